//! DeepSeek-V2 / V2-Lite / V2.5 / V3 / R1 and Kimi-K2 (all `deepseek2` in
//! GGUF): multi-head latent attention, then a few dense FFN blocks and
//! mixture-of-experts blocks with routed and shared experts.
//!
//! ```text
//! attention (MLA), h = norm(x) [n_embd], per head: nope + rope = key width
//!   q      = Wq·h, or Wq_b · norm(Wq_a·h)            [(nope + rope) · n_head]
//!   [c|kr] = Wkv_a·h;  c = norm(c) [rank], kr = rope(kr) [rope]   (one per token)
//!   q_lat  = W_kb,hᵀ... absorbed: q_lat_h = K_b,h · q_nope_h     [rank] per head
//!   o_h    = Σ_t softmax_t(scale · (q_lat_h·c_t + rope(q_pe_h)·kr_t)) · c_t
//!   x     += Wo · concat_h(V_b,h · o_h)
//! ffn: dense for the first `leading_dense_block_count` layers, else
//!   s = softmax(Wr·h) (V2) or sigmoid(Wr·h) (V3); pick k by s + bias, inside
//!   the best groups (V3); w = s[E] (renormalised if asked) · scale
//!   x += Σ_e w_e · expert_e(h) + shared(h)
//! ```
//! The latent cache holds `rank + rope` values a token and layer. Files come
//! with `attn_k_b`/`attn_v_b` per head (split) or with one `attn_kv_b` whose
//! rows per head are `[k_nope | v]` (legacy); both absorb the same way.

use tern_graph::RopeMode;

use super::{ArchSpec, DefaultActivation, MoeSpec};

pub const SPEC: ArchSpec = ArchSpec {
    names: &["deepseek2"],
    rope: RopeMode::Norm,
    activation: DefaultActivation::Silu,
    sub_norms: false,
    qk_norm: false,
    proj_scales: false,
    moe: Some(MoeSpec { norm: false }),
    mla: true,
};
