//! The key a split's plan is found by, on the host's critical path every
//! decoding step: the nodes, their ops, shapes and precisions, where every
//! node and source lives, and the split's host copies.

use std::hash::{Hash, Hasher};

use tern_backend::{HostIo, TensorLoc};
use tern_graph::{Graph, NodeId, Op, Precision};

use crate::decode::{cache_span, CacheSpan};

/// The plan key's hasher, on the host's critical path every step (a 2B-4T
/// step hashes ~75 KB: 31 µs with SipHash, a few with this). Each word's
/// step `(rotl(h, 5) ^ w) · K` is a bijection of the state, so two keys of
/// one length that differ in a single word never collide.
#[derive(Default)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn write_u64(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u32(&mut self, w: u32) {
        self.write_u64(w as u64);
    }

    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Identifies a compute call cheaply: the nodes, their ops and shapes, and
/// where every node and source lives. Attention's cache position is left out
/// on purpose (kernels read positions from device memory), so that decoding
/// steps map to one plan a `CacheSpan` (`decode::cache_span`), which picks
/// `decode_run`'s module: up to three plans.
pub(crate) fn fingerprint(graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> u64 {
    let mut h = KeyHasher::default();
    let loc = |h: &mut KeyHasher, id: NodeId| {
        if let Some(l) = locs[id.index()] {
            (l.buffer.0, l.offset, l.nbytes).hash(h);
        }
    };
    for &id in nodes {
        let n = graph.node(id);
        // A product's precision picks its kernel.
        let paired = matches!(n.op, Op::MulMat { precision: Precision::Paired });
        let span = match &n.op {
            Op::Attention(p) => cache_span(p, n.ne[1]),
            _ => CacheSpan::Short,
        };
        (id.0, std::mem::discriminant(&n.op), paired, span, n.ne).hash(&mut h);
        loc(&mut h, id);
        for &s in &n.srcs {
            s.0.hash(&mut h);
            loc(&mut h, s);
        }
    }
    h.finish()
}

/// The plan key of a compute call: its fingerprint and its host copies.
pub(crate) fn plan_key(graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>], io: &HostIo) -> u64 {
    let mut h = KeyHasher::default();
    (fingerprint(graph, nodes, locs), io).hash(&mut h);
    h.finish()
}
