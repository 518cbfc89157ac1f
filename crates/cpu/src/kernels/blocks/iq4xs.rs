//! IQ4_XS weights (136 B per 256: f16 `d`, u16 `scales_h`, `scales_l[4]`,
//! `qs[128]`) against Q8_K activations (292 B: f32 `d`, 256 i8, i16
//! `bsums[16]`).
//!
//! Sub-block `b` (32 elements) is `qs[16b..16b+16]`, low nibbles first, each
//! nibble an index into IQ4_NL's table (levels −127..=113), with the signed
//! scale `s_b = code_b − 32` (−32..=31). Per block the reference's integer
//! `Σ_b s_b·Σ level·a` is formed exactly, then `d_a·d·sum` in f32; blocks are
//! summed in row order, so the kernels return the reference's bits.
//!
//! * AVX2: levels by a table shuffle, `maddubs(|level|, a·sign level)` (the
//!   sign trick: exact for activation quants in −127..=127, what
//!   `quantize_acts` writes), `madd` by the sub-block scale.
//! * AVX-512: levels widened to i16 and multiplied by the scale (|·| ≤
//!   4064), `dpwssd` with the widened activations: exact for every byte.

use std::arch::x86_64::*;

use tern_quant::q4_0::KVALUES_IQ4NL;
use tern_quant::GgmlType;

use super::q32::nibbles_at;
use super::x86::*;
use super::{blocks_of, Entry};
use crate::isa::Isa;

const QK: usize = 256;
const W_BYTES: usize = 136;
const ACT_BYTES: usize = 292;
const ACT_QS: usize = 4;
const SCALES_H: usize = 2;
const SCALES_L: usize = 4;
const QS: usize = 8;

/// The eight sub-block scales `code − 32` of the block at `wb`.
#[inline]
unsafe fn scales(wb: *const u8) -> [i16; 8] {
    let high = wb.add(SCALES_H).cast::<u16>().read_unaligned();
    let low = wb.add(SCALES_L).cast::<u32>().read_unaligned();
    std::array::from_fn(|b| ((low >> (4 * b)) & 15 | ((high as u32 >> (2 * b)) & 3) << 4) as i16 - 32)
}

/// The 32 signed levels of sub-block `b` of the block at `wb`, element order.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn levels(wb: *const u8, b: usize) -> __m256i {
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    _mm256_shuffle_epi8(table, nibbles_at(wb.add(QS + 16 * b)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_avx2(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W_BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut sum = 0.0f32;
    for blk in 0..nb {
        let (wb, ab) = (wp.add(blk * W_BYTES), ap.add(blk * ACT_BYTES));
        let sc = scales(wb);
        let mut acc = _mm256_setzero_si256();
        // Two sub-blocks a step: in the 32 bytes of `qs`, the low nibbles are
        // elements 0..16 of each (one per 128-bit lane), the high nibbles
        // elements 16..32; the activations are arranged to match.
        for p in 0..4 {
            let q = load256(wb.add(QS + 32 * p));
            let lo = _mm256_shuffle_epi8(table, _mm256_and_si256(q, m4));
            let hi = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
            let a0 = load256(ab.add(ACT_QS + 64 * p));
            let a1 = load256(ab.add(ACT_QS + 64 * p + 32));
            let alo = _mm256_permute2x128_si256::<0x20>(a0, a1);
            let ahi = _mm256_permute2x128_si256::<0x31>(a0, a1);
            let plo = _mm256_maddubs_epi16(_mm256_abs_epi8(lo), _mm256_sign_epi8(alo, lo));
            let phi = _mm256_maddubs_epi16(_mm256_abs_epi8(hi), _mm256_sign_epi8(ahi, hi));
            // Both sums are i16 pair sums ≤ 2·127·127: add them as i16 only
            // after the scale (madd), in i32.
            let s = _mm256_set_m128i(_mm_set1_epi16(sc[2 * p + 1]), _mm_set1_epi16(sc[2 * p]));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, s));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, s));
        }
        sum += f32_at(ab) * f16_at(wb) * hsum_i32x8(acc) as f32;
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4xs_avx512(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W_BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut sum = 0.0f32;
    for blk in 0..nb {
        let (wb, ab) = (wp.add(blk * W_BYTES), ap.add(blk * ACT_BYTES));
        let sc = scales(wb);
        let mut acc = _mm512_setzero_si512();
        for (b, &s) in sc.iter().enumerate() {
            let lv = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(levels(wb, b)), _mm512_set1_epi16(s));
            let a = _mm512_cvtepi8_epi16(load256(ab.add(ACT_QS + 32 * b)));
            acc = _mm512_dpwssd_epi32(acc, lv, a);
        }
        sum += f32_at(ab) * f16_at(wb) * _mm512_reduce_add_epi32(acc) as f32;
    }
    sum
}

/// This file's kernels, by weight type and ISA level.
pub(super) const KERNELS: &[Entry] = &[
    Entry { ty: GgmlType::IQ4_XS, isa: Isa::Avx2, dot: iq4xs_avx2 },
    Entry { ty: GgmlType::IQ4_XS, isa: Isa::Avx512, dot: iq4xs_avx512 },
];
