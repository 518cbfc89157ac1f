//! The MoE routing ops (`Op::Route`, `Op::RouteWeights`) and the expert sum
//! (`Op::ExpertSum`) on the GPU against the CPU backend (`tern_cpu::ops::moe`)
//! on random data, with poisoned outputs (an id a kernel misses stays −1, a
//! float NaN, and fails).
//!
//! Needs a CUDA device: skipped with the reason when there is none, unless
//! `TERN_REQUIRE_GPU=1`, which makes that a failure.
//!
//! The kernels (`kernels/route.cu`) do the CPU's f32 operations in the CPU's
//! order (the softmax's sum in index order, the renormalising sum in slot
//! order, no fused multiply-adds); only an exponential may round the other
//! way (the GPU's is e^x in double rounded once to f32, the CPU's is libm's
//! `expf`; both are the correctly rounded value for all but rare
//! arguments), which moves a score by an ulp or two. Bounds:
//! - ids: equal to the CPU's, except in a token whose choice turns on a
//!   near-tie of the CPU's scores, recomputed here in f32 as the CPU does:
//!   every slot of the GPU's list must hold an expert whose selection score
//!   is within `TIE` = 1e-6 relative (8 ulp) of the best expert not yet
//!   listed, the scores' magnitude being the larger of the two experts'
//!   |biased| and unbiased scores (so at the first slot that differs, the
//!   CPU's and the GPU's experts are within `TIE`); or, with groups, the last
//!   kept and the first dropped group's scores are within `TIE` (of twice the
//!   largest score in the two groups; the token is then not checked further).
//!   At least 99% of all tokens must match exactly, so a loose rule cannot
//!   hide a broken kernel; and routers on a coarse grid of logits and biases
//!   (exact ties, NaN, ±inf, k past the kept groups' experts, k = n_expert)
//!   must match in every token, ties to the lower index.
//! - weights (fused with the Route, and alone on given ids): within 1e-6
//!   relative per element, on tokens whose ids agree. A weight goes through
//!   at most six f32 roundings after the exponential (the softmax's sum and
//!   quotient, the renormalising sum and quotient, the scale): an
//!   exponential rounded the other way moves it by a few ulp; 1e-6 is 8 ulp.
//! - expert sum: within 1e-6 of max |cpu| (on tokens whose ids agree in the
//!   routed graph): the same rounded products summed in slot order, so equal
//!   weights give equal sums bit for bit, and weights a few ulp apart move a
//!   sum by a few ulp of its terms.

use std::collections::HashMap;

use tern_backend::{Backend, BackendId};
use tern_cpu::CpuBackend;
use tern_graph::{DType, ExpertGroups, Gating, Graph, InputKind, Node, NodeId, Op, RouteParams};
use tern_quant::GgmlType;

mod common;
use common::*;

/// Relative distance of two scores the GPU may order the other way.
const TIE: f32 = 1e-6;
/// Weights, relative per element; the expert sum, relative to max |cpu|.
const WEIGHT_TOL: f64 = 1e-6;
const SUM_TOL: f64 = 1e-6;
/// Rows of each expert's output in the routed graph.
const M: usize = 64;

// ------------------------------------------- the CPU's router, in f32 here --

/// `tern_cpu::ops::moe::gate`, the same f32 operations.
fn gate(l: &[f32], gating: Gating) -> Vec<f32> {
    match gating {
        Gating::Softmax => {
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut out: Vec<f32> = l.iter().map(|&v| (v - max).exp()).collect();
            let mut sum = 0.0f32;
            for &o in &out {
                sum += o;
            }
            out.iter_mut().for_each(|o| *o /= sum);
            out
        }
        Gating::Sigmoid => l.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect(),
    }
}

/// `best`'s order: larger first, NaN last, ties to the lower index.
fn best(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap_or_else(|| v[a].is_nan().cmp(&v[b].is_nan())).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// One token's router state as the CPU forms it.
struct Scores {
    /// Unbiased scores.
    prob: Vec<f32>,
    /// Selection scores: biased, −inf in dropped groups.
    sel: Vec<f32>,
    /// Biased, before the groups' mask (for magnitudes).
    raw: Vec<f32>,
    /// Group scores (empty without groups).
    gs: Vec<f32>,
}

fn scores(l: &[f32], bias: Option<&[f32]>, p: &RouteParams) -> Scores {
    let prob = gate(l, p.gating);
    let raw: Vec<f32> = match bias {
        Some(b) => prob.iter().zip(b).map(|(s, b)| s + b).collect(),
        None => prob.clone(),
    };
    let mut sel = raw.clone();
    let mut gs = Vec::new();
    if let Some(g) = p.groups {
        let per = p.n_expert / g.count;
        for gi in 0..g.count {
            let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
            for &v in &raw[gi * per..(gi + 1) * per] {
                if v > a {
                    (a, b) = (v, a);
                } else if v > b {
                    b = v;
                }
            }
            gs.push(a + b);
        }
        let kept = best(&gs, g.used);
        for gi in (0..g.count).filter(|gi| !kept.contains(gi)) {
            sel[gi * per..(gi + 1) * per].fill(f32::NEG_INFINITY);
        }
    }
    Scores { prob, sel, raw, gs }
}

fn near(a: f32, b: f32, mag: f32) -> bool {
    a == b || (a - b).abs() <= TIE * mag
}

impl Scores {
    fn mag(&self, e: usize) -> f32 {
        let m = self.raw[e].abs().max(self.prob[e].abs());
        if m.is_finite() {
            m
        } else {
            0.0
        }
    }

    /// Whether the last kept and the first dropped group are near-tied.
    fn groups_near_tied(&self, p: &RouteParams) -> bool {
        let Some(g) = p.groups else { return false };
        if g.used == 0 || g.used >= g.count {
            return false;
        }
        let order = best(&self.gs, g.count);
        let (a, b) = (order[g.used - 1], order[g.used]);
        let per = p.n_expert / g.count;
        let mag = (a * per..(a + 1) * per).chain(b * per..(b + 1) * per).map(|e| self.mag(e)).fold(0.0, f32::max);
        near(self.gs[a], self.gs[b], 2.0 * mag)
    }

    /// Why the GPU's list `got` cannot be the CPU's order up to near-ties
    /// (`None`: it can).
    fn refute(&self, got: &[i32], p: &RouteParams) -> Option<String> {
        let mut seen = vec![false; p.n_expert];
        for &e in got {
            match usize::try_from(e).ok().filter(|&e| e < p.n_expert) {
                Some(e) if !seen[e] => seen[e] = true,
                _ => return Some(format!("id {e} out of range or repeated")),
            }
        }
        if self.groups_near_tied(p) {
            return None;
        }
        let mut left: Vec<usize> = (0..p.n_expert).collect();
        for (j, &e) in got.iter().enumerate() {
            let e = e as usize;
            // The best expert not yet listed, in the CPU's order.
            let vals: Vec<f32> = left.iter().map(|&x| self.sel[x]).collect();
            let top = left[best(&vals, 1)[0]];
            let mag = self.mag(e).max(self.mag(top));
            if e != top && !near(self.sel[e], self.sel[top], mag) {
                return Some(format!(
                    "slot {j}: expert {e} (score {:e}) where the CPU's order has {top} ({:e})",
                    self.sel[e], self.sel[top]
                ));
            }
            left.retain(|&x| x != e);
        }
        None
    }
}

// ------------------------------------------------------------- the graphs --

/// An i32 `[k, n]` input (the ids a RouteWeights reads, given by the test).
fn ids_input(g: &mut Graph, k: usize, n: usize) -> NodeId {
    let op = Op::Input(InputKind::Tokens);
    g.nodes.push(Node { op, srcs: vec![], ne: [k, n, 1, 1], dtype: DType::I32, label: None });
    NodeId(g.nodes.len() as u32 - 1)
}

fn to_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Distinct random ids, `k` a token.
fn random_ids(rng: &mut Rng, n_expert: usize, k: usize, n: usize) -> Vec<i32> {
    let mut out = Vec::with_capacity(k * n);
    for _ in 0..n {
        let mut all: Vec<i32> = (0..n_expert as i32).collect();
        for j in 0..k {
            let r = j + rng.below(n_expert - j);
            all.swap(j, r);
        }
        out.extend_from_slice(&all[..k]);
    }
    out
}

struct Outcome {
    tokens: usize,
    exact: usize,
}

fn close(a: f32, b: f32, tol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || ((a as f64 - b as f64).abs() <= tol)
}

/// logits (+ bias) → Route → RouteWeights (fused) → ExpertSum of random
/// expert outputs, and a RouteWeights alone on random ids; run on the CPU and
/// the GPU and checked as the top doc says. `exact`: every token's ids must
/// be the CPU's.
fn check_router(
    gpu: &mut dyn Backend,
    p: RouteParams,
    logits: &[f32],
    bias: Option<&[f32]>,
    rng: &mut Rng,
    exact: bool,
) -> Outcome {
    let (ne, k) = (p.n_expert, p.k);
    let n = logits.len() / ne;
    let what = format!("{p:?} n={n}");
    let mut g = Graph::new();
    let lg = g.weight(0, "logits", GgmlType::F32, [ne, n, 1, 1]);
    let bw = bias.map(|_| g.weight(1, "bias", GgmlType::F32, [ne, 1, 1, 1]));
    let ys = g.weight(2, "ys", GgmlType::F32, [M, k, n, 1]);
    let given = ids_input(&mut g, k, n);
    let ids = g.route(lg, bw, p);
    let w = g.route_weights(lg, ids, p);
    let y = g.expert_sum(ys, w);
    let w_given = g.route_weights(lg, given, p);
    let outs = [ids, w, y, w_given];
    let given_ids = random_ids(rng, ne, k, n);
    let mut data =
        HashMap::from([(lg, bytes_f32(logits)), (ys, bytes_f32(&rng.vec(M * k * n))), (given, bytes_i32(&given_ids))]);
    if let (Some(bw), Some(b)) = (bw, bias) {
        data.insert(bw, bytes_f32(b));
    }
    let want = run(&mut CpuBackend::new(BackendId::CPU, 2), &g, &data, &outs);
    let got = run(gpu, &g, &data, &outs);
    let (ci, gi) = (to_i32(&want[0]), to_i32(&got[0]));
    let (cw, gw) = (to_f32(&want[1]), to_f32(&got[1]));
    let (cy, gy) = (to_f32(&want[2]), to_f32(&got[2]));
    let (cg, gg) = (to_f32(&want[3]), to_f32(&got[3]));
    let y_scale = cy.iter().filter(|v| v.is_finite()).fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-30);
    let mut n_exact = 0;
    for t in 0..n {
        // The weights on given ids do not depend on the choice.
        for j in t * k..(t + 1) * k {
            let tol = WEIGHT_TOL * cg[j].abs() as f64;
            assert!(close(cg[j], gg[j], tol), "{what}: token {t} weight {j} on given ids: cpu {} gpu {}", cg[j], gg[j]);
        }
        let (c, gt) = (&ci[t * k..(t + 1) * k], &gi[t * k..(t + 1) * k]);
        if c != gt {
            assert!(!exact, "{what}: token {t}: cpu ids {c:?}, gpu {gt:?}");
            let s = scores(&logits[t * ne..(t + 1) * ne], bias, &p);
            if let Some(why) = s.refute(gt, &p) {
                panic!("{what}: token {t}: cpu ids {c:?}, gpu {gt:?}: {why}");
            }
            continue;
        }
        n_exact += 1;
        for j in t * k..(t + 1) * k {
            let tol = WEIGHT_TOL * cw[j].abs() as f64;
            assert!(close(cw[j], gw[j], tol), "{what}: token {t} weight {j}: cpu {} gpu {}", cw[j], gw[j]);
        }
        for i in t * M..(t + 1) * M {
            let ok = close(cy[i], gy[i], SUM_TOL * y_scale);
            assert!(ok, "{what}: token {t} sum element {i}: cpu {} gpu {}", cy[i], gy[i]);
        }
    }
    Outcome { tokens: n, exact: n_exact }
}

/// (n_expert, k, groups as (count, used)).
type Shape = (usize, usize, Option<(usize, usize)>);

fn params(n_expert: usize, k: usize, gating: Gating, biased: bool, groups: Option<(usize, usize)>) -> RouteParams {
    RouteParams {
        n_expert,
        k,
        gating,
        biased,
        groups: groups.map(|(count, used)| ExpertGroups { count, used }),
        norm: true,
        scale: 1.0,
    }
}

// ------------------------------------------------------------------ tests --

/// Random routers at the shapes of the MoE models and the kernels' limits:
/// softmax and sigmoid, with and without the bias, groups, norm and scale,
/// 1, 7 and 300 tokens.
#[test]
fn routing_and_expert_sum_match_cpu_on_random_routers() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(41);
    let shapes: [Shape; 9] = [
        (256, 8, Some((8, 4))), // DeepSeek-V3
        (256, 8, None),
        (64, 6, None),          // DeepSeek-V2-Lite
        (128, 8, None),         // Qwen3-MoE
        (160, 6, None),         // DeepSeek-V2
        (160, 6, Some((8, 3))), // DeepSeek-V2's group limit
        (384, 8, Some((1, 1))), // Kimi-K2: one group
        (512, 16, Some((16, 4))),
        (1024, 32, None), // the kernels' limits
    ];
    let (mut tokens, mut exact) = (0, 0);
    for (ne, k, groups) in shapes {
        for gating in [Gating::Softmax, Gating::Sigmoid] {
            for biased in [false, true] {
                for (norm, scale) in [(true, 1.0), (true, 2.5), (false, 1.5)] {
                    for n in [1, 7, 300] {
                        let p = RouteParams { norm, scale, ..params(ne, k, gating, biased, groups) };
                        let logits = rng.normals(ne * n, 2.0);
                        let bias = biased.then(|| rng.vec(ne).iter().map(|b| b * 0.5).collect::<Vec<f32>>());
                        let o = check_router(&mut gpu, p, &logits, bias.as_deref(), &mut rng, false);
                        tokens += o.tokens;
                        exact += o.exact;
                    }
                }
            }
        }
    }
    eprintln!("routing: {exact} of {tokens} tokens chose the CPU's experts exactly");
    assert!(exact as f64 >= 0.99 * tokens as f64, "only {exact} of {tokens} tokens match exactly");
}

/// The tie rule can fail: on the CPU's own routing (no GPU needed) the
/// mirror here picks the CPU backend's ids, which pass, while lists a kernel
/// bug would give (two slots swapped, an expert past the k best, a repeated
/// or missing id) are refuted; and the routed graph's checks pass with the
/// CPU standing in for the GPU.
#[test]
fn the_tie_rule_refutes_wrong_choices() {
    let mut rng = Rng::new(53);
    let mut cpu = CpuBackend::new(BackendId::CPU, 1);
    let (mut refuted, mut lists) = (0, 0);
    for (ne, k, groups) in [(256, 8, Some((8, 4))), (160, 6, None)] {
        for gating in [Gating::Softmax, Gating::Sigmoid] {
            let p = params(ne, k, gating, true, groups);
            let n = 50;
            let logits = rng.normals(ne * n, 2.0);
            let bias: Vec<f32> = rng.vec(ne).iter().map(|b| b * 0.5).collect();
            let o = check_router(&mut cpu, p, &logits, Some(&bias), &mut rng, true);
            assert_eq!(o.exact, n);
            for t in 0..n {
                let s = scores(&logits[t * ne..(t + 1) * ne], Some(&bias), &p);
                let ids: Vec<i32> = best(&s.sel, k).into_iter().map(|e| e as i32).collect();
                assert_eq!(s.refute(&ids, &p), None, "token {t}");
                let ranked = best(&s.sel, ne);
                let mut wrong = vec![ids.clone(), ids.clone(), ids.clone(), ids.clone()];
                wrong[0].swap(0, k - 1);
                wrong[1][k - 1] = ranked[k + 5] as i32;
                wrong[2][1] = ids[0];
                wrong[3][0] = -1;
                for w in &wrong {
                    lists += 1;
                    refuted += s.refute(w, &p).is_some() as usize;
                }
            }
        }
    }
    // A near-tie may excuse a swap now and then, never most of them.
    assert!(refuted as f64 >= 0.95 * lists as f64, "{refuted} of {lists} wrong lists refuted");
}

/// Whether the distinct values of `v` (NaN and infinities aside) are at
/// least 1e-5 of their magnitude apart, so neither side can order them
/// differently.
fn separated(v: &[f32]) -> bool {
    let mut f: Vec<f32> = v.iter().copied().filter(|x| x.is_finite()).collect();
    f.sort_by(|a, b| a.partial_cmp(b).unwrap());
    f.windows(2).all(|w| w[0] == w[1] || (w[1] - w[0]) > 1e-5 * w[0].abs().max(w[1].abs()))
}

/// Routers on a coarse grid: logits in steps of 0.5, biases of 0.25, so
/// equal inputs make exact ties of experts and of groups on both sides
/// (broken to the lower index), with NaN and ±inf logits in some tokens,
/// k past the kept groups' experts (−inf experts chosen by index) and k =
/// n_expert. Tokens whose distinct scores or group scores come closer than
/// 1e-5 are drawn again. Every token must match exactly.
#[test]
fn routing_ties_nan_and_infinities_match_cpu_exactly() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(43);
    let shapes: [Shape; 5] = [
        (256, 8, Some((8, 4))),
        (64, 20, Some((8, 2))), // 16 kept experts: four −inf ones chosen
        (16, 16, None),
        (128, 8, None),
        (160, 6, Some((8, 3))),
    ];
    let grid = |rng: &mut Rng, steps: usize, step: f32| (rng.below(2 * steps + 1) as f32 - steps as f32) * step;
    for (ne, k, groups) in shapes {
        for gating in [Gating::Softmax, Gating::Sigmoid] {
            for biased in [false, true] {
                let p = RouteParams { scale: 2.5, ..params(ne, k, gating, biased, groups) };
                let n = 40;
                let bias: Option<Vec<f32>> = biased.then(|| (0..ne).map(|_| grid(&mut rng, 1, 0.25)).collect());
                let mut logits = Vec::with_capacity(ne * n);
                for t in 0..n {
                    let mut draws = 0;
                    let row = loop {
                        draws += 1;
                        assert!(draws < 1000, "no separated row for {p:?} token {t}");
                        let mut row: Vec<f32> = (0..ne).map(|_| grid(&mut rng, 4, 0.5)).collect();
                        match t % 8 {
                            1 => row[rng.below(ne)] = f32::NAN,
                            2 => row[rng.below(ne)] = f32::INFINITY,
                            3 => row[rng.below(ne)] = f32::NEG_INFINITY,
                            4 => row.iter_mut().for_each(|v| *v = 0.5), // one value: all tied
                            _ => {}
                        }
                        let s = scores(&row, bias.as_deref(), &p);
                        if separated(&s.raw) && separated(&s.gs) {
                            break row;
                        }
                    };
                    logits.extend(row);
                }
                check_router(&mut gpu, p, &logits, bias.as_deref(), &mut rng, true);
            }
        }
    }
}

/// The expert sum alone at widths that end inside a block of 256 and past
/// a grid's worth of elements, k of 1 to 8, 1 to 300 tokens.
#[test]
fn expert_sum_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(47);
    for (m, k, n) in [(1, 1, 1), (7, 6, 7), (2048, 8, 1), (7168, 8, 7), (300, 6, 300), (4096, 8, 300)] {
        let mut g = Graph::new();
        let ys = g.weight(0, "ys", GgmlType::F32, [m, k, n, 1]);
        let w = g.weight(1, "w", GgmlType::F32, [k, n, 1, 1]);
        let y = g.expert_sum(ys, w);
        let data = HashMap::from([(ys, bytes_f32(&rng.vec(m * k * n))), (w, bytes_f32(&rng.vec(k * n)))]);
        let e = compare(&mut gpu, &g, &data, &[y], SUM_TOL, &format!("expert_sum m={m} k={k} n={n}"));
        eprintln!("expert_sum m={m} k={k} n={n}: {e:.1e}");
    }
}
