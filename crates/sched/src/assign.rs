//! Node assignment: every graph node gets a backend and the reason for it.
//!
//! Passes, in order:
//! 1. leaves live where their data is (weights by placement, the tied head's
//!    matmul operand at its device copy, caches at their layer's home, step
//!    inputs on the host);
//! 2. an op that writes a cache runs where the cache lives;
//! 3. an op that reads a weight runs where the weight lives, unless the
//!    offload policy moves a matmul on a host weight to the GPU that holds a
//!    staged copy of it (the weight leaf then lives at that copy), or the
//!    weight is a small one with a device copy and the op follows its
//!    computed input onto that device;
//! 4. any other op follows a computed input: one on a device if there is one
//!    (so the residual stream stays on the GPU once a layer's output is there,
//!    instead of bouncing back to where the embedding was looked up), else
//!    the first.
//!
//! A backend that cannot run the chosen op hands it to the host. Last, each
//! step input is written where its first reader runs: positions feed every
//! layer's rope, and kept on the host they would be copied to the GPU once
//! per split.

use std::fmt;

use tern_backend::{Backend, BackendId};
use tern_graph::{Graph, NodeId, Op};

use crate::offload::OffloadWhy;
use crate::placement::{CopyKind, Placement};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeReason {
    /// A weight leaf, placed by the placement.
    Weight,
    /// A KV cache leaf at its layer's home.
    Cache,
    /// A per-step input, written where its first reader runs.
    StepInput,
    /// The op writes a KV cache that lives on this backend.
    CacheLives,
    /// The op reads a weight that lives on this backend.
    WeightLives,
    /// The op follows its first computed input.
    InputLives,
    /// The preferred backend cannot run the op; the host does.
    Fallback,
    /// The tied head's matmul reads a device copy of `token_embd`.
    HeadCopy,
    /// A lookup of at least the policy's `min_batch` rows reads the device
    /// copy too, rather than copying the looked-up rows over.
    HeadCopyBatch,
    /// Any lookup reads the device copy when the first layer's first weight
    /// lives on that device: a decoding step then has no host split before
    /// its layers.
    HeadCopyFirstLayer,
    /// A host weight read by an offloaded op: its staged copy, streamed in.
    Staged,
    /// A small host weight's device copy, read by an op that follows its input there.
    Replica,
    /// The offload policy moved this op on a host weight to the GPU.
    Offload(OffloadWhy),
}

impl fmt::Display for NodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeReason::Weight => "weight",
            NodeReason::Cache => "cache",
            NodeReason::StepInput => "step input, where first read",
            NodeReason::CacheLives => "cache lives here",
            NodeReason::WeightLives => "weight lives here",
            NodeReason::InputLives => "input lives here",
            NodeReason::Fallback => "unsupported there, host fallback",
            NodeReason::HeadCopy => "device copy of the tied head",
            NodeReason::HeadCopyBatch => "device copy of the tied head, large lookup",
            NodeReason::HeadCopyFirstLayer => "device copy of the tied head, first layer there",
            NodeReason::Staged => "staged copy of a host weight, streamed in",
            NodeReason::Replica => "device copy of a small host weight",
            NodeReason::Offload(why) => return write!(f, "offloaded: {why}"),
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Assigned {
    pub backend: BackendId,
    pub reason: NodeReason,
}

/// Assigns every node of `graph`. `backends` answers `supports`.
pub fn assign(graph: &Graph, placement: &Placement, backends: &[&dyn Backend]) -> Vec<Assigned> {
    // Weight leaves a matmul reads (the head's use of a tied token_embd), and
    // how a lookup reads them.
    let mut read_by_matmul = vec![false; graph.nodes.len()];
    let mut lookup: Vec<Option<NodeReason>> = vec![None; graph.nodes.len()];
    // Whether the first weight the step reads after its lookup (the first
    // layer's norm) lives where the copy does.
    let first_layer_on_copy = placement.head_copy.is_some_and(|c| {
        let next = graph.nodes.iter().skip_while(|n| !matches!(n.op, Op::GetRows)).find_map(|n| match n.op {
            Op::Weight(i) if i != c.weight => Some(placement.weights[i].backend),
            _ => None,
        });
        next == Some(c.backend)
    });
    // Host weights whose matmul the offload policy moves to their staged copy.
    let mut offloaded: Vec<Option<OffloadWhy>> = vec![None; graph.nodes.len()];
    for n in &graph.nodes {
        match (&n.op, n.srcs.first()) {
            (Op::MulMat { .. }, Some(w)) => {
                read_by_matmul[w.index()] = true;
                offloaded[w.index()] =
                    placement.staged_work(graph, n).and_then(|(_, work)| placement.offload.decide(&work));
            }
            (Op::GetRows, Some(w)) if n.ne[1] >= placement.offload.min_batch => {
                lookup[w.index()] = Some(NodeReason::HeadCopyBatch)
            }
            (Op::GetRows, Some(w)) if first_layer_on_copy => lookup[w.index()] = Some(NodeReason::HeadCopyFirstLayer),
            _ => {}
        }
    }
    let mut out: Vec<Assigned> = Vec::with_capacity(graph.nodes.len());
    for (id, node) in graph.nodes.iter().enumerate() {
        let on = |backend, reason| Assigned { backend, reason };
        let src_backend = |i: usize| out[node.srcs[i].index()].backend;
        let a = match &node.op {
            Op::Weight(i) => match (placement.head_copy, lookup[id]) {
                (Some(c), _) if c.weight == *i && read_by_matmul[id] => on(c.backend, NodeReason::HeadCopy),
                (Some(c), Some(how)) if c.weight == *i => on(c.backend, how),
                _ => match (placement.staged_copy(*i), offloaded[id]) {
                    (Some(c), Some(_)) if c.kind == CopyKind::Staged => on(c.backend, NodeReason::Staged),
                    _ => on(placement.weights[*i].backend, NodeReason::Weight),
                },
            },
            Op::KvCache { layer, .. } => on(placement.kv_homes[*layer], NodeReason::Cache),
            Op::Input(_) => on(BackendId::CPU, NodeReason::StepInput),
            Op::Attention(p) => on(placement.kv_homes[p.layer], NodeReason::CacheLives),
            Op::LatentAttention(p) => on(placement.kv_homes[p.layer], NodeReason::CacheLives),
            _ => match node.srcs.iter().enumerate().find_map(|(k, s)| match graph.node(*s).op {
                Op::Weight(i) => Some((k, i)),
                _ => None,
            }) {
                Some((w, weight)) => {
                    let wid = node.srcs[w];
                    // A computed input on the device that holds a resident copy of the weight.
                    let replica_on = placement.staged_copy(weight).filter(|c| {
                        c.kind == CopyKind::Resident
                            && node
                                .srcs
                                .iter()
                                .any(|s| !graph.node(*s).op.is_leaf() && out[s.index()].backend == c.backend)
                    });
                    match (offloaded[wid.index()], replica_on) {
                        (Some(why), _) if out[wid.index()].reason == NodeReason::Staged => {
                            on(src_backend(w), NodeReason::Offload(why))
                        }
                        (_, Some(c)) => {
                            out[wid.index()] = on(c.backend, NodeReason::Replica);
                            on(c.backend, NodeReason::InputLives)
                        }
                        _ => on(src_backend(w), NodeReason::WeightLives),
                    }
                }
                None => {
                    let computed = || (0..node.srcs.len()).filter(|&i| !graph.node(node.srcs[i]).op.is_leaf());
                    let pick =
                        computed().find(|&i| !src_backend(i).is_host()).or_else(|| computed().next()).unwrap_or(0);
                    on(src_backend(pick), NodeReason::InputLives)
                }
            },
        };
        let a = if node.op.is_leaf() || supported(graph, node, a.backend, backends) {
            a
        } else {
            on(BackendId::CPU, NodeReason::Fallback)
        };
        out.push(a);
    }
    // Safe after the fact: copies are derived from the final assignment.
    for (id, node) in graph.nodes.iter().enumerate() {
        if !matches!(node.op, Op::Input(_)) {
            continue;
        }
        let me = NodeId(id as u32);
        if let Some(reader) = graph.nodes.iter().position(|n| n.srcs.contains(&me)) {
            out[id].backend = out[reader].backend;
        }
    }
    out
}

fn supported(graph: &Graph, node: &tern_graph::Node, id: BackendId, backends: &[&dyn Backend]) -> bool {
    let srcs: Vec<_> = node.srcs.iter().map(|s| graph.node(*s)).collect();
    backends.iter().find(|b| b.id() == id).is_some_and(|b| b.supports(node, &srcs))
}

/// A maximal run of consecutive computed nodes on one backend, with the
/// sources it must receive from other backends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub backend: BackendId,
    pub nodes: Vec<NodeId>,
    /// Sources living on another backend, copied in before the split runs.
    pub copies: Vec<Copy>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy {
    pub src: NodeId,
    pub from: BackendId,
}

/// Cuts the computed nodes into splits and finds the copies each needs.
/// Graph outputs computed on a device are read on the host: a last split on
/// `host`, with no nodes, copies them in. Scheduled like any other copy, a
/// device can do it as part of its last split's work (`Backend::compute_io`)
/// instead of a transfer call and a wait after it.
pub fn split(graph: &Graph, assigned: &[Assigned], host: Option<BackendId>) -> Vec<Split> {
    let mut splits: Vec<Split> = Vec::new();
    for id in graph.ids() {
        let node = graph.node(id);
        if node.op.is_leaf() {
            continue;
        }
        let backend = assigned[id.index()].backend;
        if splits.last().is_none_or(|s| s.backend != backend) {
            splits.push(Split { backend, nodes: Vec::new(), copies: Vec::new() });
        }
        let s = splits.last_mut().expect("pushed above");
        s.nodes.push(id);
        for &src in &node.srcs {
            let from = assigned[src.index()].backend;
            if from != backend && !s.copies.iter().any(|c| c.src == src) {
                s.copies.push(Copy { src, from });
            }
        }
    }
    let readback: Vec<Copy> = graph
        .outputs
        .iter()
        .map(|&src| Copy { src, from: assigned[src.index()].backend })
        .filter(|c| !c.from.is_host())
        .collect();
    if let Some(host) = host.filter(|_| !readback.is_empty()) {
        splits.push(Split { backend: host, nodes: Vec::new(), copies: readback });
    }
    splits
}
