//! Multi-head latent attention's ops: a head's slice of a row, products with
//! per-head blocks of weight rows (the absorbed key and value projections),
//! and attention over the latent cache.

use tern_graph::{HeadMatMul, LatentAttentionParams, Precision};
use tern_quant::ternary::rows;

use super::attention::Cache;
use super::matmul::{weight_type, Acts, RowDot};
use super::seqs;
use super::{Ctx, Tensor};
use crate::kernels::vec;

/// [`tern_graph::Op::Columns`].
pub fn columns(x: &[f32], width: usize, start: usize, len: usize, y: &mut [f32]) {
    for (piece, out) in x.chunks_exact(width).zip(y.chunks_exact_mut(len)) {
        out.copy_from_slice(&piece[start..start + len]);
    }
}

/// A weight's rows as f32, whatever its storage (file bytes or repacked ternary).
struct Widen<'w> {
    w: &'w Tensor<'w>,
    file: Option<RowDot<'w>>,
}

impl<'w> Widen<'w> {
    fn new(w: &'w Tensor<'w>, cx: &Ctx) -> Widen<'w> {
        let (k, rows) = (w.node.ne[0], w.node.n_rows());
        let file =
            w.packed.is_none().then(|| RowDot::new(weight_type(w), w.bytes(), k, k * rows, Precision::Float, cx));
        Widen { w, file }
    }

    fn row(&self, j: usize, out: &mut [f32]) {
        match (&self.file, self.w.packed) {
            (Some(d), _) => d.widen(j, out),
            (None, Some(p)) => {
                let mut values = vec![0i8; p.layout.k_pad];
                rows::unpack_row(&p.layout, p.row(j), &mut values);
                let s = p.row_scales(j);
                for (i, (o, &v)) in out.iter_mut().zip(&values).enumerate() {
                    *o = v as f32 * s[i / p.layout.group()];
                }
            }
            (None, None) => unreachable!("a weight is file bytes or packed"),
        }
    }
}

struct Out(*mut f32);
// SAFETY: each head's outputs are written by one thread only.
unsafe impl Sync for Out {}

/// [`tern_graph::Op::MulMatHeads`]: `x [k_in · n_head, n]` → `y [k_out · n_head, n]`.
pub fn mul_mat_heads(w: &Tensor, x: &[f32], mm: &HeadMatMul, precision: Precision, y: &mut [f32], cx: &Ctx) {
    let (kd, h) = (w.node.ne[0], mm.n_head);
    let first = |head: usize| head * mm.stride + mm.offset;
    let out = Out(y.as_mut_ptr());
    if mm.transposed {
        // y_h = Σ_i x_h[i] · row_i: each row widened once for every token.
        let n = x.len() / (mm.len * h);
        y.fill(0.0);
        let widen = Widen::new(w, cx);
        let out = &out;
        cx.pool.for_chunks(h, 1, |heads| {
            let mut row = vec![0f32; kd];
            for head in heads {
                for i in 0..mm.len {
                    widen.row(first(head) + i, &mut row);
                    for t in 0..n {
                        let a = x[(t * h + head) * mm.len + i];
                        // SAFETY: head `head`'s outputs belong to this thread.
                        let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add((t * h + head) * kd), kd) };
                        dst.iter_mut().zip(&row).for_each(|(d, r)| *d += a * r);
                    }
                }
            }
        });
        return;
    }
    let n = x.len() / (kd * h);
    // Paired activations need whole blocks; a head slice that is not gets float.
    let paired = precision == Precision::Paired
        && w.packed.is_none()
        && kd.is_multiple_of(tern_quant::act_type(weight_type(w)).block_elems());
    if !paired {
        let widen = Widen::new(w, cx);
        let out = &out;
        return cx.pool.for_chunks(h, 1, |heads| {
            let mut row = vec![0f32; kd];
            for head in heads {
                for i in 0..mm.len {
                    widen.row(first(head) + i, &mut row);
                    for t in 0..n {
                        let xs = &x[(t * h + head) * kd..][..kd];
                        let v: f64 = xs.iter().zip(&row).map(|(a, b)| *a as f64 * *b as f64).sum();
                        // SAFETY: as above.
                        unsafe { *out.0.add((t * h + head) * mm.len + i) = v as f32 };
                    }
                }
            }
        });
    }
    let dot = RowDot::new(weight_type(w), w.bytes(), kd, kd * w.node.n_rows(), precision, cx);
    let acts = Acts::quantize(dot.act, x, kd, cx);
    let out = &out;
    if dot.has_gemm(n) {
        return cx.pool.for_chunks(h, 1, |heads| {
            let mut vals = vec![0f32; mm.len * n];
            for head in heads {
                let cols: Vec<usize> = (0..n).map(|t| t * h + head).collect();
                dot.gemm(first(head)..first(head) + mm.len, &acts, &cols, &mut vals);
                for (t, vals) in vals.chunks_exact(mm.len).enumerate() {
                    // SAFETY: as above.
                    let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add((t * h + head) * mm.len), mm.len) };
                    dst.copy_from_slice(vals);
                }
            }
        });
    }
    cx.pool.for_chunks(h, 1, |heads| {
        for head in heads {
            for i in 0..mm.len {
                let wr = dot.row(first(head) + i);
                for t in 0..n {
                    // SAFETY: as above.
                    unsafe { *out.0.add((t * h + head) * mm.len + i) = dot.dot(wr, &acts, t * h + head) };
                }
            }
        }
    });
}

/// Cache positions per block: rows widened once per block serve every
/// (token, head) query of a task (the `vec` kernels' block).
const POSITIONS: usize = 64;
/// Tokens of a prompt task: their queries share each widened block.
const TASK_TOKENS: usize = 8;

/// [`tern_graph::Op::LatentAttention`].
///
/// Queries `[q_lat | q_pe]` (`rank + rope` wide) against the cache rows
/// (`[latent | k_pe]`), values the rows' latent part; an online softmax per
/// query over blocks of [`POSITIONS`], on the attention kernels of `vec`
/// (`HEADS` heads share each key and value load).
///
/// # Safety
/// `srcs[4]` is the layer's cache, not aliased by any other view in use.
pub unsafe fn latent_attention(srcs: &[Tensor], p: &LatentAttentionParams, y: &mut [f32], cx: &Ctx) {
    let (q_lat, q_pe, c, k_pe) = (srcs[0].f32(), srcs[1].f32(), srcs[2].f32(), srcs[3].f32());
    let cache = Cache::new(&srcs[4]);
    let (r, dr, h) = (p.rank, p.rope, p.n_head);
    let width = r + dr;
    let n = c.len() / r;
    let runs = seqs::runs(srcs, p.kv_pos, n, srcs[4].node.ne[1]);
    let mut row = vec![0f32; width];
    for run in &runs {
        for t in run.tokens.clone() {
            row[..r].copy_from_slice(&c[t * r..(t + 1) * r]);
            row[r..].copy_from_slice(&k_pe[t * dr..(t + 1) * dr]);
            cache.store(run.row(t), &row);
        }
    }
    let out = &Out(y.as_mut_ptr());
    let (isa, threads) = (cx.isa, cx.pool.threads());
    // Tasks are (run, block of tokens, part of the cache), all heads each:
    // every widened cache block serves all of a task's queries. A prompt's
    // tokens go in blocks; a decoding step's few tokens cut the cache into
    // parts (whole position blocks, one per thread) whose softmax states are
    // merged after (flash-decoding). The cut depends on the run alone, so a
    // sequence gets the same bits in any batch.
    let state = 2 + r; // a part's max, sum and accumulator per query
    let mut cuts = Vec::with_capacity(runs.len());
    let mut tasks = Vec::new();
    let mut slots = 0;
    for (ri, run) in runs.iter().enumerate() {
        let tb = (run.len() / (2 * threads)).clamp(1, TASK_TOKENS);
        let blocks = run.len().div_ceil(tb);
        let cache_blocks = run.end().div_ceil(POSITIONS);
        let parts = if blocks < threads { cache_blocks.min(threads) } else { 1 };
        let per_part = cache_blocks.div_ceil(parts) * POSITIONS;
        cuts.push(Cut { tb, parts, per_part, first: slots });
        if parts > 1 {
            slots += run.len() * h * parts;
        }
        tasks.extend((0..blocks * parts).map(|task| (ri, task / parts, task % parts)));
    }
    let mut partials = vec![0f32; slots * state];
    let partial = &Out(partials.as_mut_ptr());
    cx.pool.for_chunks_claimed(tasks.len(), 1, |mine| {
        let mut keys = vec![0f32; POSITIONS * width];
        let mut kt = vec![0f32; width * POSITIONS];
        let mut vals = vec![0f32; POSITIONS * r];
        for &(ri, b, part) in &tasks[mine] {
            let (run, cut) = (&runs[ri], &cuts[ri]);
            let (tb, parts, per_part) = (cut.tb, cut.parts, cut.per_part);
            let tokens = run.tokens.start + b * tb..(run.tokens.start + (b + 1) * tb).min(run.tokens.end);
            let heads = 0..h;
            let nh = h;
            let mut queries = vec![0f32; tokens.len() * nh * width];
            for (ti, t) in tokens.clone().enumerate() {
                for (hi, hd) in heads.clone().enumerate() {
                    let q = &mut queries[(ti * nh + hi) * width..][..width];
                    q[..r].copy_from_slice(&q_lat[(t * h + hd) * r..][..r]);
                    q[r..].copy_from_slice(&q_pe[(t * h + hd) * dr..][..dr]);
                }
            }
            let nq = tokens.len() * nh;
            let (mut max, mut sum) = (vec![f32::NEG_INFINITY; nq], vec![0f32; nq]);
            let mut acc = vec![0f32; nq * r];
            // One token's groups of HEADS heads read the key rows as they
            // are; otherwise the transposed copy serves every query.
            let rows_only = tokens.len() == 1 && nh.is_multiple_of(vec::HEADS);
            let end = run.seen(tokens.end - 1).min((part + 1) * per_part);
            for start in (part * per_part..end).step_by(POSITIONS) {
                let n_pos = POSITIONS.min(end - start);
                for j in 0..n_pos {
                    let key = &mut keys[j * width..(j + 1) * width];
                    cache.load(run.row0 + start + j, 0, key, isa);
                    vals[j * r..(j + 1) * r].copy_from_slice(&key[..r]);
                }
                if !rows_only {
                    // Scores of positions past a short block must read zeros.
                    if n_pos < POSITIONS {
                        kt.fill(0.0);
                    }
                    for j in 0..n_pos {
                        for d in 0..width {
                            kt[d * POSITIONS + j] = keys[j * width + d];
                        }
                    }
                }
                for (ti, t) in tokens.clone().enumerate() {
                    // Causal: token t sees its sequence's positions up to its own.
                    let visible = run.seen(t).saturating_sub(start).min(n_pos);
                    if visible == 0 {
                        continue;
                    }
                    let q = |hi: usize| &queries[(ti * nh + hi) * width..][..width];
                    let grouped = nh / vec::HEADS * vec::HEADS;
                    for h0 in (0..grouped).step_by(vec::HEADS) {
                        let qi0 = ti * nh + h0;
                        let mut scores = [[0f32; POSITIONS]; vec::HEADS];
                        let qs = std::array::from_fn(|i| q(h0 + i));
                        if rows_only {
                            vec::scores_rows_heads(qs, &keys[..n_pos * width], p.scale, &mut scores, isa);
                        } else {
                            vec::scores_transposed_heads(qs, &kt, p.scale, &mut scores, isa);
                        }
                        let (mx, sm) = (&mut max[qi0..qi0 + vec::HEADS], &mut sum[qi0..qi0 + vec::HEADS]);
                        let rescale = vec::softmax_heads(&mut scores, visible, mx, sm, isa);
                        let mut accs = acc[qi0 * r..(qi0 + vec::HEADS) * r].chunks_exact_mut(r);
                        let accs = std::array::from_fn(|_| accs.next().expect("HEADS accumulators"));
                        let w = std::array::from_fn(|i| &scores[i][..visible]);
                        vec::weighted_rows_heads(accs, rescale, w, &vals[..visible * r], isa);
                    }
                    for hi in grouped..nh {
                        let qi = ti * nh + hi;
                        let mut scores = [0f32; POSITIONS];
                        vec::scores_transposed(q(hi), &kt, p.scale, &mut scores, isa);
                        let sc = &mut scores[..visible];
                        let new_max = max[qi].max(vec::max(sc, isa));
                        let rescale = (max[qi] - new_max).exp();
                        max[qi] = new_max;
                        sum[qi] = sum[qi] * rescale + vec::exp_shifted_sum(sc, new_max, isa);
                        vec::weighted_rows(&mut acc[qi * r..(qi + 1) * r], rescale, sc, &vals[..visible * r], isa);
                    }
                }
            }
            for (ti, t) in tokens.clone().enumerate() {
                for (hi, hd) in heads.clone().enumerate() {
                    let (qi, a) = (ti * nh + hi, &acc[(ti * nh + hi) * r..][..r]);
                    if parts == 1 {
                        let inv = 1.0 / sum[qi];
                        // SAFETY: token t's outputs belong to this task.
                        let dst = std::slice::from_raw_parts_mut(out.0.add((t * h + hd) * r), r);
                        dst.iter_mut().zip(a).for_each(|(o, a)| *o = a * inv);
                    } else {
                        // SAFETY: this (token, head, part)'s state belongs to this task.
                        let slot = cut.first + ((t - run.tokens.start) * h + hd) * parts + part;
                        let st = std::slice::from_raw_parts_mut(partial.0.add(slot * state), state);
                        (st[0], st[1]) = (max[qi], sum[qi]);
                        st[2..].copy_from_slice(a);
                    }
                }
            }
        }
    });
    for (run, cut) in runs.iter().zip(&cuts).filter(|(_, c)| c.parts > 1) {
        let states = &partials[cut.first * state..][..run.len() * h * cut.parts * state];
        merge_parts(states, cut.parts, r, &mut y[run.tokens.start * h * r..run.tokens.end * h * r]);
    }
}

/// How one run's work is cut: blocks of `tb` tokens, `parts` pieces of
/// `per_part` positions along the cache, their softmax states from query
/// slot `first` of the partials.
struct Cut {
    tb: usize,
    parts: usize,
    per_part: usize,
    first: usize,
}

/// Each query's output from its parts' softmax states (`[max, sum, acc[r]]`
/// per part): `Σ acc·e^(max − M) / Σ sum·e^(max − M)`, `M` the largest max.
/// A part that saw no position has max −∞ and weighs nothing; position 0 is
/// in the first part and visible to every query.
fn merge_parts(partials: &[f32], parts: usize, r: usize, y: &mut [f32]) {
    for (o, states) in y.chunks_exact_mut(r).zip(partials.chunks_exact(parts * (2 + r))) {
        let m = states.chunks_exact(2 + r).map(|s| s[0]).fold(f32::NEG_INFINITY, f32::max);
        o.fill(0.0);
        let mut sum = 0.0;
        for st in states.chunks_exact(2 + r) {
            let w = (st[0] - m).exp();
            sum += st[1] * w;
            o.iter_mut().zip(&st[2..]).for_each(|(o, a)| *o += a * w);
        }
        let inv = 1.0 / sum;
        o.iter_mut().for_each(|x| *x *= inv);
    }
}
