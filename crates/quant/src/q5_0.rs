//! Q5_0 (ggml id 6): 32 elements in 22 bytes, an f16 scale and a 5-bit
//! level per element, split into a nibble and a fifth bit. Pairs with
//! `ActType::Q8_0` activations, as ggml's `vec_dot_type` does.
//!
//! ```text
//! f16 d
//! u8  qh[4]    // u32 little-endian: bit j is the fifth bit of element j
//! u8  qs[16]   // low nibble of qs[j] = element j, high nibble = element j+16
//! ```
//! With the 5-bit code `c = nibble | (bit << 4)` (0..=31), `x = d·(c − 16)`,
//! so the levels are −16..=15.
//!
//! Quantization (ggml's `quantize_row_q5_0_ref`, reproduced byte for byte):
//! the element of largest |x| (sign kept, the first on ties) maps to level
//! −16, so `d = max / −16`; every element takes `c = min(31, trunc(x/d +
//! 16.5))` with the unrounded `d`, and `d` is stored as f16.

use tern_gguf::GgmlType;

use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block, signed_max};
use crate::q8_0::BlockQ8_0;
use crate::{ActType, Format, TensorScale};

/// Elements per Q5_0 / Q5_1 block.
pub const QK5: usize = 32;

/// One Q5_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_0 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    /// The fifth bits, a little-endian u32 (bit j for element j).
    pub qh: [u8; 4],
    pub qs: [u8; QK5 / 2],
}
impl_block!(BlockQ5_0, 22);

/// The 5-bit code (0..=31) of element `j` from a block's nibbles and fifth bits.
#[inline]
pub(crate) fn code5(qs: &[u8; QK5 / 2], qh: [u8; 4], j: usize) -> u8 {
    let nibble = if j < QK5 / 2 { qs[j] & 15 } else { qs[j - QK5 / 2] >> 4 };
    let high = (u32::from_le_bytes(qh) >> j) & 1;
    nibble | (high as u8) << 4
}

/// Writes 32 codes (0..=31, element order) as nibbles and fifth bits.
#[inline]
pub(crate) fn pack5(codes: &[u8; QK5], qs: &mut [u8; QK5 / 2], qh: &mut [u8; 4]) {
    let mut bits = 0u32;
    for j in 0..QK5 / 2 {
        let (lo, hi) = (codes[j], codes[j + QK5 / 2]);
        qs[j] = (lo & 15) | (hi & 15) << 4;
        bits |= ((lo >> 4) as u32 & 1) << j;
        bits |= ((hi >> 4) as u32 & 1) << (j + QK5 / 2);
    }
    *qh = bits.to_le_bytes();
}

impl BlockQ5_0 {
    /// The code (0..=31) of element `j`; its level is `code − 16`.
    #[inline]
    pub fn code(&self, j: usize) -> u8 {
        code5(&self.qs, self.qh, j)
    }
}

fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK5).zip(cast_blocks_mut::<BlockQ5_0>(out)) {
        let d = signed_max(xb) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        // x·id + 16.5 lies in [0.5, 32.5]: truncation is floor, and `min` folds 32 into 31.
        let codes: [u8; QK5] = std::array::from_fn(|j| ((xb[j] * id + 16.5) as u8).min(31));
        pack5(&codes, &mut b.qs, &mut b.qh);
    }
}

fn dequantize(blocks: &[BlockQ5_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK5)) {
        let d = f16_to_f32(b.d);
        for (j, o) in o.iter_mut().enumerate() {
            *o = d * (b.code(j) as i32 - 16) as f32;
        }
    }
}

/// Q5_0 · Q8_0: the exact i32 `Σ (c − 16)·a` per block, scaled by
/// `d·d_a` in f32, blocks summed in f32 in row order (as ggml's generic
/// `ggml_vec_dot_q5_0_q8_0`).
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ5_0>(w).iter().zip(cast_blocks::<BlockQ8_0>(act)) {
        let sumi: i32 = ab.qs.iter().enumerate().map(|(j, &q)| (wb.code(j) as i32 - 16) * q as i32).sum();
        sum += f16_to_f32(wb.d) * ab.scale() * sumi as f32;
    }
    sum
}

/// Q5_0 (ggml id 6).
pub struct Q5_0;

impl Format for Q5_0 {
    const TYPE: GgmlType = GgmlType::Q5_0;
    type Block = BlockQ5_0;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ5_0], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
