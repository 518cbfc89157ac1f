//! Ternary formats: exactness on ternary-valued data, agreement between all
//! five formats, the spec's worked examples and exhaustive base-3 patterns,
//! and the bit positions of the 2-bit layouts.

mod common;

use common::decode_tensor_bytes;
use tern_quant::{dequantize_row, quantize_row, quantize_tensor, row_bytes, GgmlType, TensorScale};
use tern_testutil::Rng;

const TERNARY: [GgmlType; 5] = [GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::IQ1_BN, GgmlType::IQ2_BN, GgmlType::I2_S];

/// A [ne0, rows] tensor of `t·s`, t ∈ {−1, 0, +1} with ~35% zeros; row 1 is all zero.
fn ternary_tensor(seed: u64, ne0: usize, rows: usize, s: f32) -> Vec<f32> {
    let mut rng = Rng::new(seed);
    let mut x: Vec<f32> = (0..ne0 * rows).map(|_| rng.trit(0.35) * s).collect();
    x[ne0..2 * ne0].fill(0.0);
    x
}

#[test]
fn all_five_formats_decode_ternary_data_exactly() {
    // Scales exactly representable in f16 (IQ1_BN and the TQ formats store f16).
    for (seed, s) in [(1u64, 0.375f32), (2, 1.0), (3, 0.0625)] {
        let (ne0, rows) = (512, 6);
        let x = ternary_tensor(seed, ne0, rows, s);
        let zeros = x.iter().filter(|&&v| v == 0.0).count() as f64 / x.len() as f64;
        assert!((0.3..0.5).contains(&zeros), "zero fraction {zeros}");
        for ty in TERNARY {
            let mut q = vec![0u8; ty.tensor_bytes(&[ne0 as u64, rows as u64]).unwrap() as usize];
            quantize_tensor(ty, &x, ne0, &mut q);
            let (y, _) = decode_tensor_bytes(ty, &q, x.len(), ne0);
            // Bitwise equality of every decoded value with the input, hence
            // with each other format's decoding too.
            let same = x.iter().zip(&y).all(|(a, b)| a.to_bits() == b.to_bits() || (*a == 0.0 && *b == 0.0));
            assert!(same, "{ty} with scale {s} does not decode to its ternary input");
        }
    }
}

#[test]
fn row_quantizer_matches_tensor_quantizer_for_i2s_rows() {
    let (ne0, rows) = (256, 4);
    let x = ternary_tensor(7, ne0, rows, 0.375);
    let mut whole = vec![0u8; x.len() / 4 + 32];
    quantize_tensor(GgmlType::I2_S, &x, ne0, &mut whole);
    let rb = row_bytes(GgmlType::I2_S, ne0);
    for (r, xr) in x.chunks_exact(ne0).enumerate() {
        let mut row = vec![0u8; rb];
        quantize_row(GgmlType::I2_S, xr, &mut row);
        assert_eq!(row, whole[r * rb..(r + 1) * rb], "row {r}");
    }
}

/// Byte of five zero codes (all 1): ⌈121·256/243⌉; of four (qh/extra): see below.
const ZERO5: u8 = 128;

#[test]
fn tq1_0_worked_example_byte_202() {
    // qs[0] holds elements 0, 32, 64, 96, 128 (docs/spec/quants.md §10).
    let mut block = [ZERO5; 54];
    block[0] = 202;
    block[48..52].fill(127); // qh: codes (1,1,1,1) → v = 40·3 = 120 → ⌈120·256/243⌉
    block[52..54].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    let mut y = [0.0f32; 256];
    dequantize_row(GgmlType::TQ1_0, &block, TensorScale::ONE, &mut y);
    let expected: Vec<f32> = (0..256)
        .map(|e| match e {
            0 | 128 => 1.0,
            64 | 96 => -1.0,
            _ => 0.0,
        })
        .collect();
    assert_eq!(y.to_vec(), expected);
}

#[test]
fn iq1_bn_worked_example_byte_176() {
    // Row: f16 scale, then one block; ql[0] holds elements 0..5 (docs/spec/quants.md §12).
    let mut row = [ZERO5; 2 + 13];
    row[..2].copy_from_slice(&half::f16::from_f32(1.0).to_le_bytes());
    row[2] = 176;
    row[14] = 43; // extra: codes (1,1,1,1) → v = 40 → ⌈40·256/243⌉
    let mut y = [0.0f32; 64];
    dequantize_row(GgmlType::IQ1_BN, &row, TensorScale::ONE, &mut y);
    assert_eq!(y[..5], [1.0, 0.0, -1.0, -1.0, 1.0]);
    assert!(y[5..].iter().all(|&v| v == 0.0));
    // And the encoder produces that byte.
    let mut q = [0u8; 15];
    quantize_row(GgmlType::IQ1_BN, &y, &mut q);
    assert_eq!(q, row);
}

/// The trits (−1, 0, +1) of pattern `v` (0..243), digit k = (v / 3^k) % 3.
fn trits(v: usize) -> [f32; 5] {
    std::array::from_fn(|k| ((v / 3usize.pow(k as u32)) % 3) as f32 - 1.0)
}

#[test]
fn tq1_0_every_pattern_in_every_region_round_trips() {
    for v in 0..243 {
        let t = trits(v);
        let mut x = [1.0f32; 256]; // keeps the block scale at 1
        for k in 0..5 {
            x[7 + 32 * k] = t[k]; // qs[7]
            x[160 + 11 + 16 * k] = t[k]; // qs[32 + 11]
        }
        for k in 0..4 {
            x[240 + 2 + 4 * k] = t[k]; // qh[2]
        }
        let mut q = [0u8; 54];
        quantize_row(GgmlType::TQ1_0, &x, &mut q);
        // Digit order: the first element is the most significant trit.
        let msb_first = t.iter().fold(0u32, |a, &c| a * 3 + (c + 1.0) as u32);
        assert_eq!(q[7] as u32, (msb_first * 256).div_ceil(243), "pattern {v}");
        let mut y = [0.0f32; 256];
        dequantize_row(GgmlType::TQ1_0, &q, TensorScale::ONE, &mut y);
        assert_eq!(y, x, "pattern {v}");
    }
}

#[test]
fn iq1_bn_every_pattern_in_every_position_round_trips() {
    for v in 0..243 {
        let t = trits(v);
        let mut x = [1.0f32; 64];
        x[32..37].copy_from_slice(&t); // ql[6]
        x[37..42].copy_from_slice(&t); // ql[7]
        for g in 0..4 {
            x[16 * g + 15] = t[g]; // extra, digit g
        }
        let mut q = [0u8; 15];
        quantize_row(GgmlType::IQ1_BN, &x, &mut q);
        // Digit order: the first element is the least significant trit.
        let lsb_first = t.iter().rev().fold(0u32, |a, &c| a * 3 + (c + 1.0) as u32);
        assert_eq!(q[2 + 6] as u32, (lsb_first * 256).div_ceil(243), "pattern {v}");
        let mut y = [0.0f32; 64];
        dequantize_row(GgmlType::IQ1_BN, &q, TensorScale::ONE, &mut y);
        assert_eq!(y, x, "pattern {v}");
    }
}

/// Quantizes a one-hot row (+1 at `e`, 0 elsewhere) and returns the bytes
/// (data only) that differ from the all-zero encoding, as (index, xor).
fn one_hot_diff(ty: GgmlType, n: usize, e: usize) -> Vec<(usize, u8)> {
    let zero_codes = |x: &[f32]| {
        let mut q = vec![0u8; row_bytes(ty, n)];
        quantize_row(ty, x, &mut q);
        q
    };
    let mut x = vec![0.0f32; n];
    // A −1 far away keeps the scale at 1 without touching element e's byte.
    x[(e + n / 2) % n] = -1.0;
    let base = zero_codes(&x);
    x[e] = 1.0;
    let hot = zero_codes(&x);
    let prefix = ty.layout().row_prefix;
    base.iter()
        .zip(&hot)
        .enumerate()
        .skip(prefix)
        .filter(|(_, (a, b))| a != b)
        .map(|(i, (a, b))| (i - prefix, a ^ b))
        .collect()
}

#[test]
fn two_bit_layouts_put_elements_where_the_spec_says() {
    // Code 1 → 2 flips the pair's bits from 01 to 10: xor 0b11 at the shift.
    // TQ2_0: element 37 → byte 5, shift 2; element 200 → byte 40, shift 4.
    assert_eq!(one_hot_diff(GgmlType::TQ2_0, 256, 37), [(5, 0b11 << 2)]);
    assert_eq!(one_hot_diff(GgmlType::TQ2_0, 256, 200), [(40, 0b11 << 4)]);
    // IQ2_BN: element e → byte e % 16, shift 2·(e/16).
    assert_eq!(one_hot_diff(GgmlType::IQ2_BN, 64, 37), [(5, 0b11 << 4)]);
    // I2_S: element 70 → byte 6, bits 3–2 (most significant pair first).
    assert_eq!(one_hot_diff(GgmlType::I2_S, 128, 70), [(6, 0b11 << 2)]);
    assert_eq!(one_hot_diff(GgmlType::I2_S, 128, 5), [(5, 0b11 << 6)]);
}
