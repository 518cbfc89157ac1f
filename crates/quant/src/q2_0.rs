//! Q2_0 (ggml id 42, mainline llama.cpp): 64 elements in 18 bytes, one f16
//! scale per block and a 2-bit code per element. Pairs with `ActType::Q8_0`
//! activations, two 32-element activation blocks per weight block, as
//! mainline's `vec_dot_type` does.
//!
//! ```text
//! f16 d
//! u8  qs[16]   // element j: code c = (qs[j/4] >> 2·(j%4)) & 3
//! ```
//! `x[j] = d·(c − 1)`, so the codes stand for −1, 0, +1 and +2. Ternary
//! data uses the first three, but the format allows the fourth, and every
//! kernel must be exact for it.
//!
//! Quantization (mainline's `quantize_row_q2_0_ref`, reproduced byte for
//! byte): `d = max|x|` over the block, `c = clamp(roundf(x/d) + 1, 0, 3)`
//! with the unrounded `d` (round half away from zero; 0 when `d` is 0), and
//! `d` stored as f16. It never writes code 3: `|x/d| ≤ 1`.

use tern_gguf::GgmlType;

use crate::blocks::{amax, cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::q8_0::{BlockQ8_0, QK8_0};
use crate::{ActType, Format, TensorScale};

/// Elements per Q2_0 block.
pub const QK2_0: usize = 64;

/// One Q2_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2_0 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    pub qs: [u8; QK2_0 / 4],
}
impl_block!(BlockQ2_0, 18);

impl BlockQ2_0 {
    /// The code (0..=3) of element `j`.
    #[inline]
    pub fn code(&self, j: usize) -> u8 {
        (self.qs[j / 4] >> (2 * (j % 4))) & 3
    }
}

fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK2_0).zip(cast_blocks_mut::<BlockQ2_0>(out)) {
        let d = amax(xb);
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        b.qs = [0; QK2_0 / 4];
        for (j, &v) in xb.iter().enumerate() {
            // `as` saturates (NaN to 0), where C's conversion is undefined.
            let c = ((v * id).round() as i32 + 1).clamp(0, 3) as u8;
            b.qs[j / 4] |= c << (2 * (j % 4));
        }
    }
}

fn dequantize(blocks: &[BlockQ2_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK2_0)) {
        let d = f16_to_f32(b.d);
        for (j, o) in o.iter_mut().enumerate() {
            *o = d * (b.code(j) as i32 - 1) as f32;
        }
    }
}

/// Q2_0 · Q8_0: per activation block (two a weight block) the exact i32
/// `s = Σ (c − 1)·a`, then `d·d_a·s` in f32, summed in f32 in row order, as
/// the Q8_0 and Q4_0 twins do. Mainline's generic kernel groups the same
/// products as `d·(d_a0·s0 + d_a1·s1)`: equal up to rounding.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let acts = cast_blocks::<BlockQ8_0>(act);
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ2_0>(w).iter().zip(acts.chunks_exact(QK2_0 / QK8_0)) {
        let d = f16_to_f32(wb.d);
        for (k, a) in ab.iter().enumerate() {
            let s: i32 = a.qs.iter().enumerate().map(|(l, &q)| (wb.code(QK8_0 * k + l) as i32 - 1) * q as i32).sum();
            sum += d * a.scale() * s as f32;
        }
    }
    sum
}

/// Q2_0 (ggml id 42).
pub struct Q2_0;

impl Format for Q2_0 {
    const TYPE: GgmlType = GgmlType::Q2_0;
    type Block = BlockQ2_0;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ2_0], _outer: f32, out: &mut [f32]) {
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

    /// The reference quantizer's codes on a hand-made block: the largest
    /// magnitude maps to ±1 exactly, halves round away from zero, and a
    /// hand-written code 3 decodes to +2d.
    #[test]
    fn codes_follow_the_reference_quantizer() {
        let mut x = [0.0f32; QK2_0];
        x[..6].copy_from_slice(&[-4.0, 4.0, 2.0, -2.0, 1.9, -1.99]);
        let mut out = [0u8; 18];
        quantize(&x, &mut out);
        let b = cast_blocks::<BlockQ2_0>(&out)[0];
        assert_eq!(f16_to_f32(b.d), 4.0);
        // x/d = −1, 1, 0.5, −0.5, 0.475, −0.4975 → −1, 1, 1, −1, 0, 0; the rest 0.
        assert_eq!((0..6).map(|j| b.code(j)).collect::<Vec<_>>(), [0, 2, 2, 0, 1, 1]);
        assert!((6..QK2_0).all(|j| b.code(j) == 1));
        assert_eq!(b.qs[0], 0b00_10_10_00);

        let mut b2 = b;
        b2.qs[15] = 0b11_00_01_10; // elements 60..64: codes 2, 1, 0, 3
        let mut y = [0.0f32; QK2_0];
        dequantize(&[b2], &mut y);
        assert_eq!(y[60..], [4.0, 0.0, -4.0, 8.0]);
    }

    #[test]
    fn zero_blocks_quantize_to_code_1() {
        let mut out = [0xFFu8; 36];
        quantize(&[0.0; 2 * QK2_0], &mut out);
        for b in cast_blocks::<BlockQ2_0>(&out) {
            assert_eq!((f16_to_f32(b.d), b.qs), (0.0, [0x55; 16]));
        }
    }
}
