//! Activation row formats: how the f32 input of a matrix-vector product is
//! quantized before it meets a weight row in [`crate::vec_dot`]. Each weight
//! type has exactly one partner ([`act_type`]); these formats never appear in
//! model files.
//!
//! | [`ActType`] | block | layout | quantization |
//! |---|---:|---|---|
//! | `F32` | 1 | little-endian f32 per element | none |
//! | `Q8_0` | 32 | [`BlockQ8_0`]: `f16 d, i8 qs[32]` (34 B) | `d = amax/127`, `roundf` |
//! | `Q8_K` | 256 | [`BlockQ8K`]: `f32 d, i8 qs[256], i16 bsums[16]` (292 B) | `d = amax/127`, `roundf` |
//! | `Q8_K64` | 64 | [`BlockQ8K64`]: `f32 d, i8 qs[64]` (68 B) | `d = amax/127`, `roundf` |
//! | `Q8_Row` | row | `f32 d, i32 sum, i8 qs[n]` (8 + n B) | see below |
//!
//! `roundf` is round half away from zero. Q8_K uses the plain positive
//! `amax/127` scale (not ggml's signed `-127/max` quirk: the dot product does
//! not depend on the sign convention, only on consistency).
//!
//! `Q8_Row` is the training-faithful BitNet per-token quantization
//! (`docs/spec/bitnet.md` §5.1): one scale for the whole row,
//! `s_a = 127 / max(amax, 1e-5)`, `q = clamp(round_half_even(x·s_a), −128, 127)`,
//! stored as `d = 1/s_a`, plus `sum = Σq` so a ternary dot can be computed as
//! `Σ code·q − Σ q` with codes 0..2.

use tern_gguf::GgmlType;

use crate::blocks::{amax, as_i8, cast_blocks, cast_blocks_mut, f32_at, impl_block, read_f32};
use crate::kquants::QK_K;
use crate::q8_0::{self, BlockQ8_0, QK8_0};

/// The activation format a weight type is multiplied with.
#[allow(non_camel_case_types)] // mirrors the ggml type names
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActType {
    F32,
    Q8_0,
    Q8_K,
    Q8_Row,
}

/// The activation partner of each weight type (`Format::ACT` of its implementation).
pub const fn act_type(ty: GgmlType) -> ActType {
    crate::format::ops(ty).act
}

/// Bytes of the `Q8_Row` header (f32 d, i32 sum) before the `n` quants.
pub const Q8_ROW_HEADER: usize = 8;

/// One `Q8_K` activation block.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ8K {
    /// f32 scale, little-endian.
    pub d: [u8; 4],
    pub qs: [i8; QK_K],
    /// `bsums[g] = Σ qs[16g..16g+16]`, little-endian i16.
    pub bsums: [[u8; 2]; QK_K / 16],
}
impl_block!(BlockQ8K, 292);

impl BlockQ8K {
    #[inline]
    pub fn scale(&self) -> f32 {
        read_f32(self.d)
    }

    /// Sum of the 16 quants of group `g`.
    #[inline]
    pub fn bsum(&self, g: usize) -> i32 {
        i16::from_le_bytes(self.bsums[g]) as i32
    }

    /// Sum of all 256 quants.
    #[inline]
    pub fn sum(&self) -> i32 {
        (0..QK_K / 16).map(|g| self.bsum(g)).sum()
    }
}

impl ActType {
    /// Elements per block: a row length must be a multiple of it (`Q8_Row`: 1).
    pub const fn block_elems(self) -> usize {
        match self {
            ActType::F32 | ActType::Q8_Row => 1,
            ActType::Q8_0 => QK8_0,
            ActType::Q8_K => QK_K,
        }
    }
}

/// Bytes of one quantized activation row of `n` elements.
///
/// Panics if `n` is not a multiple of `act.block_elems()`.
pub fn act_row_bytes(act: ActType, n: usize) -> usize {
    let be = act.block_elems();
    assert!(n.is_multiple_of(be), "activation row of {n} elements is not whole {act:?} blocks of {be}");
    match act {
        ActType::F32 => 4 * n,
        ActType::Q8_0 => n / QK8_0 * std::mem::size_of::<BlockQ8_0>(),
        ActType::Q8_K => n / QK_K * std::mem::size_of::<BlockQ8K>(),
        ActType::Q8_Row => Q8_ROW_HEADER + n,
    }
}

/// `round(x / d)` with `d = amax/127` over `x` (0 when `x` is all zero); returns `d`.
fn quantize_absmax(x: &[f32], qs: &mut [i8]) -> f32 {
    let d = amax(x) / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    d
}

/// Quantizes an activation row `x` into `out` (`act_row_bytes(act, x.len())` bytes).
pub fn quantize_acts(act: ActType, x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), act_row_bytes(act, x.len()), "activation buffer size");
    match act {
        ActType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        ActType::Q8_0 => q8_0::quantize(x, out),
        ActType::Q8_K => {
            for (xb, b) in x.chunks_exact(QK_K).zip(cast_blocks_mut::<BlockQ8K>(out)) {
                b.d = quantize_absmax(xb, &mut b.qs).to_le_bytes();
                for (g, s) in b.bsums.iter_mut().enumerate() {
                    // |Σ of 16 quants| ≤ 16·127 fits i16.
                    let sum: i32 = b.qs[16 * g..16 * g + 16].iter().map(|&q| q as i32).sum();
                    *s = (sum as i16).to_le_bytes();
                }
            }
        }
        ActType::Q8_Row => {
            let s_a = 127.0 / amax(x).max(1e-5);
            let (head, qs) = out.split_at_mut(Q8_ROW_HEADER);
            let mut sum = 0i32;
            for (q, &v) in qs.iter_mut().zip(x) {
                let qi = (v * s_a).round_ties_even().clamp(-128.0, 127.0) as i8;
                sum += qi as i32;
                *q = qi as u8;
            }
            head[..4].copy_from_slice(&(1.0 / s_a).to_le_bytes());
            head[4..].copy_from_slice(&sum.to_le_bytes());
        }
    }
}

/// Splits a `Q8_Row` row into `(d, Σq, qs)`.
pub fn q8_row_parts(bytes: &[u8]) -> (f32, i32, &[i8]) {
    let (head, qs) = bytes.split_at(Q8_ROW_HEADER);
    let sum = i32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
    (f32_at(head, 0), sum, as_i8(qs))
}

/// Expands a quantized activation row back to f32 (`out.len()` elements):
/// the values the integer dot products effectively multiply with.
pub fn dequantize_acts(act: ActType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(bytes.len(), act_row_bytes(act, out.len()), "activation row size");
    match act {
        ActType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        ActType::Q8_0 => q8_0::dequantize(cast_blocks(bytes), out),
        ActType::Q8_K => {
            for (b, o) in cast_blocks::<BlockQ8K>(bytes).iter().zip(out.chunks_exact_mut(QK_K)) {
                let d = b.scale();
                for (o, &q) in o.iter_mut().zip(&b.qs) {
                    *o = d * q as f32;
                }
            }
        }
        ActType::Q8_Row => {
            let (d, _, qs) = q8_row_parts(bytes);
            for (o, &q) in out.iter_mut().zip(qs) {
                *o = d * q as f32;
            }
        }
    }
}
