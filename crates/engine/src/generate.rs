//! The decode loop: evaluate the prompt, then sample one token at a time.

use std::time::{Duration, Instant};

use tern_sampling::Sampler;

use crate::error::Result;
use crate::session::Session;

#[derive(Clone, Debug, Default)]
pub struct GenStats {
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Time to evaluate the prompt (also the time to the first token's logits).
    pub prompt_time: Duration,
    pub gen_time: Duration,
    /// The last generated token when it was not evaluated (generation stopped
    /// right after sampling it); a caller continuing the context feeds it first.
    pub pending: Option<u32>,
}

impl GenStats {
    pub fn prompt_tps(&self) -> f64 {
        self.n_prompt as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    pub fn gen_tps(&self) -> f64 {
        self.n_gen as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
}

/// Feeds `prompt`, then samples up to `n_predict` tokens. `on_token` sees each
/// new token and returns false to stop. Generation also stops at an
/// end-of-generation token (which is not passed on) or when the context is full.
pub fn generate(
    session: &mut Session,
    prompt: &[u32],
    n_predict: usize,
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenStats> {
    let mut stats = GenStats { n_prompt: prompt.len(), ..GenStats::default() };
    let mut history: Vec<u32> = prompt.to_vec();
    let t0 = Instant::now();
    // The logits are read in place, so each token is sampled before the next step.
    let mut tok = sampler.sample(session.eval_last(prompt)?, &history);
    stats.prompt_time = t0.elapsed();
    let t1 = Instant::now();
    while stats.n_gen < n_predict && session.pos() < session.n_ctx() {
        if session.tokenizer().is_ok_and(|t| t.is_eog(tok)) {
            break;
        }
        stats.n_gen += 1;
        history.push(tok);
        if !on_token(tok) || stats.n_gen == n_predict || session.pos() == session.n_ctx() {
            stats.pending = Some(tok);
            break;
        }
        tok = sampler.sample(session.eval_last(&[tok])?, &history);
    }
    stats.gen_time = t1.elapsed();
    Ok(stats)
}
