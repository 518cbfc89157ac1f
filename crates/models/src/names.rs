//! GGUF tensor names as a type. Every architecture spells its tensors
//! through this enum, so a name is written once.

/// A tensor role. Per-layer roles take the layer index in [`TensorName::key`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorName {
    TokenEmbd,
    OutputNorm,
    Output,
    RopeFreqs,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    AttnQNorm,
    AttnKNorm,
    AttnSubNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    FfnSubNorm,
    AttnQA,
    AttnQANorm,
    AttnQB,
    AttnKvAMqa,
    AttnKvANorm,
    AttnKB,
    AttnVB,
    AttnKvB,
    FfnGateInp,
    ExpProbsB,
    FfnGateExps,
    FfnUpExps,
    FfnDownExps,
    FfnGateShexp,
    FfnUpShexp,
    FfnDownShexp,
}

impl TensorName {
    fn stem(self) -> &'static str {
        match self {
            TensorName::TokenEmbd => "token_embd",
            TensorName::OutputNorm => "output_norm",
            TensorName::Output => "output",
            TensorName::RopeFreqs => "rope_freqs",
            TensorName::AttnNorm => "attn_norm",
            TensorName::AttnQ => "attn_q",
            TensorName::AttnK => "attn_k",
            TensorName::AttnV => "attn_v",
            TensorName::AttnOutput => "attn_output",
            TensorName::AttnQNorm => "attn_q_norm",
            TensorName::AttnKNorm => "attn_k_norm",
            TensorName::AttnSubNorm => "attn_sub_norm",
            TensorName::FfnNorm => "ffn_norm",
            TensorName::FfnGate => "ffn_gate",
            TensorName::FfnUp => "ffn_up",
            TensorName::FfnDown => "ffn_down",
            TensorName::FfnSubNorm => "ffn_sub_norm",
            TensorName::AttnQA => "attn_q_a",
            TensorName::AttnQANorm => "attn_q_a_norm",
            TensorName::AttnQB => "attn_q_b",
            TensorName::AttnKvAMqa => "attn_kv_a_mqa",
            TensorName::AttnKvANorm => "attn_kv_a_norm",
            TensorName::AttnKB => "attn_k_b",
            TensorName::AttnVB => "attn_v_b",
            TensorName::AttnKvB => "attn_kv_b",
            TensorName::FfnGateInp => "ffn_gate_inp",
            TensorName::ExpProbsB => "exp_probs_b",
            TensorName::FfnGateExps => "ffn_gate_exps",
            TensorName::FfnUpExps => "ffn_up_exps",
            TensorName::FfnDownExps => "ffn_down_exps",
            TensorName::FfnGateShexp => "ffn_gate_shexp",
            TensorName::FfnUpShexp => "ffn_up_shexp",
            TensorName::FfnDownShexp => "ffn_down_shexp",
        }
    }

    pub fn is_per_layer(self) -> bool {
        !matches!(self, TensorName::TokenEmbd | TensorName::OutputNorm | TensorName::Output | TensorName::RopeFreqs)
    }

    /// The weight's GGUF name: `token_embd.weight`, `blk.3.attn_q.weight`.
    pub fn key(self, layer: Option<usize>) -> String {
        self.key_with(layer, "weight")
    }

    /// A bias vector: `blk.3.exp_probs_b.bias`.
    pub fn bias_key(self, layer: usize) -> String {
        self.key_with(Some(layer), "bias")
    }

    /// The 1bitLLM per-weight scale: `blk.3.attn_q.scale`.
    pub fn scale_key(self, layer: usize) -> String {
        self.key_with(Some(layer), "scale")
    }

    fn key_with(self, layer: Option<usize>, suffix: &str) -> String {
        match (self.is_per_layer(), layer) {
            (true, Some(l)) => format!("blk.{l}.{}.{suffix}", self.stem()),
            (false, None) => format!("{}.{suffix}", self.stem()),
            _ => panic!("{:?}: wrong layer argument {layer:?}", self),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(TensorName::AttnQ.key(Some(12)), "blk.12.attn_q.weight");
        assert_eq!(TensorName::FfnDown.scale_key(0), "blk.0.ffn_down.scale");
        assert_eq!(TensorName::TokenEmbd.key(None), "token_embd.weight");
    }
}
