//! Hyper-parameters read from GGUF metadata: the llama family's keys, under
//! the prefix of the file's `general.architecture`, with llama.cpp's
//! defaults; what differs between architectures comes from their [`ArchSpec`].

use tern_gguf::{Array, Metadata};
use tern_graph::{Activation, ExpertGroups, Gating, RopeMode, RouteParams, Yarn};

use crate::arch::{ArchSpec, MoeSpec};
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
    /// YaRN rope scaling (`rope.scaling.type` yarn).
    pub yarn: Option<YarnConfig>,
    /// Routed experts, for the architectures that have them.
    pub moe: Option<MoeConfig>,
    /// Multi-head latent attention (DeepSeek-V2/V3).
    pub mla: Option<MlaConfig>,
}

/// YaRN as a file declares it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnConfig {
    /// The rope parameters' part (the ramp and the rope magnitude).
    pub rope: Yarn,
    /// `rope.scaling.yarn_log_multiplier` (DeepSeek): the attention scale is
    /// multiplied by `(1 + log_mul · ln(factor))²`.
    pub log_mul: f32,
}

/// The experts of an MoE model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// An expert's FFN width.
    pub n_ff_exp: usize,
    /// Shared experts (one dense FFN of `n_shared · n_ff_exp`), 0 for none.
    pub n_shared: usize,
    /// Layers `0..n_dense_lead` have a dense FFN of `n_ff` instead.
    pub n_dense_lead: usize,
    /// The router (its `biased` is per layer: whether the layer has `exp_probs_b`).
    pub route: RouteParams,
}

/// Multi-head latent attention's dimensions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaConfig {
    /// The query's low-rank width, `None` when `attn_q` projects directly.
    pub q_lora: Option<usize>,
    /// The compressed KV width (`kv_lora_rank`).
    pub rank: usize,
    /// A head's key width without rope, and its roped width.
    pub nope: usize,
    pub rope: usize,
    /// A head's value width.
    pub v_dim: usize,
}

impl Config {
    /// Elements per token and layer of the K and V caches: a GQA layer keeps
    /// `head_dim · n_head_kv` of each; an MLA layer one row of latent and rope
    /// values and no V.
    pub fn kv_widths(&self) -> (usize, usize) {
        match &self.mla {
            Some(m) => (m.rank + m.rope, 0),
            None => (self.head_dim * self.n_head_kv, self.head_dim * self.n_head_kv),
        }
    }

    /// Whether layer `layer`'s FFN is routed experts.
    pub fn is_moe_layer(&self, layer: usize) -> bool {
        self.moe.is_some_and(|m| layer >= m.n_dense_lead)
    }
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
        let n_ff = match (arch.moe, md.get(&key("feed_forward_length"))) {
            (Some(_), None) => 0,
            _ => per_layer_constant(md, &key("feed_forward_length"))?,
        };
        let bad = |k: &str, reason: String| Error::BadConfig { key: k.to_string(), reason };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(
                &key("attention.head_count_kv"),
                format!("{n_head} heads cannot share {n_head_kv} KV heads"),
            ));
        }
        // MLA files give the head's key and value widths under `_mla` keys
        // when the plain ones describe the latent cache (split layout).
        let key_length = match arch.mla {
            true => md.opt_usize(&key("attention.key_length_mla"))?.or(md.opt_usize(&key("attention.key_length"))?),
            false => md.opt_usize(&key("attention.key_length"))?,
        };
        let head_dim = key_length.unwrap_or(n_embd / n_head);
        let value_key = if arch.mla && md.get(&key("attention.value_length_mla")).is_some() {
            key("attention.value_length_mla")
        } else {
            key("attention.value_length")
        };
        let v_dim = md.opt_usize(&value_key)?.unwrap_or(head_dim);
        if v_dim != head_dim && !arch.mla {
            return Err(bad(&value_key, format!("{v_dim} differs from the key length {head_dim}")));
        }
        let n_rot = md.opt_usize(&key("rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(bad(&key("rope.dimension_count"), format!("{n_rot} rotary dims for head size {head_dim}")));
        }
        let n_ctx_train = md.opt_usize(&key("context_length"))?.unwrap_or(4096);
        let factor = md.opt_f32(&key("rope.scaling.factor"))?.filter(|f| *f > 0.0).unwrap_or(1.0);
        let (rope_freq_scale, yarn) = match md.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => (1.0, None),
            Some("linear") => (1.0 / factor, None),
            Some("yarn") => (1.0 / factor, Some(yarn_config(md, &key, factor, n_ctx_train)?)),
            Some(other) => {
                return Err(bad(
                    &key("rope.scaling.type"),
                    format!("rope scaling {other:?} is not supported (none, linear, yarn)"),
                ))
            }
        };
        let moe = match arch.moe {
            Some(spec) => Some(moe_config(md, &key, spec, n_layer)?),
            None => None,
        };
        let mla = match arch.mla {
            true => Some(mla_config(md, &key, head_dim, n_rot, v_dim)?),
            false => None,
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
            n_ctx_train,
            rms_eps: md.f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_mode: arch.rope,
            n_rot,
            rope_freq_base: md.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_freq_scale,
            activation,
            arch_name,
            yarn,
            moe,
            mla,
        })
    }
}

fn yarn_config(md: &Metadata, key: &dyn Fn(&str) -> String, factor: f32, n_ctx_train: usize) -> Result<YarnConfig> {
    let n_ctx_orig = md.opt_usize(&key("rope.scaling.original_context_length"))?.unwrap_or(n_ctx_train);
    Ok(YarnConfig {
        rope: Yarn {
            n_ctx_orig,
            beta_fast: md.opt_f32(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
            beta_slow: md.opt_f32(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
            ext_factor: 1.0,
            // YaRN's magnitude correction for the interpolated positions.
            magnitude: 1.0 + 0.1 * factor.ln(),
        },
        log_mul: md.opt_f32(&key("rope.scaling.yarn_log_multiplier"))?.unwrap_or(0.0),
    })
}

fn moe_config(md: &Metadata, key: &dyn Fn(&str) -> String, spec: MoeSpec, n_layer: usize) -> Result<MoeConfig> {
    let bad = |k: &str, reason: String| Error::BadConfig { key: key(k), reason };
    let n_expert = md.usize(&key("expert_count"))?;
    let k = md.usize(&key("expert_used_count"))?;
    if n_expert == 0 || k == 0 || k > n_expert {
        return Err(bad("expert_used_count", format!("{k} experts used of {n_expert}")));
    }
    let n_ff_exp = md.usize(&key("expert_feed_forward_length"))?;
    if n_ff_exp == 0 {
        return Err(bad("expert_feed_forward_length", "0".into()));
    }
    let gating = match md.opt_usize(&key("expert_gating_func"))? {
        None | Some(1) => Gating::Softmax,
        Some(2) => Gating::Sigmoid,
        Some(g) => return Err(bad("expert_gating_func", format!("{g} (1 softmax, 2 sigmoid)"))),
    };
    let groups = match (md.opt_usize(&key("expert_group_count"))?, md.opt_usize(&key("expert_group_used_count"))?) {
        (None | Some(0 | 1), _) => None,
        (Some(count), used) => {
            let used = used.unwrap_or(count);
            if n_expert % count != 0 || n_expert / count < 2 {
                return Err(bad(
                    "expert_group_count",
                    format!("{count} groups do not divide {n_expert} experts in pairs"),
                ));
            }
            if used == 0 || used > count || used * (n_expert / count) < k {
                return Err(bad(
                    "expert_group_used_count",
                    format!("{used} of {count} groups cannot hold {k} experts"),
                ));
            }
            (used < count).then_some(ExpertGroups { count, used })
        }
    };
    let norm = match md.get(&key("expert_weights_norm")) {
        Some(_) => md.bool(&key("expert_weights_norm"))?,
        None => spec.norm,
    };
    let scale = md.opt_f32(&key("expert_weights_scale"))?.unwrap_or(1.0);
    if !(scale.is_finite() && scale > 0.0) {
        return Err(bad("expert_weights_scale", format!("{scale}")));
    }
    let n_dense_lead = md.opt_usize(&key("leading_dense_block_count"))?.unwrap_or(0);
    if n_dense_lead > n_layer {
        return Err(bad("leading_dense_block_count", format!("{n_dense_lead} of {n_layer} layers")));
    }
    Ok(MoeConfig {
        n_expert,
        n_expert_used: k,
        n_ff_exp,
        n_shared: md.opt_usize(&key("expert_shared_count"))?.unwrap_or(0),
        n_dense_lead,
        route: RouteParams { n_expert, k, gating, biased: false, groups, norm, scale },
    })
}

fn mla_config(
    md: &Metadata,
    key: &dyn Fn(&str) -> String,
    head_dim: usize,
    n_rot: usize,
    v_dim: usize,
) -> Result<MlaConfig> {
    let bad = |k: &str, reason: String| Error::BadConfig { key: key(k), reason };
    let rank = md.usize(&key("attention.kv_lora_rank"))?;
    if rank == 0 {
        return Err(bad("attention.kv_lora_rank", "0".into()));
    }
    if n_rot >= head_dim {
        return Err(bad("rope.dimension_count", format!("{n_rot} leaves no unroped part of a {head_dim}-wide key")));
    }
    let q_lora = md.opt_usize(&key("attention.q_lora_rank"))?.filter(|&r| r > 0);
    Ok(MlaConfig { q_lora, rank, nope: head_dim - n_rot, rope: n_rot, v_dim })
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
