//! AVX2 tiles over decoded panels (see `Panel`), for batches of a few tokens
//! up to prompts.
//!
//! Panel layout: rows `r0..r0 + 2u`, each as its `k_pad` codes (0, 1, 2),
//! one byte a weight in weight order (the activations' order), row after
//! row. A tile of 2 rows × `T` tokens then loads 32 codes of each row and 32
//! activations of each token per step and multiplies them with `vpmaddubsw`
//! as the direct tiles do, but with no unpacking: that was paid once per
//! panel. The 16-bit pair sums (each within ±512: codes ≤ 2, |a| ≤ 128) add
//! up for 64 steps (within ±32768) before `vpmaddwd` widens them to 32 bits.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::avx2::store;
use super::{Out, PackedActs, PackedTernary, Panel, PanelTile};

/// Rows per tile: a panel is decoded in units of this many rows.
const R: usize = 2;
/// Units per full panel (16 rows: 2 × 6912 codes a unit stay in L1 while a
/// tile runs, the whole panel in L2).
const U: usize = 8;
/// Tokens per full tile: 2 × 6 16-bit accumulators, 2 code vectors and an
/// activation vector fill 15 of 16 registers.
const T: usize = 6;

/// Steps of 32 weights whose pair sums a 16-bit lane holds.
const STEPS_16: usize = 64;

/// Rows `r0..r0 + R·u` of a Bits2 matrix into the panel. Byte `b` of a
/// 64-byte chunk holds weights `b`, `64 + b`, `128 + b` and `192 + b` of its
/// 256, 2 bits each from the bottom.
#[target_feature(enable = "avx2,fma")]
unsafe fn decode_bits2(w: &PackedTernary, r0: usize, u: usize, panel: &mut [u8]) {
    let k_pad = w.layout.k_pad;
    assert!(panel.len() >= R * u * k_pad);
    let mask = _mm256_set1_epi8(3);
    for i in 0..R * u {
        let (src, dst) = (w.row(r0 + i).as_ptr(), panel.as_mut_ptr().add(i * k_pad));
        for c in 0..k_pad / 256 {
            // Both halves at once, so that each 64-byte line of codes is written whole.
            let mut cur: [__m256i; 2] =
                std::array::from_fn(|h| _mm256_loadu_si256(src.add(64 * c + 32 * h) as *const _));
            for j in 0..4 {
                for (h, v) in cur.iter_mut().enumerate() {
                    _mm256_storeu_si256(dst.add(256 * c + 64 * j + 32 * h) as *mut _, _mm256_and_si256(*v, mask));
                    *v = _mm256_srli_epi16::<2>(*v);
                }
            }
        }
    }
}

/// Rows `r0..r0 + R·u` of a Base3 matrix into the panel. Byte `b` of a
/// 64-byte chunk holds weights `b + 64j` for digits `j` in 0..5; digit `j`
/// is the top of `(q · 3^j mod 256) · 3`: 0 below 86, 1 below 171, else 2.
#[target_feature(enable = "avx2,fma")]
unsafe fn decode_base3(w: &PackedTernary, r0: usize, u: usize, panel: &mut [u8]) {
    let k_pad = w.layout.k_pad;
    assert!(panel.len() >= R * u * k_pad);
    let (t1, t2) = (_mm256_set1_epi8(86u8 as i8), _mm256_set1_epi8(171u8 as i8));
    for i in 0..R * u {
        let (src, dst) = (w.row(r0 + i).as_ptr(), panel.as_mut_ptr().add(i * k_pad));
        for c in 0..k_pad / 320 {
            // Both halves at once, so that each 64-byte line of codes is written whole.
            let mut q: [__m256i; 2] = std::array::from_fn(|h| _mm256_loadu_si256(src.add(64 * c + 32 * h) as *const _));
            for j in 0..5 {
                for (h, q) in q.iter_mut().enumerate() {
                    if j > 0 {
                        *q = _mm256_add_epi8(_mm256_add_epi8(*q, *q), *q);
                    }
                    // Unsigned q ≥ t  ⇔  max(q, t) == q; each true compare is −1.
                    let ge1 = _mm256_cmpeq_epi8(_mm256_max_epu8(*q, t1), *q);
                    let ge2 = _mm256_cmpeq_epi8(_mm256_max_epu8(*q, t2), *q);
                    let codes = _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), ge1), ge2);
                    _mm256_storeu_si256(dst.add(320 * c + 64 * j + 32 * h) as *mut _, codes);
                }
            }
        }
    }
}

/// One unit: rows `r0, r0 + 1` (codes at `codes`, `k_pad` apart) × `TT`
/// tokens from `t0`.
#[target_feature(enable = "avx2,fma")]
unsafe fn unit<const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    codes: *const u8,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let k_pad = w.layout.k_pad;
    let cp: [*const u8; R] = std::array::from_fn(|r| codes.add(r * k_pad));
    let ap: [*const i8; TT] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr());
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); TT]; R];
    let steps = k_pad / 32;
    for s0 in (0..steps).step_by(STEPS_16) {
        let mut acc16 = [[_mm256_setzero_si256(); TT]; R];
        for s in s0..(s0 + STEPS_16).min(steps) {
            let c: [__m256i; R] = std::array::from_fn(|r| _mm256_loadu_si256(cp[r].add(32 * s) as *const _));
            for t in 0..TT {
                let a = _mm256_load_si256(ap[t].add(32 * s) as *const _);
                for r in 0..R {
                    acc16[r][t] = _mm256_add_epi16(acc16[r][t], _mm256_maddubs_epi16(c[r], a));
                }
            }
        }
        for (row, row16) in acc.iter_mut().zip(&acc16) {
            for (a, &a16) in row.iter_mut().zip(row16) {
                *a = _mm256_add_epi32(*a, _mm256_madd_epi16(a16, ones));
            }
        }
    }
    store(&acc, w, r0, acts, t0, out);
}

/// `UU` units of rows × `TT` tokens over a decoded panel.
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const UU: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    panel: &[u8],
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    debug_assert!(panel.len() >= R * UU * w.layout.k_pad);
    for u in 0..UU {
        unit::<TT>(w, r0 + R * u, panel.as_ptr().add(R * u * w.layout.k_pad), acts, t0, out);
    }
}

macro_rules! tiles_for {
    ($u:literal) => {
        &[tile::<$u, 1>, tile::<$u, 2>, tile::<$u, 3>, tile::<$u, 4>, tile::<$u, 5>, tile::<$u, 6>]
    };
}

static TILES: [&[PanelTile]; U] = [
    tiles_for!(1),
    tiles_for!(2),
    tiles_for!(3),
    tiles_for!(4),
    tiles_for!(5),
    tiles_for!(6),
    tiles_for!(7),
    tiles_for!(8),
];

/// The fewest tokens that take panels. Decoding a panel costs about a pass
/// over the packed weights, which the direct tiles' unpacking repays for
/// Bits2 only from 9 tokens (measured on Zen 3 at the 2B-4T shapes); Base3's
/// direct tiles unpack slowly enough that panels pay from 2.
const MIN_TOKENS_BITS2: usize = 9;
const MIN_TOKENS_BASE3: usize = 2;

pub fn bits2() -> Panel {
    Panel { unit: R, units: U, tokens: T, min_tokens: MIN_TOKENS_BITS2, decode: decode_bits2, tiles: &TILES }
}

pub fn base3() -> Panel {
    Panel { unit: R, units: U, tokens: T, min_tokens: MIN_TOKENS_BASE3, decode: decode_base3, tiles: &TILES }
}
