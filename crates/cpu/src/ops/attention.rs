//! Causal attention over a layer's KV cache (f32, f16 or q8_0 rows), flash
//! style: one pass over the cache with an online softmax, never materialising
//! the whole score matrix.
//!
//! The op stores this batch's keys and values into the cache, then each task
//! (KV head, block of query tokens) walks the cache in blocks of positions:
//! every K and V row is widened to f32 once and shared by all the query heads
//! of its group (GQA) and all the tokens of the block. Scores of a position
//! block are computed first so their exponentials run as one vector loop.

use half::f16;
use half::slice::HalfFloatSliceExt;
use tern_graph::{AttentionParams, DType, GgmlType};

use super::seqs::{self, Run};
use super::Tensor;
use crate::isa::Isa;
use crate::kernels::vec;
use crate::pool::Pool;

/// Query tokens per task and cache positions per block.
const TOKENS: usize = 32;
const POSITIONS: usize = 64;

/// A cache as rows of `width` elements of type `ty` (F32, F16 or Q8_0).
pub(super) struct Cache {
    ptr: *mut u8,
    ty: GgmlType,
    width: usize,
    row_bytes: usize,
}

// SAFETY: threads only read cache rows after the single-threaded store below.
unsafe impl Sync for Cache {}

impl Cache {
    pub(super) fn new(t: &Tensor) -> Cache {
        let ty = match t.node.dtype {
            DType::Ggml(ty) => ty,
            DType::I32 => unreachable!("supports() admits only F32, F16 and Q8_0 caches"),
        };
        let width = t.node.ne[0];
        let row_bytes = ty.row_bytes(width as u64).expect("cache rows are whole blocks") as usize;
        Cache { ptr: t.ptr, ty, width, row_bytes }
    }

    /// # Safety
    /// `row` is inside the cache and nobody reads it concurrently.
    pub(super) unsafe fn store(&self, row: usize, src: &[f32]) {
        let bytes = std::slice::from_raw_parts_mut(self.ptr.add(row * self.row_bytes), self.row_bytes);
        match self.ty {
            GgmlType::F16 => {
                std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f16, self.width).convert_from_f32_slice(src)
            }
            GgmlType::F32 => {
                std::slice::from_raw_parts_mut(bytes.as_mut_ptr() as *mut f32, self.width).copy_from_slice(src)
            }
            ty => tern_quant::quantize_row(ty, src, bytes),
        }
    }

    /// Element range `[start, start + out.len())` of `row`, widened into `out`
    /// (`start` and the length are whole blocks: head boundaries).
    pub(super) fn load(&self, row: usize, start: usize, out: &mut [f32], isa: Isa) {
        // SAFETY: rows below the current position were written by `store`; the
        // cache buffer holds n_ctx rows (checked when the graph was built).
        unsafe {
            let base = self.ptr.add(row * self.row_bytes);
            match self.ty {
                GgmlType::F16 => {
                    vec::f16_to_f32(std::slice::from_raw_parts((base as *const f16).add(start), out.len()), out, isa)
                }
                GgmlType::F32 => {
                    out.copy_from_slice(std::slice::from_raw_parts((base as *const f32).add(start), out.len()))
                }
                ty => {
                    let (be, bb) = (ty.block_elems(), ty.layout().block_bytes);
                    let bytes = std::slice::from_raw_parts(base.add(start / be * bb), out.len() / be * bb);
                    tern_quant::dequantize_row(ty, bytes, tern_quant::TensorScale::ONE, out);
                }
            }
        }
    }
}

struct Out(*mut f32);
// SAFETY: each task writes the outputs of its own (token block, KV head) queries.
unsafe impl Sync for Out {}

/// # Safety
/// `srcs[3..5]` are the layer's caches, not aliased by any other view in use.
pub unsafe fn attention(srcs: &[Tensor], p: &AttentionParams, out: &mut [f32], pool: &Pool, isa: Isa) {
    let runs = seqs::runs(srcs, p.kv_pos, srcs[0].node.ne[1], srcs[3].node.ne[1]);
    // Decoding has one task per KV head, few and uneven against the threads:
    // each is then cut along the cache into parts (up to one per thread, of
    // whole position blocks) that run at once, and the parts' softmax states
    // are merged after (flash-decoding). No work is repeated across parts.
    // The cut depends on the run alone, so a sequence gets the same bits in
    // any batch.
    let threads = pool.threads();
    let parts = |r: &Run| if r.len() <= TOKENS && threads > 1 { r.end().div_ceil(POSITIONS).min(threads) } else { 1 };
    attention_in_parts(srcs, p, &runs, out, pool, isa, &parts);
}

/// How one run's work is cut: `parts` pieces of `per_part` positions along
/// the cache, their softmax states from query slot `first` of the partials.
struct Cut {
    parts: usize,
    per_part: usize,
    first: usize,
}

/// [`attention`] over `runs`, each run's cache cut into `parts(run)` (1 for
/// runs of more than one token block).
///
/// # Safety
/// As [`attention`].
#[allow(clippy::too_many_arguments)]
unsafe fn attention_in_parts(
    srcs: &[Tensor],
    p: &AttentionParams,
    runs: &[Run],
    out: &mut [f32],
    pool: &Pool,
    isa: Isa,
    parts: &dyn Fn(&Run) -> usize,
) {
    let (q, k, v) = (srcs[0].f32(), srcs[1].f32(), srcs[2].f32());
    let (kc, vc) = (Cache::new(&srcs[3]), Cache::new(&srcs[4]));
    let kv_width = p.head_dim * p.n_head_kv;
    let n_tokens = srcs[0].node.ne[1];
    for r in runs {
        for t in r.tokens.clone() {
            kc.store(r.row(t), &k[t * kv_width..(t + 1) * kv_width]);
            vc.store(r.row(t), &v[t * kv_width..(t + 1) * kv_width]);
        }
    }
    let group = p.n_head / p.n_head_kv;
    let queries = TOKENS.min(n_tokens) * group;
    // Tasks are (run, token block, KV head, part), in that order; each part
    // covers whole position blocks.
    let mut cuts = Vec::with_capacity(runs.len());
    let mut tasks = Vec::new();
    let mut slots = 0;
    for (ri, r) in runs.iter().enumerate() {
        let (n_parts, blocks) = (parts(r), r.len().div_ceil(TOKENS));
        assert!(n_parts == 1 || blocks == 1, "only one block of tokens is split along the cache");
        let per_part = r.end().div_ceil(POSITIONS).div_ceil(n_parts) * POSITIONS;
        cuts.push(Cut { parts: n_parts, per_part, first: slots });
        if n_parts > 1 {
            slots += p.n_head_kv * n_parts * r.len() * group;
        }
        for b in 0..blocks {
            for g in 0..p.n_head_kv {
                tasks.extend((0..n_parts).map(|part| (ri, b, g, part)));
            }
        }
    }
    let mut partials = vec![0f32; slots * Partial::len(p)];
    let (sink, partial) = (Out(out.as_mut_ptr()), Out(partials.as_mut_ptr()));
    // Later token blocks see more of the cache: threads take tasks strided,
    // not in contiguous runs, so each gets a fair share of early and late ones.
    // Threads without a task must not pay for scratch, and the busy ones
    // reuse theirs across calls.
    pool.run(&|thread, n_threads| {
        let mine = (thread..tasks.len()).step_by(n_threads);
        if mine.len() == 0 {
            return;
        }
        SCRATCH.with_borrow_mut(|scratch| {
            let task = match scratch {
                Some(t) if t.fits(p, queries) => t,
                _ => scratch.insert(Task::new(p, queries)),
            };
            for i in mine {
                let (ri, b, g, part) = tasks[i];
                let (r, cut) = (&runs[ri], &cuts[ri]);
                let tokens = r.tokens.start + b * TOKENS..(r.tokens.start + (b + 1) * TOKENS).min(r.tokens.end);
                task.run(p, q, &kc, &vc, g, r, tokens.clone(), part * cut.per_part..(part + 1) * cut.per_part, isa);
                if cut.parts == 1 {
                    task.write_out(p, g, tokens, &sink);
                } else {
                    let n_q = r.len() * group;
                    task.write_partial(p, n_q, &partial, cut.first + (g * cut.parts + part) * n_q);
                }
            }
        });
    });
    for (r, cut) in runs.iter().zip(&cuts).filter(|(_, c)| c.parts > 1) {
        let states = &partials[cut.first * Partial::len(p)..];
        merge_parts(states, p, cut.parts, r.tokens.clone(), out);
    }
}

/// One query's softmax state over part of the cache: running max, running
/// sum, then the unnormalised accumulator (`head_dim`).
struct Partial;

impl Partial {
    fn len(p: &AttentionParams) -> usize {
        2 + p.head_dim
    }
}

/// Out = Σ_parts acc·e^(max − M) / Σ_parts sum·e^(max − M), M the largest max,
/// for the queries of `tokens` (one run, states from the start of `partials`).
/// A part that saw no position of a query has max −∞ and weighs nothing;
/// position 0 is in the first part and visible to every query.
fn merge_parts(partials: &[f32], p: &AttentionParams, parts: usize, tokens: std::ops::Range<usize>, out: &mut [f32]) {
    let (group, hd, len) = (p.n_head / p.n_head_kv, p.head_dim, Partial::len(p));
    let (width, queries) = (hd * p.n_head, tokens.len() * group);
    for g in 0..p.n_head_kv {
        for (ti, t) in tokens.clone().enumerate() {
            for h in 0..group {
                let qi = ti * group + h;
                let state = |part: usize| &partials[((g * parts + part) * queries + qi) * len..][..len];
                let m = (0..parts).map(|part| state(part)[0]).fold(f32::NEG_INFINITY, f32::max);
                let o = &mut out[t * width + (g * group + h) * hd..][..hd];
                o.fill(0.0);
                let mut sum = 0.0;
                for part in 0..parts {
                    let st = state(part);
                    let w = (st[0] - m).exp();
                    sum += st[1] * w;
                    for (o, a) in o.iter_mut().zip(&st[2..]) {
                        *o += a * w;
                    }
                }
                let inv = 1.0 / sum;
                o.iter_mut().for_each(|x| *x *= inv);
            }
        }
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Option<Task>> = const { std::cell::RefCell::new(None) };
}

/// Scratch of one task: per query (token of the block × head of the group)
/// the running max, running sum and accumulator of the online softmax.
struct Task {
    group: usize,
    hd: usize,
    krows: Vec<f32>,
    /// The K block transposed, `[head_dim][POSITIONS]`, zero past the block.
    kt: Vec<f32>,
    vrows: Vec<f32>,
    scores: Vec<f32>,
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

impl Task {
    /// Scratch for up to `queries` (tokens × heads of a group) at a time.
    fn new(p: &AttentionParams, queries: usize) -> Task {
        let (group, hd) = (p.n_head / p.n_head_kv, p.head_dim);
        Task {
            group,
            hd,
            krows: vec![0.0; POSITIONS * hd],
            kt: vec![0.0; POSITIONS * hd],
            vrows: vec![0.0; POSITIONS * hd],
            scores: vec![0.0; POSITIONS],
            max: vec![f32::NEG_INFINITY; queries],
            sum: vec![0.0; queries],
            acc: vec![0.0; queries * hd],
        }
    }

    fn fits(&self, p: &AttentionParams, queries: usize) -> bool {
        self.group == p.n_head / p.n_head_kv && self.hd == p.head_dim && self.max.len() >= queries
    }

    /// Folds a block of scores into query `qi`'s running softmax: turns them
    /// into weights (in place) and returns the factor that rescales what was
    /// accumulated under the old max.
    fn online_softmax(&mut self, qi: usize, scores: &mut [f32], isa: Isa) -> f32 {
        let new_max = self.max[qi].max(vec::max(scores, isa));
        let rescale = (self.max[qi] - new_max).exp();
        self.max[qi] = new_max;
        self.sum[qi] = self.sum[qi] * rescale + vec::exp_shifted_sum(scores, new_max, isa);
        rescale
    }

    /// The queries of `tokens` (of run `r`) and KV head `g` over the run's
    /// sequence positions `positions`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        p: &AttentionParams,
        q: &[f32],
        kc: &Cache,
        vc: &Cache,
        g: usize,
        r: &Run,
        tokens: std::ops::Range<usize>,
        positions: std::ops::Range<usize>,
        isa: Isa,
    ) {
        let (group, hd) = (self.group, self.hd);
        let width = hd * p.n_head;
        let n_q = tokens.len() * group;
        self.max[..n_q].fill(f32::NEG_INFINITY);
        self.sum[..n_q].fill(0.0);
        self.acc[..n_q * hd].fill(0.0);
        // The last token of the block sees the most positions.
        let end = r.seen(tokens.end - 1).min(positions.end);
        for start in (positions.start..end).step_by(POSITIONS) {
            let n_pos = POSITIONS.min(end - start);
            for j in 0..n_pos {
                kc.load(r.row0 + start + j, g * hd, &mut self.krows[j * hd..(j + 1) * hd], isa);
                vc.load(r.row0 + start + j, g * hd, &mut self.vrows[j * hd..(j + 1) * hd], isa);
            }
            // Scores then run along positions: one broadcast of q[d] feeds a
            // whole vector of positions, with no horizontal sums. One token's
            // grouped heads read the key rows as they are instead: for them
            // the transposed copy would cost more than the scores.
            let grouped = group / vec::HEADS * vec::HEADS;
            let rows_only = tokens.len() == 1 && grouped == group;
            if !rows_only {
                // Scores of positions past a short block must read zeros.
                if n_pos < POSITIONS {
                    self.kt.fill(0.0);
                }
                for j in 0..n_pos {
                    for d in 0..hd {
                        self.kt[d * POSITIONS + j] = self.krows[j * hd + d];
                    }
                }
            }
            for (ti, t) in tokens.clone().enumerate() {
                // Causal: token t sees its sequence's positions up to its own.
                let visible = r.seen(t).saturating_sub(start).min(n_pos);
                if visible == 0 {
                    continue;
                }
                let qv = |h: usize| &q[t * width + (g * group + h) * hd..][..hd];
                // Whole groups of HEADS heads share each K and V load; the rest go one by one.
                for h0 in (0..grouped).step_by(vec::HEADS) {
                    let qi0 = ti * group + h0;
                    let mut scores = [[0f32; POSITIONS]; vec::HEADS];
                    let qs = std::array::from_fn(|i| qv(h0 + i));
                    if rows_only {
                        vec::scores_rows_heads(qs, &self.krows[..n_pos * hd], p.scale, &mut scores, isa);
                    } else {
                        vec::scores_transposed_heads(qs, &self.kt, p.scale, &mut scores, isa);
                    }
                    let (max, sum) = (&mut self.max[qi0..qi0 + vec::HEADS], &mut self.sum[qi0..qi0 + vec::HEADS]);
                    let rescale = vec::softmax_heads(&mut scores, visible, max, sum, isa);
                    let mut accs = self.acc[qi0 * hd..(qi0 + vec::HEADS) * hd].chunks_exact_mut(hd);
                    let accs = std::array::from_fn(|_| accs.next().expect("HEADS accumulators"));
                    let w = std::array::from_fn(|i| &scores[i][..visible]);
                    vec::weighted_rows_heads(accs, rescale, w, &self.vrows[..visible * hd], isa);
                }
                for h in grouped..group {
                    let qi = ti * group + h;
                    let all: &mut [f32; POSITIONS] = (&mut self.scores[..]).try_into().expect("POSITIONS scores");
                    vec::scores_transposed(qv(h), &self.kt, p.scale, all, isa);
                    let mut scores = std::mem::take(&mut self.scores);
                    let rescale = self.online_softmax(qi, &mut scores[..visible], isa);
                    let acc = &mut self.acc[qi * hd..(qi + 1) * hd];
                    vec::weighted_rows(acc, rescale, &scores[..visible], &self.vrows[..visible * hd], isa);
                    self.scores = scores;
                }
            }
        }
    }

    /// The normalised outputs of `tokens` for the heads of group `g`.
    fn write_out(&self, p: &AttentionParams, g: usize, tokens: std::ops::Range<usize>, out: &Out) {
        let (group, hd) = (self.group, self.hd);
        let width = hd * p.n_head;
        for (ti, t) in tokens.enumerate() {
            for h in 0..group {
                let qi = ti * group + h;
                // SAFETY: this task owns the outputs of query heads g·group.. of its tokens.
                let o = unsafe { std::slice::from_raw_parts_mut(out.0.add(t * width + (g * group + h) * hd), hd) };
                let inv = 1.0 / self.sum[qi];
                for (o, a) in o.iter_mut().zip(&self.acc[qi * hd..(qi + 1) * hd]) {
                    *o = a * inv;
                }
            }
        }
    }

    /// The softmax states of the first `n_q` queries, at query slot `first`
    /// of `partials`.
    fn write_partial(&self, p: &AttentionParams, n_q: usize, partials: &Out, first: usize) {
        let (hd, len) = (self.hd, Partial::len(p));
        for qi in 0..n_q {
            // SAFETY: slots first.. belong to this (KV head, part) task alone.
            let st = unsafe { std::slice::from_raw_parts_mut(partials.0.add((first + qi) * len), len) };
            st[0] = self.max[qi];
            st[1] = self.sum[qi];
            st[2..].copy_from_slice(&self.acc[qi * hd..(qi + 1) * hd]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_graph::Node;

    fn node(ne0: usize, ne1: usize, dtype: DType) -> Node {
        Node { op: tern_graph::Op::Add, srcs: Vec::new(), ne: [ne0, ne1, 1, 1], dtype, label: None }
    }

    /// Uniform in [-1, 1), from a fixed linear congruential sequence.
    fn random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// Runs one attention call over caches whose first `kv_pos` rows hold
    /// random keys and values, cut into `parts`.
    fn run(p: &AttentionParams, n_tokens: usize, cache: GgmlType, parts: usize) -> Vec<f32> {
        let (kv_width, n_ctx) = (p.head_dim * p.n_head_kv, p.kv_pos + n_tokens + 7);
        let nodes = [
            node(p.head_dim * p.n_head, n_tokens, DType::F32),
            node(kv_width, n_tokens, DType::F32),
            node(kv_width, n_ctx, DType::Ggml(cache)),
        ];
        let mut q = random(p.head_dim * p.n_head * n_tokens, 1);
        let (mut k, mut v) = (random(kv_width * n_tokens, 2), random(kv_width * n_tokens, 3));
        let row_bytes = cache.row_bytes(kv_width as u64).unwrap() as usize;
        let mut caches = [vec![0u8; row_bytes * n_ctx], vec![0u8; row_bytes * n_ctx]];
        for (i, c) in caches.iter_mut().enumerate() {
            let cc = Cache { ptr: c.as_mut_ptr(), ty: cache, width: kv_width, row_bytes };
            for (row, vals) in random(kv_width * p.kv_pos, 10 + i as u64).chunks_exact(kv_width).enumerate() {
                // SAFETY: row < n_ctx; nothing else reads the cache yet.
                unsafe { cc.store(row, vals) };
            }
        }
        let [kc, vc] = &mut caches;
        let srcs = [
            Tensor { ptr: q.as_mut_ptr() as *mut u8, node: &nodes[0], packed: None },
            Tensor { ptr: k.as_mut_ptr() as *mut u8, node: &nodes[1], packed: None },
            Tensor { ptr: v.as_mut_ptr() as *mut u8, node: &nodes[1], packed: None },
            Tensor { ptr: kc.as_mut_ptr(), node: &nodes[2], packed: None },
            Tensor { ptr: vc.as_mut_ptr(), node: &nodes[2], packed: None },
        ];
        let mut out = vec![f32::NAN; p.head_dim * p.n_head * n_tokens];
        let runs = [Run { tokens: 0..n_tokens, pos0: p.kv_pos, row0: 0 }];
        // SAFETY: the caches are only viewed through `srcs`.
        unsafe { attention_in_parts(&srcs, p, &runs, &mut out, &Pool::new(3), crate::isa::active(None), &|_| parts) };
        out
    }

    /// Cutting the cache into parts and merging their softmax states gives
    /// the single pass's result within float rounding (1e-5 of the largest
    /// output), including parts that see no position of some query, caches
    /// of odd lengths, and f16 rows.
    #[test]
    fn parts_along_the_cache_merge_to_the_single_pass() {
        for (kv_pos, n_tokens, cache) in
            [(0, 1, GgmlType::F32), (5, 1, GgmlType::F32), (200, 1, GgmlType::F16), (130, 3, GgmlType::F32)]
        {
            let p = AttentionParams { layer: 0, n_head: 8, n_head_kv: 2, head_dim: 64, scale: 0.125, kv_pos };
            let whole = run(&p, n_tokens, cache, 1);
            assert!(whole.iter().all(|x| x.is_finite()));
            let bound = 1e-5 * whole.iter().fold(0f32, |m, x| m.max(x.abs()));
            for parts in [2, 3, 5] {
                let cut = run(&p, n_tokens, cache, parts);
                let err = whole.iter().zip(&cut).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(
                    err <= bound,
                    "kv_pos {kv_pos}, {n_tokens} tokens, {cache}, {parts} parts: |Δ| {err} > {bound}"
                );
            }
        }
    }
}
