//! Kernels by op family, and the dispatch from graph ops to them.

mod attention;
mod elementwise;
mod matmul;
mod mla;
mod moe;
mod rope;
mod seqs;

use tern_graph::{Node, Op};

use crate::isa::Isa;
use crate::kernels::ternary::{PackedActs, PackedTernary};
use crate::pool::Pool;

/// A node's data on this backend: a raw base pointer plus the node's shape,
/// or, for a repacked ternary weight, the packed matrix (and a null pointer).
pub struct Tensor<'g> {
    pub ptr: *mut u8,
    pub node: &'g Node,
    pub packed: Option<&'g PackedTernary>,
}

// SAFETY: a view is read by many threads at once; ops write only through
// `dst`, each thread to its own rows.
unsafe impl Sync for Tensor<'_> {}

/// What kernels run with: the thread pool, the ISA level, and the last
/// quantized activations (q/k/v and gate/up read the same input, which is then
/// quantized once).
pub struct Ctx<'a> {
    pub pool: &'a Pool,
    pub isa: Isa,
    pub acts: std::cell::RefCell<Option<(*const Node, PackedActs)>>,
}

impl Tensor<'_> {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` was bounds-checked for `nbytes` when the view was made.
        unsafe { std::slice::from_raw_parts(self.ptr, self.node.nbytes()) }
    }

    /// The data as f32 (arena tensors and f32 weights are 4-byte aligned).
    pub fn f32(&self) -> &[f32] {
        debug_assert_eq!(self.ptr as usize % 4, 0);
        // SAFETY: as `bytes`, and the dtype is F32 (checked by `supports`).
        unsafe { std::slice::from_raw_parts(self.ptr as *const f32, self.node.n_elements()) }
    }

    /// # Safety
    /// No other live view may overlap this tensor.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn f32_mut(&self) -> &mut [f32] {
        debug_assert_eq!(self.ptr as usize % 4, 0);
        std::slice::from_raw_parts_mut(self.ptr as *mut f32, self.node.n_elements())
    }

    pub fn i32(&self) -> &[i32] {
        debug_assert_eq!(self.ptr as usize % 4, 0);
        // SAFETY: as `bytes`; inputs are I32.
        unsafe { std::slice::from_raw_parts(self.ptr as *const i32, self.node.n_elements()) }
    }
}

/// A raw f32 base pointer that threads index by disjoint rows.
#[derive(Clone, Copy)]
struct Rows(*mut f32);
// SAFETY: every thread touches only its own rows.
unsafe impl Send for Rows {}
unsafe impl Sync for Rows {}

/// Runs `f(rows)` on disjoint row ranges of an op over `n_rows` rows, on all
/// threads when there are enough rows to pay for it (prompt processing).
fn by_rows(cx: &Ctx, n_rows: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    cx.pool.for_chunks(n_rows, 8, f)
}

/// Rows `r` of a contiguous `[width, ..]` f32 tensor.
///
/// # Safety
/// The rows are in bounds and no other thread uses them mutably.
#[allow(clippy::mut_from_ref)]
unsafe fn rows_mut(base: Rows, width: usize, r: &std::ops::Range<usize>) -> &mut [f32] {
    std::slice::from_raw_parts_mut(base.0.add(r.start * width), r.len() * width)
}

/// `dst = rms_norm(x) · w`, `w` one row: a norm and the multiply that is its
/// only reader, in one pass.
///
/// # Safety
/// `dst` is `x` itself or overlaps it nowhere, it does not overlap `w`, and
/// no other thread uses them.
pub unsafe fn rms_norm_mul(x: &Tensor, w: &Tensor, eps: f32, dst: Tensor, cx: &Ctx) {
    let (width, n_rows) = (dst.node.ne[0], dst.node.n_rows());
    let (out, isa, ws) = (Rows(dst.ptr as *mut f32), cx.isa, w.f32());
    if x.ptr == dst.ptr {
        return by_rows(cx, n_rows, |r| {
            elementwise::rms_norm_mul_in_place(rows_mut(out, width, &r), width, eps, ws, isa)
        });
    }
    let xs = x.f32();
    by_rows(cx, n_rows, |r| {
        elementwise::rms_norm_mul(&xs[r.start * width..r.end * width], width, eps, ws, rows_mut(out, width, &r), isa)
    })
}

/// Runs one node.
///
/// # Safety
/// `dst` must not overlap any of `srcs`, and no other thread may access them.
pub unsafe fn run(node: &Node, dst: Tensor, srcs: &[Tensor], cx: &Ctx) {
    let (width, n_rows) = (node.ne[0], node.n_rows());
    let (out, isa) = (Rows(dst.ptr as *mut f32), cx.isa);
    // Row `r`'s slice of a source; a one-row source broadcasts.
    let src_rows = |i: usize, r: &std::ops::Range<usize>| -> &[f32] {
        let x = srcs[i].f32();
        if x.len() == width {
            x
        } else {
            &x[r.start * width..r.end * width]
        }
    };
    match &node.op {
        Op::Weight(_) | Op::Input(_) | Op::KvCache { .. } => {}
        Op::GetRows => matmul::get_rows(&srcs[0], srcs[1].i32(), dst.f32_mut(), cx),
        Op::RmsNorm { eps } => {
            by_rows(cx, n_rows, |r| elementwise::rms_norm(src_rows(0, &r), width, *eps, rows_mut(out, width, &r), isa))
        }
        Op::HeadNorm { eps, head_dim } => {
            // x is contiguous, so its heads are rows of `head_dim`.
            let (hd, xs, ws) = (*head_dim, srcs[0].f32(), srcs[1].f32());
            by_rows(cx, node.n_elements() / hd, |r| {
                elementwise::rms_norm_mul(&xs[r.start * hd..r.end * hd], hd, *eps, ws, rows_mut(out, hd, &r), isa)
            })
        }
        Op::Mul => {
            by_rows(cx, n_rows, |r| elementwise::mul(src_rows(0, &r), src_rows(1, &r), rows_mut(out, width, &r), isa))
        }
        Op::Add => {
            by_rows(cx, n_rows, |r| elementwise::add(src_rows(0, &r), src_rows(1, &r), rows_mut(out, width, &r), isa))
        }
        Op::Scale { factor } => {
            by_rows(cx, n_rows, |r| elementwise::scale(src_rows(0, &r), *factor, rows_mut(out, width, &r), isa))
        }
        Op::GatedAct(act) => by_rows(cx, n_rows, |r| {
            elementwise::gated(src_rows(0, &r), src_rows(1, &r), *act, rows_mut(out, width, &r), isa)
        }),
        Op::Rope(p) => by_rows(cx, n_rows, |r| {
            let pos = &srcs[1].i32()[r.clone()];
            rope::rope(src_rows(0, &r), pos, srcs.get(2).map(|f| f.f32()), p, rows_mut(out, width, &r))
        }),
        Op::MulMat { precision } => matmul::mul_mat(&srcs[0], &srcs[1], *precision, dst.f32_mut(), cx),
        Op::Attention(p) => attention::attention(srcs, p, dst.f32_mut(), cx.pool, cx.isa),
        Op::Columns { width: w, start, len } => mla::columns(srcs[0].f32(), *w, *start, *len, dst.f32_mut()),
        Op::MulMatHeads { mm, precision } => {
            mla::mul_mat_heads(&srcs[0], srcs[1].f32(), mm, *precision, dst.f32_mut(), cx)
        }
        Op::LatentAttention(p) => mla::latent_attention(srcs, p, dst.f32_mut(), cx),
        Op::Route(p) => {
            let ids = std::slice::from_raw_parts_mut(dst.ptr as *mut i32, node.n_elements());
            moe::route(srcs[0].f32(), srcs.get(1).map(|b| b.f32()), p, ids)
        }
        Op::RouteWeights(p) => moe::route_weights(srcs[0].f32(), srcs[1].i32(), p, dst.f32_mut()),
        Op::MulMatId { precision } => moe::mul_mat_id(&srcs[0], &srcs[1], &srcs[2], *precision, dst.f32_mut(), cx),
        Op::MoeUpGate { act, precision } => {
            moe::moe_up_gate(&srcs[0], &srcs[1], &srcs[2], &srcs[3], *act, *precision, dst.f32_mut(), cx)
        }
        Op::ExpertSum => moe::expert_sum(srcs[0].f32(), srcs[1].f32(), node.ne[0], srcs[1].node.ne[0], dst.f32_mut()),
    }
}
