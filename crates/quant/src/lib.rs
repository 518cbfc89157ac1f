//! tern-quant: the numerics of every tensor type tern reads from GGUF — block
//! layouts, dequantization, reference quantizers, and the scalar dot products
//! between one weight row and one quantized activation row. Layouts and
//! formulas follow `docs/spec/quants.md`; this is clear scalar reference code that
//! SIMD kernels elsewhere are checked against.
//!
//! Conventions:
//! * A *row* is `n = ne0` consecutive elements; its bytes are
//!   [`row_bytes`]`(ty, n)` (ik's IQ1_BN/IQ2_BN rows begin with their row
//!   scale). `n` must be a whole number of blocks of `ty`.
//! * I2_S keeps one scale per *tensor* after the data; row functions take it as
//!   a [`TensorScale`] (read it with [`TensorScale::of`] or [`i2s_tensor_scale`]). Every other type
//!   ignores the `TensorScale` argument — pass [`TensorScale::ONE`].
//! * Length mismatches are programmer errors and panic with a message; valid
//!   lengths never panic, whatever the bytes hold.
//!
//! Every format is one implementation of [`Format`] (its block struct, its
//! activation partner, its scalar dequantize, quantize and dot), and the
//! registry in `format.rs` maps each `GgmlType` to it; the functions below
//! dispatch through that registry.
//!
//! Modules: `float` (private) F32/F16/BF16, [`q8_0`], [`q4_0`] (Q4_0 + IQ4_NL),
//! [`q5_0`], [`q4_1`] (Q4_1 + Q5_1), [`q2_0`], [`q1_0`],
//! [`kquants`] (Q2_K/Q3_K/Q4_K/Q5_K/Q6_K), [`iq4_xs`], [`ternary`] (TQ1_0/TQ2_0, IQ1_BN/IQ2_BN,
//! I2_S), [`act`] (activation formats), [`blocks`] (casts and scalar helpers),
//! `format` (the trait and the registry).

pub mod act;
pub mod blocks;
mod float;
mod format;
pub mod iq4_xs;
pub mod kquants;
pub mod q1_0;
pub mod q2_0;
pub mod q4_0;
pub mod q4_1;
pub mod q5_0;
pub mod q8_0;
pub mod ternary;

pub use act::{act_row_bytes, act_type, dequantize_acts, quantize_acts, ActType, BlockQ8K};
pub use blocks::{cast_blocks, cast_blocks_mut, Block};
pub use format::Format;
pub use iq4_xs::BlockIQ4XS;
pub use kquants::{q2k::BlockQ2K, q3k::BlockQ3K, q4k::BlockQ4K, q5k::BlockQ5K, q6k::BlockQ6K};
pub use q1_0::BlockQ1_0;
pub use q2_0::BlockQ2_0;
pub use q4_0::{BlockIQ4NL, BlockQ4_0};
pub use q4_1::{BlockQ4_1, BlockQ5_1};
pub use q5_0::BlockQ5_0;
pub use q8_0::BlockQ8_0;
pub use tern_gguf::GgmlType;
pub use ternary::{bn::BlockIQ1BN, bn::BlockIQ2BN, i2s::BlockI2S, tq::BlockTQ1_0, tq::BlockTQ2_0};

use format::ops;
use ternary::i2s;

/// A scale that belongs to the whole tensor rather than to the row bytes:
/// I2_S's tail scale. `TensorScale::ONE` for every other type (ignored).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorScale(pub f32);

impl TensorScale {
    pub const ONE: TensorScale = TensorScale(1.0);

    /// The scale of a whole tensor of `n_elements` stored as `ty` in `bytes`.
    pub fn of(ty: GgmlType, bytes: &[u8], n_elements: usize) -> TensorScale {
        (ops(ty).tensor_scale)(bytes, n_elements)
    }
}

impl Default for TensorScale {
    fn default() -> Self {
        TensorScale::ONE
    }
}

/// Bytes of one row of `n` elements of `ty` (I2_S: `n/4`, its tail is per tensor).
///
/// Panics if `n` is not a whole number of `ty`'s blocks.
pub fn row_bytes(ty: GgmlType, n: usize) -> usize {
    ty.row_bytes(n as u64).and_then(|b| usize::try_from(b).ok()).unwrap_or_else(|| {
        panic!("a {ty} row of {n} elements is not a whole number of {}-element blocks", ty.block_elems())
    })
}

/// Reads I2_S's per-tensor scale from the tensor's bytes (the f32 at byte
/// `n_elements / 4`).
pub fn i2s_tensor_scale(tensor_bytes: &[u8], n_elements: usize) -> f32 {
    i2s::tensor_scale(tensor_bytes, n_elements)
}

/// Decodes one row of `out.len()` elements; `row.len()` must be
/// `row_bytes(ty, out.len())`.
pub fn dequantize_row(ty: GgmlType, row: &[u8], scale: TensorScale, out: &mut [f32]) {
    assert_eq!(row.len(), row_bytes(ty, out.len()), "{ty} row byte length");
    (ops(ty).dequantize_span)(row, scale, 0, out);
}

/// Quantizes one row `x` into `out` (`row_bytes(ty, x.len())` bytes).
///
/// Ternary quantizers reproduce the peers byte for byte (TQ1_0/TQ2_0 as
/// mainline, IQ1_BN/IQ2_BN as ik); Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_0 and Q1_0 are ggml's
/// reference quantizers; IQ4_NL and the k-quants are our own error-minimizing searches.
///
/// I2_S: a row cannot carry the tensor scale, so its codes are taken against
/// this row's own `max|x|`. That is only right when every row shares the same
/// magnitude (true of ternary-valued weights, where an all-zero row encodes the
/// same either way); for a whole tensor use [`quantize_tensor`] or
/// [`quantize_i2s_tensor`].
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    assert_eq!(out.len(), row_bytes(ty, x.len()), "{ty} row buffer size");
    (ops(ty).quantize)(x, out);
}

/// Quantizes a whole I2_S tensor (`x` flattened, `x.len()` a multiple of 128)
/// into `out` of `x.len()/4 + 32` bytes: packed codes, then the f32 scale
/// `max|x|`, then 28 zero bytes.
pub fn quantize_i2s_tensor(x: &[f32], out: &mut [u8]) {
    i2s::quantize_tensor(x, out);
}

/// Quantizes a whole tensor of rows of `ne0` elements (`x.len()` a multiple of
/// `ne0`) into `out` of `ty.tensor_bytes([ne0, rows])` bytes. Row types are
/// quantized row by row; I2_S as one tensor with its tail.
pub fn quantize_tensor(ty: GgmlType, x: &[f32], ne0: usize, out: &mut [u8]) {
    assert!(ne0 > 0 && x.len().is_multiple_of(ne0), "{} elements are not whole rows of {ne0}", x.len());
    let rb = row_bytes(ty, ne0);
    let rows = x.len() / ne0;
    assert_eq!(out.len(), rb * rows + ty.layout().tensor_suffix, "{ty} tensor buffer size");
    (ops(ty).quantize_tensor)(x, ne0, out);
}

/// Dot product of one weight row (`n` elements of `ty`) with one activation
/// row quantized as `act_type(ty)` by [`quantize_acts`]. For float weights the
/// activation row is `ActType::F32`: `n` little-endian f32s.
///
/// Arithmetic: integer inside each block exactly as the pairing implies (i32
/// sums of int8 × weight levels), each block's result scaled in f32 and the
/// blocks summed in f32; ternary row/tensor scales are applied once at the
/// end. Float weights are accumulated in f64 and rounded once.
pub fn vec_dot(ty: GgmlType, n: usize, w_row: &[u8], scale: TensorScale, act: &[u8]) -> f32 {
    assert_eq!(w_row.len(), row_bytes(ty, n), "{ty} weight row byte length");
    assert_eq!(act.len(), act_row_bytes(act_type(ty), n), "activation row byte length for {ty}");
    (ops(ty).dot)(n, w_row, scale, act)
}

/// Elements decoded at a time by [`vec_dot_f32`]: a multiple of every block size.
const F32_DOT_CHUNK: usize = 256;

/// The "precise" dot product for any weight type with unquantized f32
/// activations (`x.len()` elements), e.g. for output heads: the weights are
/// dequantized 256 elements at a time onto the stack, and products and sums
/// are taken in f64, rounded to f32 once at the end.
pub fn vec_dot_f32(ty: GgmlType, w_row: &[u8], scale: TensorScale, x: &[f32]) -> f32 {
    assert_eq!(w_row.len(), row_bytes(ty, x.len()), "{ty} weight row byte length");
    let dequantize_span = ops(ty).dequantize_span;
    let mut buf = [0.0f32; F32_DOT_CHUNK];
    let mut acc = 0.0f64;
    for (i, xs) in x.chunks(F32_DOT_CHUNK).enumerate() {
        // The last chunk is n mod 256 elements: still whole blocks, since both
        // n and 256 are multiples of the block size.
        let w = &mut buf[..xs.len()];
        dequantize_span(w_row, scale, i * F32_DOT_CHUNK, w);
        acc += w.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>();
    }
    acc as f32
}
