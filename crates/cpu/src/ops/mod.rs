//! Kernels by op family, and the dispatch from graph ops to them.

mod attention;
mod elementwise;
mod matmul;
mod rope;

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

/// Runs one node.
///
/// # Safety
/// `dst` must not overlap any of `srcs`, and no other thread may access them.
pub unsafe fn run(node: &Node, dst: Tensor, srcs: &[Tensor], cx: &Ctx) {
    match &node.op {
        Op::Weight(_) | Op::Input(_) | Op::KvCache { .. } => {}
        Op::GetRows => matmul::get_rows(&srcs[0], srcs[1].i32(), dst.f32_mut()),
        Op::RmsNorm { eps } => elementwise::rms_norm(srcs[0].f32(), node.ne[0], *eps, dst.f32_mut()),
        Op::Mul => elementwise::binary(srcs[0].f32(), srcs[1].f32(), dst.f32_mut(), |a, b| a * b),
        Op::Add => elementwise::binary(srcs[0].f32(), srcs[1].f32(), dst.f32_mut(), |a, b| a + b),
        Op::Scale { factor } => elementwise::scale(srcs[0].f32(), *factor, dst.f32_mut()),
        Op::GatedAct(act) => elementwise::gated(srcs[0].f32(), srcs[1].f32(), *act, dst.f32_mut()),
        Op::MulMat { precision } => matmul::mul_mat(&srcs[0], &srcs[1], *precision, dst.f32_mut(), cx),
        Op::Rope(p) => rope::rope(srcs[0].f32(), srcs[1].i32(), srcs.get(2).map(|f| f.f32()), p, dst.f32_mut()),
        Op::Attention(p) => attention::attention(srcs, p, dst.f32_mut(), cx.pool, cx.isa),
    }
}
