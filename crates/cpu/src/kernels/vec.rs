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

#[inline(always)]
fn exp_shifted_loop(xs: &mut [f32], shift: f32) {
    for x in xs.iter_mut() {
        *x = exp_neg(*x - shift);
    }
}

/// Instantiates a loop at each SIMD level and dispatches on `isa`.
macro_rules! per_isa {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) => $body512:expr, $body2:expr, $scalar:expr) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty,)* isa: Isa) {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512($($arg: $ty),*) {
                $body512
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2($($arg: $ty),*) {
                $body2
            }
            match isa {
                // SAFETY: the caller's `isa` is available on this processor.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { avx2($($arg),*) },
                _ => $scalar,
            }
        }
    };
}

per_isa! {
    /// Attention scores of `q` against 64 keys stored transposed (`[q.len()][64]`).
    pub fn scores_transposed(q: &[f32], kt: &[f32], scale: f32, out: &mut [f32; 64]) =>
        scores_transposed_loop(q, kt, scale, out), scores_transposed_loop(q, kt, scale, out),
        scores_transposed_loop(q, kt, scale, out)
}

per_isa! {
    /// `acc = acc·rescale + Σ_j w[j]·rows[j]` (attention's value accumulation).
    pub fn weighted_rows(acc: &mut [f32], rescale: f32, w: &[f32], rows: &[f32]) =>
        weighted_rows_loop(acc, rescale, w, rows), weighted_rows_loop(acc, rescale, w, rows),
        weighted_rows_loop(acc, rescale, w, rows)
}

per_isa! {
    /// `x = e^(x − shift)` for every element, `shift ≥ max(x)`.
    pub fn exp_shifted(xs: &mut [f32], shift: f32) =>
        exp_shifted_loop(xs, shift), exp_shifted_loop(xs, shift), exp_shifted_loop(xs, shift)
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
            exp_shifted(&mut got, 0.0, isa);
            for (&x, &g) in xs.iter().zip(&got) {
                let want = (x as f64).exp();
                let rel = if x < -87.0 { g as f64 * 1e30 } else { (g as f64 - want).abs() / want };
                assert!(rel < 3e-7, "{isa:?} exp({x}) = {g}, want {want}");
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
