//! AVX-512 VNNI kernels: `vpdpbusd` multiplies unsigned codes (0, 1, 2) by
//! signed int8 activations, 64 at a time. A tile of R weight rows × T tokens
//! keeps R·T accumulators in registers, so each unpacked weight vector is used
//! T times and each activation vector R times.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use std::ops::Range;

use super::{finish, panel, Out, PackedActs, PackedTernary, Tiles};

/// Tiles ahead that the streaming kernels prefetch. A tile's rows are
/// contiguous, and the hardware prefetcher stops at page ends, which a
/// decoding step's weight stream crosses every few tiles.
const PREFETCH_TILES: usize = 2;

/// Rows and tokens per tile.
const R: usize = 4;
const T: usize = 4;

#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn amax(x: &[f32]) -> f32 {
    let mut m = _mm512_setzero_ps();
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(c.as_ptr())));
    }
    let mut r = _mm512_reduce_max_ps(m);
    for &v in tail {
        r = r.max(v.abs());
    }
    r
}

/// `q = round_half_even(x · s_a)` (the default MXCSR rounding), zero padding
/// after `x.len()`; returns `Σ q`.
#[target_feature(enable = "avx512f,avx512bw")]
pub unsafe fn quantize(x: &[f32], s_a: f32, q: &mut [i8]) -> i32 {
    let s = _mm512_set1_ps(s_a);
    let mut sum = _mm512_setzero_si512();
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    let n = x.len() - tail.len();
    for (i, c) in chunks.enumerate() {
        let v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(c.as_ptr()), s));
        sum = _mm512_add_epi32(sum, v);
        _mm_storeu_si128(q.as_mut_ptr().add(16 * i) as *mut __m128i, _mm512_cvtsepi32_epi8(v));
    }
    let mut total = _mm512_reduce_add_epi32(sum);
    for (o, &v) in q[n..].iter_mut().zip(tail) {
        *o = (v * s_a).round_ties_even().clamp(-128.0, 127.0) as i8;
        total += *o as i32;
    }
    q[x.len()..].fill(0);
    total
}

/// The first byte of weight rows `r0..r0 + RR`.
#[inline(always)]
fn row_ptrs<const RR: usize>(w: &PackedTernary, r0: usize) -> [*const u8; RR] {
    std::array::from_fn(|r| w.row(r0 + r).as_ptr())
}

/// The first activation of tokens `t0..t0 + TT`.
#[inline(always)]
fn act_ptrs<const TT: usize>(acts: &PackedActs, t0: usize) -> [*const i8; TT] {
    std::array::from_fn(|t| acts.q(t0 + t).as_ptr())
}

/// Writes the tile's results.
#[inline(always)]
unsafe fn store<const RR: usize, const TT: usize>(
    acc: &[[__m512i; TT]; RR],
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    for (r, row) in acc.iter().enumerate() {
        let s = w.row_scales(r0 + r)[0];
        for (t, a) in row.iter().enumerate() {
            let y = finish(_mm512_reduce_add_epi32(*a), acts.sum[t0 + t], s, acts.d[t0 + t]);
            *out.ptr.add((t0 + t) * out.ld + r0 + r) = y;
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_bits2<const RR: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let mask = _mm512_set1_epi8(3);
    let mut acc = [[_mm512_setzero_si512(); TT]; RR];
    let (wp, ap) = (row_ptrs::<RR>(w, r0), act_ptrs::<TT>(acts, t0));
    let ahead = PREFETCH_TILES * RR * w.layout.row_bytes;
    for c in 0..w.layout.k_pad / 256 {
        let mut cur = [_mm512_setzero_si512(); RR];
        for r in 0..RR {
            // Weights stream from memory once per token: line c of the same
            // row PREFETCH_TILES tiles on (past the matrix, a harmless hint).
            _mm_prefetch::<_MM_HINT_T0>(wp[r].wrapping_add(64 * c + ahead) as *const i8);
            cur[r] = _mm512_loadu_si512(wp[r].add(64 * c) as *const _);
        }
        for i in 0..4 {
            let mut codes = [_mm512_setzero_si512(); RR];
            for r in 0..RR {
                codes[r] = _mm512_and_si512(cur[r], mask);
                // Shifting 16-bit lanes moves the next pair of each byte down;
                // bits leaking in from the neighbouring byte are masked off.
                cur[r] = _mm512_srli_epi16::<2>(cur[r]);
            }
            for t in 0..TT {
                let a = _mm512_load_si512(ap[t].add(256 * c + 64 * i) as *const _);
                for r in 0..RR {
                    acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes[r], a);
                }
            }
        }
    }
    store(&acc, w, r0, acts, t0, out);
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_base3<const RR: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let one = _mm512_set1_epi8(1);
    // Digit = ((q · 3) >> 8) for the byte q: 0 below 86, 1 below 171, else 2.
    let (t1, t2) = (_mm512_set1_epi8(86u8 as i8), _mm512_set1_epi8(171u8 as i8));
    let mut acc = [[_mm512_setzero_si512(); TT]; RR];
    let (wp, ap) = (row_ptrs::<RR>(w, r0), act_ptrs::<TT>(acts, t0));
    for c in 0..w.layout.k_pad / 320 {
        let mut q = [_mm512_setzero_si512(); RR];
        for r in 0..RR {
            q[r] = _mm512_loadu_si512(wp[r].add(64 * c) as *const _);
        }
        for i in 0..5 {
            let mut codes = [_mm512_setzero_si512(); RR];
            for r in 0..RR {
                if i > 0 {
                    // b·3^i mod 256 from the previous digit's byte, in wrapping byte adds.
                    q[r] = _mm512_add_epi8(_mm512_add_epi8(q[r], q[r]), q[r]);
                }
                let lo = _mm512_maskz_mov_epi8(_mm512_cmpge_epu8_mask(q[r], t1), one);
                codes[r] = _mm512_mask_add_epi8(lo, _mm512_cmpge_epu8_mask(q[r], t2), lo, one);
            }
            for t in 0..TT {
                let a = _mm512_load_si512(ap[t].add(320 * c + 64 * i) as *const _);
                for r in 0..RR {
                    acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes[r], a);
                }
            }
        }
    }
    store(&acc, w, r0, acts, t0, out);
}

/// Digit `k` (0..5) of a base-3 byte: the top of `(b · 3^k mod 256) · 3`.
const fn digit(b: u8, k: u32) -> u8 {
    (((b.wrapping_mul(3u8.pow(k)) as u16) * 3) >> 8) as u8
}

/// The base-3 digits of every byte as two 256-entry tables, built at compile
/// time: digits 0..4 packed 2 bits each (digit i at bit 2i), and digit 4 alone.
static BASE3_FOUR: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = digit(b as u8, 0) | digit(b as u8, 1) << 2 | digit(b as u8, 2) << 4 | digit(b as u8, 3) << 6;
        b += 1;
    }
    t
};
static BASE3_FIFTH: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = digit(b as u8, 4);
        b += 1;
    }
    t
};

/// A 256-entry byte table in four registers, looked up with two `vpermi2b`.
#[derive(Clone, Copy)]
struct Lut([__m512i; 4]);

impl Lut {
    #[target_feature(enable = "avx512f")]
    unsafe fn new(table: &[u8; 256]) -> Lut {
        let part = |i: usize| _mm512_loadu_si512(table.as_ptr().add(64 * i) as *const _);
        Lut([part(0), part(1), part(2), part(3)])
    }

    #[inline(always)]
    unsafe fn get(&self, idx: __m512i) -> __m512i {
        let lo = _mm512_permutex2var_epi8(self.0[0], idx, self.0[1]);
        let hi = _mm512_permutex2var_epi8(self.0[2], idx, self.0[3]);
        _mm512_mask_blend_epi8(_mm512_movepi8_mask(idx), lo, hi)
    }
}

/// Base3 through table lookups (AVX-512 VBMI): one lookup gives four digits
/// as 2-bit fields, unpacked like Bits2; a second gives the fifth.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi")]
unsafe fn tile_base3_lut<const RR: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let (four, fifth) = (Lut::new(&BASE3_FOUR), Lut::new(&BASE3_FIFTH));
    let mask = _mm512_set1_epi8(3);
    let mut acc = [[_mm512_setzero_si512(); TT]; RR];
    let (wp, ap) = (row_ptrs::<RR>(w, r0), act_ptrs::<TT>(acts, t0));
    for c in 0..w.layout.k_pad / 320 {
        let mut packed = [_mm512_setzero_si512(); RR];
        let mut last = [_mm512_setzero_si512(); RR];
        for r in 0..RR {
            let b = _mm512_loadu_si512(wp[r].add(64 * c) as *const _);
            packed[r] = four.get(b);
            last[r] = fifth.get(b);
        }
        for i in 0..5 {
            let mut codes = [_mm512_setzero_si512(); RR];
            for r in 0..RR {
                codes[r] = if i < 4 { _mm512_and_si512(packed[r], mask) } else { last[r] };
                packed[r] = _mm512_srli_epi16::<2>(packed[r]);
            }
            for t in 0..TT {
                let a = _mm512_load_si512(ap[t].add(320 * c + 64 * i) as *const _);
                for r in 0..RR {
                    acc[r][t] = _mm512_dpbusd_epi32(acc[r][t], codes[r], a);
                }
            }
        }
    }
    store(&acc, w, r0, acts, t0, out);
}

/// The AVX-512 tile set of a direct tile kernel and a panel decoder: full
/// R×T tiles, their edges, and decoded panels for prompt-sized batches.
macro_rules! tiles {
    ($tile:ident, $panel:expr) => {
        Tiles {
            rows: R,
            tokens: T,
            full: $tile::<R, T>,
            row_edge: $tile::<1, T>,
            token_edge: &[$tile::<R, 1>, $tile::<R, 2>, $tile::<R, 3>],
            single: $tile::<1, 1>,
            panel: Some($panel),
        }
    };
}

/// Rows per tile when there is one token (decoding): more rows stream from
/// memory at once.
const GEMV_ROWS: usize = 8;

pub unsafe fn gemm_bits2(w: &PackedTernary, rows: Range<usize>, acts: &PackedActs, out: Out) {
    if acts.n == 1 {
        let mut r = rows.start;
        while r + GEMV_ROWS <= rows.end {
            tile_bits2::<GEMV_ROWS, 1>(w, r, acts, 0, out);
            r += GEMV_ROWS;
        }
        for r in r..rows.end {
            tile_bits2::<1, 1>(w, r, acts, 0, out);
        }
        return;
    }
    tiles!(tile_bits2, panel::bits2()).drive(w, rows, acts, out)
}

pub unsafe fn gemm_base3(w: &PackedTernary, rows: Range<usize>, acts: &PackedActs, out: Out, lut: bool) {
    if lut {
        return gemm_base3_lut(w, rows, acts, out);
    }
    tiles!(tile_base3, panel::base3()).drive(w, rows, acts, out)
}

unsafe fn gemm_base3_lut(w: &PackedTernary, rows: Range<usize>, acts: &PackedActs, out: Out) {
    if acts.n == 1 {
        let mut r = rows.start;
        while r + GEMV_ROWS <= rows.end {
            gemv_base3_lut::<GEMV_ROWS>(w, r, acts, out);
            r += GEMV_ROWS;
        }
        for r in r..rows.end {
            gemv_base3_lut::<1>(w, r, acts, out);
        }
        return;
    }
    tiles!(tile_base3_lut, panel::base3()).drive(w, rows, acts, out)
}

/// One token against `RR` Base3 rows by table lookups, streaming: each row's
/// byte chunk is decoded and multiplied before the next row's, so only the
/// `RR` accumulators, the tables and one chunk's five activation vectors
/// stay in registers; weights are prefetched as in [`tile_bits2`].
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi")]
unsafe fn gemv_base3_lut<const RR: usize>(w: &PackedTernary, r0: usize, acts: &PackedActs, out: Out) {
    let (four, fifth) = (Lut::new(&BASE3_FOUR), Lut::new(&BASE3_FIFTH));
    let mask = _mm512_set1_epi8(3);
    let mut acc = [[_mm512_setzero_si512(); 1]; RR];
    let (wp, ap) = (row_ptrs::<RR>(w, r0), act_ptrs::<1>(acts, 0)[0]);
    let ahead = PREFETCH_TILES * RR * w.layout.row_bytes;
    for c in 0..w.layout.k_pad / 320 {
        let a: [__m512i; 5] = std::array::from_fn(|i| _mm512_load_si512(ap.add(320 * c + 64 * i) as *const _));
        for r in 0..RR {
            _mm_prefetch::<_MM_HINT_T0>(wp[r].wrapping_add(64 * c + ahead) as *const i8);
            let b = _mm512_loadu_si512(wp[r].add(64 * c) as *const _);
            let mut packed = four.get(b);
            for &ai in &a[..4] {
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], _mm512_and_si512(packed, mask), ai);
                packed = _mm512_srli_epi16::<2>(packed);
            }
            acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], fifth.get(b), a[4]);
        }
    }
    store(&acc, w, r0, acts, 0, out);
}
