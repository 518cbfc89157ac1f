//! The fitting routines of ggml's reference quantizers for Q2_K, Q3_K and
//! IQ4_XS (`ggml-quants.c`), reproduced so that our quantizers write the
//! bytes `llama-quantize` writes without an importance matrix. Every float
//! operation is the reference's, in its order and in f32 (ggml-quants.c is
//! built without FMA contraction), so the results agree bit for bit; the
//! integer casts keep C's wrapping where the reference stores an `int` into
//! a byte.

/// ggml's `nearest_int`: rounds by adding 1.5·2²³ and reading the low
/// mantissa bits, i.e. round half to even for |v| < 2²², and defined (if
/// meaningless) for every other input, NaN included.
#[inline]
pub(crate) fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Fits `x ≈ scale·L − min_out` with `L ∈ 0..=nmax` (`make_qkx2_quants`):
/// a zero point at or below zero, weighted absolute (`mad`) or squared
/// error, the levels of the plain min/max fit first, then `nstep + 1` trial
/// inverse scales `(rmin + rdelta·is + nmax)/(max − min)` each refitted by
/// weighted least squares, keeping a trial only if its error is lower.
/// Writes the levels to `l`; returns `(scale, min_out)` with `min_out ≥ 0`
/// (the negated zero point).
#[allow(clippy::too_many_arguments)] // the reference's own parameter list
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        best_error += weights[i] * err(scale * q as f32 + min - x[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                cur_error += weights[i] * err(this_scale * laux[i] as f32 + this_min - x[i]);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Below this largest |x| a group is all zero (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Fits `x ≈ s·q` with `q ∈ −nmax..nmax−1` (`make_q3_quants` with its
/// error refinement on): the element of largest |x| (first on ties) maps
/// to `−nmax`, then up to five passes move single levels where that raises
/// `(Σw·x·q)²/Σw·q²` with weights `w = x²`. Writes `q + nmax` to `l`
/// (all 0 for an all-zero group) and returns `s = Σw·x·q / Σw·q²`.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (mut max, mut amax) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (i, &v) in x.iter().enumerate() {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        l[i] = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let old = l[i] as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let q = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if q != l[i] as i32 {
                    slx += w * v * q as f32;
                    sl2 += w * q as f32 * q as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = q as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for q in l.iter_mut() {
        *q += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Index of the entry of the ascending table `values` nearest to `x`
/// (`best_index_int8`): the ends below the first and above the last entry,
/// a bisection otherwise, the upper entry on an exact tie.
#[inline]
pub(crate) fn best_index(values: &[i8; 16], x: f32) -> u8 {
    if x <= values[0] as f32 {
        return 0;
    }
    if x >= values[15] as f32 {
        return 15;
    }
    let (mut lo, mut hi) = (0usize, 15usize);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if x < values[mid] as f32 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    if x - (values[hi - 1] as f32) < values[hi] as f32 - x {
        (hi - 1) as u8
    } else {
        hi as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        for (v, want) in [(0.5f32, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (3.49, 3), (-7.51, -8), (0.0, 0)] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
        assert_eq!(nearest_int(4_194_303.0), 4_194_303);
        // Defined for what the reference never feeds it.
        let _ = (nearest_int(f32::NAN), nearest_int(f32::INFINITY), nearest_int(-1e30));
    }

    #[test]
    fn best_index_takes_the_nearest_entry_and_the_upper_on_ties() {
        let v: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
        assert_eq!(best_index(&v, -200.0), 0);
        assert_eq!(best_index(&v, 200.0), 15);
        assert_eq!(best_index(&v, 0.0), 8);
        assert_eq!(best_index(&v, -4.5), 8); // tie between −10 and 1: the upper
        assert_eq!(best_index(&v, -4.6), 7);
        assert_eq!(best_index(&v, 100.0), 14);
        assert_eq!(best_index(&v, 101.0), 15); // tie between 89 and 113
        assert_eq!(best_index(&v, f32::NAN), 15);
    }
}
