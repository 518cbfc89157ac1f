//! Model architectures. Each reads its hyper-parameters and weights from a
//! GGUF file and builds a compute graph for a batch of tokens. Models build
//! graphs; they never call kernels or move data.

mod arch;
mod blocks;
mod config;
mod error;
mod mla;
mod moe;
mod names;
mod weights;

pub use arch::{ArchSpec, DefaultActivation, ARCHS};
pub use blocks::{Built, StepInputs};
pub use config::{Config, MlaConfig, MoeConfig, YarnConfig};
pub use error::{Error, Result};
pub use names::TensorName;
pub use weights::{
    Attention, DenseFfn, Ffn, Gqa, HeadProj, Layer, Mla, MlaQuery, MoeFfn, WeightRef, WeightTable, Weights,
};

use tern_gguf::{File, GgmlType};

/// One micro-batch: `n_tokens` new tokens whose first sits at cache position
/// `kv_pos`, of which `n_outputs` rows of logits are wanted (the rows the
/// `OutputRows` input names; `n_outputs == n_tokens` means every row, in
/// order, and the graph then has no such input).
///
/// With `multi_seq` the tokens belong to several sequences, each in its own
/// region of the cache: positions and regions are then step inputs
/// (`Positions`, `SeqStarts`) and `kv_pos` is 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub n_tokens: usize,
    pub kv_pos: usize,
    pub n_outputs: usize,
    pub multi_seq: bool,
}

/// The KV cache the graph attends over.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    /// Type of the K rows: F32, F16 or Q8_0.
    pub k_type: GgmlType,
    /// Type of the V rows: F32, F16 or Q8_0.
    pub v_type: GgmlType,
    /// Cache rows: the context size, times the sequences when the cache holds
    /// a region per sequence.
    pub n_ctx: usize,
}

/// A loaded model description: config and weight references (no data).
#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    pub weights: Weights,
}

impl Model {
    pub fn load(file: &File) -> Result<Model> {
        let embd = file
            .tensor(&TensorName::TokenEmbd.key(None))
            .ok_or(Error::MissingTensor { name: TensorName::TokenEmbd.key(None) })?;
        let n_vocab = embd.ne[1] as usize;
        let config = Config::from_metadata(&file.metadata, n_vocab)?;
        let weights = Weights::load(file, &config)?;
        Ok(Model { config, weights })
    }

    pub fn build_graph(&self, batch: &Batch, kv: &KvSpec) -> Built {
        blocks::Ctx::new(&self.config, &self.weights, batch, kv).decoder()
    }
}
