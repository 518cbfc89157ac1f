//! Matrix products and row lookups on weights in their file format, or in
//! the repacked ternary layout.
//!
//! Weights are never widened to f32 as a whole: a paired matmul quantizes
//! the activations once per column into the int8 type the weight format pairs
//! with, then runs the per-format dot product row by row (ternary weights:
//! the packed kernels, a tile of rows × tokens at a time).

use tern_graph::{DType, GgmlType, Precision};
use tern_quant::ternary::rows;
use tern_quant::{ActType, TensorScale};

use super::{Ctx, Tensor};
use crate::kernels::{self, blocks};

/// Activation rows from which a format's GEMM beats its row dots (the
/// GEMM's register tile is four tokens).
const GEMM_MIN_TOKENS: usize = 4;
/// Weight rows a thread claims at a time for a GEMM (whole decoded groups).
pub(super) const GEMM_ROWS: usize = 2 * blocks::GEMM_GROUP;
use crate::kernels::ternary::{self, PackedActs, PackedTernary};

pub(super) fn weight_type(w: &Tensor) -> GgmlType {
    match w.node.dtype {
        DType::Ggml(t) => t,
        DType::I32 => unreachable!("supports() admits only GGUF types as weights"),
    }
}

/// Rows `ids` of `table`, dequantized to f32; a prompt's rows on every thread.
pub fn get_rows(table: &Tensor, ids: &[i32], y: &mut [f32], cx: &Ctx) {
    let k = table.node.ne[0];
    let out = Out(y.as_mut_ptr());
    // Ids come from the tokenizer or the user; the engine checks them against
    // n_vocab before building the graph.
    let rows = |r: std::ops::Range<usize>, f: &mut dyn FnMut(usize, &mut [f32])| {
        let out = &out;
        for i in r {
            // SAFETY: each thread writes only the output rows of its own ids.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(i * k), k) };
            f(ids[i] as usize, dst);
        }
    };
    if let Some(p) = table.packed {
        cx.pool.for_chunks(ids.len(), 16, |r| {
            let mut values = vec![0i8; p.layout.k_pad];
            rows(r, &mut |id, dst| {
                rows::unpack_row(&p.layout, p.row(id), &mut values);
                let scales = p.row_scales(id);
                for (i, (o, &v)) in dst.iter_mut().zip(&values).enumerate() {
                    *o = v as f32 * scales[i / p.layout.group()];
                }
            });
        });
        return;
    }
    let ty = weight_type(table);
    let bytes = table.bytes();
    let scale = TensorScale::of(ty, bytes, k * table.node.n_rows());
    let row_bytes = ty.row_bytes(k as u64).expect("validated at load") as usize;
    cx.pool.for_chunks(ids.len(), 16, |r| {
        rows(r, &mut |id, dst| {
            tern_quant::dequantize_row(ty, &bytes[id * row_bytes..(id + 1) * row_bytes], scale, dst)
        });
    });
}

struct Out(*mut f32);
// SAFETY: each thread writes only the output rows of its own range of weight rows.
unsafe impl Sync for Out {}

struct Bytes(*mut u8);
// SAFETY: each thread writes only the quantized rows of its own columns.
unsafe impl Sync for Bytes {}

/// `y [n, m] = W [k, n] · x [k, m]`.
pub fn mul_mat(w: &Tensor, x: &Tensor, precision: Precision, y: &mut [f32], cx: &Ctx) {
    match w.packed {
        Some(p) if precision == Precision::Paired => mul_mat_ternary(p, x, y, cx),
        _ => mul_mat_rows(w, x.f32(), precision, y, cx),
    }
}

/// Ternary weights: per-token int8 activations, tiles of rows × tokens.
fn mul_mat_ternary(w: &PackedTernary, x: &Tensor, y: &mut [f32], cx: &Ctx) {
    let mut cache = cx.acts.borrow_mut();
    let key = x.node as *const _;
    let fresh = !matches!(&*cache, Some((k, a)) if *k == key && a.k_pad == w.layout.k_pad);
    if fresh {
        let (k, xs) = (w.layout.k, x.f32());
        let mut acts = PackedActs::new(k, w.layout.k_pad, xs.len() / k);
        acts.quantize(xs, cx.isa);
        *cache = Some((key, acts));
    }
    let acts = &cache.as_ref().expect("filled above").1;
    let out = ternary::Out { ptr: y.as_mut_ptr(), ld: w.rows };
    // Whole row groups per thread keep the kernels' tiles full.
    let (unit, isa) = (ternary::rows_per_claim(acts.n), cx.isa);
    cx.pool.for_chunks_claimed(w.rows.div_ceil(unit), 1, |g| {
        let rows = (g.start * unit).min(w.rows)..(g.end * unit).min(w.rows);
        // SAFETY: every thread writes its own rows; `isa` is the backend's, which is available.
        unsafe { ternary::gemm(w, rows, acts, out, isa) };
    });
}

/// Any other weight: the per-format dot product, row by row.
fn mul_mat_rows(w: &Tensor, x: &[f32], precision: Precision, y: &mut [f32], cx: &Ctx) {
    let ty = weight_type(w);
    let (k, n) = (w.node.ne[0], w.node.ne[1]);
    let m = x.len() / k;
    if let Some(p) = w.packed {
        // A ternary weight asked for float activations: widen its rows.
        let mut values = vec![0i8; p.layout.k_pad];
        for j in 0..n {
            rows::unpack_row(&p.layout, p.row(j), &mut values);
            let s = p.row_scales(j);
            for c in 0..m {
                let xs = &x[c * k..(c + 1) * k];
                let acc: f64 = xs
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| (values[i] as f32 * s[i / p.layout.group()]) as f64 * v as f64)
                    .sum();
                y[c * n + j] = acc as f32;
            }
        }
        return;
    }
    let bytes = w.bytes();
    #[cfg(target_arch = "x86_64")]
    if ty == GgmlType::Q2_0 && precision == Precision::Paired && cx.isa >= crate::isa::Isa::Avx2 {
        // SAFETY: the backend's ISA level is available; `y` is n · m floats.
        return unsafe { kernels::q2_0::mul_mat(bytes, k, n, x, y, cx.pool) };
    }
    let dot = RowDot::new(ty, bytes, k, k * n, precision, cx);
    let acts = Acts::quantize(dot.act, x, k, cx);
    let row_bytes = dot.row_bytes;
    let y_ptr = Out(y.as_mut_ptr());
    if dot.has_gemm(m) {
        let cols: Vec<usize> = (0..m).collect();
        cx.pool.for_chunks_claimed(n, GEMM_ROWS, |rows| {
            let y_ptr = &y_ptr;
            let mut out = vec![0f32; rows.len() * m];
            dot.gemm(rows.clone(), &acts, &cols, &mut out);
            for (c, vals) in out.chunks_exact(rows.len()).enumerate() {
                // SAFETY: rows `rows` of every column belong to this thread only.
                let dst = unsafe { std::slice::from_raw_parts_mut(y_ptr.0.add(c * n + rows.start), rows.len()) };
                dst.copy_from_slice(vals);
            }
        });
        return;
    }
    // About 64k multiply-adds per thread before splitting pays.
    let min_rows = (65536 / (k * m).max(1)).max(1);
    // A decoding step streams each row once: fetch about a page ahead, past
    // where the hardware prefetcher stops.
    let ahead = if m == 1 { kernels::rows_ahead(row_bytes) } else { 0 };
    cx.pool.for_chunks_claimed(n, min_rows, |rows| {
        let y_ptr = &y_ptr;
        let end = rows.end;
        for j in rows {
            if ahead > 0 && j + ahead < end {
                kernels::prefetch(bytes[(j + ahead) * row_bytes..].as_ptr(), row_bytes);
            }
            let wr = dot.row(j);
            let quads = m / 4 * 4;
            for c0 in (0..quads).step_by(4) {
                let v = dot.dot4(wr, &acts, [c0, c0 + 1, c0 + 2, c0 + 3]);
                for (i, v) in v.into_iter().enumerate() {
                    // SAFETY: row j of every column belongs to this thread only.
                    unsafe { *y_ptr.0.add((c0 + i) * n + j) = v };
                }
            }
            for c in quads..m {
                // SAFETY: as above.
                unsafe { *y_ptr.0.add(c * n + j) = dot.dot(wr, &acts, c) };
            }
        }
    });
}

/// Activation rows in the type a weight format pairs with: quantized once,
/// then read by every weight row (f32 activations stay as they are).
pub(super) struct Acts<'x> {
    x: &'x [f32],
    k: usize,
    act: ActType,
    row_bytes: usize,
    quantized: Vec<u8>,
}

impl<'x> Acts<'x> {
    /// `x`: rows of `k` floats, quantized on every thread of `cx`.
    pub fn quantize(act: ActType, x: &'x [f32], k: usize, cx: &Ctx) -> Acts<'x> {
        let row_bytes = tern_quant::act_row_bytes(act, k);
        let mut quantized = Vec::new();
        if act != ActType::F32 {
            let n = x.len() / k;
            quantized = vec![0u8; row_bytes * n];
            let dst = Bytes(quantized.as_mut_ptr());
            // About 16k elements per thread before splitting pays.
            cx.pool.for_chunks(n, (16384 / k).max(1), |rows| {
                let dst = &dst;
                for c in rows {
                    // SAFETY: each thread writes the rows of its own columns.
                    let out = unsafe { std::slice::from_raw_parts_mut(dst.0.add(c * row_bytes), row_bytes) };
                    tern_quant::quantize_acts(act, &x[c * k..(c + 1) * k], out);
                }
            });
        }
        Acts { x, k, act, row_bytes, quantized }
    }

    fn row_bytes_of(&self, c: usize) -> &[u8] {
        if self.act == ActType::F32 {
            // SAFETY: f32 has no padding; the kernels read activations as little-endian f32 bytes.
            unsafe { std::slice::from_raw_parts(self.x[c * self.k..].as_ptr() as *const u8, self.k * 4) }
        } else {
            &self.quantized[c * self.row_bytes..(c + 1) * self.row_bytes]
        }
    }
}

/// The dot product of a weight's rows (file format) with activation rows:
/// the SIMD kernel for the pair when there is one, else the scalar reference.
pub(super) struct RowDot<'w> {
    ty: GgmlType,
    bytes: &'w [u8],
    k: usize,
    scale: TensorScale,
    pub act: ActType,
    pub row_bytes: usize,
    fast: Option<blocks::DotFn>,
    fast4: Option<blocks::Dot4Fn>,
    gemm: Option<blocks::GemmFn>,
}

impl<'w> RowDot<'w> {
    /// `bytes`: the weight's rows of `k` elements (`n_elements` in all).
    pub fn new(
        ty: GgmlType,
        bytes: &'w [u8],
        k: usize,
        n_elements: usize,
        precision: Precision,
        cx: &Ctx,
    ) -> RowDot<'w> {
        let act = match precision {
            Precision::Paired => tern_quant::act_type(ty),
            Precision::Float => ActType::F32,
        };
        // A SIMD kernel exists for float weights with f32 activations, or
        // quantized weights with their paired int8 activations.
        let fast = if act != ActType::F32 || ty.is_float() { blocks::dot_fn(ty, cx.isa) } else { None };
        let fast4 = if act != ActType::F32 { blocks::dot4_fn(ty, cx.isa) } else { None };
        let gemm = if act != ActType::F32 { blocks::gemm_fn(ty, cx.isa) } else { None };
        RowDot {
            ty,
            bytes,
            k,
            scale: TensorScale::of(ty, bytes, n_elements),
            act,
            row_bytes: ty.row_bytes(k as u64).expect("validated at load") as usize,
            fast,
            fast4,
            gemm,
        }
    }

    /// Whether [`RowDot::gemm`] serves `tokens` activation rows.
    pub fn has_gemm(&self, tokens: usize) -> bool {
        self.gemm.is_some() && tokens >= GEMM_MIN_TOKENS
    }

    /// Weight rows `rows` against activation rows `cols` through the
    /// format's GEMM (when [`RowDot::has_gemm`]): `out[t·rows.len() + r]`.
    pub fn gemm(&self, rows: std::ops::Range<usize>, acts: &Acts, cols: &[usize], out: &mut [f32]) {
        let f = self.gemm.expect("has_gemm checked");
        let w: Vec<&[u8]> = rows.map(|j| self.row(j)).collect();
        let a: Vec<&[u8]> = cols.iter().map(|&c| acts.row_bytes_of(c)).collect();
        // SAFETY: gemm_fn only returns kernels the processor supports.
        unsafe { f(&mut blocks::Gemm { k: self.k, rows: &w, acts: &a, out }) };
    }

    pub fn row(&self, j: usize) -> &'w [u8] {
        &self.bytes[j * self.row_bytes..(j + 1) * self.row_bytes]
    }

    /// Weight row `wr` against activation row `c`.
    pub fn dot(&self, wr: &[u8], acts: &Acts, c: usize) -> f32 {
        let act_row = acts.row_bytes_of(c);
        match self.fast {
            // SAFETY: dot_fn only returns kernels the processor supports.
            Some(f) => unsafe { f(self.k, wr, act_row) },
            None if self.act == ActType::F32 => {
                tern_quant::vec_dot_f32(self.ty, wr, self.scale, &acts.x[c * self.k..(c + 1) * self.k])
            }
            None => tern_quant::vec_dot(self.ty, self.k, wr, self.scale, act_row),
        }
    }

    /// Weight row `wr` against activation rows `cols`: one pass over the row
    /// where the format has a four-row kernel, each result the bits of
    /// [`RowDot::dot`].
    pub fn dot4(&self, wr: &[u8], acts: &Acts, cols: [usize; 4]) -> [f32; 4] {
        match self.fast4 {
            // SAFETY: dot4_fn only returns kernels the processor supports.
            Some(f) => unsafe { f(self.k, wr, cols.map(|c| acts.row_bytes_of(c))) },
            None => cols.map(|c| self.dot(wr, acts, c)),
        }
    }

    /// Row `j` widened to f32.
    pub fn widen(&self, j: usize, out: &mut [f32]) {
        tern_quant::dequantize_row(self.ty, self.row(j), self.scale, out)
    }
}
