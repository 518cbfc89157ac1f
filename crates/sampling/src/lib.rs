//! Logit processing and seeded sampling.
//!
//! The chain follows llama.cpp's default order: repetition penalty → top-k →
//! top-p → min-p → temperature → softmax → draw. Because temperature comes
//! after the filters, top-p and min-p judge the temperature-1 distribution,
//! as llama.cpp does. Everything is deterministic: the same config (seed
//! included), logits and history give the same tokens on every platform.
//! Ties are broken toward the lower token id everywhere.
//!
//! Logit edge cases: NaN counts as -inf. If every logit is -inf (or NaN) the
//! sampler returns token 0, the same answer greedy argmax gives. If some
//! logits are +inf, only those remain, with equal probability.

mod rng;

use std::cmp::Ordering;

pub use rng::Rng;

/// Sampling settings. Each filter has an "off" value.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// <= 0 (or NaN) means greedy: the first maximum after the repetition penalty.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 = off.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches
    /// top_p; >= 1 = off, <= 0 keeps only the most likely token.
    pub top_p: f32,
    /// Drop tokens less likely than min_p × the most likely one; <= 0 = off.
    pub min_p: f32,
    /// Penalty for tokens seen in the last `repeat_last_n` of the history;
    /// 1 = off (and so is a value <= 0 or NaN, which has no sensible meaning).
    pub repeat_penalty: f32,
    /// How much history the penalty looks at; 0 = off.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// llama.cpp's defaults. llama.cpp picks a random seed by default; ours
    /// is fixed (0) so that runs are reproducible unless a seed is chosen.
    fn default() -> Self {
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Deterministic argmax decoding with no penalty.
    pub fn greedy() -> Self {
        SamplerConfig { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, ..Default::default() }
    }

    fn is_greedy(&self) -> bool {
        !(self.temperature > 0.0)
    }

    fn penalty_active(&self) -> bool {
        self.repeat_last_n > 0 && self.repeat_penalty > 0.0 && self.repeat_penalty != 1.0
    }
}

/// A token under consideration. `v` is its logit until the softmax step,
/// then its unnormalised probability.
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    v: f32,
}

/// Most likely first, lower id first among equals: a total order, so every
/// selection and sort gives one well-defined result.
fn desc(a: &Cand, b: &Cand) -> Ordering {
    b.v.total_cmp(&a.v).then(a.id.cmp(&b.id))
}

/// The first maximum, with NaN counted as -inf; 0 when every logit is -inf or NaN.
///
/// # Panics
/// If `logits` is empty.
pub fn argmax(logits: &[f32]) -> u32 {
    assert!(!logits.is_empty(), "argmax of empty logits");
    let (mut best, mut best_v) = (0, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        // A strict `>` keeps the first maximum and is false for NaN.
        if x > best_v {
            (best, best_v) = (i, x);
        }
    }
    best as u32
}

/// A seeded sampler. It keeps its RNG and scratch space between calls, so one
/// sampler per sequence gives a reproducible stream.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    /// Reused between calls: with a 128k vocabulary these are 1 MiB each.
    cands: Vec<Cand>,
    recent: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng::new(cfg.seed);
        Sampler { cfg, rng, cands: Vec::new(), recent: Vec::new() }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Restarts the random stream as if newly created with `seed`.
    pub fn reseed(&mut self, seed: u64) {
        self.cfg.seed = seed;
        self.rng = Rng::new(seed);
    }

    /// Picks the next token. `history` is every token so far (prompt and
    /// generated); only its last `repeat_last_n` entries matter, and ids
    /// outside the vocabulary are ignored.
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "sample from empty logits");
        if let Some(greedy) = self.prepare(logits, history) {
            return greedy;
        }
        let total: f64 = self.cands.iter().map(|c| c.v as f64).sum();
        let target = self.rng.next_f64() * total;
        let mut cum = 0.0;
        for c in &self.cands {
            cum += c.v as f64;
            if target < cum {
                return c.id;
            }
        }
        // Only reachable through rounding in the sum: the last candidate is the one `target` fell on.
        self.cands.last().expect("prepare leaves at least one candidate").id
    }

    /// The final distribution `sample` would draw from, most likely first,
    /// as (token, probability). Does not advance the RNG. Greedy configs give
    /// one token with probability 1.
    pub fn probabilities(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f32)> {
        assert!(!logits.is_empty(), "probabilities of empty logits");
        if let Some(greedy) = self.prepare(logits, history) {
            return vec![(greedy, 1.0)];
        }
        let total: f64 = self.cands.iter().map(|c| c.v as f64).sum();
        let mut out: Vec<Cand> = self.cands.iter().map(|c| Cand { id: c.id, v: (c.v as f64 / total) as f32 }).collect();
        out.sort_unstable_by(desc);
        out.into_iter().map(|c| (c.id, c.v)).collect()
    }

    /// Runs the chain up to the softmax. Returns `Some(token)` when the answer
    /// is already decided (greedy, or nothing finite left); otherwise leaves
    /// the surviving candidates with unnormalised probabilities in `cands`.
    fn prepare(&mut self, logits: &[f32], history: &[u32]) -> Option<u32> {
        let cands = &mut self.cands;
        cands.clear();
        let nan_as_inf = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
        cands.extend(logits.iter().enumerate().map(|(i, &x)| Cand { id: i as u32, v: nan_as_inf(x) }));
        if self.cfg.penalty_active() {
            penalize(cands, history, &self.cfg, &mut self.recent);
        }
        if self.cfg.is_greedy() {
            return Some(first_max(cands));
        }
        let max = cands.iter().map(|c| c.v).fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return Some(0);
        }
        if max == f32::INFINITY {
            // inf - inf is NaN: make the +inf tokens equal and drop the rest.
            for c in cands.iter_mut() {
                c.v = if c.v == f32::INFINITY { 0.0 } else { f32::NEG_INFINITY };
            }
        }
        cands.retain(|c| c.v > f32::NEG_INFINITY);
        let max = if max == f32::INFINITY { 0.0 } else { max };

        let mut sorted = 0; // cands[..sorted] are the top candidates, in order
        let k = self.cfg.top_k;
        if k > 0 && k < cands.len() {
            sort_prefix(cands, 0, k);
            cands.truncate(k);
            sorted = k;
        }
        if self.cfg.top_p < 1.0 {
            top_p(cands, sorted, max, self.cfg.top_p);
        }
        if self.cfg.min_p > 0.0 {
            // p_i >= min_p * p_max  <=>  logit_i >= max + ln(min_p); the max always stays.
            let threshold = max + self.cfg.min_p.min(1.0).ln();
            cands.retain(|c| c.v >= threshold);
        }
        let t = self.cfg.temperature;
        for c in cands.iter_mut() {
            // Scaling (logit - max) leaves the softmax unchanged and keeps every
            // exponent <= 0, so the top token weighs exactly 1. Dividing (not
            // multiplying by 1/t) keeps a tiny t from producing 0 * inf = NaN.
            c.v = (((c.v - max) / t) as f64).exp() as f32;
        }
        None
    }
}

/// The first maximum of the candidates (still in id order); 0 if all are -inf.
fn first_max(cands: &[Cand]) -> u32 {
    let mut best = 0;
    for (i, c) in cands.iter().enumerate() {
        if c.v > cands[best].v {
            best = i;
        }
    }
    cands[best].id
}

/// llama.cpp's repetition penalty: each distinct token among the last
/// `repeat_last_n` of the history has its logit divided by the penalty if
/// positive, multiplied by it otherwise — once, however often it occurred.
fn penalize(cands: &mut [Cand], history: &[u32], cfg: &SamplerConfig, recent: &mut Vec<u32>) {
    recent.clear();
    recent.extend_from_slice(&history[history.len().saturating_sub(cfg.repeat_last_n)..]);
    recent.sort_unstable();
    recent.dedup();
    for &t in recent.iter() {
        if let Some(c) = cands.get_mut(t as usize) {
            c.v = if c.v > 0.0 { c.v / cfg.repeat_penalty } else { c.v * cfg.repeat_penalty };
        }
    }
}

/// Makes `cands[from..to]` the next-best candidates in order, given that
/// `cands[..from]` already holds the best ones in order. A selection then a
/// sort of only the prefix: O(n + m log m) rather than a full sort.
fn sort_prefix(cands: &mut [Cand], from: usize, to: usize) {
    let rest = &mut cands[from..];
    let m = to - from;
    if m == 0 {
        return;
    }
    if m < rest.len() {
        rest.select_nth_unstable_by(m - 1, desc);
    }
    rest[..m].sort_unstable_by(desc);
}

/// Keeps the most likely candidates until their probability (at temperature
/// 1) reaches `p`, the one that crosses included. Sorts only as far as
/// needed: the sorted prefix grows by doubling, so a peaked distribution over
/// a 128k vocabulary touches a few hundred tokens, not all of them.
fn top_p(cands: &mut Vec<Cand>, mut sorted: usize, max: f32, p: f32) {
    let weight = |c: &Cand| ((c.v - max) as f64).exp();
    let total: f64 = cands.iter().map(weight).sum();
    let target = p.max(0.0) as f64 * total;
    let mut cum = 0.0;
    let mut i = 0;
    loop {
        while i < sorted {
            cum += weight(&cands[i]);
            i += 1;
            if cum >= target {
                cands.truncate(i);
                return;
            }
        }
        if sorted == cands.len() {
            return; // rounding kept `cum` just under the target: keep everything
        }
        let next = (2 * sorted).max(256).min(cands.len());
        sort_prefix(cands, sorted, next);
        sorted = next;
    }
}
