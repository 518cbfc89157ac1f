//! One implementation per tensor format, and the one registry that maps a
//! [`GgmlType`] to it.
//!
//! A format is a marker type implementing [`Format`]: its block struct, the
//! activation format its dot product pairs with, and its scalar numerics
//! (dequantize, quantize, dot). The registry ([`ops`]) turns each impl into a
//! table of function pointers ([`FormatOps`]) once, at compile time, and
//! checks there that the block struct has the size `GgmlType::layout` gives.
//! Adding a format is one impl plus one line in [`ops`].

use crate::blocks::{cast_blocks, Block};
use crate::float::{BF16, F16, F32};
use crate::iq4_xs::IQ4XS;
use crate::kquants::{q2k::Q2K, q3k::Q3K, q4k::Q4K, q5k::Q5K, q6k::Q6K};
use crate::q1_0::Q1_0;
use crate::q2_0::Q2_0;
use crate::q4_0::{IQ4NL, Q4_0};
use crate::q4_1::{Q4_1, Q5_1};
use crate::q5_0::Q5_0;
use crate::q8_0::Q8_0;
use crate::ternary::{bn::IQ1BN, bn::IQ2BN, i2s::I2S, tq::TQ1_0, tq::TQ2_0};
use crate::{row_bytes, ActType, GgmlType, TensorScale};

/// One tensor format: its storage, its activation partner and its scalar
/// numerics. The `dot` here is the reference every fast kernel of the format
/// is tested against.
///
/// Rows are `n` elements (`n` a multiple of the block) stored as an optional
/// row prefix (`TYPE.layout().row_prefix` bytes) followed by whole blocks.
pub trait Format {
    /// The GGUF type this is the implementation of.
    const TYPE: GgmlType;
    /// One block as stored (`#[repr(C)]`, alignment 1); its size is checked
    /// against `TYPE.layout().block_bytes` when the registry is built.
    type Block: Block;
    /// The activation format [`Format::dot`] multiplies with.
    const ACT: ActType;

    /// The scale kept outside the blocks that multiplies every value of a
    /// row: the row prefix (IQ1_BN, IQ2_BN) or the tensor's scale (I2_S).
    /// Formats without one return 1, which [`Format::dequantize`] ignores.
    fn outer_scale(row: &[u8], tensor: TensorScale) -> f32 {
        let _ = (row, tensor);
        1.0
    }

    /// Decodes whole blocks into `out` (`blocks.len()` × block elements),
    /// given the row's [`Format::outer_scale`].
    fn dequantize(blocks: &[Self::Block], outer: f32, out: &mut [f32]);

    /// Quantizes the row `x` into `out` (its prefix, if any, then its blocks).
    fn quantize(x: &[f32], out: &mut [u8]);

    /// The scalar dot product of weight row `w` (`n` elements) with one
    /// activation row quantized as [`Format::ACT`].
    fn dot(n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32;

    /// The scale a whole tensor of `n_elements` keeps beside its rows (I2_S);
    /// `TensorScale::ONE` for the others.
    fn tensor_scale(tensor: &[u8], n_elements: usize) -> TensorScale {
        let _ = (tensor, n_elements);
        TensorScale::ONE
    }

    /// Quantizes a whole tensor of rows of `ne0` elements into `out`: row by
    /// row, unless the format keeps data per tensor (I2_S).
    fn quantize_tensor(x: &[f32], ne0: usize, out: &mut [u8]) {
        let rb = row_bytes(Self::TYPE, ne0);
        for (xr, o) in x.chunks_exact(ne0).zip(out.chunks_exact_mut(rb)) {
            Self::quantize(xr, o);
        }
    }
}

/// A format's operations as plain data, as the registry hands them out.
/// Lengths are checked by the public functions in `lib.rs` before these run.
#[derive(Clone, Copy)]
pub(crate) struct FormatOps {
    pub act: ActType,
    /// `(row, tensor scale, first element, out)`: decodes the whole blocks
    /// covering elements `first..first + out.len()` of `row`.
    pub dequantize_span: fn(&[u8], TensorScale, usize, &mut [f32]),
    pub quantize: fn(&[f32], &mut [u8]),
    pub dot: fn(usize, &[u8], TensorScale, &[u8]) -> f32,
    pub tensor_scale: fn(&[u8], usize) -> TensorScale,
    pub quantize_tensor: fn(&[f32], usize, &mut [u8]),
}

impl FormatOps {
    /// The table of `F`, after checking at compile time that its block struct
    /// has the size the GGUF layout says.
    const fn of<F: Format>() -> FormatOps {
        assert!(std::mem::size_of::<F::Block>() == F::TYPE.layout().block_bytes, "block struct size");
        FormatOps {
            act: F::ACT,
            dequantize_span: dequantize_span::<F>,
            quantize: F::quantize,
            dot: F::dot,
            tensor_scale: F::tensor_scale,
            quantize_tensor: F::quantize_tensor,
        }
    }
}

fn dequantize_span<F: Format>(row: &[u8], scale: TensorScale, start: usize, out: &mut [f32]) {
    let l = F::TYPE.layout();
    debug_assert!(start.is_multiple_of(l.block_elems) && out.len().is_multiple_of(l.block_elems));
    let first = l.row_prefix + start / l.block_elems * l.block_bytes;
    let bytes = &row[first..first + out.len() / l.block_elems * l.block_bytes];
    F::dequantize(cast_blocks::<F::Block>(bytes), F::outer_scale(row, scale), out);
}

/// The registry: every `GgmlType` and its implementation. Each entry is a
/// constant, so the block-size check of [`FormatOps::of`] and the check that
/// the impl is the entry's type run at compile time.
macro_rules! registry {
    ($ty:expr; $($name:ident => $fmt:ty,)*) => {
        match $ty {
            $(GgmlType::$name => {
                const OPS: FormatOps = {
                    assert!(<$fmt as Format>::TYPE.id() == GgmlType::$name.id(), "registered under its own type");
                    FormatOps::of::<$fmt>()
                };
                &OPS
            })*
        }
    };
}

/// The operations of `ty`.
pub(crate) const fn ops(ty: GgmlType) -> &'static FormatOps {
    registry! { ty;
        F32 => F32,
        F16 => F16,
        BF16 => BF16,
        Q8_0 => Q8_0,
        Q4_0 => Q4_0,
        Q4_1 => Q4_1,
        Q5_0 => Q5_0,
        Q5_1 => Q5_1,
        IQ4_NL => IQ4NL,
        IQ4_XS => IQ4XS,
        Q2_K => Q2K,
        Q3_K => Q3K,
        Q4_K => Q4K,
        Q5_K => Q5K,
        Q6_K => Q6K,
        TQ1_0 => TQ1_0,
        TQ2_0 => TQ2_0,
        IQ1_BN => IQ1BN,
        IQ2_BN => IQ2BN,
        I2_S => I2S,
        Q2_0 => Q2_0,
        Q1_0 => Q1_0,
    }
}
