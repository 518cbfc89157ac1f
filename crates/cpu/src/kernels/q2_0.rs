//! Q2_0 matrix products on AVX2: weights in the file's blocks (64 weights,
//! an f16 scale `d`, 16 bytes of 2-bit codes, weight `4i + p` in bits `2p`
//! of byte `i`, value `d · (code − 1)`, codes 0..=3 so −1, 0, +1 and +2)
//! against Q8_0 activations, the pairing of `tern_quant::vec_dot`.
//!
//! Every kernel forms the reference's integers exactly: per 32-weight half
//! of a block, `Σ code·q − Σ q` (`vpmaddubsw` of unsigned codes by signed
//! quants, at most 2 · 3 · 127 a 16-bit pair), then scales it by
//! `d_w · d_a` in f32. Only the order of the float sums differs from the
//! reference (which sums each block's two halves, then the blocks, in
//! order), so results agree to a few ulps of `Σ |d_w · d_a · isum|`.
//!
//! - **One token** (`gemv`): a block's 16 code bytes, loaded into both
//!   halves of a vector and shifted by 0/2 and 4/6 bits, give the four
//!   planes (plane `p` of byte `i` is weight `4i + p`) in two vectors; the
//!   activations are laid out per block in the same plane order when they
//!   are quantized ([`Q2Acts`] with `planes`), so no shuffles run per row.
//! - **Prompts** (`gemm`): 16 rows at a time are decoded once into a panel
//!   of code bytes, 4 weights of 8 rows per 32-byte vector, and their block
//!   scales as f32; a tile broadcasts 4 activations of a token against it
//!   and keeps 16-bit sums of 8 rows per vector over a 32-weight half
//!   (no horizontal sums), which one `vpmaddwd`, a conversion and an FMA
//!   fold into f32 per half.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use tern_quant::{ActType, BlockQ8_0};

/// Weights a block, and its bytes (f16 scale + 16 code bytes).
const QK: usize = 64;
const BLOCK_BYTES: usize = 18;
/// Rows a prompt panel decodes at a time (two 8-row vectors).
const PANEL_ROWS: usize = 16;

/// Q8_0 activations of `m` tokens, split into what the kernels read: the
/// quants (in plane order within each 64-block when `planes`), and per
/// 32-weight half its scale and quant sum.
pub struct Q2Acts {
    pub k: usize,
    pub m: usize,
    q: Vec<i8>,
    d: Vec<f32>,
    sum: Vec<i32>,
    planes: bool,
}

impl Q2Acts {
    /// Quantizes `m = x.len() / k` tokens as `ActType::Q8_0` does (the same
    /// quants and scales as the reference's activation rows).
    pub fn new(x: &[f32], k: usize, planes: bool) -> Q2Acts {
        assert!(k.is_multiple_of(QK) && x.len().is_multiple_of(k), "Q2_0 rows are whole 64-weight blocks");
        let m = x.len() / k;
        let halves = k / 32;
        let mut acts = Q2Acts { k, m, q: vec![0; m * k], d: vec![0.0; m * halves], sum: vec![0; m * halves], planes };
        let mut row = vec![0u8; tern_quant::act_row_bytes(ActType::Q8_0, k)];
        for t in 0..m {
            tern_quant::quantize_acts(ActType::Q8_0, &x[t * k..(t + 1) * k], &mut row);
            let blocks = tern_quant::cast_blocks::<BlockQ8_0>(&row);
            for (h, b) in blocks.iter().enumerate() {
                acts.d[t * halves + h] = b.scale();
                acts.sum[t * halves + h] = b.qs.iter().map(|&q| q as i32).sum();
            }
            let q = &mut acts.q[t * k..(t + 1) * k];
            for (j, v) in blocks.iter().flat_map(|b| b.qs).enumerate() {
                // Plane order: weight 4i + p of a block goes to 16p + i.
                let (blk, e) = (j / QK, j % QK);
                let at = if planes { blk * QK + 16 * (e % 4) + e / 4 } else { j };
                q[at] = v;
            }
        }
        acts
    }

    fn q(&self, t: usize) -> &[i8] {
        &self.q[t * self.k..(t + 1) * self.k]
    }
}

/// Where a product writes: `y[t · ld + r]`, each thread its own rows.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    pub ld: usize,
}

// SAFETY: callers give each thread a disjoint row range.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// `y[t·ld + r] = W[r] · x[t]` for one-token activations (`planes`), every
/// token of `acts`, rows `rows` of `w` (`k / 64` blocks a row).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `out` valid for the written
/// indices, which no one else writes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemv(w: &[u8], rows: std::ops::Range<usize>, acts: &Q2Acts, out: Out) {
    debug_assert!(acts.planes);
    let nb = acts.k / QK;
    let row_bytes = nb * BLOCK_BYTES;
    // Per token and block: the lane scales [d0 d0 d1 d1 d0 d0 d1 d1] and
    // the lane offsets [−Σq0 0 −Σq1 0 0 0 0 0] that turn Σ code·q into
    // Σ (code − 1)·q (lanes 0, 1, 4, 5 sum the first half's weights).
    let mut lane_d = vec![0f32; acts.m * nb * 8];
    let mut lane_sum = vec![0i32; acts.m * nb * 8];
    for t in 0..acts.m {
        for b in 0..nb {
            let (h0, h1) = (t * 2 * nb + 2 * b, t * 2 * nb + 2 * b + 1);
            let (d0, d1) = (acts.d[h0], acts.d[h1]);
            lane_d[(t * nb + b) * 8..][..8].copy_from_slice(&[d0, d0, d1, d1, d0, d0, d1, d1]);
            lane_sum[(t * nb + b) * 8] = -acts.sum[h0];
            lane_sum[(t * nb + b) * 8 + 2] = -acts.sum[h1];
        }
    }
    let (m3, ones) = (_mm256_set1_epi8(3), _mm256_set1_epi16(1));
    let (sh01, sh23) = (_mm256_setr_epi64x(0, 0, 2, 2), _mm256_setr_epi64x(4, 4, 6, 6));
    for r in rows {
        let row = w.as_ptr().add(r * row_bytes);
        crate::kernels::prefetch(row.wrapping_add(8 * row_bytes), row_bytes);
        for t in 0..acts.m {
            let (q, ld, ls) = (acts.q(t).as_ptr(), lane_d.as_ptr().add(t * nb * 8), lane_sum.as_ptr().add(t * nb * 8));
            // Two chains over alternate blocks keep the FMA latency hidden.
            let mut acc = [_mm256_setzero_ps(); 2];
            for b in 0..nb {
                let blk = row.add(b * BLOCK_BYTES);
                let dw = _mm256_set1_ps(f16_at(blk));
                let c = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(2) as *const __m128i));
                let p01 = _mm256_and_si256(_mm256_srlv_epi64(c, sh01), m3);
                let p23 = _mm256_and_si256(_mm256_srlv_epi64(c, sh23), m3);
                let a01 = _mm256_loadu_si256(q.add(b * QK) as *const __m256i);
                let a23 = _mm256_loadu_si256(q.add(b * QK + 32) as *const __m256i);
                let s = _mm256_add_epi16(_mm256_maddubs_epi16(p01, a01), _mm256_maddubs_epi16(p23, a23));
                let i =
                    _mm256_add_epi32(_mm256_madd_epi16(s, ones), _mm256_loadu_si256(ls.add(8 * b) as *const __m256i));
                let sc = _mm256_mul_ps(dw, _mm256_loadu_ps(ld.add(8 * b)));
                acc[b % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, acc[b % 2]);
            }
            *out.ptr.add(t * out.ld + r) = hsum(_mm256_add_ps(acc[0], acc[1]));
        }
    }
}

/// `y[t·ld + r] = W[r] · x[t]` for prompt activations (natural order), every
/// token, rows `rows`: 16-row panels decoded into `panel` (resized here).
///
/// # Safety
/// As [`gemv`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn gemm(w: &[u8], rows: std::ops::Range<usize>, acts: &Q2Acts, out: Out, panel: &mut Vec<u8>) {
    debug_assert!(!acts.planes);
    let k = acts.k;
    let scales_at = k / 4 * 64;
    panel.resize(scales_at + k / QK * PANEL_ROWS * 4, 0);
    let mut r0 = rows.start;
    while r0 < rows.end {
        let nr = (rows.end - r0).min(PANEL_ROWS);
        decode_panel(w, k, r0, nr, panel);
        let (codes, scales) = panel.split_at(scales_at);
        let scales = scales.as_ptr() as *const f32;
        let mut t0 = 0;
        while t0 + 2 <= acts.m {
            tile::<2>(codes, scales, acts, t0, r0, nr, out);
            t0 += 2;
        }
        if t0 < acts.m {
            tile::<1>(codes, scales, acts, t0, r0, nr, out);
        }
        r0 += nr;
    }
}

/// Rows `r0..r0 + nr` (the rest of 16 as zeros) into the panel: step `s`
/// (weights `4s..4s + 4`) is 64 bytes, rows 0..8 then 8..16, 4 code bytes
/// a row; then per block 16 f32 scales.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn decode_panel(w: &[u8], k: usize, r0: usize, nr: usize, panel: &mut [u8]) {
    let nb = k / QK;
    let scales_at = k / 4 * 64;
    let row_bytes = nb * BLOCK_BYTES;
    for j in 0..PANEL_ROWS {
        let lane = (j / 8) * 32 + (j % 8) * 4;
        if j >= nr {
            for s in 0..k / 4 {
                panel[s * 64 + lane..][..4].fill(0);
            }
            for b in 0..nb {
                panel[scales_at + (b * PANEL_ROWS + j) * 4..][..4].fill(0);
            }
            continue;
        }
        let row = &w[(r0 + j) * row_bytes..(r0 + j + 1) * row_bytes];
        for (b, blk) in row.chunks_exact(BLOCK_BYTES).enumerate() {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            panel[scales_at + (b * PANEL_ROWS + j) * 4..][..4].copy_from_slice(&d.to_le_bytes());
            for (i, &c) in blk[2..].iter().enumerate() {
                let s = b * 16 + i;
                panel[s * 64 + lane..][..4].copy_from_slice(&[c & 3, (c >> 2) & 3, (c >> 4) & 3, c >> 6]);
            }
        }
    }
}

/// 16 panel rows × `TT` tokens from `t0`; writes rows `r0..r0 + nr`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const TT: usize>(
    codes: &[u8],
    scales: *const f32,
    acts: &Q2Acts,
    t0: usize,
    r0: usize,
    nr: usize,
    out: Out,
) {
    let (k, halves) = (acts.k, acts.k / 32);
    let ones = _mm256_set1_epi16(1);
    let q: [*const i8; TT] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr());
    let mut facc = [[_mm256_setzero_ps(); TT]; 2];
    let mut p = codes.as_ptr();
    for h in 0..k / 32 {
        let mut acc = [[_mm256_setzero_si256(); TT]; 2];
        for s in 8 * h..8 * h + 8 {
            let w0 = _mm256_loadu_si256(p as *const __m256i);
            let w1 = _mm256_loadu_si256(p.add(32) as *const __m256i);
            for t in 0..TT {
                let a = _mm256_set1_epi32((q[t].add(4 * s) as *const i32).read_unaligned());
                acc[0][t] = _mm256_add_epi16(acc[0][t], _mm256_maddubs_epi16(w0, a));
                acc[1][t] = _mm256_add_epi16(acc[1][t], _mm256_maddubs_epi16(w1, a));
            }
            p = p.add(64);
        }
        let sc = scales.add(h / 2 * PANEL_ROWS);
        for t in 0..TT {
            let i = (t0 + t) * halves + h;
            let (da, sum) = (_mm256_set1_ps(acts.d[i]), _mm256_set1_epi32(acts.sum[i]));
            for v in 0..2 {
                let dot = _mm256_sub_epi32(_mm256_madd_epi16(acc[v][t], ones), sum);
                let s = _mm256_mul_ps(_mm256_loadu_ps(sc.add(8 * v)), da);
                facc[v][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), s, facc[v][t]);
            }
        }
    }
    for (t, (lo, hi)) in facc[0].iter().zip(&facc[1]).enumerate() {
        let mut y = [0f32; PANEL_ROWS];
        _mm256_storeu_ps(y.as_mut_ptr(), *lo);
        _mm256_storeu_ps(y.as_mut_ptr().add(8), *hi);
        let dst = out.ptr.add((t0 + t) * out.ld + r0);
        std::ptr::copy_nonoverlapping(y.as_ptr(), dst, nr);
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = p.cast::<u16>().read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    let x = _mm_add_ss(x, _mm_movehdup_ps(x));
    _mm_cvtss_f32(x)
}
