//! The registry of architectures. An architecture is data ([`ArchSpec`]):
//! the names its GGUF files carry, its rope pairing, its activation and the
//! optional parts of its blocks. The shared loader (`weights.rs`) and block
//! builder (`blocks.rs`) read that data; adding a llama-family variant is one
//! file with its `SPEC` and one line in [`ARCHS`].

use tern_graph::{Activation, RopeMode};

mod bitnet;
mod deepseek2;
mod llama;
mod qwen3;
mod qwen3moe;

/// Every architecture tern runs, one line each.
pub const ARCHS: &[&ArchSpec] = &[&llama::SPEC, &bitnet::SPEC, &qwen3::SPEC, &qwen3moe::SPEC, &deepseek2::SPEC];

/// What the shape of a model's attention and FFN blocks is, and how the
/// loader finds its weights.
#[derive(Debug)]
pub struct ArchSpec {
    /// `general.architecture` values, the canonical one first. The metadata
    /// keys of a file are prefixed with the value it carries.
    pub names: &'static [&'static str],
    /// How rope pairs the dimensions of a head.
    pub rope: RopeMode,
    /// The FFN's activation when `{arch}.hidden_activation` is absent.
    pub activation: DefaultActivation,
    /// Extra RMS norms on the input of `attn_output` and `ffn_down`
    /// (`attn_sub_norm`, `ffn_sub_norm`: BitNet).
    pub sub_norms: bool,
    /// RMS norms over each head of q and k before rope (`attn_q_norm`,
    /// `attn_k_norm`, `[head_dim]`: Qwen3).
    pub qk_norm: bool,
    /// Per-projection output multipliers (`blk.N.attn_q.scale`, one f32, 1.0
    /// when absent: 1bitLLM's BitNet files).
    pub proj_scales: bool,
    /// Routed experts (`ffn_*_exps`, `ffn_gate_inp`), and how they route.
    pub moe: Option<MoeSpec>,
    /// Multi-head latent attention (`attn_kv_a_mqa` and a latent KV cache).
    pub mla: bool,
}

/// What an MoE architecture assumes when its file does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeSpec {
    /// Renormalise the chosen experts' weights (`expert_weights_norm`).
    pub norm: bool,
}

/// How an architecture's activation is decided when the file does not say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultActivation {
    Silu,
    /// BitNet's names do not tell 2B-4T (relu²) from the 1bitLLM models
    /// (SiLU): 2B-4T is the one with GQA or the Llama 3 vocabulary.
    BitNet,
}

impl DefaultActivation {
    pub fn resolve(self, n_head: usize, n_head_kv: usize, n_vocab: usize) -> Activation {
        match self {
            DefaultActivation::Silu => Activation::Silu,
            DefaultActivation::BitNet if n_head_kv < n_head || n_vocab == 128256 => Activation::Relu2,
            DefaultActivation::BitNet => Activation::Silu,
        }
    }
}

impl ArchSpec {
    /// The canonical name (the first of [`ArchSpec::names`]).
    pub fn name(&self) -> &'static str {
        self.names[0]
    }

    /// The architecture a `general.architecture` value names.
    pub fn find(name: &str) -> Option<&'static ArchSpec> {
        ARCHS.iter().copied().find(|a| a.names.contains(&name))
    }

    /// Every name tern accepts, for error messages.
    pub fn all_names() -> Vec<&'static str> {
        ARCHS.iter().flat_map(|a| a.names.iter().copied()).collect()
    }
}

impl PartialEq for ArchSpec {
    fn eq(&self, other: &ArchSpec) -> bool {
        std::ptr::eq(self, other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        let names = ArchSpec::all_names();
        for (i, n) in names.iter().enumerate() {
            assert!(!names[i + 1..].contains(n), "{n} is registered twice");
            assert!(ArchSpec::find(n).unwrap().names.contains(n));
        }
        assert!(ArchSpec::find("gpt2").is_none());
    }
}
