//! IQ4_XS (ggml id 23): 256 elements in 136 bytes, 4.25 bpw: IQ4_NL's
//! non-linear table with a 6-bit signed scale per 32 under one f16
//! super-scale. Pairs with `ActType::Q8_K` activations, as ggml's
//! `vec_dot_type` does.
//!
//! ```text
//! f16 d
//! u16 scales_h     // bits 2b..2b+2: top two bits of sub-block b's scale code
//! u8  scales_l[4]  // nibble b%2 of scales_l[b/2]: its low four bits
//! u8  qs[128]      // sub-block b = qs[16b..16b+16]: low nibbles elements
//!                  // 32b..32b+16, high nibbles 32b+16..32b+32
//! ```
//! With the 6-bit code `ls_b` (0..=63),
//! `x = d·(ls_b − 32)·KVALUES_IQ4NL[nibble]`.
//!
//! Quantization is ggml's `quantize_row_iq4_xs_ref` (its `iq4_nl` fitting
//! without importance weights), bit for bit: per sub-block, weights `x²`,
//! the scale `max/127` and 15 trial inverse scales `(t − 127)/max`,
//! `t ∈ −7..=7`, each with the nearest table entries and its weighted
//! least-squares scale, the best kept; then the super-scale
//! `d = −max_scale/32` (the sub-block scale of largest magnitude, sign
//! kept), each sub-block's code `round(s/d)` clamped to −32..=31 and its
//! entries picked again against `d·code` (with the unrounded `d`).

use tern_gguf::GgmlType;

use crate::act::BlockQ8K;
use crate::blocks::{cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block};
use crate::kquants::reference::{best_index, nearest_int};
use crate::kquants::QK_K;
use crate::q4_0::KVALUES_IQ4NL;
use crate::{ActType, Format, TensorScale};

/// One IQ4_XS super-block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4XS {
    /// f16 super-scale, little-endian.
    pub d: [u8; 2],
    /// Top two bits of the eight scale codes, a little-endian u16.
    pub scales_h: [u8; 2],
    /// Low four bits of the eight scale codes, two a byte.
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockIQ4XS, 136);

impl BlockIQ4XS {
    /// The 6-bit scale code (0..=63) of sub-block `b` (0..8); its scale is `d·(code − 32)`.
    #[inline]
    pub fn scale_code(&self, b: usize) -> u8 {
        let low = (self.scales_l[b / 2] >> (4 * (b % 2))) & 15;
        let high = (u16::from_le_bytes(self.scales_h) >> (2 * b)) & 3;
        low | (high as u8) << 4
    }

    /// The table index (0..=15) of block-local element `e`.
    #[inline]
    pub fn index(&self, e: usize) -> u8 {
        let (b, j) = (e / 32, e % 32);
        let q = self.qs[16 * b + j % 16];
        if j < 16 {
            q & 15
        } else {
            q >> 4
        }
    }
}

/// The reference's trial count (`ntry`).
const NTRY: i32 = 7;

fn quantize(x: &[f32], out: &mut [u8]) {
    let kv = &KVALUES_IQ4NL;
    let v0 = kv[0] as i32;
    for (xs, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockIQ4XS>(out)) {
        let mut scales = [0.0f32; 8];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for (ib, xb) in xs.chunks_exact(32).enumerate() {
            let weight: [f32; 32] = std::array::from_fn(|j| xb[j] * xb[j]);
            let (mut max, mut amax) = (0.0f32, 0.0f32);
            for &v in xb {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            if amax < 1e-15 {
                scales[ib] = 0.0;
                continue;
            }
            // Σ w·q·x and Σ w·q² over the nearest entries for inverse scale `id`.
            let sums = |id: f32| {
                let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
                for (&v, &w) in xb.iter().zip(&weight) {
                    let q = kv[best_index(kv, id * v) as usize] as f32;
                    sumqx += w * q * v;
                    sumq2 += w * q * q;
                }
                (sumqx, sumq2)
            };
            let d0 = -max / v0 as f32;
            let (sumqx, sumq2) = sums(1.0 / d0);
            let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
            let mut best = d * sumqx;
            for itry in -NTRY..=NTRY {
                let (sumqx, sumq2) = sums((itry + v0) as f32 / max);
                if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            scales[ib] = d;
            if d.abs() > amax_scale {
                amax_scale = d.abs();
                max_scale = d;
            }
        }
        let d = -max_scale / 32.0;
        b.d = f32_to_f16(d);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut scales_h = 0u16;
        b.scales_l = [0; 4];
        let mut idx = [0u8; QK_K];
        for (ib, xb) in xs.chunks_exact(32).enumerate() {
            let l = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for (i, &v) in idx[32 * ib..32 * ib + 32].iter_mut().zip(xb) {
                *i = best_index(kv, idl * v);
            }
            let code = (l + 32) as u8;
            b.scales_l[ib / 2] |= (code & 15) << (4 * (ib % 2));
            scales_h |= ((code >> 4) as u16) << (2 * ib);
        }
        b.scales_h = scales_h.to_le_bytes();
        for ib in 0..8 {
            for j in 0..16 {
                b.qs[16 * ib + j] = idx[32 * ib + j] | idx[32 * ib + 16 + j] << 4;
            }
        }
    }
}

fn dequantize(blocks: &[BlockIQ4XS], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        for (e, o) in o.iter_mut().enumerate() {
            let dl = d * (b.scale_code(e / 32) as i32 - 32) as f32;
            *o = dl * KVALUES_IQ4NL[b.index(e) as usize] as f32;
        }
    }
}

/// IQ4_XS · Q8_K: `Σ_b (ls_b − 32)·Σ kv·a` over the sub-blocks of 32 in
/// i32, then `d_a · d · sum` in f32 (Q6_K's arithmetic), blocks summed in
/// row order.
fn dot(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockIQ4XS>(w).iter().zip(cast_blocks::<BlockQ8K>(act)) {
        let mut sumi = 0i32;
        for sb in 0..8 {
            let s: i32 =
                (32 * sb..32 * sb + 32).map(|e| KVALUES_IQ4NL[wb.index(e) as usize] as i32 * ab.qs[e] as i32).sum();
            sumi += (wb.scale_code(sb) as i32 - 32) * s;
        }
        sum += ab.scale() * f16_to_f32(wb.d) * sumi as f32;
    }
    sum
}

/// IQ4_XS (ggml id 23).
pub struct IQ4XS;

impl Format for IQ4XS {
    const TYPE: GgmlType = GgmlType::IQ4_XS;
    type Block = BlockIQ4XS;
    const ACT: ActType = ActType::Q8_K;

    fn dequantize(blocks: &[BlockIQ4XS], _outer: f32, out: &mut [f32]) {
        dequantize(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot(w, act)
    }
}
