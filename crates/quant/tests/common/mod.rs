//! Shared test helpers: a seeded PRNG (no rand crate), error metrics, fixture access.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use tern_quant::{dequantize_row, row_bytes, GgmlType, TensorScale};

/// SplitMix64: tiny, deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Approximately standard normal (Irwin–Hall sum of 12 uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..12).map(|_| self.uniform()).sum::<f32>() - 6.0
    }

    pub fn normals(&mut self, n: usize, std: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * std).collect()
    }

    /// −1, 0 or +1 with P(0) = `p_zero`.
    pub fn trit(&mut self, p_zero: f32) -> f32 {
        let u = self.uniform();
        if u < p_zero {
            0.0
        } else if u < p_zero + (1.0 - p_zero) / 2.0 {
            -1.0
        } else {
            1.0
        }
    }
}

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

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/compact/models").join(name)
}

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
