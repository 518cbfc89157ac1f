//! Small f32 vector kernels (attention's inner loops). The loops are written
//! with independent lanes so the compiler vectorises them; each ISA level
//! compiles the same loop with its own target features, and the plain loop
//! is the scalar twin.

use crate::isa::Isa;

/// `out[j] = scale · Σ_d q[d]·kt[d][j]` for `P` positions, `kt` being `[q.len()][P]`.
/// The `P` sums stay in registers across the whole loop over `d`.
#[inline(always)]
fn scores_transposed_loop<const P: usize>(q: &[f32], kt: &[f32], scale: f32, out: &mut [f32; P]) {
    let mut acc = [0f32; P];
    for (&qd, row) in q.iter().zip(kt.chunks_exact(P)) {
        for j in 0..P {
            acc[j] = qd.mul_add(row[j], acc[j]);
        }
    }
    for (o, a) in out.iter_mut().zip(acc) {
        *o = a * scale;
    }
}

/// `acc = acc·rescale + Σ_j w[j]·rows[j]`.
#[inline(always)]
fn weighted_rows_loop(acc: &mut [f32], rescale: f32, w: &[f32], rows: &[f32]) {
    for a in acc.iter_mut() {
        *a *= rescale;
    }
    for (&wj, row) in w.iter().zip(rows.chunks_exact(acc.len())) {
        for (a, &r) in acc.iter_mut().zip(row) {
            *a = wj.mul_add(r, *a);
        }
    }
}

/// Attention heads processed together: the heads of one GQA group share
/// their keys and values, so each loaded key or value vector feeds `Q` heads.
pub const HEADS: usize = 4;

/// [`scores_transposed_loop`] for `HEADS` queries against the same keys: each
/// `kt` row is loaded once for all of them. Each query's sums run in the same
/// order as the single-query loop, so results are identical.
#[inline(always)]
fn scores_heads_loop<const P: usize>(qs: [&[f32]; HEADS], kt: &[f32], scale: f32, out: &mut [[f32; P]; HEADS]) {
    // One length for every query, so the loop indexes them unchecked.
    let n = qs.iter().map(|q| q.len()).min().unwrap_or(0);
    let qs: [&[f32]; HEADS] = std::array::from_fn(|h| &qs[h][..n]);
    // A chunk of positions at a time, so the `HEADS × POS_CHUNK` sums stay
    // in registers (all `P` would spill).
    for p0 in (0..P).step_by(POS_CHUNK) {
        let mut acc = [[0f32; POS_CHUNK]; HEADS];
        for (d, row) in kt.chunks_exact(P).take(n).enumerate() {
            let r: &[f32; POS_CHUNK] = row[p0..p0 + POS_CHUNK].try_into().expect("a whole chunk");
            let qd: [f32; HEADS] = std::array::from_fn(|h| qs[h][d]);
            for h in 0..HEADS {
                for j in 0..POS_CHUNK {
                    acc[h][j] = qd[h].mul_add(r[j], acc[h][j]);
                }
            }
        }
        for (o, a) in out.iter_mut().zip(acc) {
            for (o, a) in o[p0..p0 + POS_CHUNK].iter_mut().zip(a) {
                *o = a * scale;
            }
        }
    }
}

/// Positions per pass of [`scores_heads_loop`] (`P` is a multiple).
const POS_CHUNK: usize = 16;

/// `Σ a[i]·b[i]` over `LANES` partial sums, combined in a fixed order.
#[inline(always)]
fn dot_loop(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail = x.mul_add(*y, tail);
    }
    acc.iter().sum::<f32>() + tail
}

/// `out[h][j] = scale · q_h · rows[j]` for the `HEADS` queries of a group and
/// up to `P` keys stored as rows (`[n][q.len()]`); positions past the keys
/// score 0. One token's scores need no transposed copy of the keys: the copy
/// costs more than the scores it would speed up. One head at a
/// time, so each dot product is the plain lane loop the compiler vectorises
/// fully; the row stays in L1 across the heads.
#[inline(always)]
fn scores_rows_heads_loop<const P: usize>(qs: [&[f32]; HEADS], rows: &[f32], scale: f32, out: &mut [[f32; P]; HEADS]) {
    let d = qs.iter().map(|q| q.len()).min().unwrap_or(0);
    *out = [[0f32; P]; HEADS];
    if d == 0 {
        return;
    }
    for (j, row) in rows.chunks_exact(d).take(P).enumerate() {
        for h in 0..HEADS {
            out[h][j] = dot_loop(&qs[h][..d], row) * scale;
        }
    }
}

/// Dimensions per pass of [`weighted_rows_heads_loop`]: `HEADS` accumulators
/// of this many floats stay in registers (8 AVX2 vectors; 64 spilled).
const DIM_CHUNK: usize = 16;

/// [`weighted_rows_loop`] for `HEADS` accumulators over the same rows, a
/// chunk of `C` dimensions at a time (a constant, so the `HEADS × C`
/// accumulators stay in registers); each element sees the same operations in
/// the same order as the single loop.
#[inline(always)]
fn weighted_rows_chunk<const C: usize>(
    accs: &mut [&mut [f32]; HEADS],
    c0: usize,
    rescale: [f32; HEADS],
    w: [&[f32]; HEADS],
    rows: &[f32],
) {
    let hd = accs[0].len();
    let mut acc = [[0f32; C]; HEADS];
    for h in 0..HEADS {
        for i in 0..C {
            acc[h][i] = accs[h][c0 + i] * rescale[h];
        }
    }
    // Every weight list cut to one length up front, so the loop below
    // indexes them without bounds checks (which also kept accumulators
    // from staying in registers).
    let n = w.iter().map(|w| w.len()).min().unwrap_or(0).min(rows.len() / hd);
    let w: [&[f32]; HEADS] = std::array::from_fn(|h| &w[h][..n]);
    for (j, row) in rows.chunks_exact(hd).take(n).enumerate() {
        let r: &[f32; C] = row[c0..c0 + C].try_into().expect("a whole chunk");
        let wj: [f32; HEADS] = std::array::from_fn(|h| w[h][j]);
        for h in 0..HEADS {
            for i in 0..C {
                acc[h][i] = wj[h].mul_add(r[i], acc[h][i]);
            }
        }
    }
    for h in 0..HEADS {
        accs[h][c0..c0 + C].copy_from_slice(&acc[h]);
    }
}

#[inline(always)]
fn weighted_rows_heads_loop(accs: [&mut [f32]; HEADS], rescale: [f32; HEADS], w: [&[f32]; HEADS], rows: &[f32]) {
    let mut accs = accs;
    let hd = accs[0].len();
    let mut c0 = 0;
    while c0 + DIM_CHUNK <= hd {
        weighted_rows_chunk::<DIM_CHUNK>(&mut accs, c0, rescale, w, rows);
        c0 += DIM_CHUNK;
    }
    while c0 < hd {
        weighted_rows_chunk::<1>(&mut accs, c0, rescale, w, rows);
        c0 += 1;
    }
}

/// `e^x` for `x ≤ 0` (softmax after subtracting the max), as a polynomial the
/// compiler vectorises: `x = n·ln2 + f` (Cody–Waite), `e^f` by its degree-7
/// Taylor polynomial (|f| ≤ ln2/2), `2^n` through the exponent bits. Relative
/// error below 3e-7 (a few ulp); inputs under -87 give about 1e-38.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    // Cody–Waite: ln 2 split in a part exact in f32 times n and a small rest.
    let f = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    let p = 1.0
        + f * (1.0
            + f * (0.5
                + f * (1.0 / 6.0 + f * (1.0 / 24.0 + f * (1.0 / 120.0 + f * (1.0 / 720.0 + f * (1.0 / 5040.0)))))));
    f32::from_bits(((n as i32 + 127) << 23) as u32) * p
}

/// Lanes of the reductions below: independent partial results the compiler
/// keeps in one vector, combined at the end in a fixed order.
const LANES: usize = 16;

/// `max(xs)` (−∞ for none), lane-parallel.
#[inline(always)]
fn max_loop(xs: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            m[i] = m[i].max(c[i]);
        }
    }
    for (i, &x) in tail.iter().enumerate() {
        m[i] = m[i].max(x);
    }
    m.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
}

/// `xs = e^(xs − shift)`, returning `Σ xs` summed lane by lane.
#[inline(always)]
fn exp_shifted_sum_loop(xs: &mut [f32], shift: f32) -> f32 {
    let mut s = [0f32; LANES];
    let mut chunks = xs.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            c[i] = exp_neg(c[i] - shift);
            s[i] += c[i];
        }
    }
    for (i, x) in chunks.into_remainder().iter_mut().enumerate() {
        *x = exp_neg(*x - shift);
        s[i] += *x;
    }
    s.iter().sum()
}

/// `dst = src` widened from f16 (exact). The AVX-512 and AVX2 paths convert
/// 16 or 8 at a time in place (no call per vector); elsewhere `half` picks
/// its own instructions.
pub fn f16_to_f32(src: &[half::f16], dst: &mut [f32], isa: Isa) {
    use half::slice::HalfFloatSliceExt;
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f")]
    unsafe fn avx512(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 16 <= n {
            let h = _mm256_loadu_si256(src.as_ptr().add(i) as *const _);
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
            i += 16;
        }
        src[i..n].convert_to_f32_slice(&mut dst[i..n]);
    }
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn avx2(src: &[half::f16], dst: &mut [f32]) {
        use std::arch::x86_64::*;
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const _);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        src[i..n].convert_to_f32_slice(&mut dst[i..n]);
    }
    match isa {
        // SAFETY (both): the caller's `isa` is available on this processor,
        // and every AVX2 machine tern runs on has F16C (`Isa::detected`).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { avx512(src, dst) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { avx2(src, dst) },
        _ => src.convert_to_f32_slice(dst),
    }
}

/// One online-softmax step for `HEADS` queries over `n` new scores each:
/// `max[h]` and `sum[h]` advance, the scores become their weights (in place),
/// and the factor rescaling each query's old accumulator is returned. The
/// same loops as [`max`] and [`exp_shifted_sum`], in one call for the group.
#[inline(always)]
fn softmax_heads_loop(scores: &mut [[f32; 64]; HEADS], n: usize, max: &mut [f32], sum: &mut [f32]) -> [f32; HEADS] {
    let mut rescale = [0f32; HEADS];
    for (h, sc) in scores.iter_mut().enumerate() {
        let sc = &mut sc[..n];
        let new_max = max[h].max(max_loop(sc));
        rescale[h] = (max[h] - new_max).exp();
        max[h] = new_max;
        sum[h] = sum[h] * rescale[h] + exp_shifted_sum_loop(sc, new_max);
    }
    rescale
}

/// Instantiates a loop at each SIMD level (the same body compiled with each
/// level's target features; the plain build is the scalar twin) and
/// dispatches on `isa`.
macro_rules! per_isa {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? => $body:expr) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty,)* isa: $crate::isa::Isa) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                $body
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                $body
            }
            match isa {
                // SAFETY: the caller's `isa` is available on this processor.
                #[cfg(target_arch = "x86_64")]
                $crate::isa::Isa::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                $crate::isa::Isa::Avx2 => unsafe { avx2($($arg),*) },
                _ => $body,
            }
        }
    };
}

pub(crate) use per_isa;

per_isa! {
    /// Attention scores of `q` against 64 keys stored transposed (`[q.len()][64]`).
    pub fn scores_transposed(q: &[f32], kt: &[f32], scale: f32, out: &mut [f32; 64]) =>
        scores_transposed_loop(q, kt, scale, out)
}

per_isa! {
    /// `acc = acc·rescale + Σ_j w[j]·rows[j]` (attention's value accumulation).
    pub fn weighted_rows(acc: &mut [f32], rescale: f32, w: &[f32], rows: &[f32]) =>
        weighted_rows_loop(acc, rescale, w, rows)
}

per_isa! {
    /// [`scores_transposed`] for the `HEADS` heads of a group at once.
    pub fn scores_transposed_heads(qs: [&[f32]; HEADS], kt: &[f32], scale: f32, out: &mut [[f32; 64]; HEADS]) =>
        scores_heads_loop(qs, kt, scale, out)
}

per_isa! {
    /// Scores of the `HEADS` heads of a group against up to 64 keys stored
    /// as rows: one token's attention.
    pub fn scores_rows_heads(qs: [&[f32]; HEADS], rows: &[f32], scale: f32, out: &mut [[f32; 64]; HEADS]) =>
        scores_rows_heads_loop(qs, rows, scale, out)
}

per_isa! {
    /// [`weighted_rows`] for the `HEADS` heads of a group at once (same rows).
    pub fn weighted_rows_heads(accs: [&mut [f32]; HEADS], rescale: [f32; HEADS], w: [&[f32]; HEADS], rows: &[f32]) =>
        weighted_rows_heads_loop(accs, rescale, w, rows)
}

per_isa! {
    /// See [`softmax_heads_loop`].
    pub fn softmax_heads(scores: &mut [[f32; 64]; HEADS], n: usize, max: &mut [f32], sum: &mut [f32]) -> [f32; HEADS] =>
        softmax_heads_loop(scores, n, max, sum)
}

per_isa! {
    /// The largest element (−∞ for none).
    pub fn max(xs: &[f32]) -> f32 => max_loop(xs)
}

per_isa! {
    /// `x = e^(x − shift)` for every element, `shift ≥ max(x)`; returns their sum.
    pub fn exp_shifted_sum(xs: &mut [f32], shift: f32) -> f32 => exp_shifted_sum_loop(xs, shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn isas() -> impl Iterator<Item = Isa> {
        Isa::ALL.into_iter().filter(|i| i.available())
    }

    #[test]
    fn exp_matches_f64() {
        let xs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
        for isa in isas() {
            let mut got = xs.clone();
            exp_shifted_sum(&mut got, 0.0, isa);
            for (&x, &g) in xs.iter().zip(&got) {
                let want = (x as f64).exp();
                let rel = if x < -87.0 { g as f64 * 1e30 } else { (g as f64 - want).abs() / want };
                assert!(rel < 3e-7, "{isa:?} exp({x}) = {g}, want {want}");
            }
        }
    }

    #[test]
    fn lane_reductions_match_f64() {
        for n in [0usize, 1, 15, 16, 17, 64, 100] {
            let xs: Vec<f32> = (0..n).map(|i| -(((i * 29) % 97) as f32) * 0.1).collect();
            for isa in isas() {
                let want_max = xs.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                assert_eq!(max(&xs, isa), want_max, "{isa:?} n={n}");
                let mut e = xs.clone();
                let sum = exp_shifted_sum(&mut e, 0.0, isa);
                let want: f64 = xs.iter().map(|&x| (x as f64).exp()).sum();
                assert!((sum as f64 - want).abs() <= 1e-6 * want.max(1e-30), "{isa:?} n={n}: {sum} vs {want}");
                assert!(e.iter().zip(&xs).all(|(g, x)| (*g as f64 - (*x as f64).exp()).abs() < 3e-7));
            }
        }
    }

    /// The grouped softmax step is the per-head one (max, exp, sums) for
    /// every ISA, bit for bit, at lengths that are not multiples of 16.
    #[test]
    fn softmax_heads_is_the_per_head_step() {
        for n in [1usize, 15, 17, 40, 64] {
            let base: [[f32; 64]; HEADS] =
                std::array::from_fn(|h| std::array::from_fn(|j| ((j * (h + 3) % 29) as f32 - 14.0) * 0.37));
            for isa in isas() {
                let mut grouped = base;
                let (mut max, mut sum) = ([0.5, f32::NEG_INFINITY, -3.0, 2.0], [1.5, 0.0, 0.25, 4.0]);
                let (max0, sum0) = (max, sum);
                let rescale = softmax_heads(&mut grouped, n, &mut max, &mut sum, isa);
                for h in 0..HEADS {
                    let mut one = base[h];
                    let m = max0[h].max(super::max(&one[..n], Isa::Scalar));
                    let r = (max0[h] - m).exp();
                    let s = sum0[h] * r + exp_shifted_sum(&mut one[..n], m, Isa::Scalar);
                    assert_eq!((rescale[h], max[h], sum[h]), (r, m, s), "{isa:?} n={n} head {h}");
                    assert_eq!(one[..n], grouped[h][..n], "{isa:?} n={n} head {h} weights");
                }
            }
        }
    }

    /// f16 → f32 widening is exact on every ISA, including the tail past the
    /// last 16 and subnormal, infinite and NaN halves.
    #[test]
    fn f16_widening_is_exact() {
        let src: Vec<half::f16> = (0..70u16).map(|i| half::f16::from_bits(i.wrapping_mul(2039) ^ 0x7c00)).collect();
        for isa in isas() {
            let mut out = vec![0f32; src.len()];
            f16_to_f32(&src, &mut out, isa);
            for (h, o) in src.iter().zip(&out) {
                assert_eq!(h.to_f32().to_bits(), o.to_bits(), "{isa:?} {h:?}");
            }
        }
    }

    /// The grouped kernels give exactly the single-head kernels' results.
    #[test]
    fn grouped_heads_match_single_heads_bit_for_bit() {
        for (d, n) in [(1, 3), (64, 64), (100, 17), (128, 40), (72, 64)] {
            let v = |k: usize, m: usize| -> Vec<f32> { (0..k).map(|i| ((i * m % 23) as f32 - 11.0) * 0.13).collect() };
            let qs: Vec<Vec<f32>> = (0..HEADS).map(|h| v(d, 7 + h)).collect();
            let rows = v(d * n, 5);
            let ws: Vec<Vec<f32>> = (0..HEADS).map(|h| v(n, 3 + h)).collect();
            let kt = v(d * 64, 11);
            for isa in isas() {
                let mut grouped = [[0f32; 64]; HEADS];
                scores_transposed_heads([&qs[0], &qs[1], &qs[2], &qs[3]], &kt, 0.7, &mut grouped, isa);
                let mut accs: Vec<Vec<f32>> = (0..HEADS).map(|h| v(d, 13 + h)).collect();
                let mut singles = accs.clone();
                let rescale = [0.5, 1.0, 0.25, 0.75];
                {
                    let [a, b, c, e] = &mut accs[..] else { unreachable!() };
                    weighted_rows_heads([a, b, c, e], rescale, [&ws[0], &ws[1], &ws[2], &ws[3]], &rows, isa);
                }
                for h in 0..HEADS {
                    let mut one = [0f32; 64];
                    scores_transposed(&qs[h], &kt, 0.7, &mut one, isa);
                    assert_eq!(one, grouped[h], "{isa:?} d={d} head {h} scores");
                    weighted_rows(&mut singles[h], rescale[h], &ws[h], &rows, isa);
                    assert_eq!(singles[h], accs[h], "{isa:?} d={d} n={n} head {h} values");
                }
            }
        }
    }

    /// Row-major scores (one token) against float64, at odd dimensions and
    /// key counts; every ISA gives the same bits (the same fused
    /// multiply-adds in the same order).
    #[test]
    fn row_scores_match_f64_on_every_isa() {
        for (d, n) in [(1, 3), (7, 2), (16, 64), (100, 17), (128, 40), (130, 64)] {
            let v = |k: usize, m: usize| -> Vec<f32> { (0..k).map(|i| ((i * m % 23) as f32 - 11.0) * 0.13).collect() };
            let qs: Vec<Vec<f32>> = (0..HEADS).map(|h| v(d, 7 + h)).collect();
            let rows = v(d * n, 5);
            let mut first: Option<[[f32; 64]; HEADS]> = None;
            for isa in isas() {
                let mut out = [[f32::NAN; 64]; HEADS];
                scores_rows_heads([&qs[0], &qs[1], &qs[2], &qs[3]], &rows, 0.7, &mut out, isa);
                for h in 0..HEADS {
                    for j in 0..n {
                        let row = &rows[j * d..(j + 1) * d];
                        let exact: f64 = qs[h].iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * 0.7;
                        let mag: f64 = qs[h].iter().zip(row).map(|(a, b)| (a * b).abs() as f64).sum();
                        let got = out[h][j] as f64;
                        assert!((got - exact).abs() <= 1e-6 * mag + 1e-12, "{isa:?} d={d} head {h} key {j}");
                    }
                    assert!(out[h][n..].iter().all(|&s| s == 0.0), "positions past the keys score 0");
                }
                match first {
                    None => first = Some(out),
                    Some(f) => assert_eq!(f, out, "{isa:?} d={d} n={n}: ISAs disagree"),
                }
            }
        }
    }

    #[test]
    fn scores_and_weighted_rows_match_f64() {
        for (d, n) in [(1, 3), (7, 2), (64, 5), (100, 4), (128, 9)] {
            let q: Vec<f32> = (0..d).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
            let rows: Vec<f32> = (0..d * n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.7).collect();
            let w: Vec<f32> = (0..n).map(|j| 0.1 + j as f32 * 0.05).collect();
            let mut kt = vec![0f32; d * 64];
            for j in 0..n {
                for i in 0..d {
                    kt[i * 64 + j] = rows[j * d + i];
                }
            }
            for isa in isas() {
                let mut out = [0f32; 64];
                scores_transposed(&q, &kt, 0.5, &mut out, isa);
                let mut acc = vec![1f32; d];
                weighted_rows(&mut acc, 0.25, &w, &rows, isa);
                for j in 0..n {
                    let row = &rows[j * d..(j + 1) * d];
                    let exact: f64 = q.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * 0.5;
                    let mag: f64 = q.iter().zip(row).map(|(a, b)| (a * b).abs() as f64).sum();
                    assert!((out[j] as f64 - exact).abs() <= 1e-6 * mag + 1e-12, "{isa:?} d={d} row {j}");
                }
                assert!(out[n..].iter().all(|&s| s == 0.0), "positions past the keys score 0");
                for i in 0..d {
                    let exact: f64 = 0.25 + (0..n).map(|j| w[j] as f64 * rows[j * d + i] as f64).sum::<f64>();
                    assert!((acc[i] as f64 - exact).abs() <= 1e-5, "{isa:?} d={d} elem {i}");
                }
            }
        }
    }
}
