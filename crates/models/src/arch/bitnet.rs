//! BitNet b1.58 (Ma et al. 2024, "The Era of 1-bit LLMs"; 2B-4T technical
//! report 2025). A llama block whose projections are ternary BitLinear
//! layers, with an extra RMSNorm ("sub-norm") on the input of `attn_output`
//! and of `ffn_down`, and rope over rotated halves:
//!
//! ```text
//! per layer: x += Wo · subnorm(attn(rope(Wq·h), rope(Wk·h), Wv·h)),  h = norm(x)
//!            x += Wdown · subnorm(act(Wgate·h) ⊙ Wup·h),             h = norm(x)
//! ```
//!
//! 2B-4T uses GQA and relu²; the 1bitLLM models use MHA, SiLU and a scale
//! tensor per projection.

use tern_graph::RopeMode;

use super::{ArchSpec, DefaultActivation};

pub const SPEC: ArchSpec = ArchSpec {
    names: &["bitnet-b1.58", "bitnet", "bitnet-25"],
    rope: RopeMode::Neox,
    activation: DefaultActivation::BitNet,
    sub_norms: true,
    qk_norm: false,
    proj_scales: true,
    moe: None,
    mla: false,
};
