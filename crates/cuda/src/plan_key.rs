//! The key a split's plan is found by, on the host's critical path every
//! decoding step: the nodes, their ops, shapes and precisions, where every
//! node and source lives, and the split's host copies.

use std::hash::{Hash, Hasher};

use tern_backend::{HostIo, TensorLoc};
use tern_graph::{Graph, NodeId, Op, Precision};

use crate::decode::{cache_span, CacheSpan};

/// The plan key's hasher, on the host's critical path every decoding step
/// (a 2B-4T step hashes ~20 words for each of ~1,000 nodes). Word i goes to
/// lane i mod LANES, whose step `(rotl(h, 5) ^ w) · K` is a bijection of the
/// lane's state, and `finish` folds the lanes with the same step, a
/// bijection of each lane's state given the others: two keys of one length
/// that differ in a single word never collide. The lanes are independent
/// chains of multiplies, so the host's hashing of a step overlaps itself
/// instead of waiting on one long dependent chain (BENCHMARKS.md: the
/// host's time between tokens).
#[derive(Default)]
struct KeyHasher {
    lanes: [u64; LANES],
    words: usize,
}

const LANES: usize = 4;
const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;

fn step(h: u64, w: u64) -> u64 {
    (h.rotate_left(5) ^ w).wrapping_mul(K)
}

impl Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for c in words.by_ref() {
            self.write_u64(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    fn write_u8(&mut self, w: u8) {
        self.write_u64(w as u64);
    }

    fn write_u64(&mut self, w: u64) {
        let lane = &mut self.lanes[self.words % LANES];
        *lane = step(*lane, w);
        self.words += 1;
    }

    fn write_u32(&mut self, w: u32) {
        self.write_u64(w as u64);
    }

    fn write_usize(&mut self, w: usize) {
        self.write_u64(w as u64);
    }

    fn finish(&self) -> u64 {
        self.lanes.iter().fold(self.words as u64, |h, &l| step(h, l))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(words: &[u64]) -> u64 {
        let mut h = KeyHasher::default();
        words.iter().for_each(|&w| h.write_u64(w));
        h.finish()
    }

    /// Keys of one length that differ in one word (in any lane, by any
    /// value) never collide; equal words give equal keys.
    #[test]
    fn one_word_apart_never_collides() {
        for len in 1..=13usize {
            let base: Vec<u64> = (0..len as u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            assert_eq!(key(&base), key(&base.clone()));
            for i in 0..len {
                for delta in [1u64, 1 << 63, 0xdead_beef] {
                    let mut other = base.clone();
                    other[i] ^= delta;
                    assert_ne!(key(&other), key(&base), "len {len} word {i} delta {delta:#x}");
                }
            }
        }
        assert_ne!(key(&[0]), key(&[0, 0]), "lengths count");
    }
}
