//! The two 4-bit, 32-element formats that share one 18-byte block shape:
//! Q4_0 (ggml id 2, linear levels) and IQ4_NL (id 20, a fixed non-linear table).
//! Both pair with `ActType::Q8_0` activations.
//!
//! ```text
//! f16 d
//! u8  qs[16]   // low nibble of qs[j] = element j, high nibble = element j+16
//! ```
//! * Q4_0:   `x[j] = d * ((qs[j] & 15) - 8)`, `x[j+16] = d * ((qs[j] >> 4) - 8)`.
//! * IQ4_NL: `x[j] = d * KVALUES_IQ4NL[qs[j] & 15]`, `x[j+16] = d * KVALUES_IQ4NL[qs[j] >> 4]`.

use tern_gguf::GgmlType;

use crate::blocks::{amax, cast_blocks, cast_blocks_mut, f16_to_f32, f32_to_f16, impl_block, round_f16, signed_max};
use crate::q8_0::BlockQ8_0;
use crate::{ActType, Format, TensorScale};

/// Elements per Q4_0 / IQ4_NL block.
pub const QK4_0: usize = 32;

/// The IQ4_NL levels (in units of the block scale).
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// One Q4_0 block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4_0 {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    pub qs: [u8; QK4_0 / 2],
}
impl_block!(BlockQ4_0, 18);

/// One IQ4_NL block (same shape as Q4_0, nibbles index [`KVALUES_IQ4NL`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockIQ4NL {
    /// f16 scale, little-endian.
    pub d: [u8; 2],
    pub qs: [u8; QK4_0 / 2],
}
impl_block!(BlockIQ4NL, 18);

/// Q4_0 reference quantizer, byte-identical to ggml's: the element with the
/// largest |x| (sign kept) maps to level -8, so `d = max / -8`; the other
/// levels are `min(15, trunc(x/d + 8.5))`.
fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK4_0).zip(cast_blocks_mut::<BlockQ4_0>(out)) {
        let d = signed_max(xb) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b.d = f32_to_f16(d);
        // x*id + 8.5 lies in [0.5, 16.5]: truncation is floor, and `min` folds 16 into 15.
        let level = |v: f32| ((v * id + 8.5) as u8).min(15);
        for j in 0..QK4_0 / 2 {
            b.qs[j] = level(xb[j]) | (level(xb[j + 16]) << 4);
        }
    }
}

fn dequantize_q4_0(blocks: &[BlockQ4_0], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = d * ((q & 15) as i32 - 8) as f32;
            o[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
        }
    }
}

fn dot_q4_0(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockQ4_0>(w).iter().zip(cast_blocks::<BlockQ8_0>(act)) {
        let mut sumi = 0i32;
        for (j, &q) in wb.qs.iter().enumerate() {
            sumi += ((q & 15) as i32 - 8) * ab.qs[j] as i32 + ((q >> 4) as i32 - 8) * ab.qs[j + 16] as i32;
        }
        sum += f16_to_f32(wb.d) * ab.scale() * sumi as f32;
    }
    sum
}

/// Index of the table level nearest to `v` (lower index on ties).
fn nearest_iq4nl(v: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = f32::INFINITY;
    for (i, &k) in KVALUES_IQ4NL.iter().enumerate() {
        let err = (v - k as f32).abs();
        if err < best_err {
            best_err = err;
            best = i as u8;
        }
    }
    best
}

/// For a trial inverse scale `id`, picks each element's nearest level and
/// returns the least-squares scale for those levels with its squared error.
fn iq4nl_trial(xb: &[f32], id: f32) -> (f32, f32) {
    let (mut sxl, mut sll) = (0.0f32, 0.0f32);
    for &v in xb {
        let l = KVALUES_IQ4NL[nearest_iq4nl(v * id) as usize] as f32;
        sxl += v * l;
        sll += l * l;
    }
    let s = if sll > 0.0 { sxl / sll } else { 0.0 };
    let err: f32 = xb
        .iter()
        .map(|&v| {
            let l = KVALUES_IQ4NL[nearest_iq4nl(v * id) as usize] as f32;
            (v - s * l) * (v - s * l)
        })
        .sum();
    (s, err)
}

/// IQ4_NL quantizer (not bit-identical to ggml's; error-minimizing): the
/// largest-|x| element is tried against both ends of the asymmetric table
/// (-127 and +113) with the mapping stretched in steps of one level unit,
/// each trial's scale refitted by least squares, and the lowest squared error
/// wins. Levels are then re-picked against the f16-rounded scale.
fn quantize_iq4nl(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(QK4_0).zip(cast_blocks_mut::<BlockIQ4NL>(out)) {
        if amax(xb) == 0.0 {
            b.d = f32_to_f16(0.0);
            b.qs = [0x88; 16]; // level 8 (= +1) for every element; the scale makes them 0
            continue;
        }
        let max = signed_max(xb);
        let mut best = (0.0f32, f32::INFINITY);
        for edge in [-127.0f32, 113.0] {
            for step in -10..=10 {
                let trial = iq4nl_trial(xb, (edge + step as f32) / max);
                if trial.1 < best.1 {
                    best = trial;
                }
            }
        }
        let d = round_f16(best.0);
        b.d = f32_to_f16(best.0);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for j in 0..QK4_0 / 2 {
            b.qs[j] = nearest_iq4nl(xb[j] * id) | (nearest_iq4nl(xb[j + 16] * id) << 4);
        }
    }
}

fn dequantize_iq4nl(blocks: &[BlockIQ4NL], out: &mut [f32]) {
    for (b, o) in blocks.iter().zip(out.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(b.d);
        for (j, &q) in b.qs.iter().enumerate() {
            o[j] = d * KVALUES_IQ4NL[(q & 15) as usize] as f32;
            o[j + 16] = d * KVALUES_IQ4NL[(q >> 4) as usize] as f32;
        }
    }
}

fn dot_iq4nl(w: &[u8], act: &[u8]) -> f32 {
    let mut sum = 0.0f32;
    for (wb, ab) in cast_blocks::<BlockIQ4NL>(w).iter().zip(cast_blocks::<BlockQ8_0>(act)) {
        let mut sumi = 0i32;
        for (j, &q) in wb.qs.iter().enumerate() {
            sumi += KVALUES_IQ4NL[(q & 15) as usize] as i32 * ab.qs[j] as i32
                + KVALUES_IQ4NL[(q >> 4) as usize] as i32 * ab.qs[j + 16] as i32;
        }
        sum += f16_to_f32(wb.d) * ab.scale() * sumi as f32;
    }
    sum
}

/// Q4_0 (ggml id 2).
pub struct Q4_0;

impl Format for Q4_0 {
    const TYPE: GgmlType = GgmlType::Q4_0;
    type Block = BlockQ4_0;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockQ4_0], _outer: f32, out: &mut [f32]) {
        dequantize_q4_0(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_q4_0(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot_q4_0(w, act)
    }
}

/// IQ4_NL (ggml id 20).
pub struct IQ4NL;

impl Format for IQ4NL {
    const TYPE: GgmlType = GgmlType::IQ4_NL;
    type Block = BlockIQ4NL;
    const ACT: ActType = ActType::Q8_0;

    fn dequantize(blocks: &[BlockIQ4NL], _outer: f32, out: &mut [f32]) {
        dequantize_iq4nl(blocks, out);
    }

    fn quantize(x: &[f32], out: &mut [u8]) {
        quantize_iq4nl(x, out);
    }

    fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
        dot_iq4nl(w, act)
    }
}
