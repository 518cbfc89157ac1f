//! AVX-512 VNNI prompt tiles over decoded panels (see `Panel`).
//!
//! Panel layout, for `V` vectors of 16 rows and `k_pad / 4` steps: step `s`
//! holds `V` 64-byte vectors, vector `v` carrying the codes of weights
//! `4s..4s + 4` of rows `16v..16v + 16` (row-major within the vector, one
//! 32-bit lane per row). `vpdpbusd` against 4 activations broadcast to every
//! lane then adds 4 products to each of 16 rows' sums.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::{Out, PackedActs, PackedTernary, Panel, PanelTile};

/// 16-row vectors per full panel and tokens per full tile: 4 × 6
/// accumulators, 4 weight vectors and a broadcast fill 29 of 32 registers.
const V: usize = 4;
const T: usize = 6;

/// Decoded codes of row `r`'s 64-weight block `m`, one byte per weight.
type BlockCodes = unsafe fn(&PackedTernary, usize, usize) -> __m512i;

/// Bits2: byte `b` of a 64-byte chunk holds weights `b`, `64 + b`, `128 + b`
/// and `192 + b` of its 256, 2 bits each from the bottom.
#[inline(always)]
unsafe fn block_bits2(w: &PackedTernary, r: usize, m: usize) -> __m512i {
    let chunk = _mm512_loadu_si512(w.row(r).as_ptr().add(64 * (m / 4)) as *const _);
    let shifted = _mm512_srl_epi16(chunk, _mm_cvtsi32_si128(2 * (m % 4) as i32));
    _mm512_and_si512(shifted, _mm512_set1_epi8(3))
}

/// Base3: byte `b` of a 64-byte chunk holds weights `b + 64i` for digits
/// `i` in 0..5; digit `i` is the top of `(q · 3^i mod 256) · 3`.
#[inline(always)]
unsafe fn block_base3(w: &PackedTernary, r: usize, m: usize) -> __m512i {
    let mut q = _mm512_loadu_si512(w.row(r).as_ptr().add(64 * (m / 5)) as *const _);
    for _ in 0..m % 5 {
        q = _mm512_add_epi8(_mm512_add_epi8(q, q), q);
    }
    let one = _mm512_set1_epi8(1);
    let lo = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(q, _mm512_set1_epi8(86u8 as i8)), one);
    _mm512_mask_add_epi8(lo, _mm512_cmpge_epu8_mask(q, _mm512_set1_epi8(171u8 as i8)), lo, one)
}

/// Transposes 16 rows × 16 lanes of 32 bits: lane `j` of output `s` is lane
/// `s` of input `j`.
#[inline(always)]
unsafe fn transpose16(x: &[__m512i; 16]) -> [__m512i; 16] {
    // Within 128-bit lanes: groups of 4 rows; b[g][e] holds, in lane L, rows
    // 4g..4g + 4 at column 4L + e.
    let mut b = [[_mm512_setzero_si512(); 4]; 4];
    for g in 0..4 {
        let r = &x[4 * g..4 * g + 4];
        let a0 = _mm512_unpacklo_epi32(r[0], r[1]);
        let a1 = _mm512_unpackhi_epi32(r[0], r[1]);
        let a2 = _mm512_unpacklo_epi32(r[2], r[3]);
        let a3 = _mm512_unpackhi_epi32(r[2], r[3]);
        b[g] = [
            _mm512_unpacklo_epi64(a0, a2),
            _mm512_unpackhi_epi64(a0, a2),
            _mm512_unpacklo_epi64(a1, a3),
            _mm512_unpackhi_epi64(a1, a3),
        ];
    }
    // Across 128-bit lanes: output 4L + e takes lane L of b[0..4][e].
    let mut o = [_mm512_setzero_si512(); 16];
    for e in 0..4 {
        let c0 = _mm512_shuffle_i32x4::<0x44>(b[0][e], b[1][e]);
        let c1 = _mm512_shuffle_i32x4::<0xEE>(b[0][e], b[1][e]);
        let c2 = _mm512_shuffle_i32x4::<0x44>(b[2][e], b[3][e]);
        let c3 = _mm512_shuffle_i32x4::<0xEE>(b[2][e], b[3][e]);
        o[e] = _mm512_shuffle_i32x4::<0x88>(c0, c2);
        o[4 + e] = _mm512_shuffle_i32x4::<0xDD>(c0, c2);
        o[8 + e] = _mm512_shuffle_i32x4::<0x88>(c1, c3);
        o[12 + e] = _mm512_shuffle_i32x4::<0xDD>(c1, c3);
    }
    o
}

/// Rows `r0..r0 + 16·v` into the panel layout.
#[inline(always)]
unsafe fn decode(w: &PackedTernary, r0: usize, v: usize, panel: &mut [u8], codes: BlockCodes) {
    let blocks = w.layout.k_pad / 64;
    assert!(panel.len() >= 16 * v * w.layout.k_pad);
    let dst = panel.as_mut_ptr();
    for g in 0..v {
        for m in 0..blocks {
            let rows: [__m512i; 16] = std::array::from_fn(|j| codes(w, r0 + 16 * g + j, m));
            for (s, lane) in transpose16(&rows).iter().enumerate() {
                _mm512_storeu_si512(dst.add(((16 * m + s) * v + g) * 64) as *mut _, *lane);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_bits2(w: &PackedTernary, r0: usize, v: usize, panel: &mut [u8]) {
    decode(w, r0, v, panel, block_bits2)
}

#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn decode_base3(w: &PackedTernary, r0: usize, v: usize, panel: &mut [u8]) {
    decode(w, r0, v, panel, block_base3)
}

/// `VV` vectors of rows × `TT` tokens over a decoded panel.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const VV: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    panel: &[u8],
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let steps = w.layout.k_pad / 4;
    debug_assert!(panel.len() >= steps * VV * 64);
    let ap: [*const i32; TT] = std::array::from_fn(|t| acts.q(t0 + t).as_ptr() as *const i32);
    let mut acc = [[_mm512_setzero_si512(); TT]; VV];
    let mut p = panel.as_ptr();
    for s in 0..steps {
        let wv: [__m512i; VV] = std::array::from_fn(|v| _mm512_loadu_si512(p.add(64 * v) as *const _));
        for t in 0..TT {
            let a = _mm512_set1_epi32(ap[t].add(s).read_unaligned());
            for v in 0..VV {
                acc[v][t] = _mm512_dpbusd_epi32(acc[v][t], wv[v], a);
            }
        }
        p = p.add(64 * VV);
    }
    // The reference's `((Σ c·q − Σ q) as f32 · s_row) · d_token`, 16 rows at once.
    for (v, row) in acc.iter().enumerate() {
        let s = _mm512_loadu_ps(w.scales_from(r0 + 16 * v).as_ptr());
        for (t, a) in row.iter().enumerate() {
            let dot = _mm512_sub_epi32(*a, _mm512_set1_epi32(acts.sum[t0 + t]));
            let y = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(dot), s), _mm512_set1_ps(acts.d[t0 + t]));
            _mm512_storeu_ps(out.ptr.add((t0 + t) * out.ld + r0 + 16 * v), y);
        }
    }
}

macro_rules! tiles_for {
    ($v:literal) => {
        &[tile::<$v, 1>, tile::<$v, 2>, tile::<$v, 3>, tile::<$v, 4>, tile::<$v, 5>, tile::<$v, 6>]
    };
}

static TILES: [&[PanelTile]; V] = [tiles_for!(1), tiles_for!(2), tiles_for!(3), tiles_for!(4)];

pub fn bits2() -> Panel {
    Panel { unit: 16, units: V, tokens: T, min_tokens: 2 * T, decode: decode_bits2, tiles: &TILES }
}

pub fn base3() -> Panel {
    Panel { unit: 16, units: V, tokens: T, min_tokens: 2 * T, decode: decode_base3, tiles: &TILES }
}
