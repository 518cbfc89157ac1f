//! Ternary matrix products on the repacked layouts of `tern_quant::ternary::rows`
//! (`Bits2`, `Base3`) with per-row int8 activations.
//!
//! Every kernel computes, per (weight row, token), the exact integer `Σ c·q`
//! over the padded row, subtracts `Σ q`, and scales once:
//! `((Σ c·q − Σ q) as f32) · s_row · d_token`, the float operations of the
//! scalar reference `rows::dot_values`, so all ISA paths agree bit for bit.
//! Matrices whose rows carry several scales (rare TQ files) take the scalar
//! path.

mod avx2;
mod avx512;
mod panel;
mod panel_avx2;

use tern_quant::ternary::rows::{self, Layout, Packing};

use crate::buffer::Aligned;
use crate::isa::Isa;

/// A ternary weight matrix in a kernel layout, rows padded to whole chunks.
pub struct PackedTernary {
    pub layout: Layout,
    pub rows: usize,
    data: Aligned,
    /// `layout.groups` per row.
    scales: Vec<f32>,
}

impl PackedTernary {
    /// Repacks `rows` rows of `k` elements of ternary type `ty`.
    pub fn new(ty: tern_quant::GgmlType, bytes: &[u8], k: usize, rows: usize, packing: Packing) -> PackedTernary {
        let scale = tern_quant::TensorScale::of(ty, bytes, k * rows);
        let (layout, packed, scales) = rows::repack(ty, bytes, scale, k, rows, packing);
        let mut data = Aligned::new(packed.len()).expect("allocation of a repacked weight");
        data.as_mut_slice().copy_from_slice(&packed);
        PackedTernary { layout, rows, data, scales }
    }

    pub fn row(&self, r: usize) -> &[u8] {
        &self.data.as_slice()[r * self.layout.row_bytes..(r + 1) * self.layout.row_bytes]
    }

    /// The scales of rows `r..` (one per row when `layout.groups` is 1).
    pub fn scales_from(&self, r: usize) -> &[f32] {
        &self.scales[r * self.layout.groups..]
    }

    pub fn row_scales(&self, r: usize) -> &[f32] {
        &self.scales[r * self.layout.groups..(r + 1) * self.layout.groups]
    }

    pub fn bytes(&self) -> usize {
        self.data.as_slice().len() + self.scales.len() * 4
    }
}

/// Per-token int8 activations, padded to `k_pad` with zeros, 64-byte aligned rows.
pub struct PackedActs {
    pub k: usize,
    pub k_pad: usize,
    pub n: usize,
    q: Aligned,
    /// Per token: the scale `1 / s_a` and `Σ q`.
    pub d: Vec<f32>,
    pub sum: Vec<i32>,
}

impl PackedActs {
    pub fn new(k: usize, k_pad: usize, n: usize) -> PackedActs {
        PackedActs {
            k,
            k_pad,
            n,
            q: Aligned::new(k_pad * n).expect("activation buffer"),
            d: vec![0.0; n],
            sum: vec![0; n],
        }
    }

    pub fn q(&self, t: usize) -> &[i8] {
        let b = &self.q.as_slice()[t * self.k_pad..(t + 1) * self.k_pad];
        // SAFETY: i8 and u8 have the same layout.
        unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
    }

    /// Quantizes `x` (`n` rows of `k`) as `ActType::Q8_Row` does: `s_a =
    /// 127 / max(amax, 1e-5)`, `q = round_half_even(x · s_a)`, `d = 1 / s_a`.
    pub fn quantize(&mut self, x: &[f32], isa: Isa) {
        let (k, k_pad) = (self.k, self.k_pad);
        for t in 0..self.n {
            let xs = &x[t * k..(t + 1) * k];
            let amax = match isa {
                Isa::Avx512 => unsafe { avx512::amax(xs) },
                Isa::Avx2 => unsafe { avx2::amax(xs) },
                Isa::Scalar => xs.iter().fold(0f32, |m, v| m.max(v.abs())),
            };
            let s_a = 127.0 / amax.max(1e-5);
            let qb = &mut self.q.as_mut_slice()[t * k_pad..(t + 1) * k_pad];
            // SAFETY: i8 and u8 have the same layout.
            let q = unsafe { std::slice::from_raw_parts_mut(qb.as_mut_ptr() as *mut i8, k_pad) };
            let sum = match isa {
                Isa::Avx512 => unsafe { avx512::quantize(xs, s_a, q) },
                Isa::Avx2 => unsafe { avx2::quantize(xs, s_a, q) },
                Isa::Scalar => quantize_scalar(xs, s_a, q),
            };
            self.d[t] = 1.0 / s_a;
            self.sum[t] = sum;
        }
    }
}

fn quantize_scalar(x: &[f32], s_a: f32, q: &mut [i8]) -> i32 {
    let mut sum = 0;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (v * s_a).round_ties_even().clamp(-128.0, 127.0) as i8;
        sum += *o as i32;
    }
    q[x.len()..].fill(0);
    sum
}

/// Output pointer shared by threads that write disjoint rows.
#[derive(Clone, Copy)]
pub struct Out {
    pub ptr: *mut f32,
    /// Elements between consecutive tokens' outputs (the weight's row count).
    pub ld: usize,
}

// SAFETY: callers give each thread a disjoint row range.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

/// How AVX-512 kernels read base-3 bytes: table lookups (needs VBMI) or
/// multiply-and-compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Base3Decode {
    Lookup,
    Compare,
}

impl Base3Decode {
    /// The faster one this processor supports.
    pub fn best() -> Base3Decode {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512vbmi") {
            return Base3Decode::Lookup;
        }
        Base3Decode::Compare
    }
}

/// The row count that a thread's share of a product should be a multiple
/// of: whole panels for a prompt, whole 16-row tiles for a few tokens.
pub fn rows_per_claim(tokens: usize) -> usize {
    if tokens >= TOKEN_BLOCK {
        64
    } else {
        16
    }
}

/// `y[t·ld + r] = W[r] · x[t]` for `r` in `rows`, every token of `acts`.
///
/// # Safety
/// `out` must be valid for every written index and not written by anyone else
/// for these rows; `isa` must be available.
pub unsafe fn gemm(w: &PackedTernary, rows: std::ops::Range<usize>, acts: &PackedActs, out: Out, isa: Isa) {
    gemm_with(w, rows, acts, out, isa, Base3Decode::best())
}

/// [`gemm`] with the base-3 decoding chosen (tests cover both).
///
/// # Safety
/// As [`gemm`]; `Base3Decode::Lookup` needs AVX-512 VBMI.
pub unsafe fn gemm_with(
    w: &PackedTernary,
    rows: std::ops::Range<usize>,
    acts: &PackedActs,
    out: Out,
    isa: Isa,
    base3: Base3Decode,
) {
    debug_assert_eq!(acts.k_pad, w.layout.k_pad);
    if w.layout.groups != 1 || isa == Isa::Scalar {
        return gemm_scalar(w, rows, acts, out);
    }
    match (isa, w.layout.packing) {
        (Isa::Avx512, Packing::Bits2) => avx512::gemm_bits2(w, rows, acts, out),
        (Isa::Avx512, Packing::Base3) => avx512::gemm_base3(w, rows, acts, out, base3 == Base3Decode::Lookup),
        (Isa::Avx2, Packing::Bits2) => avx2::gemm_bits2(w, rows, acts, out),
        (Isa::Avx2, Packing::Base3) => avx2::gemm_base3(w, rows, acts, out),
        (Isa::Scalar, _) => unreachable!("handled above"),
    }
}

/// The scalar path: the reference decode and dot, row by row.
unsafe fn gemm_scalar(w: &PackedTernary, rows: std::ops::Range<usize>, acts: &PackedActs, out: Out) {
    let mut values = vec![0i8; w.layout.k_pad];
    for r in rows {
        rows::unpack_row(&w.layout, w.row(r), &mut values);
        for t in 0..acts.n {
            let y = rows::dot_values(&values, w.row_scales(r), w.layout.group(), acts.d[t], acts.q(t));
            *out.ptr.add(t * out.ld + r) = y;
        }
    }
}

/// A kernel for one tile: R weight rows starting at a row, T tokens starting at a token.
type Tile = unsafe fn(&PackedTernary, usize, &PackedActs, usize, Out);

/// A tile over a decoded panel (see [`Panel`]): its rows start at a row,
/// T tokens start at a token.
type PanelTile = unsafe fn(&PackedTernary, usize, &[u8], &PackedActs, usize, Out);

/// Batches of more than a few tokens decode a panel of up to `units` ×
/// `unit` rows once, one code byte a weight, in the layout its ISA's tiles
/// read: on AVX-512 (`panel.rs`) one 64-byte vector holds 4 consecutive
/// weights of 16 rows, multiplied against 4 broadcast activations of a
/// token so that each accumulator holds 16 rows' sums; on AVX2
/// (`panel_avx2.rs`) rows keep their weight order, read like the
/// activations by tiles of 2 rows. A tile covers the panel's rows × up to
/// `tokens` tokens; the unpacking is paid once per panel instead of once per
/// token tile.
struct Panel {
    /// Rows per unit: a panel holds whole units.
    unit: usize,
    /// Units in a full panel.
    units: usize,
    /// Tokens in a full tile.
    tokens: usize,
    /// Batches of fewer tokens take the direct tiles.
    min_tokens: usize,
    /// Decodes `u` units of rows from a row into the scratch.
    decode: unsafe fn(&PackedTernary, usize, usize, &mut [u8]),
    /// The tile for `u` units and `t` tokens: `tiles[u − 1][t − 1]`.
    tiles: &'static [&'static [PanelTile]],
}

/// An ISA's tile kernels: the full R×T tile and the smaller ones for edges.
struct Tiles {
    rows: usize,
    tokens: usize,
    full: Tile,
    /// One row × T tokens.
    row_edge: Tile,
    /// R rows × 1..T-1 tokens (index = tokens − 1).
    token_edge: &'static [Tile],
    single: Tile,
    panel: Option<Panel>,
}

/// Tokens whose activations stay in cache while every direct row tile passes
/// over them (64 rows of 6912 int8 is 442 KB, within a core's L2). Weights
/// are then read from memory once per block of tokens instead of once per tile.
const TOKEN_BLOCK: usize = 64;

thread_local! {
    /// A thread's decoded panel, kept between calls: a fresh zeroed buffer of
    /// this size would be new pages, faulted in on every matmul.
    static PANEL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Tiles {
    /// Covers `rows` × every token. A batch of the panel's `min_tokens` or
    /// more runs whole panels over every token (each panel decoded once, the
    /// activations streaming past it); the rows left, and smaller batches,
    /// run the direct tiles by token blocks.
    unsafe fn drive(&self, w: &PackedTernary, rows: std::ops::Range<usize>, acts: &PackedActs, out: Out) {
        let mut r = rows.start;
        if let Some(p) = self.panel.as_ref().filter(|p| acts.n >= p.min_tokens) {
            PANEL.with_borrow_mut(|scratch| {
                scratch.resize(p.unit * p.units * w.layout.k_pad, 0);
                while rows.end - r >= p.unit {
                    let u = ((rows.end - r) / p.unit).min(p.units);
                    (p.decode)(w, r, u, scratch);
                    for t0 in (0..acts.n).step_by(p.tokens) {
                        let tt = (acts.n - t0).min(p.tokens);
                        (p.tiles[u - 1][tt - 1])(w, r, scratch, acts, t0, out);
                    }
                    r += p.unit * u;
                }
            });
        }
        for block in (0..acts.n).step_by(TOKEN_BLOCK) {
            self.direct(w, r..rows.end, acts, block..(block + TOKEN_BLOCK).min(acts.n), out);
        }
    }

    /// Rows × tokens with the tiles that unpack weights as they go.
    unsafe fn direct(
        &self,
        w: &PackedTernary,
        rows: std::ops::Range<usize>,
        acts: &PackedActs,
        tokens: std::ops::Range<usize>,
        out: Out,
    ) {
        let (rr, tt) = (self.rows, self.tokens);
        let full_end = tokens.start + tokens.len() / tt * tt;
        let mut r = rows.start;
        // A decoding step streams each row once: fetch about a page ahead,
        // past where the hardware prefetcher stops.
        let ahead = if tokens.len() == 1 { crate::kernels::rows_ahead(w.layout.row_bytes) } else { 0 };
        while r + rr <= rows.end {
            if ahead > 0 && r + ahead + rr <= rows.end {
                crate::kernels::prefetch(w.row(r + ahead).as_ptr(), rr * w.layout.row_bytes);
            }
            for t0 in (tokens.start..full_end).step_by(tt) {
                (self.full)(w, r, acts, t0, out);
            }
            if full_end < tokens.end {
                (self.token_edge[tokens.end - full_end - 1])(w, r, acts, full_end, out);
            }
            r += rr;
        }
        for r in r..rows.end {
            for t0 in (tokens.start..full_end).step_by(tt) {
                (self.row_edge)(w, r, acts, t0, out);
            }
            for t in full_end..tokens.end {
                (self.single)(w, r, acts, t, out);
            }
        }
    }
}

/// The final scaling shared by the SIMD kernels (the reference's order).
#[inline(always)]
fn finish(dot: i32, sum: i32, s: f32, d: f32) -> f32 {
    (dot - sum) as f32 * s * d
}
