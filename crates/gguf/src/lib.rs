//! GGUF v2/v3: read (over mmap, validating every count, length and offset),
//! and write. This crate knows bytes and type ids, never math or devices.

mod error;
mod reader;
mod types;
mod value;
mod writer;

pub use error::{Error, Result};
pub use reader::{File, TensorInfo, DEFAULT_ALIGNMENT, MAGIC};
pub use types::{GgmlType, Layout};
pub use value::{Array, Metadata, Value, ValueType};
pub use writer::{Writer, WriterTensor};

/// Maximum tensor rank in GGUF.
pub const MAX_DIMS: usize = 4;
