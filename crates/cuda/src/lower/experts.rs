//! Lowering the expert products of a mixture of experts (`Op::MulMatId`,
//! `Op::MoeUpGate`) to `moe_plan` and the expert GEMVs (`kernels/experts.cu`).
//!
//! The router's ids stay on the device: `moe_plan` groups a batch's
//! (token, slot) pairs by expert into items of up to 8 pairs, once per ids
//! node (a layer's gate/up and down share it), and each GEMV launches a
//! block row per possible item, `min(pairs, ⌈pairs / 8⌉ + n_expert)`; the
//! blocks past the plan's count return. So the launch list is the same for
//! every routing, and a decoding step replays as one graph.

use tern_graph::{NodeId, Op, Precision};

use super::fmat::act_shift;
use super::{grid1, Lower, Need};
use crate::args::{Act, MoeGemvArgs, MoePlanArgs};
use crate::kernels::Kernel;
use crate::launch::Launch;
use crate::qlayout::QLayout;
use crate::Weight;

/// Pairs an item of the plan holds (`MOE_MAXT` in experts.cu).
const ITEM_PAIRS: usize = 8;

/// A plan in the workspace (`moe_plan`'s outputs) and its most items.
#[derive(Clone, Copy)]
pub(super) struct MoePlan {
    items: u64,
    n_items: u64,
    sorted: u64,
    max_items: usize,
}

/// The kernel for a weight held as `w` (gate and up of a pair share a kind:
/// `supports` accepts no other pairs), for a gated pair or not, with int8
/// activations (`paired`) or f32 ones.
fn gemv_kernel(w: &Weight, up: Option<&Weight>, paired: bool) -> Kernel {
    let offsets = w.quant == Some(QLayout::LevelsOffset) || up.is_some_and(|u| u.quant == Some(QLayout::LevelsOffset));
    match (w.quant.is_some(), offsets, up.is_some(), paired) {
        (false, _, false, _) => Kernel::MoeDq,
        (false, _, true, _) => Kernel::MoeDqPair,
        (true, false, false, false) => Kernel::MoeQ8,
        (true, false, true, false) => Kernel::MoeQ8Pair,
        (true, true, false, false) => Kernel::MoeQ8o,
        (true, true, true, false) => Kernel::MoeQ8oPair,
        (true, false, false, true) => Kernel::MoeQ8p,
        (true, false, true, true) => Kernel::MoeQ8pPair,
        (true, true, false, true) => Kernel::MoeQ8op,
        (true, true, true, true) => Kernel::MoeQ8opPair,
    }
}

impl Lower<'_> {
    /// The plan of the pairs of `ids` (i32 `[k_used, n]`), made by the first
    /// expert product that reads them.
    fn moe_plan(&mut self, ids: NodeId, n_expert: usize) -> Result<MoePlan, Need> {
        if let Some(p) = self.moe_plans.get(&ids) {
            return Ok(*p);
        }
        let n_pairs = self.node_ref(ids).n_elements();
        let max_items = n_pairs.min(n_pairs.div_ceil(ITEM_PAIRS) + n_expert).max(1);
        let plan = MoePlan {
            items: self.take(16 * max_items),
            n_items: self.take(4),
            sorted: self.take(4 * n_pairs),
            max_items,
        };
        let args = MoePlanArgs {
            ids: self.ptr(ids)?,
            n_pairs: n_pairs as i32,
            n_expert: n_expert as i32,
            items: plan.items,
            n_items: plan.n_items,
            sorted: plan.sorted,
        };
        self.out.push(Launch::new(Kernel::MoePlan, (1, 1, 1), 1024, args).smem(8 * n_expert));
        self.moe_plans.insert(ids, plan);
        Ok(plan)
    }

    /// `MulMatId` (`srcs = [w, x, ids]`) or `MoeUpGate` (`[gate, up, x, ids]`)
    /// at `id`: one GEMV launch over the chosen experts' rows.
    pub(super) fn expert_product(&mut self, id: NodeId) -> Result<usize, Need> {
        let node = self.node_ref(id).clone();
        let (act, precision, ws, x, ids) = match node.op {
            Op::MoeUpGate { act, precision } => (Act::of(act), precision, &node.srcs[..2], node.srcs[2], node.srcs[3]),
            Op::MulMatId { precision } => (Act::None, precision, &node.srcs[..1], node.srcs[1], node.srcs[2]),
            _ => return super::fail("not an expert product"),
        };
        let Some(w) = self.weight(ws[0]).cloned() else { return super::fail("expert weight is not on this device") };
        let up = match ws.get(1) {
            Some(&u) => Some(self.weight(u).cloned().ok_or(Need::Error("expert weight is not on this device".into()))?),
            None => None,
        };
        let [k, rows, n_expert, _] = self.node_ref(ws[0]).ne;
        // MulMatId's x is [k, 1, n] (a column per token) or [k, k_used, n]
        // (per pair); MoeUpGate's [k, n].
        let x_pair = up.is_none() && self.node_ref(x).ne[1] != 1;
        // A quantized model's levels pair int8 activations (the CPU's
        // integers); gate and up share the type's block size (`supports`).
        let ab = act_shift(w.ty);
        let paired = w.quant.is_some() && precision == Precision::Paired;
        let (qa, da) = if paired { self.acts_q8(x, k, ab)? } else { (0, 0) };
        let plan = self.moe_plan(ids, n_expert)?;
        if plan.max_items > 65535 {
            return super::fail(format!("{} expert items exceed a grid's rows", plan.max_items));
        }
        let up_w = up.as_ref();
        let args = MoeGemvArgs {
            q: w.ptr_codes,
            s: w.ptr_scales,
            o: w.ptr_offsets,
            q2: up_w.map_or(0, |u| u.ptr_codes),
            s2: up_w.map_or(0, |u| u.ptr_scales),
            o2: up_w.map_or(0, |u| u.ptr_offsets),
            row_bytes: w.ty.row_bytes(k as u64).unwrap_or(0),
            ty: w.ty.id() as i32,
            rows: rows as i32,
            k: k as i32,
            x: self.ptr(x)?,
            qa,
            da,
            ab,
            x_pair: x_pair as i32,
            k_used: node.ne[1] as i32,
            items: plan.items,
            n_items: plan.n_items,
            sorted: plan.sorted,
            out: self.ptr(id)?,
            act,
        };
        let grid = (grid1(rows, 8).0, plan.max_items as u32, 1);
        self.out.push(Launch::new(gemv_kernel(&w, up_w, paired), grid, 256, args));
        Ok(1)
    }
}
