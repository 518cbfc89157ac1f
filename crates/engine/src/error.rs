//! Engine errors: everything a session can report, each naming what failed.

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] tern_gguf::Error),
    #[error(transparent)]
    Model(#[from] tern_models::Error),
    #[error(transparent)]
    Backend(#[from] tern_backend::Error),
    #[error(transparent)]
    Sched(#[from] tern_sched::Error),
    #[error(transparent)]
    Rules(#[from] tern_sched::RuleError),
    #[error("the context is full: {pos} tokens are cached, {n} more do not fit in a context of {n_ctx} (raise -c)")]
    ContextFull { pos: usize, n: usize, n_ctx: usize },
    #[error("token id {id} is outside the vocabulary (n_vocab = {n_vocab})")]
    BadToken { id: u32, n_vocab: usize },
    #[error("this model has no usable tokenizer: {0}")]
    Tokenizer(String),
    #[error("KV cache type {0}")]
    KvType(String),
    #[error("perplexity: {0}")]
    Perplexity(String),
    #[error("{0}")]
    Device(String),
    /// `hint`: what would fit (`planning::fit_hint`).
    #[error("the plan does not fit: {backend} needs {need} bytes ({:.2} GiB) but has {have} ({:.2} GiB); {hint}", *need as f64 / (1u64 << 30) as f64, *have as f64 / (1u64 << 30) as f64)]
    DoesNotFit { backend: String, need: u64, have: u64, hint: String },
    #[error("nothing to evaluate: the token list is empty")]
    Empty,
    #[error("the KV cache must hold at least one sequence (n_seqs = 0)")]
    NoSeqs,
    #[error("sequence {seq} does not exist: the KV cache holds {n_seqs}")]
    NoSeq { seq: usize, n_seqs: usize },
    #[error("sequence {seq} appears twice in one batch")]
    SeqTwice { seq: usize },
    #[error("a batch of {n} tokens is more than one graph takes (-b {n_batch})")]
    BatchTooLarge { n: usize, n_batch: usize },
    /// Which backend runs an attention one sequence at a time.
    #[error("batches of several sequences cannot run: {0}")]
    MultiSeq(String),
}
