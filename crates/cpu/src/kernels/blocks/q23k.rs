//! Q2_K (84 B per 256) and Q3_K (110 B) weights against Q8_K activations
//! (292 B: f32 `d`, 256 i8, i16 `bsums[16]`).
//!
//! ```text
//! Q2_K: u8 scales[16], u8 qs[64],                 f16 d, f16 dmin
//! Q3_K: u8 hmask[32],  u8 qs[64], u8 scales[12],  f16 d
//! ```
//! Both place their two low bits alike: in half `h`, element `128h + 32j +
//! l` is bits `2j..2j+2` of `qs[32h + l]`; Q3_K's third bit is bit `4h + j`
//! of `hmask[l]`. A group of 16 (`e/16`) has one scale.
//!
//! The codes are assembled unsigned (Q2_K 0..=3, Q3_K `level + 4` in
//! 0..=7), so `maddubs(code, a)` cannot saturate and takes any activation
//! byte. Per block, as the reference:
//! * Q2_K: `sumi = Σ_g sc_g·Σ q·a` and `summ = Σ_g m_g·bsum_g` in i32, then
//!   `d_a·(d·sumi − dmin·summ)` in f32 (Q4_K's arithmetic);
//! * Q3_K: `sumi = Σ_g s_g·Σ code·a − Σ_g 4·s_g·bsum_g` (`s_g = sc_g − 32`),
//!   the reference's `Σ_g s_g·Σ level·a` exactly, then `d_a·d·sumi` (Q6_K's).
//!
//! The group scales multiply the `maddubs` pair sums by `madd` (AVX2) or
//! `dpwssd` (AVX-512); blocks are summed in row order, so the kernels return
//! the reference's bits.

use std::arch::x86_64::*;

use super::blocks_of;
use super::x86::*;

const QK: usize = 256;
const ACT_BYTES: usize = 292;
const ACT_QS: usize = 4;
const ACT_BSUMS: usize = 260;

/// Where the fields are: Q2_K (`THREE = false`) or Q3_K.
const fn w_bytes(three: bool) -> usize {
    if three {
        110
    } else {
        84
    }
}
const fn qs_at(three: bool) -> usize {
    if three {
        32
    } else {
        16
    }
}
const Q3_SCALES: usize = 96;
const Q3_D: usize = 108;
const Q2_D: usize = 80;
const Q2_DMIN: usize = 82;

/// The sixteen 6-bit scale codes of Q3_K's `scales[12]` at `p`, a byte each
/// (group g in byte g): the low nibbles of words 0 and 1 are groups 0..8,
/// their high nibbles groups 8..16, and word 2 gives each its top two bits,
/// two bits a word-quarter (`docs/spec/quants.md` §7a).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn q3k_codes(p: *const u8) -> __m128i {
    let word = |i: usize| p.add(4 * i).cast::<u32>().read_unaligned();
    let (a0, a1, top) = (word(0), word(1), word(2));
    let (m2, m4) = (0x0303_0303u32, 0x0f0f_0f0fu32);
    _mm_setr_epi32(
        ((a0 & m4) | (top & m2) << 4) as i32,
        ((a1 & m4) | ((top >> 2) & m2) << 4) as i32,
        (((a0 >> 4) & m4) | ((top >> 4) & m2) << 4) as i32,
        (((a1 >> 4) & m4) | ((top >> 6) & m2) << 4) as i32,
    )
}

/// The block's sixteen group scales as i16 (Q2_K: the low nibbles; Q3_K:
/// code − 32), and the i32 lanes of the second term: Q2_K's
/// `m_g·bsum_g` (its mins), Q3_K's `4·s_g·bsum_g` (subtracted).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn scales<const THREE: bool>(wb: *const u8, ab: *const u8) -> (__m256i, __m256i) {
    let bsums = load256(ab.add(ACT_BSUMS));
    if THREE {
        let sc = _mm256_cvtepi8_epi16(_mm_sub_epi8(q3k_codes(wb.add(Q3_SCALES)), _mm_set1_epi8(32)));
        (sc, _mm256_madd_epi16(bsums, _mm256_slli_epi16::<2>(sc)))
    } else {
        let raw = load128(wb);
        let m4 = _mm_set1_epi8(15);
        let sc = _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
        let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
        (sc, _mm256_madd_epi16(bsums, mins))
    }
}

/// `shuffle_epi8` masks picking, from a lane of eight i16 group scales, scale
/// `2j` for the low 128-bit lane and `2j+1` for the high one, broadcast.
const fn scale_pick(j: usize) -> [u8; 32] {
    let mut m = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        let s = 2 * j + i / 16;
        m[i] = (2 * s + i % 2) as u8;
        i += 1;
    }
    m
}
static SCALE_PICK: [[u8; 32]; 4] = [scale_pick(0), scale_pick(1), scale_pick(2), scale_pick(3)];

/// The 32 codes of sub-block `sb` (`4h + j`): the low two bits of `q`
/// (which then moves on by two bits; the 16-bit shift only pulls the next
/// byte's bits into bits 2..8, masked off), and for Q3_K the third bit,
/// bit `sb` of each `hmask` byte in `hm`, as +4.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn next_codes<const THREE: bool>(q: &mut __m256i, hm: __m256i, sb: usize) -> __m256i {
    let mut u = _mm256_and_si256(*q, _mm256_set1_epi8(3));
    *q = _mm256_srli_epi16::<2>(*q);
    if THREE {
        let bit = _mm256_set1_epi8((1u8 << sb) as i8);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
        u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(4)));
    }
    u
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx2<const THREE: bool>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let wbytes = w_bytes(THREE);
    let nb = blocks_of(n, w, act, QK, wbytes, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut sum = 0.0f32;
    for b in 0..nb {
        let (wb, ab) = (wp.add(b * wbytes), ap.add(b * ACT_BYTES));
        let (sc, second) = scales::<THREE>(wb, ab);
        let hm = if THREE { load256(wb) } else { _mm256_setzero_si256() };
        let mut acc = _mm256_setzero_si256();
        for h in 0..2 {
            let mut q = load256(wb.add(qs_at(THREE) + 32 * h));
            // Both 128-bit lanes: the eight i16 scales of this half.
            let sch = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc, sc)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc, sc)
            };
            for (j, pick) in SCALE_PICK.iter().enumerate() {
                let u = next_codes::<THREE>(&mut q, hm, 4 * h + j);
                let a = load256(ab.add(ACT_QS + 128 * h + 32 * j));
                let s = _mm256_shuffle_epi8(sch, load256(pick.as_ptr()));
                acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), s));
            }
        }
        if THREE {
            let sumi = hsum_i32x8(_mm256_sub_epi32(acc, second));
            sum += f32_at(ab) * f16_at(wb.add(Q3_D)) * sumi as f32;
        } else {
            let (sumi, summ) = hsum2_i32x8(acc, second);
            sum += f32_at(ab) * (f16_at(wb.add(Q2_D)) * sumi as f32 - f16_at(wb.add(Q2_DMIN)) * summ as f32);
        }
    }
    sum
}

/// `permutexvar_epi16` indices: for the 64 elements `128h + 64k ..`, i16 lane
/// `i` of the `maddubs` result (elements `2i, 2i+1`) belongs to group
/// `8h + 4k + i/8`.
const fn group_index(h: usize, k: usize) -> [u16; 32] {
    let mut m = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        m[i] = (8 * h + 4 * k + i / 8) as u16;
        i += 1;
    }
    m
}
static GROUP_INDEX: [[u16; 32]; 4] = [group_index(0, 0), group_index(0, 1), group_index(1, 0), group_index(1, 1)];

/// Byte masks of Q3_K's third bits for the 64 elements `128h + 64k ..`: bit
/// `4h + 2k` for the first 32 (j = 2k), bit `4h + 2k + 1` for the next.
const fn hbit_mask(h: usize, k: usize) -> [u8; 64] {
    let mut m = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        m[i] = 1 << (4 * h + 2 * k + i / 32);
        i += 1;
    }
    m
}
static HBIT_MASK: [[u8; 64]; 4] = [hbit_mask(0, 0), hbit_mask(0, 1), hbit_mask(1, 0), hbit_mask(1, 1)];

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx512<const THREE: bool>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let wbytes = w_bytes(THREE);
    let nb = blocks_of(n, w, act, QK, wbytes, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let m3 = _mm512_set1_epi8(3);
    let four = _mm512_set1_epi8(4);
    let mut sum = 0.0f32;
    for b in 0..nb {
        let (wb, ab) = (wp.add(b * wbytes), ap.add(b * ACT_BYTES));
        let (sc, second) = scales::<THREE>(wb, ab);
        let scz = _mm512_castsi256_si512(sc);
        // Q3_K starts from −Σ_g 4·s_g·bsum_g.
        let mut acc = if THREE {
            _mm512_zextsi256_si512(_mm256_sub_epi32(_mm256_setzero_si256(), second))
        } else {
            _mm512_setzero_si512()
        };
        let hm = if THREE { _mm512_broadcast_i64x4(load256(wb)) } else { _mm512_setzero_si512() };
        for h in 0..2 {
            // [qs | qs >> 2]: the codes of j = 0 and 1 at bits 0..2, of
            // j = 2 and 3 at bits 4..6.
            let q = load256(wb.add(qs_at(THREE) + 32 * h));
            let qq = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q), _mm256_srli_epi16::<2>(q));
            for k in 0..2 {
                let mut u =
                    if k == 0 { _mm512_and_si512(qq, m3) } else { _mm512_and_si512(_mm512_srli_epi16::<4>(qq), m3) };
                if THREE {
                    let set = _mm512_test_epi8_mask(hm, _mm512_loadu_si512(HBIT_MASK[2 * h + k].as_ptr().cast()));
                    u = _mm512_mask_add_epi8(u, set, u, four);
                }
                let a = _mm512_loadu_si512(ab.add(ACT_QS + 128 * h + 64 * k).cast());
                let s = _mm512_permutexvar_epi16(_mm512_loadu_si512(GROUP_INDEX[2 * h + k].as_ptr().cast()), scz);
                acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(u, a), s);
            }
        }
        let sumi = _mm512_reduce_add_epi32(acc);
        if THREE {
            sum += f32_at(ab) * f16_at(wb.add(Q3_D)) * sumi as f32;
        } else {
            let summ = hsum_i32x8(second);
            sum += f32_at(ab) * (f16_at(wb.add(Q2_D)) * sumi as f32 - f16_at(wb.add(Q2_DMIN)) * summ as f32);
        }
    }
    sum
}

kernels! {
    q2k_avx2, q2k_avx512, false => Q2_K;
    q3k_avx2, q3k_avx512, true => Q3_K;
}

/// Q2_K (`THREE = false`) or Q3_K blocks, decoded for the prompt GEMM:
/// codes 0..=3 (Q2_K) or `level + 4` in 0..=7 (Q3_K) and the group scales;
/// Q2_K's mins and `dmin` as they are, Q3_K's "mins" `4·s_g` with
/// `dmin = d` (so `d·s·code − d·4·s = d·s·level`).
pub(super) struct K23<const THREE: bool>;

impl<const THREE: bool> super::gemm::KDecode for K23<THREE> {
    const BYTES: usize = w_bytes(THREE);
    const JOINT: bool = THREE;

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(wb: *const u8, out: &mut super::gemm::KBlock) {
        let hm = if THREE { load256(wb) } else { _mm256_setzero_si256() };
        for h in 0..2 {
            let mut q = load256(wb.add(qs_at(THREE) + 32 * h));
            for j in 0..4 {
                let u = next_codes::<THREE>(&mut q, hm, 4 * h + j);
                _mm256_storeu_si256(out.codes[4 * h + j].as_mut_ptr().cast(), u);
            }
        }
        let mut sc = [0i16; 16];
        if THREE {
            let s = _mm256_cvtepi8_epi16(_mm_sub_epi8(q3k_codes(wb.add(Q3_SCALES)), _mm_set1_epi8(32)));
            _mm256_storeu_si256(sc.as_mut_ptr().cast(), s);
            _mm256_storeu_si256(out.mins.as_mut_ptr().cast(), _mm256_slli_epi16::<2>(s));
            out.d = f16_at(wb.add(Q3_D));
            out.dmin = out.d;
        } else {
            let (raw, m4) = (load128(wb), _mm_set1_epi8(15));
            _mm256_storeu_si256(sc.as_mut_ptr().cast(), _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4)));
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(raw), m4));
            _mm256_storeu_si256(out.mins.as_mut_ptr().cast(), mins);
            out.d = f16_at(wb.add(Q2_D));
            out.dmin = f16_at(wb.add(Q2_DMIN));
        }
        for (j, s) in out.scales.iter_mut().enumerate() {
            s[..8].fill(sc[2 * j]);
            s[8..].fill(sc[2 * j + 1]);
        }
    }
}

gemms! {
    q2k_gemm_avx2, gemm_k::<K23<false>> => Q2_K;
    q3k_gemm_avx2, gemm_k::<K23<true>> => Q3_K;
}
