//! Causal attention over a layer's KV cache (f32 or f16 rows).
//!
//! The op stores this batch's keys and values into the cache, then each
//! (token, head) pair attends to every cache row up to its own position.
//! Scores and the softmax are accumulated in f32 with the running-max trick.

use half::f16;
use tern_graph::{AttentionParams, DType, GgmlType};

use super::Tensor;
use crate::pool::Pool;

/// A cache as rows of `width` elements.
struct Cache {
    ptr: *mut u8,
    f16: bool,
    width: usize,
}

// SAFETY: threads only read cache rows after the single-threaded store below.
unsafe impl Sync for Cache {}

impl Cache {
    fn new(t: &Tensor) -> Cache {
        let f16 = t.node.dtype == DType::Ggml(GgmlType::F16);
        Cache { ptr: t.ptr, f16, width: t.node.ne[0] }
    }

    /// # Safety
    /// `row` is inside the cache and nobody reads it concurrently.
    unsafe fn store(&self, row: usize, src: &[f32]) {
        if self.f16 {
            let dst = std::slice::from_raw_parts_mut((self.ptr as *mut u16).add(row * self.width), self.width);
            for (d, &s) in dst.iter_mut().zip(src) {
                *d = f16::from_f32(s).to_bits();
            }
        } else {
            std::slice::from_raw_parts_mut((self.ptr as *mut f32).add(row * self.width), self.width)
                .copy_from_slice(src);
        }
    }

    /// Element range `[start, start + len)` of `row`, widened into `out`.
    fn load(&self, row: usize, start: usize, out: &mut [f32]) {
        let at = row * self.width + start;
        // SAFETY: rows below the current position were written by `store`; the
        // cache buffer holds n_ctx rows (checked when the graph was built).
        unsafe {
            if self.f16 {
                let src = std::slice::from_raw_parts((self.ptr as *const u16).add(at), out.len());
                for (o, &b) in out.iter_mut().zip(src) {
                    *o = f16::from_bits(b).to_f32();
                }
            } else {
                out.copy_from_slice(std::slice::from_raw_parts((self.ptr as *const f32).add(at), out.len()));
            }
        }
    }
}

struct Out(*mut f32);
// SAFETY: each (token, head) task writes its own disjoint slice of the output.
unsafe impl Sync for Out {}

/// # Safety
/// `srcs[3..5]` are the layer's caches, not aliased by any other view in use.
pub unsafe fn attention(srcs: &[Tensor], p: &AttentionParams, out: &mut [f32], pool: &Pool) {
    let (q, k, v) = (srcs[0].f32(), srcs[1].f32(), srcs[2].f32());
    let (kc, vc) = (Cache::new(&srcs[3]), Cache::new(&srcs[4]));
    let kv_width = p.head_dim * p.n_head_kv;
    let n_tokens = srcs[0].node.ne[1];
    for t in 0..n_tokens {
        kc.store(p.kv_pos + t, &k[t * kv_width..(t + 1) * kv_width]);
        vc.store(p.kv_pos + t, &v[t * kv_width..(t + 1) * kv_width]);
    }
    let group = p.n_head / p.n_head_kv;
    let width = p.head_dim * p.n_head;
    let out_ptr = Out(out.as_mut_ptr());
    let tasks = n_tokens * p.n_head;
    pool.for_chunks(tasks, 4, |range| {
        let out_ptr = &out_ptr;
        let mut krow = vec![0f32; p.head_dim];
        let mut acc = vec![0f32; p.head_dim];
        for task in range {
            let (t, h) = (task / p.n_head, task % p.n_head);
            let kv_head = h / group;
            let qh = &q[t * width + h * p.head_dim..][..p.head_dim];
            let n_kv = p.kv_pos + t + 1;
            let mut max = f32::NEG_INFINITY;
            let mut sum = 0f32;
            acc.fill(0.0);
            for pos in 0..n_kv {
                kc.load(pos, kv_head * p.head_dim, &mut krow);
                let s = qh.iter().zip(&krow).map(|(a, b)| a * b).sum::<f32>() * p.scale;
                // Online softmax: rescale what was accumulated when the max grows.
                let (w, rescale) = if s > max { (1.0, (max - s).exp()) } else { ((s - max).exp(), 1.0) };
                max = max.max(s);
                sum = sum * rescale + w;
                vc.load(pos, kv_head * p.head_dim, &mut krow);
                for (a, &vv) in acc.iter_mut().zip(&krow) {
                    *a = *a * rescale + w * vv;
                }
            }
            // SAFETY: task (t, h) owns output elements [t*width + h*hd, +hd).
            let o = unsafe { std::slice::from_raw_parts_mut(out_ptr.0.add(t * width + h * p.head_dim), p.head_dim) };
            for (o, a) in o.iter_mut().zip(&acc) {
                *o = a / sum;
            }
        }
    });
}
