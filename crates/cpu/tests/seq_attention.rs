//! Multi-sequence batches of `Op::Attention` and `Op::LatentAttention`
//! (the ops' `SeqStarts` source), driven through the public CPU backend
//! against their twin: each sequence run alone, in the single-sequence form,
//! over a cache of its own.
//!
//! Three sequences share one cache, sequence `s` owning rows
//! `s·REGION..(s + 1)·REGION`. Each step puts runs of several sequences in
//! one batch, in varied orders and sizes (prompt chunks over more than one
//! token block and position block, single decoding tokens, a sequence left
//! out, a decoding token over four position blocks); every run is also
//! evaluated alone at the same positions, on the same q, k and v. Bound: none, bit for bit. The kernels cut a run's work
//! (token blocks, parts along the cache) from the run alone, so a sequence's
//! arithmetic is the same in any batch; any row read from another region,
//! or any key stored at a wrong row, changes the outputs or the caches. On 1
//! and 3 threads (3: decoding tokens cut along the cache) and every ISA
//! level the machine has; caches F32, F16 and Q8_0.

mod common;

use common::{setups, Data, Dev, Rng, Step};
use tern_cpu::isa::Isa;
use tern_graph::{AttentionParams, GgmlType, LatentAttentionParams, NodeId};

/// Rows of a sequence's region.
const REGION: usize = 320;
const SEQS: usize = 3;

/// Each step's runs: (sequence, tokens).
const STEPS: [&[(usize, usize)]; 6] = [
    &[(0, 5), (1, 1), (2, 70)],
    &[(1, 3), (0, 1), (2, 1)],
    &[(1, 200), (2, 1), (0, 1)],
    &[(2, 1), (0, 1), (1, 1)],
    &[(0, 40), (2, 1)],
    &[(1, 1), (2, 33), (0, 1)],
];

/// The attention an op test builds: widths of its inputs and its node.
trait Attend {
    /// Widths of the per-token inputs, and of a cache row (one cache for
    /// latent attention, K and V for plain attention).
    fn inputs(&self) -> Vec<usize>;
    fn caches(&self) -> usize;
    fn row(&self) -> usize;
    /// The op node over inputs `i`, caches `c` and positions, multi-sequence with `starts`.
    fn node(&self, st: &mut Step, i: &[NodeId], c: &[NodeId], pos: NodeId, starts: Option<NodeId>) -> NodeId;
}

struct Plain(AttentionParams);

impl Attend for Plain {
    fn inputs(&self) -> Vec<usize> {
        let p = &self.0;
        vec![p.head_dim * p.n_head, p.head_dim * p.n_head_kv, p.head_dim * p.n_head_kv]
    }

    fn caches(&self) -> usize {
        2
    }

    fn row(&self) -> usize {
        self.0.head_dim * self.0.n_head_kv
    }

    fn node(&self, st: &mut Step, i: &[NodeId], c: &[NodeId], pos: NodeId, starts: Option<NodeId>) -> NodeId {
        match starts {
            Some(starts) => st.g.seq_attention(i[0], i[1], i[2], c[0], c[1], pos, starts, self.0),
            None => st.g.attention(i[0], i[1], i[2], c[0], c[1], pos, self.0),
        }
    }
}

struct Latent(LatentAttentionParams);

impl Attend for Latent {
    fn inputs(&self) -> Vec<usize> {
        let p = &self.0;
        vec![p.rank * p.n_head, p.rope * p.n_head, p.rank, p.rope]
    }

    fn caches(&self) -> usize {
        1
    }

    fn row(&self) -> usize {
        self.0.rank + self.0.rope
    }

    fn node(&self, st: &mut Step, i: &[NodeId], c: &[NodeId], pos: NodeId, starts: Option<NodeId>) -> NodeId {
        match starts {
            Some(starts) => st.g.seq_latent_attention(i[0], i[1], i[2], i[3], c[0], pos, starts, self.0),
            None => st.g.latent_attention(i[0], i[1], i[2], i[3], c[0], pos, self.0),
        }
    }
}

/// Runs `STEPS` batched and alone (`op(kv_pos)` the op's form at a
/// position); panics at the first bit that differs.
fn check(op: &dyn Fn(usize) -> Box<dyn Attend>, ty: GgmlType, threads: usize, isa: Isa) {
    let a = op(0);
    let mut rng = Rng::new(0x5E05 + (a.row() * 31 + a.inputs()[0]) as u64);
    let mut dev = Dev::new(threads, isa);
    let rb = tern_quant::row_bytes(ty, a.row());
    let shared: Vec<_> = (0..a.caches()).map(|_| dev.alloc(rb * REGION * SEQS)).collect();
    let alone: Vec<Vec<_>> = (0..SEQS).map(|_| (0..a.caches()).map(|_| dev.alloc(rb * REGION)).collect()).collect();
    let mut pos = [0usize; SEQS];
    for (si, step) in STEPS.iter().enumerate() {
        let n: usize = step.iter().map(|&(_, len)| len).sum();
        let data: Vec<Vec<f32>> = a.inputs().iter().map(|w| rng.scaled(w * n, 1.0)).collect();
        // The batch: positions and region starts per token.
        let (mut positions, mut starts) = (Vec::new(), Vec::new());
        for &(s, len) in step.iter() {
            positions.extend((pos[s]..pos[s] + len).map(|p| p as i32));
            starts.extend(std::iter::repeat_n((s * REGION) as i32, len));
        }
        let mut st = Step::new();
        let ins: Vec<NodeId> = a.inputs().iter().zip(&data).map(|(&w, d)| st.f32(&mut dev, [w, n, 1, 1], d)).collect();
        let caches: Vec<NodeId> = shared.iter().map(|&loc| st.cache(ty, [a.row(), REGION * SEQS, 1, 1], loc)).collect();
        let p = st.i32(&mut dev, [n, 1, 1, 1], &positions);
        let s = st.i32(&mut dev, [n, 1, 1, 1], &starts);
        let y = a.node(&mut st, &ins, &caches, p, Some(s));
        st.run(&mut dev);
        let batched = st.read_f32(&dev, y);
        let width = batched.len() / n;

        // Each run alone, over its sequence's own cache.
        let mut first = 0;
        for &(s, len) in step.iter() {
            let one = op(pos[s]);
            let mut st = Step::new();
            let ins: Vec<NodeId> = one
                .inputs()
                .iter()
                .zip(&data)
                .map(|(&w, d)| st.f32(&mut dev, [w, len, 1, 1], &d[first * w..(first + len) * w]))
                .collect();
            let caches: Vec<NodeId> =
                alone[s].iter().map(|&loc| st.cache(ty, [one.row(), REGION, 1, 1], loc)).collect();
            let p = st.i32(&mut dev, [len, 1, 1, 1], &positions[first..first + len]);
            let y = one.node(&mut st, &ins, &caches, p, None);
            st.run(&mut dev);
            let want = st.read_f32(&dev, y);
            let got = &batched[first * width..(first + len) * width];
            let ctx = format!("{ty}, {threads} threads, {isa:?}: step {si}, sequence {s} ({len} at {})", pos[s]);
            assert_eq!(want.len(), got.len(), "{ctx}");
            for (i, (w, g)) in want.iter().zip(got).enumerate() {
                assert!(w.to_bits() == g.to_bits(), "{ctx}: output {i}: {g} batched, {w} alone");
            }
            pos[s] += len;
            first += len;
        }
    }
    // Each region holds what its sequence stored alone, and nothing past it.
    for (c, &loc) in shared.iter().enumerate() {
        let bytes = dev.read(loc);
        for (s, own) in alone.iter().enumerate() {
            let region = &bytes[s * REGION * rb..(s + 1) * REGION * rb];
            let want = dev.read(own[c]);
            assert_eq!(region[..pos[s] * rb], want[..pos[s] * rb], "{ty}: cache {c}, region {s}");
            assert!(region[pos[s] * rb..].iter().all(|&b| b == 0), "{ty}: cache {c}, region {s} past its rows");
        }
    }
}

#[test]
fn multi_sequence_attention_is_each_sequence_alone() {
    // (head_dim, heads, KV heads): groups of 4 (the grouped kernels) and 3.
    for (hd, nh, nkv) in [(64, 8, 2), (32, 6, 2)] {
        let params =
            move |kv_pos| AttentionParams { layer: 0, n_head: nh, n_head_kv: nkv, head_dim: hd, scale: 0.2, kv_pos };
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
            for (threads, isa) in setups() {
                check(&|kv_pos| Box::new(Plain(params(kv_pos))), ty, threads, isa);
            }
        }
    }
}

#[test]
fn multi_sequence_latent_attention_is_each_sequence_alone() {
    // (rank, rope, heads): heads a multiple of the grouped kernels' 4, and not;
    // rows of whole Q8_0 blocks.
    for (rank, rope, h) in [(64, 32, 4), (32, 32, 3)] {
        let params = move |kv_pos| LatentAttentionParams { layer: 0, n_head: h, rank, rope, scale: 0.15, kv_pos };
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0] {
            for (threads, isa) in setups() {
                check(&|kv_pos| Box::new(Latent(params(kv_pos))), ty, threads, isa);
            }
        }
    }
}
