//! Byte compatibility with peer-written files (testdata/compact/models, see its
//! README): our quantizers must reproduce the ternary, Q8_0, Q4_0 and Q5_0 tensors
//! of the quantized fixtures exactly from their F16 siblings, and our
//! decoders must bring the peers' Q4_K/Q6_K/IQ4_NL tensors close to the F16
//! originals.

mod common;

use common::{decode_tensor, open, rel_rmse};
use tern_quant::{quantize_tensor, GgmlType};

/// Re-quantizes every tensor of `quantized` whose type is `ty` from the same
/// tensor of `source` and checks the bytes; returns how many were checked.
fn requantize_matches(source: &str, quantized: &str, ty: GgmlType) -> usize {
    let (src, dst) = (open(source), open(quantized));
    let mut checked = 0;
    for info in dst.tensors.iter().filter(|t| t.ty == ty) {
        let src_info = src.tensor(&info.name).unwrap_or_else(|| panic!("{source} lacks {}", info.name));
        assert_eq!(src_info.ne, info.ne, "{}", info.name);
        let (x, ne0) = decode_tensor(&src, src_info);
        let mut out = vec![0u8; info.nbytes as usize];
        quantize_tensor(ty, &x, ne0, &mut out);
        let expected = dst.tensor_data(info);
        if let Some(i) = out.iter().zip(expected).position(|(a, b)| a != b) {
            panic!("{quantized} {} ({ty}): first differing byte {i}: ours {} peer {}", info.name, out[i], expected[i]);
        }
        checked += 1;
    }
    checked
}

#[test]
fn ik_iq2_bn_tensors_are_reproduced() {
    assert_eq!(requantize_matches("b158-e512-f16.gguf", "b158-e512-iq2_bn.gguf", GgmlType::IQ2_BN), 14);
}

#[test]
fn ik_iq1_bn_tensors_are_reproduced() {
    assert_eq!(requantize_matches("b158-e512-f16.gguf", "b158-e512-iq1_bn.gguf", GgmlType::IQ1_BN), 14);
}

#[test]
fn tq2_0_tensors_are_reproduced() {
    assert_eq!(requantize_matches("b158-e512-f16.gguf", "b158-e512-tq2_0.gguf", GgmlType::TQ2_0), 14);
    assert_eq!(requantize_matches("bitnet-e256-f16.gguf", "bitnet-e256-tq2_0.gguf", GgmlType::TQ2_0), 14);
}

#[test]
fn mainline_tq1_0_tensors_are_reproduced() {
    assert_eq!(requantize_matches("bitnet-e256-f16.gguf", "bitnet-e256-tq1_0.gguf", GgmlType::TQ1_0), 14);
}

#[test]
fn peer_ternary_tensors_decode_exactly_to_the_f16_values() {
    for (source, quantized) in [
        ("b158-e512-f16.gguf", "b158-e512-iq2_bn.gguf"),
        ("b158-e512-f16.gguf", "b158-e512-iq1_bn.gguf"),
        ("b158-e512-f16.gguf", "b158-e512-tq2_0.gguf"),
        ("bitnet-e256-f16.gguf", "bitnet-e256-tq2_0.gguf"),
        ("bitnet-e256-f16.gguf", "bitnet-e256-tq1_0.gguf"),
    ] {
        let (src, dst) = (open(source), open(quantized));
        let mut checked = 0;
        for info in dst.tensors.iter().filter(|t| t.ty.is_ternary()) {
            let (x, _) = decode_tensor(&src, src.tensor(&info.name).expect("same tensors"));
            let (y, _) = decode_tensor(&dst, info);
            assert!(x == y, "{quantized} {}: decoded values differ from {source}", info.name);
            checked += 1;
        }
        assert_eq!(checked, 14, "{quantized}");
    }
}

#[test]
fn q4_0_token_embeddings_requantize_to_themselves() {
    for name in [
        "b158-e512-f16.gguf",
        "b158-e512-iq2_bn.gguf",
        "b158-e512-iq1_bn.gguf",
        "bitnet-e256-f16.gguf",
        "bitnet-e256-tq1_0.gguf",
    ] {
        assert_eq!(requantize_matches(name, name, GgmlType::Q4_0), 1, "{name}");
    }
}

/// llama-quantize falls back from Q4_K to Q5_0 for rows that are not whole
/// 256-element blocks: all 23 matrices of the qwen3moe fixture (rows of
/// 128, 192 and 32), the expert tensors included.
#[test]
fn mainline_q5_0_fallbacks_are_reproduced() {
    assert_eq!(requantize_matches("q3moe-e128-f16.gguf", "q3moe-e128-q4_k.gguf", GgmlType::Q5_0), 23);
}

#[test]
fn mainline_q8_0_and_q4_0_are_reproduced() {
    assert_eq!(requantize_matches("llama-e256-f16.gguf", "llama-e256-q8_0.gguf", GgmlType::Q8_0), 15);
    assert_eq!(requantize_matches("llama-e256-f16.gguf", "llama-e256-q4_0.gguf", GgmlType::Q4_0), 15);
    assert_eq!(requantize_matches("ds2-e128-f16.gguf", "ds2-e128-q8_0.gguf", GgmlType::Q8_0), 32);
}

/// Worst relative RMSE over the 15 matrices of llama-e256 of (peer-quantized
/// file decoded by us, our own quantizer) against the F16 originals.
fn errors(quantized: &str, ty: GgmlType) -> (f64, f64) {
    let (src, dst) = (open("llama-e256-f16.gguf"), open(quantized));
    let (mut peer, mut ours) = (0.0f64, 0.0f64);
    let mut n = 0;
    for info in dst.tensors.iter().filter(|t| t.ty == ty) {
        let (x, ne0) = decode_tensor(&src, src.tensor(&info.name).expect("same tensors"));
        let (y, _) = decode_tensor(&dst, info);
        peer = peer.max(rel_rmse(&x, &y));
        let mut q = vec![0u8; info.nbytes as usize];
        quantize_tensor(ty, &x, ne0, &mut q);
        let (z, _) = common::decode_tensor_bytes(ty, &q, x.len(), ne0);
        ours = ours.max(rel_rmse(&x, &z));
        n += 1;
    }
    assert_eq!(n, 15, "{quantized}");
    (peer, ours)
}

/// Validates our decoders on real peer-written data (the quantizers differ, so
/// bytes are not compared). Bounds on the worst tensor's relative RMSE, with
/// margin over the measured values (peer decode / our quantizer):
///
/// | type | peer measured | peer bound | ours measured | ours bound |
/// |---|---:|---:|---:|---:|
/// | Q4_K | 0.0715 | 0.085 | 0.0714 | 0.085 |
/// | Q6_K | 0.0179 | 0.022 | 0.0174 | 0.022 |
/// | IQ4_NL | 0.0763 | 0.090 | 0.0737 | 0.090 |
#[test]
fn peer_k_quants_and_iq4_nl_decode_close_to_f16() {
    for (file, ty, bound) in [
        ("llama-e256-q4_k.gguf", GgmlType::Q4_K, 0.085),
        ("llama-e256-q6_k.gguf", GgmlType::Q6_K, 0.022),
        ("llama-e256-iq4_nl.gguf", GgmlType::IQ4_NL, 0.090),
    ] {
        let (peer, ours) = errors(file, ty);
        println!("{ty}: worst relative RMSE peer {peer:.5} ours {ours:.5}");
        assert!(peer < bound, "{file}: peer data decodes with relative RMSE {peer}");
        assert!(ours < bound, "{ty}: our quantizer's relative RMSE {ours}");
    }
}
