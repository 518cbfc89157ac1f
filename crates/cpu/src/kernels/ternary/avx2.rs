//! AVX2 kernels: `vpmaddubsw` multiplies unsigned codes by signed int8
//! activations into 16-bit pairs (at most 2·2·128, no overflow); a 2-bit
//! chunk's eight of them add up in 16 bits (≤ 4096) before `vpmaddwd`
//! widens them to 32. Tiles are smaller than AVX-512's (16 registers).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;
use std::ops::Range;

use super::{finish, panel_avx2, Out, PackedActs, PackedTernary, Tiles};

const R: usize = 2;
const T: usize = 2;

#[target_feature(enable = "avx2,fma")]
pub unsafe fn amax(x: &[f32]) -> f32 {
    let sign = _mm256_set1_ps(-0.0);
    let mut m = _mm256_setzero_ps();
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(c.as_ptr())));
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), m);
    let mut r = lanes.iter().fold(0f32, |a, &b| a.max(b));
    for &v in tail {
        r = r.max(v.abs());
    }
    r
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn quantize(x: &[f32], s_a: f32, q: &mut [i8]) -> i32 {
    let s = _mm256_set1_ps(s_a);
    let mut sum = _mm256_setzero_si256();
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    let n = x.len() - tail.len();
    for (i, c) in chunks.enumerate() {
        let v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), s));
        sum = _mm256_add_epi32(sum, v);
        // |v| ≤ 127: the saturating packs keep every value.
        let w = _mm256_packs_epi32(v, v);
        let b = _mm256_packs_epi16(w, w);
        let lo = _mm256_castsi256_si128(b);
        let hi = _mm256_extracti128_si256::<1>(b);
        let bytes = _mm_unpacklo_epi32(lo, hi);
        _mm_storel_epi64(q.as_mut_ptr().add(8 * i) as *mut __m128i, bytes);
    }
    let mut total = hsum(sum);
    for (o, &v) in q[n..].iter_mut().zip(tail) {
        *o = (v * s_a).round_ties_even().clamp(-128.0, 127.0) as i8;
        total += *o as i32;
    }
    q[x.len()..].fill(0);
    total
}

#[inline(always)]
unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// `acc += Σ codes · a` in 32-bit lanes.
#[inline(always)]
unsafe fn dot_acc(acc: __m256i, codes: __m256i, a: __m256i, ones: __m256i) -> __m256i {
    _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(codes, a), ones))
}

#[inline(always)]
pub(super) unsafe fn store<const RR: usize, const TT: usize>(
    acc: &[[__m256i; TT]; RR],
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    for (r, row) in acc.iter().enumerate() {
        let s = w.row_scales(r0 + r)[0];
        for (t, a) in row.iter().enumerate() {
            *out.ptr.add((t0 + t) * out.ld + r0 + r) = finish(hsum(*a), acts.sum[t0 + t], s, acts.d[t0 + t]);
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_bits2<const RR: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let (mask, ones) = (_mm256_set1_epi8(3), _mm256_set1_epi16(1));
    let mut acc = [[_mm256_setzero_si256(); TT]; RR];
    for c in 0..w.layout.k_pad / 256 {
        // A chunk's eight `maddubs` pair sums (each ≤ 2·2·128) add up in
        // 16-bit lanes (≤ 4096), widened once a chunk.
        let mut acc16 = [[_mm256_setzero_si256(); TT]; RR];
        // A 64-byte chunk is two 32-byte halves; half h, pair i covers weights 64i + 32h ..+32.
        for h in 0..2 {
            let mut cur = [_mm256_setzero_si256(); RR];
            for (r, v) in cur.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(w.row(r0 + r).as_ptr().add(64 * c + 32 * h) as *const _);
            }
            for i in 0..4 {
                let mut codes = [_mm256_setzero_si256(); RR];
                for r in 0..RR {
                    codes[r] = _mm256_and_si256(cur[r], mask);
                    cur[r] = _mm256_srli_epi16::<2>(cur[r]);
                }
                for t in 0..TT {
                    let a = _mm256_load_si256(acts.q(t0 + t).as_ptr().add(256 * c + 64 * i + 32 * h) as *const _);
                    for (row, &code) in acc16.iter_mut().zip(&codes) {
                        row[t] = _mm256_add_epi16(row[t], _mm256_maddubs_epi16(code, a));
                    }
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

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_base3<const RR: usize, const TT: usize>(
    w: &PackedTernary,
    r0: usize,
    acts: &PackedActs,
    t0: usize,
    out: Out,
) {
    let ones = _mm256_set1_epi16(1);
    let (t1, t2) = (_mm256_set1_epi8(86u8 as i8), _mm256_set1_epi8(171u8 as i8));
    let mut acc = [[_mm256_setzero_si256(); TT]; RR];
    for c in 0..w.layout.k_pad / 320 {
        for h in 0..2 {
            let mut q = [_mm256_setzero_si256(); RR];
            for (r, v) in q.iter_mut().enumerate() {
                *v = _mm256_loadu_si256(w.row(r0 + r).as_ptr().add(64 * c + 32 * h) as *const _);
            }
            for i in 0..5 {
                let mut codes = [_mm256_setzero_si256(); RR];
                for r in 0..RR {
                    if i > 0 {
                        q[r] = _mm256_add_epi8(_mm256_add_epi8(q[r], q[r]), q[r]);
                    }
                    // Unsigned q ≥ t  ⇔  max(q, t) == q; each true compare is −1.
                    let ge1 = _mm256_cmpeq_epi8(_mm256_max_epu8(q[r], t1), q[r]);
                    let ge2 = _mm256_cmpeq_epi8(_mm256_max_epu8(q[r], t2), q[r]);
                    codes[r] = _mm256_sub_epi8(_mm256_sub_epi8(_mm256_setzero_si256(), ge1), ge2);
                }
                for t in 0..TT {
                    let a = _mm256_load_si256(acts.q(t0 + t).as_ptr().add(320 * c + 64 * i + 32 * h) as *const _);
                    for (row, &code) in acc.iter_mut().zip(&codes) {
                        row[t] = dot_acc(row[t], code, a, ones);
                    }
                }
            }
        }
    }
    store(&acc, w, r0, acts, t0, out);
}

pub unsafe fn gemm_bits2(w: &PackedTernary, rows: Range<usize>, acts: &PackedActs, out: Out) {
    let tiles = Tiles {
        rows: R,
        tokens: T,
        full: tile_bits2::<R, T>,
        row_edge: tile_bits2::<1, T>,
        token_edge: &[tile_bits2::<R, 1>],
        single: tile_bits2::<1, 1>,
        panel: Some(panel_avx2::bits2()),
    };
    tiles.drive(w, rows, acts, out)
}

pub unsafe fn gemm_base3(w: &PackedTernary, rows: Range<usize>, acts: &PackedActs, out: Out) {
    let tiles = Tiles {
        rows: R,
        tokens: T,
        full: tile_base3::<R, T>,
        row_edge: tile_base3::<1, T>,
        token_edge: &[tile_base3::<R, 1>],
        single: tile_base3::<1, 1>,
        panel: Some(panel_avx2::base3()),
    };
    tiles.drive(w, rows, acts, out)
}
