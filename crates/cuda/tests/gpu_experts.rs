//! The expert products of a mixture of experts on the GPU (`Op::MulMatId`,
//! `Op::MoeUpGate`: `moe_plan` and the `moe_*` GEMVs) against the CPU
//! backend, on every way an expert tensor is held: int8 levels (Q8_0, Q5_0,
//! Q6_K's 3-D tensors), levels with offsets (Q4_K, Q5_K, Q2_K, Q4_1) and
//! stored floats (F32, F16); gate and up of different holdings (Q4_K gate,
//! Q8_0 up). Batches of 1 token (a decoding step), 5, and 40 tokens whose
//! choices pile onto few experts (an expert's pairs cut into several items
//! of 8), one input per token or one per slot. Outputs poisoned before the
//! run: a pair the plan loses stays NaN and fails.
//!
//! With `Precision::Float` both sides multiply f32 activations; only the
//! order of the f32 sums differs, bound 1e-4 of the largest output, as the
//! dense block matmuls in `gpu_ops.rs`. With `Precision::Paired` (a
//! quantized model) both quantize the activations to the weight type's
//! int8 blocks bit for bit and form the same integers: 1e-5 (gate and up of
//! one activation type; the mixed pair runs float only).
//!
//! Needs a CUDA device: skipped with the reason when there is none, unless
//! `TERN_REQUIRE_GPU=1`.

use std::collections::HashMap;

use tern_graph::{Activation, Graph, InputKind, Precision};
use tern_quant::GgmlType;

mod common;
use common::*;

/// Ids `[k_used, n]`: distinct experts per token. With `piled`, every token
/// chooses among the first `k_used + 2` experts, so each is chosen by most
/// tokens; else among all `n_expert`.
fn choices(rng: &mut Rng, n_expert: usize, k_used: usize, n: usize, piled: bool) -> Vec<i32> {
    let pool = if piled { k_used + 2 } else { n_expert };
    let mut ids = Vec::with_capacity(k_used * n);
    for _ in 0..n {
        let mut chosen: Vec<i32> = Vec::with_capacity(k_used);
        while chosen.len() < k_used {
            let e = rng.below(pool) as i32;
            if !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        ids.extend(chosen);
    }
    ids
}

/// An expert tensor `[k, m, n_expert]` of `ty` from random values.
fn experts(ty: GgmlType, k: usize, m: usize, n_expert: usize, rng: &mut Rng) -> Vec<u8> {
    float_weight(ty, k, m * n_expert, rng)
}

#[test]
fn expert_products_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(71);
    let pairs = [
        (GgmlType::Q8_0, GgmlType::Q8_0),
        (GgmlType::Q5_0, GgmlType::Q5_0),
        (GgmlType::Q6_K, GgmlType::Q6_K),
        (GgmlType::Q4_K, GgmlType::Q4_K),
        (GgmlType::Q5_K, GgmlType::Q5_K),
        (GgmlType::Q2_K, GgmlType::Q2_K),
        (GgmlType::Q4_1, GgmlType::Q4_1),
        (GgmlType::F32, GgmlType::F32),
        (GgmlType::F16, GgmlType::F16),
        (GgmlType::Q4_K, GgmlType::Q8_0),
    ];
    // (k, m, n_expert, k_used, tokens, piled)
    // Past 8 tokens the paired products run on tensor cores in items of up
    // to 64 pairs: 40 piled tokens fill some experts' items, 150 tokens over
    // 32 experts give most experts two items and a partial row tile. One
    // token at k 2048 (DeepSeek-V2-Lite's width) walks whole Q4_K rows.
    let shapes = [
        (256usize, 96usize, 16usize, 4usize, 1usize, false),
        (2048, 40, 16, 6, 1, false),
        (512, 130, 64, 6, 5, false),
        (256, 72, 16, 8, 40, true),
        (1024, 80, 32, 8, 150, false),
    ];
    for (tg, tu) in pairs {
        let floats = matches!(tg, GgmlType::F32 | GgmlType::F16);
        let precisions: &[Precision] =
            if floats || tg != tu { &[Precision::Float] } else { &[Precision::Float, Precision::Paired] };
        for &(k, m, n_expert, k_used, n, piled) in &shapes {
            for (&precision, act) in precisions.iter().flat_map(|p| [(p, Activation::Silu), (p, Activation::Relu2)]) {
                let mut g = Graph::new();
                let wg = g.weight(0, "gate", tg, [k, m, n_expert, 1]);
                let wu = g.weight(1, "up", tu, [k, m, n_expert, 1]);
                // Down's rows are m too; its k is 256 (block types need whole blocks).
                let wd = g.weight(2, "down", tg, [256, m, n_expert, 1]);
                let x = g.weight(3, "x", GgmlType::F32, [k, n, 1, 1]);
                // Down's input, one column per (slot, token).
                let xs = g.weight(4, "xs", GgmlType::F32, [256, k_used, n, 1]);
                let ids = g.input(InputKind::Tokens, k_used * n);
                g.nodes[ids.index()].ne = [k_used, n, 1, 1];
                let gu = g.moe_up_gate(wg, wu, x, ids, act, precision);
                let down = g.mul_mat_id(wd, xs, ids, precision);
                // One input shared by the slots: [k, 1, n].
                let x1 = g.weight(5, "x1", GgmlType::F32, [k, 1, n, 1]);
                let gate_only = g.mul_mat_id(wg, x1, ids, precision);
                let data = HashMap::from([
                    (wg, experts(tg, k, m, n_expert, &mut rng)),
                    (wu, experts(tu, k, m, n_expert, &mut rng)),
                    (wd, experts(tg, 256, m, n_expert, &mut rng)),
                    (x, bytes_f32(&rng.vec(k * n))),
                    (xs, bytes_f32(&rng.vec(256 * k_used * n))),
                    (x1, bytes_f32(&rng.vec(k * n))),
                    (ids, bytes_i32(&choices(&mut rng, n_expert, k_used, n, piled))),
                ]);
                let what =
                    format!("{tg}/{tu} k={k} m={m} experts={n_expert} k_used={k_used} n={n} {act:?} {precision:?}");
                let bound = if precision == Precision::Paired { 1e-5 } else { 1e-4 };
                let e = compare(&mut gpu, &g, &data, &[gu, down, gate_only], bound, &what);
                eprintln!("{what}: {e:.1e}");
            }
        }
    }
}
