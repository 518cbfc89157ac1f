//! Shared test helpers: error metrics, fixture access (the seeded generator
//! is `tern_testutil::Rng`).
#![allow(dead_code)] // each test binary uses a different subset

use tern_quant::{dequantize_row, row_bytes, GgmlType, TensorScale};

/// RMS of `x − y` divided by the RMS of `x`.
pub fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let err: f64 = x.iter().zip(y).map(|(&a, &b)| (a as f64 - b as f64).powi(2)).sum();
    let rms: f64 = x.iter().map(|&a| (a as f64).powi(2)).sum();
    (err / rms).sqrt()
}

/// f64 dot product.
pub fn dot64(x: &[f32], y: &[f32]) -> f64 {
    x.iter().zip(y).map(|(&a, &b)| a as f64 * b as f64).sum()
}

/// Quantizes `x` as one row of `ty` and decodes it back.
pub fn round_trip(ty: GgmlType, x: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![0u8; row_bytes(ty, x.len())];
    tern_quant::quantize_row(ty, x, &mut q);
    let mut y = vec![0.0f32; x.len()];
    dequantize_row(ty, &q, TensorScale::ONE, &mut y);
    (q, y)
}

pub use tern_testutil::compact_model as fixture;

pub fn open(name: &str) -> tern_gguf::File {
    let path = fixture(name);
    tern_gguf::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A tensor decoded to f32 (flattened), with its row length.
pub fn decode_tensor(file: &tern_gguf::File, info: &tern_gguf::TensorInfo) -> (Vec<f32>, usize) {
    let ne0 = info.ne[0] as usize;
    decode_tensor_bytes(info.ty, file.tensor_data(info), info.n_elements() as usize, ne0)
}

/// Tensor bytes of `n` elements in rows of `ne0`, decoded to f32 (flattened).
pub fn decode_tensor_bytes(ty: GgmlType, data: &[u8], n: usize, ne0: usize) -> (Vec<f32>, usize) {
    let scale = TensorScale::of(ty, data, n);
    let rb = row_bytes(ty, ne0);
    let mut out = vec![0.0f32; n];
    for (r, o) in out.chunks_exact_mut(ne0).enumerate() {
        dequantize_row(ty, &data[r * rb..(r + 1) * rb], scale, o);
    }
    (out, ne0)
}
