//! The 32-element formats with a leading f16 scale and no minimum — Q8_0
//! (34 B), Q4_0 and IQ4_NL (18 B), Q5_0 (22 B) — against Q8_0 activations
//! (34 B: f16 `d`, 32 i8). (Q4_1 and Q5_1, which add a minimum, are in
//! `q32min.rs`, with the nibble and fifth-bit decoders here.)
//!
//! The block's exact i32 sum `Σ level·a` is formed in lanes and collected by
//! a transposing reduction over 8 (AVX2) or 16 (AVX-512) blocks at once; the
//! sums are converted to f32 (exact: |Σ| ≤ 32·128·128 < 2²⁴), scaled by
//! `d_w·d_a` and accumulated in f32 lanes.
//!
//! * AVX2: signed levels, sign trick `maddubs(|w|, a·sign w)`; exact for
//!   activation quants in −127..=127 (the `maddubs` pair sums stay below
//!   2·128·127 < 2¹⁵).
//! * AVX-512 (`dpbusd`, also for the last < 16 blocks): unsigned codes `u = level + off` (Q4_0: nibble, off 8;
//!   Q5_0: nibble + 16·fifth bit, off 16; IQ4_NL: table + 128; Q8_0: `w ^ 0x80`, off 128) and
//!   `Σ level·a = Σ u·a + Σ (a + 128)·(−off) + 128·off·32`, two `dpbusd`
//!   with the constant folded into the accumulator's start value; exact for
//!   every byte value.
//!
//! Q5_0's fifth bits (a u32, bit j for element j) become bytes by a
//! shuffle that gives each byte its bit's source byte, an AND with that
//! bit and a compare (AVX2), or as a byte mask (AVX-512).

use std::arch::x86_64::*;

use tern_quant::q4_0::KVALUES_IQ4NL;

use super::blocks_of;
use super::x86::*;
use super::x86_512::*;

const QK: usize = 32;
/// Bytes of one Q8_0 activation block: f16 `d`, then 32 quants.
const ACT_BYTES: usize = 34;

/// One weight format: how a block becomes 32 levels.
trait Q32 {
    /// Bytes per block; the f16 scale is the first two.
    const BYTES: usize;
    /// The 32 signed levels of the block at `p`, element order.
    unsafe fn levels(p: *const u8) -> __m256i;
    /// `level = code − OFFSET` for the codes of [`Q32::codes`] and [`Q32::codes2`].
    const OFFSET: i32;
    /// The 32 unsigned codes of the block at `p`, element order.
    unsafe fn codes(p: *const u8) -> __m256i;
    /// Whether [`Q32::codes2`] returns the split layout.
    const SPLIT: bool = false;
    /// The codes of the blocks at `p` and `p + BYTES` in one vector, either
    /// whole blocks (`[b0 | b1]`) or, if `SPLIT`, by 16-element halves
    /// (`[b0 0..16, b1 0..16, b0 16..32, b1 16..32]`, cheaper for nibbles).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes2(p: *const u8) -> __m512i {
        _mm512_inserti64x4::<1>(_mm512_castsi256_si512(Self::codes(p)), Self::codes(p.add(Self::BYTES)))
    }
}

struct Q8_0;
struct Q4_0;
struct IQ4NL;
struct Q5_0;

impl Q32 for Q8_0 {
    const BYTES: usize = 34;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn levels(p: *const u8) -> __m256i {
        load256(p.add(2))
    }
    const OFFSET: i32 = 128;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes(p: *const u8) -> __m256i {
        _mm256_xor_si256(load256(p.add(2)), _mm256_set1_epi8(-128))
    }
}

/// The 32 nibbles at `q` (16 bytes) in element order: low nibbles of
/// `q[0..16]` are elements 0..16, high nibbles elements 16..32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn nibbles_at(q: *const u8) -> __m256i {
    let x = load128(q);
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(x), x), _mm256_set1_epi8(0x0F))
}

/// The 32 nibbles of an 18-byte block (`qs` after the f16 scale).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles(p: *const u8) -> __m256i {
    nibbles_at(p.add(2))
}

/// The nibbles of the 16 bytes at `q` and at `q + stride` (two blocks'
/// `qs`), split layout (see [`Q32::codes2`]): low nibbles are the first 16
/// elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn nibbles2_at(q: *const u8, stride: usize) -> __m512i {
    let x = _mm256_loadu2_m128i(q.add(stride).cast(), q.cast());
    let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi16::<4>(x));
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
}

/// The nibbles of the 18-byte blocks at `p` and `p + 18`, split layout.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibbles2(p: *const u8) -> __m512i {
    nibbles2_at(p.add(2), 18)
}

/// The little-endian u32 of fifth bits at `p` (bit j for element j).
#[inline]
pub(super) unsafe fn fifth_bits(p: *const u8) -> u32 {
    p.cast::<u32>().read_unaligned()
}

/// Byte j is 0xFF where bit j of `bits` is set, 0 elsewhere.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn bit_bytes(bits: u32) -> __m256i {
    // Byte j takes source byte j/8 (the shuffle stays in 128-bit lanes, and
    // each lane holds the four source bytes), then tests its bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, //
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        ),
    );
    let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
}

/// The 5-bit codes (0..=31) of a block's nibbles at `q` and fifth bits `bits`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn codes5(q: *const u8, bits: u32) -> __m256i {
    _mm256_or_si256(nibbles_at(q), _mm256_and_si256(bit_bytes(bits), _mm256_set1_epi8(0x10)))
}

/// [`codes5`] of two blocks (nibbles at `q` and `q + stride`, fifth bits
/// `bits0` and `bits1`) in the split layout of [`nibbles2_at`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn codes5x2(q: *const u8, stride: usize, bits0: u32, bits1: u32) -> __m512i {
    let (b0, b1) = (bits0 as u64, bits1 as u64);
    // Byte order: block 0 elements 0..16, block 1 0..16, block 0 16..32, block 1 16..32.
    let mask = (b0 & 0xFFFF) | (b1 & 0xFFFF) << 16 | (b0 >> 16) << 32 | (b1 >> 16) << 48;
    _mm512_or_si512(nibbles2_at(q, stride), _mm512_maskz_mov_epi8(mask, _mm512_set1_epi8(0x10)))
}

impl Q32 for Q4_0 {
    const BYTES: usize = 18;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn levels(p: *const u8) -> __m256i {
        _mm256_sub_epi8(nibbles(p), _mm256_set1_epi8(8))
    }
    const OFFSET: i32 = 8;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes(p: *const u8) -> __m256i {
        nibbles(p)
    }
    const SPLIT: bool = true;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes2(p: *const u8) -> __m512i {
        nibbles2(p)
    }
}

/// The IQ4_NL levels shifted by +128 into 1..=241, as unsigned bytes.
const IQ4NL_CODES: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES_IQ4NL[i] as i32 + 128) as u8;
        i += 1;
    }
    t
};

impl Q32 for IQ4NL {
    const BYTES: usize = 18;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn levels(p: *const u8) -> __m256i {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        _mm256_shuffle_epi8(table, nibbles(p))
    }
    const OFFSET: i32 = 128;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes(p: *const u8) -> __m256i {
        let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_CODES.as_ptr().cast()));
        _mm256_shuffle_epi8(table, nibbles(p))
    }
    const SPLIT: bool = true;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes2(p: *const u8) -> __m512i {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(IQ4NL_CODES.as_ptr().cast()));
        _mm512_shuffle_epi8(table, nibbles2(p))
    }
}

/// Q5_0: `f16 d, u32 qh, u8 qs[16]`, levels `code − 16`.
impl Q32 for Q5_0 {
    const BYTES: usize = 22;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn levels(p: *const u8) -> __m256i {
        // code − 16 is the nibble where the fifth bit is set, the nibble − 16
        // (its top bits set) where it is clear.
        let set = bit_bytes(fifth_bits(p.add(2)));
        _mm256_or_si256(nibbles_at(p.add(6)), _mm256_andnot_si256(set, _mm256_set1_epi8(-16)))
    }
    const OFFSET: i32 = 16;
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn codes(p: *const u8) -> __m256i {
        codes5(p.add(6), fifth_bits(p.add(2)))
    }
    const SPLIT: bool = true;
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    #[inline]
    unsafe fn codes2(p: *const u8) -> __m512i {
        codes5x2(p.add(6), 22, fifth_bits(p.add(2)), fifth_bits(p.add(24)))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx2<W: Q32>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W::BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut acc = _mm256_setzero_ps();
    let mut b = 0;
    while b + 8 <= nb {
        let mut s = [_mm256_setzero_si256(); 8];
        for (k, s) in s.iter_mut().enumerate() {
            let (wb, ab) = (wp.add((b + k) * W::BYTES), ap.add((b + k) * ACT_BYTES));
            *s = dot_i8x32(W::levels(wb), load256(ab.add(2)));
        }
        let sums = _mm256_cvtepi32_ps(reduce8x8(&s));
        let dw = f16x8_strided(wp.add(b * W::BYTES), W::BYTES);
        let da = f16x8_strided(ap.add(b * ACT_BYTES), ACT_BYTES);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, da), sums, acc);
        b += 8;
    }
    let mut sum = hsum_f32x8(acc);
    for b in b..nb {
        let (wb, ab) = (wp.add(b * W::BYTES), ap.add(b * ACT_BYTES));
        let sumi = hsum_i32x8(dot_i8x32(W::levels(wb), load256(ab.add(2))));
        sum += f16_at(wb) * f16_at(ab) * sumi as f32;
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx512<W: Q32>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W::BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut acc = _mm512_setzero_ps();
    let mut b = 0;
    while b + 16 <= nb {
        let mut s = [_mm512_setzero_si512(); 8];
        for (k, s) in s.iter_mut().enumerate() {
            let (wb, ab) = (wp.add((b + 2 * k) * W::BYTES), ap.add((b + 2 * k) * ACT_BYTES));
            let mut av = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(load256(ab.add(2))), load256(ab.add(36)));
            if W::SPLIT {
                av = _mm512_shuffle_i64x2::<0b11_01_10_00>(av, av);
            }
            *s = dot_codes(W::codes2(wb), av, W::OFFSET);
        }
        let sums = _mm512_cvtepi32_ps(reduce16(&s, W::SPLIT));
        let dw = scales16(wp.add(b * W::BYTES), W::BYTES);
        let da = scales16(ap.add(b * ACT_BYTES), ACT_BYTES);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(dw, da), sums, acc);
        b += 16;
    }
    let mut sum = _mm512_reduce_add_ps(acc);
    for b in b..nb {
        let (wb, ab) = (wp.add(b * W::BYTES), ap.add(b * ACT_BYTES));
        let sumi = hsum_i32x8(dot_codes256(W::codes(wb), load256(ab.add(2)), W::OFFSET));
        sum += f16_at(wb) * f16_at(ab) * sumi as f32;
    }
    sum
}

kernels! {
    q8_0_avx2, q8_0_avx512, Q8_0 => Q8_0;
    q4_0_avx2, q4_0_avx512, Q4_0 => Q4_0;
    iq4nl_avx2, iq4nl_avx512, IQ4NL => IQ4_NL;
    q5_0_avx2, q5_0_avx512, Q5_0 => Q5_0;
}

impl<F: Q32> super::gemm::LevelDecode for F {
    const BYTES: usize = F::BYTES;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn levels(p: *const u8) -> __m256i {
        F::levels(p)
    }
}

gemms! {
    q8_0_gemm_avx2, gemm_32::<Q8_0> => Q8_0;
    q4_0_gemm_avx2, gemm_32::<Q4_0> => Q4_0;
    iq4nl_gemm_avx2, gemm_32::<IQ4NL> => IQ4_NL;
    q5_0_gemm_avx2, gemm_32::<Q5_0> => Q5_0;
}
