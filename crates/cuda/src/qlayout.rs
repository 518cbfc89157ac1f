//! The GPU layouts of block-quantized weights (heads, embeddings,
//! non-ternary models), both exact: every value is the file's.
//!
//! - [`QLayout::Levels`] (Q8_0, Q4_0, Q5_0, IQ4_NL, Q2_0, Q1_0, Q3_K,
//!   IQ4_XS, and Q6_K expert tensors): `k` int8 levels a row plus an f32
//!   scale per 16, read with 16-byte loads.
//! - [`QLayout::LevelsOffset`] (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K): the same plus
//!   an f32 offset per 16 after the scales: an element is `s·q + o`.
//! - [`QLayout::Q6K`]: Q6_K's 6.56 bits a weight kept, in planes a warp reads
//!   with coalesced vector loads (the head streams 269 MB a token instead of
//!   the 410 MB its int8 levels and f32 scales would take).
//!
//! Q2_0, Q1_0 and Q5_0 matrices become levels −1..=2, ±1 and −16..=15;
//! Q3_K levels −4..=3 with the group's `d·(code − 32)` as its scale, and
//! IQ4_NL's table entries (−127..=113) for IQ4_NL and IQ4_XS (the latter
//! with the sub-block's `d·(code − 32)` on both its groups of 16); Q6_K's
//! `q − 32` with `d·sc`. The formats with a minimum keep their codes
//! (0..=31) with `d·sc` and `−dmin·m` (K-quants) or `d` and `m` (Q4_1,
//! Q5_1): the same f32 products and sums the CPU's dequantization forms
//! (an f16 times a 6-bit integer is exact in f32, and `a − b` is `a + (−b)`).
//! Both GEMVs read a word of levels a lane, consecutive lanes on
//! consecutive elements, so a warp's float4 activation loads cover four
//! cache lines. Levels become floats
//! by a byte permute into the mantissa of 2^23 and one exact subtraction, so a
//! float model's Q6_K head computes the exact function of its dequantized
//! weights. A quantized model's one-token Q6_K product (`Precision::Paired`,
//! the BitNet heads) runs the CPU's integers instead (`q6k_gemv1_q8`): each
//! block quantizes x to Q8_K in shared memory and multiplies level words by
//! dp4a (within 1e-7 of the CPU), each warp loading its next round of a row
//! as 16-byte words while it multiplies the current one.

use half::f16;
use tern_quant::kquants::q3k::q3k_scale_codes;
use tern_quant::kquants::{q5k, q6k, unpack_scale_min};
use tern_quant::q4_0::KVALUES_IQ4NL;
use tern_quant::{
    cast_blocks, BlockIQ4NL, BlockIQ4XS, BlockQ1_0, BlockQ2K, BlockQ2_0, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1,
    BlockQ5K, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8_0, GgmlType,
};

/// Elements per scale.
pub const GROUP: usize = 16;

pub struct GpuQ8 {
    /// `rows * k` levels.
    pub values: Vec<i8>,
    /// `rows * k / 16` scales.
    pub scales: Vec<f32>,
    /// `rows * k / 16` offsets ([`QLayout::LevelsOffset`]), else empty.
    pub offsets: Vec<f32>,
}

/// A block-quantized matrix's GPU layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QLayout {
    /// int8 levels and an f32 scale per 16 ([`pack`]).
    Levels,
    /// [`QLayout::Levels`] and an f32 offset per 16 ([`pack`]).
    LevelsOffset,
    /// Q6_K in planes ([`pack_q6k`]).
    Q6K,
}

/// Bytes of a `[k, rows]` matrix in `layout`.
pub fn bytes(layout: QLayout, k: usize, rows: usize) -> usize {
    let n = k * rows;
    match layout {
        QLayout::Levels => n.next_multiple_of(256) + n / GROUP * 4,
        QLayout::LevelsOffset => n.next_multiple_of(256) + n / GROUP * 8,
        QLayout::Q6K => n / 256 * 210,
    }
}

fn f16_at(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Where a Q6_K block's scale `q` (of elements 16q..16q + 16) goes among
/// the block's 16 scale bytes on the GPU: next to scale `q + 4`, which the
/// same GEMV lane needs, as (0, 4), (1, 5), (2, 6), (3, 7), (8, 12), ...
fn scale_slot(q: usize) -> usize {
    2 * (q % 4 + 4 * (q / 8)) + (q / 4) % 2
}

/// Converts a `[k, rows]` Q6_K tensor to [`QLayout::Q6K`]: the file's
/// blocks split into four planes, every block's `ql` (128 bytes), then every
/// `qh` (64), every `scales` (16, paired by [`scale_slot`]) and every `d`
/// (2). `ql` and `qh` keep the file's order; the split aligns them (a
/// 210-byte block is 2-byte aligned), so that the head GEMV reads them a
/// word a lane (fmat.cu).
pub fn pack_q6k(bytes: &[u8], k: usize, rows: usize) -> Vec<u8> {
    let nb = k * rows / 256;
    let mut out = vec![0u8; self::bytes(QLayout::Q6K, k, rows)];
    let (ql, rest) = out.split_at_mut(nb * 128);
    let (qh, rest) = rest.split_at_mut(nb * 64);
    let (sc, d) = rest.split_at_mut(nb * 16);
    for (i, b) in cast_blocks::<BlockQ6K>(bytes).iter().enumerate() {
        ql[128 * i..][..128].copy_from_slice(&b.ql);
        qh[64 * i..][..64].copy_from_slice(&b.qh);
        for (q, &s) in b.scales.iter().enumerate() {
            sc[16 * i + scale_slot(q)] = s as u8;
        }
        d[2 * i..][..2].copy_from_slice(&b.d);
    }
    out
}

/// The layout a block-quantized type takes: [`QLayout::Q6K`] for Q6_K
/// matrices (`matrix`), [`QLayout::LevelsOffset`] for the types with a
/// minimum, [`QLayout::Levels`] for the rest; `None` for float and ternary
/// types.
pub fn of(ty: GgmlType, matrix: bool) -> Option<QLayout> {
    match ty {
        GgmlType::Q6_K if matrix => Some(QLayout::Q6K),
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K => {
            Some(QLayout::LevelsOffset)
        }
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q5_0
        | GgmlType::IQ4_NL
        | GgmlType::Q2_0
        | GgmlType::Q1_0
        | GgmlType::Q3_K
        | GgmlType::IQ4_XS
        | GgmlType::Q6_K => Some(QLayout::Levels),
        _ => None,
    }
}

/// Elements that share one scale (and offset) in the file's blocks of a
/// type held as levels: 32 for the types whose blocks or sub-blocks are 32
/// wide, else 16 (the layout's group). The tensor-core products take one
/// k32 step per scale where it spans 32.
pub fn scale_span(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::Q5_0
        | GgmlType::Q4_1
        | GgmlType::Q5_1
        | GgmlType::IQ4_NL
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::IQ4_XS => 32,
        _ => GROUP,
    }
}

/// Converts a tensor of `k`-wide rows (any number: a 3-D tensor's rows are
/// consecutive) to [`QLayout::Levels`] or [`QLayout::LevelsOffset`]
/// ([`of`]). The rows are converted on up to `threads` threads.
pub fn pack(ty: GgmlType, bytes: &[u8], k: usize, rows: usize, threads: usize) -> GpuQ8 {
    let offset = of(ty, false) == Some(QLayout::LevelsOffset);
    let mut q = GpuQ8 {
        values: vec![0i8; k * rows],
        scales: vec![0f32; k * rows / GROUP],
        offsets: if offset { vec![0f32; k * rows / GROUP] } else { Vec::new() },
    };
    let row_bytes = bytes.len() / rows.max(1);
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|sc| {
        let mut offsets = q.offsets.chunks_mut(per * k / GROUP);
        for ((values, scales), bytes) in
            q.values.chunks_mut(per * k).zip(q.scales.chunks_mut(per * k / GROUP)).zip(bytes.chunks(per * row_bytes))
        {
            let offsets = offsets.next().unwrap_or_default();
            sc.spawn(move || pack_rows(ty, bytes, values, scales, offsets));
        }
    });
    q
}

/// A Q4_1/Q5_1 block: codes 0..=31, its two groups sharing `d` and `m`.
fn min_block(
    d: [u8; 2],
    m: [u8; 2],
    code: impl Fn(usize) -> u8,
    values: &mut [i8],
    scales: &mut [f32],
    offsets: &mut [f32],
) {
    for (j, v) in values[..32].iter_mut().enumerate() {
        *v = code(j) as i8;
    }
    scales[..2].fill(f16_at(d));
    offsets[..2].fill(f16_at(m));
}

/// A Q4_K/Q5_K block's groups: sub-block j's `d·sc` and `−dmin·m` on its
/// groups 2j and 2j + 1.
fn k_scale_min(d: [u8; 2], dmin: [u8; 2], packed: &[u8; 12], scales: &mut [f32], offsets: &mut [f32]) {
    let (d, dmin) = (f16_at(d), f16_at(dmin));
    for j in 0..8 {
        let (sc, m) = unpack_scale_min(packed, j);
        scales[2 * j..2 * j + 2].fill(d * sc as f32);
        offsets[2 * j..2 * j + 2].fill(-(dmin * m as f32));
    }
}

/// [`pack`] of whole rows: `values` and `scales` (and `offsets`) are theirs.
fn pack_rows(ty: GgmlType, bytes: &[u8], values: &mut [i8], scales: &mut [f32], offsets: &mut [f32]) {
    match ty {
        GgmlType::Q8_0 => {
            for (i, b) in cast_blocks::<BlockQ8_0>(bytes).iter().enumerate() {
                values[32 * i..32 * i + 32].copy_from_slice(&b.qs);
                scales[2 * i..2 * i + 2].fill(f16_at(b.d));
            }
        }
        GgmlType::Q4_0 => {
            for (i, b) in cast_blocks::<BlockQ4_0>(bytes).iter().enumerate() {
                for (j, &q) in b.qs.iter().enumerate() {
                    values[32 * i + j] = (q & 15) as i8 - 8;
                    values[32 * i + j + 16] = (q >> 4) as i8 - 8;
                }
                scales[2 * i..2 * i + 2].fill(f16_at(b.d));
            }
        }
        GgmlType::Q2_0 => {
            // Levels c − 1 (−1..=2); the block's four groups of 16 share its d.
            for (i, b) in cast_blocks::<BlockQ2_0>(bytes).iter().enumerate() {
                for (j, v) in values[64 * i..64 * i + 64].iter_mut().enumerate() {
                    *v = b.code(j) as i8 - 1;
                }
                scales[4 * i..4 * i + 4].fill(f16_at(b.d));
            }
        }
        GgmlType::Q1_0 => {
            // Levels ±1; the block's eight groups of 16 share its d.
            for (i, b) in cast_blocks::<BlockQ1_0>(bytes).iter().enumerate() {
                for (j, v) in values[128 * i..128 * i + 128].iter_mut().enumerate() {
                    *v = b.sign(j) as i8;
                }
                scales[8 * i..8 * i + 8].fill(f16_at(b.d));
            }
        }
        GgmlType::Q5_0 => {
            // Levels code − 16 (−16..=15); the block's two groups of 16 share its d.
            for (i, b) in cast_blocks::<BlockQ5_0>(bytes).iter().enumerate() {
                for (j, v) in values[32 * i..32 * i + 32].iter_mut().enumerate() {
                    *v = b.code(j) as i8 - 16;
                }
                scales[2 * i..2 * i + 2].fill(f16_at(b.d));
            }
        }
        GgmlType::Q3_K => {
            // Levels −4..=3; group g's scale is d·(code_g − 32).
            for (i, b) in cast_blocks::<BlockQ3K>(bytes).iter().enumerate() {
                for (e, v) in values[256 * i..256 * i + 256].iter_mut().enumerate() {
                    *v = b.level(e) as i8;
                }
                let d = f16_at(b.d);
                for (s, &c) in scales[16 * i..16 * i + 16].iter_mut().zip(&q3k_scale_codes(&b.scales)) {
                    *s = d * (c as i32 - 32) as f32;
                }
            }
        }
        GgmlType::IQ4_XS => {
            // The table entries; sub-block sb's d·(code − 32) on its two groups of 16.
            for (i, b) in cast_blocks::<BlockIQ4XS>(bytes).iter().enumerate() {
                for (e, v) in values[256 * i..256 * i + 256].iter_mut().enumerate() {
                    *v = KVALUES_IQ4NL[b.index(e) as usize];
                }
                let d = f16_at(b.d);
                for (g, s) in scales[16 * i..16 * i + 16].iter_mut().enumerate() {
                    *s = d * (b.scale_code(g / 2) as i32 - 32) as f32;
                }
            }
        }
        GgmlType::IQ4_NL => {
            for (i, b) in cast_blocks::<BlockIQ4NL>(bytes).iter().enumerate() {
                for (j, &q) in b.qs.iter().enumerate() {
                    values[32 * i + j] = KVALUES_IQ4NL[(q & 15) as usize];
                    values[32 * i + j + 16] = KVALUES_IQ4NL[(q >> 4) as usize];
                }
                scales[2 * i..2 * i + 2].fill(f16_at(b.d));
            }
        }
        GgmlType::Q6_K => {
            // Levels q − 32; group g's scale is d·sc_g.
            for (i, b) in cast_blocks::<BlockQ6K>(bytes).iter().enumerate() {
                for (e, v) in values[256 * i..256 * i + 256].iter_mut().enumerate() {
                    *v = q6k::level(b, e) as i8;
                }
                let d = f16_at(b.d);
                for (s, &c) in scales[16 * i..16 * i + 16].iter_mut().zip(&b.scales) {
                    *s = d * c as f32;
                }
            }
        }
        GgmlType::Q4_1 => {
            for (i, b) in cast_blocks::<BlockQ4_1>(bytes).iter().enumerate() {
                min_block(b.d, b.m, |j| b.code(j), &mut values[32 * i..], &mut scales[2 * i..], &mut offsets[2 * i..]);
            }
        }
        GgmlType::Q5_1 => {
            for (i, b) in cast_blocks::<BlockQ5_1>(bytes).iter().enumerate() {
                min_block(b.d, b.m, |j| b.code(j), &mut values[32 * i..], &mut scales[2 * i..], &mut offsets[2 * i..]);
            }
        }
        GgmlType::Q2_K => {
            // Codes 0..=3; group g: d·(sc & 15) and −dmin·(sc >> 4).
            for (i, b) in cast_blocks::<BlockQ2K>(bytes).iter().enumerate() {
                for (e, v) in values[256 * i..256 * i + 256].iter_mut().enumerate() {
                    *v = b.code(e) as i8;
                }
                let (d, dmin) = (f16_at(b.d), f16_at(b.dmin));
                for (g, &sc) in b.scales.iter().enumerate() {
                    scales[16 * i + g] = d * (sc & 15) as f32;
                    offsets[16 * i + g] = -(dmin * (sc >> 4) as f32);
                }
            }
        }
        GgmlType::Q4_K => {
            for (i, b) in cast_blocks::<BlockQ4K>(bytes).iter().enumerate() {
                for (e, v) in values[256 * i..256 * i + 256].iter_mut().enumerate() {
                    *v = ((b.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 15) as i8;
                }
                k_scale_min(b.d, b.dmin, &b.scales, &mut scales[16 * i..], &mut offsets[16 * i..]);
            }
        }
        GgmlType::Q5_K => {
            for (i, b) in cast_blocks::<BlockQ5K>(bytes).iter().enumerate() {
                for (e, v) in values[256 * i..256 * i + 256].iter_mut().enumerate() {
                    *v = q5k::level(b, e) as i8;
                }
                k_scale_min(b.d, b.dmin, &b.scales, &mut scales[16 * i..], &mut offsets[16 * i..]);
            }
        }
        _ => panic!("{ty} has no int8 GPU layout"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element `e` of row `r` read back from the planes the way `get_rows_q6k`
    /// (fmat.cu) does.
    fn q6k_value(p: &[u8], k: usize, rows: usize, r: usize, e: usize) -> f32 {
        let nb = k * rows / 256;
        let (b, i) = ((r * k + e) / 256, e % 256);
        let (h, g, l) = (i / 128, (i / 32) % 4, i % 32);
        let lo = (p[128 * b + 64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 15;
        let hi = (p[nb * 128 + 64 * b + 32 * h + l] >> (2 * g)) & 3;
        let d = f16_at([p[nb * 208 + 2 * b], p[nb * 208 + 2 * b + 1]]);
        let sc = p[nb * 192 + 16 * b + scale_slot(i / 16)] as i8;
        d * sc as f32 * ((lo | (hi << 4)) as f32 - 32.0)
    }

    #[test]
    fn the_gpu_layouts_hold_the_files_values() {
        let (k, rows) = (512, 3);
        let x: Vec<f32> = (0..k * rows).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
        for (ty, raw) in [
            (GgmlType::Q8_0, false),
            (GgmlType::Q4_0, false),
            (GgmlType::Q6_K, false),
            (GgmlType::Q2_0, false),
            (GgmlType::Q2_0, true),
            (GgmlType::Q1_0, false),
            (GgmlType::Q1_0, true),
            (GgmlType::Q5_0, false),
            (GgmlType::Q5_0, true),
            (GgmlType::Q3_K, false),
            (GgmlType::Q3_K, true),
            (GgmlType::IQ4_XS, false),
            (GgmlType::IQ4_XS, true),
            (GgmlType::IQ4_NL, false),
            (GgmlType::IQ4_NL, true),
            (GgmlType::Q4_1, false),
            (GgmlType::Q4_1, true),
            (GgmlType::Q5_1, false),
            (GgmlType::Q5_1, true),
            (GgmlType::Q2_K, false),
            (GgmlType::Q2_K, true),
            (GgmlType::Q4_K, false),
            (GgmlType::Q4_K, true),
            (GgmlType::Q5_K, false),
            (GgmlType::Q5_K, true),
        ] {
            let mut bytes = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
            tern_quant::quantize_tensor(ty, &x, k, &mut bytes);
            if raw {
                // Every code (Q2_0's quantizer never writes +2), finite scales of both signs.
                let bb = ty.layout().block_bytes;
                // Where the f16 scale is (Q3_K keeps it at the end, Q2_K
                // after its codes). Other f16s (minimums) stay raw: NaN and
                // infinity must come out as the CPU's.
                let d_at = match ty {
                    GgmlType::Q3_K => 108,
                    GgmlType::Q2_K => 80,
                    _ => 0,
                };
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = match i % bb {
                        o if o == d_at => (i / bb * 29) as u8,
                        o if o == d_at + 1 => 0x2e | ((i / bb) as u8 & 1) << 7,
                        _ => (i * 97 % 256) as u8,
                    };
                }
            }
            let layout = of(ty, true).unwrap();
            assert_eq!(of(ty, false), Some(if ty == GgmlType::Q6_K { QLayout::Levels } else { layout }));
            // Every type has an int8 layout (Q6_K's 3-D expert tensors), packed
            // here on 2 threads (rows 0..2 and 2).
            let p = pack(ty, &bytes, k, rows, 2);
            let n_offsets = if layout == QLayout::LevelsOffset { p.scales.len() } else { 0 };
            assert_eq!(p.offsets.len(), n_offsets, "{ty}");
            let planes = (layout == QLayout::Q6K).then(|| pack_q6k(&bytes, k, rows));
            if let Some(p) = &planes {
                assert_eq!(p.len(), self::bytes(layout, k, rows));
            }
            let row_bytes = bytes.len() / rows;
            for r in 0..rows {
                let mut want = vec![0f32; k];
                tern_quant::dequantize_row(
                    ty,
                    &bytes[r * row_bytes..][..row_bytes],
                    tern_quant::TensorScale::ONE,
                    &mut want,
                );
                for (e, &w) in want.iter().enumerate() {
                    let (i, g) = (r * k + e, (r * k + e) / GROUP);
                    let v = p.values[i] as f32 * p.scales[g];
                    let mut got = vec![p.offsets.get(g).map_or(v, |o| v + o)];
                    if let Some(planes) = &planes {
                        got.push(q6k_value(planes, k, rows, r, e));
                    }
                    for got in got {
                        assert!(
                            got == w || got.is_nan() && w.is_nan(),
                            "{ty} raw={raw} row {r} element {e}: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }
}
