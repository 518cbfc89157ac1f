//! Logit processing and seeded sampling.
//!
//! The chain follows llama.cpp's default order: penalties (repetition,
//! then OpenAI's presence and frequency, as llama.cpp's penalties sampler) → top-k →
//! top-p → min-p → temperature → softmax → draw. Because temperature comes
//! after the filters, top-p and min-p judge the temperature-1 distribution,
//! as llama.cpp does. Everything is deterministic: the same config (seed
//! included), logits and history give the same tokens. The RNG stream is the
//! same on every platform; `exp` comes from the platform's libm, so another
//! platform could in rare cases round a probability across a draw boundary.
//! Ties are broken toward the lower token id everywhere.
//!
//! Logit edge cases: NaN counts as -inf. If every logit is -inf (or NaN) the
//! sampler returns token 0, the same answer greedy argmax gives. If some
//! logits are +inf, only those remain, with equal probability.

mod rng;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

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
    /// How much history the penalties look at (all three); 0 = off.
    pub repeat_last_n: usize,
    /// OpenAI's `presence_penalty`: subtracted once from the logit of every
    /// token present in the window; 0 = off.
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty`: subtracted from a token's logit once per
    /// occurrence in the window; 0 = off.
    pub frequency_penalty: f32,
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
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
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
        // Written so that NaN is greedy too.
        self.temperature.partial_cmp(&0.0) != Some(Ordering::Greater)
    }

    fn repeat_active(&self) -> bool {
        self.repeat_penalty > 0.0 && self.repeat_penalty != 1.0
    }

    /// Written so that NaN is off.
    fn additive_active(&self) -> bool {
        self.presence_penalty.abs() > 0.0 || self.frequency_penalty.abs() > 0.0
    }

    fn penalty_active(&self) -> bool {
        self.repeat_last_n > 0 && (self.repeat_active() || self.additive_active())
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

/// Ordered by `desc`, so the better candidate is the smaller one (for `BinaryHeap`).
impl Ord for Cand {
    fn cmp(&self, other: &Self) -> Ordering {
        desc(self, other)
    }
}

impl PartialOrd for Cand {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Cand {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Cand {}

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
    /// Scratch reused between calls (with a 128k vocabulary, 0.5-1 MiB each):
    /// the logits after NaN cleanup and penalty, the candidates, the penalised ids.
    vals: Vec<f32>,
    cands: Vec<Cand>,
    recent: Vec<u32>,
}

impl Sampler {
    pub fn new(cfg: SamplerConfig) -> Sampler {
        let rng = Rng::new(cfg.seed);
        Sampler { cfg, rng, vals: Vec::new(), cands: Vec::new(), recent: Vec::new() }
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
        if self.cfg.is_greedy() && !self.cfg.penalty_active() {
            return Some(argmax(logits)); // no copy needed
        }
        let vals = &mut self.vals;
        vals.clear();
        vals.extend(logits.iter().map(|&x| if x.is_nan() { f32::NEG_INFINITY } else { x }));
        if self.cfg.penalty_active() {
            penalize(vals, history, &self.cfg, &mut self.recent);
        }
        if self.cfg.is_greedy() {
            return Some(argmax(vals));
        }
        let mut max = vals.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return Some(0);
        }
        if max == f32::INFINITY {
            // inf - inf is NaN: make the +inf tokens equal and drop the rest.
            for v in vals.iter_mut() {
                *v = if *v == f32::INFINITY { 0.0 } else { f32::NEG_INFINITY };
            }
            max = 0.0;
        }

        let cands = &mut self.cands;
        cands.clear();
        let mut sorted = 0; // cands[..sorted] are the top candidates, in order
        let k = self.cfg.top_k;
        if k > 0 && k <= vals.len() / 16 {
            // The usual case (k = 40 of 128k): one pass with a k-heap, no 1 MiB candidate list.
            top_k_heap(vals, k, cands);
            sorted = cands.len();
        } else {
            let finite = vals.iter().enumerate().filter(|(_, &v)| v > f32::NEG_INFINITY);
            cands.extend(finite.map(|(i, &v)| Cand { id: i as u32, v }));
            if k > 0 && k < cands.len() {
                sort_prefix(cands, 0, k);
                cands.truncate(k);
                sorted = k;
            }
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
            c.v = ((c.v - max) / t).exp();
        }
        None
    }
}

/// llama.cpp's penalties over the last `repeat_last_n` of the history: each
/// distinct token has its logit divided by the repetition penalty if
/// positive, multiplied by it otherwise (once, however often it occurred);
/// then `count × frequency + presence` is subtracted (OpenAI's definition).
fn penalize(vals: &mut [f32], history: &[u32], cfg: &SamplerConfig, recent: &mut Vec<u32>) {
    recent.clear();
    recent.extend_from_slice(&history[history.len().saturating_sub(cfg.repeat_last_n)..]);
    recent.sort_unstable();
    let (repeat, additive) = (cfg.repeat_active(), cfg.additive_active());
    // After the sort, equal ids are adjacent: one run per distinct token, its length the count.
    for run in recent.chunk_by(|a, b| a == b) {
        let Some(v) = vals.get_mut(run[0] as usize) else { continue };
        if repeat {
            *v = if *v > 0.0 { *v / cfg.repeat_penalty } else { *v * cfg.repeat_penalty };
        }
        if additive {
            *v -= run.len() as f32 * cfg.frequency_penalty + cfg.presence_penalty;
        }
    }
}

/// The `k` best finite values into `cands`, best first. A max-heap under
/// `desc` keeps the worst survivor on top, so most tokens cost one float
/// comparison. Ties go to the lower id because ids arrive in increasing order
/// and an equal value never displaces a survivor.
fn top_k_heap(vals: &[f32], k: usize, cands: &mut Vec<Cand>) {
    let mut heap = BinaryHeap::from(std::mem::take(cands));
    heap.reserve(k);
    let mut worst = f32::NEG_INFINITY; // stays -inf until the heap is full, which also skips -inf tokens
    for (i, &v) in vals.iter().enumerate() {
        if v > worst {
            let c = Cand { id: i as u32, v };
            if heap.len() < k {
                heap.push(c);
                if heap.len() < k {
                    continue;
                }
            } else {
                *heap.peek_mut().expect("full heap") = c;
            }
            worst = heap.peek().expect("full heap").v;
        }
    }
    *cands = heap.into_sorted_vec();
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
/// one) reaches `p`, the one that crosses included. Sorts only as far as
/// needed: the sorted prefix grows by doubling, so a peaked distribution over
/// a 128k vocabulary sorts a few hundred tokens, not all of them.
fn top_p(cands: &mut Vec<Cand>, mut sorted: usize, max: f32, p: f32) {
    let weight = |c: &Cand| (c.v - max).exp() as f64;
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

/// The natural log-probabilities of the model's own distribution (the raw
/// logits' softmax, before any filter or temperature), as OpenAI's
/// `logprobs` report them: the chosen token's and the `n` most likely
/// (most likely first, lower id first among equals). NaN counts as -inf.
///
/// # Panics
/// If `logits` is empty.
pub fn log_probs(logits: &[f32], chosen: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    assert!(!logits.is_empty(), "log_probs of empty logits");
    let clean = |x: f32| if x.is_nan() { f32::NEG_INFINITY } else { x };
    let max = logits.iter().copied().map(clean).fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&x| ((clean(x) - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |x: f32| (clean(x) as f64 - lse) as f32;
    let own = logits.get(chosen as usize).map_or(f32::NEG_INFINITY, |&x| lp(x));
    let mut top = Vec::new();
    if n > 0 {
        let mut cands = Vec::new();
        let vals: Vec<f32> = logits.iter().copied().map(clean).collect();
        top_k_heap(&vals, n.min(vals.len()), &mut cands);
        top = cands.into_iter().map(|c| (c.id, lp(c.v))).collect();
    }
    (own, top)
}
