//! Quantize → dequantize round trips on seeded Gaussian data, per type, with a
//! stated bound on the relative RMSE (RMS of the error / RMS of the data).

mod common;

use common::{rel_rmse, round_trip};
use tern_quant::{dequantize_row, quantize_i2s_tensor, row_bytes, GgmlType, TensorScale};
use tern_testutil::Rng;

/// Bounds, set with ~1.3x margin over the measured worst case of the sizes
/// below. For the ternary formats Gaussian data is far from their design
/// point; their bounds only guard against gross errors (the exactness tests in
/// `ternary.rs` are what matters there).
///
/// | type | bound | measured | expected from the format |
/// |---|---:|---:|---|
/// | F32 | 0 | 0 | exact |
/// | F16 | 3e-4 | 2.16e-4 | 11-bit significand: ≈ 2^-11/√3 |
/// | BF16 | 2.5e-3 | 1.76e-3 | 8-bit significand: ≈ 2^-8/√3 |
/// | Q8_0 | 7.5e-3 | 5.78e-3 | step amax/127 per 32 (amax ≈ 2.1σ), error step/√12 |
/// | Q6_K | 0.022 | 0.0176 | 64 levels per 16, int8 sub-scales |
/// | Q5_K | 0.045 | 0.0362 | 32 levels + min per 32, 6-bit sub-scales |
/// | Q4_K | 0.095 | 0.0732 | 16 levels + min per 32, 6-bit sub-scales |
/// | IQ4_NL | 0.095 | 0.0739 | 16 non-linear levels per 32, fitted scale |
/// | Q4_0 | 0.11 | 0.0867 | 16 levels per 32, extreme pinned to −8 |
/// | Q5_0 | 0.062 | 0.0477 | 32 levels per 32, extreme pinned to −16 |
/// | Q4_1 | 0.105 | 0.0817 | 16 levels + min per 32, spanning min..max |
/// | Q5_1 | 0.049 | 0.0377 | 32 levels + min per 32, spanning min..max |
/// | IQ4_XS | 0.1 | 0.0773 | IQ4_NL's 16 levels per 32, 6-bit sub-scales (ggml's fit) |
/// | Q3_K | 0.19 | 0.149 | 8 levels per 16, 6-bit signed sub-scales (ggml's fit) |
/// | Q2_K | 0.4 | 0.306 | 4 levels + min per 16, 4-bit sub-scales and mins (ggml's fit) |
/// | Q2_0 | 0.94 | 0.726 | 3 levels (of its 4) per 64, block max scale |
/// | Q1_0 | 0.78 | 0.602 | signs per 128, mean-magnitude scale: √(1 − 2/π) on Gaussian data |
/// | TQ2_0 / TQ1_0 | 0.95 | 0.78 / 0.80 | 3 levels, block max scale |
/// | IQ2_BN / IQ1_BN | 0.95 | 0.88 / 0.91 | 3 levels, row max scale |
/// | I2_S | 0.98 | 0.952 | 3 levels, tensor max scale |
const BOUNDS: [(GgmlType, f64); 21] = [
    (GgmlType::F32, 0.0),
    (GgmlType::F16, 3e-4),
    (GgmlType::BF16, 2.5e-3),
    (GgmlType::Q8_0, 7.5e-3),
    (GgmlType::Q6_K, 0.022),
    (GgmlType::Q5_K, 0.045),
    (GgmlType::Q4_K, 0.095),
    (GgmlType::IQ4_NL, 0.095),
    (GgmlType::Q4_0, 0.11),
    (GgmlType::Q5_0, 0.062),
    (GgmlType::Q4_1, 0.105),
    (GgmlType::Q5_1, 0.049),
    (GgmlType::IQ4_XS, 0.1),
    (GgmlType::Q3_K, 0.19),
    (GgmlType::Q2_K, 0.4),
    (GgmlType::Q2_0, 0.94),
    (GgmlType::Q1_0, 0.78),
    (GgmlType::TQ2_0, 0.95),
    (GgmlType::TQ1_0, 0.95),
    (GgmlType::IQ2_BN, 0.95),
    (GgmlType::IQ1_BN, 0.95),
];

/// Row lengths per block size: whole multiples only (others are invalid rows).
fn sizes(ty: GgmlType) -> Vec<usize> {
    let be = ty.block_elems();
    let mut s = vec![256, 2048, 4096];
    if be < 256 {
        s.push(3 * be.max(32)); // not a multiple of 256
    }
    s
}

#[test]
fn every_row_type_round_trips_within_its_bound() {
    for (ty, bound) in BOUNDS {
        let mut rng = Rng::new(0x5eed_0001 ^ ty.id() as u64);
        let mut worst = 0.0f64;
        for n in sizes(ty) {
            // Mix scales so blocks see different magnitudes.
            let x: Vec<f32> = (0..n).map(|i| rng.normal() * if i % 512 < 256 { 1.0 } else { 0.03 }).collect();
            let (_, y) = round_trip(ty, &x);
            worst = worst.max(rel_rmse(&x, &y));
        }
        println!("{ty}: worst relative RMSE {worst:.3e} (bound {bound:.1e})");
        assert!(worst <= bound, "{ty}: relative RMSE {worst} exceeds {bound}");
    }
}

#[test]
fn i2s_tensor_round_trips_within_its_bound() {
    let mut rng = Rng::new(0x5eed_0002);
    let (ne0, rows) = (256, 8);
    let x = rng.normals(ne0 * rows, 1.0);
    let mut q = vec![0u8; x.len() / 4 + 32];
    quantize_i2s_tensor(&x, &mut q);
    let scale = TensorScale(tern_quant::i2s_tensor_scale(&q, x.len()));
    assert_eq!(scale.0, x.iter().fold(0.0f32, |m, v| m.max(v.abs())));
    assert!(q[x.len() / 4 + 4..].iter().all(|&b| b == 0), "tail padding must be zero");
    let mut y = vec![0.0f32; x.len()];
    let rb = row_bytes(GgmlType::I2_S, ne0);
    for (r, o) in y.chunks_exact_mut(ne0).enumerate() {
        dequantize_row(GgmlType::I2_S, &q[r * rb..(r + 1) * rb], scale, o);
    }
    let err = rel_rmse(&x, &y);
    println!("I2_S: relative RMSE {err:.3e}");
    assert!(err <= 0.98, "I2_S relative RMSE {err}");
}

#[test]
fn zero_rows_decode_to_zero() {
    for (ty, _) in BOUNDS {
        let x = vec![0.0f32; 512];
        let (_, y) = round_trip(ty, &x);
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn constant_and_one_hot_rows_are_sane() {
    // Degenerate shapes that break naive min/max scale fitting. Q1_0's ±d
    // cannot hold a one-hot row (nor a zero), whatever its scale.
    for (ty, _) in BOUNDS.iter().filter(|(t, _)| !t.is_ternary() && *t != GgmlType::Q1_0) {
        for x in [vec![-0.75f32; 256], vec![0.75f32; 256], (0..256).map(|i| if i == 77 { 5.0 } else { 0.0 }).collect()]
        {
            let (_, y) = round_trip(*ty, &x);
            let err = rel_rmse(&x, &y);
            assert!(err < 0.05, "{ty}: relative RMSE {err} on a degenerate row");
        }
    }
}
