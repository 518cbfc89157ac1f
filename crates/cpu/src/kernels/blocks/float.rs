//! F32, F16 and BF16 weights against f32 activations (`ActType::F32`: `n`
//! little-endian f32s).
//!
//! Weights are widened to f32 (exact for all three) and multiplied into four
//! independent f32 FMA accumulators of 8 (AVX2) or 16 (AVX-512) lanes; the
//! reference accumulates in f64 and rounds once. Each lane is a sequential f32
//! sum of `n/32` (AVX2) or `n/64` (AVX-512) fused products, followed by a few
//! tail and reduction additions, so with `u = 2⁻²⁴` the worst case is about
//! `|Δ| ≤ (n/32 + 16)·u·Σ|w·x|` (AVX2) and `(n/64 + 12)·u·Σ|w·x|` (AVX-512);
//! on random data the error is typically near `u·Σ|w·x|`.

use std::arch::x86_64::*;

use super::blocks_of;
use super::x86::*;

/// One float weight format: widening loads.
trait Float {
    const BYTES: usize;
    /// The weight at `p`, widened.
    unsafe fn one(p: *const u8) -> f32;
    /// Eight weights from `p`, widened.
    unsafe fn eight(p: *const u8) -> __m256;
    /// Sixteen weights from `p`, widened.
    unsafe fn sixteen(p: *const u8) -> __m512;
    /// The weights from `p` in the lanes set in `mask`, widened; the rest 0
    /// (masked-off lanes are not read).
    unsafe fn sixteen_masked(p: *const u8, mask: __mmask16) -> __m512;
}

struct F32;
struct F16;
struct BF16;

impl Float for F32 {
    const BYTES: usize = 4;
    #[inline]
    unsafe fn one(p: *const u8) -> f32 {
        f32_at(p)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn eight(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sixteen(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p.cast())
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sixteen_masked(p: *const u8, mask: __mmask16) -> __m512 {
        _mm512_maskz_loadu_ps(mask, p.cast())
    }
}

impl Float for F16 {
    const BYTES: usize = 2;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn one(p: *const u8) -> f32 {
        f16_at(p)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn eight(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(load128(p))
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sixteen(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(load256(p))
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sixteen_masked(p: *const u8, mask: __mmask16) -> __m512 {
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast()))
    }
}

/// BF16 is the top half of an f32: widen to u32 and shift left by 16.
impl Float for BF16 {
    const BYTES: usize = 2;
    #[inline]
    unsafe fn one(p: *const u8) -> f32 {
        f32::from_bits((p.cast::<u16>().read_unaligned() as u32) << 16)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn eight(p: *const u8) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(load128(p))))
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sixteen(p: *const u8) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(load256(p))))
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn sixteen_masked(p: *const u8, mask: __mmask16) -> __m512 {
        let h = _mm256_maskz_loadu_epi16(mask, p.cast());
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx2<W: Float>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    blocks_of(n, w, act, 1, W::BYTES, 4);
    let (wp, xp) = (w.as_ptr(), act.as_ptr().cast::<f32>());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let j = i + 8 * k;
            *acc = _mm256_fmadd_ps(W::eight(wp.add(j * W::BYTES)), _mm256_loadu_ps(xp.add(j)), *acc);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(W::eight(wp.add(i * W::BYTES)), _mm256_loadu_ps(xp.add(i)), acc[0]);
        i += 8;
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut sum = hsum_f32x8(acc);
    for i in i..n {
        sum += W::one(wp.add(i * W::BYTES)) * xp.add(i).read_unaligned();
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx512<W: Float>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    blocks_of(n, w, act, 1, W::BYTES, 4);
    let (wp, xp) = (w.as_ptr(), act.as_ptr().cast::<f32>());
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 64 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let j = i + 16 * k;
            *acc = _mm512_fmadd_ps(W::sixteen(wp.add(j * W::BYTES)), _mm512_loadu_ps(xp.add(j)), *acc);
        }
        i += 64;
    }
    while i + 16 <= n {
        acc[0] = _mm512_fmadd_ps(W::sixteen(wp.add(i * W::BYTES)), _mm512_loadu_ps(xp.add(i)), acc[0]);
        i += 16;
    }
    if i < n {
        // Masked-off lanes are neither read nor faulted on.
        let mask: __mmask16 = (1u16 << (n - i)) - 1;
        let x = _mm512_maskz_loadu_ps(mask, xp.add(i));
        acc[1] = _mm512_fmadd_ps(W::sixteen_masked(wp.add(i * W::BYTES), mask), x, acc[1]);
    }
    let acc = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    _mm512_reduce_add_ps(acc)
}

kernels! {
    f32_avx2, f32_avx512, F32 => F32;
    f16_avx2, f16_avx512, F16 => F16;
    bf16_avx2, bf16_avx512, BF16 => BF16;
}
