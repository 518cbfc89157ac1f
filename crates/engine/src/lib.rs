//! The engine: a session that loads a model onto its backends, owns the KV
//! cache, evaluates tokens, and generates text.

mod error;
mod generate;
mod kv;
pub mod npy;
pub mod perplexity;
pub mod planning;
mod session;

pub use error::{Error, Result};
pub use generate::{generate, GenStats};
pub use kv::parse_kv_type;
pub use session::{LoadOptions, Logits, Profile, SeqInput, Session};
pub use tern_cpu::{weight_read_bytes as cpu_weight_read_bytes, CpuOptions, Isa};
pub use tern_cuda::{kernel_cache_dir, CudaOptions};
