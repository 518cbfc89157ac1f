//! Q5_K (ggml id 13): 256 elements in 176 bytes, 5.5 bpw. Q4_K plus a fifth bit.
//!
//! ```text
//! f16 d; f16 dmin; u8 scales[12]   // as Q4_K
//! u8  qh[32]      // bit 2c of qh[l]: element 64c+l; bit 2c+1: element 64c+32+l
//! u8  qs[128]     // low 4 bits, arranged as Q4_K
//! ```
//! Sub-block j = element / 32: `x = d·sc(j)·(q + 16·hbit) − dmin·m(j)`.

use tern_gguf::GgmlType;

use super::{quantize_scale_min, unpack_scale_min, QK_K};
use crate::act::BlockQ8K;
use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, impl_block};
use crate::{ActType, Format, TensorScale};

/// One Q5_K super-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockQ5K, 176);

/// The 5-bit level of block-local element `e`.
#[inline]
pub fn level(b: &BlockQ5K, e: usize) -> u8 {
    let (c, h, l) = (e / 64, (e / 32) % 2, e % 32);
    let low = (b.qs[32 * c + l] >> (4 * h)) & 15;
    let high = (b.qh[l] >> (2 * c + h)) & 1;
    low | (high << 4)
}

fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockQ5K>(out)) {
        let q = quantize_scale_min(xb, 31);
        b.d = q.d;
        b.dmin = q.dmin;
        b.scales = q.scales;
        b.qh = [0; QK_K / 8];
        for c in 0..4 {
            for l in 0..32 {
                let (lo, hi) = (q.levels[64 * c + l], q.levels[64 * c + 32 + l]);
                b.qs[32 * c + l] = (lo & 15) | ((hi & 15) << 4);
                b.qh[l] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
            }
        }
    }
}

fn dequantize(blocks: &[BlockQ5K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for (j, o) in o.chunks_exact_mut(32).enumerate() {
            let (sc, m) = unpack_scale_min(&b.scales, j);
            let (ds, mn) = (d * sc as f32, dmin * m as f32);
            for (l, o) in o.iter_mut().enumerate() {
                *o = ds * level(b, 32 * j + l) as f32 - mn;
            }
        }
    }
}

/// Q5_K · Q8_K, arranged as the Q4_K dot (see there).
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ5K>(w).iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = unpack_scale_min(&wb.scales, j);
            let s: i32 = (32 * j..32 * j + 32).map(|e| level(wb, e) as i32 * ab.qs[e] as i32).sum();
            sumi += sc as i32 * s;
            summ += m as i32 * (ab.bsum(2 * j) + ab.bsum(2 * j + 1));
        }
        sum += ab.scale() * (f16_to_f32(wb.d) * sumi as f32 - f16_to_f32(wb.dmin) * summ as f32);
    }
    sum
}

/// Q5_K (ggml id 13).
pub struct Q5K;

impl Format for Q5K {
    const TYPE: GgmlType = GgmlType::Q5_K;
    type Block = BlockQ5K;
    const ACT: ActType = ActType::Q8_K;

    fn dequantize(blocks: &[BlockQ5K], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
