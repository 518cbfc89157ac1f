//! The mixture-of-experts ops of the CPU backend (`Op::Route`,
//! `Op::RouteWeights`, `Op::MulMatId`, `Op::MoeUpGate`, `Op::ExpertSum`),
//! each driven through the public backend (a graph, weights loaded with
//! `load_weight`, `compute`, results read back) on 1 and 3 threads and every
//! ISA level the machine has, against a plain twin written here.
//!
//! * Routing against float64 (`docs/spec/moe.md` §1, §4): softmax and
//!   sigmoid gating, with and without the selection-only bias, with and
//!   without group limits (a group scores the sum of its two best biased
//!   scores; the best `used` groups' experts may be chosen), norm on and off
//!   (the sum floored at f16's smallest normal), scale; k = 1, k = n_expert,
//!   k = all of the kept groups' experts. Logits lie on a grid of 0.25 and
//!   biases on a grid of 1/8, so the deliberate ties (equal inputs: equal
//!   experts at the top-k boundary, equal groups at the group boundary, rows
//!   of one value) are exact ties in f32 and f64 alike, broken towards the
//!   lower index; any other two scores (or group scores) are kept at least
//!   2e-5 of their magnitude apart (rows that are not are drawn again), far
//!   more than f32 can misorder. The ids must be equal; the weights within
//!   `(m + 6)·u` relative (`u = 2⁻²⁴`), `m` the terms of the f32 sums a
//!   weight goes through (the chosen k when renormalised, else the
//!   softmax's n_expert; both when the floor replaces the sum), see
//!   `weight_tol`: 8.3e-7 for k = 8 renormalised, 4.2e-6 for a sum of 64.
//!   A flat 1e-6 is not a bound once 64 terms are summed (8.9e-7 is seen).
//!   Weight sums below the floor are tested on their own (sigmoid with
//!   every logit near −14, and softmax with the bias choosing experts 12
//!   below the rest).
//! * `MulMatId` (one input shared by the slots, or one per slot) and
//!   `MoeUpGate` (SiLU, ReLU²) on F32, F16, Q8_0, Q4_0, Q4_K and Q6_K experts,
//!   batches of 1, 3 and 17 tokens whose experts repeat across tokens while
//!   some experts are chosen by none, against a twin that computes each
//!   (token, slot, row) with `tern_quant::vec_dot` on the activation
//!   quantized by `quantize_acts(act_type(ty))` (`Precision::Paired`) or
//!   `vec_dot_f32` (`Precision::Float`). Bound: `common::dot_tol` (the block
//!   kernels' bound, derived there: `(k/32 + 17)·u·S` with f32 activations,
//!   `(3N + 10)·u·S` for the K-quants (their GEMM; the row dots are bit for
//!   bit), `2(N + 3)·u·S` for the 32-element formats, `N` the row's blocks;
//!   `S = Σ|w·a|`, `u = 2⁻²⁴`), carried through `act(g)·u` for `MoeUpGate`
//!   (`|act'| ≤ 1.1` for SiLU, `2|g|` for ReLU², plus `8u·|y|` for the f32
//!   evaluation of the activation and product).
//! * `ExpertSum`: bit for bit against the plain loop (`Σ_j w_j·y_j` in f32,
//!   slot order).

mod common;

use common::{dot_tol, setups, twin_dot, weight_rows, Data, Dev, Rng, Step, U};
use tern_graph::{Activation, ExpertGroups, Gating, GgmlType, Precision, RouteParams};

// ---------------------------------------------------------------- routing --

/// llama.cpp's floor on the sum of the chosen weights: f16's smallest normal.
const FLOOR: f64 = 6.103515625e-5;

/// The router in float64.
struct Routed {
    /// Unbiased scores.
    probs: Vec<f64>,
    /// Scores for the choice (biased; −inf in dropped groups).
    sel: Vec<f64>,
    /// Group scores and the kept groups, best first.
    groups: Option<(Vec<f64>, Vec<usize>)>,
    ids: Vec<usize>,
    weights: Vec<f64>,
}

/// Indices of the `k` largest values, largest first, ties to the lower index.
fn top(v: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap().then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

fn top2_sum(s: &[f64]) -> f64 {
    let t = top(s, 2);
    s[t[0]] + s[t[1]]
}

fn route64(logits: &[f32], bias: Option<&[f32]>, p: &RouteParams) -> Routed {
    let l: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
    let probs: Vec<f64> = match p.gating {
        Gating::Softmax => {
            let max = l.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = l.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.iter().map(|v| v / sum).collect()
        }
        Gating::Sigmoid => l.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
    };
    let mut sel: Vec<f64> = match bias {
        Some(b) => probs.iter().zip(b).map(|(p, &b)| p + b as f64).collect(),
        None => probs.clone(),
    };
    let groups = p.groups.map(|g| {
        let per = p.n_expert / g.count;
        let gs: Vec<f64> = sel.chunks_exact(per).map(top2_sum).collect();
        let kept = top(&gs, g.used);
        for gi in (0..g.count).filter(|gi| !kept.contains(gi)) {
            sel[gi * per..(gi + 1) * per].fill(f64::NEG_INFINITY);
        }
        (gs, kept)
    });
    let ids = top(&sel, p.k);
    let mut weights: Vec<f64> = ids.iter().map(|&e| probs[e]).collect();
    if p.norm {
        let sum = weights.iter().sum::<f64>().max(FLOOR);
        weights.iter_mut().for_each(|w| *w /= sum);
    }
    weights.iter_mut().for_each(|w| *w *= p.scale as f64);
    Routed { probs, sel, groups, ids, weights }
}

/// Whether a row's order is the same in f32 as in f64: any two experts with
/// different (logit, bias) have scores at least 2e-5 of their magnitudes
/// apart, and so have any two groups whose two best experts differ.
fn unambiguous(logits: &[f32], bias: Option<&[f32]>, p: &RouteParams) -> bool {
    let r = route64(logits, bias, p);
    let b = |e: usize| bias.map_or(0.0, |b| b[e]);
    let key = |e: usize| (logits[e].to_bits(), b(e).to_bits());
    let mag = |e: usize| r.probs[e] + (b(e) as f64).abs();
    // Unmasked choice scores.
    let sel: Vec<f64> = (0..p.n_expert).map(|e| r.probs[e] + b(e) as f64).collect();
    for i in 0..p.n_expert {
        for j in i + 1..p.n_expert {
            if key(i) != key(j) && (sel[i] - sel[j]).abs() <= 2e-5 * (mag(i) + mag(j)) {
                return false;
            }
        }
    }
    if let Some(g) = p.groups {
        let per = p.n_expert / g.count;
        let best2 = |gi: usize| -> (Vec<(u32, u32)>, f64, f64) {
            let t: Vec<usize> = top(&sel[gi * per..(gi + 1) * per], 2).iter().map(|&e| gi * per + e).collect();
            let mut keys: Vec<(u32, u32)> = t.iter().map(|&e| key(e)).collect();
            keys.sort();
            (keys, sel[t[0]] + sel[t[1]], mag(t[0]) + mag(t[1]))
        };
        let gs: Vec<_> = (0..g.count).map(best2).collect();
        for i in 0..g.count {
            for j in i + 1..g.count {
                if gs[i].0 != gs[j].0 && (gs[i].1 - gs[j].1).abs() <= 2e-5 * (gs[i].2 + gs[j].2) {
                    return false;
                }
            }
        }
    }
    true
}

/// A logit on the grid of 0.25 in [lo, hi].
fn grid(rng: &mut Rng, lo: f32, hi: f32) -> f32 {
    lo + 0.25 * rng.below(((hi - lo) / 0.25) as usize + 1) as f32
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Random,
    /// Every logit the same.
    AllEqual,
    /// Experts outside the top k given the k-th expert's inputs.
    ExpertTie,
    /// The best dropped group made a copy of the last kept one.
    GroupTie,
}

/// One row of logits of `kind`.
fn row(rng: &mut Rng, kind: Kind, bias: Option<&[f32]>, p: &RouteParams) -> Vec<f32> {
    let n = p.n_expert;
    for _ in 0..1000 {
        let mut l: Vec<f32> = (0..n).map(|_| grid(rng, -4.0, 4.0)).collect();
        match kind {
            Kind::Random => {}
            Kind::AllEqual => l.fill(grid(rng, -4.0, 4.0)),
            Kind::ExpertTie => {
                let r = route64(&l, bias, p);
                let ek = r.ids[p.k - 1];
                let b = |e: usize| bias.map_or(0.0, |b| b[e]);
                // Unchosen experts that may be chosen (kept groups), with the same bias.
                let cands: Vec<usize> = (0..n)
                    .filter(|&e| e != ek && r.sel[e].is_finite() && !r.ids.contains(&e) && b(e) == b(ek))
                    .collect();
                if cands.is_empty() {
                    continue;
                }
                for _ in 0..1 + rng.below(3) {
                    l[cands[rng.below(cands.len())]] = l[ek];
                }
            }
            Kind::GroupTie => {
                let g = p.groups.expect("groups");
                let per = n / g.count;
                let (gs, kept) = route64(&l, bias, p).groups.unwrap();
                let last = kept[g.used - 1];
                let next = top(&gs, g.count).into_iter().find(|gi| !kept.contains(gi)).unwrap();
                let copy = l[last * per..(last + 1) * per].to_vec();
                l[next * per..(next + 1) * per].copy_from_slice(&copy);
            }
        }
        if unambiguous(&l, bias, p) {
            return l;
        }
    }
    panic!("no unambiguous {kind:?} row for {p:?}");
}

/// How far (relative) the f32 weights may be from float64: `(m + 6)·u`, with
/// `m` the terms of the long f32 sums a weight goes through (a recursive
/// sum of `m` positive terms is within `(m − 1)·u` of the exact one): the
/// chosen `k` when renormalised, plus the softmax's `n_expert` unless the
/// renormalisation cancels the softmax's own sum (it does not when the
/// floor replaces the chosen weights' sum); none for a sigmoid. `6·u`
/// covers `exp` (≤ 1 ulp, twice when it does not cancel), the divisions
/// and the scale. The logits lie on a grid, so `l − max` is exact.
fn weight_tol(p: &RouteParams, floored: bool) -> f64 {
    let softmax = if p.gating == Gating::Softmax { p.n_expert } else { 0 };
    let m = match (p.norm, floored) {
        (true, false) => p.k,
        (true, true) => p.k + softmax,
        (false, _) => softmax,
    };
    (m + 6) as f64 * U
}

/// Runs Route and RouteWeights on `rows` and compares them with
/// [`route64`]; returns the largest relative weight error.
fn check_route(p: &RouteParams, rows: &[Vec<f32>], bias: Option<&[f32]>, what: &str) -> f64 {
    let n = rows.len();
    let flat: Vec<f32> = rows.concat();
    let mut worst = 0f64;
    for (threads, isa) in setups() {
        let mut dev = Dev::new(threads, isa);
        let mut s = Step::new();
        let logits = s.f32(&mut dev, [p.n_expert, n, 1, 1], &flat);
        let b = bias.map(|b| s.f32(&mut dev, [p.n_expert, 1, 1, 1], b));
        let ids = s.g.route(logits, b, *p);
        let w = s.g.route_weights(logits, ids, *p);
        s.run(&mut dev);
        let (got_ids, got_w) = (s.read_i32(&dev, ids), s.read_f32(&dev, w));
        for (t, l) in rows.iter().enumerate() {
            let r = route64(l, bias, p);
            let tol = weight_tol(p, r.ids.iter().map(|&e| r.probs[e]).sum::<f64>() < FLOOR);
            let ctx = format!("{what} {p:?}, {threads} threads, {isa:?}, token {t}, logits {l:?}");
            let got: Vec<usize> = got_ids[t * p.k..(t + 1) * p.k].iter().map(|&e| e as usize).collect();
            assert_eq!(got, r.ids, "{ctx}: ids");
            for (j, (&g, &want)) in got_w[t * p.k..(t + 1) * p.k].iter().zip(&r.weights).enumerate() {
                let err = (g as f64 - want).abs();
                assert!(err <= tol * want.abs(), "{ctx}: weight {j}: {g} against {want} (bound {tol:.2e} relative)");
                if want != 0.0 {
                    worst = worst.max(err / want.abs());
                }
            }
        }
    }
    worst
}

/// Whether the row has an exact tie across the top-k boundary (the k-th
/// chosen expert and the best unchosen one), and one across the group
/// boundary.
fn boundary_ties(l: &[f32], bias: Option<&[f32]>, p: &RouteParams) -> (bool, bool) {
    let r = route64(l, bias, p);
    let expert = p.k < p.n_expert && {
        let rest = (0..p.n_expert).filter(|e| !r.ids.contains(e)).map(|e| r.sel[e]);
        rest.fold(f64::NEG_INFINITY, f64::max) == r.sel[r.ids[p.k - 1]]
    };
    let group = r.groups.as_ref().is_some_and(|(gs, kept)| {
        let dropped = (0..gs.len()).filter(|g| !kept.contains(g)).map(|g| gs[g]);
        dropped.fold(f64::NEG_INFINITY, f64::max) == gs[*kept.last().unwrap()]
    });
    (expert, group)
}

#[test]
fn routing_matches_float64() {
    let mut rng = Rng::new(0x5EED_0001);
    // (n_expert, k, groups, scale)
    let shapes: &[(usize, usize, Option<ExpertGroups>, f32)] = &[
        (8, 1, None, 1.0),
        (8, 2, None, 2.5),
        (8, 8, None, 1.0),
        (16, 4, Some(ExpertGroups { count: 4, used: 2 }), 1.0),
        (64, 1, Some(ExpertGroups { count: 8, used: 3 }), 2.5),
        (64, 6, Some(ExpertGroups { count: 8, used: 3 }), 2.5),
        (64, 24, Some(ExpertGroups { count: 8, used: 3 }), 1.0),
        (64, 8, None, 1.5),
        (64, 64, None, 1.0),
        (128, 8, None, 1.0),
    ];
    let mut worst = 0f64;
    let (mut expert_ties, mut group_ties) = (0usize, 0usize);
    for &(n_expert, k, groups, scale) in shapes {
        for gating in [Gating::Softmax, Gating::Sigmoid] {
            for biased in [false, true] {
                for norm in [false, true] {
                    let p = RouteParams { n_expert, k, gating, biased, groups, norm, scale };
                    // Biases on a grid of 1/8 in [-0.5, 0.5]; with groups, every
                    // group has the same biases, so whole groups can tie.
                    let pattern: Vec<f32> = (0..n_expert).map(|_| rng.below(9) as f32 / 8.0 - 0.5).collect();
                    let per = groups.map_or(n_expert, |g| n_expert / g.count);
                    let bias: Option<Vec<f32>> = biased.then(|| (0..n_expert).map(|e| pattern[e % per]).collect());
                    let bias = bias.as_deref();
                    let mut kinds = vec![Kind::Random; 10];
                    kinds.extend([Kind::AllEqual; 2]);
                    // Experts that may be chosen: all, or those of the kept groups.
                    let choosable = groups.map_or(n_expert, |g| g.used * per);
                    if k < choosable {
                        kinds.extend([Kind::ExpertTie; 8]);
                    }
                    if groups.is_some() {
                        kinds.extend([Kind::GroupTie; 8]);
                    }
                    let rows: Vec<Vec<f32>> = kinds.iter().map(|&kind| row(&mut rng, kind, bias, &p)).collect();
                    let (mut e_ties, mut g_ties) = (0, 0);
                    for l in &rows {
                        let (e, g) = boundary_ties(l, bias, &p);
                        (e_ties, g_ties) = (e_ties + e as usize, g_ties + g as usize);
                    }
                    if k < choosable {
                        assert!(e_ties > 0, "{p:?}: no tie across the top-k boundary");
                    }
                    if groups.is_some() {
                        assert!(g_ties > 0, "{p:?}: no tie across the group boundary");
                    }
                    (expert_ties, group_ties) = (expert_ties + e_ties, group_ties + g_ties);
                    worst = worst.max(check_route(&p, &rows, bias, "routing"));
                }
            }
        }
    }
    println!("routing: {expert_ties} rows tie across the top-k boundary, {group_ties} across the group boundary");
    println!("routing: max relative weight error {worst:.3e} (bounds (m + 6)·u, 8.3e-7 for k = 8 renormalised)");
}

/// Chosen weights whose sum lies below the floor: divided by the floor,
/// not by their sum (then scaled).
#[test]
fn routing_weight_sum_floor() {
    let mut rng = Rng::new(0x5EED_0002);
    let n_expert = 16;
    for scale in [1.0f32, 2.5] {
        // Sigmoid, unbiased: every logit very low (σ(-13) ≈ 2e-6, k = 4).
        let p = RouteParams { n_expert, k: 4, gating: Gating::Sigmoid, biased: false, groups: None, norm: true, scale };
        let rows: Vec<Vec<f32>> =
            (0..5).map(|_| (0..n_expert).map(|_| grid(&mut rng, -16.0, -13.0)).collect()).collect();
        for l in &rows {
            let r = route64(l, None, &p);
            assert!(r.ids.iter().map(|&e| r.probs[e]).sum::<f64>() < 0.5 * FLOOR);
            assert!(unambiguous(l, None, &p));
        }
        check_route(&p, &rows, None, "floor");
        // Softmax, biased: experts 0..4 boosted by the bias (by different
        // amounts: their probabilities are too small to order 2 + p in f32)
        // while their logits are 12 below the rest.
        let p = RouteParams { gating: Gating::Softmax, biased: true, ..p };
        let bias: Vec<f32> =
            (0..n_expert).map(|e| if e < 4 { 2.0 + 0.125 * e as f32 } else { 0.125 * (e % 3) as f32 }).collect();
        let rows: Vec<Vec<f32>> = (0..5)
            .map(|_| (0..n_expert).map(|e| grid(&mut rng, -1.0, 1.0) - if e < 4 { 12.0 } else { 0.0 }).collect())
            .collect();
        for l in &rows {
            let r = route64(l, Some(&bias), &p);
            assert_eq!(r.ids, [3, 2, 1, 0]);
            assert!(r.ids.iter().map(|&e| r.probs[e]).sum::<f64>() < 0.5 * FLOOR);
            assert!(unambiguous(l, Some(&bias), &p));
        }
        check_route(&p, &rows, Some(&bias), "floor");
    }
}

// ------------------------------------------------------ expert products --

const TYPES: [GgmlType; 6] =
    [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K];
const N_EXPERT: usize = 8;
const SLOTS: usize = 3;
/// Rows per expert (not a multiple of any chunk size).
const M: usize = 40;

/// Each token's `SLOTS` distinct experts, drawn from {6, 1, 2, 5} in random
/// order: experts repeat across tokens, and 0, 3, 4, 7 are chosen by none.
fn expert_ids(rng: &mut Rng, n: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(n * SLOTS);
    for _ in 0..n {
        let mut pool = vec![6, 1, 2, 5];
        for _ in 0..SLOTS {
            ids.push(pool.remove(rng.below(pool.len())));
        }
    }
    ids
}

/// Activation columns of `k` values, of varied magnitude.
fn columns(rng: &mut Rng, k: usize, n: usize) -> Vec<f32> {
    (0..n)
        .flat_map(|_| {
            let scale = 0.1 * (1 + rng.below(20)) as f32;
            rng.scaled(k, scale)
        })
        .collect()
}

#[test]
fn mul_mat_id_matches_twin() {
    let mut rng = Rng::new(0x5EED_0003);
    for ty in TYPES {
        let kd = 256;
        let rb = tern_quant::row_bytes(ty, kd);
        let w = weight_rows(&mut rng, ty, kd, M * N_EXPERT);
        let mut worst = [0f64; 2];
        for n in [1usize, 3, 17] {
            let ids = expert_ids(&mut rng, n);
            for s in [1, SLOTS] {
                let x = columns(&mut rng, kd, s * n);
                for (pi, precision) in [Precision::Paired, Precision::Float].into_iter().enumerate() {
                    let tol = dot_tol(ty, kd, precision);
                    let worst = &mut worst[pi];
                    // The twin: every (token, slot, row).
                    let mut want = vec![(0f32, 0f64); M * SLOTS * n];
                    for t in 0..n {
                        for j in 0..SLOTS {
                            let e = ids[t * SLOTS + j] as usize;
                            let col = if s == 1 { t } else { t * s + j };
                            let xc = &x[col * kd..(col + 1) * kd];
                            for r in 0..M {
                                let row = &w[(e * M + r) * rb..(e * M + r + 1) * rb];
                                want[(t * SLOTS + j) * M + r] = twin_dot(ty, precision, row, xc);
                            }
                        }
                    }
                    for (threads, isa) in setups() {
                        let mut dev = Dev::new(threads, isa);
                        let mut st = Step::new();
                        let wn = st.weight(&mut dev, ty, [kd, M, N_EXPERT, 1], w.clone());
                        let xn = st.f32(&mut dev, [kd, s, n, 1], &x);
                        let idn = st.i32(&mut dev, [SLOTS, n, 1, 1], &ids);
                        let y = st.g.mul_mat_id(wn, xn, idn, precision);
                        st.run(&mut dev);
                        let got = st.read_f32(&dev, y);
                        for (i, (&g, &(v, sum))) in got.iter().zip(&want).enumerate() {
                            let (r, j, t) = (i % M, i / M % SLOTS, i / (M * SLOTS));
                            if sum > 0.0 {
                                *worst = worst.max((g as f64 - v as f64).abs() / sum);
                            }
                            assert!(
                                (g as f64 - v as f64).abs() <= tol * sum,
                                "{ty} {precision:?} n={n} s={s} {threads} threads {isa:?}: token {t} slot {j} \
                                 (expert {}) row {r}: {g} against {v}, S={sum}",
                                ids[t * SLOTS + j]
                            );
                        }
                    }
                }
            }
        }
        let bounds = [Precision::Paired, Precision::Float].map(|p| dot_tol(ty, kd, p));
        println!(
            "mul_mat_id {ty}: max |Δ|/S paired {:.2e} (bound {:.2e}), float {:.2e} (bound {:.2e})",
            worst[0], bounds[0], worst[1], bounds[1]
        );
    }
}

fn act64(act: Activation, g: f64) -> f64 {
    match act {
        Activation::Silu => g / (1.0 + (-g).exp()),
        Activation::Relu2 => g.max(0.0) * g.max(0.0),
    }
}

#[test]
fn moe_up_gate_matches_twin() {
    let mut rng = Rng::new(0x5EED_0004);
    // Gate and up of one type, and of two (shared or separate activations).
    let pairs: Vec<(GgmlType, GgmlType)> = TYPES
        .into_iter()
        .map(|t| (t, t))
        .chain([(GgmlType::Q4_K, GgmlType::Q6_K), (GgmlType::Q4_0, GgmlType::F16), (GgmlType::Q8_0, GgmlType::Q4_K)])
        .collect();
    let kd = 256;
    let mut worst = 0f64;
    for (gt, ut) in pairs {
        let (grb, urb) = (tern_quant::row_bytes(gt, kd), tern_quant::row_bytes(ut, kd));
        let wg = weight_rows(&mut rng, gt, kd, M * N_EXPERT);
        let wu = weight_rows(&mut rng, ut, kd, M * N_EXPERT);
        for n in [1usize, 3, 17] {
            let ids = expert_ids(&mut rng, n);
            let x = columns(&mut rng, kd, n);
            for precision in [Precision::Paired, Precision::Float] {
                let (tg, tu) = (dot_tol(gt, kd, precision), dot_tol(ut, kd, precision));
                // (g, δg, u, δu) per output.
                let mut twin = vec![[0f64; 4]; M * SLOTS * n];
                for t in 0..n {
                    for j in 0..SLOTS {
                        let e = ids[t * SLOTS + j] as usize;
                        let xc = &x[t * kd..(t + 1) * kd];
                        for r in 0..M {
                            let (g, sg) = twin_dot(gt, precision, &wg[(e * M + r) * grb..][..grb], xc);
                            let (u, su) = twin_dot(ut, precision, &wu[(e * M + r) * urb..][..urb], xc);
                            twin[(t * SLOTS + j) * M + r] = [g as f64, tg * sg, u as f64, tu * su];
                        }
                    }
                }
                for act in [Activation::Silu, Activation::Relu2] {
                    for (threads, isa) in setups() {
                        let mut dev = Dev::new(threads, isa);
                        let mut st = Step::new();
                        let gn = st.weight(&mut dev, gt, [kd, M, N_EXPERT, 1], wg.clone());
                        let un = st.weight(&mut dev, ut, [kd, M, N_EXPERT, 1], wu.clone());
                        let xn = st.f32(&mut dev, [kd, n, 1, 1], &x);
                        let idn = st.i32(&mut dev, [SLOTS, n, 1, 1], &ids);
                        let y = st.g.moe_up_gate(gn, un, xn, idn, act, precision);
                        st.run(&mut dev);
                        let got = st.read_f32(&dev, y);
                        for (i, (&y, &[g, dg, u, du])) in got.iter().zip(&twin).enumerate() {
                            let want = act64(act, g) * u;
                            let lip = match act {
                                Activation::Silu => 1.1,
                                Activation::Relu2 => 2.0 * (g.abs() + dg),
                            };
                            // Below 1e-30 the f32 SiLU may be 0 (exp(−g) overflows
                            // for g < −88.7) or subnormal.
                            let a = act64(act, g).abs();
                            let flushed = if a < 1e-30 { a * (u.abs() + du) } else { 0.0 };
                            let bound = lip * dg * (u.abs() + du) + a * du + 8.0 * U * want.abs() + flushed;
                            let err = (y as f64 - want).abs();
                            let (r, j, t) = (i % M, i / M % SLOTS, i / (M * SLOTS));
                            assert!(
                                err <= bound,
                                "gate {gt} up {ut} {act:?} {precision:?} n={n} {threads} threads {isa:?}: \
                                 token {t} slot {j} row {r}: {y} against {want} (g {g} ± {dg}, u {u} ± {du})"
                            );
                            if flushed == 0.0 && bound > 0.0 {
                                worst = worst.max(err / bound);
                            }
                        }
                    }
                }
            }
        }
    }
    println!("moe_up_gate: max |Δ| / bound {worst:.3e}");
}

#[test]
fn expert_sum_is_the_plain_loop() {
    let mut rng = Rng::new(0x5EED_0005);
    for (m, k, n) in [(40usize, 3usize, 1usize), (64, 8, 17), (7, 1, 3)] {
        let ys = rng.scaled(m * k * n, 1.0);
        let w = rng.scaled(k * n, 0.3);
        let mut want = vec![0f32; m * n];
        for t in 0..n {
            for j in 0..k {
                for i in 0..m {
                    want[t * m + i] += w[t * k + j] * ys[(t * k + j) * m + i];
                }
            }
        }
        for (threads, isa) in setups() {
            let mut dev = Dev::new(threads, isa);
            let mut st = Step::new();
            let yn = st.f32(&mut dev, [m, k, n, 1], &ys);
            let wn = st.f32(&mut dev, [k, n, 1, 1], &w);
            let out = st.g.expert_sum(yn, wn);
            st.run(&mut dev);
            let got = st.read_f32(&dev, out);
            assert!(
                got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                "m={m} k={k} n={n} {threads} threads {isa:?}"
            );
        }
    }
}
