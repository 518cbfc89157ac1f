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

/// Bytes of one element.
fn elem_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::BF16 => 2,
        _ => unreachable!("{ty} is not a float type"),
    }
}

/// Widens `out.len()` elements of `ty` from `bytes`.
pub(crate) fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * elem_bytes(ty));
    match ty {
        GgmlType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        _ => unreachable!("{ty} is not a float type"),
    }
}

/// Stores `x` as `ty` into `out` (`x.len()` elements).
pub(crate) fn quantize(ty: GgmlType, x: &[f32], out: &mut [u8]) {
    debug_assert_eq!(out.len(), x.len() * elem_bytes(ty));
    match ty {
        GgmlType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&bf16::from_f32(*v).to_le_bytes());
            }
        }
        _ => unreachable!("{ty} is not a float type"),
    }
}

/// Dot of a float weight row with f32 activations given as little-endian f32
/// bytes (the `ActType::F32` row format). Products and the sum are taken in
/// f64 and rounded to f32 once at the end.
pub(crate) fn dot(ty: GgmlType, w: &[u8], act: &[u8]) -> f32 {
    let eb = elem_bytes(ty);
    debug_assert_eq!(w.len() / eb, act.len() / 4);
    let mut acc = 0.0f64;
    for (wb, ab) in w.chunks_exact(eb).zip(act.chunks_exact(4)) {
        let wv = match ty {
            GgmlType::F32 => f32::from_le_bytes([wb[0], wb[1], wb[2], wb[3]]),
            GgmlType::F16 => f16::from_le_bytes([wb[0], wb[1]]).to_f32(),
            _ => bf16::from_le_bytes([wb[0], wb[1]]).to_f32(),
        };
        let av = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        acc += wv as f64 * av as f64;
    }
    acc as f32
}
