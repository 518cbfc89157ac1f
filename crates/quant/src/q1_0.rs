//! Q1_0 (ggml id 41, mainline llama.cpp): 128 elements in 18 bytes, one f16
//! scale per block and one sign bit per element. Pairs with `ActType::Q8_0`
//! activations, four 32-element activation blocks per weight block, as
//! mainline's `vec_dot_type` does.
//!
//! ```text
//! f16 d
//! u8  qs[16]   // element j: bit j%8 of qs[j/8] (least significant first)
//! ```
//! `x[j] = +d` where the bit is 1, `−d` where it is 0.
//!
//! Quantization (mainline's `quantize_row_q1_0_ref`, reproduced byte for
//! byte): `d = Σ|x| / 128` over the block, summed in element order in f32
//! and stored as f16; the bit is 1 where `x ≥ 0` (so −0.0 too, not NaN).

use tern_gguf::GgmlType;

use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::q8_0::{BlockQ8_0, QK8_0};
use crate::{ActType, Format, TensorScale};

/// Elements per Q1_0 block.
pub const QK1_0: usize = 128;

/// One Q1_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ1_0 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    pub qs: [u8; QK1_0 / 8],
}
impl_block!(BlockQ1_0, 18);

impl BlockQ1_0 {
    /// The sign of element `j`: +1 for a set bit, −1 for a clear one.
    #[inline]
    pub fn sign(&self, j: usize) -> i32 {
        2 * ((self.qs[j / 8] >> (j % 8)) & 1) as i32 - 1
    }
}

fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK1_0).zip(cast_blocks_mut::<BlockQ1_0>(out)) {
        let sum_abs = xb.iter().fold(0.0f32, |s, v| s + v.abs());
        b.d = f32_to_f16(sum_abs / QK1_0 as f32);
        b.qs = [0; QK1_0 / 8];
        for (j, &v) in xb.iter().enumerate() {
            b.qs[j / 8] |= ((v >= 0.0) as u8) << (j % 8);
        }
    }
}

fn dequantize(blocks: &[BlockQ1_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK1_0)) {
        let d = f16_to_f32(b.d);
        for (j, o) in o.iter_mut().enumerate() {
            *o = if b.sign(j) > 0 { d } else { -d };
        }
    }
}

/// Q1_0 · Q8_0: per activation block (four a weight block) the exact i32
/// `s = Σ ±a`, then `d·d_a·s` in f32, summed in f32 in row order, as the
/// Q8_0 and Q2_0 twins do. Mainline's generic kernel groups the same
/// products as `d·Σ_k d_ak·s_k`: equal up to rounding.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let acts = cast_blocks::<BlockQ8_0>(act);
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ1_0>(w).iter().zip(acts.chunks_exact(QK1_0 / QK8_0)) {
        let d = f16_to_f32(wb.d);
        for (k, a) in ab.iter().enumerate() {
            let s: i32 = a.qs.iter().enumerate().map(|(l, &q)| wb.sign(QK8_0 * k + l) * q as i32).sum();
            sum += d * a.scale() * s as f32;
        }
    }
    sum
}

/// Q1_0 (ggml id 41).
pub struct Q1_0;

impl Format for Q1_0 {
    const TYPE: GgmlType = GgmlType::Q1_0;
    type Block = BlockQ1_0;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ1_0], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference quantizer on a hand-made block: the scale is the mean
    /// magnitude, bit j of byte j/8 is element j's sign, zeros count as
    /// positive.
    #[test]
    fn bits_follow_the_reference_quantizer() {
        let mut x = [0.0f32; QK1_0];
        x[..4].copy_from_slice(&[-64.0, 32.0, -0.0, -32.0]);
        x[9] = 128.0;
        x[127] = -0.5;
        let mut out = [0u8; 18];
        quantize(&x, &mut out);
        let b = cast_blocks::<BlockQ1_0>(&out)[0];
        assert_eq!(f16_to_f32(b.d), (64.0 + 32.0 + 32.0 + 128.0 + 0.5) / 128.0);
        // Elements 0..8: −, +, + (−0.0), −, then + (zeros).
        assert_eq!(b.qs[0], 0b1111_0110);
        assert_eq!(b.qs[1], 0xFF);
        assert_eq!(b.qs[15], 0x7F);
        let mut y = [0.0f32; QK1_0];
        dequantize(&[b], &mut y);
        let d = f16_to_f32(b.d);
        assert_eq!((y[0], y[1], y[127]), (-d, d, -d));
    }
}
