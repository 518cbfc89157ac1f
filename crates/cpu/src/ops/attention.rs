//! Causal attention over a layer's KV cache (f32 or f16 rows), flash style:
//! one pass over the cache with an online softmax, never materialising the
//! score matrix.
//!
//! The op stores this batch's keys and values into the cache, then each task
//! (token, KV head) walks cache rows `0..=kv_pos + t` once: every K and V row
//! is widened to f32 once and shared by the query heads of its group (GQA).

use half::slice::HalfFloatSliceExt;
use half::f16;
use tern_graph::{AttentionParams, DType, GgmlType};

use super::Tensor;
use crate::isa::Isa;
use crate::kernels::vec;
use crate::pool::Pool;

/// A cache as rows of `width` elements of type `ty` (F32, F16 or Q8_0).
struct Cache {
    ptr: *mut u8,
    ty: GgmlType,
    width: usize,
    row_bytes: usize,
}

// SAFETY: threads only read cache rows after the single-threaded store below.
unsafe impl Sync for Cache {}

impl Cache {
    fn new(t: &Tensor) -> Cache {
        let ty = match t.node.dtype {
            DType::Ggml(ty) => ty,
            DType::I32 => unreachable!("supports() admits only F32, F16 and Q8_0 caches"),
        };
        let width = t.node.ne[0];
        let row_bytes = ty.row_bytes(width as u64).expect("cache rows are whole blocks") as usize;
        Cache { ptr: t.ptr, ty, width, row_bytes }
    }

    /// # Safety
    /// `row` is inside the cache and nobody reads it concurrently.
    unsafe fn store(&self, row: usize, src: &[f32]) {
        let bytes = std::slice::from_raw_parts_mut(self.ptr.add(row * self.row_bytes), self.row_bytes);
        match self.ty {
            GgmlType::F16 => std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f16, self.width).convert_from_f32_slice(src),
            GgmlType::F32 => std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, self.width).copy_from_slice(src),
            ty => tern_quant::quantize_row(ty, src, bytes),
        }
    }

    /// Element range `[start, start + out.len())` of `row`, widened into `out`
    /// (`start` and the length are whole blocks: head boundaries).
    fn load(&self, row: usize, start: usize, out: &mut [f32]) {
        // SAFETY: rows below the current position were written by `store`; the
        // cache buffer holds n_ctx rows (checked when the graph was built).
        unsafe {
            let base = self.ptr.add(row * self.row_bytes);
            match self.ty {
                GgmlType::F16 => std::slice::from_raw_parts((base as *const f16).add(start), out.len()).convert_to_f32_slice(out),
                GgmlType::F32 => out.copy_from_slice(std::slice::from_raw_parts((base as *const f32).add(start), out.len())),
                ty => {
                    let be = ty.block_elems();
                    let bb = ty.layout().block_bytes;
                    let bytes = std::slice::from_raw_parts(base.add(start / be * bb), out.len() / be * bb);
                    tern_quant::dequantize_row(ty, bytes, tern_quant::TensorScale::ONE, out);
                }
            }
        }
    }
}

struct Out(*mut f32);
// SAFETY: each (token, KV head) task writes the outputs of its own query heads.
unsafe impl Sync for Out {}

/// # Safety
/// `srcs[3..5]` are the layer's caches, not aliased by any other view in use.
pub unsafe fn attention(srcs: &[Tensor], p: &AttentionParams, out: &mut [f32], pool: &Pool, isa: Isa) {
    let (q, k, v) = (srcs[0].f32(), srcs[1].f32(), srcs[2].f32());
    let (kc, vc) = (Cache::new(&srcs[3]), Cache::new(&srcs[4]));
    let kv_width = p.head_dim * p.n_head_kv;
    let n_tokens = srcs[0].node.ne[1];
    for t in 0..n_tokens {
        kc.store(p.kv_pos + t, &k[t * kv_width..(t + 1) * kv_width]);
        vc.store(p.kv_pos + t, &v[t * kv_width..(t + 1) * kv_width]);
    }
    let group = p.n_head / p.n_head_kv;
    let (hd, width) = (p.head_dim, p.head_dim * p.n_head);
    let out_ptr = Out(out.as_mut_ptr());
    pool.for_chunks(n_tokens * p.n_head_kv, 1, |range| {
        let out_ptr = &out_ptr;
        let mut krow = vec![0f32; hd];
        let mut vrow = vec![0f32; hd];
        // Per query head of the group: running max, running sum, accumulator.
        let mut max = vec![f32::NEG_INFINITY; group];
        let mut sum = vec![0f32; group];
        let mut acc = vec![0f32; group * hd];
        for task in range {
            let (t, g) = (task / p.n_head_kv, task % p.n_head_kv);
            let qs = &q[t * width + g * group * hd..][..group * hd];
            max.fill(f32::NEG_INFINITY);
            sum.fill(0.0);
            acc.fill(0.0);
            for pos in 0..=p.kv_pos + t {
                kc.load(pos, g * hd, &mut krow);
                vc.load(pos, g * hd, &mut vrow);
                for h in 0..group {
                    let s = vec::dot(&qs[h * hd..(h + 1) * hd], &krow, isa) * p.scale;
                    // Online softmax: rescale what was accumulated when the max grows.
                    let (w, rescale) = if s > max[h] { (1.0, (max[h] - s).exp()) } else { ((s - max[h]).exp(), 1.0) };
                    max[h] = max[h].max(s);
                    sum[h] = sum[h] * rescale + w;
                    vec::scale_add(&mut acc[h * hd..(h + 1) * hd], rescale, w, &vrow, isa);
                }
            }
            for h in 0..group {
                // SAFETY: task (t, g) owns the outputs of query heads g·group..(g+1)·group of token t.
                let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * width + (g * group + h) * hd), hd) };
                for (o, a) in o.iter_mut().zip(&acc[h * hd..(h + 1) * hd]) {
                    *o = a / sum[h];
                }
            }
        }
    });
}
