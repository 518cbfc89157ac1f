//! Q6_K weights (210 B per 256: `ql[128]`, `qh[64]`, i8 `scales[16]`, f16 `d`
//! at the end) against Q8_K activations (292 B: f32 `d`, 256 i8, i16
//! `bsums[16]`).
//!
//! The 6-bit codes `q = level + 32` (0..=63) are assembled unsigned, so
//! `maddubs(q, a)` cannot saturate (2·63·127 < 2¹⁵). Per 16-element group `g`
//! the reference sums `sc_g·Σ(q−32)·a`; here that is
//! `Σ_g sc_g·Σ q·a − Σ_g 32·sc_g·bsum_g`, the same integer, formed in i32
//! lanes (`madd`/`dpwssd` of the pair sums with the group scale, and of the
//! activation block sums with `32·sc_g`, which fits i16). The block's f32
//! value and the running sum are computed exactly as the reference does.
//!
//! Element layout (`docs/spec/quants.md` §7): in half `h` (128 elements), element
//! `128h + 32k + l` has its low nibble in `ql[64h + 32(k%2) + l]` (low nibble
//! for k < 2, high for k ≥ 2) and its top two bits at bits `2k..2k+2` of
//! `qh[32h + l]`.

use std::arch::x86_64::*;

use tern_quant::GgmlType;

use super::x86::*;
use super::{blocks_of, Entry};
use crate::isa::Isa;

const QK: usize = 256;
const W_BYTES: usize = 210;
const ACT_BYTES: usize = 292;
const QH: usize = 128;
const SCALES: usize = 192;
const D: usize = 208;
const ACT_QS: usize = 4;
const ACT_BSUMS: usize = 260;

/// `shuffle_epi8` masks picking, from a lane of eight i16 group scales, scale
/// `2k` for the low 128-bit lane and `2k+1` for the high one, broadcast.
const fn scale_pick(k: usize) -> [u8; 32] {
    let mut m = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let s = 2 * k + i / 16;
        m[i] = (2 * s + i % 2) as u8;
        i += 1;
    }
    m
}
static SCALE_PICK: [[u8; 32]; 4] = [scale_pick(0), scale_pick(1), scale_pick(2), scale_pick(3)];

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_avx2(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W_BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut sum = 0.0f32;
    for b in 0..nb {
        let (wb, ab) = (wp.add(b * W_BYTES), ap.add(b * ACT_BYTES));
        let sc = _mm256_cvtepi8_epi16(load128(wb.add(SCALES)));
        // Σ_g 32·sc_g·bsum_g, subtracted at the end.
        let offset = _mm256_madd_epi16(load256(ab.add(ACT_BSUMS)), _mm256_slli_epi16::<5>(sc));
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let q = half_codes(wb, h);
            // Both 128-bit lanes: the eight i16 scales of this half.
            let sch = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc, sc)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc, sc)
            };
            for (k, &q) in q.iter().enumerate() {
                let a = load256(ab.add(ACT_QS + 128 * h + 32 * k));
                let s = _mm256_shuffle_epi8(sch, load256(SCALE_PICK[k].as_ptr()));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), s));
            }
        }
        let sumi = hsum_i32x8(_mm256_sub_epi32(acc, offset));
        sum += f32_at(ab) * f16_at(wb.add(D)) * sumi as f32;
    }
    sum
}

/// The block's codes in element order: sub-block `4h + k` is `q[k]` of half `h`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn half_codes(wb: *const u8, h: usize) -> [__m256i; 4] {
    let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    let l0 = load256(wb.add(64 * h));
    let l1 = load256(wb.add(64 * h + 32));
    let hb = load256(wb.add(QH + 32 * h));
    [
        _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16::<4>(hb), m30)),
        _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16::<2>(hb), m30)),
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(l0), m4), _mm256_and_si256(hb, m30)),
        _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m4),
            _mm256_and_si256(_mm256_srli_epi16::<2>(hb), m30),
        ),
    ]
}

/// Q6_K blocks, decoded for the prompt GEMM: codes `q` (0..=63), the group
/// scales, "mins" `32·sc_g` and `dmin = d`, so `d·sc·q − d·32·sc = d·sc·(q − 32)`.
struct K6;

impl super::gemm::KDecode for K6 {
    const BYTES: usize = W_BYTES;
    const JOINT: bool = true;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(wb: *const u8, out: &mut super::gemm::KBlock) {
        for h in 0..2 {
            for (k, q) in half_codes(wb, h).into_iter().enumerate() {
                _mm256_storeu_si256(out.codes[4 * h + k].as_mut_ptr().cast(), q);
            }
        }
        for g in 0..16 {
            let s = *wb.add(SCALES + g) as i8 as i16;
            out.scales[g / 2][8 * (g % 2)..8 * (g % 2) + 8].fill(s);
            out.mins[g] = 32 * s;
        }
        out.d = f16_at(wb.add(D));
        out.dmin = out.d;
    }
}

gemms! {
    q6k_gemm_avx2, gemm_k::<K6> => Q6_K;
}

/// `permutexvar_epi16` indices: for the 64 elements `128h + 64j ..`, i16 lane
/// `i` of the `maddubs` result (elements `2i, 2i+1`) belongs to group
/// `8h + 4j + i/8`.
const fn group_index(h: usize, j: usize) -> [u16; 32] {
    let mut m = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        m[i] = (8 * h + 4 * j + i / 8) as u16;
        i += 1;
    }
    m
}
static GROUP_INDEX: [[u16; 32]; 4] = [group_index(0, 0), group_index(0, 1), group_index(1, 0), group_index(1, 1)];

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_avx512(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let nb = blocks_of(n, w, act, QK, W_BYTES, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let mut sum = 0.0f32;
    for b in 0..nb {
        let (wb, ab) = (wp.add(b * W_BYTES), ap.add(b * ACT_BYTES));
        let sc = _mm256_cvtepi8_epi16(load128(wb.add(SCALES)));
        let scz = _mm512_castsi256_si512(sc);
        let offset = _mm256_madd_epi16(load256(ab.add(ACT_BSUMS)), _mm256_slli_epi16::<5>(sc));
        let mut acc = _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), offset));
        for h in 0..2 {
            // ql[64h..64h+64]: low nibbles are elements 0..64 of the half,
            // high nibbles 64..128.
            let l = _mm512_loadu_si512(wb.add(64 * h).cast());
            let hb = load256(wb.add(QH + 32 * h));
            // Top bits: elements 0..32 at bits 0..2 of hb, 32..64 at bits 2..4,
            // 64..96 at bits 4..6, 96..128 at bits 6..8. hh = [hb | hb >> 2].
            let hh = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(hb), _mm256_srli_epi16::<2>(hb));
            let q01 = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_slli_epi16::<4>(hh), m30));
            let q23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(l), m4), _mm512_and_si512(hh, m30));
            for (j, q) in [q01, q23].into_iter().enumerate() {
                let a = _mm512_loadu_si512(ab.add(ACT_QS + 128 * h + 64 * j).cast());
                let idx = _mm512_loadu_si512(GROUP_INDEX[2 * h + j].as_ptr().cast());
                let s = _mm512_permutexvar_epi16(idx, scz);
                acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, a), s);
            }
        }
        let sumi = _mm512_reduce_add_epi32(acc);
        sum += f32_at(ab) * f16_at(wb.add(D)) * sumi as f32;
    }
    sum
}

/// This file's kernels, by weight type and ISA level.
pub(super) const KERNELS: &[Entry] = &[
    Entry { ty: GgmlType::Q6_K, isa: Isa::Avx2, dot: q6k_avx2 },
    Entry { ty: GgmlType::Q6_K, isa: Isa::Avx512, dot: q6k_avx512 },
];
