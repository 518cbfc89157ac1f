//! Llama (Touvron et al. 2023; Llama 3 2024): pre-norm decoder blocks with
//! rotary attention over adjacent pairs (grouped-query when n_head_kv <
//! n_head) and a SwiGLU FFN:
//!
//! ```text
//! x = embed(tokens)                                   // [n_embd, n_tokens]
//! per layer: x += Wo · attn(rope(Wq·h), rope(Wk·h), Wv·h),  h = norm(x)
//!            x += Wdown · (silu(Wgate·h) ⊙ Wup·h),          h = norm(x)
//! logits = Wout · norm(x)                             // [n_vocab, n_tokens]
//! ```

use tern_graph::RopeMode;

use super::{ArchSpec, DefaultActivation};

pub const SPEC: ArchSpec = ArchSpec {
    names: &["llama"],
    rope: RopeMode::Norm,
    activation: DefaultActivation::Silu,
    sub_norms: false,
    qk_norm: false,
    proj_scales: false,
    moe: None,
    mla: false,
};
