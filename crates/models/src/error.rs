//! Errors of model loading: every message names the key or tensor.

use tern_gguf::GgmlType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] tern_gguf::Error),
    #[error("unknown architecture {name:?} (tern runs: {known})")]
    UnknownArch { name: String, known: String },
    #[error("metadata key {key:?}: {reason}")]
    BadConfig { key: String, reason: String },
    #[error("missing tensor {name:?}")]
    MissingTensor { name: String },
    #[error("tensor {name:?} has shape {found:?}, expected {expected:?}")]
    BadShape { name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("tensor {name:?} is {ty}, expected {expected}")]
    BadType { name: String, ty: GgmlType, expected: &'static str },
}
