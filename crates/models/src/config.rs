//! Hyper-parameters read from GGUF metadata, with the defaults and the
//! architecture rules of `spec/gguf.md` §4 and `spec/bitnet.md` §1.

use tern_gguf::{Array, Metadata};
use tern_graph::{Activation, RopeMode};

use crate::error::{Error, Result};

/// The graph family a file runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3 and the llama family: pre-norm, SwiGLU, rope NORM.
    Llama,
    /// BitNet b1.58 (2B-4T and 1bitLLM): llama plus sub-norms, rope NEOX.
    BitNet,
}

impl Arch {
    /// Every `general.architecture` value tern runs.
    pub const NAMES: [&'static str; 4] = ["llama", "bitnet", "bitnet-b1.58", "bitnet-25"];

    pub fn from_name(name: &str) -> Result<Arch> {
        match name {
            "llama" => Ok(Arch::Llama),
            "bitnet" | "bitnet-b1.58" | "bitnet-25" => Ok(Arch::BitNet),
            other => Err(Error::UnknownArch { name: other.to_string(), known: Arch::NAMES.join(", ") }),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: Arch,
    /// `general.architecture` as written (the metadata key prefix).
    pub arch_name: String,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub rope_mode: RopeMode,
    pub n_rot: usize,
    pub rope_freq_base: f32,
    /// 1 / linear scaling factor.
    pub rope_freq_scale: f32,
    pub activation: Activation,
    /// BitNet's RMSNorms before `attn_output` and `ffn_down`.
    pub sub_norms: bool,
}

impl Config {
    /// Reads the hyper-parameters. `n_vocab` and `gqa_kv_rows` come from the
    /// tensors (the token embedding's rows, `attn_k`'s output rows), which
    /// are more reliable than optional keys.
    pub fn from_metadata(md: &Metadata, n_vocab: usize) -> Result<Config> {
        let arch_name = md.str("general.architecture")?.to_string();
        let arch = Arch::from_name(&arch_name)?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let n_embd = md.usize(&key("embedding_length"))?;
        let n_layer = md.usize(&key("block_count"))?;
        let n_head = per_layer_constant(md, &key("attention.head_count"))?;
        let n_head_kv = match md.get(&key("attention.head_count_kv")) {
            Some(_) => per_layer_constant(md, &key("attention.head_count_kv"))?,
            None => n_head,
        };
        let n_ff = per_layer_constant(md, &key("feed_forward_length"))?;
        let bad = |k: &str, reason: String| Error::BadConfig { key: k.to_string(), reason };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!("{n_head} heads cannot share {n_head_kv} KV heads"),
            ));
        }
        let head_dim = md.opt_usize(&key("attention.key_length"))?.unwrap_or(n_embd / n_head);
        if let Some(v) = md.opt_usize(&key("attention.value_length"))? {
            if v != head_dim {
                return Err(bad(&key("attention.value_length"), format!("{v} differs from the key length {head_dim}")));
            }
        }
        let n_rot = md.opt_usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(&key("rope.dimension_count"), format!("{n_rot} rotary dims for head size {head_dim}")));
        }
        let rope_freq_scale = match md.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => 1.0,
            Some("linear") => 1.0 / md.opt_f32(&key("rope.scaling.factor"))?.filter(|f| *f > 0.0).unwrap_or(1.0),
            Some(other) => {
                return Err(bad(
                    &key("rope.scaling.type"),
                    format!("rope scaling {other:?} is not supported yet (none, linear)"),
                ))
            }
        };
        if let Some(v) = md.opt_usize(&key("vocab_size"))? {
            if v != n_vocab {
                return Err(bad(&key("vocab_size"), format!("{v}, but token_embd has {n_vocab} rows")));
            }
        }
        let (rope_mode, sub_norms) = match arch {
            Arch::Llama => (RopeMode::Norm, false),
            Arch::BitNet => (RopeMode::Neox, true),
        };
        let activation = match md.opt_str(&key("hidden_activation"))? {
            Some("relu2") => Activation::Relu2,
            Some("silu") => Activation::Silu,
            Some(other) => return Err(bad(&key("hidden_activation"), format!("{other:?} (expected relu2 or silu)"))),
            // spec/bitnet.md §1: the arch string does not decide; 2B-4T is the
            // one with GQA (or the llama-3 vocabulary) and runs relu².
            None if arch == Arch::BitNet && (n_head_kv < n_head || n_vocab == 128256) => Activation::Relu2,
            None => Activation::Silu,
        };
        Ok(Config {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_ctx_train: md.opt_usize(&key("context_length"))?.unwrap_or(4096),
            rms_eps: md.f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_mode,
            n_rot,
            rope_freq_base: md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_freq_scale,
            activation,
            sub_norms,
            arch_name,
        })
    }
}

/// A key that may be a scalar or a per-layer array; tern needs it constant.
fn per_layer_constant(md: &Metadata, key: &str) -> Result<usize> {
    match md.get(key).and_then(|v| v.as_array()) {
        Some(arr) => {
            let vals = match arr {
                Array::String(_) | Array::F32(_) | Array::F64(_) | Array::Bool(_) => None,
                a => a.as_i64s(),
            }
            .filter(|v| !v.is_empty())
            .ok_or_else(|| Error::BadConfig { key: key.to_string(), reason: "expected integers".into() })?;
            if vals.iter().any(|&v| v != vals[0] || v < 0) {
                return Err(Error::BadConfig {
                    key: key.to_string(),
                    reason: "per-layer values differ; not supported".into(),
                });
            }
            Ok(vals[0] as usize)
        }
        None => Ok(md.usize(key)?),
    }
}
