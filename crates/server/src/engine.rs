//! The engine thread: the only owner of the `Session`. Handlers send it
//! `Job`s over a channel and read `Event`s back; nothing else touches the
//! model.
//!
//! Slots and the queue: a request takes one of `n_slots` slots when it is
//! admitted; past them it waits in the queue (at most `max_queue`); beyond
//! that it is refused (503). Today the engine serves busy slots one after
//! another, in arrival order, each with the session's whole KV cache (the
//! per-slot context). Batched decoding plugs in at `Engine::run`: take up to
//! `n_slots` jobs at once, keep a `Sequence` (sampler, decoder, stop matcher,
//! counts: the state `Sequence::step` now advances) per slot, and feed one
//! token of every live sequence to a multi-sequence `eval` each step.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Instant;

use tern_engine::Session;
use tern_sampling::{log_probs, Sampler, SamplerConfig};
use tern_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::metrics::{Gauges, Metrics};

use crate::stop::StopMatcher;

/// What a request asks of generation.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub sampler: SamplerConfig,
    /// None: until an end-of-generation token or the slot's context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Some(n): report each token's log-probability and the n most likely.
    pub logprobs: Option<usize>,
}

pub struct Job {
    pub prompt: Vec<u32>,
    pub params: GenParams,
    pub events: mpsc::UnboundedSender<Event>,
    pub arrived: Instant,
}

#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Debug)]
pub enum Event {
    /// Text now safe to show, with the log-probabilities of the tokens it came from.
    Text {
        text: String,
        logprobs: Vec<TokenLogprob>,
    },
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
    /// Generation failed (a model error, or the server shutting down).
    Failed(String),
}

/// The slot accounting shared by the engine and the handlers.
pub struct Shared {
    pub metrics: Metrics,
    pub n_slots: usize,
    pub max_queue: usize,
    /// Admitted and not yet finished: the first `n_slots` hold slots, the rest queue.
    admitted: AtomicUsize,
    shutting_down: AtomicBool,
}

impl Shared {
    pub fn gauges(&self) -> Gauges {
        let a = self.admitted.load(SeqCst);
        Gauges {
            slots_total: self.n_slots,
            slots_busy: a.min(self.n_slots),
            queue_depth: a.saturating_sub(self.n_slots),
        }
    }

    fn release(&self) {
        self.admitted.fetch_sub(1, SeqCst);
    }
}

/// Why a job was not admitted.
#[derive(Debug)]
pub enum Refused {
    QueueFull,
    ShuttingDown,
}

/// The handlers' side: submits jobs.
#[derive(Clone)]
pub struct EngineHandle {
    jobs: mpsc::UnboundedSender<Job>,
    pub shared: Arc<Shared>,
}

impl EngineHandle {
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        let s = &self.shared;
        if s.shutting_down.load(SeqCst) {
            return Err(Refused::ShuttingDown);
        }
        let cap = s.n_slots + s.max_queue;
        s.admitted.fetch_update(SeqCst, SeqCst, |a| (a < cap).then_some(a + 1)).map_err(|_| Refused::QueueFull)?;
        // The engine thread only ends when every handle is gone, so this send succeeds.
        if self.jobs.send(job).is_err() {
            s.release();
            return Err(Refused::ShuttingDown);
        }
        Ok(())
    }

    /// Refuses new jobs and makes the engine cancel queued ones; running ones finish.
    pub fn shut_down(&self) {
        self.shared.shutting_down.store(true, SeqCst);
    }
}

/// Starts the engine thread around the session `load` makes (on that thread,
/// so the session never crosses threads).
pub fn start<F>(
    load: F,
    n_slots: usize,
    max_queue: usize,
) -> Result<(EngineHandle, std::thread::JoinHandle<()>, Loaded), String>
where
    F: FnOnce() -> Result<Session, String> + Send + 'static,
{
    let shared = Arc::new(Shared {
        metrics: Metrics::default(),
        n_slots,
        max_queue,
        admitted: AtomicUsize::new(0),
        shutting_down: AtomicBool::new(false),
    });
    let (jobs_tx, jobs_rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name("tern-engine".into())
        .spawn(move || {
            let session = match load().and_then(|s| s.tokenizer().map(|t| (s, t)).map_err(|e| e.to_string())) {
                Ok((session, tok)) => {
                    let _ = ready_tx.send(Ok(Loaded {
                        tokenizer: tok,
                        n_ctx: session.n_ctx(),
                        session_info: info(&session),
                    }));
                    session
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            Engine { session, shared: s }.run(jobs_rx);
        })
        .map_err(|e| format!("starting the engine thread: {e}"))?;
    let loaded = ready_rx.recv().map_err(|_| "the engine thread ended while loading".to_string())??;
    Ok((EngineHandle { jobs: jobs_tx, shared }, thread, loaded))
}

/// What the HTTP side learns about the loaded model.
pub struct Loaded {
    pub tokenizer: Arc<Tokenizer>,
    /// A slot's context (the session's).
    pub n_ctx: usize,
    pub session_info: ModelInfo,
}

#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub chat_template: Option<String>,
}

fn info(s: &Session) -> ModelInfo {
    ModelInfo {
        n_ctx_train: s.model.config.n_ctx_train,
        n_vocab: s.n_vocab(),
        chat_template: s.file.metadata.get("tokenizer.chat_template").and_then(|v| v.as_str()).map(str::to_string),
    }
}

struct Engine {
    session: Session,
    shared: Arc<Shared>,
}

impl Engine {
    /// Serves jobs in arrival order until every handle is dropped. A job's
    /// slot is released before its last event is sent, so a client that has
    /// its answer sees the slot free in `/metrics`.
    fn run(mut self, mut jobs: mpsc::UnboundedReceiver<Job>) {
        while let Some(job) = jobs.blocking_recv() {
            let events = job.events.clone();
            let last = if self.shared.shutting_down.load(SeqCst) {
                Some(Event::Failed("the server is shutting down".into()))
            } else if events.is_closed() {
                None
            } else {
                match std::panic::catch_unwind(AssertUnwindSafe(|| self.serve(job))) {
                    Ok(Ok(done)) => done,
                    // The handler counts the failure when it answers with it.
                    Ok(Err(e)) => Some(Event::Failed(e)),
                    Err(_) => Some(Event::Failed("internal error: generation panicked".into())),
                }
            };
            self.shared.release();
            if let Some(ev) = last {
                let _ = events.send(ev);
            }
        }
    }

    /// One request, from its prompt to its last token; returns the final
    /// event (`Done`), none when the client has gone (the receiver is
    /// dropped, checked every token: its slot frees within one step).
    fn serve(&mut self, job: Job) -> Result<Option<Event>, String> {
        let m = &self.shared.metrics;
        let tok = self.session.tokenizer().map_err(|e| e.to_string())?;
        let Job { prompt, params, events, arrived } = job;
        self.session.reset();
        let mut sampler = Sampler::new(params.sampler.clone());
        let mut decoder = StreamDecoder::new(false);
        let mut stop = StopMatcher::new(params.stop.clone());
        let mut history = prompt.clone();
        let mut pending_lp: Vec<TokenLogprob> = Vec::new();
        m.prompt_tokens.fetch_add(prompt.len() as u64, SeqCst);
        let max = params.max_tokens.unwrap_or(usize::MAX);
        let n_ctx = self.session.n_ctx();
        let mut n_gen = 0;
        let mut last = Instant::now();
        let mut input = prompt.clone();
        let mut stopped_at_string = false;
        let finish = loop {
            if n_gen >= max {
                break Finish::Length;
            }
            let logits = self.session.eval_last(&input).map_err(|e| e.to_string())?;
            let id = sampler.sample(logits, &history);
            let lp = params.logprobs.map(|n| {
                let (logprob, top) = log_probs(logits, id, n);
                TokenLogprob { id, logprob, top }
            });
            if tok.is_eog(id) {
                break Finish::Stop;
            }
            let now = Instant::now();
            if n_gen == 0 {
                m.first_token(now - arrived);
            } else {
                m.next_token(now - last);
            }
            last = now;
            n_gen += 1;
            m.generated_tokens.fetch_add(1, SeqCst);
            history.push(id);
            pending_lp.extend(lp);
            let (text, hit) = stop.push(&decoder.push(&tok, id));
            if !text.is_empty() || hit {
                let logprobs = std::mem::take(&mut pending_lp);
                if events.send(Event::Text { text, logprobs }).is_err() {
                    return Ok(None); // the client is gone
                }
            }
            if hit {
                stopped_at_string = true;
                break Finish::Stop;
            }
            if events.is_closed() {
                return Ok(None);
            }
            // The next step would not fit: the answer is cut here, as `tern run` does.
            if self.session.pos() >= n_ctx {
                break Finish::Length;
            }
            input = vec![id];
        };
        // After a stop string, what the decoder still holds comes after it: dropped.
        if !stopped_at_string {
            let rest = stop.push(&decoder.finish()).0 + &stop.finish();
            if !rest.is_empty() || !pending_lp.is_empty() {
                let _ = events.send(Event::Text { text: rest, logprobs: pending_lp });
            }
        }
        Ok(Some(Event::Done { finish, prompt_tokens: prompt.len(), completion_tokens: n_gen }))
    }
}
