//! The k-quants Q2_K, Q3_K, Q4_K, Q5_K and Q6_K: 256-element super-blocks
//! whose sub-blocks carry small integer scales relative to f16 super-scales.
//! All pair with `ActType::Q8_K` activations. This module holds what they
//! share: the 6-bit scale/min packing of Q4_K/Q5_K and the scale fitting.
//! The Q4_K/Q5_K/Q6_K quantizers are our own least-squares searches, not
//! bit-identical to `llama-quantize` (the spec only requires the decoders to
//! match); Q2_K's and Q3_K's (and IQ4_XS's) are ggml's reference quantizers,
//! bit for bit ([`reference`]).

pub mod q2k;
pub mod q3k;
pub mod q4k;
pub mod q5k;
pub mod q6k;
pub(crate) mod reference;

use crate::blocks::{f32_to_f16, round_f16};

/// Elements per k-quant super-block.
pub const QK_K: usize = 256;

/// Sub-block `j` (0..8) scale and min of a Q4_K/Q5_K block, 6 bits each:
/// * j < 4: `sc = q[j] & 63`, `m = q[j+4] & 63`;
/// * j ≥ 4: low 4 bits in `q[j+4]` (scale low nibble, min high nibble), high
///   2 bits in the top bits of `q[j-4]` (scale) and `q[j]` (min).
#[inline]
pub fn unpack_scale_min(q: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Inverse of [`unpack_scale_min`] for eight 6-bit scales and mins.
pub(crate) fn pack_scales_mins(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut q = [0u8; 12];
    for j in 0..8 {
        debug_assert!(sc[j] < 64 && m[j] < 64);
        if j < 4 {
            q[j] |= sc[j];
            q[j + 4] |= m[j];
        } else {
            q[j + 4] = (sc[j] & 0x0F) | ((m[j] & 0x0F) << 4);
            q[j - 4] |= (sc[j] >> 4) << 6;
            q[j] |= (m[j] >> 4) << 6;
        }
    }
    q
}

/// Fits `x ≈ s·L − m` with integer levels `L ∈ 0..=nmax`, `s ≥ 0`, `m ≥ 0`
/// (a zero point at or below the minimum, as Q4_K/Q5_K store it). Tries 21
/// inverse scales around `nmax / (max − min)`, refits `(s, m)` by least squares
/// for each trial's levels, and keeps the lowest squared error.
pub(crate) fn fit_scale_min(x: &[f32], nmax: u8) -> (f32, f32) {
    let lo = x.iter().fold(0.0f32, |a, &v| a.min(v));
    let hi = x.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v));
    if hi <= lo {
        // Constant (non-positive) data: the zero point alone represents it.
        return (0.0, -lo);
    }
    let nmaxf = nmax as f32;
    let n = x.len() as f32;
    let mut best = (0.0f32, -lo, f32::INFINITY);
    for step in -10..=10 {
        let iscale = (nmaxf + 0.1 * step as f32) / (hi - lo);
        let level = |v: f32| ((v - lo) * iscale).round().clamp(0.0, nmaxf);
        let (mut sl, mut sll, mut sx, mut sxl) = (0.0f32, 0.0f32, 0.0f32, 0.0f32);
        for &v in x {
            let l = level(v);
            sl += l;
            sll += l * l;
            sx += v;
            sxl += v * l;
        }
        if sll == 0.0 {
            continue; // every level 0: nothing to fit a scale to
        }
        let det = n * sll - sl * sl;
        let joint = (det > 0.0).then(|| ((n * sxl - sl * sx) / det, (sll * sx - sl * sxl) / det));
        let (s, c) = match joint {
            Some((s, c)) if c <= 0.0 => (s.max(0.0), c),
            // The format has no positive offset, and a single shared level
            // (det == 0) cannot fit one: refit the scale alone.
            _ => ((sxl / sll).max(0.0), 0.0),
        };
        let err: f32 = x.iter().map(|&v| (s * level(v) + c - v).powi(2)).sum();
        if err < best.2 {
            best = (s, -c, err);
        }
    }
    (best.0, best.1)
}

/// Fits `x ≈ s·L` with `L ∈ −nmax..=nmax−1` (Q6_K: nmax = 32). The largest-|x|
/// element is mapped near level −nmax (so `s` takes the sign that uses the
/// longer negative side), 21 stretches are tried, each refitted by least
/// squares, lowest squared error wins.
pub(crate) fn fit_scale_symmetric(x: &[f32], nmax: i32) -> f32 {
    let max = crate::blocks::signed_max(x);
    if max == 0.0 {
        return 0.0;
    }
    let (lo, hi) = (-nmax as f32, (nmax - 1) as f32);
    let mut best = (0.0f32, f32::INFINITY);
    for step in -10..=10 {
        let iscale = -(nmax as f32 + 0.1 * step as f32) / max;
        let level = |v: f32| (v * iscale).round().clamp(lo, hi);
        let (mut sxl, mut sll) = (0.0f32, 0.0f32);
        for &v in x {
            let l = level(v);
            sxl += v * l;
            sll += l * l;
        }
        if sll == 0.0 {
            continue;
        }
        let s = sxl / sll;
        let err: f32 = x.iter().map(|&v| (v - s * level(v)).powi(2)).sum();
        if err < best.1 {
            best = (s, err);
        }
    }
    best.0
}

/// Quantizes non-negative sub-block values to 6 bits against one super-scale
/// `d = max/63`; returns `(d, codes)`.
pub(crate) fn quantize_6bit(vals: &[f32; 8]) -> (f32, [u8; 8]) {
    let max = vals.iter().fold(0.0f32, |a, &v| a.max(v));
    let d = max / 63.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0u8; 8];
    for (q, &v) in q.iter_mut().zip(vals) {
        *q = (v * id).round().clamp(0.0, 63.0) as u8;
    }
    (d, q)
}

/// A Q4_K/Q5_K super-block before bit packing.
pub(crate) struct ScaleMinBlock {
    /// f16 super-scale of the 6-bit sub-block scales.
    pub d: [u8; 2],
    /// f16 super-scale of the 6-bit sub-block mins.
    pub dmin: [u8; 2],
    /// Packed 6-bit scales and mins (see [`unpack_scale_min`]).
    pub scales: [u8; 12],
    /// Level of each element, `0..=nmax`.
    pub levels: [u8; QK_K],
}

/// Quantizes one 256-element super-block for Q4_K (`nmax = 15`) or Q5_K
/// (`nmax = 31`): fit each 32-element sub-block, quantize the eight scales and
/// eight mins to 6 bits, then re-pick every level against the scales exactly
/// as the decoder will see them (f16 super-scales × 6-bit codes).
pub(crate) fn quantize_scale_min(xb: &[f32], nmax: u8) -> ScaleMinBlock {
    debug_assert_eq!(xb.len(), QK_K);
    let (mut s, mut m) = ([0.0f32; 8], [0.0f32; 8]);
    for (j, sub) in xb.chunks_exact(32).enumerate() {
        (s[j], m[j]) = fit_scale_min(sub, nmax);
    }
    let (d, sc) = quantize_6bit(&s);
    let (dmin, mq) = quantize_6bit(&m);
    let (d16, dmin16) = (round_f16(d), round_f16(dmin));
    let mut levels = [0u8; QK_K];
    for (j, (sub, lv)) in xb.chunks_exact(32).zip(levels.chunks_exact_mut(32)).enumerate() {
        let ds = d16 * sc[j] as f32;
        let dm = dmin16 * mq[j] as f32;
        if ds > 0.0 {
            for (l, &v) in lv.iter_mut().zip(sub) {
                *l = ((v + dm) / ds).round().clamp(0.0, nmax as f32) as u8;
            }
        }
    }
    ScaleMinBlock { d: f32_to_f16(d), dmin: f32_to_f16(dmin), scales: pack_scales_mins(&sc, &mq), levels }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_packing_round_trips() {
        let sc = [0, 63, 17, 42, 1, 63, 33, 5];
        let m = [63, 0, 9, 31, 62, 48, 2, 63];
        let q = pack_scales_mins(&sc, &m);
        for j in 0..8 {
            assert_eq!(unpack_scale_min(&q, j), (sc[j], m[j]), "sub-block {j}");
        }
    }
}
