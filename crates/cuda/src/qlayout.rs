//! The GPU layout of block-quantized weights whose values are an int8 level
//! times one scale per 16 elements: Q8_0, Q4_0 and Q6_K (heads and
//! embeddings). Rows become `k` int8 levels plus `k / 16` f32 scales, which
//! reproduce the file's values exactly (each scale is the product of the
//! block's f16 scale and, for Q6_K, its int8 sub-scale) and which the head
//! GEMV reads with 16-byte loads. Q6_K grows from 6.56 to 9 bits per weight
//! in exchange.

use half::f16;
use tern_quant::{cast_blocks, BlockQ4_0, BlockQ6K, BlockQ8_0, GgmlType};

/// Elements per scale.
pub const GROUP: usize = 16;

pub struct GpuQ8 {
    /// `rows * k` levels.
    pub values: Vec<i8>,
    /// `rows * k / 16` scales.
    pub scales: Vec<f32>,
}

/// Whether `ty` converts to this layout.
pub fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q6_K)
}

fn f16_at(b: [u8; 2]) -> f32 {
    f16::from_le_bytes(b).to_f32()
}

/// Converts a `[k, rows]` tensor of `ty` (see [`supported`]).
pub fn pack(ty: GgmlType, bytes: &[u8], k: usize, rows: usize) -> GpuQ8 {
    let mut values = vec![0i8; k * rows];
    let mut scales = vec![0f32; k * rows / GROUP];
    match ty {
        GgmlType::Q8_0 => {
            for (i, b) in cast_blocks::<BlockQ8_0>(bytes).iter().enumerate() {
                values[32 * i..32 * i + 32].copy_from_slice(&b.qs);
                scales[2 * i..2 * i + 2].fill(f16_at(b.d));
            }
        }
        GgmlType::Q4_0 => {
            for (i, b) in cast_blocks::<BlockQ4_0>(bytes).iter().enumerate() {
                for (j, &q) in b.qs.iter().enumerate() {
                    values[32 * i + j] = (q & 15) as i8 - 8;
                    values[32 * i + j + 16] = (q >> 4) as i8 - 8;
                }
                scales[2 * i..2 * i + 2].fill(f16_at(b.d));
            }
        }
        GgmlType::Q6_K => {
            for (i, b) in cast_blocks::<BlockQ6K>(bytes).iter().enumerate() {
                let d = f16_at(b.d);
                for e in 0..256 {
                    let (h, g, l) = (e / 128, (e % 128) / 32, e % 32);
                    let lo = (b.ql[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 15;
                    let hi = (b.qh[32 * h + l] >> (2 * g)) & 3;
                    values[256 * i + e] = (lo | (hi << 4)) as i8 - 32;
                }
                for (s, &sc) in scales[16 * i..16 * i + 16].iter_mut().zip(&b.scales) {
                    *s = d * sc as f32;
                }
            }
        }
        _ => panic!("{ty} has no int8 GPU layout"),
    }
    GpuQ8 { values, scales }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_times_scales_are_the_files_values() {
        let (k, rows) = (512, 3);
        let x: Vec<f32> = (0..k * rows).map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0).collect();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q6_K] {
            let mut bytes = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
            tern_quant::quantize_tensor(ty, &x, k, &mut bytes);
            let p = pack(ty, &bytes, k, rows);
            let row_bytes = bytes.len() / rows;
            for r in 0..rows {
                let mut want = vec![0f32; k];
                tern_quant::dequantize_row(
                    ty,
                    &bytes[r * row_bytes..][..row_bytes],
                    tern_quant::TensorScale::ONE,
                    &mut want,
                );
                for (e, &w) in want.iter().enumerate() {
                    let got = p.values[r * k + e] as f32 * p.scales[(r * k + e) / GROUP];
                    assert_eq!(got, w, "{ty} row {r} element {e}");
                }
            }
        }
    }
}
