//! Prompt GEMM for block formats: many weight rows against many activation
//! rows (a prompt's tokens, or the tokens one expert serves).
//!
//! A group of [`GROUP`] weight rows is decoded once into a flat layout, then
//! every activation row is multiplied against it in register tiles of
//! 1 row × 4 tokens, so a block is decoded once per batch instead of once
//! per token, a decoded vector serves four tokens, and the 8 i32 lanes of a
//! block's sums are scaled and accumulated in f32 lanes (one horizontal sum
//! per result, not per block). Two decoded layouts cover the formats:
//!
//! * [`KBlock`] (k-quants against Q8_K): per 256 elements, 8 sub-blocks of
//!   32 unsigned codes, each with the i16 `madd` vector of its sub-scales
//!   (one per 16 elements), the 16 i16 mins the activation's `bsums` meet,
//!   and f32 `d`, `dmin`: `Σ w·a = d_a·(d·Σ_j sc·Σ q·a − dmin·Σ_g m_g·bsum_g)`.
//!   Q6_K is `q − 32` with signed scales: its "mins" are `32·sc_g` and `dmin = d`.
//! * [`LevelRows`] (32-element formats against Q8_0): the signed levels and
//!   the f32 scale of each block; the sign trick `maddubs(|w|, a·sign w)`.
//!
//! Numerics: every block's integer sums are exact (lanes of `madd` results,
//! as the one-row kernels form them); they are converted to f32 per lane,
//! scaled and summed in lanes, then across lanes. The order differs from the
//! reference's block order, so results agree with it to a rounding bound
//! (`tests/gemm_kernels.rs` states it), not bit for bit.

use std::arch::x86_64::*;

use super::x86::*;
use super::Gemm;

use super::GEMM_GROUP as GROUP;
const TOKENS: usize = 4;

/// One decoded k-quant block of 256 elements.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct KBlock {
    /// Sub-block `j`'s 32 unsigned codes (≤ 63), element order.
    pub codes: [[u8; 32]; 8],
    /// Sub-block `j`'s `madd` vector: i16 lane `i` (elements `2i, 2i+1`) holds
    /// the scale of elements `16·(i/8)..`.
    pub scales: [[i16; 16]; 8],
    /// The weight of activation block sum `g` (elements `16g..16g+16`).
    pub mins: [i16; 16],
    pub d: f32,
    pub dmin: f32,
}

impl KBlock {
    const ZERO: KBlock = KBlock { codes: [[0; 32]; 8], scales: [[0; 16]; 8], mins: [0; 16], d: 0.0, dmin: 0.0 };
}

/// A k-quant format that decodes to [`KBlock`]s.
pub(super) trait KDecode {
    /// Bytes of one 256-element block.
    const BYTES: usize;
    /// `dmin == d` (Q6_K): the mins' sum is subtracted in i32 before the one
    /// scaling, so the block's integer is the reference's, as in its kernel.
    const JOINT: bool = false;
    /// Decodes the block at `p`.
    ///
    /// # Safety
    /// AVX2 must be available; `p` points at `BYTES` readable bytes.
    unsafe fn decode(p: *const u8, out: &mut KBlock);
}

/// Q8_K activation block: f32 `d`, 256 i8, i16 `bsums[16]`.
const Q8K_BYTES: usize = 292;
const Q8K_QS: usize = 4;
const Q8K_BSUMS: usize = 260;

/// [`Gemm`] for a k-quant format.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_k<D: KDecode>(g: &mut Gemm) {
    let nb = g.check(256, D::BYTES, Q8K_BYTES);
    let (nr, nt) = (g.rows.len(), g.acts.len());
    let mut buf = vec![KBlock::ZERO; GROUP * nb];
    for r0 in (0..nr).step_by(GROUP) {
        let gr = (nr - r0).min(GROUP);
        for (i, row) in g.rows[r0..r0 + gr].iter().enumerate() {
            for b in 0..nb {
                D::decode(row.as_ptr().add(b * D::BYTES), &mut buf[i * nb + b]);
            }
        }
        for t0 in (0..nt).step_by(TOKENS) {
            let tn = (nt - t0).min(TOKENS);
            let acts = &g.acts[t0..t0 + tn];
            for i in 0..gr {
                let w = buf[i * nb..(i + 1) * nb].as_ptr();
                let out = Out { ptr: g.out.as_mut_ptr().add(t0 * nr + r0 + i), ld: nr };
                match tn {
                    4 => tile_k::<D, 4>(w, nb, acts, out),
                    3 => tile_k::<D, 3>(w, nb, acts, out),
                    2 => tile_k::<D, 2>(w, nb, acts, out),
                    _ => tile_k::<D, 1>(w, nb, acts, out),
                }
            }
        }
    }
}

/// Where a tile's results go: result (r, t) at `ptr + t·ld + r`.
#[derive(Clone, Copy)]
struct Out {
    ptr: *mut f32,
    ld: usize,
}

/// One decoded row (`nb` blocks from `w`) against `T` activation rows.
/// (One row at a time: with two, LLVM's schedule spills the codes of a
/// block to the stack.)
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_k<D: KDecode, const T: usize>(w: *const KBlock, nb: usize, acts: &[&[u8]], out: Out) {
    let ap: [*const u8; T] = std::array::from_fn(|t| acts[t].as_ptr());
    let mut accf = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let blk = &*w.add(b);
        let mut acc = [_mm256_setzero_si256(); T];
        for j in 0..8 {
            let c = load256(blk.codes[j].as_ptr());
            let s = load256(blk.scales[j].as_ptr().cast());
            for t in 0..T {
                let a = load256(ap[t].add(b * Q8K_BYTES + Q8K_QS + 32 * j));
                acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(_mm256_maddubs_epi16(c, a), s));
            }
        }
        let (d, dmin) = (_mm256_set1_ps(blk.d), _mm256_set1_ps(blk.dmin));
        let m = load256(blk.mins.as_ptr().cast());
        for t in 0..T {
            let ab = ap[t].add(b * Q8K_BYTES);
            let mins = _mm256_madd_epi16(load256(ab.add(Q8K_BSUMS)), m);
            let da = _mm256_set1_ps(f32_at(ab));
            if D::JOINT {
                let sumi = _mm256_sub_epi32(acc[t], mins);
                accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(da, d), accf[t]);
            } else {
                accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[t]), _mm256_mul_ps(da, d), accf[t]);
                accf[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(da, dmin), accf[t]);
            }
        }
    }
    for (t, &v) in accf.iter().enumerate() {
        *out.ptr.add(t * out.ld) = hsum_f32x8(v);
    }
}

/// A 32-element format against Q8_0 activations: its signed levels and scale.
pub(super) trait LevelDecode {
    /// Bytes of one block; its f16 scale is the first two.
    const BYTES: usize;
    /// The block's 32 signed levels, element order (−128 included: the sign
    /// trick's pair sums stay within i16 for activation quants in −127..=127).
    ///
    /// # Safety
    /// AVX2 must be available; `p` points at `BYTES` readable bytes.
    unsafe fn levels(p: *const u8) -> __m256i;
}

/// Q8_0 activation block: f16 `d`, 32 i8.
const Q8_0_BYTES: usize = 34;

/// Decoded rows of a 32-element format: levels, then one f32 scale per block.
struct LevelRows {
    levels: Vec<i8>,
    scales: Vec<f32>,
}

/// [`Gemm`] for a 32-element format.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm_32<D: LevelDecode>(g: &mut Gemm) {
    let nb = g.check(32, D::BYTES, Q8_0_BYTES);
    let (nr, nt) = (g.rows.len(), g.acts.len());
    // The activations' scales, widened once: `da[t·nb + b]`.
    let mut da = vec![0f32; nt * nb];
    for (t, a) in g.acts.iter().enumerate() {
        for b in 0..nb {
            da[t * nb + b] = f16_at(a.as_ptr().add(b * Q8_0_BYTES));
        }
    }
    let mut dec = LevelRows { levels: vec![0; GROUP * g.k], scales: vec![0.0; GROUP * nb] };
    for r0 in (0..nr).step_by(GROUP) {
        let gr = (nr - r0).min(GROUP);
        for (i, row) in g.rows[r0..r0 + gr].iter().enumerate() {
            for b in 0..nb {
                let p = row.as_ptr().add(b * D::BYTES);
                let at = (i * nb + b) * 32;
                _mm256_storeu_si256(dec.levels.as_mut_ptr().add(at).cast(), D::levels(p));
                dec.scales[i * nb + b] = f16_at(p);
            }
        }
        for t0 in (0..nt).step_by(TOKENS) {
            let tn = (nt - t0).min(TOKENS);
            let acts = &g.acts[t0..t0 + tn];
            let da = &da[t0 * nb..];
            for i in 0..gr {
                let (lv, sc) = (dec.levels[i * nb * 32..].as_ptr(), dec.scales[i * nb..].as_ptr());
                let out = Out { ptr: g.out.as_mut_ptr().add(t0 * nr + r0 + i), ld: nr };
                match tn {
                    4 => tile_32::<4>(lv, sc, nb, acts, da, out),
                    3 => tile_32::<3>(lv, sc, nb, acts, da, out),
                    2 => tile_32::<2>(lv, sc, nb, acts, da, out),
                    _ => tile_32::<1>(lv, sc, nb, acts, da, out),
                }
            }
        }
    }
}

/// One decoded row (levels from `lv`, scales from `sc`, `nb` blocks)
/// against `T` activation rows with widened scales `da[t·nb + b]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_32<const T: usize>(lv: *const i8, sc: *const f32, nb: usize, acts: &[&[u8]], da: &[f32], out: Out) {
    let ap: [*const u8; T] = std::array::from_fn(|t| acts[t].as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut accf = [_mm256_setzero_ps(); T];
    for b in 0..nb {
        let w = load256(lv.add(b * 32).cast());
        let aw = _mm256_abs_epi8(w);
        let dw = _mm256_set1_ps(*sc.add(b));
        for t in 0..T {
            let a = load256(ap[t].add(b * Q8_0_BYTES + 2));
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), ones);
            let d = _mm256_mul_ps(dw, _mm256_set1_ps(da[t * nb + b]));
            accf[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, accf[t]);
        }
    }
    for (t, &v) in accf.iter().enumerate() {
        *out.ptr.add(t * out.ld) = hsum_f32x8(v);
    }
}
