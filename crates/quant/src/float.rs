//! The plain float types F32, F16 and BF16: widening, narrowing and the dot
//! product with f32 activations.
//!
//! Layouts (little-endian, one element per unit, no blocks or scales):
//! * F32  — IEEE binary32, 4 bytes;
//! * F16  — IEEE binary16, 2 bytes; narrowing rounds to nearest, ties to even;
//! * BF16 — the upper 16 bits of an f32, 2 bytes; narrowing rounds to nearest,
//!   ties to even, and keeps NaNs NaN (quieted) as ggml does.

use half::{bf16, f16};
use tern_gguf::GgmlType;

use crate::blocks::{cast_blocks, cast_blocks_mut, impl_block, Block};
use crate::{ActType, Format, TensorScale};

/// One F32 element, little-endian.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockF32(pub [u8; 4]);
impl_block!(BlockF32, 4);

/// One F16 element, little-endian.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockF16(pub [u8; 2]);
impl_block!(BlockF16, 2);

/// One BF16 element, little-endian.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockBF16(pub [u8; 2]);
impl_block!(BlockBF16, 2);

/// A float element: exact widening to f32, rounding narrowing from it.
trait Element: Block {
    fn widen(self) -> f32;
    fn narrow(x: f32) -> Self;
}

impl Element for BlockF32 {
    #[inline]
    fn widen(self) -> f32 {
        f32::from_le_bytes(self.0)
    }
    #[inline]
    fn narrow(x: f32) -> Self {
        BlockF32(x.to_le_bytes())
    }
}

impl Element for BlockF16 {
    #[inline]
    fn widen(self) -> f32 {
        f16::from_le_bytes(self.0).to_f32()
    }
    #[inline]
    fn narrow(x: f32) -> Self {
        BlockF16(f16::from_f32(x).to_le_bytes())
    }
}

impl Element for BlockBF16 {
    #[inline]
    fn widen(self) -> f32 {
        bf16::from_le_bytes(self.0).to_f32()
    }
    #[inline]
    fn narrow(x: f32) -> Self {
        BlockBF16(bf16::from_f32(x).to_le_bytes())
    }
}

fn widen<E: Element>(elems: &[E], out: &mut [f32]) {
    for (o, &e) in out.iter_mut().zip(elems) {
        *o = e.widen();
    }
}

fn narrow<E: Element>(x: &[f32], out: &mut [u8]) {
    for (e, &v) in cast_blocks_mut::<E>(out).iter_mut().zip(x) {
        *e = E::narrow(v);
    }
}

/// Dot of a float weight row with f32 activations given as little-endian f32
/// bytes (the `ActType::F32` row format). Products and the sum are taken in
/// f64 and rounded to f32 once at the end.
fn dot<E: Element>(w: &[u8], act: &[u8]) -> f32 {
    let mut acc = 0.0f64;
    for (&e, a) in cast_blocks::<E>(w).iter().zip(cast_blocks::<BlockF32>(act)) {
        acc += e.widen() as f64 * a.widen() as f64;
    }
    acc as f32
}

/// F32 (ggml id 0).
pub struct F32;
/// F16 (ggml id 1).
pub struct F16;
/// BF16 (ggml id 30).
pub struct BF16;

macro_rules! float_format {
    ($($fmt:ident, $block:ident, $ty:ident;)*) => {$(
        impl Format for $fmt {
            const TYPE: GgmlType = GgmlType::$ty;
            type Block = $block;
            const ACT: ActType = ActType::F32;

            fn dequantize(blocks: &[$block], _outer: f32, out: &mut [f32]) {
                widen(blocks, out);
            }

            fn quantize(x: &[f32], out: &mut [u8]) {
                narrow::<$block>(x, out);
            }

            fn dot(_n: usize, w: &[u8], _tensor: TensorScale, act: &[u8]) -> f32 {
                dot::<$block>(w, act)
            }
        }
    )*};
}

float_format! {
    F32, BlockF32, F32;
    F16, BlockF16, F16;
    BF16, BlockBF16, BF16;
}
