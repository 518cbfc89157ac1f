//! Row-wise and pointwise ops on f32 tensors, each compiled per ISA level
//! (the same loop; results do not depend on the level).

use tern_graph::Activation;

use crate::kernels::vec::per_isa;

/// `1 / sqrt(mean(row²) + eps)`, the mean accumulated in f64 over eight
/// independent partial sums (the loop vectorises and is not one long
/// dependency chain), combined in a fixed order.
#[inline(always)]
fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f64; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..8 {
            lanes[i] += c[i] as f64 * c[i] as f64;
        }
    }
    for (l, &v) in lanes.iter_mut().zip(tail) {
        *l += v as f64 * v as f64;
    }
    let ss: f64 = lanes.iter().sum();
    (1.0 / (ss / row.len() as f64 + eps as f64).sqrt()) as f32
}

/// `y = x / sqrt(mean(x²) + eps)` per row of `n`, then `y · w` when a weight
/// row is given (the graph's `mul` after the norm, in the same float
/// operations). The mean is accumulated in f64 so long rows do not lose
/// precision.
#[inline(always)]
fn rms_norm_loop(x: &[f32], n: usize, eps: f32, w: Option<&[f32]>, y: &mut [f32]) {
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let inv = inv_rms(xr, eps);
        match w {
            Some(w) => {
                for ((o, &v), &wi) in yr.iter_mut().zip(xr).zip(w) {
                    *o = v * inv * wi;
                }
            }
            None => {
                for (o, &v) in yr.iter_mut().zip(xr) {
                    *o = v * inv;
                }
            }
        }
    }
}

per_isa! {
    pub fn rms_norm(x: &[f32], n: usize, eps: f32, y: &mut [f32]) => rms_norm_loop(x, n, eps, None, y)
}

per_isa! {
    /// [`rms_norm`] then `· w` (one row of `n`), in one pass.
    pub fn rms_norm_mul(x: &[f32], n: usize, eps: f32, w: &[f32], y: &mut [f32]) =>
        rms_norm_loop(x, n, eps, Some(w), y)
}

/// [`rms_norm_mul`] over `y` in place, the same float operations.
#[inline(always)]
fn rms_norm_mul_in_place_loop(y: &mut [f32], n: usize, eps: f32, w: &[f32]) {
    for yr in y.chunks_exact_mut(n) {
        let inv = inv_rms(yr, eps);
        for (o, &wi) in yr.iter_mut().zip(w) {
            *o = *o * inv * wi;
        }
    }
}

per_isa! {
    pub fn rms_norm_mul_in_place(y: &mut [f32], n: usize, eps: f32, w: &[f32]) =>
        rms_norm_mul_in_place_loop(y, n, eps, w)
}

/// `y = f(a, b)` where `b` is either the same shape as `a` or one row
/// broadcast over all rows of `a`.
#[inline(always)]
fn binary_loop(a: &[f32], b: &[f32], y: &mut [f32], f: impl Fn(f32, f32) -> f32) {
    let n = b.len();
    for (ar, yr) in a.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        for ((o, &x), &w) in yr.iter_mut().zip(ar).zip(b) {
            *o = f(x, w);
        }
    }
}

per_isa! {
    /// `y = a · b` (see [`binary_loop`] for the shapes).
    pub fn mul(a: &[f32], b: &[f32], y: &mut [f32]) => binary_loop(a, b, y, |x, w| x * w)
}

per_isa! {
    /// `y = a + b` (see [`binary_loop`] for the shapes).
    pub fn add(a: &[f32], b: &[f32], y: &mut [f32]) => binary_loop(a, b, y, |x, w| x + w)
}

per_isa! {
    pub fn scale(x: &[f32], factor: f32, y: &mut [f32]) => {
        for (o, &v) in y.iter_mut().zip(x) {
            *o = v * factor;
        }
    }
}

/// `y = act(gate) * up`.
#[inline(always)]
fn gated_loop(gate: &[f32], up: &[f32], act: Activation, y: &mut [f32]) {
    match act {
        Activation::Silu => {
            for ((o, &g), &u) in y.iter_mut().zip(gate).zip(up) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        }
        Activation::Relu2 => {
            for ((o, &g), &u) in y.iter_mut().zip(gate).zip(up) {
                let r = g.max(0.0);
                *o = r * r * u;
            }
        }
    }
}

per_isa! {
    pub fn gated(gate: &[f32], up: &[f32], act: Activation, y: &mut [f32]) => gated_loop(gate, up, act, y)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::Isa;

    /// Every ISA level computes the scalar loop's exact results (row lengths
    /// that are not multiples of a vector, one broadcast row, both activations).
    #[test]
    fn every_isa_matches_the_scalar_loop() {
        let v = |n: usize, m: usize| -> Vec<f32> { (0..n).map(|i| ((i * m % 31) as f32 - 15.0) * 0.21).collect() };
        for width in [1usize, 7, 33, 2560] {
            let (a, b, row) = (v(3 * width, 7), v(3 * width, 11), v(width, 5));
            let run = |isa: Isa| {
                let mut outs = vec![vec![0f32; 3 * width]; 9];
                rms_norm(&a, width, 1e-5, &mut outs[0], isa);
                mul(&a, &b, &mut outs[1], isa);
                add(&a, &row, &mut outs[2], isa);
                scale(&a, 0.3, &mut outs[3], isa);
                gated(&a, &b, Activation::Silu, &mut outs[4], isa);
                gated(&a, &b, Activation::Relu2, &mut outs[5], isa);
                mul(&a, &row, &mut outs[6], isa);
                rms_norm_mul(&a, width, 1e-5, &row, &mut outs[7], isa);
                let normed = outs[0].clone();
                mul(&normed, &row, &mut outs[8], isa);
                assert_eq!(outs[7], outs[8], "{isa:?} width {width}: fused norm · w");
                let mut in_place = a.clone();
                rms_norm_mul_in_place(&mut in_place, width, 1e-5, &row, isa);
                assert_eq!(in_place, outs[7], "{isa:?} width {width}: in place");
                outs
            };
            let want = run(Isa::Scalar);
            for isa in Isa::ALL.into_iter().filter(|i| i.available()) {
                assert_eq!(run(isa), want, "{isa:?} width {width}");
            }
        }
    }
}
