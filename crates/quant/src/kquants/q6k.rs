//! Q6_K (ggml id 14): 256 elements in 210 bytes, 6.5625 bpw.
//!
//! ```text
//! u8  ql[128]     // low 4 bits
//! u8  qh[64]      // high 2 bits
//! i8  scales[16]  // one per 16 elements (scale index = element / 16)
//! f16 d           // at the END
//! ```
//! Element e: half `h = e/128`, `k = (e%128)/32`, `l = e%32`; its low nibble is
//! `ql[64h + 32(k%2) + l]` (low nibble for k < 2, high for k ≥ 2), its high
//! two bits are bits `2k..2k+2` of `qh[32h + l]`; `x = d·scales[e/16]·(q − 32)`.

use tern_gguf::GgmlType;

use super::{fit_scale_symmetric, QK_K};
use crate::act::BlockQ8K;
use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block, round_f16};
use crate::{ActType, Format, TensorScale};

/// One Q6_K super-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    /// f16 super-scale, little-endian.
    pub d: [u8; 2],
}
impl_block!(BlockQ6K, 210);

/// Byte positions of block-local element `e`: (ql index, ql shift, qh index, qh shift).
#[inline]
fn position(e: usize) -> (usize, u32, usize, u32) {
    let (h, k, l) = (e / 128, (e % 128) / 32, e % 32);
    (64 * h + 32 * (k % 2) + l, 4 * (k / 2) as u32, 32 * h + l, 2 * k as u32)
}

/// The signed level (−32..=31) of block-local element `e`.
#[inline]
pub fn level(b: &BlockQ6K, e: usize) -> i32 {
    let (li, ls, hi, hs) = position(e);
    let q = ((b.ql[li] >> ls) & 15) | (((b.qh[hi] >> hs) & 3) << 4);
    q as i32 - 32
}

/// Fits each 16-element sub-block symmetrically, quantizes the 16 sub-scales
/// to int8 against `d = max|s|/127`, then re-picks the levels against the
/// scales the decoder will see.
fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockQ6K>(out)) {
        let mut s = [0.0f32; 16];
        for (s, sub) in s.iter_mut().zip(xb.chunks_exact(16)) {
            *s = fit_scale_symmetric(sub, 32);
        }
        let d = s.iter().fold(0.0f32, |a, v| a.max(v.abs())) / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        for (q, &v) in b.scales.iter_mut().zip(&s) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
        b.d = f32_to_f16(d);
        let d16 = round_f16(d);
        b.ql = [0; QK_K / 2];
        b.qh = [0; QK_K / 4];
        for (e, &v) in xb.iter().enumerate() {
            let ds = d16 * b.scales[e / 16] as f32;
            let l = if ds != 0.0 { (v / ds).round().clamp(-32.0, 31.0) as i32 } else { 0 };
            let q = (l + 32) as u8;
            let (li, ls, hi, hs) = position(e);
            b.ql[li] |= (q & 15) << ls;
            b.qh[hi] |= (q >> 4) << hs;
        }
    }
}

fn dequantize(blocks: &[BlockQ6K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (e, o) in o.iter_mut().enumerate() {
            *o = d * b.scales[e / 16] as f32 * level(b, e) as f32;
        }
    }
}

/// Q6_K · Q8_K: `Σ_g scales[g]·Σ (q−32)·a` over the 16-element groups in i32,
/// then `d_a · d · sum` in f32.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ6K>(w).iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let mut sumi = 0i32;
        for g in 0..16 {
            let s: i32 = (16 * g..16 * g + 16).map(|e| level(wb, e) * ab.qs[e] as i32).sum();
            sumi += wb.scales[g] as i32 * s;
        }
        sum += ab.scale() * f16_to_f32(wb.d) * sumi as f32;
    }
    sum
}

/// Q6_K (ggml id 14).
pub struct Q6K;

impl Format for Q6K {
    const TYPE: GgmlType = GgmlType::Q6_K;
    type Block = BlockQ6K;
    const ACT: ActType = ActType::Q8_K;

    fn dequantize(blocks: &[BlockQ6K], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
