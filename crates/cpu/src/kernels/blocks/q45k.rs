//! Q4_K (144 B per 256) and Q5_K (176 B) weights against Q8_K activations
//! (292 B: f32 `d`, 256 i8, i16 `bsums[16]`).
//!
//! ```text
//! Q4_K: f16 d, f16 dmin, u8 scales[12],             u8 qs[128]
//! Q5_K: f16 d, f16 dmin, u8 scales[12], u8 qh[32],  u8 qs[128]
//! ```
//! Chunk `c` (64 elements) is `qs[32c..32c+32]`: low nibbles are sub-block
//! `2c`, high nibbles sub-block `2c+1`; Q5_K adds bit `2c` (low) / `2c+1`
//! (high) of `qh[l]` as the fifth bit of element `l` of the chunk's halves.
//!
//! Per block, as the reference: `sumi = Σ_j sc_j·Σ q·a` and
//! `summ = Σ_j m_j·(bsum_2j + bsum_2j+1)` in i32 (levels unsigned, so
//! `maddubs` pair sums stay ≤ 2·31·127), then
//! `d_a·(d·sumi − dmin·summ)` in f32, summed in block order — the reference's
//! float operations exactly.

use std::arch::x86_64::*;

use super::blocks_of;
use super::x86::*;

const QK: usize = 256;
const ACT_BYTES: usize = 292;
const ACT_QS: usize = 4;
const ACT_BSUMS: usize = 260;
const SCALES: usize = 4;
/// Where `qs` starts: after `scales` (Q4_K) or after `qh` (Q5_K).
const fn qs_at(five: bool) -> usize {
    if five {
        48
    } else {
        16
    }
}
const fn w_bytes(five: bool) -> usize {
    if five {
        176
    } else {
        144
    }
}
const QH: usize = 16;

/// The eight 6-bit scales and eight 6-bit mins of `scales[12]` at `p`, one per
/// byte of each u64 (sub-block `j` in byte `j`); `docs/spec/quants.md` §5:
/// * j < 4: `sc = q[j] & 63`, `m = q[j+4] & 63`;
/// * j ≥ 4: `sc = (q[j+4] & 15) | (q[j-4] >> 6) << 4`, `m = (q[j+4] >> 4) | (q[j] >> 6) << 4`.
#[inline]
unsafe fn scales_mins(p: *const u8) -> (u64, u64) {
    let q = |i: usize| p.add(4 * i).cast::<u32>().read_unaligned();
    let (w0, w1, w2) = (q(0), q(1), q(2));
    let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
    let m_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
    let sc = (w0 & 0x3F3F_3F3F) as u64 | (sc_hi as u64) << 32;
    let m = (w1 & 0x3F3F_3F3F) as u64 | (m_hi as u64) << 32;
    (sc, m)
}

/// `Σ_j m_j·(bsum_2j + bsum_2j+1)` as eight i32 lanes (`madd` of the sixteen
/// block sums with each min repeated twice).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn mins_dot(m: u64, ab: *const u8) -> __m256i {
    let m8 = _mm_cvtsi64_si128(m as i64);
    let m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
    _mm256_madd_epi16(load256(ab.add(ACT_BSUMS)), m16)
}

/// `shuffle_epi8` masks broadcasting i16 scale `j` of a lane of eight.
const fn scale_pick(j: usize) -> [u8; 32] {
    let mut m = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        m[i] = (2 * j + i % 2) as u8;
        i += 1;
    }
    m
}
static SCALE_PICK: [[u8; 32]; 8] = [
    scale_pick(0),
    scale_pick(1),
    scale_pick(2),
    scale_pick(3),
    scale_pick(4),
    scale_pick(5),
    scale_pick(6),
    scale_pick(7),
];

/// Chunk `c`'s codes of block `wb`: sub-block `2c` (low nibbles) and `2c+1`
/// (high), with Q5_K's fifth bits from `hb`, which moves on to the next chunk.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn chunk_codes<const FIVE: bool>(wb: *const u8, c: usize, hb: &mut __m256i) -> (__m256i, __m256i) {
    let (m4, m10) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x10));
    let qs = load256(wb.add(qs_at(FIVE) + 32 * c));
    let mut lo = _mm256_and_si256(qs, m4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), m4);
    if FIVE {
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(*hb), m10));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(*hb), m10));
        *hb = _mm256_srli_epi16::<2>(*hb);
    }
    (lo, hi)
}

#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx2<const FIVE: bool>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let wbytes = w_bytes(FIVE);
    let nb = blocks_of(n, w, act, QK, wbytes, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let mut sum = 0.0f32;
    for b in 0..nb {
        let (wb, ab) = (wp.add(b * wbytes), ap.add(b * ACT_BYTES));
        let (sc, m) = scales_mins(wb.add(SCALES));
        let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let mins = mins_dot(m, ab);
        // Q5_K: bits 0 and 1 of each byte are the fifth bits of chunk c
        // (shifted down by 2 per chunk; the 16-bit shifts only pull
        // neighbouring bits into bits 2..8, which are never read).
        let mut hb = if FIVE { load256(wb.add(QH)) } else { _mm256_setzero_si256() };
        let mut acc = _mm256_setzero_si256();
        for c in 0..4 {
            let (lo, hi) = chunk_codes::<FIVE>(wb, c, &mut hb);
            let a0 = load256(ab.add(ACT_QS + 64 * c));
            let a1 = load256(ab.add(ACT_QS + 64 * c + 32));
            let s0 = _mm256_shuffle_epi8(scv, load256(SCALE_PICK[2 * c].as_ptr()));
            let s1 = _mm256_shuffle_epi8(scv, load256(SCALE_PICK[2 * c + 1].as_ptr()));
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), s0);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), s1);
            acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
        }
        let (sumi, summ) = hsum2_i32x8(acc, mins);
        sum += f32_at(ab) * (f16_at(wb) * sumi as f32 - f16_at(wb.add(2)) * summ as f32);
    }
    sum
}

/// Four activation rows against one weight row: each block's scales and
/// codes are decoded once for the four, and each row's sums are formed with
/// [`dot_avx2`]'s operations in its order, so each result is its bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot4_avx2<const FIVE: bool>(n: usize, w: &[u8], acts: [&[u8]; 4]) -> [f32; 4] {
    let wbytes = w_bytes(FIVE);
    let nb = blocks_of(n, w, acts[0], QK, wbytes, ACT_BYTES);
    for a in &acts[1..] {
        blocks_of(n, w, a, QK, wbytes, ACT_BYTES);
    }
    let wp = w.as_ptr();
    let aps = acts.map(|a| a.as_ptr());
    let mut sums = [0.0f32; 4];
    for b in 0..nb {
        let wb = wp.add(b * wbytes);
        let (sc, m) = scales_mins(wb.add(SCALES));
        let scv = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let mut hb = if FIVE { load256(wb.add(QH)) } else { _mm256_setzero_si256() };
        let mut codes = [[_mm256_setzero_si256(); 2]; 4];
        let mut scales = [[_mm256_setzero_si256(); 2]; 4];
        for c in 0..4 {
            let (lo, hi) = chunk_codes::<FIVE>(wb, c, &mut hb);
            codes[c] = [lo, hi];
            scales[c] = [
                _mm256_shuffle_epi8(scv, load256(SCALE_PICK[2 * c].as_ptr())),
                _mm256_shuffle_epi8(scv, load256(SCALE_PICK[2 * c + 1].as_ptr())),
            ];
        }
        let (d, dmin) = (f16_at(wb), f16_at(wb.add(2)));
        for (t, sum) in sums.iter_mut().enumerate() {
            let ab = aps[t].add(b * ACT_BYTES);
            let mins = mins_dot(m, ab);
            let mut acc = _mm256_setzero_si256();
            for c in 0..4 {
                let a0 = load256(ab.add(ACT_QS + 64 * c));
                let a1 = load256(ab.add(ACT_QS + 64 * c + 32));
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(codes[c][0], a0), scales[c][0]);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(codes[c][1], a1), scales[c][1]);
                acc = _mm256_add_epi32(acc, _mm256_add_epi32(p0, p1));
            }
            let (sumi, summ) = hsum2_i32x8(acc, mins);
            *sum += f32_at(ab) * (d * sumi as f32 - dmin * summ as f32);
        }
    }
    sums
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_dot4_avx2(n: usize, w: &[u8], acts: [&[u8]; 4]) -> [f32; 4] {
    dot4_avx2::<false>(n, w, acts)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k_dot4_avx2(n: usize, w: &[u8], acts: [&[u8]; 4]) -> [f32; 4] {
    dot4_avx2::<true>(n, w, acts)
}

/// Q4_K (`FIVE = false`) or Q5_K blocks, decoded for the prompt GEMM.
pub(super) struct K45<const FIVE: bool>;

impl<const FIVE: bool> super::gemm::KDecode for K45<FIVE> {
    const BYTES: usize = w_bytes(FIVE);

    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn decode(wb: *const u8, out: &mut super::gemm::KBlock) {
        let (sc, m) = scales_mins(wb.add(SCALES));
        let mut hb = if FIVE { load256(wb.add(QH)) } else { _mm256_setzero_si256() };
        for c in 0..4 {
            let (lo, hi) = chunk_codes::<FIVE>(wb, c, &mut hb);
            _mm256_storeu_si256(out.codes[2 * c].as_mut_ptr().cast(), lo);
            _mm256_storeu_si256(out.codes[2 * c + 1].as_mut_ptr().cast(), hi);
        }
        for j in 0..8 {
            let (s, mj) = ((sc >> (8 * j)) as u8 as i16, (m >> (8 * j)) as u8 as i16);
            _mm256_storeu_si256(out.scales[j].as_mut_ptr().cast(), _mm256_set1_epi16(s));
            out.mins[2 * j] = mj;
            out.mins[2 * j + 1] = mj;
        }
        out.d = f16_at(wb);
        out.dmin = f16_at(wb.add(2));
    }
}

gemms! {
    q4k_gemm_avx2, gemm_k::<K45<false>> => Q4_K;
    q5k_gemm_avx2, gemm_k::<K45<true>> => Q5_K;
}

/// This file's four-row kernels.
pub(super) const TILES: &[super::TileEntry] = &[
    super::TileEntry { ty: tern_quant::GgmlType::Q4_K, isa: crate::isa::Isa::Avx2, dot4: q4k_dot4_avx2 },
    super::TileEntry { ty: tern_quant::GgmlType::Q5_K, isa: crate::isa::Isa::Avx2, dot4: q5k_dot4_avx2 },
];

/// `permutexvar_epi16` indices for chunk `c`: i16 lanes 0..16 of the
/// `maddubs` result are sub-block `2c`, lanes 16..32 sub-block `2c+1`.
const fn chunk_index(c: usize) -> [u16; 32] {
    let mut m = [0u16; 32];
    let mut i = 0;
    while i < 32 {
        m[i] = (2 * c + i / 16) as u16;
        i += 1;
    }
    m
}
static CHUNK_INDEX: [[u16; 32]; 4] = [chunk_index(0), chunk_index(1), chunk_index(2), chunk_index(3)];

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn dot_avx512<const FIVE: bool>(n: usize, w: &[u8], act: &[u8]) -> f32 {
    let wbytes = w_bytes(FIVE);
    let nb = blocks_of(n, w, act, QK, wbytes, ACT_BYTES);
    let (wp, ap) = (w.as_ptr(), act.as_ptr());
    let m4 = _mm512_set1_epi8(0x0F);
    let m10 = _mm512_set1_epi8(0x10);
    let mut sum = 0.0f32;
    for b in 0..nb {
        let (wb, ab) = (wp.add(b * wbytes), ap.add(b * ACT_BYTES));
        let (sc, m) = scales_mins(wb.add(SCALES));
        let scz = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let mins = mins_dot(m, ab);
        // Q5_K: [qh | qh >> 1]; bit 0 of each byte is the fifth bit of the
        // chunk's low (first 256 bits) and high (last 256 bits) nibbles.
        let mut hh = if FIVE {
            let h = load256(wb.add(QH));
            _mm512_inserti64x4::<1>(_mm512_castsi256_si512(h), _mm256_srli_epi16::<1>(h))
        } else {
            _mm512_setzero_si512()
        };
        let mut acc = _mm512_setzero_si512();
        for (c, idx) in CHUNK_INDEX.iter().enumerate() {
            let qs = load256(wb.add(qs_at(FIVE) + 32 * c));
            let both = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(qs), _mm256_srli_epi16::<4>(qs));
            let mut q = _mm512_and_si512(both, m4);
            if FIVE {
                q = _mm512_or_si512(q, _mm512_and_si512(_mm512_slli_epi16::<4>(hh), m10));
                hh = _mm512_srli_epi16::<2>(hh);
            }
            let a = _mm512_loadu_si512(ab.add(ACT_QS + 64 * c).cast());
            let s = _mm512_permutexvar_epi16(_mm512_loadu_si512(idx.as_ptr().cast()), scz);
            acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(q, a), s);
        }
        let sumi = _mm512_reduce_add_epi32(acc);
        let summ = hsum_i32x8(mins);
        sum += f32_at(ab) * (f16_at(wb) * sumi as f32 - f16_at(wb.add(2)) * summ as f32);
    }
    sum
}

kernels! {
    q4k_avx2, q4k_avx512, false => Q4_K;
    q5k_avx2, q5k_avx512, true => Q5_K;
}
