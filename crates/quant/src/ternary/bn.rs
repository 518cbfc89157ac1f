//! ik_llama.cpp's ternary formats IQ2_BN (id 135) and IQ1_BN (id 134): 64-element
//! blocks behind one row scale; `x = d_row·(c − 1)`. Like every ternary type
//! they pair with `ActType::Q8_Row` (see `rows`).
//!
//! IQ2_BN row: `f32 d; blocks[ne0/64] { u8 qs[16] }`. Element e of a block is
//! in byte `e % 16` at bit shift `2·(e/16)`.
//!
//! IQ1_BN row: `f16 d; blocks[ne0/64] { u8 ql[12]; u8 extra }`. The block is
//! four groups of 16 (g = 0..4): `ql[3g+k]` holds elements `16g + 5k + j`
//! (j = 0..5) with element j the *least* significant base-3 digit (the opposite
//! of TQ1_0's order), and element `16g + 15` is digit g (least significant
//! first) of `extra`.
//!
//! Quantization (ik's, reproduced byte for byte): `d = max|x|` over the row,
//! `c = 1` if `|x| < d/2`, else `0` for `x < 0` and `2` otherwise (so an
//! all-zero row gets code 2 everywhere — harmless, its scale is 0).

use tern_gguf::GgmlType;

use super::{dot_q8_row, pack_trits, unpack_trit};
use crate::blocks::{amax, cast_blocks_mut, f16_to_f32, f32_at, f32_to_f16, impl_block};
use crate::{ActType, Format, TensorScale};

/// Elements per IQ1_BN / IQ2_BN block.
pub const QK_BN: usize = 64;
/// Row prefix (the f16 row scale) of IQ1_BN.
pub const IQ1_BN_PREFIX: usize = 2;
/// Row prefix (the f32 row scale) of IQ2_BN.
pub const IQ2_BN_PREFIX: usize = 4;

/// One IQ2_BN block (the row scale lives in front of the row).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ2BN {
    pub qs: [u8; QK_BN / 4],
}
impl_block!(BlockIQ2BN, 16);

/// One IQ1_BN block (the row scale lives in front of the row).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ1BN {
    pub ql: [u8; 12],
    pub extra: u8,
}
impl_block!(BlockIQ1BN, 13);

/// The threshold code rule shared by both formats.
#[inline]
fn code(x: f32, thresh: f32) -> u8 {
    if x.abs() < thresh {
        1
    } else if x < 0.0 {
        0
    } else {
        2
    }
}

fn iq2_codes(b: &BlockIQ2BN) -> [u8; QK_BN] {
    std::array::from_fn(|e| (b.qs[e % 16] >> (2 * (e / 16))) & 3)
}

fn iq1_codes(b: &BlockIQ1BN) -> [u8; QK_BN] {
    let mut codes = [0u8; QK_BN];
    for g in 0..4 {
        for k in 0..3 {
            for j in 0..5 {
                codes[16 * g + 5 * k + j] = unpack_trit(b.ql[3 * g + k], 4 - j);
            }
        }
        codes[16 * g + 15] = unpack_trit(b.extra, 4 - g);
    }
    codes
}

fn iq2bn_row_scale(row: &[u8]) -> f32 {
    f32_at(row, 0)
}

fn iq1bn_row_scale(row: &[u8]) -> f32 {
    f16_to_f32([row[0], row[1]])
}

fn quantize_iq2bn(x: &[f32], out: &mut [u8]) {
    let d = amax(x);
    let thresh = 0.5 * d;
    let (head, blocks) = out.split_at_mut(IQ2_BN_PREFIX);
    head.copy_from_slice(&d.to_le_bytes());
    for (xb, b) in x.chunks_exact(QK_BN).zip(cast_blocks_mut::<BlockIQ2BN>(blocks)) {
        for j in 0..16 {
            b.qs[j] = (0..4).fold(0u8, |acc, s| acc | (code(xb[j + 16 * s], thresh) << (2 * s)));
        }
    }
}

fn quantize_iq1bn(x: &[f32], out: &mut [u8]) {
    let d = amax(x);
    let thresh = 0.5 * d;
    let (head, blocks) = out.split_at_mut(IQ1_BN_PREFIX);
    head.copy_from_slice(&f32_to_f16(d));
    for (xb, b) in x.chunks_exact(QK_BN).zip(cast_blocks_mut::<BlockIQ1BN>(blocks)) {
        for g in 0..4 {
            for k in 0..3 {
                // Element j is digit j from the least significant end.
                b.ql[3 * g + k] = pack_trits(std::array::from_fn(|t| code(xb[16 * g + 5 * k + 4 - t], thresh)));
            }
        }
        b.extra = pack_trits(std::array::from_fn(|t| if t == 0 { 0 } else { code(xb[16 * (4 - t) + 15], thresh) }));
    }
}

fn expand(d: f32, codes: &[u8; QK_BN], out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = d * (c as i32 - 1) as f32;
    }
}

/// Decodes whole blocks (no row prefix) with row scale `d`.
fn dequantize_iq2bn_blocks(d: f32, blocks: &[BlockIQ2BN], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_BN)) {
        expand(d, &iq2_codes(b), o);
    }
}

/// Decodes whole blocks (no row prefix) with row scale `d`.
fn dequantize_iq1bn_blocks(d: f32, blocks: &[BlockIQ1BN], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_BN)) {
        expand(d, &iq1_codes(b), o);
    }
}

/// IQ2_BN (ik's id 135).
pub struct IQ2BN;

impl Format for IQ2BN {
    const TYPE: GgmlType = GgmlType::IQ2_BN;
    type Block = BlockIQ2BN;
    const ACT: ActType = ActType::Q8_Row;

    fn outer_scale(row: &[u8], _tensor: TensorScale) -> f32 {
        iq2bn_row_scale(row)
    }

    fn dequantize(blocks: &[BlockIQ2BN], outer: f32, out: &mut [f32]) {
        dequantize_iq2bn_blocks(outer, blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_iq2bn(x, out);
    }

    fn dot(n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q8_row(Self::TYPE, n, w, tensor, act)
    }
}

/// IQ1_BN (ik's id 134).
pub struct IQ1BN;

impl Format for IQ1BN {
    const TYPE: GgmlType = GgmlType::IQ1_BN;
    type Block = BlockIQ1BN;
    const ACT: ActType = ActType::Q8_Row;

    fn outer_scale(row: &[u8], _tensor: TensorScale) -> f32 {
        iq1bn_row_scale(row)
    }

    fn dequantize(blocks: &[BlockIQ1BN], outer: f32, out: &mut [f32]) {
        dequantize_iq1bn_blocks(outer, blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_iq1bn(x, out);
    }

    fn dot(n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q8_row(Self::TYPE, n, w, tensor, act)
    }
}
