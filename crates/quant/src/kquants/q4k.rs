//! Q4_K (ggml id 12): 256 elements in 144 bytes, 4.5 bpw.
//!
//! ```text
//! f16 d           // super-scale of the 6-bit sub-block scales
//! f16 dmin        // super-scale of the 6-bit sub-block mins
//! u8  scales[12]  // 8 scales + 8 mins, 6 bits each (kquants::unpack_scale_min)
//! u8  qs[128]     // chunk c (0..4) = qs[32c..32c+32]: low nibbles are
//!                 // elements 64c..64c+32, high nibbles 64c+32..64c+64
//! ```
//! Sub-block j = element / 32: `x = d·sc(j)·q − dmin·m(j)`.

use tern_gguf::GgmlType;

use super::{quantize_scale_min, unpack_scale_min, QK_K};
use crate::act::BlockQ8K;
use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, impl_block};
use crate::{ActType, Format, TensorScale};

/// One Q4_K super-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    pub d: [u8; 2],
    pub dmin: [u8; 2],
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockQ4K, 144);

fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockQ4K>(out)) {
        let q = quantize_scale_min(xb, 15);
        b.d = q.d;
        b.dmin = q.dmin;
        b.scales = q.scales;
        for c in 0..4 {
            for l in 0..32 {
                b.qs[32 * c + l] = q.levels[64 * c + l] | (q.levels[64 * c + 32 + l] << 4);
            }
        }
    }
}

fn dequantize(blocks: &[BlockQ4K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for c in 0..4 {
            let (sc0, m0) = unpack_scale_min(&b.scales, 2 * c);
            let (sc1, m1) = unpack_scale_min(&b.scales, 2 * c + 1);
            let (d0, mn0) = (d * sc0 as f32, dmin * m0 as f32);
            let (d1, mn1) = (d * sc1 as f32, dmin * m1 as f32);
            for l in 0..32 {
                let q = b.qs[32 * c + l];
                o[64 * c + l] = d0 * (q & 15) as f32 - mn0;
                o[64 * c + 32 + l] = d1 * (q >> 4) as f32 - mn1;
            }
        }
    }
}

/// Q4_K · Q8_K: per super-block, `Σ_j sc_j·Σ q·a` and `Σ_j m_j·bsum_j` in i32
/// (the mins use the activation block sums), then
/// `d_a · (d·Σscaled − dmin·Σmins)` in f32.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ4K>(w).iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let (mut sumi, mut summ) = (0i32, 0i32);
        for j in 0..8 {
            let (sc, m) = unpack_scale_min(&wb.scales, j);
            let (c, shift) = (j / 2, 4 * (j % 2));
            let a = &ab.qs[32 * j..32 * j + 32];
            let s: i32 = (0..32).map(|l| ((wb.qs[32 * c + l] >> shift) & 15) as i32 * a[l] as i32).sum();
            sumi += sc as i32 * s;
            summ += m as i32 * (ab.bsum(2 * j) + ab.bsum(2 * j + 1));
        }
        sum += ab.scale() * (f16_to_f32(wb.d) * sumi as f32 - f16_to_f32(wb.dmin) * summ as f32);
    }
    sum
}

/// Q4_K (ggml id 12).
pub struct Q4K;

impl Format for Q4K {
    const TYPE: GgmlType = GgmlType::Q4_K;
    type Block = BlockQ4K;
    const ACT: ActType = ActType::Q8_K;

    fn dequantize(blocks: &[BlockQ4K], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
