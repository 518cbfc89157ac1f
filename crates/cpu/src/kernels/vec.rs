//! Small f32 vector kernels (attention's inner loops). The loops are written
//! with independent lanes so the compiler vectorises them; each ISA level
//! compiles the same loop with its own target features.

use crate::isa::Isa;

/// `Σ a·b` in `L` independent lanes (then summed), the scalar twin of every level.
#[inline(always)]
fn dot_lanes<const L: usize>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..L {
            acc[i] = x[i].mul_add(y[i], acc[i]);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// `y = y·rescale + w·x`.
#[inline(always)]
fn scale_add_loop(y: &mut [f32], rescale: f32, w: f32, x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = y.mul_add(rescale, w * x);
    }
}

/// `e^x` for `x ≤ 0` (softmax after subtracting the max), as a polynomial the
/// compiler vectorises: `x = n·ln2 + f` (Cody–Waite), `e^f` by its degree-7
/// Taylor polynomial (|f| ≤ ln2/2), `2^n` through the exponent bits. Relative error
/// below 3e-7 (a few ulp); inputs under -87 give about 1e-38.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    let x = x.max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    // Cody–Waite: ln 2 split in a part exact in f32 times n and a small rest.
    let f = (x - n * 0.693_145_75) - n * 1.428_606_8e-6;
    // e^f on |f| ≤ ln2/2.
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn exp_shifted_avx512(xs: &mut [f32], shift: f32) {
    exp_shifted_loop(xs, shift)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_shifted_avx2(xs: &mut [f32], shift: f32) {
    exp_shifted_loop(xs, shift)
}

/// `x = e^(x − shift)` for every element, `shift ≥ max(x)`.
pub fn exp_shifted(xs: &mut [f32], shift: f32, isa: Isa) {
    match isa {
        // SAFETY: the caller's `isa` is available on this processor.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { exp_shifted_avx512(xs, shift) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { exp_shifted_avx2(xs, shift) },
        _ => exp_shifted_loop(xs, shift),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn dot_avx512(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<16>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes::<8>(a, b)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scale_add_avx512(y: &mut [f32], rescale: f32, w: f32, x: &[f32]) {
    scale_add_loop(y, rescale, w, x)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_add_avx2(y: &mut [f32], rescale: f32, w: f32, x: &[f32]) {
    scale_add_loop(y, rescale, w, x)
}

/// `Σ a·b` at ISA level `isa` (which must be available).
pub fn dot(a: &[f32], b: &[f32], isa: Isa) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    match isa {
        // SAFETY: the caller's `isa` is available on this processor.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { dot_avx512(a, b) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { dot_avx2(a, b) },
        _ => dot_lanes::<8>(a, b),
    }
}

/// `y = y·rescale + w·x` at ISA level `isa` (which must be available).
pub fn scale_add(y: &mut [f32], rescale: f32, w: f32, x: &[f32], isa: Isa) {
    debug_assert_eq!(y.len(), x.len());
    match isa {
        // SAFETY: the caller's `isa` is available on this processor.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { scale_add_avx512(y, rescale, w, x) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { scale_add_avx2(y, rescale, w, x) },
        _ => scale_add_loop(y, rescale, w, x),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_f64() {
        let xs: Vec<f32> = (0..2000).map(|i| -(i as f32) * 0.05).collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
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
    fn every_level_matches_f64() {
        for n in [1, 7, 64, 100, 128] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.7).collect();
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let bound = 1e-6 * a.iter().zip(&b).map(|(x, y)| (x * y).abs() as f64).sum::<f64>();
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                assert!((dot(&a, &b, isa) as f64 - exact).abs() <= bound, "{isa:?} n={n}");
                let mut y: Vec<f32> = b.clone();
                scale_add(&mut y, 0.5, 2.0, &a, isa);
                for ((y, &b), &a) in y.iter().zip(&b).zip(&a) {
                    assert!((y - (0.5 * b + 2.0 * a)).abs() <= 1e-5 * (b.abs() + a.abs() + 1.0));
                }
            }
        }
    }
}
