//! One request in a slot: its prompt fed chunk by chunk, then one token a
//! step. A `Sequence` holds what a request's generation needs between
//! steps (sampler, stream decoder, stop matcher, history, counts) and turns
//! each row of logits the engine gives it into the request's events.

use std::time::Instant;

use tern_sampling::{log_probs, Sampler};
use tern_tokenizer::{StreamDecoder, Tokenizer};

use crate::engine::{Event, Finish, Job, TokenLogprob};
use crate::metrics::Metrics;
use crate::stop::StopMatcher;

/// What a row of logits made of a sequence.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// Feed this token next step.
    Token(u32),
    /// Generation ended (`Sequence::finish` sends the last events).
    Done(Finish),
    /// The client has gone: nothing more is sent.
    Gone,
}

pub struct Sequence {
    pub job: Job,
    /// Prompt tokens in the slot's cache: reused ones, then each chunk evaluated.
    pub fed: usize,
    /// Prompt tokens the slot's cache already held (`cache_prompt`).
    pub cached: usize,
    /// The sampled token the next step evaluates, once the prompt is in.
    pub next: Option<u32>,
    /// When its prompt started (`Engine` feeds prompts in this order).
    pub admitted: u64,
    sampler: Sampler,
    decoder: StreamDecoder,
    stop: StopMatcher,
    /// Prompt and generated tokens, for the repetition penalties.
    history: Vec<u32>,
    pending_lp: Vec<TokenLogprob>,
    n_gen: usize,
    last: Instant,
    stopped_at_string: bool,
    /// A logits row without the end-of-generation tokens (`ignore_eos`).
    masked: Vec<f32>,
}

impl Sequence {
    /// A job whose first `cached` prompt tokens its slot already holds.
    pub fn new(job: Job, cached: usize, admitted: u64) -> Sequence {
        let p = &job.params;
        Sequence {
            sampler: Sampler::new(p.sampler.clone()),
            decoder: StreamDecoder::new(false),
            stop: StopMatcher::new(p.stop.clone()),
            history: job.prompt.clone(),
            pending_lp: Vec::new(),
            fed: cached,
            cached,
            next: None,
            admitted,
            n_gen: 0,
            last: Instant::now(),
            stopped_at_string: false,
            masked: Vec::new(),
            job,
        }
    }

    /// Prompt tokens still to evaluate.
    pub fn prompt_left(&self) -> &[u32] {
        &self.job.prompt[self.fed..]
    }

    /// Samples the next token from `logits` (after the whole prompt or the
    /// last token) and sends the text it completes. `room`: whether the
    /// slot's context holds one more token.
    pub fn on_logits(&mut self, logits: &[f32], tok: &Tokenizer, m: &Metrics, room: bool) -> Next {
        let id = if self.job.params.ignore_eos {
            // The row without its end-of-generation tokens (log-probabilities stay the model's).
            self.masked.clear();
            self.masked.extend_from_slice(logits);
            for &e in tok.eog_ids() {
                if let Some(x) = self.masked.get_mut(e as usize) {
                    *x = f32::NEG_INFINITY;
                }
            }
            self.sampler.sample(&self.masked, &self.history)
        } else {
            self.sampler.sample(logits, &self.history)
        };
        let lp = self.job.params.logprobs.map(|n| {
            let (logprob, top) = log_probs(logits, id, n);
            TokenLogprob { id, logprob, top }
        });
        if tok.is_eog(id) {
            return Next::Done(Finish::Stop);
        }
        let now = Instant::now();
        if self.n_gen == 0 {
            m.first_token(now - self.job.arrived);
        } else {
            m.next_token(now - self.last);
        }
        self.last = now;
        self.n_gen += 1;
        m.generated_tokens.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.history.push(id);
        self.pending_lp.extend(lp);
        let (text, hit) = self.stop.push(&self.decoder.push(tok, id));
        if !text.is_empty() || hit {
            let logprobs = std::mem::take(&mut self.pending_lp);
            if self.job.events.send(Event::Text { text, logprobs }).is_err() {
                return Next::Gone;
            }
        }
        if hit {
            self.stopped_at_string = true;
            return Next::Done(Finish::Stop);
        }
        if self.job.events.is_closed() {
            return Next::Gone;
        }
        // The next step would not fit: the answer is cut here, as `tern run` does.
        if !room || self.n_gen >= self.job.params.max_tokens.unwrap_or(usize::MAX) {
            return Next::Done(Finish::Length);
        }
        Next::Token(id)
    }

    /// Sends what the decoder still holds (dropped after a stop string: it
    /// comes after it) and returns the last event.
    pub fn finish(mut self, finish: Finish) -> Event {
        if !self.stopped_at_string {
            let rest = self.stop.push(&self.decoder.finish()).0 + &self.stop.finish();
            if !rest.is_empty() || !self.pending_lp.is_empty() {
                let _ = self.job.events.send(Event::Text { text: rest, logprobs: self.pending_lp });
            }
        }
        Event::Done {
            finish,
            prompt_tokens: self.job.prompt.len(),
            completion_tokens: self.n_gen,
            cached_tokens: self.cached,
        }
    }
}
