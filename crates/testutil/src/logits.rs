//! How far one run's logits are from another's, over rows of `n_vocab`:
//! the KL divergence of their softmaxes, top-1 agreement, and max |Δ|.

/// `log_softmax(row)` in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

/// The index of the largest value (the first on ties).
pub fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

/// The largest |a − b| over two slices of the same length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (*x as f64 - *y as f64).abs()).fold(0.0, f64::max)
}

/// How far `ours` is from `reference`.
#[derive(Clone, Copy, Debug)]
pub struct Distance {
    /// Mean KL(reference ‖ ours) over rows, nats.
    pub mean_kl: f64,
    pub max_abs: f64,
    /// Share of rows with the same arg-max.
    pub top1: f64,
}

/// The [`Distance`] of `ours` from `reference`, rows of `n_vocab` logits.
pub fn distance(reference: &[f32], ours: &[f32], n_vocab: usize) -> Distance {
    assert_eq!(reference.len(), ours.len());
    let rows = reference.len() / n_vocab;
    let (mut kl, mut same) = (0.0, 0);
    for (p, q) in reference.chunks_exact(n_vocab).zip(ours.chunks_exact(n_vocab)) {
        let (lp, lq) = (log_softmax(p), log_softmax(q));
        kl += lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
        same += (argmax(p) == argmax(q)) as usize;
    }
    Distance { mean_kl: kl / rows as f64, max_abs: max_abs_diff(reference, ours), top1: same as f64 / rows as f64 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_rows_are_at_distance_zero() {
        let a = [0.5, -1.0, 2.0, 0.0, 1.0, 3.0];
        let d = distance(&a, &a, 3);
        assert_eq!((d.mean_kl, d.max_abs, d.top1), (0.0, 0.0, 1.0));
    }

    #[test]
    fn a_shift_changes_nothing_but_max_abs() {
        let a = [0.5f32, -1.0, 2.0];
        let b = a.map(|v| v + 0.25);
        let d = distance(&a, &b, 3);
        assert!(d.mean_kl.abs() < 1e-12 && d.top1 == 1.0);
        assert!((d.max_abs - 0.25).abs() < 1e-12);
    }

    #[test]
    fn kl_of_two_softmaxes() {
        // p = softmax(0, ln 3) = (1/4, 3/4), q = (1/2, 1/2).
        let (p, q) = ([0.0f32, 3f32.ln()], [0.0f32, 0.0]);
        let want = 0.25 * (0.5f64).ln() + 0.75 * (1.5f64).ln();
        assert!((distance(&p, &q, 2).mean_kl - want).abs() < 1e-6);
        assert_eq!(distance(&p, &[1.0, 0.0], 2).top1, 0.0);
    }
}
