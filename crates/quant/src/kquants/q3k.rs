//! Q3_K (ggml id 11): 256 elements in 110 bytes, 3.4375 bpw.
//!
//! ```text
//! u8  hmask[32]   // third bit: element 128h + 32j + l is bit 4h + j of hmask[l]
//! u8  qs[64]      // low two bits, placed as Q2_K's codes (bits 2j..2j+2 of qs[32h + l])
//! u8  scales[12]  // sixteen 6-bit codes, one per group g = element/16 (see below)
//! f16 d           // super-scale, at the END
//! ```
//! The level is `low + 4·bit − 4` (−4..=3; a clear bit subtracts 4) and
//! `x = d·(sc_g − 32)·level`. Scale code `sc_g` (0..=63): its low four bits
//! are the low nibble of `scales[g]` for g < 8 and the high nibble of
//! `scales[g − 8]` for g ≥ 8; its top two bits are bits `2·(g/4)..+2` of
//! `scales[8 + g%4]`.
//!
//! Quantization is ggml's `quantize_row_q3_K_ref`, bit for bit: each group
//! of 16 is fitted symmetrically by [`make_q3_quants`] (levels −4..=3,
//! weights x², a few passes of single-level moves), the sixteen signed
//! scales are rounded to 6 bits against `d = max/−32` (the scale of largest
//! magnitude, sign kept, takes code 0), and the levels are picked again as
//! `round(x / (d·(sc − 32)))` with the f16 `d` (a group whose scale is 0
//! keeps its fitted levels).

use tern_gguf::GgmlType;

use super::q2k::pack_2bit;
use super::reference::{make_q3_quants, nearest_int};
use super::QK_K;
use crate::act::BlockQ8K;
use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::{ActType, Format, TensorScale};

/// One Q3_K super-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    /// f16 super-scale, little-endian.
    pub d: [u8; 2],
}
impl_block!(BlockQ3K, 110);

/// The sixteen 6-bit scale codes (0..=63) of a Q3_K block's `scales[12]`.
pub fn q3k_scale_codes(q: &[u8; 12]) -> [u8; 16] {
    std::array::from_fn(|g| {
        let low = if g < 8 { q[g] & 15 } else { q[g - 8] >> 4 };
        let high = (q[8 + g % 4] >> (2 * (g / 4))) & 3;
        low | high << 4
    })
}

impl BlockQ3K {
    /// The level (−4..=3) of block-local element `e`.
    #[inline]
    pub fn level(&self, e: usize) -> i32 {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let low = (self.qs[32 * h + l] >> (2 * j)) & 3;
        let bit = (self.hmask[l] >> (4 * h + j)) & 1;
        (low | bit << 2) as i32 - 4
    }
}

fn quantize(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockQ3K>(out)) {
        // Levels + 4 (0..=7), element order.
        let mut lv = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
        for g in 0..16 {
            scales[g] = make_q3_quants(4, &xb[16 * g..16 * g + 16], &mut lv[16 * g..16 * g + 16]);
            if scales[g].abs() > amax {
                amax = scales[g].abs();
                max_scale = scales[g];
            }
        }
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for (g, &s) in scales.iter().enumerate() {
                // The reference keeps the rounded value in an int8 before clamping.
                let l = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if g < 8 {
                    b.scales[g] = l & 15;
                } else {
                    b.scales[g - 8] |= (l & 15) << 4;
                }
                b.scales[8 + g % 4] |= (l >> 4) << (2 * (g / 4));
            }
            b.d = f32_to_f16(1.0 / iscale);
        } else {
            b.d = f32_to_f16(0.0);
        }
        let d = f16_to_f32(b.d);
        for (g, &sc) in q3k_scale_codes(&b.scales).iter().enumerate() {
            let dg = d * (sc as i32 - 32) as f32;
            if dg == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                lv[i] = (nearest_int(xb[i] / dg).clamp(-4, 3) + 4) as i8;
            }
        }
        b.hmask = [0; QK_K / 8];
        let mut low = [0u8; QK_K];
        for (e, (&q, low)) in lv.iter().zip(low.iter_mut()).enumerate() {
            let mut q = q as u8;
            if q > 3 {
                b.hmask[e % 32] |= 1 << (e / 32);
                q -= 4;
            }
            *low = q;
        }
        pack_2bit(&low, &mut b.qs);
    }
}

fn dequantize(blocks: &[BlockQ3K], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let sc = q3k_scale_codes(&b.scales);
        for (e, o) in o.iter_mut().enumerate() {
            let dl = d * (sc[e / 16] as i32 - 32) as f32;
            *o = dl * b.level(e) as f32;
        }
    }
}

/// Q3_K · Q8_K: `Σ_g (sc_g − 32)·Σ level·a` over the groups of 16 in i32,
/// then `d_a · d · sum` in f32 (Q6_K's arithmetic), blocks summed in row
/// order.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ3K>(w).iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let sc = q3k_scale_codes(&wb.scales);
        let mut sumi = 0i32;
        for (g, &sc) in sc.iter().enumerate() {
            let s: i32 = (16 * g..16 * g + 16).map(|e| wb.level(e) * ab.qs[e] as i32).sum();
            sumi += (sc as i32 - 32) * s;
        }
        sum += ab.scale() * f16_to_f32(wb.d) * sumi as f32;
    }
    sum
}

/// Q3_K (ggml id 11).
pub struct Q3K;

impl Format for Q3K {
    const TYPE: GgmlType = GgmlType::Q3_K;
    type Block = BlockQ3K;
    const ACT: ActType = ActType::Q8_K;

    fn dequantize(blocks: &[BlockQ3K], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
