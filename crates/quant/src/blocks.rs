//! Plumbing shared by every block struct: the [`Block`] marker trait, checked
//! zero-copy casts between unaligned byte slices and block slices, and the
//! little-endian scalar conversions the block fields need.
//!
//! Every block struct in this crate is `#[repr(C)]` and built only from `u8`/`i8`
//! arrays (f16, f32 and i16 fields are stored as `[u8; 2]`/`[u8; 4]`), so its
//! alignment is 1, it has no padding, and every bit pattern is a valid value.
//! That is what makes reinterpreting a tensor's mmapped bytes as `&[Block]` sound
//! wherever the bytes happen to sit.

pub(crate) mod sealed {
    /// Keeps [`super::Block`] implementable only inside this crate.
    pub trait Sealed {}
}

/// A plain-bytes block layout that can be viewed in place over `&[u8]`.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, have alignment 1, contain no padding and
/// accept every bit pattern. The trait is sealed: only this crate's blocks
/// (declared through `impl_block!`, which checks size and alignment at compile
/// time) implement it.
pub unsafe trait Block: sealed::Sealed + Copy + 'static {}

/// Declares a block type: checks its size and alignment at compile time and
/// implements [`Block`] for it.
macro_rules! impl_block {
    ($t:ty, $size:expr) => {
        const _: () = assert!(std::mem::size_of::<$t>() == $size);
        const _: () = assert!(std::mem::align_of::<$t>() == 1);
        impl crate::blocks::sealed::Sealed for $t {}
        // SAFETY: `$t` is `#[repr(C)]` with only u8/i8 array fields (alignment 1,
        // asserted above); with alignment 1 there is no padding, and byte arrays
        // accept every bit pattern.
        unsafe impl crate::blocks::Block for $t {}
    };
}
pub(crate) use impl_block;

/// Views `bytes` as a slice of blocks.
///
/// Panics if `bytes.len()` is not a multiple of the block size (a caller passed
/// a row of the wrong length — a programmer error).
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    let size = std::mem::size_of::<B>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {size}-byte blocks", bytes.len());
    // SAFETY: `B: Block` guarantees alignment 1 (any address is aligned), no
    // padding and validity of every bit pattern; the length covers exactly
    // `len / size` blocks, and the lifetime is tied to `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// Mutable counterpart of [`cast_blocks`]; same preconditions.
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    let size = std::mem::size_of::<B>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {size}-byte blocks", bytes.len());
    // SAFETY: as in `cast_blocks`; additionally any value written through the
    // result is a valid byte pattern, and the exclusive borrow is carried over.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / size) }
}

/// Reads a little-endian IEEE half.
#[inline]
pub(crate) fn f16_to_f32(b: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(b).to_f32()
}

/// Rounds to the nearest IEEE half (ties to even) and returns its little-endian bytes.
#[inline]
pub(crate) fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// Rounds `x` through f16 and back: the scale a decoder will actually see.
#[inline]
pub(crate) fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

#[inline]
pub(crate) fn read_f32(b: [u8; 4]) -> f32 {
    f32::from_le_bytes(b)
}

/// Reads a little-endian f32 at `offset` of `bytes`.
#[inline]
pub(crate) fn f32_at(bytes: &[u8], offset: usize) -> f32 {
    f32::from_le_bytes(bytes[offset..offset + 4].try_into().expect("4 bytes"))
}

/// Largest |x| of a slice (0 for an empty slice; NaNs are ignored).
#[inline]
pub(crate) fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// The element with the largest |x|, keeping its sign (the first one on ties).
/// Several reference quantizers map this element to the most negative level.
#[inline]
pub(crate) fn signed_max(x: &[f32]) -> f32 {
    let mut best = 0.0f32;
    for &v in x {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

/// Views bytes as signed bytes (same size, alignment and validity).
#[inline]
pub(crate) fn as_i8(bytes: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have identical size and alignment and every bit
    // pattern is valid for both; the lifetime is carried over.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<i8>(), bytes.len()) }
}
