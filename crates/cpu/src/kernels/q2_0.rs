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
    /// quants and scales as the reference's activation rows), tokens split
    /// over the pool's threads.
    pub fn new(x: &[f32], k: usize, planes: bool, pool: &crate::pool::Pool) -> Q2Acts {
        assert!(k.is_multiple_of(QK) && x.len().is_multiple_of(k), "Q2_0 rows are whole 64-weight blocks");
        let m = x.len() / k;
        let halves = k / 32;
        let mut acts = Q2Acts { k, m, q: vec![0; m * k], d: vec![0.0; m * halves], sum: vec![0; m * halves], planes };
        let (q, d, sum) = (Shared(acts.q.as_mut_ptr()), Shared(acts.d.as_mut_ptr()), Shared(acts.sum.as_mut_ptr()));
        pool.for_chunks(m, 4, |tokens| {
            let mut row = vec![0u8; tern_quant::act_row_bytes(ActType::Q8_0, k)];
            for t in tokens {
                // SAFETY: token t's slices belong to this thread alone.
                let (q, d, sum) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(q.at(t * k), k),
                        std::slice::from_raw_parts_mut(d.at(t * halves), halves),
                        std::slice::from_raw_parts_mut(sum.at(t * halves), halves),
                    )
                };
                tern_quant::quantize_acts(ActType::Q8_0, &x[t * k..(t + 1) * k], &mut row);
                let blocks = tern_quant::cast_blocks::<BlockQ8_0>(&row);
                for (h, b) in blocks.iter().enumerate() {
                    d[h] = b.scale();
                    sum[h] = b.qs.iter().map(|&q| q as i32).sum();
                    if !planes {
                        q[32 * h..32 * h + 32].copy_from_slice(&b.qs);
                        continue;
                    }
                    // Plane order: weight 4i + p of a 64-block goes to 16p + i.
                    let dst = &mut q[32 * (h & !1)..32 * (h & !1) + QK];
                    for (e, &v) in b.qs.iter().enumerate() {
                        let j = 32 * (h & 1) + e;
                        dst[16 * (j % 4) + j / 4] = v;
                    }
                }
            }
        });
        acts
    }

    fn q(&self, t: usize) -> &[i8] {
        &self.q[t * self.k..(t + 1) * self.k]
    }
}

/// Tokens from which a product decodes panels; fewer read the blocks as
/// stored, each row once for all its tokens.
pub const PANEL_TOKENS: usize = 4;

thread_local! {
    /// A thread's decoded panel, kept between products (fresh pages would be
    /// faulted in on every call).
    static PANEL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `y [n, m] = W [k, n] · x [k, m]` for Q2_0 `w` (`n` rows of `k`), on the
/// pool's threads, 16 rows a claim.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `y` holds `n · m` floats.
#[cfg(target_arch = "x86_64")]
pub unsafe fn mul_mat(w: &[u8], k: usize, n: usize, x: &[f32], y: &mut [f32], pool: &crate::pool::Pool) {
    let m = x.len() / k;
    let acts = Q2Acts::new(x, k, m < PANEL_TOKENS, pool);
    let out = Out { ptr: y.as_mut_ptr(), ld: n };
    pool.for_chunks_claimed(n.div_ceil(PANEL_ROWS), 1, |g| {
        let rows = g.start * PANEL_ROWS..(g.end * PANEL_ROWS).min(n);
        // SAFETY: each claim writes its own rows; the caller checked the ISA.
        unsafe {
            if acts.planes {
                gemv(w, rows, &acts, out)
            } else {
                PANEL.with_borrow_mut(|p| gemm(w, rows, &acts, out, p))
            }
        }
    });
}

/// A base pointer that threads index by disjoint parts.
struct Shared<T>(*mut T);
// SAFETY: every thread touches only its own part.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// # Safety
    /// `i` is in bounds of the allocation.
    unsafe fn at(&self, i: usize) -> *mut T {
        self.0.add(i)
    }
}

/// Where a product writes: `y[t · ld + r]`, each thread its own rows (the
/// ternary kernels' output handle).
pub use super::ternary::Out;

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
            let mut acc = _mm256_setzero_ps();
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
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), sc, acc);
            }
            *out.ptr.add(t * out.ld + r) = hsum(acc);
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
        while t0 + 4 <= acts.m {
            tile::<4>(codes, scales, acts, t0, r0, nr, out);
            t0 += 4;
        }
        while t0 < acts.m {
            tile::<1>(codes, scales, acts, t0, r0, nr, out);
            t0 += 1;
        }
        r0 += nr;
    }
}

/// Rows `r0..r0 + nr` (the rest of 16 as zeros) into the panel: step `s`
/// (weights `4s..4s + 4`) is 64 bytes, rows 0..8 then 8..16, 4 code bytes
/// a row; then per block 16 f32 scales. A gather takes code bytes
/// `4g..4g + 4` of 8 rows at once; each byte's four codes spread to the
/// four bytes of its row's lane by shifts (`b | b << 6 | b << 12 | b << 18`,
/// then the low 2 bits of each byte).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_panel(w: &[u8], k: usize, r0: usize, nr: usize, panel: &mut [u8]) {
    let nb = k / QK;
    let scales_at = k / 4 * 64;
    let row_bytes = nb * BLOCK_BYTES;
    let dst = panel.as_mut_ptr();
    let m3 = _mm256_set1_epi8(3);
    for v in 0..2 {
        // Rows past the matrix read row r0 (any valid row) and are zeroed below.
        let idx: [i32; 8] = std::array::from_fn(|j| {
            let r = 8 * v + j;
            if r < nr {
                (r * row_bytes) as i32
            } else {
                0
            }
        });
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(nr as i32 - 8 * v as i32), lanes);
        let idx = _mm256_loadu_si256(idx.as_ptr() as *const __m256i);
        let base = w.as_ptr().add(r0 * row_bytes);
        for b in 0..nb {
            for g in 0..4 {
                let words = _mm256_i32gather_epi32::<1>(base.add(b * BLOCK_BYTES + 2 + 4 * g) as *const i32, idx);
                let words = _mm256_and_si256(words, valid);
                for e in 0..4 {
                    let byte = _mm256_and_si256(
                        _mm256_srlv_epi32(words, _mm256_set1_epi32(8 * e as i32)),
                        _mm256_set1_epi32(0xff),
                    );
                    let spread = _mm256_or_si256(
                        _mm256_or_si256(byte, _mm256_slli_epi32::<6>(byte)),
                        _mm256_or_si256(_mm256_slli_epi32::<12>(byte), _mm256_slli_epi32::<18>(byte)),
                    );
                    let s = b * 16 + 4 * g + e;
                    _mm256_storeu_si256(dst.add(s * 64 + 32 * v) as *mut __m256i, _mm256_and_si256(spread, m3));
                }
            }
        }
    }
    for j in 0..PANEL_ROWS {
        for b in 0..nb {
            let d = if j < nr { f16_at(w.as_ptr().add((r0 + j) * row_bytes + b * BLOCK_BYTES)) } else { 0.0 };
            (dst.add(scales_at + (b * PANEL_ROWS + j) * 4) as *mut f32).write_unaligned(d);
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
