//! Lowering the expert products of a mixture of experts (`Op::MulMatId`,
//! `Op::MoeUpGate`) to `moe_plan` and the expert GEMVs (`kernels/experts.cu`).
//!
//! The router's ids stay on the device: `moe_plan` groups a batch's
//! (token, slot) pairs by expert into items of up to 8 pairs, once per ids
//! node (a layer's gate/up and down share it), and each GEMV launches a
//! block row per possible item, `min(pairs, ⌈pairs / 8⌉ + n_expert)`; the
//! blocks past the plan's count return. So the launch list is the same for
//! every routing, and a decoding step replays as one graph. One token's
//! GEMVs take no plan: its k_used experts are distinct, so block row y is
//! pair y, of expert `ids[y]`.

use tern_graph::{NodeId, Op, Precision};

use super::fmat::act_shift;
use super::{grid1, Lower, Need, MMA_K, MMA_ROWS, MMA_SMEM};
use crate::args::{Act, MmaArgs, MoeGemvArgs, MoePlanArgs};
use crate::kernels::Kernel;
use crate::launch::Launch;
use crate::qlayout::{self, QLayout};
use crate::Weight;

/// Pairs an item of the plan holds for the GEMVs (`MOE_MAXT` in
/// experts.cu), and for the tensor-core products (a block's 64 columns,
/// levels_mma.cu `MMA_BN`).
const ITEM_PAIRS: usize = 8;
const MMA_ITEM_PAIRS: usize = 64;
/// Rows a warp of a decoding step's expert GEMV takes (experts.cu
/// `MOE_ROWS`): its block quantizes the item's activations once for 16 rows.
const QX_ROWS: usize = 2;
/// The most shared memory a decoding step's expert GEMV takes for its
/// item's quantized activations (the default limit without opting in).
const IN_BLOCK_SMEM: usize = 48 << 10;

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
/// activations (`paired`) or f32 ones; `in_block`: a decoding step's paired
/// product quantizing its activations in each block.
fn gemv_kernel(w: &Weight, up: Option<&Weight>, paired: bool, in_block: bool) -> Kernel {
    let offsets = w.quant == Some(QLayout::LevelsOffset) || up.is_some_and(|u| u.quant == Some(QLayout::LevelsOffset));
    match (w.quant.is_some(), offsets, up.is_some(), paired, in_block) {
        (false, _, false, _, _) => Kernel::MoeDq,
        (false, _, true, _, _) => Kernel::MoeDqPair,
        (true, false, false, false, _) => Kernel::MoeQ8,
        (true, false, true, false, _) => Kernel::MoeQ8Pair,
        (true, true, false, false, _) => Kernel::MoeQ8o,
        (true, true, true, false, _) => Kernel::MoeQ8oPair,
        (true, false, false, true, false) => Kernel::MoeQ8p,
        (true, false, true, true, false) => Kernel::MoeQ8pPair,
        (true, true, false, true, false) => Kernel::MoeQ8op,
        (true, true, true, true, false) => Kernel::MoeQ8opPair,
        (true, false, false, true, true) => Kernel::MoeQ8pX,
        (true, false, true, true, true) => Kernel::MoeQ8pPairX,
        (true, true, false, true, true) => Kernel::MoeQ8opX,
        (true, true, true, true, true) => Kernel::MoeQ8opPairX,
    }
}

/// The arguments every tensor-core product shares: the levels `w` (and the
/// up matrix of a gated pair), `rows` of `k`, `act_q8`'s (q, d) in blocks of
/// 2^`ab`, and the output; the rest (which columns, dense, items or heads)
/// is the caller's.
pub(super) fn mma_args(
    w: &Weight,
    up: Option<&Weight>,
    rows: usize,
    k: usize,
    acts: (u64, u64),
    ab: i32,
    out: u64,
) -> MmaArgs {
    MmaArgs {
        q: w.ptr_codes,
        s: w.ptr_scales,
        o: w.ptr_offsets,
        q2: up.map_or(0, |u| u.ptr_codes),
        s2: up.map_or(0, |u| u.ptr_scales),
        o2: up.map_or(0, |u| u.ptr_offsets),
        rows: rows as i32,
        k: k as i32,
        qa: acts.0,
        da: acts.1,
        ab,
        out,
        ..MmaArgs::default()
    }
}

/// The tensor-core kernel for levels `w` (and the up matrix of a gated
/// pair): a k32 step per scale where both types' scales span 32.
pub(super) fn mma_kernel(w: &Weight, up: Option<&Weight>) -> Kernel {
    let offsets = w.quant == Some(QLayout::LevelsOffset) || up.is_some_and(|u| u.quant == Some(QLayout::LevelsOffset));
    let g32 = qlayout::scale_span(w.ty) == 32 && up.is_none_or(|u| qlayout::scale_span(u.ty) == 32);
    match (offsets, up.is_some(), g32) {
        (false, false, false) => Kernel::Q8pMma,
        (true, false, false) => Kernel::Q8pMmaO,
        (false, true, false) => Kernel::Q8pMmaPair,
        (true, true, false) => Kernel::Q8pMmaOPair,
        (false, false, true) => Kernel::Q8pMma32,
        (true, false, true) => Kernel::Q8pMmaO32,
        (false, true, true) => Kernel::Q8pMmaPair32,
        (true, true, true) => Kernel::Q8pMmaOPair32,
    }
}

impl Lower<'_> {
    /// The plan of the pairs of `ids` (i32 `[k_used, n]`), made by the first
    /// expert product that reads them.
    fn moe_plan(&mut self, ids: NodeId, n_expert: usize, per_item: usize) -> Result<MoePlan, Need> {
        if let Some(p) = self.moe_plans.get(&(ids, per_item)) {
            return Ok(*p);
        }
        let n_pairs = self.node_ref(ids).n_elements();
        let max_items = n_pairs.min(n_pairs.div_ceil(per_item) + n_expert).max(1);
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
            per_item: per_item as i32,
            items: plan.items,
            n_items: plan.n_items,
            sorted: plan.sorted,
        };
        self.out.push(Launch::new(Kernel::MoePlan, (1, 1, 1), 1024, args).smem(8 * n_expert));
        self.moe_plans.insert((ids, per_item), plan);
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
        // A prompt's int8 levels go to the tensor cores, a block per 64 rows
        // of an item of up to 64 pairs; a decoding step's blocks quantize
        // their item's activations themselves (at most 8 vectors of k).
        let n_tok = self.node_ref(ids).ne[1];
        let mma = paired && n_tok > super::FMAT_TOKENS && k % MMA_K == 0;
        let x_smem = ITEM_PAIRS * (k + 4 * (k >> ab));
        let in_block = paired && n_tok == 1 && x_smem <= IN_BLOCK_SMEM;
        let (qa, da) = if paired && !in_block { self.acts_q8(x, k, ab)? } else { (0, 0) };
        let plan = if n_tok == 1 && !mma {
            MoePlan { items: 0, n_items: 0, sorted: 0, max_items: self.node_ref(ids).n_elements() }
        } else {
            self.moe_plan(ids, n_expert, if mma { MMA_ITEM_PAIRS } else { ITEM_PAIRS })?
        };
        if plan.max_items > 65535 {
            return super::fail(format!("{} expert items exceed a grid's rows", plan.max_items));
        }
        let up_w = up.as_ref();
        if mma {
            let args = MmaArgs {
                items: plan.items,
                n_items: plan.n_items,
                sorted: plan.sorted,
                x_pair: x_pair as i32,
                k_used: node.ne[1] as i32,
                act,
                ..mma_args(&w, up_w, rows, k, (qa, da), ab, self.ptr(id)?)
            };
            let grid = (rows.div_ceil(MMA_ROWS) as u32, plan.max_items as u32, 1);
            self.out.push(Launch::new(mma_kernel(&w, up_w), grid, 128, args).smem(MMA_SMEM));
            return Ok(1);
        }
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
            ids: self.ptr(ids)?,
            n_expert: n_expert as i32,
            out: self.ptr(id)?,
            act,
        };
        // Q4_K experts are read in the file's blocks (`q4k.cu`).
        let native = in_block && w.ptr_native != 0 && up_w.is_none_or(|u| u.ptr_native != 0);
        let (kernel, args) = match (native, up_w) {
            (true, Some(u)) => (Kernel::MoeQ4kPairX, MoeGemvArgs { q: w.ptr_native, q2: u.ptr_native, ..args }),
            (true, None) => (Kernel::MoeQ4kX, MoeGemvArgs { q: w.ptr_native, ..args }),
            (false, _) => (gemv_kernel(&w, up_w, paired, in_block), args),
        };
        let per_block = if in_block { 8 * QX_ROWS } else { 8 };
        let grid = (grid1(rows, per_block).0, plan.max_items as u32, 1);
        let l = Launch::new(kernel, grid, 256, args);
        self.out.push(if in_block { l.smem(x_smem) } else { l });
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use tern_backend::TensorLoc;
    use tern_graph::{Activation, DType, Gating, Graph, Op, Precision, RouteParams};
    use tern_quant::GgmlType;

    use crate::args::Args;
    use crate::buffers::{Backing, Buffers, DevBuf};
    use crate::kernels::Kernel;
    use crate::lower::{lower, Scratch};
    use crate::weights::Held;
    use crate::Weight;

    const SCRATCH: Scratch =
        Scratch { base: 1 << 42, cap: 1 << 30, counters: 1 << 43, counters_cap: 1 << 20, stage_base: 0, stage_cap: 0 };

    /// A MoE FFN of `ty` experts on `n` tokens, lowered with every node in
    /// its own arena range and the experts held as `Held::of` says.
    fn lowered(ty: GgmlType, n: usize, precision: Precision) -> Vec<crate::launch::Launch> {
        // m: gate/up rows and down's k (whole blocks of every type).
        let (e, k, m, n_expert, k_used) = (256, 256, 256, 16, 4);
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [e, n, 1, 1]);
        let router = g.weight(1, "router", GgmlType::F32, [e, n_expert, 1, 1]);
        let (wg, wu) = (g.weight(2, "gate", ty, [k, m, n_expert, 1]), g.weight(3, "up", ty, [k, m, n_expert, 1]));
        let wd = g.weight(4, "down", ty, [m, e, n_expert, 1]);
        let logits = g.mul_mat(router, x, Precision::Float);
        let p = RouteParams {
            n_expert,
            k: k_used,
            gating: Gating::Softmax,
            biased: false,
            groups: None,
            norm: true,
            scale: 1.0,
        };
        let ids = g.route(logits, None, p);
        let w = g.route_weights(logits, ids, p);
        let act = g.moe_up_gate(wg, wu, x, ids, Activation::Silu, precision);
        let y = g.mul_mat_id(wd, act, ids, precision);
        let out = g.expert_sum(y, w);
        g.mark_output(out);
        let mut bufs = Buffers::default();
        let arena = bufs.insert(DevBuf { ptr: 1 << 40, bytes: 1 << 30, weight: None, backing: Backing::Device });
        let (mut locs, mut offset) = (vec![None; g.nodes.len()], 0);
        for id in g.ids() {
            let node = g.node(id);
            let held = match (node.op.clone(), node.dtype) {
                (Op::Weight(i), DType::Ggml(t)) if i >= 1 => Held::of(t, node.ne).map(|h| (t, h)),
                _ => None,
            };
            locs[id.index()] = Some(match held {
                Some((ty, h)) => {
                    let ptr = (1 << 41) + (id.0 as u64) * (1 << 24);
                    let quant = match h {
                        Held::Quant(l) => Some(l),
                        _ => None,
                    };
                    let offsets = quant == Some(crate::qlayout::QLayout::LevelsOffset);
                    let weight = Weight {
                        ty,
                        ptr_codes: ptr,
                        ptr_scales: ptr + 4096,
                        ptr_offsets: if offsets { ptr + 8192 } else { 0 },
                        ptr_native: if crate::weights::keeps_native(ty, node.ne[0]) { ptr + 12288 } else { 0 },
                        ternary: None,
                        quant,
                        staged: None,
                    };
                    let b = bufs.insert(DevBuf { ptr, bytes: 1 << 24, weight: Some(weight), backing: Backing::Device });
                    TensorLoc { buffer: b, offset: 0, nbytes: node.nbytes() }
                }
                None => {
                    let loc = TensorLoc { buffer: arena, offset, nbytes: node.nbytes() };
                    offset += node.nbytes().next_multiple_of(256);
                    loc
                }
            });
        }
        let nodes: Vec<_> = g.ids().filter(|&id| !matches!(g.node(id).op, Op::Weight(_) | Op::Input(_))).collect();
        lower(&g, &nodes, &locs, &bufs, SCRATCH, 132, true).unwrap_or_else(|e| panic!("{e:?}")).launches
    }

    /// What the tests read of an expert launch: (qa, ab, o, x_pair, items).
    fn expert_args(l: &crate::launch::Launch) -> (u64, i32, u64, i32, u64) {
        match l.args {
            Args::MoeGemv(a) => (a.qa, a.ab, a.o, a.x_pair, a.items),
            Args::Mma(a) => (a.qa, a.ab, a.o, a.x_pair, a.items),
            _ => panic!("{:?} is not an expert product", l.kernel),
        }
    }

    /// One plan for the router's ids serves both expert products (one
    /// token's take none: a block row a pair); a quantized model's products
    /// quantize each input once, in the blocks
    /// the type pairs with (Q4_K: Q8_K's 256; Q8_0: 32), and take the
    /// offset kernels only for a type with offsets; past 8 tokens they run
    /// on tensor cores. The grid has a row of blocks per possible item:
    /// min(pairs, ⌈pairs / per item⌉ + experts), 8 pairs an item for the
    /// GEMVs and 64 for the tensor cores.
    #[test]
    fn expert_products_share_one_plan_and_pick_their_kernels() {
        for (ty, n, precision, pair, single, ab, per_item) in [
            (GgmlType::Q4_K, 1, Precision::Paired, Kernel::MoeQ4kPairX, Kernel::MoeQ4kX, 8, 8),
            (GgmlType::Q5_K, 1, Precision::Paired, Kernel::MoeQ8opPairX, Kernel::MoeQ8opX, 8, 8),
            (GgmlType::Q8_0, 5, Precision::Paired, Kernel::MoeQ8pPair, Kernel::MoeQ8p, 5, 8),
            (GgmlType::Q8_0, 37, Precision::Paired, Kernel::Q8pMmaPair32, Kernel::Q8pMma32, 5, 64),
            (GgmlType::Q4_K, 300, Precision::Paired, Kernel::Q8pMmaOPair32, Kernel::Q8pMmaO32, 8, 64),
            (GgmlType::Q2_K, 300, Precision::Paired, Kernel::Q8pMmaOPair, Kernel::Q8pMmaO, 8, 64),
            (GgmlType::Q4_K, 37, Precision::Float, Kernel::MoeQ8oPair, Kernel::MoeQ8o, 8, 8),
            (GgmlType::F16, 5, Precision::Paired, Kernel::MoeDqPair, Kernel::MoeDq, 8, 8),
        ] {
            let l = lowered(ty, n, precision);
            let kernels: Vec<Kernel> = l.iter().map(|l| l.kernel).collect();
            let at = |k: Kernel| kernels.iter().position(|&x| x == k).unwrap_or_else(|| panic!("{ty}: no {k:?}"));
            let plans = kernels.iter().filter(|&&k| k == Kernel::MoePlan).count();
            assert_eq!(plans, (n > 1) as usize, "{ty}: {kernels:?}");
            let (up_gate, down) = (at(pair), at(single));
            assert!(up_gate < down, "{ty}: {kernels:?}");
            if n > 1 {
                let plan = at(Kernel::MoePlan);
                assert!(plan < up_gate, "{ty}: {kernels:?}");
                match l[plan].args {
                    Args::MoePlan(p) => assert_eq!(p.per_item, per_item as i32, "{ty} n={n}"),
                    _ => panic!("not a plan"),
                }
            }
            let quantized = precision == Precision::Paired && ty != GgmlType::F16;
            // One token's blocks quantize their activations themselves.
            let act_q8 = 2 * (quantized && n > 1) as usize;
            assert_eq!(kernels.iter().filter(|&&k| k == Kernel::ActQ8).count(), act_q8, "{ty}");
            let pairs = 4 * n;
            let items = if n == 1 { pairs } else { pairs.min(pairs.div_ceil(per_item) + 16) } as u32;
            for i in [up_gate, down] {
                let (qa, a_ab, o, _, _) = expert_args(&l[i]);
                assert_eq!(l[i].grid.1, items, "{ty} n={n}");
                // 256 rows: 8 a block, 16 where the block quantizes x
                // itself, 64 on tensor cores.
                let blocks = if per_item == 64 {
                    4
                } else if quantized && n == 1 {
                    16
                } else {
                    32
                };
                assert_eq!(l[i].grid.0, blocks, "{ty} n={n}");
                assert_eq!((qa != 0, a_ab), (quantized && n > 1, ab), "{ty}");
                if per_item == 8 {
                    assert_eq!(l[i].smem > 0, quantized && n == 1, "{ty} n={n}: activations in shared memory");
                }
                assert_eq!(o != 0, matches!(ty, GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K), "{ty}");
            }
            assert_eq!((expert_args(&l[up_gate]).3, expert_args(&l[down]).3), (0, 1), "{ty}");
            assert_eq!(expert_args(&l[up_gate]).4, expert_args(&l[down]).4, "{ty}: one plan");
            assert_eq!(expert_args(&l[down]).4 == 0, n == 1, "{ty} n={n}: one token's products read the ids");
        }
    }
}
