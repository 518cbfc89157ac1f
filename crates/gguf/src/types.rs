//! Tensor element types as they appear in GGUF files (`ggml_type` ids), with the
//! byte-size arithmetic needed to locate tensors. No math lives here: the
//! numerics of each type are in `tern-quant`.

use std::fmt;

/// A tensor storage type. The id collisions between llama.cpp, ik_llama.cpp and
/// Microsoft's fork are resolved at parse time (see `docs/spec/gguf.md` §3), so every
/// variant here has exactly one meaning.
#[allow(non_camel_case_types)] // the names users type and read in other tools
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32,
    F16,
    /// Mainline's 1-bit signs (±d), f16 scale per 128.
    Q1_0,
    /// Mainline's 2-bit codes for −1, 0, +1, +2, f16 scale per 64.
    Q2_0,
    Q4_0,
    /// 4-bit codes 0..15 with an f16 scale and an f16 min per 32.
    Q4_1,
    /// 5-bit levels −16..15 (a fifth bit per element beside the nibbles), f16 scale per 32.
    Q5_0,
    /// 5-bit codes 0..31 with an f16 scale and an f16 min per 32.
    Q5_1,
    Q8_0,
    /// 2-bit codes with a 4-bit scale and a 4-bit min per 16 (f16 super-scales), 256 per block.
    Q2_K,
    /// 3-bit levels −4..3 with a 6-bit signed scale per 16 (f16 super-scale), 256 per block.
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    /// IQ4_NL's table with a 6-bit signed scale per 32 (f16 super-scale), 256 per block.
    IQ4_XS,
    BF16,
    TQ1_0,
    TQ2_0,
    /// Microsoft BitNet 2-bit, one f32 scale per tensor in a 32-byte tail.
    I2_S,
    /// ik_llama.cpp 1.625 bpw ternary, f16 scale per row.
    IQ1_BN,
    /// ik_llama.cpp 2 bpw ternary, f32 scale per row.
    IQ2_BN,
}

/// How a type's bytes are laid out, for size arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Elements per block along `ne[0]`.
    pub block_elems: usize,
    /// Bytes per block.
    pub block_bytes: usize,
    /// Extra bytes at the start of each row (ik's row scales).
    pub row_prefix: usize,
    /// Extra bytes at the end of the whole tensor (I2_S scale tail).
    pub tensor_suffix: usize,
}

impl GgmlType {
    pub const ALL: [GgmlType; 22] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::I2_S,
        GgmlType::IQ1_BN,
        GgmlType::IQ2_BN,
    ];

    /// The id written into GGUF files. I2_S uses Microsoft's 36, the BN types ik's ids.
    pub const fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q2_K => 10,
            GgmlType::Q3_K => 11,
            GgmlType::Q4_K => 12,
            GgmlType::Q5_K => 13,
            GgmlType::Q6_K => 14,
            GgmlType::IQ4_NL => 20,
            GgmlType::IQ4_XS => 23,
            GgmlType::BF16 => 30,
            GgmlType::TQ1_0 => 34,
            GgmlType::TQ2_0 => 35,
            GgmlType::I2_S => 36,
            GgmlType::IQ1_BN => 134,
            GgmlType::IQ2_BN => 135,
            GgmlType::Q1_0 => 41,
            GgmlType::Q2_0 => 42,
        }
    }

    /// The type for an id, without the size-based disambiguation that the
    /// reader applies (see `reader::resolve_type`).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.id() == id)
    }

    pub const fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q5_1 => "Q5_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q2_K => "Q2_K",
            GgmlType::Q3_K => "Q3_K",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q5_K => "Q5_K",
            GgmlType::Q6_K => "Q6_K",
            GgmlType::IQ4_NL => "IQ4_NL",
            GgmlType::IQ4_XS => "IQ4_XS",
            GgmlType::BF16 => "BF16",
            GgmlType::TQ1_0 => "TQ1_0",
            GgmlType::TQ2_0 => "TQ2_0",
            GgmlType::I2_S => "I2_S",
            GgmlType::IQ1_BN => "IQ1_BN",
            GgmlType::IQ2_BN => "IQ2_BN",
            GgmlType::Q1_0 => "Q1_0",
            GgmlType::Q2_0 => "Q2_0",
        }
    }

    /// Parses a type name case-insensitively (`q4_k`, `TQ2_0`, ...).
    pub fn from_name(s: &str) -> Option<GgmlType> {
        GgmlType::ALL.into_iter().find(|t| t.name().eq_ignore_ascii_case(s))
    }

    pub const fn layout(self) -> Layout {
        let (block_elems, block_bytes, row_prefix, tensor_suffix) = match self {
            GgmlType::F32 => (1, 4, 0, 0),
            GgmlType::F16 | GgmlType::BF16 => (1, 2, 0, 0),
            GgmlType::Q4_0 | GgmlType::IQ4_NL => (32, 18, 0, 0),
            GgmlType::Q4_1 => (32, 20, 0, 0),
            GgmlType::Q5_0 => (32, 22, 0, 0),
            GgmlType::Q5_1 => (32, 24, 0, 0),
            GgmlType::Q8_0 => (32, 34, 0, 0),
            GgmlType::Q2_K => (256, 84, 0, 0),
            GgmlType::Q3_K => (256, 110, 0, 0),
            GgmlType::Q4_K => (256, 144, 0, 0),
            GgmlType::Q5_K => (256, 176, 0, 0),
            GgmlType::Q6_K => (256, 210, 0, 0),
            GgmlType::IQ4_XS => (256, 136, 0, 0),
            GgmlType::TQ1_0 => (256, 54, 0, 0),
            GgmlType::TQ2_0 => (256, 66, 0, 0),
            // I2_S packs 128 elements in 32 bytes over the flattened tensor.
            GgmlType::I2_S => (128, 32, 0, 32),
            GgmlType::IQ1_BN => (64, 13, 2, 0),
            GgmlType::IQ2_BN => (64, 16, 4, 0),
            GgmlType::Q2_0 => (64, 18, 0, 0),
            GgmlType::Q1_0 => (128, 18, 0, 0),
        };
        Layout { block_elems, block_bytes, row_prefix, tensor_suffix }
    }

    /// llama.cpp's `general.file_type` (`llama_ftype`) of a model whose
    /// matrices are mostly this type, for the types that have one.
    pub const fn file_type(self) -> Option<u32> {
        Some(match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q8_0 => 7,
            GgmlType::Q5_0 => 8,
            GgmlType::Q5_1 => 9,
            GgmlType::Q2_K => 10,
            // Q3_K_M, as Q4_K and Q5_K give their _M mixes.
            GgmlType::Q3_K => 12,
            GgmlType::Q4_K => 15,
            GgmlType::Q5_K => 17,
            GgmlType::Q6_K => 18,
            GgmlType::IQ4_NL => 25,
            GgmlType::IQ4_XS => 30,
            GgmlType::BF16 => 32,
            GgmlType::TQ1_0 => 36,
            GgmlType::TQ2_0 => 37,
            GgmlType::Q1_0 => 40,
            GgmlType::Q2_0 => 41,
            GgmlType::I2_S | GgmlType::IQ1_BN | GgmlType::IQ2_BN => return None,
        })
    }

    pub const fn block_elems(self) -> usize {
        self.layout().block_elems
    }

    /// True for the types whose values are ternary × scale.
    pub const fn is_ternary(self) -> bool {
        matches!(self, GgmlType::TQ1_0 | GgmlType::TQ2_0 | GgmlType::I2_S | GgmlType::IQ1_BN | GgmlType::IQ2_BN)
    }

    /// True for the plain float types (no blocks, no scales).
    pub const fn is_float(self) -> bool {
        matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Bytes of one row of `ne0` elements, or `None` if `ne0` is not a whole
    /// number of blocks. I2_S has no per-row size of its own (its tail is per
    /// tensor), so its rows are `ne0 / 4` bytes.
    pub fn row_bytes(self, ne0: u64) -> Option<u64> {
        let l = self.layout();
        let be = l.block_elems as u64;
        if !ne0.is_multiple_of(be) {
            return None;
        }
        (ne0 / be).checked_mul(l.block_bytes as u64)?.checked_add(l.row_prefix as u64)
    }

    /// Bytes of a whole tensor with dims `ne`, or `None` on overflow or when
    /// the row length is not a multiple of the block.
    pub fn tensor_bytes(self, ne: &[u64]) -> Option<u64> {
        let rows = ne.iter().skip(1).try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        let row = self.row_bytes(*ne.first()?)?;
        row.checked_mul(rows)?.checked_add(self.layout().tensor_suffix as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_spec_table() {
        // docs/spec/bitnet.md §6: attn_q of 2B-4T, 2560 x 2560.
        let ne = [2560u64, 2560];
        assert_eq!(GgmlType::I2_S.tensor_bytes(&ne), Some(1_638_432));
        assert_eq!(GgmlType::IQ2_BN.tensor_bytes(&ne), Some(1_648_640));
        assert_eq!(GgmlType::TQ2_0.tensor_bytes(&ne), Some(1_689_600));
        assert_eq!(GgmlType::IQ2_BN.tensor_bytes(&[6912, 2560]), Some(4_433_920));
        assert_eq!(GgmlType::Q2_0.tensor_bytes(&ne), Some(1_843_200));
        assert_eq!(GgmlType::Q2_0.tensor_bytes(&[96]), None);
        assert_eq!(GgmlType::Q1_0.tensor_bytes(&ne), Some(921_600));
        assert_eq!(GgmlType::Q1_0.tensor_bytes(&[64]), None);
        assert_eq!(GgmlType::Q4_0.tensor_bytes(&[33]), None);
        // A 2048 x 768 expert matrix: 64 blocks a row.
        assert_eq!(GgmlType::Q4_1.tensor_bytes(&[2048, 768]), Some(64 * 20 * 768));
        assert_eq!(GgmlType::Q5_0.tensor_bytes(&[2048, 768]), Some(64 * 22 * 768));
        assert_eq!(GgmlType::Q5_1.tensor_bytes(&[2048, 768]), Some(64 * 24 * 768));
        assert_eq!(GgmlType::Q5_0.tensor_bytes(&[48]), None);
        // Qwen3-30B-A3B's experts: 2048 x 768, 8 super-blocks a row.
        assert_eq!(GgmlType::Q2_K.tensor_bytes(&[2048, 768]), Some(8 * 84 * 768));
        assert_eq!(GgmlType::Q3_K.tensor_bytes(&[2048, 768]), Some(8 * 110 * 768));
        assert_eq!(GgmlType::IQ4_XS.tensor_bytes(&[2048, 768]), Some(8 * 136 * 768));
        assert_eq!(GgmlType::IQ4_XS.tensor_bytes(&[128]), None);
        assert_eq!(GgmlType::F32.tensor_bytes(&[u64::MAX, 2]), None);
    }

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(&t.name().to_lowercase()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(6), Some(GgmlType::Q5_0));
        assert_eq!(GgmlType::from_name("q5_1"), Some(GgmlType::Q5_1));
        assert_eq!(GgmlType::from_id(10), Some(GgmlType::Q2_K));
        assert_eq!(GgmlType::from_id(11), Some(GgmlType::Q3_K));
        assert_eq!(GgmlType::from_id(23), Some(GgmlType::IQ4_XS));
        assert_eq!(GgmlType::from_name("iq4_xs"), Some(GgmlType::IQ4_XS));
    }
}
