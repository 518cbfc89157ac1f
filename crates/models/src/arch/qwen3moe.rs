//! Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention (QK-norm per
//! head, rope over rotated halves) with every FFN a mixture of experts. The
//! router takes a softmax over all experts, keeps the best k and renormalises
//! their weights; there is no shared expert.
//!
//! ```text
//! per layer: x += Wo · attn(rope(headnorm(Wq·h)), rope(headnorm(Wk·h)), Wv·h),  h = norm(x)
//!            p = softmax(Wr·h) [n_expert];  E = top-k(p);  w = p[E] / Σ p[E]
//!            x += Σ_{e∈E} w_e · Wdown_e · (silu(Wgate_e·h) ⊙ Wup_e·h),  h = norm(x)
//! ```

use tern_graph::RopeMode;

use super::{ArchSpec, DefaultActivation, MoeSpec};

pub const SPEC: ArchSpec = ArchSpec {
    names: &["qwen3moe"],
    rope: RopeMode::Neox,
    activation: DefaultActivation::Silu,
    sub_norms: false,
    qk_norm: true,
    proj_scales: false,
    moe: Some(MoeSpec { norm: true }),
    mla: false,
};
