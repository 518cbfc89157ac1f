//! Mixture-of-experts ops: the router's choice and weights, the expert
//! matrix products, and the weighted sum of the experts' outputs.
//!
//! The expert products group a batch's (token, slot) pairs by expert, so each
//! expert's weight rows are read once for all the tokens that chose it, and
//! a step reads only the chosen experts' rows. A token's activation is
//! quantized once and shared by its slots (gate and up) when the input has
//! one row per token.

use tern_graph::{Activation, Gating, Precision, RouteParams};

use std::ops::Range;

use super::matmul::{weight_type, Acts, RowDot, GEMM_ROWS};
use super::{elementwise, Ctx, Tensor};
use crate::kernels;

/// Each token's chosen experts, best first (ties go to the lower index).
///
/// Scores are the softmax or sigmoid of the logits, plus the bias for the
/// choice when there is one. With groups, a group scores the sum of its two
/// best experts, and only the best `used` groups' experts may be chosen.
pub fn route(logits: &[f32], bias: Option<&[f32]>, p: &RouteParams, ids: &mut [i32]) {
    let n = p.n_expert;
    let mut scores = vec![0f32; n];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for (l, out) in logits.chunks_exact(n).zip(ids.chunks_exact_mut(p.k)) {
        gate(l, p.gating, &mut scores);
        if let Some(b) = bias {
            scores.iter_mut().zip(b).for_each(|(s, b)| *s += b);
        }
        if let Some(g) = p.groups {
            let per = n / g.count;
            let group_score = |gi: usize| {
                let s = &scores[gi * per..(gi + 1) * per];
                let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
                for &v in s {
                    if v > a {
                        (a, b) = (v, a);
                    } else if v > b {
                        b = v;
                    }
                }
                a + b
            };
            let gs: Vec<f32> = (0..g.count).map(group_score).collect();
            let kept = best(&gs, g.used);
            for gi in (0..g.count).filter(|gi| !kept.contains(gi)) {
                scores[gi * per..(gi + 1) * per].fill(f32::NEG_INFINITY);
            }
        }
        order.clear();
        order.extend(best(&scores, p.k));
        for (o, &e) in out.iter_mut().zip(&order) {
            *o = e as i32;
        }
    }
}

/// The weights of the chosen experts: their unbiased scores, renormalised
/// to sum 1 when the router says so, times its scale.
pub fn route_weights(logits: &[f32], ids: &[i32], p: &RouteParams, w: &mut [f32]) {
    let mut scores = vec![0f32; p.n_expert];
    for ((l, ids), w) in logits.chunks_exact(p.n_expert).zip(ids.chunks_exact(p.k)).zip(w.chunks_exact_mut(p.k)) {
        gate(l, p.gating, &mut scores);
        for (w, &e) in w.iter_mut().zip(ids) {
            *w = scores[e as usize];
        }
        if p.norm {
            // llama.cpp's floor on the sum: the smallest normal f16.
            let sum = w.iter().sum::<f32>().max(half::f16::MIN_POSITIVE.to_f32());
            w.iter_mut().for_each(|w| *w /= sum);
        }
        w.iter_mut().for_each(|w| *w *= p.scale);
    }
}

fn gate(logits: &[f32], gating: Gating, out: &mut [f32]) {
    match gating {
        Gating::Softmax => {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0;
            for (o, &l) in out.iter_mut().zip(logits) {
                *o = (l - max).exp();
                sum += *o;
            }
            out.iter_mut().for_each(|o| *o /= sum);
        }
        Gating::Sigmoid => out.iter_mut().zip(logits).for_each(|(o, &l)| *o = 1.0 / (1.0 + (-l).exp())),
    }
}

/// The indices of the `k` largest values, largest first; ties go to the lower
/// index, and NaN sorts last.
fn best(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap_or_else(|| v[a].is_nan().cmp(&v[b].is_nan())).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The (slot, token) pairs of a batch grouped by expert.
struct ByExpert {
    /// Experts chosen at least once, ascending.
    active: Vec<usize>,
    /// For `active[a]`, its (slot, token) pairs.
    uses: Vec<Vec<(usize, usize)>>,
}

impl ByExpert {
    fn new(ids: &[i32], k: usize, n_expert: usize) -> ByExpert {
        let mut per: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_expert];
        for (t, slots) in ids.chunks_exact(k).enumerate() {
            for (j, &e) in slots.iter().enumerate() {
                // The router produced these ids; a bad one is a bug upstream.
                per[usize::try_from(e).ok().filter(|&e| e < n_expert).expect("expert id in range")].push((j, t));
            }
        }
        let active: Vec<usize> = (0..n_expert).filter(|&e| !per[e].is_empty()).collect();
        let uses = active.iter().map(|&e| std::mem::take(&mut per[e])).collect();
        ByExpert { active, uses }
    }
}

struct Out(*mut f32);
// SAFETY: each (expert row, slot, token) output is written by one thread only.
unsafe impl Sync for Out {}

/// Runs `f(expert, rows, uses)` over the `m` rows of every chosen expert,
/// each call a range of one expert's rows, spread over the threads.
fn per_expert_rows(
    cx: &Ctx,
    by: &ByExpert,
    m: usize,
    f: impl Fn(usize, Range<usize>, &[(usize, usize)]) + Sync, // (expert, rows, uses)
) {
    let total = by.active.len() * m;
    // Rows of one expert go together, and a decoding step's few chosen
    // experts still spread over every thread.
    let min_rows = (total / (4 * cx.pool.threads())).clamp(GEMM_ROWS.min(m), 64);
    cx.pool.for_chunks_claimed(total, min_rows, |range| {
        let mut i = range.start;
        while i < range.end {
            let a = i / m;
            let end = (range.end - a * m).min(m);
            f(by.active[a], i % m..end, &by.uses[a]);
            i = a * m + end;
        }
    });
}

/// One expert's rows `rows` against the activation columns of its uses:
/// `put(use, row, value)` for every pair, by the GEMM for four uses or more,
/// else by row dots.
fn expert_products(
    dot: &RowDot,
    acts: &Acts,
    first_row: usize,
    rows: Range<usize>,
    cols: &[usize],
    mut put: impl FnMut(usize, usize, f32),
) {
    if dot.has_gemm(cols.len()) {
        let mut vals = vec![0f32; rows.len() * cols.len()];
        dot.gemm(first_row + rows.start..first_row + rows.end, acts, cols, &mut vals);
        for (u, vals) in vals.chunks_exact(rows.len()).enumerate() {
            for (r, &v) in rows.clone().zip(vals) {
                put(u, r, v);
            }
        }
        return;
    }
    // One token streams each row once: fetch about a page ahead.
    let ahead = if cols.len() == 1 { kernels::rows_ahead(dot.row_bytes) } else { 0 };
    let end = rows.end;
    for r in rows {
        if ahead > 0 && r + ahead < end {
            kernels::prefetch(dot.row(first_row + r + ahead).as_ptr(), dot.row_bytes);
        }
        let wr = dot.row(first_row + r);
        let quads = cols.len() / 4 * 4;
        for u0 in (0..quads).step_by(4) {
            let v = dot.dot4(wr, acts, [cols[u0], cols[u0 + 1], cols[u0 + 2], cols[u0 + 3]]);
            for (i, v) in v.into_iter().enumerate() {
                put(u0 + i, r, v);
            }
        }
        for (u, &c) in cols.iter().enumerate().skip(quads) {
            put(u, r, dot.dot(wr, acts, c));
        }
    }
}

/// [`tern_graph::Op::MulMatId`].
pub fn mul_mat_id(w: &Tensor, x: &Tensor, ids: &Tensor, precision: Precision, y: &mut [f32], cx: &Ctx) {
    let [kd, m, n_expert, _] = w.node.ne;
    let (k, s) = (ids.node.ne[0], x.node.ne[1]);
    let by = ByExpert::new(ids.i32(), k, n_expert);
    let dot = RowDot::new(weight_type(w), w.bytes(), kd, kd * m * n_expert, precision, cx);
    let acts = Acts::quantize(dot.act, x.f32(), kd, cx);
    let out = &Out(y.as_mut_ptr());
    per_expert_rows(cx, &by, m, |e, rows, uses| {
        let cols: Vec<usize> = uses.iter().map(|&(j, t)| if s == 1 { t } else { t * s + j }).collect();
        expert_products(&dot, &acts, e * m, rows, &cols, |u, r, v| {
            let (j, t) = uses[u];
            // SAFETY: row r of slot j of token t belongs to this call only.
            unsafe { *out.0.add((t * k + j) * m + r) = v };
        });
    });
}

/// [`tern_graph::Op::MoeUpGate`]: the gate and up products of every chosen
/// row, then `y = act(gate) ⊙ up`.
#[allow(clippy::too_many_arguments)]
pub fn moe_up_gate(
    wg: &Tensor,
    wu: &Tensor,
    x: &Tensor,
    ids: &Tensor,
    act: Activation,
    precision: Precision,
    y: &mut [f32],
    cx: &Ctx,
) {
    let [kd, m, n_expert, _] = wg.node.ne;
    let k = ids.node.ne[0];
    let by = ByExpert::new(ids.i32(), k, n_expert);
    let n_el = kd * m * n_expert;
    let gate = RowDot::new(weight_type(wg), wg.bytes(), kd, n_el, precision, cx);
    let up = RowDot::new(weight_type(wu), wu.bytes(), kd, n_el, precision, cx);
    let acts = Acts::quantize(gate.act, x.f32(), kd, cx);
    let up_acts = (up.act != gate.act).then(|| Acts::quantize(up.act, x.f32(), kd, cx));
    let (mut gates, mut ups) = (vec![0f32; y.len()], vec![0f32; y.len()]);
    let (out, out_up) = (&Out(gates.as_mut_ptr()), &Out(ups.as_mut_ptr()));
    per_expert_rows(cx, &by, m, |e, rows, uses| {
        let cols: Vec<usize> = uses.iter().map(|&(_, t)| t).collect();
        let at = |u: usize, r: usize| {
            let (j, t) = uses[u];
            (t * k + j) * m + r
        };
        // SAFETY (both): output `at(u, r)` belongs to this call only.
        expert_products(&gate, &acts, e * m, rows.clone(), &cols, |u, r, v| unsafe { *out.0.add(at(u, r)) = v });
        let ua = up_acts.as_ref().unwrap_or(&acts);
        expert_products(&up, ua, e * m, rows, &cols, |u, r, v| unsafe { *out_up.0.add(at(u, r)) = v });
    });
    let (isa, dst) = (cx.isa, super::Rows(y.as_mut_ptr()));
    super::by_rows(cx, gates.len() / m, |rows| {
        let span = rows.start * m..rows.end * m;
        // SAFETY: each thread writes its own rows of `y`.
        let dst = unsafe { super::rows_mut(dst, m, &rows) };
        elementwise::gated(&gates[span.clone()], &ups[span], act, dst, isa);
    });
}

/// [`tern_graph::Op::ExpertSum`]: `y [m, n] = Σ_j w[j, t] · ys[:, j, t]`.
pub fn expert_sum(ys: &[f32], w: &[f32], m: usize, k: usize, y: &mut [f32]) {
    for ((out, slots), ws) in y.chunks_exact_mut(m).zip(ys.chunks_exact(m * k)).zip(w.chunks_exact(k)) {
        out.fill(0.0);
        for (row, &wj) in slots.chunks_exact(m).zip(ws) {
            out.iter_mut().zip(row).for_each(|(o, v)| *o += wj * v);
        }
    }
}
