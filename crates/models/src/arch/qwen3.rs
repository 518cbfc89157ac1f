//! Qwen3 (Qwen team 2025), dense: a llama block whose queries and keys are
//! RMS-normalised per head before rope (QK-norm), rope over rotated halves,
//! and a head size that need not be n_embd / n_head. PrismML's
//! Ternary-Bonsai models are this architecture with ternary projections.
//!
//! ```text
//! per layer: q = rope(headnorm(Wq·h)), k = rope(headnorm(Wk·h)), v = Wv·h,  h = norm(x)
//!            x += Wo · attn(q, k, v)              // q: [head_dim · n_head, n_tokens]
//!            x += Wdown · (silu(Wgate·h) ⊙ Wup·h),  h = norm(x)
//! ```

use tern_graph::RopeMode;

use super::{ArchSpec, DefaultActivation};

pub const SPEC: ArchSpec = ArchSpec {
    names: &["qwen3"],
    rope: RopeMode::Neox,
    activation: DefaultActivation::Silu,
    sub_norms: false,
    qk_norm: true,
    proj_scales: false,
    moe: None,
    mla: false,
};
