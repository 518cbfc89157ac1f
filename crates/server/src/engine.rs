//! The engine thread: the only owner of the `Session`. Handlers send it
//! `Job`s over a channel and read `Event`s back; nothing else touches the
//! model.
//!
//! Slots and the queue: a request takes one of `n_slots` slots when it is
//! admitted; past them it waits in the queue (at most `max_queue`); beyond
//! that it is refused (503). The thread runs `batch::Engine`, which decodes
//! every slot's sequence together (continuous batching).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Instant;

use tern_engine::Session;
use tern_sampling::SamplerConfig;
use tern_tokenizer::Tokenizer;
use tokio::sync::mpsc;

use crate::batch::Engine;
use crate::metrics::{Gauges, Metrics};

/// What a request asks of generation.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub sampler: SamplerConfig,
    /// None: until an end-of-generation token or the slot's context is full.
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    /// Some(n): report each token's log-probability and the n most likely.
    pub logprobs: Option<usize>,
    /// Reuse the longest prefix a free slot's cache holds (llama-server's
    /// `cache_prompt`, on unless the request turns it off).
    pub cache_prompt: bool,
    /// Never sample an end-of-generation token (llama-server's `ignore_eos`).
    pub ignore_eos: bool,
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
    Text { text: String, logprobs: Vec<TokenLogprob> },
    Done {
        finish: Finish,
        prompt_tokens: usize,
        completion_tokens: usize,
        /// Prompt tokens a slot's cache held already (not evaluated again).
        cached_tokens: usize,
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
    pub(crate) shutting_down: AtomicBool,
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

    pub(crate) fn release(&self) {
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
/// so the session never crosses threads). A step decodes a token of every
/// slot, so the session's `n_batch` must be at least `n_slots`.
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
            let loaded = load().and_then(|s| s.tokenizer().map(|t| (s, t)).map_err(|e| e.to_string()));
            let fits = |s: &Session| match s.n_batch() < n_slots {
                true => {
                    Err(format!("-b {} is less than -np {n_slots}: a step decodes a token of every slot", s.n_batch()))
                }
                false => Ok(()),
            };
            let (session, tok) = match loaded.and_then(|(s, t)| fits(&s).map(|()| (s, t))) {
                Ok((session, tok)) => {
                    let _ = ready_tx.send(Ok(Loaded {
                        tokenizer: tok.clone(),
                        n_ctx: session.n_ctx(),
                        session_info: info(&session),
                    }));
                    (session, tok)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            Engine::new(session, s, tok).run(jobs_rx);
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
