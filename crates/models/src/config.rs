//! Hyper-parameters read from GGUF metadata: the llama family's keys, under
//! the prefix of the file's `general.architecture`, with llama.cpp's
//! defaults; what differs between architectures comes from their [`ArchSpec`].

use tern_gguf::{Array, Metadata};
use tern_graph::{Activation, RopeMode};

use crate::arch::ArchSpec;
use crate::error::{Error, Result};

#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub arch: &'static ArchSpec,
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
}

impl Config {
    /// Reads the hyper-parameters. `n_vocab` and `gqa_kv_rows` come from the
    /// tensors (the token embedding's rows, `attn_k`'s output rows), which
    /// are more reliable than optional keys.
    pub fn from_metadata(md: &Metadata, n_vocab: usize) -> Result<Config> {
        let arch_name = md.str("general.architecture")?.to_string();
        let arch = ArchSpec::find(&arch_name)
            .ok_or_else(|| Error::UnknownArch { name: arch_name.clone(), known: ArchSpec::all_names().join(", ") })?;
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
        let activation = match md.opt_str(&key("hidden_activation"))? {
            Some("relu2") => Activation::Relu2,
            Some("silu") => Activation::Silu,
            Some(other) => return Err(bad(&key("hidden_activation"), format!("{other:?} (expected relu2 or silu)"))),
            None => arch.activation.resolve(n_head, n_head_kv, n_vocab),
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
            rope_mode: arch.rope,
            n_rot,
            rope_freq_base: md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_freq_scale,
            activation,
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
