//! The two 32-element formats with a scale and a minimum per block: Q4_1
//! (ggml id 3, 4-bit codes, 20 bytes) and Q5_1 (id 7, 5-bit codes, 24
//! bytes). Values are `x = d·c + m` for codes `c` from 0.
//!
//! ```text
//! Q4_1: f16 d, f16 m, u8 qs[16]
//! Q5_1: f16 d, f16 m, u8 qh[4], u8 qs[16]
//! ```
//! The low nibble of `qs[j]` is element j, the high nibble element j+16;
//! Q5_1's `qh` is a little-endian u32 whose bit j is element j's fifth bit
//! (as Q5_0's, `q5_0.rs`).
//!
//! Quantization (ggml's `quantize_row_q4_1_ref` / `quantize_row_q5_1_ref`,
//! reproduced byte for byte): `min` and `max` of the block, `d = (max −
//! min)/(2^bits − 1)`, `c = trunc((x − min)/d + 0.5)` with the unrounded `d`
//! and `min` (Q4_1 folds a 16 into 15), then `d` and `m = min` stored as f16.
//!
//! Activations: ggml pairs both with Q8_1, whose blocks carry `s = d_a·Σa`
//! (as an f16) for the `m` term. We pair them with plain `ActType::Q8_0` and
//! form `Σa` from the quants in the dot product, so a block contributes
//! `d·d_a·Σ c·a + m·d_a·Σ a` with both sums exact (ggml's differs by the
//! f16 rounding of its `s`).

use tern_gguf::GgmlType;

use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::q5_0::{code5, pack5, QK5};
use crate::q8_0::BlockQ8_0;
use crate::{ActType, Format, TensorScale};

/// Elements per Q4_1 block.
pub const QK4_1: usize = 32;

/// One Q4_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_1 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    /// f16 minimum (the value of code 0), little-endian.
    pub m: [u8; 2],
    pub qs: [u8; QK4_1 / 2],
}
impl_block!(BlockQ4_1, 20);

impl BlockQ4_1 {
    /// The code (0..=15) of element `j`.
    #[inline]
    pub fn code(&self, j: usize) -> u8 {
        if j < QK4_1 / 2 {
            self.qs[j] & 15
        } else {
            self.qs[j - QK4_1 / 2] >> 4
        }
    }
}

/// One Q5_1 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5_1 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    /// f16 minimum (the value of code 0), little-endian.
    pub m: [u8; 2],
    /// The fifth bits, a little-endian u32 (bit j for element j).
    pub qh: [u8; 4],
    pub qs: [u8; QK5 / 2],
}
impl_block!(BlockQ5_1, 24);

impl BlockQ5_1 {
    /// The code (0..=31) of element `j`.
    #[inline]
    pub fn code(&self, j: usize) -> u8 {
        code5(&self.qs, self.qh, j)
    }
}

/// A block's minimum and maximum as ggml's reference finds them, and the
/// scale and inverse scale for codes `0..=top`.
fn min_scale(xb: &[f32], top: f32) -> (f32, f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / top;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    (min, d, id)
}

fn quantize_q4_1(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK4_1).zip(cast_blocks_mut::<BlockQ4_1>(out)) {
        let (min, d, id) = min_scale(xb, 15.0);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        // (x − min)·id + 0.5 lies in [0.5, 15.5] up to rounding: truncation is floor.
        let code = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
        for j in 0..QK4_1 / 2 {
            b.qs[j] = code(xb[j]) | code(xb[j + 16]) << 4;
        }
    }
}

fn quantize_q5_1(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK5).zip(cast_blocks_mut::<BlockQ5_1>(out)) {
        let (min, d, id) = min_scale(xb, 31.0);
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        // ggml does not clamp (the value stays below 32 for finite data);
        // the `min` only keeps non-finite input from setting stray bits.
        let codes: [u8; QK5] = std::array::from_fn(|j| (((xb[j] - min) * id + 0.5) as u8).min(31));
        pack5(&codes, &mut b.qs, &mut b.qh);
    }
}

fn dequantize_q4_1(blocks: &[BlockQ4_1], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK4_1)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (j, o) in o.iter_mut().enumerate() {
            *o = d * b.code(j) as f32 + m;
        }
    }
}

fn dequantize_q5_1(blocks: &[BlockQ5_1], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK5)) {
        let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
        for (j, o) in o.iter_mut().enumerate() {
            *o = d * b.code(j) as f32 + m;
        }
    }
}

/// One block's contribution: `d·d_a·Σ c·a + m·d_a·Σ a`, both sums exact
/// i32s, each product formed in f32 in this order (the SIMD kernels form
/// the same per-block value and only sum the blocks in another order).
#[inline]
fn block_dot(d: [u8; 2], m: [u8; 2], code: impl Fn(usize) -> u8, ab: &BlockQ8_0) -> f32 {
    let (mut sumi, mut suma) = (0i32, 0i32);
    for (j, &q) in ab.qs.iter().enumerate() {
        sumi += code(j) as i32 * q as i32;
        suma += q as i32;
    }
    let da = ab.scale();
    f16_to_f32(d) * da * sumi as f32 + f16_to_f32(m) * da * suma as f32
}

fn dot_q4_1(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ4_1>(w).iter().zip(cast_blocks::<BlockQ8_0>(act)) {
        sum += block_dot(wb.d, wb.m, |j| wb.code(j), ab);
    }
    sum
}

fn dot_q5_1(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ5_1>(w).iter().zip(cast_blocks::<BlockQ8_0>(act)) {
        sum += block_dot(wb.d, wb.m, |j| wb.code(j), ab);
    }
    sum
}

/// Q4_1 (ggml id 3).
pub struct Q4_1;

impl Format for Q4_1 {
    const TYPE: GgmlType = GgmlType::Q4_1;
    type Block = BlockQ4_1;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ4_1], _outer: f32, out: &mut [f32]) {
        dequantize_q4_1(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_q4_1(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q4_1(w, act)
    }
}

/// Q5_1 (ggml id 7).
pub struct Q5_1;

impl Format for Q5_1 {
    const TYPE: GgmlType = GgmlType::Q5_1;
    type Block = BlockQ5_1;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ5_1], _outer: f32, out: &mut [f32]) {
        dequantize_q5_1(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_q5_1(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q5_1(w, act)
    }
}
