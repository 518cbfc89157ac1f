//! Typed load errors. Each names the metadata key that was wrong, so a bad
//! GGUF file can be diagnosed without a debugger.

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key was missing or had the wrong type (the GGUF error names it), or
    /// the file could not be read.
    #[error(transparent)]
    Gguf(#[from] tern_gguf::Error),

    /// A tokenizer family tern does not implement yet.
    #[error("tokenizer.ggml.model = {model:?} is not supported: {reason}")]
    Unsupported { model: String, reason: &'static str },

    #[error("tokenizer.ggml.pre = {pre:?} is not a known pre-tokenizer (supported: {supported})")]
    UnknownPreTokenizer { pre: String, supported: &'static str },

    #[error("metadata key {key:?} is empty")]
    Empty { key: &'static str },

    #[error("metadata key {key:?} has {found} entries, but tokenizer.ggml.tokens has {expected}")]
    LengthMismatch { key: &'static str, found: usize, expected: usize },

    #[error("metadata key {key:?} holds {len} tokens; token ids must fit in u32")]
    TooLarge { key: &'static str, len: usize },

    #[error("metadata key {key:?}: entry {index} is {value}, not a token type (0..=6)")]
    BadTokenType { key: &'static str, index: usize, value: i64 },

    #[error("metadata key {key:?}: token id {id} is out of range (the vocabulary has {n_vocab} tokens)")]
    IdOutOfRange { key: &'static str, id: u64, n_vocab: usize },

    #[error("metadata key {key:?}: entry {index} ({text:?}) is not of the form \"left right\"")]
    BadMerge { key: &'static str, index: usize, text: String },

    #[error("metadata key {key:?}: entry {index} ({text:?}) uses {part:?}, which is not in the vocabulary")]
    MergeUnknownToken { key: &'static str, index: usize, text: String, part: String },
}
