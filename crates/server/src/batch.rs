//! Continuous batching: the engine thread's loop. Every step is one
//! `Session::eval_seqs` over the next token of every decoding sequence and
//! chunks of the prompts being read, up to `n_batch` tokens: decoding tokens
//! first, then prompt chunks in the order their requests took a slot, so a
//! long prompt arriving costs the running streams one chunk's time a step,
//! never the whole prompt's. Each logits row is sampled with its sequence's
//! own sampler and becomes that request's events. Jobs take a slot as one
//! frees (`slots::pick`); a sequence that ends, or whose client has gone,
//! frees its slot within the step.
//!
//! Where the session takes one sequence at a time (an attention on the
//! CUDA backend, `Session::multi_seq`), only slot 0 serves: requests run one
//! after another, each in its own steps, still with prompt reuse.

use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use tern_engine::{SeqInput, Session};
use tern_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::engine::{Event, Finish, Job, Shared};
use crate::sequence::{Next, Sequence};
use crate::slots::{self, Slot};

pub struct Engine {
    session: Session,
    shared: Arc<Shared>,
    tok: Arc<Tokenizer>,
    slots: Vec<Slot>,
    /// Admitted jobs waiting for a free slot, in arrival order.
    waiting: VecDeque<Job>,
    /// Tokens a step may evaluate (the session's `n_batch`, at least the slots).
    budget: usize,
    /// Counts slot assignments (least-recent choice, prompt order).
    clock: u64,
}

/// One step's part for one slot: `n` tokens from where its sequence stands.
struct Part {
    slot: usize,
    n: usize,
    logits: bool,
}

impl Engine {
    /// Serves `shared.n_slots` slots, as many as the session has sequences
    /// (one where it takes one sequence at a time).
    pub fn new(session: Session, shared: Arc<Shared>, tok: Arc<Tokenizer>) -> Engine {
        let n = if session.multi_seq().is_ok() { shared.n_slots.min(session.n_seqs()) } else { 1 };
        let slots = (0..n).map(|_| Slot { cached: Vec::new(), used: 0, seq: None }).collect();
        let budget = session.n_batch();
        Engine { session, shared, tok, slots, waiting: VecDeque::new(), budget, clock: 0 }
    }

    /// Serves until every handle is dropped and the last sequence ends.
    pub fn run(mut self, mut jobs: mpsc::UnboundedReceiver<Job>) {
        loop {
            let idle = self.waiting.is_empty() && self.slots.iter().all(|s| s.seq.is_none());
            if idle {
                // None: every handle is gone and nothing is left to serve.
                let Some(job) = jobs.blocking_recv() else { return };
                self.waiting.push_back(job);
            }
            while let Ok(job) = jobs.try_recv() {
                self.waiting.push_back(job);
            }
            self.admit();
            self.drop_gone();
            if self.slots.iter().any(|s| s.seq.is_some()) {
                if let Err(e) = std::panic::catch_unwind(AssertUnwindSafe(|| self.step())) {
                    let why =
                        e.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| e.downcast_ref::<String>().cloned());
                    self.fail_all(&format!("internal error: generation panicked ({})", why.unwrap_or_default()));
                }
            }
        }
    }

    /// Ends a request: its slot is released before its last event is sent,
    /// so a client that has its answer sees the slot free in `/metrics`.
    fn end(&self, events: &mpsc::UnboundedSender<Event>, last: Option<Event>) {
        self.shared.release();
        if let Some(ev) = last {
            let _ = events.send(ev);
        }
    }

    /// Puts waiting jobs into free slots; answers those that need no slot.
    fn admit(&mut self) {
        while let Some(job) = self.waiting.front() {
            if self.shared.shutting_down.load(SeqCst) {
                let job = self.waiting.pop_front().expect("front");
                self.end(&job.events, Some(Event::Failed("the server is shutting down".into())));
                continue;
            }
            if job.events.is_closed() {
                let job = self.waiting.pop_front().expect("front");
                self.end(&job.events, None);
                continue;
            }
            let m = &self.shared.metrics;
            if job.params.max_tokens == Some(0) {
                let job = self.waiting.pop_front().expect("front");
                m.prompt_tokens.fetch_add(job.prompt.len() as u64, SeqCst);
                let done = Event::Done {
                    finish: Finish::Length,
                    prompt_tokens: job.prompt.len(),
                    completion_tokens: 0,
                    cached_tokens: 0,
                };
                self.end(&job.events, Some(done));
                continue;
            }
            let Some((i, reuse)) = slots::pick(&self.slots, &job.prompt, job.params.cache_prompt) else { return };
            let job = self.waiting.pop_front().expect("front");
            m.prompt_tokens.fetch_add(job.prompt.len() as u64, SeqCst);
            m.prompt_tokens_cached.fetch_add(reuse as u64, SeqCst);
            self.clock += 1;
            let slot = &mut self.slots[i];
            slot.cached.truncate(reuse);
            slot.used = self.clock;
            slot.seq = Some(Sequence::new(job, reuse, self.clock));
            self.session.truncate_seq(i, reuse).expect("slots are the session's sequences");
        }
    }

    /// Frees the slots of sequences whose clients have gone.
    fn drop_gone(&mut self) {
        for i in 0..self.slots.len() {
            if self.slots[i].seq.as_ref().is_some_and(|s| s.job.events.is_closed()) {
                let seq = self.slots[i].seq.take().expect("checked");
                self.end(&seq.job.events, None);
            }
        }
    }

    /// The parts of the next step: every decoding token (the budget is at
    /// least the slots, `engine::start` checks), then prompt chunks in
    /// admission order while the budget lasts.
    fn plan(&self) -> Vec<Part> {
        let mut parts = Vec::new();
        let mut left = self.budget;
        for (slot, s) in self.slots.iter().enumerate() {
            if s.seq.as_ref().is_some_and(|q| q.next.is_some()) {
                parts.push(Part { slot, n: 1, logits: true });
                left -= 1;
            }
        }
        let mut prompts: Vec<(u64, usize, usize)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.seq.as_ref().map(|q| (q.admitted, i, q.prompt_left().len())))
            .filter(|&(_, _, n)| n > 0)
            .collect();
        prompts.sort_unstable();
        for (_, slot, n) in prompts {
            if left == 0 {
                break;
            }
            let take = n.min(left);
            parts.push(Part { slot, n: take, logits: take == n });
            left -= take;
        }
        parts
    }

    /// One forward pass over the planned parts, then each row to its sequence.
    fn step(&mut self) {
        let parts = self.plan();
        let tokens: Vec<Vec<u32>> = parts
            .iter()
            .map(|p| {
                let seq = self.slots[p.slot].seq.as_ref().expect("planned slots hold sequences");
                match seq.next {
                    Some(t) => vec![t],
                    None => seq.prompt_left()[..p.n].to_vec(),
                }
            })
            .collect();
        let inputs: Vec<SeqInput> =
            parts.iter().zip(&tokens).map(|(p, t)| SeqInput { seq: p.slot, tokens: t, logits: p.logits }).collect();
        let Engine { session, slots, shared, tok, .. } = self;
        let (n_vocab, n_ctx) = (session.n_vocab(), session.n_ctx());
        let logits = match session.eval_seqs(&inputs) {
            Ok(l) => l,
            Err(e) => return self.fail_all(&e.to_string()),
        };
        let m = &shared.metrics;
        m.steps.fetch_add(1, SeqCst);
        m.step_sequences.fetch_add(parts.len() as u64, SeqCst);
        let mut rows = logits.chunks_exact(n_vocab);
        let mut ended = Vec::new();
        for (p, t) in parts.iter().zip(&tokens) {
            let slot = &mut slots[p.slot];
            slot.cached.extend_from_slice(t);
            let seq = slot.seq.as_mut().expect("planned slots hold sequences");
            if seq.next.is_none() {
                seq.fed += p.n;
                m.prompt_tokens_evaluated.fetch_add(p.n as u64, SeqCst);
            }
            if !p.logits {
                continue;
            }
            let row = rows.next().expect("a row per part that asks");
            let room = slot.cached.len() < n_ctx;
            match seq.on_logits(row, tok, m, room) {
                Next::Token(id) => seq.next = Some(id),
                Next::Done(finish) => ended.push((p.slot, Some(finish))),
                Next::Gone => ended.push((p.slot, None)),
            }
        }
        for (slot, finish) in ended {
            let seq = self.slots[slot].seq.take().expect("ended sequences are in their slots");
            let events = seq.job.events.clone();
            let last = finish.map(|f| seq.finish(f));
            self.end(&events, last);
        }
    }

    /// Fails every running request (a model error or a panic mid-step) and
    /// forgets every slot's cache, which the step may have left half written.
    fn fail_all(&mut self, why: &str) {
        for i in 0..self.slots.len() {
            self.slots[i].cached.clear();
            let _ = self.session.truncate_seq(i, 0);
            if let Some(seq) = self.slots[i].seq.take() {
                self.end(&seq.job.events, Some(Event::Failed(why.to_string())));
            }
        }
    }
}
