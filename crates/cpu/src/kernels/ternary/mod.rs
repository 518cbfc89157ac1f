//! Ternary matrix products on the repacked layouts of `tern_quant::ternary::rows`
//! (`Bits2`, `Base3`) with per-row int8 activations.
//!
//! Every kernel computes, per (weight row, token), the exact integer `Σ c·q`
//! over the padded row, subtracts `Σ q`, and scales once:
//! `((Σ c·q − Σ q) as f32) · s_row · d_token`, the float operations of the
//! scalar reference `rows::dot_values`, so all ISA paths agree bit for bit.
//! Matrices whose rows carry several scales (rare TQ files) take the scalar
//! path.

mod avx2;
mod avx512;

use tern_quant::ternary::rows::{self, Layout, Packing};

use crate::buffer::Aligned;
use crate::isa::Isa;

/// A ternary weight matrix in a kernel layout, rows padded to whole chunks.
pub struct PackedTernary {
    pub layout: Layout,
    pub rows: usize,
    data: Aligned,
    /// `layout.groups` per row.
    scales: Vec<f32>,
}

impl PackedTernary {
    /// Repacks `rows` rows of `k` elements of ternary type `ty`.
    pub fn new(ty: tern_quant::GgmlType, bytes: &[u8], k: usize, rows: usize, packing: Packing) -> PackedTernary {
        let scale = tern_quant::TensorScale::of(ty, bytes, k * rows);
        let (layout, packed, scales) = rows::repack(ty, bytes, scale, k, rows, packing);
        let mut data = Aligned::new(packed.len()).expect("allocation of a repacked weight");
        data.as_mut_slice().copy_from_slice(&packed);
        PackedTernary { layout, rows, data, scales }
    }

    pub fn row(&self, r: usize) -> &[u8] {
        &self.data.as_slice()[r * self.layout.row_bytes..(r + 1) * self.layout.row_bytes]
    }

    pub fn row_scales(&self, r: usize) -> &[f32] {
        &self.scales[r * self.layout.groups..(r + 1) * self.layout.groups]
    }

    pub fn bytes(&self) -> usize {
        self.data.as_slice().len() + self.scales.len() * 4
    }
}

/// Per-token int8 activations, padded to `k_pad` with zeros, 64-byte aligned rows.
pub struct PackedActs {
    pub k: usize,
    pub k_pad: usize,
    pub n: usize,
    q: Aligned,
    /// Per token: the scale `1 / s_a` and `Σ q`.
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
}

impl PackedActs {
    pub fn new(k: usize, k_pad: usize, n: usize) -> PackedActs {
        PackedActs {
            k,
            k_pad,
            n,
            q: Aligned::new(k_pad * n).expect("activation buffer"),
            d: vec![0.0; n],
            sum: vec![0; n],
        }
    }

    pub fn q(&self, t: usize) -> &[i8] {
        let b = &self.q.as_slice()[t * self.k_pad..(t + 1) * self.k_pad];
        // SAFETY: i8 and u8 have the same layout.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
    }

    /// Quantizes `x` (`n` rows of `k`) as `ActType::Q8_Row` does: `s_a =
    /// 127 / max(amax, 1e-5)`, `q = round_half_even(x · s_a)`, `d = 1 / s_a`.
    pub fn quantize(&mut self, x: &[f32], isa: Isa) {
        let (k, k_pad) = (self.k, self.k_pad);
        for t in 0..self.n {
            let xs = &x[t * k..(t + 1) * k];
            let amax = match isa {
                Isa::Avx512 => unsafe { avx512::amax(xs) },
                Isa::Avx2 => unsafe { avx2::amax(xs) },
                Isa::Scalar => xs.iter().fold(0f32, |m, v| m.max(v.abs())),
            };
            let s_a = 127.0 / amax.max(1e-5);
            let qb = &mut self.q.as_mut_slice()[t * k_pad..(t + 1) * k_pad];
            // SAFETY: i8 and u8 have the same layout.
            let q = unsafe { std::slice::from_raw_parts_mut(qb.as_mut_ptr() as *mut i8, k_pad) };
            let sum = match isa {
                Isa::Avx512 => unsafe { avx512::quantize(xs, s_a, q) },
                Isa::Avx2 => unsafe { avx2::quantize(xs, s_a, q) },
                Isa::Scalar => quantize_scalar(xs, s_a, q),
            };
            self.d[t] = 1.0 / s_a;
            self.sum[t] = sum;
        }
    }
}

fn quantize_scalar(x: &[f32], s_a: f32, q: &mut [i8]) -> i32 {
    let mut sum = 0;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (v * s_a).round_ties_even().clamp(-128.0, 127.0) as i8;
        sum += *o as i32;
    }
    q[x.len()..].fill(0);
    sum
}

/// Output pointer shared by threads that write disjoint rows.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    /// Elements between consecutive tokens' outputs (the weight's row count).
    pub ld: usize,
}

// SAFETY: callers give each thread a disjoint row range.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// How AVX-512 kernels read base-3 bytes: table lookups (needs VBMI) or
/// multiply-and-compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base3Decode {
    Lookup,
    Compare,
}

impl Base3Decode {
    /// The faster one this processor supports.
    pub fn best() -> Base3Decode {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512vbmi") {
            return Base3Decode::Lookup;
        }
        Base3Decode::Compare
    }
}

/// `y[t·ld + r] = W[r] · x[t]` for `r` in `rows`, every token of `acts`.
///
/// # Safety
/// `out` must be valid for every written index and not written by anyone else
/// for these rows; `isa` must be available.
pub unsafe fn gemm(w: &PackedTernary, rows: std::ops::Range<usize>, acts: &PackedActs, out: Out, isa: Isa) {
    gemm_with(w, rows, acts, out, isa, Base3Decode::best())
}

/// [`gemm`] with the base-3 decoding chosen (tests cover both).
///
/// # Safety
/// As [`gemm`]; `Base3Decode::Lookup` needs AVX-512 VBMI.
pub unsafe fn gemm_with(
    w: &PackedTernary,
    rows: std::ops::Range<usize>,
    acts: &PackedActs,
    out: Out,
    isa: Isa,
    base3: Base3Decode,
) {
    debug_assert_eq!(acts.k_pad, w.layout.k_pad);
    if w.layout.groups != 1 || isa == Isa::Scalar {
        return gemm_scalar(w, rows, acts, out);
    }
    match (isa, w.layout.packing) {
        (Isa::Avx512, Packing::Bits2) => avx512::gemm_bits2(w, rows, acts, out),
        (Isa::Avx512, Packing::Base3) => avx512::gemm_base3(w, rows, acts, out, base3 == Base3Decode::Lookup),
        (Isa::Avx2, Packing::Bits2) => avx2::gemm_bits2(w, rows, acts, out),
        (Isa::Avx2, Packing::Base3) => avx2::gemm_base3(w, rows, acts, out),
        (Isa::Scalar, _) => unreachable!("handled above"),
    }
}

/// The scalar path: the reference decode and dot, row by row.
unsafe fn gemm_scalar(w: &PackedTernary, rows: std::ops::Range<usize>, acts: &PackedActs, out: Out) {
    let mut values = vec![0i8; w.layout.k_pad];
    for r in rows {
        rows::unpack_row(&w.layout, w.row(r), &mut values);
        for t in 0..acts.n {
            let y = rows::dot_values(&values, w.row_scales(r), w.layout.group(), acts.d[t], acts.q(t));
            *out.ptr.add(t * out.ld + r) = y;
        }
    }
}

/// A kernel for one tile: R weight rows starting at a row, T tokens starting at a token.
type Tile = unsafe fn(&PackedTernary, usize, &PackedActs, usize, Out);

/// A kernel for one tile whose R rows were decoded to one code byte per weight.
type CodesTile = unsafe fn(&PackedTernary, usize, &[u8], &PackedActs, usize, Out);

/// Prompt-sized batches decode each row tile once per token block into a
/// scratch of codes, then every token tile reads plain bytes: the unpacking
/// is paid once per block instead of once per token tile.
struct Decoded {
    /// Rows per decoded tile (its accumulators need fewer registers than a
    /// direct tile's, so it can be taller).
    rows: usize,
    /// Decodes rows `r0..r0 + rows` into `rows × k_pad` code bytes.
    decode: unsafe fn(&PackedTernary, usize, &mut [u8]),
    full: CodesTile,
    /// R rows × 1..T-1 tokens (index = tokens − 1).
    token_edge: &'static [CodesTile],
}

/// An ISA's tile kernels: the full R×T tile and the smaller ones for edges.
struct Tiles {
    rows: usize,
    tokens: usize,
    full: Tile,
    /// One row × T tokens.
    row_edge: Tile,
    /// R rows × 1..T-1 tokens (index = tokens − 1).
    token_edge: &'static [Tile],
    single: Tile,
    decoded: Option<Decoded>,
}

/// Tokens whose activations stay in cache while every row tile passes over
/// them (64 rows of 6912 int8 is 442 KB, within a core's L2). Weights are
/// then read from memory once per block of tokens instead of once per tile.
const TOKEN_BLOCK: usize = 64;

impl Tiles {
    /// Covers `rows` × every token: token blocks outermost, then row tiles,
    /// then token tiles; edges get the smaller kernels.
    unsafe fn drive(&self, w: &PackedTernary, rows: std::ops::Range<usize>, acts: &PackedActs, out: Out) {
        let (rr, tt) = (self.rows, self.tokens);
        for block in (0..acts.n).step_by(TOKEN_BLOCK) {
            let block_end = (block + TOKEN_BLOCK).min(acts.n);
            let full_end = block + (block_end - block) / tt * tt;
            let mut r = rows.start;
            if let Some(d) = self.decoded.as_ref().filter(|_| full_end - block >= 2 * tt) {
                let mut scratch = vec![0u8; d.rows * w.layout.k_pad];
                while r + d.rows <= rows.end {
                    (d.decode)(w, r, &mut scratch);
                    for t0 in (block..full_end).step_by(tt) {
                        (d.full)(w, r, &scratch, acts, t0, out);
                    }
                    if full_end < block_end {
                        (d.token_edge[block_end - full_end - 1])(w, r, &scratch, acts, full_end, out);
                    }
                    r += d.rows;
                }
            }
            while r + rr <= rows.end {
                for t0 in (block..full_end).step_by(tt) {
                    (self.full)(w, r, acts, t0, out);
                }
                if full_end < block_end {
                    (self.token_edge[block_end - full_end - 1])(w, r, acts, full_end, out);
                }
                r += rr;
            }
            for r in r..rows.end {
                for t0 in (block..full_end).step_by(tt) {
                    (self.row_edge)(w, r, acts, t0, out);
                }
                for t in full_end..block_end {
                    (self.single)(w, r, acts, t, out);
                }
            }
        }
    }
}

/// The final scaling shared by the SIMD kernels (the reference's order).
#[inline(always)]
fn finish(dot: i32, sum: i32, s: f32, d: f32) -> f32 {
    (dot - sum) as f32 * s * d
}
