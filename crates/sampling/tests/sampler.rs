//! Behaviour of the sampler: greedy, determinism, each filter, the penalty
//! math, the drawn distribution, and robustness to NaN / infinities. The
//! chain is also checked against a naive full-sort reference on a 128k vocab.

use tern_sampling::{argmax, Rng, Sampler, SamplerConfig};

/// Only the filter under test active: temperature 1, everything else off.
fn plain() -> SamplerConfig {
    SamplerConfig { temperature: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, repeat_penalty: 1.0, ..Default::default() }
}

fn softmax(l: &[f64]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = l.iter().map(|x| (x - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

/// Deterministic pseudo-normal logits (sum of uniforms), `scale` wide.
fn random_logits(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| scale * ((0..4).map(|_| rng.next_f64()).sum::<f64>() as f32 - 2.0)).collect()
}

fn ids(probs: &[(u32, f32)]) -> Vec<u32> {
    probs.iter().map(|p| p.0).collect()
}

#[test]
fn defaults_match_llama_cpp() {
    let d = SamplerConfig::default();
    assert_eq!(
        (d.temperature, d.top_k, d.top_p, d.min_p, d.repeat_penalty, d.repeat_last_n),
        (0.8, 40, 0.95, 0.05, 1.0, 64)
    );
    assert_eq!(SamplerConfig::greedy().temperature, 0.0);
}

#[test]
fn greedy_is_the_first_argmax() {
    let logits = [1.0, 3.0, 2.0, 3.0, -5.0];
    assert_eq!(argmax(&logits), 1);
    for t in [0.0, -1.0, f32::NAN] {
        let mut s = Sampler::new(SamplerConfig { temperature: t, ..Default::default() });
        for _ in 0..10 {
            assert_eq!(s.sample(&logits, &[]), 1, "temperature {t}");
        }
        assert_eq!(s.probabilities(&logits, &[]), [(1, 1.0)]);
    }
    let mut rng = Rng::new(1);
    let mut s = Sampler::new(SamplerConfig::greedy());
    for _ in 0..50 {
        let l = random_logits(&mut rng, 1000, 3.0);
        assert_eq!(s.sample(&l, &[]), argmax(&l));
    }
}

/// A short generation loop: logits depend on the step, history accumulates.
fn generate(cfg: SamplerConfig, steps: usize) -> Vec<u32> {
    let mut logit_rng = Rng::new(99);
    let mut s = Sampler::new(cfg);
    let mut history = vec![1u32, 2, 3];
    for _ in 0..steps {
        let l = random_logits(&mut logit_rng, 1000, 2.0);
        let t = s.sample(&l, &history);
        history.push(t);
    }
    history.split_off(3)
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    for base in [SamplerConfig::default(), SamplerConfig { repeat_penalty: 1.3, top_k: 0, ..Default::default() }] {
        let a = generate(SamplerConfig { seed: 42, ..base.clone() }, 200);
        let b = generate(SamplerConfig { seed: 42, ..base.clone() }, 200);
        let c = generate(SamplerConfig { seed: 43, ..base.clone() }, 200);
        assert_eq!(a, b);
        let differing = a.iter().zip(&c).filter(|(x, y)| x != y).count();
        assert!(differing > 50, "seeds 42 and 43 differ at only {differing} of 200 steps");
        // Not degenerate: the sampler really samples.
        let mut distinct = a.clone();
        distinct.sort();
        distinct.dedup();
        assert!(distinct.len() > 20);
    }
    // reseed restarts the stream.
    let l = [0.0f32; 16];
    let mut s = Sampler::new(SamplerConfig { seed: 5, ..plain() });
    let first: Vec<u32> = (0..20).map(|_| s.sample(&l, &[])).collect();
    s.reseed(5);
    let again: Vec<u32> = (0..20).map(|_| s.sample(&l, &[])).collect();
    assert_eq!(first, again);
}

#[test]
fn top_k_1_is_greedy() {
    let mut rng = Rng::new(2);
    for seed in 0..20 {
        let mut s = Sampler::new(SamplerConfig { top_k: 1, temperature: 1.5, seed, ..Default::default() });
        let mut l = random_logits(&mut rng, 5000, 1.0);
        l[4000] = 10.0;
        l[100] = 10.0; // a tie: the lower id wins
        assert_eq!(argmax(&l), 100);
        for _ in 0..5 {
            assert_eq!(s.sample(&l, &[]), 100);
        }
    }
}

#[test]
fn tiny_top_p_is_greedy() {
    let mut rng = Rng::new(3);
    for (seed, p) in [(0, 1e-6f32), (1, 0.0), (2, -1.0)] {
        let mut s = Sampler::new(SamplerConfig {
            top_p: p,
            top_k: 0,
            min_p: 0.0,
            temperature: 2.0,
            seed,
            ..Default::default()
        });
        for _ in 0..20 {
            let l = random_logits(&mut rng, 3000, 1.0);
            assert_eq!(s.sample(&l, &[]), argmax(&l));
        }
    }
}

#[test]
fn top_k_and_top_p_keep_the_right_sets() {
    // Probabilities 0.5, 0.3, 0.15, 0.05, in shuffled id order.
    let l: Vec<f32> = [0.15f32, 0.5, 0.05, 0.3].iter().map(|p| p.ln()).collect();
    let mut s = Sampler::new(SamplerConfig { top_k: 2, ..plain() });
    let p = s.probabilities(&l, &[]);
    assert_eq!(ids(&p), [1, 3]);
    assert!((p[0].1 - 0.625).abs() < 1e-6 && (p[1].1 - 0.375).abs() < 1e-6, "{p:?}");
    // top-p keeps tokens until the running sum reaches p, the crossing one included.
    for (top_p, want) in
        [(0.4, vec![1]), (0.5, vec![1]), (0.7, vec![1, 3]), (0.9, vec![1, 3, 0]), (0.99, vec![1, 3, 0, 2])]
    {
        let mut s = Sampler::new(SamplerConfig { top_p, ..plain() });
        assert_eq!(ids(&s.probabilities(&l, &[])), want, "top_p {top_p}");
    }
}

#[test]
fn min_p_filters_relative_to_the_top_token() {
    let probs = [0.5f32, 0.3, 0.15, 0.04, 0.01];
    let l: Vec<f32> = probs.iter().map(|p| p.ln()).collect();
    // min_p 0.1: threshold 0.05, so 0.04 and 0.01 go.
    let mut s = Sampler::new(SamplerConfig { min_p: 0.1, ..plain() });
    let p = s.probabilities(&l, &[]);
    assert_eq!(ids(&p), [0, 1, 2]);
    for (i, &(_, q)) in p.iter().enumerate() {
        assert!((q - probs[i] / 0.95).abs() < 1e-6, "{p:?}");
    }
    for _ in 0..3000 {
        assert!(s.sample(&l, &[]) < 3);
    }
    // min_p 1 (or more) keeps only the top token; the default 0.05 keeps all five here... except 0.01 < 0.025.
    let mut s = Sampler::new(SamplerConfig { min_p: 1.5, ..plain() });
    assert_eq!(ids(&s.probabilities(&l, &[])), [0]);
    let mut s = Sampler::new(SamplerConfig { min_p: 0.05, ..plain() });
    assert_eq!(ids(&s.probabilities(&l, &[])), [0, 1, 2, 3]);
}

#[test]
fn repetition_penalty_math() {
    // Token 0 (positive) is divided, token 1 (negative) multiplied, each once
    // although token 1 occurs twice; tokens 2 and 3 are untouched; 99 is out of range.
    let l = [2.0f32, -1.0, 0.5, 3.0];
    let cfg = SamplerConfig { repeat_penalty: 2.0, repeat_last_n: 64, ..plain() };
    let mut s = Sampler::new(cfg.clone());
    let got = s.probabilities(&l, &[0, 1, 1, 99]);
    let want = softmax(&[1.0, -2.0, 0.5, 3.0]);
    for (id, p) in got {
        assert!((p as f64 - want[id as usize]).abs() < 1e-6, "token {id}: {p} vs {}", want[id as usize]);
    }
    // Only the last `repeat_last_n` tokens count: here just token 3.
    let mut s = Sampler::new(SamplerConfig { repeat_last_n: 1, ..cfg.clone() });
    let got = s.probabilities(&l, &[0, 1, 3]);
    let want = softmax(&[2.0, -1.0, 0.5, 1.5]);
    for (id, p) in got {
        assert!((p as f64 - want[id as usize]).abs() < 1e-6);
    }
    // repeat_last_n 0 and penalty 1 are both off.
    for cfg in [SamplerConfig { repeat_last_n: 0, ..cfg.clone() }, SamplerConfig { repeat_penalty: 1.0, ..cfg }] {
        let got = Sampler::new(cfg).probabilities(&l, &[0, 1, 3]);
        let want = softmax(&[2.0, -1.0, 0.5, 3.0]);
        for (id, p) in got {
            assert!((p as f64 - want[id as usize]).abs() < 1e-6);
        }
    }
    // Greedy sees the penalty too: 3.0 / 1.1 < 2.9.
    let mut g = Sampler::new(SamplerConfig { repeat_penalty: 1.1, ..SamplerConfig::greedy() });
    assert_eq!(g.sample(&[3.0, 2.9], &[0]), 1);
    assert_eq!(g.sample(&[3.0, 2.9], &[1]), 0);
}

/// Draws `n` tokens and returns the frequency of each id.
fn frequencies(s: &mut Sampler, l: &[f32], n: usize) -> Vec<f64> {
    let mut count = vec![0usize; l.len()];
    for _ in 0..n {
        count[s.sample(l, &[]) as usize] += 1;
    }
    count.iter().map(|&c| c as f64 / n as f64).collect()
}

#[test]
fn empirical_distribution_at_temperature_1() {
    let l = [1.0f32, 2.0, 0.5, -1.0];
    let want = softmax(&[1.0, 2.0, 0.5, -1.0]);
    for seed in [0, 1, 12345] {
        let got = frequencies(&mut Sampler::new(SamplerConfig { seed, ..plain() }), &l, 20000);
        for i in 0..4 {
            assert!((got[i] - want[i]).abs() < 0.02, "seed {seed}, token {i}: {} vs {}", got[i], want[i]);
        }
    }
}

#[test]
fn temperature_scaling() {
    let l = [1.0f32, 2.0, 0.5, -1.0];
    for t in [0.25f32, 0.5, 1.0, 2.0, 10.0] {
        let mut s = Sampler::new(SamplerConfig { temperature: t, ..plain() });
        let want = softmax(&l.map(|x| (x / t) as f64));
        for (id, p) in s.probabilities(&l, &[]) {
            assert!((p as f64 - want[id as usize]).abs() < 1e-6, "t {t}, token {id}");
        }
        let got = frequencies(&mut s, &l, 20000);
        for i in 0..4 {
            assert!((got[i] - want[i]).abs() < 0.02, "t {t}, token {i}: {} vs {}", got[i], want[i]);
        }
    }
    // A vanishing temperature is greedy in effect, and never NaN.
    let mut s = Sampler::new(SamplerConfig { temperature: 1e-30, ..plain() });
    assert_eq!(s.probabilities(&l, &[]), [(1, 1.0), (0, 0.0), (2, 0.0), (3, 0.0)]);
    // Filters judge the temperature-1 distribution (temperature comes last).
    let mut s = Sampler::new(SamplerConfig { temperature: 100.0, top_p: 0.7, ..plain() });
    assert_eq!(ids(&s.probabilities(&l, &[])), [1, 0]);
}

#[test]
fn nan_and_infinities_never_panic() {
    let nan = f32::NAN;
    let (inf, ninf) = (f32::INFINITY, f32::NEG_INFINITY);
    for cfg in
        [SamplerConfig::default(), plain(), SamplerConfig::greedy(), SamplerConfig { top_p: 0.5, top_k: 0, ..plain() }]
    {
        let mut s = Sampler::new(SamplerConfig { repeat_penalty: 1.2, ..cfg.clone() });
        // NaN is never chosen.
        for _ in 0..200 {
            let t = s.sample(&[nan, 0.0, nan, 0.1, nan], &[0, 1]);
            assert!(t == 1 || t == 3, "{cfg:?}: {t}");
        }
        // Nothing finite: token 0, whatever the config.
        assert_eq!(s.sample(&[nan, nan, nan], &[]), 0);
        assert_eq!(s.sample(&[ninf, ninf], &[0]), 0);
        assert_eq!(s.sample(&[nan, ninf, nan], &[]), 0);
        // +inf wins; several +inf share the mass.
        assert_eq!(s.sample(&[0.0, inf, 5.0], &[]), 1);
        for _ in 0..50 {
            let t = s.sample(&[inf, nan, inf, 1e30], &[]);
            assert!(t == 0 || t == 2);
        }
        // History with ids beyond the vocabulary is harmless.
        let _ = s.sample(&[1.0, 2.0], &[u32::MAX, 7, 1]);
    }
    assert_eq!(argmax(&[nan, ninf, nan]), 0);
    assert_eq!(argmax(&[nan, -3.0, nan, -2.0]), 3);
    let mut s = Sampler::new(plain());
    let p = s.probabilities(&[inf, nan, inf], &[]);
    assert_eq!(p, [(0, 0.5), (2, 0.5)]);
}

/// The chain done the obvious way (full sort), for comparison.
fn reference(cfg: &SamplerConfig, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
    let mut l: Vec<f32> = logits.iter().map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x }).collect();
    let mut recent: Vec<u32> = history[history.len().saturating_sub(cfg.repeat_last_n)..].to_vec();
    recent.sort();
    recent.dedup();
    for &t in &recent {
        let x = &mut l[t as usize];
        *x = if *x > 0.0 { *x / cfg.repeat_penalty } else { *x * cfg.repeat_penalty };
    }
    let mut c: Vec<(u32, f32)> = l.iter().enumerate().map(|(i, &x)| (i as u32, x)).collect();
    c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if cfg.top_k > 0 {
        c.truncate(cfg.top_k);
    }
    let max = c[0].1;
    let w: Vec<f64> = c.iter().map(|x| ((x.1 - max) as f64).exp()).collect();
    let total: f64 = l.iter().map(|&x| ((x - max) as f64).exp()).filter(|_| cfg.top_k == 0).sum::<f64>()
        + if cfg.top_k > 0 { w.iter().sum() } else { 0.0 };
    let (mut cum, mut keep) = (0.0, c.len());
    for (i, wi) in w.iter().enumerate() {
        cum += wi;
        if cum >= cfg.top_p as f64 * total {
            keep = i + 1;
            break;
        }
    }
    c.truncate(keep);
    c.retain(|x| x.1 >= max + cfg.min_p.ln());
    let p = softmax(&c.iter().map(|x| ((x.1 - max) / cfg.temperature) as f64).collect::<Vec<_>>());
    c.iter().zip(p).map(|(x, p)| (x.0, p)).collect()
}

#[test]
fn matches_a_full_sort_reference_on_a_128k_vocab() {
    let mut rng = Rng::new(4);
    let history: Vec<u32> = (0..200).map(|i| (i * 641) % 128_000).collect();
    let configs = [
        SamplerConfig::default(),
        SamplerConfig { top_k: 0, ..Default::default() },
        SamplerConfig { top_k: 0, top_p: 0.5, min_p: 0.0, repeat_penalty: 1.3, ..Default::default() },
        SamplerConfig { top_k: 1000, top_p: 0.99, min_p: 0.01, temperature: 1.5, ..Default::default() },
        SamplerConfig { top_k: 0, top_p: 0.999, min_p: 1e-4, temperature: 1.0, ..Default::default() },
        // Large k: the select-and-sort path rather than the heap.
        SamplerConfig { top_k: 20_000, top_p: 0.9, min_p: 0.0, temperature: 0.7, ..Default::default() },
    ];
    for (scale, quantize) in [(0.5f32, false), (3.0, false), (12.0, false), (6.0, true)] {
        let mut l = random_logits(&mut rng, 128_000, scale);
        if quantize {
            // Many exact ties, to check that every path breaks them toward the lower id.
            l.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0);
        }
        for cfg in &configs {
            // Compared in id order: near-equal logits may round to equal probabilities.
            let mut want = reference(cfg, &l, &history);
            let mut got = Sampler::new(cfg.clone()).probabilities(&l, &history);
            want.sort_by_key(|w| w.0);
            got.sort_by_key(|g| g.0);
            assert_eq!(got.len(), want.len(), "scale {scale}, {cfg:?}");
            for (g, w) in got.iter().zip(&want) {
                assert_eq!(g.0, w.0, "scale {scale}, {cfg:?}");
                assert!((g.1 as f64 - w.1).abs() < 1e-5, "scale {scale}, {cfg:?}: {g:?} vs {w:?}");
            }
            // And sampling stays inside the kept set.
            let mut s = Sampler::new(cfg.clone());
            for _ in 0..20 {
                let t = s.sample(&l, &history);
                assert!(want.iter().any(|w| w.0 == t));
            }
        }
    }
}

#[test]
fn presence_and_frequency_penalties_math() {
    // Token 1 occurs twice, token 0 once: logit -= count × frequency + presence.
    let l = [2.0f32, -1.0, 0.5, 3.0];
    let cfg = SamplerConfig { presence_penalty: 0.5, frequency_penalty: 0.25, ..plain() };
    let got = Sampler::new(cfg.clone()).probabilities(&l, &[0, 1, 1, 99]);
    let want = softmax(&[2.0 - 0.75, -1.0 - 1.0, 0.5, 3.0]);
    for (id, p) in got {
        assert!((p as f64 - want[id as usize]).abs() < 1e-6, "token {id}: {p} vs {}", want[id as usize]);
    }
    // Negative values encourage repetition; with the repetition penalty, it applies first.
    let cfg2 = SamplerConfig { presence_penalty: -1.0, frequency_penalty: 0.0, repeat_penalty: 2.0, ..plain() };
    let got = Sampler::new(cfg2).probabilities(&l, &[0]);
    let want = softmax(&[2.0 / 2.0 + 1.0, -1.0, 0.5, 3.0]);
    for (id, p) in got {
        assert!((p as f64 - want[id as usize]).abs() < 1e-6);
    }
    // Only the window counts, and greedy sees the penalties.
    let got = Sampler::new(SamplerConfig { repeat_last_n: 1, ..cfg }).probabilities(&l, &[1, 1, 0]);
    let want = softmax(&[2.0 - 0.75, -1.0, 0.5, 3.0]);
    for (id, p) in got {
        assert!((p as f64 - want[id as usize]).abs() < 1e-6);
    }
    let mut g = Sampler::new(SamplerConfig { frequency_penalty: 0.2, ..SamplerConfig::greedy() });
    assert_eq!(g.sample(&[3.0, 2.9], &[0]), 1);
    assert_eq!(g.sample(&[3.0, 2.9], &[]), 0);
}

#[test]
fn log_probs_are_the_raw_distribution() {
    let l = [1.0f32, 3.0, f32::NAN, 2.0];
    let p = softmax(&[1.0, 3.0, f64::NEG_INFINITY, 2.0]);
    let (own, top) = tern_sampling::log_probs(&l, 3, 2);
    assert!((own as f64 - p[3].ln()).abs() < 1e-6);
    assert_eq!(ids(&top), [1, 3]);
    assert!((top[0].1 as f64 - p[1].ln()).abs() < 1e-6);
    let (own, top) = tern_sampling::log_probs(&l, 2, 0);
    assert_eq!(own, f32::NEG_INFINITY);
    assert!(top.is_empty());
    // More asked than there are tokens: all of them, an out-of-range id is -inf.
    assert_eq!(tern_sampling::log_probs(&l, 9, 10).1.len(), 3);
}
