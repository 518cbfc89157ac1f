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
        }
    }

    pub fn is_per_layer(self) -> bool {
        !matches!(self, TensorName::TokenEmbd | TensorName::OutputNorm | TensorName::Output | TensorName::RopeFreqs)
    }

    /// The weight's GGUF name: `token_embd.weight`, `blk.3.attn_q.weight`.
    pub fn key(self, layer: Option<usize>) -> String {
        self.key_with(layer, "weight")
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
