//! Q8_0 (ggml id 8): 32 elements in 34 bytes, one f16 scale per block.
//! The same block doubles as the `ActType::Q8_0` activation row format that
//! the 32-element weight formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) and
//! Q2_0 and Q1_0 are multiplied with.
//!
//! ```text
//! f16 d        // scale
//! i8  qs[32]   // x[e] = d * qs[e]
//! ```
//! Quantization (ggml reference, reproduced byte for byte): `amax = max|x|`,
//! `d = amax / 127`, `qs = roundf(x * (1/d))` (half away from zero) with the
//! unrounded `d`; `d` is then stored as f16.

use tern_gguf::GgmlType;

use crate::blocks::{amax, cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::{ActType, Format, TensorScale};

/// Elements per Q8_0 block.
pub const QK8_0: usize = 32;

/// One Q8_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8_0 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    pub qs: [i8; QK8_0],
}
impl_block!(BlockQ8_0, 34);

impl BlockQ8_0 {
    #[inline]
    pub fn scale(&self) -> f32 {
        f16_to_f32(self.d)
    }
}

pub(crate) fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK8_0).zip(cast_blocks_mut::<BlockQ8_0>(out)) {
        let d = amax(xb) / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            // |v * id| <= 127 up to one rounding, and `as` saturates anyway.
            *q = (v * id).round() as i8;
        }
    }
}

pub(crate) fn dequantize(blocks: &[BlockQ8_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK8_0)) {
        let d = b.scale();
        for (o, &q) in o.iter_mut().zip(&b.qs) {
            *o = d * q as f32;
        }
    }
}

/// Q8_0 weights · Q8_0 activations: an i32 sum per block, scaled by both f16
/// scales in f32, blocks summed in f32.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let ws = cast_blocks::<BlockQ8_0>(w);
    let acts = cast_blocks::<BlockQ8_0>(act);
    let mut sum = 0.0f32;
    for (wb, ab) in ws.iter().zip(acts) {
        let sumi: i32 = wb.qs.iter().zip(&ab.qs).map(|(&a, &b)| a as i32 * b as i32).sum();
        sum += wb.scale() * ab.scale() * sumi as f32;
    }
    sum
}

/// Q8_0 (ggml id 8).
pub struct Q8_0;

impl Format for Q8_0 {
    const TYPE: GgmlType = GgmlType::Q8_0;
    type Block = BlockQ8_0;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ8_0], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
