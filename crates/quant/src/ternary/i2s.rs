//! Microsoft BitNet's I2_S (id 36): 2 bits per element over the flattened
//! tensor, one f32 scale for the whole tensor; `x = scale·(c − 1)`. Pairs with
//! the training-faithful `ActType::Q8_Row`.
//!
//! ```text
//! u8  packed[n/4]   // 128-element blocks of 32 bytes (x86 layout, QK_I2_S = 128)
//! f32 scale         // at byte n/4
//! u8  pad[28]       // zero
//! ```
//! Element j of a block is in byte `j % 32` at bit shift `6 − 2·(j/32)`
//! (most significant pair first). Row r of a `[ne0, ne1]` tensor is bytes
//! `r·ne0/4 .. (r+1)·ne0/4`, so rows are whole blocks when `ne0 % 128 == 0`.
//!
//! Quantization: `scale = max|x|` over the tensor (what Microsoft's C
//! quantizer stores for already-ternary weights); each element takes the
//! nearest level, `c = round(x/scale) + 1` clamped to 0..=2 (all codes 1 when
//! the scale is 0). For ternary-valued input this equals Microsoft's
//! sign-based rule.

use tern_gguf::GgmlType;

use super::{dot_q8_row, round_code};
use crate::blocks::{amax, cast_blocks_mut, f32_at, impl_block};
use crate::{ActType, Format, TensorScale};

/// Elements per I2_S block.
pub const QK_I2_S: usize = 128;
/// Bytes after the packed data: the f32 scale and 28 zero bytes.
pub const I2_S_TAIL: usize = 32;

/// One I2_S block of 128 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockI2S {
    pub qs: [u8; QK_I2_S / 4],
}
impl_block!(BlockI2S, 32);

#[inline]
fn shift(j: usize) -> u32 {
    6 - 2 * (j / 32) as u32
}

/// The tensor scale stored after `n_elements / 4` packed bytes.
pub(crate) fn tensor_scale(tensor: &[u8], n_elements: usize) -> f32 {
    assert!(tensor.len() >= n_elements / 4 + 4, "I2_S tensor of {n_elements} elements is truncated");
    f32_at(tensor, n_elements / 4)
}

/// Packs whole blocks of `x` against a given tensor scale.
fn quantize_blocks(x: &[f32], scale: f32, out: &mut [u8]) {
    let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
    for (xb, b) in x.chunks_exact(QK_I2_S).zip(cast_blocks_mut::<BlockI2S>(out)) {
        b.qs = [0; 32];
        for (j, &v) in xb.iter().enumerate() {
            b.qs[j % 32] |= round_code(v, id) << shift(j);
        }
    }
}

/// Quantizes a whole flattened tensor, tail included (`out.len() == n/4 + 32`).
pub(crate) fn quantize_tensor(x: &[f32], out: &mut [u8]) {
    let n = x.len();
    assert!(n.is_multiple_of(QK_I2_S), "I2_S tensors must be whole 128-element blocks, got {n}");
    assert_eq!(out.len(), n / 4 + I2_S_TAIL, "I2_S tensor buffer size");
    let scale = amax(x);
    let (data, tail) = out.split_at_mut(n / 4);
    quantize_blocks(x, scale, data);
    tail.fill(0);
    tail[..4].copy_from_slice(&scale.to_le_bytes());
}

fn dequantize(blocks: &[BlockI2S], scale: f32, out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_I2_S)) {
        for (j, o) in o.iter_mut().enumerate() {
            *o = scale * (((b.qs[j % 32] >> shift(j)) & 3) as i32 - 1) as f32;
        }
    }
}

/// I2_S (Microsoft's id 36).
pub struct I2S;

impl Format for I2S {
    const TYPE: GgmlType = GgmlType::I2_S;
    type Block = BlockI2S;
    const ACT: ActType = ActType::Q8_Row;

    fn outer_scale(_row: &[u8], tensor: TensorScale) -> f32 {
        tensor.0
    }

    fn dequantize(blocks: &[BlockI2S], outer: f32, out: &mut [f32]) {
        dequantize(blocks, outer, out);
    }

    /// A row cannot carry the tensor scale: its codes are taken against the
    /// row's own `max|x|` (see `quantize_row`).
    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_blocks(x, amax(x), out);
    }

    fn dot(n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q8_row(Self::TYPE, n, w, tensor, act)
    }

    fn tensor_scale(tensor: &[u8], n_elements: usize) -> TensorScale {
        TensorScale(tensor_scale(tensor, n_elements))
    }

    fn quantize_tensor(x: &[f32], _ne0: usize, out: &mut [u8]) {
        quantize_tensor(x, out);
    }
}
