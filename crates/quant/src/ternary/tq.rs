//! Mainline's ternary formats TQ2_0 (id 35) and TQ1_0 (id 34): 256-element
//! blocks with an f16 scale at the END; `x = d·(c − 1)`. Like every ternary type
//! they pair with `ActType::Q8_Row` (see `rows`).
//!
//! TQ2_0, 66 bytes: `u8 qs[64]; f16 d`. Element e sits in byte
//! `32·(e/128) + e%32` at bit shift `2·((e%128)/32)`.
//!
//! TQ1_0, 54 bytes: `u8 qs[48]; u8 qh[4]; f16 d`, base-3 packed
//! (see the `ternary` module docs), digit t of a byte holds:
//! * `qs[m]`, m < 32: element `m + 32t` (t = 0..5) — elements 0..160;
//! * `qs[32+m]`, m < 16: element `160 + m + 16t` — elements 160..240;
//! * `qh[j]`, j < 4: element `240 + j + 4t` (t = 0..4, the fifth digit is 0).
//!
//! Quantization (mainline reference, reproduced byte for byte):
//! `d = max|x|` over the block, `c = lroundf(x·(1/d)) + 1`.

use tern_gguf::GgmlType;

use super::{dot_q8_row, pack_trits, round_code, unpack_trit};
use crate::blocks::{amax, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::kquants::QK_K;
use crate::{ActType, Format, TensorScale};

/// One TQ2_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTQ2_0 {
    pub qs: [u8; QK_K / 4],
    /// f16 scale, little-endian.
    pub d: [u8; 2],
}
impl_block!(BlockTQ2_0, 66);

/// One TQ1_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockTQ1_0 {
    pub qs: [u8; 48],
    pub qh: [u8; 4],
    /// f16 scale, little-endian.
    pub d: [u8; 2],
}
impl_block!(BlockTQ1_0, 54);

/// A block's scale and the codes of its 256 elements, from `x`.
fn block_codes(xb: &[f32]) -> ([u8; 2], [u8; QK_K]) {
    let d = amax(xb);
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut codes = [0u8; QK_K];
    for (c, &v) in codes.iter_mut().zip(xb) {
        *c = round_code(v, id);
    }
    (f32_to_f16(d), codes)
}

fn tq2_codes(b: &BlockTQ2_0) -> [u8; QK_K] {
    let mut codes = [0u8; QK_K];
    for (e, c) in codes.iter_mut().enumerate() {
        *c = (b.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
    }
    codes
}

fn tq1_codes(b: &BlockTQ1_0) -> [u8; QK_K] {
    let mut codes = [0u8; QK_K];
    for m in 0..32 {
        for t in 0..5 {
            codes[m + 32 * t] = unpack_trit(b.qs[m], t);
        }
    }
    for m in 0..16 {
        for t in 0..5 {
            codes[160 + m + 16 * t] = unpack_trit(b.qs[32 + m], t);
        }
    }
    for j in 0..4 {
        for t in 0..4 {
            codes[240 + j + 4 * t] = unpack_trit(b.qh[j], t);
        }
    }
    codes
}

fn quantize_tq2_0(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockTQ2_0>(out)) {
        let (d, codes) = block_codes(xb);
        b.d = d;
        b.qs = [0; QK_K / 4];
        for (e, &c) in codes.iter().enumerate() {
            b.qs[32 * (e / 128) + e % 32] |= c << (2 * ((e % 128) / 32));
        }
    }
}

fn quantize_tq1_0(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockTQ1_0>(out)) {
        let (d, c) = block_codes(xb);
        b.d = d;
        for m in 0..32 {
            b.qs[m] = pack_trits(std::array::from_fn(|t| c[m + 32 * t]));
        }
        for m in 0..16 {
            b.qs[32 + m] = pack_trits(std::array::from_fn(|t| c[160 + m + 16 * t]));
        }
        for j in 0..4 {
            b.qh[j] = pack_trits(std::array::from_fn(|t| if t < 4 { c[240 + j + 4 * t] } else { 0 }));
        }
    }
}

fn expand(d: f32, codes: &[u8; QK_K], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = d * (c as i32 - 1) as f32;
    }
}

fn dequantize_tq2_0(blocks: &[BlockTQ2_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        expand(f16_to_f32(b.d), &tq2_codes(b), o);
    }
}

fn dequantize_tq1_0(blocks: &[BlockTQ1_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        expand(f16_to_f32(b.d), &tq1_codes(b), o);
    }
}

/// TQ2_0 (ggml id 35).
pub struct TQ2_0;

impl Format for TQ2_0 {
    const TYPE: GgmlType = GgmlType::TQ2_0;
    type Block = BlockTQ2_0;
    const ACT: ActType = ActType::Q8_Row;

    fn dequantize(blocks: &[BlockTQ2_0], _outer: f32, out: &mut [f32]) {
        dequantize_tq2_0(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_tq2_0(x, out);
    }

    fn dot(n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q8_row(Self::TYPE, n, w, tensor, act)
    }
}

/// TQ1_0 (ggml id 34).
pub struct TQ1_0;

impl Format for TQ1_0 {
    const TYPE: GgmlType = GgmlType::TQ1_0;
    type Block = BlockTQ1_0;
    const ACT: ActType = ActType::Q8_Row;

    fn dequantize(blocks: &[BlockTQ1_0], _outer: f32, out: &mut [f32]) {
        dequantize_tq1_0(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_tq1_0(x, out);
    }

    fn dot(n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q8_row(Self::TYPE, n, w, tensor, act)
    }
}
