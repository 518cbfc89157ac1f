//! Rotary position embeddings. Angles are computed in f64 so positions deep in
//! a long context keep their precision.

use tern_graph::{RopeMode, RopeParams, Yarn};

/// `x`: `[head_dim * n_head, n_tokens]`, one position per token; `factors`
/// (Llama 3.1 `rope_freqs`) divide each pair's frequency.
pub fn rope(x: &[f32], positions: &[i32], factors: Option<&[f32]>, p: &RopeParams, y: &mut [f32]) {
    y.copy_from_slice(x);
    let half = p.n_rot / 2;
    let width = x.len() / positions.len();
    ANGLES.with_borrow_mut(|angles| {
        for (t, &pos) in positions.iter().enumerate() {
            let cos_sin = angles.at(p, factors, pos);
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
    });
}

/// Each pair's angle per position, and the factor on cos and sin. Pair `i`
/// turns at `base^(-2i/n_rot)`, scaled by `freq_scale`; under YaRN only the
/// pairs that turn fewer than `beta_slow` times over the original context
/// are fully scaled, those above `beta_fast` keep their frequency, with a
/// linear ramp between (the ramp in pair indices, as llama.cpp's
/// `ggml_rope_yarn_corr_dims` bounds it).
fn pair_freqs(p: &RopeParams, factors: Option<&[f32]>) -> (Vec<f64>, f64) {
    let n_rot = p.n_rot as f64;
    let base = p.freq_base as f64;
    // The pair index at which a pair turns `turns` times over `n_ctx` positions.
    let corr = |n_ctx: usize, turns: f32| {
        n_rot * (n_ctx as f64 / (turns as f64 * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let ramp = p.yarn.map(|y| {
        let low = corr(y.n_ctx_orig, y.beta_fast).floor().max(0.0);
        let high = corr(y.n_ctx_orig, y.beta_slow).ceil().min(n_rot - 1.0);
        (low, high, y.ext_factor as f64)
    });
    let freqs = (0..p.n_rot / 2)
        .map(|i| {
            let extrap = base.powf(-2.0 * i as f64 / n_rot);
            let extrap = factors.map_or(extrap, |d| extrap / d[i] as f64);
            let interp = extrap * p.freq_scale as f64;
            match ramp {
                Some((low, high, ext)) => {
                    let y = (i as f64 - low) / (high - low).max(0.001);
                    let mix = (1.0 - y.clamp(0.0, 1.0)) * ext;
                    interp * (1.0 - mix) + extrap * mix
                }
                None => interp,
            }
        })
        .collect();
    (freqs, p.yarn.map_or(1.0, |y| y.magnitude as f64))
}

/// The (cos, sin) of every pair at a run of consecutive positions. Decoding
/// ropes q and k of every layer at the same position, and a prompt's tokens
/// keep their positions through every layer (a thread gets the same rows of
/// each rope op), so each thread keeps the run it computed last and extends
/// it while positions follow on: a prompt's sines are computed once, not
/// 2 × n_layer times.
#[derive(Default)]
struct Angles {
    /// (freq_base, freq_scale, n_rot, yarn) and the frequency divisors `freqs` is for.
    params: Option<(f32, f32, usize, Option<Yarn>)>,
    factors: Vec<f32>,
    freqs: Vec<f64>,
    /// The factor on every cos and sin (YaRN's magnitude, else 1).
    magnitude: f64,
    /// The first position of the run; `cos_sin` holds `freqs.len()` pairs per position.
    first: i32,
    cos_sin: Vec<(f64, f64)>,
}

/// Positions a run may hold before it starts over (2 MB of angles at 64
/// pairs a position).
const MAX_RUN: usize = 2048;

thread_local! {
    static ANGLES: std::cell::RefCell<Angles> = std::cell::RefCell::new(Angles::default());
}

impl Angles {
    fn at(&mut self, p: &RopeParams, factors: Option<&[f32]>, pos: i32) -> &[(f64, f64)] {
        let params = (p.freq_base, p.freq_scale, p.n_rot, p.yarn);
        if self.params != Some(params) || self.factors != factors.unwrap_or_default() {
            (self.freqs, self.magnitude) = pair_freqs(p, factors);
            self.params = Some(params);
            self.factors = factors.unwrap_or_default().to_vec();
            self.cos_sin.clear();
        }
        let half = self.freqs.len();
        let held = (self.cos_sin.len() / half.max(1)) as i64;
        let i = pos as i64 - self.first as i64;
        if !(0..held).contains(&i) {
            if i != held || held as usize >= MAX_RUN {
                self.first = pos;
                self.cos_sin.clear();
            }
            let m = self.magnitude;
            self.cos_sin.extend(self.freqs.iter().map(|f| {
                let (s, c) = (pos as f64 * f).sin_cos();
                (c * m, s * m)
            }));
        }
        let i = (pos - self.first) as usize;
        &self.cos_sin[i * half..(i + 1) * half]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pair `i` of one head rotated by the angle computed from scratch.
    fn direct(x: &[f32], pos: i32, factors: Option<&[f32]>, p: &RopeParams) -> Vec<f32> {
        let mut y = x.to_vec();
        let half = p.n_rot / 2;
        for head in y.chunks_exact_mut(p.head_dim) {
            for i in 0..half {
                let mut f = (p.freq_base as f64).powf(-2.0 * i as f64 / p.n_rot as f64) * p.freq_scale as f64;
                if let Some(d) = factors {
                    f /= d[i] as f64;
                }
                let (s, c) = (pos as f64 * f).sin_cos();
                let (a, b) = match p.mode {
                    RopeMode::Norm => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a] as f64, head[b] as f64);
                head[a] = (x0 * c - x1 * s) as f32;
                head[b] = (x0 * s + x1 * c) as f32;
            }
        }
        y
    }

    /// The per-thread table must follow every change of position, params and
    /// frequency factors (two models in one thread, one after the other).
    #[test]
    fn cached_angles_follow_params_factors_and_positions() {
        let a = RopeParams {
            mode: RopeMode::Norm,
            n_rot: 16,
            head_dim: 16,
            freq_base: 10000.0,
            freq_scale: 1.0,
            yarn: None,
        };
        let b = RopeParams {
            mode: RopeMode::Neox,
            n_rot: 8,
            head_dim: 16,
            freq_base: 500000.0,
            freq_scale: 0.5,
            yarn: None,
        };
        let f1: Vec<f32> = (0..8).map(|i| 1.0 + i as f32).collect();
        let f2: Vec<f32> = (0..8).map(|i| 8.0 - i as f32 * 0.5).collect();
        let x: Vec<f32> = (0..48).map(|i| ((i * 37) % 11) as f32 - 5.0).collect();
        let cases: [(&RopeParams, Option<&[f32]>, i32); 12] = [
            (&a, None, 3),
            (&a, None, 3),
            (&a, None, 4),
            (&a, None, 2),
            (&a, None, 3),
            (&a, None, 5),
            (&a, None, 4),
            (&b, None, 4),
            (&a, Some(&f1), 4),
            (&a, Some(&f2), 4),
            (&a, None, 4),
            (&b, Some(&f1[..4]), 9),
        ];
        for (p, factors, pos) in cases {
            let mut y = vec![0.0; x.len()];
            rope(&x, &[pos], factors, p, &mut y);
            assert_eq!(y, direct(&x, pos, factors, p), "{p:?} {factors:?} pos {pos}");
        }
    }
}
