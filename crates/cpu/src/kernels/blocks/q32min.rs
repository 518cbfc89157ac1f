//! The 32-element formats with a scale and a minimum — Q4_1 (20 B: f16 `d`,
//! f16 `m`, 16 B of nibbles) and Q5_1 (24 B: `d`, `m`, a u32 of fifth
//! bits, 16 B of nibbles) — against Q8_0 activations (34 B: f16 `d_a`, 32
//! i8). A block contributes `d·d_a·Σ c·a + m·d_a·Σ a` for its unsigned codes
//! `c` (0..=15 or 0..=31), as the scalar twin (`tern_quant::q4_1`) forms it.
//!
//! Both integer sums are exact for every byte value, activation −128
//! included: AVX2 takes `maddubs(c, a)` (pair sums at most 2·31·128 < 2¹⁵)
//! and `maddubs(1, a)`, widened by `madd`; AVX-512 takes `dpbusd(c, a)` and
//! `dpbusd(1, a)`, two blocks per vector in the nibbles' split layout. The
//! sums of 8 (AVX2) or 16 (AVX-512) blocks are collected by the transposing
//! reductions, converted to f32 (exact: below 2²⁴), and each block's value
//! is formed with the scalar twin's f32 operations in its order
//! (`(d·d_a)·Σca + (m·d_a)·Σa`), then added to the row's sum block by block
//! in row order. So these kernels return the scalar twin's bits, as the
//! k-quant kernels do: the two terms of a block nearly cancel where its
//! values straddle zero, and a sum in another order would differ from the
//! twin by roundings of the terms, not of the result.

use std::arch::x86_64::*;

use super::blocks_of;
use super::q32::{codes5, codes5x2, fifth_bits, nibbles2_at, nibbles_at};
use super::x86::*;
use super::x86_512::*;

const QK: usize = 32;
/// Bytes of one Q8_0 activation block: f16 `d`, then 32 quants.
const ACT_BYTES: usize = 34;

/// One weight format: its block size and how a block becomes 32 codes. The
/// f16 `d` is at byte 0 and the f16 `m` at byte 2 of every block.
trait QMin {
    const BYTES: usize;
    /// The 32 unsigned codes of the block at `p`, element order.
    unsafe fn codes(p: *const u8) -> __m256i;
    /// The codes of the blocks at `p` and `p + BYTES` by 16-element halves:
    /// `[b0 0..16, b1 0..16, b0 16..32, b1 16..32]`.
    unsafe fn codes2(p: *const u8) -> __m512i;
}

struct Q4_1;
struct Q5_1;

impl QMin for Q4_1 {
    const BYTES: usize = 20;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes(p: *const u8) -> __m256i {
        nibbles_at(p.add(4))
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes2(p: *const u8) -> __m512i {
        nibbles2_at(p.add(4), 20)
    }
}

impl QMin for Q5_1 {
    const BYTES: usize = 24;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes(p: *const u8) -> __m256i {
        codes5(p.add(8), fifth_bits(p.add(4)))
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes2(p: *const u8) -> __m512i {
        codes5x2(p.add(8), 24, fifth_bits(p.add(4)), fifth_bits(p.add(28)))
    }
}

/// `Σ c·a` and `Σ a` of one block in eight i32 lanes each.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn sums_avx2(c: __m256i, a: __m256i) -> (__m256i, __m256i) {
    let ones16 = _mm256_set1_epi16(1);
    let ca = _mm256_madd_epi16(_mm256_maddubs_epi16(c, a), ones16);
    let sa = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), ones16);
    (ca, sa)
}

/// One block's value from its scales and exact sums, as the scalar twin.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_value(wb: *const u8, ab: *const u8, ca: i32, sa: i32) -> f32 {
    let da = f16_at(ab);
    f16_at(wb) * da * ca as f32 + f16_at(wb.add(2)) * da * sa as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx2<W: QMin>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W::BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut sum = 0.0f32;
    let mut b = 0;
    while b + 8 <= nb {
        let mut s = [_mm256_setzero_si256(); 8];
        let mut t = [_mm256_setzero_si256(); 8];
        for k in 0..8 {
            let (wb, ab) = (wp.add((b + k) * W::BYTES), ap.add((b + k) * ACT_BYTES));
            (s[k], t[k]) = sums_avx2(W::codes(wb), load256(ab.add(2)));
        }
        let ca = _mm256_cvtepi32_ps(reduce8x8(&s));
        let sa = _mm256_cvtepi32_ps(reduce8x8(&t));
        let wb = wp.add(b * W::BYTES);
        let da = f16x8_strided(ap.add(b * ACT_BYTES), ACT_BYTES);
        let dd = _mm256_mul_ps(f16x8_strided(wb, W::BYTES), da);
        let md = _mm256_mul_ps(f16x8_strided(wb.add(2), W::BYTES), da);
        let mut values = [0.0f32; 8];
        _mm256_storeu_ps(values.as_mut_ptr(), _mm256_add_ps(_mm256_mul_ps(dd, ca), _mm256_mul_ps(md, sa)));
        for v in values {
            sum += v;
        }
        b += 8;
    }
    for b in b..nb {
        let (wb, ab) = (wp.add(b * W::BYTES), ap.add(b * ACT_BYTES));
        let (ca, sa) = sums_avx2(W::codes(wb), load256(ab.add(2)));
        let (ca, sa) = hsum2_i32x8(ca, sa);
        sum += block_value(wb, ab, ca, sa);
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx512<W: QMin>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W::BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let ones = _mm512_set1_epi8(1);
    let mut sum = 0.0f32;
    let mut b = 0;
    while b + 16 <= nb {
        let mut s = [_mm512_setzero_si512(); 8];
        let mut t = [_mm512_setzero_si512(); 8];
        for k in 0..8 {
            let (wb, ab) = (wp.add((b + 2 * k) * W::BYTES), ap.add((b + 2 * k) * ACT_BYTES));
            let av = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load256(ab.add(2))), load256(ab.add(36)));
            // By halves, as the codes: [a0 0..16, a1 0..16, a0 16..32, a1 16..32].
            let av = _mm512_shuffle_i64x2::<0b11_01_10_00>(av, av);
            s[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), W::codes2(wb), av);
            t[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, av);
        }
        let ca = _mm512_cvtepi32_ps(reduce16(&s, true));
        let sa = _mm512_cvtepi32_ps(reduce16(&t, true));
        let wb = wp.add(b * W::BYTES);
        let da = scales16(ap.add(b * ACT_BYTES), ACT_BYTES);
        let dd = _mm512_mul_ps(scales16(wb, W::BYTES), da);
        let md = _mm512_mul_ps(scales16(wb.add(2), W::BYTES), da);
        let mut values = [0.0f32; 16];
        _mm512_storeu_ps(values.as_mut_ptr(), _mm512_add_ps(_mm512_mul_ps(dd, ca), _mm512_mul_ps(md, sa)));
        // Block m's value is in lane LANE_BLOCK[m] (the order is its own inverse).
        for lane in LANE_BLOCK {
            sum += values[lane as usize];
        }
        b += 16;
    }
    for b in b..nb {
        let (wb, ab) = (wp.add(b * W::BYTES), ap.add(b * ACT_BYTES));
        let a = load256(ab.add(2));
        let ca = _mm256_dpbusd_epi32(_mm256_setzero_si256(), W::codes(wb), a);
        let sa = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), a);
        let (ca, sa) = hsum2_i32x8(ca, sa);
        sum += block_value(wb, ab, ca, sa);
    }
    sum
}

kernels! {
    q4_1_avx2, q4_1_avx512, Q4_1 => Q4_1;
    q5_1_avx2, q5_1_avx512, Q5_1 => Q5_1;
}
