//! Every ternary format reduced to one form: a row of values in {−1, 0, +1}
//! with one scale per row (or, when a file's blocks disagree, one per
//! 256-element group), and the dot product of such a row with a per-row
//! int8 activation (`ActType::Q8_Row`, BitNet's training arithmetic).
//!
//! It also defines the two in-memory layouts the CPU kernels compute on,
//! with their scalar reference:
//!
//! * `Bits2`: 256 weights per 64-byte chunk; byte `j` holds weights `j`,
//!   `j+64`, `j+128`, `j+192` of the chunk in bits 0–1, 2–3, 4–5, 6–7, as
//!   codes `c = t + 1`. One shift and mask give 64 consecutive weights.
//! * `Base3`: 320 weights per 64-byte chunk (1.6 bits each); byte `j` holds
//!   weights `j + 64·i`, i = 0..5, as base-3 digits, most significant first,
//!   stored as `⌈v·256/243⌉` (the TQ1_0/IQ1_BN code). Digit i comes back as
//!   `((b·3^i mod 256)·3) >> 8`, 64 consecutive weights at a time.
//!
//! Rows are zero-padded to whole chunks; padding holds value 0, and the
//! padded activations are 0, so it adds nothing.

use tern_gguf::GgmlType;

use super::{pack_trits, unpack_trit};
use crate::{dequantize_row, TensorScale};

/// Elements that share a scale in TQ1_0/TQ2_0 (their block).
pub const GROUP: usize = 256;

/// The elements of one scale group of `ty` in a row of `k`.
pub fn scale_group(ty: GgmlType, k: usize) -> usize {
    match ty {
        GgmlType::TQ1_0 | GgmlType::TQ2_0 => GROUP,
        _ => k,
    }
}

/// Decodes one ternary row into values and one scale per group of
/// `scale_group(ty, k)` elements. Exact for every valid file: each
/// dequantized value is `±s` or 0 for its group's `s`, so its sign is the
/// ternary value and the group's largest magnitude is the scale.
pub fn decode_row(ty: GgmlType, row: &[u8], scale: TensorScale, values: &mut [i8]) -> Vec<f32> {
    debug_assert!(ty.is_ternary());
    let k = values.len();
    let mut x = vec![0f32; k];
    dequantize_row(ty, row, scale, &mut x);
    let group = scale_group(ty, k);
    let mut scales = Vec::with_capacity(k.div_ceil(group));
    for (xs, vs) in x.chunks(group).zip(values.chunks_mut(group)) {
        scales.push(xs.iter().fold(0f32, |m, v| m.max(v.abs())));
        for (v, &xv) in vs.iter_mut().zip(xs) {
            *v = (xv > 0.0) as i8 - (xv < 0.0) as i8;
        }
    }
    scales
}

/// The one scale of a row whose groups agree (all-zero groups agree with
/// anything), or `None`.
pub fn uniform_scale(scales: &[f32]) -> Option<f32> {
    let mut nonzero = scales.iter().copied().filter(|&s| s != 0.0);
    let first = nonzero.next().unwrap_or(0.0);
    nonzero.all(|s| s == first).then_some(first)
}

/// `Σ t·q`, exact.
fn int_dot(values: &[i8], q: &[i8]) -> i32 {
    values.iter().zip(q).map(|(&t, &q)| t as i32 * q as i32).sum()
}

/// The dot of a decoded row with a `Q8_Row` activation `(d, q)`. Uniform rows
/// compute `Σt·q · s · d`; others sum `Σ_g t·q · s_g` over groups first. The
/// SIMD kernels reproduce these float operations in this order.
pub fn dot_values(values: &[i8], scales: &[f32], group: usize, d: f32, q: &[i8]) -> f32 {
    match uniform_scale(scales) {
        Some(s) => int_dot(values, q) as f32 * s * d,
        None => {
            let sum: f32 = values
                .chunks(group)
                .zip(q.chunks(group))
                .zip(scales)
                .map(|((v, q), &s)| int_dot(v, q) as f32 * s)
                .sum();
            sum * d
        }
    }
}

/// How a repacked row stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packing {
    Bits2,
    Base3,
}

impl Packing {
    /// Weights per 64-byte chunk.
    pub const fn chunk(self) -> usize {
        match self {
            Packing::Bits2 => 256,
            Packing::Base3 => 320,
        }
    }
}

/// Bytes per chunk of either packing.
pub const CHUNK_BYTES: usize = 64;

/// The shape of a repacked matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub packing: Packing,
    /// Logical row length.
    pub k: usize,
    /// Row length padded to whole chunks.
    pub k_pad: usize,
    pub row_bytes: usize,
    /// Scales per row: 1, or `k_pad / GROUP` (Bits2 only).
    pub groups: usize,
}

impl Layout {
    /// Base3 needs one scale per row (its chunks straddle 256-element groups);
    /// a grouped matrix is stored as Bits2.
    pub fn new(packing: Packing, k: usize, uniform: bool) -> Layout {
        let packing = if uniform { packing } else { Packing::Bits2 };
        let chunk = packing.chunk();
        let k_pad = k.div_ceil(chunk) * chunk;
        let groups = if uniform { 1 } else { k_pad / GROUP };
        Layout { packing, k, k_pad, row_bytes: k_pad / chunk * CHUNK_BYTES, groups }
    }

    /// Elements per scale group.
    pub fn group(&self) -> usize {
        self.k_pad / self.groups
    }
}

/// Writes `values` (`layout.k` of them) as one packed row.
pub fn pack_row(layout: &Layout, values: &[i8], out: &mut [u8]) {
    debug_assert_eq!(out.len(), layout.row_bytes);
    let chunk = layout.packing.chunk();
    let code = |i: usize| values.get(i).map_or(1, |&t| (t + 1) as u8);
    for (c, bytes) in out.chunks_exact_mut(CHUNK_BYTES).enumerate() {
        let base = c * chunk;
        for (j, b) in bytes.iter_mut().enumerate() {
            *b = match layout.packing {
                Packing::Bits2 => (0..4).fold(0u8, |acc, i| acc | code(base + j + 64 * i) << (2 * i)),
                Packing::Base3 => pack_trits([0, 1, 2, 3, 4].map(|i| code(base + j + 64 * i))),
            };
        }
    }
}

/// Reads a packed row back into `k_pad` values (the scalar reference decode).
pub fn unpack_row(layout: &Layout, row: &[u8], values: &mut [i8]) {
    debug_assert_eq!(values.len(), layout.k_pad);
    let chunk = layout.packing.chunk();
    for (c, bytes) in row.chunks_exact(CHUNK_BYTES).enumerate() {
        for (j, &b) in bytes.iter().enumerate() {
            for i in 0..chunk / CHUNK_BYTES {
                let code = match layout.packing {
                    Packing::Bits2 => (b >> (2 * i)) & 3,
                    Packing::Base3 => unpack_trit(b, i),
                };
                values[c * chunk + j + 64 * i] = code as i8 - 1;
            }
        }
    }
}

/// Repacks a whole ternary tensor of `rows` rows of `k`: returns the layout,
/// the packed rows and the scales (`layout.groups` per row). Rows are
/// decoded and packed on all cores (this runs once per weight at load).
pub fn repack(
    ty: GgmlType,
    data: &[u8],
    scale: TensorScale,
    k: usize,
    rows: usize,
    packing: Packing,
) -> (Layout, Vec<u8>, Vec<f32>) {
    let in_row = ty.row_bytes(k as u64).expect("validated by the reader") as usize;
    let mut values = vec![0i8; rows * k];
    let mut group_scales = vec![Vec::new(); rows];
    in_parallel(
        rows,
        |range, out_values, out_scales| {
            for (i, r) in range.enumerate() {
                out_scales[i] =
                    decode_row(ty, &data[r * in_row..(r + 1) * in_row], scale, &mut out_values[i * k..(i + 1) * k]);
            }
        },
        &mut values,
        k,
        &mut group_scales,
    );
    let uniform: Option<Vec<f32>> = group_scales.iter().map(|s| uniform_scale(s)).collect();
    let layout = Layout::new(packing, k, uniform.is_some());
    let scales = match uniform {
        Some(s) => s,
        None => group_scales
            .iter()
            .flat_map(|s| (0..layout.groups).map(move |g| s.get(g).copied().unwrap_or(0.0)))
            .collect(),
    };
    let mut packed = vec![0u8; rows * layout.row_bytes];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (v, out) in values.chunks(per * k).zip(packed.chunks_mut(per * layout.row_bytes)) {
            sc.spawn(move || {
                for (v, o) in v.chunks_exact(k).zip(out.chunks_exact_mut(layout.row_bytes)) {
                    pack_row(&layout, v, o);
                }
            });
        }
    });
    (layout, packed, scales)
}

/// Runs `f(rows, values, scales)` on disjoint row ranges, one per core.
fn in_parallel(
    rows: usize,
    f: impl Fn(std::ops::Range<usize>, &mut [i8], &mut [Vec<f32>]) + Sync,
    values: &mut [i8],
    k: usize,
    scales: &mut [Vec<f32>],
) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = rows.div_ceil(threads).max(1);
    std::thread::scope(|sc| {
        for (i, (v, s)) in values.chunks_mut(per * k).zip(scales.chunks_mut(per)).enumerate() {
            let f = &f;
            sc.spawn(move || f(i * per..i * per + s.len(), v, s));
        }
    });
}

/// The scalar reference of the packed kernels: row `row` (its scales
/// `scales`) times an activation padded to `k_pad` with scale `d`.
pub fn dot_packed(layout: &Layout, row: &[u8], scales: &[f32], d: f32, q: &[i8]) -> f32 {
    let mut values = vec![0i8; layout.k_pad];
    unpack_row(layout, row, &mut values);
    dot_values(&values, scales, layout.group(), d, q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(k: usize, seed: u64) -> Vec<i8> {
        let mut s = seed;
        (0..k)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 33) % 3) as i8 - 1
            })
            .collect()
    }

    #[test]
    fn packings_round_trip_with_padding() {
        for packing in [Packing::Bits2, Packing::Base3] {
            for k in [64, 256, 320, 640, 1000, 2560] {
                let layout = Layout::new(packing, k, true);
                let v = values(k, k as u64);
                let mut row = vec![0u8; layout.row_bytes];
                pack_row(&layout, &v, &mut row);
                let mut back = vec![9i8; layout.k_pad];
                unpack_row(&layout, &row, &mut back);
                assert_eq!(&back[..k], &v[..], "{packing:?} k={k}");
                assert!(back[k..].iter().all(|&t| t == 0), "padding is zero");
            }
        }
    }

    #[test]
    fn grouped_rows_fall_back_to_bits2() {
        let l = Layout::new(Packing::Base3, 512, false);
        assert_eq!((l.packing, l.groups, l.group()), (Packing::Bits2, 2, 256));
        assert_eq!(uniform_scale(&[0.5, 0.0, 0.5]), Some(0.5));
        assert_eq!(uniform_scale(&[0.5, 0.25]), None);
    }
}
