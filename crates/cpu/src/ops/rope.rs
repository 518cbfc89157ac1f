//! Rotary position embeddings. Angles are computed in f64 so positions deep in
//! a long context keep their precision.

use tern_graph::{RopeMode, RopeParams};

/// `x`: `[head_dim * n_head, n_tokens]`, one position per token; `factors`
/// (Llama 3.1 `rope_freqs`) divide each pair's frequency.
pub fn rope(x: &[f32], positions: &[i32], factors: Option<&[f32]>, p: &RopeParams, y: &mut [f32]) {
    y.copy_from_slice(x);
    let half = p.n_rot / 2;
    let freqs: Vec<f64> = (0..half)
        .map(|i| {
            let f = (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_rot as f64) * p.freq_scale as f64;
            factors.map_or(f, |d| f / d[i] as f64)
        })
        .collect();
    let width = x.len() / positions.len();
    let mut cos_sin = vec![(0.0f64, 0.0f64); half];
    for (t, &pos) in positions.iter().enumerate() {
        for (cs, f) in cos_sin.iter_mut().zip(&freqs) {
            let (s, c) = (pos as f64 * f).sin_cos();
            *cs = (c, s);
        }
        for head in y[t * width..(t + 1) * width].chunks_exact_mut(p.head_dim) {
            for (i, &(cos, sin)) in cos_sin.iter().enumerate() {
                let (a, b) = match p.mode {
                    RopeMode::Norm => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a] as f64, head[b] as f64);
                head[a] = (x0 * cos - x1 * sin) as f32;
                head[b] = (x0 * sin + x1 * cos) as f32;
            }
        }
    }
}
