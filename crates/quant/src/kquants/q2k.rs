//! Q2_K (ggml id 10): 256 elements in 84 bytes, 2.625 bpw.
//!
//! ```text
//! u8  scales[16]  // group g = element/16: low nibble its scale, high nibble its min
//! u8  qs[64]      // 2-bit codes: element 128h + 32j + l is bits 2j..2j+2 of qs[32h + l]
//! f16 d           // super-scale of the scales
//! f16 dmin        // super-scale of the mins
//! ```
//! `x = d·(scales[g] & 15)·q − dmin·(scales[g] >> 4)`, codes `q ∈ 0..=3`.
//!
//! Quantization is ggml's `quantize_row_q2_K_ref`, bit for bit: each group
//! of 16 is fitted as `s·q − m` by [`make_qkx2_quants`] (weights |x|,
//! absolute error, 16 trial scales), the 16 scales and the 16 mins are
//! rounded to 4 bits against `max/15`, and the codes are picked again
//! against the scale and min the decoder will see (a group whose 4-bit
//! scale is 0 keeps its fitted codes).

use tern_gguf::GgmlType;

use super::reference::{make_qkx2_quants, nearest_int};
use super::QK_K;
use crate::act::BlockQ8K;
use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::{ActType, Format, TensorScale};

/// One Q2_K super-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ2K {
    /// Per group of 16: scale code (low nibble) and min code (high nibble).
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    /// f16 super-scale of the scales, little-endian.
    pub d: [u8; 2],
    /// f16 super-scale of the mins, little-endian.
    pub dmin: [u8; 2],
}
impl_block!(BlockQ2K, 84);

impl BlockQ2K {
    /// The 2-bit code (0..=3) of block-local element `e`.
    #[inline]
    pub fn code(&self, e: usize) -> u8 {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        (self.qs[32 * h + l] >> (2 * j)) & 3
    }
}

/// Packs 256 codes (0..=3, element order) the way [`BlockQ2K::code`] reads them.
pub(crate) fn pack_2bit(codes: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for h in 0..2 {
        for l in 0..32 {
            let c = |j: usize| codes[128 * h + 32 * j + l];
            qs[32 * h + l] = c(0) | c(1) << 2 | c(2) << 4 | c(3) << 6;
        }
    }
}

fn quantize(x: &[f32], out: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockQ2K>(out)) {
        let mut codes = [0u8; QK_K];
        let (mut scales, mut mins) = ([0.0f32; 16], [0.0f32; 16]);
        let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
        for g in 0..16 {
            let xg = &xb[16 * g..16 * g + 16];
            let weights: [f32; 16] = std::array::from_fn(|i| xg[i].abs());
            (scales[g], mins[g]) =
                make_qkx2_quants(3, xg, &weights, &mut codes[16 * g..16 * g + 16], -0.5, 0.1, 15, true);
            if scales[g] > max_scale {
                max_scale = scales[g];
            }
            if mins[g] > max_min {
                max_min = mins[g];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (code, &s) in b.scales.iter_mut().zip(&scales) {
                // The reference stores the int into a byte: keep its wrapping.
                *code = nearest_int(iscale * s) as u8;
            }
            b.d = f32_to_f16(max_scale / Q4SCALE);
        } else {
            b.scales = [0; 16];
            b.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (code, &m) in b.scales.iter_mut().zip(&mins) {
                *code |= (nearest_int(iscale * m) << 4) as u8;
            }
            b.dmin = f32_to_f16(max_min / Q4SCALE);
        } else {
            b.dmin = f32_to_f16(0.0);
        }
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for g in 0..16 {
            let dg = d * (b.scales[g] & 15) as f32;
            if dg == 0.0 {
                continue;
            }
            let mg = dmin * (b.scales[g] >> 4) as f32;
            for i in 16 * g..16 * g + 16 {
                codes[i] = nearest_int((xb[i] + mg) / dg).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&codes, &mut b.qs);
    }
}

fn dequantize(blocks: &[BlockQ2K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
        for (e, o) in o.iter_mut().enumerate() {
            let sc = b.scales[e / 16];
            let (dl, ml) = (d * (sc & 15) as f32, dmin * (sc >> 4) as f32);
            *o = dl * b.code(e) as f32 - ml;
        }
    }
}

/// Q2_K · Q8_K: per super-block `Σ_g (sc_g & 15)·Σ q·a` and
/// `Σ_g (sc_g >> 4)·bsum_g` in i32 (the mins use the activation group sums),
/// then `d_a·(d·Σscaled − dmin·Σmins)` in f32, blocks summed in row order
/// (Q4_K's arithmetic).
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ2K>(w).iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let (mut sumi, mut summ) = (0i32, 0i32);
        for g in 0..16 {
            let sc = wb.scales[g];
            let s: i32 = (16 * g..16 * g + 16).map(|e| wb.code(e) as i32 * ab.qs[e] as i32).sum();
            sumi += (sc & 15) as i32 * s;
            summ += (sc >> 4) as i32 * ab.bsum(g);
        }
        sum += ab.scale() * (f16_to_f32(wb.d) * sumi as f32 - f16_to_f32(wb.dmin) * summ as f32);
    }
    sum
}

/// Q2_K (ggml id 10).
pub struct Q2K;

impl Format for Q2K {
    const TYPE: GgmlType = GgmlType::Q2_K;
    type Block = BlockQ2K;
    const ACT: ActType = ActType::Q8_K;

    fn dequantize(blocks: &[BlockQ2K], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
