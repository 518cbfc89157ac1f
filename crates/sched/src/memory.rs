//! Memory planning: one arena per backend per graph, laid out by liveness so
//! that tensors whose lifetimes do not overlap share bytes. No allocation
//! happens per op, and the offsets are stable for a given graph shape (which
//! a device needs to replay captured work).

use std::collections::BTreeMap;

use tern_backend::BackendId;
use tern_graph::{Graph, NodeId, Op};

use crate::assign::{Assigned, Split};

/// Every arena tensor's offset is a multiple of this (cache lines, SIMD loads).
pub const ARENA_ALIGN: usize = 64;

/// Where the per-step tensors of one graph live.
#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    /// Offset in its backend's arena, for computed nodes and step inputs.
    pub node_offsets: Vec<Option<usize>>,
    /// Per split, per copy: offset of the copy in the split backend's arena.
    pub copy_offsets: Vec<Vec<usize>>,
    /// Bytes each backend's arena needs.
    pub arena_bytes: BTreeMap<BackendId, usize>,
}

/// A tensor to place: its backend, size and live range in execution steps.
struct Interval {
    backend: BackendId,
    bytes: usize,
    start: usize,
    end: usize,
    slot: Slot,
}

enum Slot {
    Node(NodeId),
    Copy { split: usize, copy: usize },
}

pub fn plan_memory(graph: &Graph, assigned: &[Assigned], splits: &[Split]) -> MemoryPlan {
    // Execution steps: each split first runs its copies (at its start step),
    // then its nodes, one step each. Step inputs are written before step 0.
    let mut step_of = vec![0usize; graph.nodes.len()];
    let mut split_start = Vec::with_capacity(splits.len());
    let mut step = 1;
    for s in splits {
        split_start.push(step);
        step += 1;
        for &n in &s.nodes {
            step_of[n.index()] = step;
            step += 1;
        }
    }
    let end_of_graph = step;

    // Last step at which each node is read, on its own backend or by a copy.
    let mut last_read = vec![0usize; graph.nodes.len()];
    for (si, s) in splits.iter().enumerate() {
        for &n in &s.nodes {
            for &src in &graph.node(n).srcs {
                let at = if s.copies.iter().any(|c| c.src == src) { split_start[si] } else { step_of[n.index()] };
                last_read[src.index()] = last_read[src.index()].max(at);
            }
        }
    }
    for &o in &graph.outputs {
        last_read[o.index()] = end_of_graph;
    }

    let mut intervals = Vec::new();
    for id in graph.ids() {
        let node = graph.node(id);
        let lives_in_arena = match node.op {
            Op::Input(_) => true,
            _ => !node.op.is_leaf(),
        };
        if lives_in_arena {
            let start = if node.op.is_leaf() { 0 } else { step_of[id.index()] };
            intervals.push(Interval {
                backend: assigned[id.index()].backend,
                bytes: node.nbytes(),
                start,
                end: last_read[id.index()].max(start),
                slot: Slot::Node(id),
            });
        }
    }
    for (si, s) in splits.iter().enumerate() {
        for (ci, c) in s.copies.iter().enumerate() {
            let end = s
                .nodes
                .iter()
                .filter(|n| graph.node(**n).srcs.contains(&c.src))
                .map(|n| step_of[n.index()])
                .max()
                // Only the readback split's copies have no reader: the caller
                // reads them after the last step.
                .unwrap_or(end_of_graph);
            intervals.push(Interval {
                backend: s.backend,
                bytes: graph.node(c.src).nbytes(),
                start: split_start[si],
                end,
                slot: Slot::Copy { split: si, copy: ci },
            });
        }
    }

    let mut plan = MemoryPlan {
        node_offsets: vec![None; graph.nodes.len()],
        copy_offsets: splits.iter().map(|s| vec![0; s.copies.len()]).collect(),
        arena_bytes: BTreeMap::new(),
    };
    intervals.sort_by_key(|iv| iv.start);
    let mut live: BTreeMap<BackendId, Vec<(usize, usize, usize)>> = BTreeMap::new(); // (offset, bytes, end)
    for iv in &intervals {
        let blocks = live.entry(iv.backend).or_default();
        blocks.retain(|&(_, _, end)| end >= iv.start);
        let offset = first_fit(blocks, iv.bytes);
        blocks.push((offset, iv.bytes, iv.end));
        let top = plan.arena_bytes.entry(iv.backend).or_insert(0);
        *top = (*top).max(offset + iv.bytes);
        match iv.slot {
            Slot::Node(id) => plan.node_offsets[id.index()] = Some(offset),
            Slot::Copy { split, copy } => plan.copy_offsets[split][copy] = offset,
        }
    }
    plan
}

/// Lowest aligned offset where `bytes` fits between the live blocks.
fn first_fit(blocks: &[(usize, usize, usize)], bytes: usize) -> usize {
    let mut taken: Vec<(usize, usize)> = blocks.iter().map(|&(o, b, _)| (o, o + b)).collect();
    taken.sort_unstable();
    let mut candidate = 0;
    for (start, end) in taken {
        if candidate + bytes <= start {
            break;
        }
        candidate = candidate.max(end.next_multiple_of(ARENA_ALIGN));
    }
    candidate
}
