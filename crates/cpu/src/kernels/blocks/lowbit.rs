//! The low-bit formats whose 18-byte blocks (f16 `d`, then 16 bytes of
//! codes) span several Q8_0 activation blocks (34 B: f16 `d`, 32 i8):
//! Q1_0, 128 elements of sign bits, taken as codes `u = 2·bit`, so that
//! `d·(u − 1)` is `±d`. (Q2_0 has whole-matrix kernels of its own,
//! `kernels/q2_0.rs`.)
//!
//! Each element's code `u` is formed unsigned and every activation block's
//! exact i32 `Σ (u − 1)·a` is `Σ u·a − Σ a`, the activation block's own sum
//! folding the −1 in (no per-element subtraction):
//! * AVX-512: one 64-element chunk of codes per 512-bit vector (half a
//!   Q1_0 block: its 64 bits are the mask of a byte move); `dpbusd` of codes
//!   and quants, and the sum `−Σa` from a second `dpbusd` of the biased
//!   quants (`x86_512::dot_codes`); 16 activation blocks' sums are reduced
//!   together and scaled in 16 f32 lanes.
//! * AVX2: `maddubs(u, a) − maddubs(1, a)` in i16 (at most 2·3·128 a pair, so
//!   nothing saturates), `madd` to i32; 8 activation blocks at a time.
//!
//! Both are exact for every weight and activation byte. The scaled sums are
//! `(d·d_a)·s` per activation block, as the scalar twin forms them, summed
//! in 16 or 8 f32 lanes (order differs, ≈1 ulp per block). Codes come in
//! element order.

use std::arch::x86_64::*;

use super::blocks_of;
use super::x86::*;
use super::x86_512::*;

/// Bytes of one weight block: f16 `d`, 16 bytes of codes.
const W_BYTES: usize = 18;
/// Bytes of one Q8_0 activation block: f16 `d`, then 32 quants.
const ACT_BYTES: usize = 34;

/// One format: where its codes come from.
trait LowBit {
    /// Elements per weight block: a multiple of 64.
    const ELEMS: usize;
    /// The unsigned codes of the 32 elements of activation block `j` of the
    /// weight block at `p`, in element order.
    unsafe fn codes32(p: *const u8, j: usize) -> __m256i;
    /// The codes of the 64 elements of activation blocks `2h` and `2h + 1`.
    unsafe fn codes64(p: *const u8, h: usize) -> __m512i;
}

/// The activation quants of the block at `a`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn acts32(a: *const u8) -> __m256i {
    load256(a.add(2))
}

/// The activation quants of the blocks at `a` and `a + 34`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn acts64(a: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load256(a.add(2))), load256(a.add(ACT_BYTES + 2)))
}

/// Eight i32 lanes of `Σ (u − 1)·a`, exact for codes `u` ≤ 3 and any quants.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot32(u: __m256i, a: __m256i) -> __m256i {
    let pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a), _mm256_maddubs_epi16(_mm256_set1_epi8(1), a));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

struct Q1_0;

impl LowBit for Q1_0 {
    const ELEMS: usize = 128;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes32(p: *const u8, j: usize) -> __m256i {
        // Byte i of the result tests bit i%8 of byte i/8 of the four at 4j.
        let q = _mm256_set1_epi32(p.add(2 + 4 * j).cast::<i32>().read_unaligned());
        let bytes = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(q, bytes), bit), bit);
        _mm256_and_si256(set, _mm256_set1_epi8(2))
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes64(p: *const u8, h: usize) -> __m512i {
        let bits = p.add(2 + 8 * h).cast::<u64>().read_unaligned();
        _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(2))
    }
}

/// Activation blocks per weight block.
const fn per_block<F: LowBit>() -> usize {
    F::ELEMS / 32
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx2<F: LowBit>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let r = per_block::<F>();
    let na = blocks_of(n, w, act, F::ELEMS, W_BYTES, r * ACT_BYTES) * r;
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    // Lane k's weight scale: block k / r of the eight activation blocks' span.
    let w_idx = _mm256_mullo_epi32(
        _mm256_srlv_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(r.trailing_zeros() as i32)),
        _mm256_set1_epi32(W_BYTES as i32),
    );
    let mut acc = _mm256_setzero_ps();
    let mut j = 0;
    while j + 8 <= na {
        let mut s = [_mm256_setzero_si256(); 8];
        for (k, s) in s.iter_mut().enumerate() {
            let b = j + k;
            *s = dot32(F::codes32(wp.add(b / r * W_BYTES), b % r), acts32(ap.add(b * ACT_BYTES)));
        }
        let sums = _mm256_cvtepi32_ps(reduce8x8(&s));
        let dw = f16x8_at(wp.add(j / r * W_BYTES), w_idx);
        let da = f16x8_strided(ap.add(j * ACT_BYTES), ACT_BYTES);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), sums, acc);
        j += 8;
    }
    let mut sum = hsum_f32x8(acc);
    for b in j..na {
        let (wb, ab) = (wp.add(b / r * W_BYTES), ap.add(b * ACT_BYTES));
        let sumi = hsum_i32x8(dot32(F::codes32(wb, b % r), acts32(ab)));
        sum += f16_at(wb) * f16_at(ab) * sumi as f32;
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx512<F: LowBit>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let r = per_block::<F>();
    let na = blocks_of(n, w, act, F::ELEMS, W_BYTES, r * ACT_BYTES) * r;
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    // Lane i's weight scale: that of activation block LANE_BLOCK[i] of the 16.
    let lanes = _mm512_loadu_si512(LANE_BLOCK.as_ptr().cast());
    let w_idx = _mm512_mullo_epi32(
        _mm512_srlv_epi32(lanes, _mm512_set1_epi32(r.trailing_zeros() as i32)),
        _mm512_set1_epi32(W_BYTES as i32),
    );
    let mut acc = _mm512_setzero_ps();
    let mut j = 0;
    while j + 16 <= na {
        let mut s = [_mm512_setzero_si512(); 8];
        for (k, s) in s.iter_mut().enumerate() {
            let b = j + 2 * k;
            let codes = F::codes64(wp.add(b / r * W_BYTES), b % r / 2);
            *s = dot_codes(codes, acts64(ap.add(b * ACT_BYTES)), 1);
        }
        let sums = _mm512_cvtepi32_ps(reduce16(&s, false));
        let dw = f16x16_at(wp.add(j / r * W_BYTES), w_idx);
        let da = scales16(ap.add(j * ACT_BYTES), ACT_BYTES);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), sums, acc);
        j += 16;
    }
    let mut sum = _mm512_reduce_add_ps(acc);
    for b in j..na {
        let (wb, ab) = (wp.add(b / r * W_BYTES), ap.add(b * ACT_BYTES));
        let sumi = hsum_i32x8(dot_codes256(F::codes32(wb, b % r), acts32(ab), 1));
        sum += f16_at(wb) * f16_at(ab) * sumi as f32;
    }
    sum
}

kernels! {
    q1_0_avx2, q1_0_avx512, Q1_0 => Q1_0;
}
