//! Lowering the mixture-of-experts router (`Op::Route`, `Op::RouteWeights`)
//! and the weighted sum of the experts' outputs (`Op::ExpertSum`) onto
//! `kernels/route.cu`, whose kernels compute the CPU's floats
//! (`tern_cpu::ops::moe`) in the CPU's order.
//!
//! A Route and the RouteWeights of the same logits right after it (as
//! `models::moe` builds them) are one `route` launch writing both: the
//! scores are formed once. Everything the kernels read is in device memory,
//! so the launches replay in a captured graph with no host step.

use tern_graph::{DType, Node, NodeId, Op, RouteParams};

use super::{grid1, Lower, Need};
use crate::args::{ExpertSumArgs, Gating, RouteArgs, RouteWeightsArgs};
use crate::kernels::Kernel;
use crate::launch::Launch;

/// `ROUTE_THREADS` and the limits of route.cu (`route_limits_match_the_kernels`
/// compares them): experts a token, experts chosen, groups.
const THREADS: u32 = 256;
const MAX_EXPERTS: usize = 1024;
const MAX_K: usize = 32;
const MAX_GROUPS: usize = 64;

/// Whether route.cu computes `node` ([`crate::supports`] for the three ops).
pub(crate) fn supports(node: &Node, srcs: &[&Node]) -> bool {
    let f32 = |n: &Node| n.dtype == DType::F32;
    let router = |p: &RouteParams, logits: &Node| {
        let groups = p.groups.is_none_or(|g| g.count >= 1 && g.count <= p.n_expert.min(MAX_GROUPS));
        f32(logits) && logits.ne[0] == p.n_expert && p.n_expert <= MAX_EXPERTS && p.k >= 1 && p.k <= MAX_K && groups
    };
    match &node.op {
        Op::Route(p) => {
            // k ≤ n_expert: every slot gets an expert.
            let bias = !p.biased || srcs.get(1).is_some_and(|b| f32(b) && b.n_elements() == p.n_expert);
            router(p, srcs[0]) && p.k <= p.n_expert && bias
        }
        Op::RouteWeights(p) => router(p, srcs[0]) && srcs[1].dtype == DType::I32 && srcs[1].ne[0] == p.k,
        Op::ExpertSum => srcs.iter().all(|n| f32(n)) && srcs[0].ne[0] <= i32::MAX as usize,
        _ => false,
    }
}

impl Lower<'_> {
    /// The Route at `nodes[i]`, with the RouteWeights after it when that
    /// one reads these ids and logits with the same parameters and its
    /// output does not lie on what the launch reads or its ids.
    pub(super) fn route(&mut self, nodes: &[NodeId], i: usize, p: &RouteParams) -> Result<usize, Need> {
        let id = nodes[i];
        let node = self.node_ref(id).clone();
        let logits = node.srcs[0];
        let fused = nodes.get(i + 1).copied().filter(|&r| {
            let rn = self.node_ref(r);
            matches!(rn.op, Op::RouteWeights(q) if q == *p)
                && rn.srcs == [logits, id]
                && node.srcs.iter().chain([&id]).all(|&s| !self.overlaps(r, s))
        });
        let w = match fused {
            Some(r) => self.ptr(r)?,
            None => 0,
        };
        let (n_group, group_used) = p.groups.map_or((0, 0), |g| (g.count as i32, g.used as i32));
        let args = RouteArgs {
            logits: self.ptr(logits)?,
            bias: if p.biased { self.ptr(node.srcs[1])? } else { 0 },
            ids: self.ptr(id)?,
            w,
            n_expert: p.n_expert as i32,
            k: p.k as i32,
            gating: Gating::of(p.gating),
            n_group,
            group_used,
            norm: p.norm as i32,
            scale: p.scale,
        };
        self.out.push(Launch::new(Kernel::Route, (node.ne[1] as u32, 1, 1), THREADS, args));
        Ok(1 + fused.is_some() as usize)
    }

    pub(super) fn route_weights(&mut self, id: NodeId, p: &RouteParams) -> Result<usize, Need> {
        let node = self.node_ref(id).clone();
        let args = RouteWeightsArgs {
            logits: self.ptr(node.srcs[0])?,
            ids: self.ptr(node.srcs[1])?,
            w: self.ptr(id)?,
            n_expert: p.n_expert as i32,
            k: p.k as i32,
            gating: Gating::of(p.gating),
            norm: p.norm as i32,
            scale: p.scale,
        };
        self.out.push(Launch::new(Kernel::RouteWeights, (node.ne[1] as u32, 1, 1), THREADS, args));
        Ok(1)
    }

    /// `y [m, n] = Σ_j w[j] · ys[:, j]`, a thread an output.
    pub(super) fn expert_sum(&mut self, id: NodeId) -> Result<usize, Need> {
        let node = self.node_ref(id).clone();
        let ys = self.node_ref(node.srcs[0]);
        let (m, k, total) = (ys.ne[0], ys.ne[1], node.n_elements());
        let args = ExpertSumArgs {
            ys: self.ptr(node.srcs[0])?,
            w: self.ptr(node.srcs[1])?,
            y: self.ptr(id)?,
            m: m as i32,
            k: k as i32,
            total: total as u64,
        };
        self.out.push(Launch::new(Kernel::ExpertSum, grid1(total, 256), 256, args));
        Ok(1)
    }
}

#[cfg(test)]
mod tests {
    use tern_backend::TensorLoc;
    use tern_graph::{ExpertGroups, Gating as GraphGating, Graph, Op, RouteParams};
    use tern_quant::GgmlType;

    use super::*;
    use crate::args::Args;
    use crate::buffers::{Backing, Buffers, DevBuf};
    use crate::kernels::SOURCES;
    use crate::lower::{lower, Scratch};

    const SCRATCH: Scratch =
        Scratch { base: 1 << 42, cap: 1 << 20, counters: 1 << 43, counters_cap: 1 << 20, stage_base: 0, stage_cap: 0 };

    /// DeepSeek-V3's router: 256 experts in 8 groups, 4 used, top 8.
    fn v3() -> RouteParams {
        RouteParams {
            n_expert: 256,
            k: 8,
            gating: GraphGating::Sigmoid,
            biased: true,
            groups: Some(ExpertGroups { count: 8, used: 4 }),
            norm: true,
            scale: 2.5,
        }
    }

    /// logits → route → route_weights → expert_sum of ys, every node its
    /// own range of one arena (`alias`: one node's bytes on another's).
    fn lowered(p: RouteParams, n: usize, alias: Option<(usize, usize)>) -> Vec<Launch> {
        let mut g = Graph::new();
        let logits = g.weight(0, "logits", GgmlType::F32, [p.n_expert, n, 1, 1]);
        let bias = p.biased.then(|| g.weight(1, "bias", GgmlType::F32, [p.n_expert, 1, 1, 1]));
        let ys = g.weight(2, "ys", GgmlType::F32, [64, p.k, n, 1]);
        let ids = g.route(logits, bias, p);
        let w = g.route_weights(logits, ids, p);
        let y = g.expert_sum(ys, w);
        g.mark_output(y);
        let mut bufs = Buffers::default();
        let arena = bufs.insert(DevBuf { ptr: 1 << 40, bytes: 1 << 30, weight: None, backing: Backing::Device });
        let mut locs = Vec::new();
        let mut offset = 0;
        for id in g.ids() {
            let nbytes = g.node(id).nbytes();
            locs.push(Some(TensorLoc { buffer: arena, offset, nbytes }));
            offset += nbytes.next_multiple_of(256);
        }
        if let Some((a, b)) = alias {
            locs[a] = Some(TensorLoc { nbytes: locs[a].unwrap().nbytes, ..locs[b].unwrap() });
        }
        let nodes: Vec<_> = g.ids().filter(|&id| !g.node(id).op.is_leaf()).collect();
        lower(&g, &nodes, &locs, &bufs, SCRATCH, 132, false).unwrap_or_else(|e| panic!("{e:?}")).launches
    }

    /// The Route and its RouteWeights are one launch writing both; the
    /// launch carries the router's parameters.
    #[test]
    fn route_and_its_weights_are_one_launch() {
        let ls = lowered(v3(), 7, None);
        let kernels: Vec<_> = ls.iter().map(|l| l.kernel).collect();
        assert_eq!(kernels, [Kernel::Route, Kernel::ExpertSum]);
        let Args::Route(a) = ls[0].args else { panic!("{:?}", ls[0].args) };
        assert!(a.w != 0 && a.bias != 0 && a.ids != 0);
        assert_eq!((a.n_expert, a.k, a.n_group, a.group_used, a.norm), (256, 8, 8, 4, 1));
        assert_eq!((a.gating, a.scale), (Gating::Sigmoid, 2.5));
        assert_eq!(ls[0].grid, (7, 1, 1));
        let Args::ExpertSum(s) = ls[1].args else { panic!() };
        assert_eq!((s.m, s.k, s.total), (64, 8, 64 * 7));
        assert_eq!(s.w, a.w, "the sum reads the fused weights");
    }

    /// Weights placed over the logits (which the fused kernel still reads
    /// for other tokens) take their own launch.
    #[test]
    fn overlapping_weights_are_not_fused() {
        // Nodes: logits 0, bias 1, ys 2, route 3, route_weights 4, sum 5.
        let ls = lowered(v3(), 3, Some((4, 0)));
        let kernels: Vec<_> = ls.iter().map(|l| l.kernel).collect();
        assert_eq!(kernels, [Kernel::Route, Kernel::RouteWeights, Kernel::ExpertSum]);
        let Args::Route(a) = ls[0].args else { panic!() };
        assert_eq!(a.w, 0);
        let p = RouteParams { biased: false, groups: None, gating: GraphGating::Softmax, ..v3() };
        let Args::Route(a) = lowered(p, 1, None)[0].args else { panic!() };
        assert_eq!((a.bias, a.n_group, a.gating), (0, 0, Gating::Softmax));
    }

    /// What the kernels cannot do is refused.
    #[test]
    fn supports_refuses_past_the_limits() {
        let node = |op: Op, ne: [usize; 4]| Node { op, srcs: vec![], ne, dtype: DType::I32, label: None };
        let f32 = |ne: [usize; 4]| Node { dtype: DType::F32, ..node(Op::Add, ne) };
        let check = |p: RouteParams| {
            let (logits, bias) = (f32([p.n_expert, 5, 1, 1]), f32([p.n_expert, 1, 1, 1]));
            let srcs: Vec<&Node> = if p.biased { vec![&logits, &bias] } else { vec![&logits] };
            supports(&node(Op::Route(p), [p.k, 5, 1, 1]), &srcs)
        };
        assert!(check(v3()));
        assert!(check(RouteParams { n_expert: 384, k: 16, groups: None, ..v3() }));
        assert!(check(RouteParams { n_expert: MAX_EXPERTS, k: MAX_K, groups: None, ..v3() }));
        assert!(!check(RouteParams { n_expert: MAX_EXPERTS + 1, groups: None, ..v3() }));
        assert!(!check(RouteParams { k: MAX_K + 1, ..v3() }));
        assert!(!check(RouteParams { n_expert: 4, k: 5, groups: None, ..v3() }));
        assert!(!check(RouteParams { groups: Some(ExpertGroups { count: 0, used: 0 }), ..v3() }));
        assert!(!check(RouteParams { n_expert: 512, groups: Some(ExpertGroups { count: 128, used: 4 }), ..v3() }));
    }

    /// The limits here are route.cu's.
    #[test]
    fn route_limits_match_the_kernels() {
        let src = SOURCES.iter().find(|(name, _)| *name == "route").expect("route.cu").1;
        let define = |name: &str| -> usize {
            let line = src.lines().find_map(|l| l.strip_prefix(&format!("#define {name} "))).expect(name);
            line.trim().parse().expect("an integer")
        };
        assert_eq!(define("ROUTE_THREADS"), THREADS as usize);
        assert_eq!(define("ROUTE_MAX_EXPERTS"), MAX_EXPERTS);
        assert_eq!(define("ROUTE_MAX_K"), MAX_K);
        assert_eq!(define("ROUTE_MAX_GROUPS"), MAX_GROUPS);
    }
}
