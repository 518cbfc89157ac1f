//! The 32-element formats with a leading f16 scale — Q8_0 (34 B), Q4_0 and
//! IQ4_NL (18 B) — against Q8_0 activations (34 B: f16 `d`, 32 i8).
//!
//! The block's exact i32 sum `Σ level·a` is formed in lanes and collected by
//! a transposing reduction over 8 (AVX2) or 16 (AVX-512) blocks at once; the
//! sums are converted to f32 (exact: |Σ| ≤ 32·128·128 < 2²⁴), scaled by
//! `d_w·d_a` and accumulated in f32 lanes.
//!
//! * AVX2: signed levels, sign trick `maddubs(|w|, a·sign w)`; exact for
//!   activation quants in −127..=127 (the `maddubs` pair sums stay below
//!   2·128·127 < 2¹⁵).
//! * AVX-512 (`dpbusd`, also for the last < 16 blocks): unsigned codes `u = level + off` (Q4_0: nibble, off 8; IQ4_NL:
//!   table + 128; Q8_0: `w ^ 0x80`, off 128) and
//!   `Σ level·a = Σ u·a + Σ (a + 128)·(−off) + 128·off·32`, two `dpbusd`
//!   with the constant folded into the accumulator's start value; exact for
//!   every byte value.

use std::arch::x86_64::*;

use tern_quant::q4_0::KVALUES_IQ4NL;

use super::blocks_of;
use super::x86::*;

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

/// The 32 nibbles of an 18-byte block in element order: low nibbles of
/// `qs[0..16]` are elements 0..16, high nibbles elements 16..32.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let x = load128(p.add(2));
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(x), x), _mm256_set1_epi8(0x0F))
}

/// The nibbles of the 18-byte blocks at `p` and `p + 18`, split layout (see
/// [`Q32::codes2`]): low nibbles are the first 16 elements.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibbles2(p: *const u8) -> __m512i {
    let x = _mm256_loadu2_m128i(p.add(20).cast(), p.add(2).cast());
    let z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(x), _mm256_srli_epi16::<4>(x));
    _mm512_and_si512(z, _mm512_set1_epi8(0x0F))
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

/// Sixteen dot products of four, `Σ (u − off)·a` per i32 lane, for unsigned
/// codes `u` and signed quants `a`: `Σ u·a` plus `Σ (a ^ 0x80)·(−off)`, which
/// is `−off·Σa − 512·off`, from a start value of `512·off`. Exact for all
/// bytes with 0 ≤ off ≤ 128.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_codes(u: __m512i, a: __m512i, off: i32) -> __m512i {
    let s = _mm512_dpbusd_epi32(_mm512_set1_epi32(512 * off), u, a);
    let a_biased = _mm512_xor_si512(a, _mm512_set1_epi8(-128));
    _mm512_dpbusd_epi32(s, a_biased, _mm512_set1_epi8((-off) as i8))
}

/// [`dot_codes`] for one block (eight lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_codes256(u: __m256i, a: __m256i, off: i32) -> __m256i {
    let s = _mm256_dpbusd_epi32(_mm256_set1_epi32(512 * off), u, a);
    let a_biased = _mm256_xor_si256(a, _mm256_set1_epi8(-128));
    _mm256_dpbusd_epi32(s, a_biased, _mm256_set1_epi8((-off) as i8))
}

/// Reduces eight vectors, each holding two blocks' partial sums (block `2k` in
/// lanes 0..8 of `v[k]`, block `2k+1` in lanes 8..16; if `split`, block `2k`
/// in lanes 0..4 and 8..12, block `2k+1` in lanes 4..8 and 12..16), to one
/// vector of the sixteen block sums. The result is in a transposed order: lane `4j + t`
/// holds block `j + 4t` (see [`LANE_BLOCK`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn reduce16(v: &[__m512i; 8], split: bool) -> __m512i {
    // 8 lanes per block -> 4: one block per 128-bit lane, blocks 4m..4m+4.
    // Whole blocks: block 2k in 128-bit lanes 0, 1 of v[k]; split: lanes 0, 2.
    let fold1 = |a: __m512i, b: __m512i| {
        if split {
            _mm512_add_epi32(_mm512_shuffle_i64x2::<0b01_00_01_00>(a, b), _mm512_shuffle_i64x2::<0b11_10_11_10>(a, b))
        } else {
            _mm512_add_epi32(_mm512_shuffle_i64x2::<0b10_00_10_00>(a, b), _mm512_shuffle_i64x2::<0b11_01_11_01>(a, b))
        }
    };
    let w0 = fold1(v[0], v[1]);
    let w1 = fold1(v[2], v[3]);
    let w2 = fold1(v[4], v[5]);
    let w3 = fold1(v[6], v[7]);
    // 4 -> 2: 128-bit lane j holds blocks j, j+4 (u0) and j+8, j+12 (u1).
    let u0 = _mm512_add_epi32(_mm512_unpacklo_epi64(w0, w1), _mm512_unpackhi_epi64(w0, w1));
    let u1 = _mm512_add_epi32(_mm512_unpacklo_epi64(w2, w3), _mm512_unpackhi_epi64(w2, w3));
    // 2 -> 1: lane 4j + t holds block j + 4t.
    let (e, f) = (_mm512_castsi512_ps(u0), _mm512_castsi512_ps(u1));
    let even = _mm512_castps_si512(_mm512_shuffle_ps::<0b10_00_10_00>(e, f));
    let odd = _mm512_castps_si512(_mm512_shuffle_ps::<0b11_01_11_01>(e, f));
    _mm512_add_epi32(even, odd)
}

/// The block whose sum [`reduce16`] leaves in each lane.
const LANE_BLOCK: [i32; 16] = [0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15];

/// The f16 scales of sixteen blocks of `stride` bytes from `p`, widened, in
/// [`reduce16`]'s lane order.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn scales16(p: *const u8, stride: usize) -> __m512 {
    let idx = _mm512_mullo_epi32(_mm512_loadu_si512(LANE_BLOCK.as_ptr().cast()), _mm512_set1_epi32(stride as i32));
    // Reads 4 bytes per block: the f16 and the first two quant bytes.
    let g = _mm512_i32gather_epi32::<1>(idx, p.cast());
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g))
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
    q8_0_avx2, q8_0_avx512, Q8_0;
    q4_0_avx2, q4_0_avx512, Q4_0;
    iq4nl_avx2, iq4nl_avx512, IQ4NL;
}
