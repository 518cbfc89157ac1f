//! The ternary (BitNet b1.58) weight formats. Every one stores codes
//! `c ∈ {0, 1, 2}` meaning `−1, 0, +1`, times a scale whose scope differs:
//!
//! | format | scale | module |
//! |---|---|---|
//! | TQ2_0, TQ1_0 (mainline) | f16 per 256-element block | [`tq`] |
//! | IQ2_BN (f32), IQ1_BN (f16) (ik) | one per row, in front of the row | [`bn`] |
//! | I2_S (Microsoft) | one f32 per tensor, after the data | [`i2s`] |
//!
//! This module holds the base-3 byte packing shared by TQ1_0 and IQ1_BN: five
//! codes form `v = Σ c_k·3^(4−k)` (k = 0 most significant, 0..=242) stored as
//! `b = ⌈v·256/243⌉`; digit k comes back as `((b·3^k mod 256)·3) >> 8`.
//! Multiplying by 3^k shifts the fixed-point fraction `v/243` left k digits
//! and the top digit then sits in the top bits of the byte.

pub mod bn;
pub mod i2s;
pub mod rows;
pub mod tq;

use tern_gguf::GgmlType;

use crate::TensorScale;

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Packs five codes (most significant first) into one byte.
#[inline]
pub(crate) fn pack_trits(codes: [u8; 5]) -> u8 {
    let v = codes.iter().fold(0u32, |v, &c| v * 3 + c as u32);
    (v * 256).div_ceil(243) as u8
}

/// Digit `k` (0 = most significant) of a packed byte.
#[inline]
pub(crate) fn unpack_trit(b: u8, k: usize) -> u8 {
    let q = b.wrapping_mul(POW3[k]);
    ((q as u16 * 3) >> 8) as u8
}

/// Nearest code of `x·id` (−1, 0, +1 → 0, 1, 2), rounding half away from zero
/// like C's `lroundf`; inputs beyond ±1 saturate.
#[inline]
pub(crate) fn round_code(x: f32, id: f32) -> u8 {
    ((x * id).round().clamp(-1.0, 1.0) + 1.0) as u8
}

/// The scalar dot of every ternary format with a `Q8_Row` activation: the
/// row reduced to values and scales ([`rows::decode_row`]), multiplied by
/// [`rows::dot_values`].
pub(crate) fn dot_q8_row(ty: GgmlType, n: usize, w: &[u8], tensor: TensorScale, act: &[u8]) -> f32 {
    let (d, _, q) = crate::act::q8_row_parts(act);
    let mut values = vec![0i8; n];
    let scales = rows::decode_row(ty, w, tensor, &mut values);
    rows::dot_values(&values, &scales, rows::scale_group(ty, n), d, q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_five_trit_pattern_round_trips() {
        for v in 0..243u32 {
            let codes = [v / 81, v / 27 % 3, v / 9 % 3, v / 3 % 3, v % 3].map(|c| c as u8);
            let b = pack_trits(codes);
            let back: Vec<u8> = (0..5).map(|k| unpack_trit(b, k)).collect();
            assert_eq!(back, codes, "pattern {v} byte {b}");
        }
    }

    #[test]
    fn spec_worked_example() {
        // (+1, 0, −1, −1, +1) → codes (2, 1, 0, 0, 2) → 202 (docs/spec/quants.md §10).
        assert_eq!(pack_trits([2, 1, 0, 0, 2]), 202);
        assert_eq!((0..5).map(|k| unpack_trit(202, k)).collect::<Vec<_>>(), [2, 1, 0, 0, 2]);
    }
}
