//! Logit comparisons shared by the golden tests.

pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let lse = row.iter().map(|&v| (v as f64 - max).exp()).sum::<f64>().ln() + max;
    row.iter().map(|&v| v as f64 - lse).collect()
}

pub fn argmax(row: &[f32]) -> usize {
    (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b })
}

/// How far `ours` is from `reference`, over rows of `n_vocab` logits.
#[derive(Debug)]
pub struct Distance {
    /// Mean KL(reference ‖ ours), nats.
    pub mean_kl: f64,
    pub max_abs: f64,
    /// Share of rows with the same arg-max.
    pub top1: f64,
}

pub fn distance(reference: &[f32], ours: &[f32], n_vocab: usize) -> Distance {
    assert_eq!(reference.len(), ours.len());
    let rows = reference.len() / n_vocab;
    let (mut kl, mut max_abs, mut same) = (0.0, 0.0f64, 0);
    for (p, q) in reference.chunks_exact(n_vocab).zip(ours.chunks_exact(n_vocab)) {
        let (lp, lq) = (log_softmax(p), log_softmax(q));
        kl += lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
        for (a, b) in p.iter().zip(q) {
            max_abs = max_abs.max((*a as f64 - *b as f64).abs());
        }
        same += (argmax(p) == argmax(q)) as usize;
    }
    Distance { mean_kl: kl / rows as f64, max_abs, top1: same as f64 / rows as f64 }
}
