//! Float and block-quantized matmuls on the GPU against the CPU backend on
//! random data, with poisoned outputs (`common::run`): every block type's
//! GPU layout in the GEMVs and `get_rows`, a quantized model's paired
//! products (one token's and a prompt's on tensor cores), and the norms
//! folded into one token's products (the Q6_K head's, the levels').
//!
//! Needs a CUDA device: skipped with the reason when there is none, unless
//! `TERN_REQUIRE_GPU=1`. Bounds, as max |gpu − cpu| / max |cpu|: f32 weights
//! or activations 1e-4 (f32 summation order); paired products 1e-5 (the
//! CPU's integers, f32 sums in another order).

use std::collections::HashMap;

use tern_graph::{Graph, InputKind, Precision};
use tern_quant::GgmlType;

mod common;
use common::*;

#[test]
fn float_and_block_matmuls_and_get_rows_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(3);
    let types = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q6_K,
        GgmlType::Q2_0,
        GgmlType::Q1_0,
        GgmlType::Q5_0,
        GgmlType::Q3_K,
        GgmlType::IQ4_XS,
        GgmlType::IQ4_NL,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
    ];
    for ty in types {
        for &(k, rows, n) in &[(256usize, 33usize, 1usize), (512, 100, 5), (768, 17, 13)] {
            let mut g = Graph::new();
            let w = g.weight(0, "w", ty, [k, rows, 1, 1]);
            let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
            let ids = g.input(InputKind::Tokens, 4);
            let y = g.mul_mat(w, x, Precision::Float);
            let r = g.get_rows(w, ids);
            let mut weight = float_weight(ty, k, rows, &mut rng);
            if ty == GgmlType::Q2_0 {
                // Every code, +2 included (the quantizer writes only −1, 0, +1).
                weight.chunks_exact_mut(18).for_each(|b| b[2..].iter_mut().for_each(|q| *q = rng.next_u64() as u8));
            }
            if ty == GgmlType::Q5_0 {
                // Random nibbles and fifth bits: every level in every position.
                weight.chunks_exact_mut(22).for_each(|b| b[2..].iter_mut().for_each(|q| *q = rng.next_u64() as u8));
            }
            if ty == GgmlType::Q3_K {
                // Random third bits, low bits and scale codes (d, at the end, kept).
                weight.chunks_exact_mut(110).for_each(|b| b[..108].iter_mut().for_each(|q| *q = rng.next_u64() as u8));
            }
            if ty == GgmlType::IQ4_XS {
                // Random scale codes and table indices (d, at the start, kept).
                weight.chunks_exact_mut(136).for_each(|b| b[2..].iter_mut().for_each(|q| *q = rng.next_u64() as u8));
            }
            let data = HashMap::from([
                (w, weight),
                (x, bytes_f32(&rng.vec(k * n))),
                (ids, bytes_i32(&[0, (rows - 1) as i32, 3 % rows as i32, 1])),
            ]);
            let e = compare(&mut gpu, &g, &data, &[y, r], 1e-4, &format!("{ty} k={k} rows={rows} n={n}"));
            eprintln!("{ty} {k}x{rows} n={n}: {e:.1e}");
            // A quantized model's product: int8 activations quantized as the
            // CPU does, the same integers, f32 sums in another order (Q6_K
            // matrices keep f32 activations for prompts: not here).
            if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q6_K) {
                let mut g = Graph::new();
                let w = g.weight(0, "w", ty, [k, rows, 1, 1]);
                let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
                let y = g.mul_mat(w, x, Precision::Paired);
                let data = HashMap::from([(w, data[&w].clone()), (x, data[&x].clone())]);
                let e = compare(&mut gpu, &g, &data, &[y], 1e-5, &format!("paired {ty} k={k} rows={rows} n={n}"));
                eprintln!("paired {ty} {k}x{rows} n={n}: {e:.1e}");
            }
        }
    }
}

/// A quantized model's prompt products of levels run on tensor cores
/// (levels_mma.cu): the CPU's integers per 16-element group, so only the f32
/// sums differ (1e-5). Shapes: partial row and token tiles, several of each,
/// k of one chunk and of many; a residual added in the same launch; every
/// layout (levels, with offsets; Q8_0's and Q8_K's activation blocks; Q6_K
/// planes decoded as they are staged). Float weights take the tiled f32
/// GEMM (1e-4, f32 summation order).
#[test]
fn paired_prompt_products_on_tensor_cores_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(29);
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q2_K,
        GgmlType::IQ4_XS,
        GgmlType::Q6_K,
        GgmlType::F32,
        GgmlType::F16,
    ];
    for ty in types {
        let float = matches!(ty, GgmlType::F32 | GgmlType::F16);
        let (precision, bound) = if float { (Precision::Float, 1e-4) } else { (Precision::Paired, 1e-5) };
        for &(k, rows, n) in &[(256usize, 200usize, 150usize), (1536, 64, 64), (768, 37, 9), (2048, 130, 70)] {
            let mut g = Graph::new();
            let w = g.weight(0, "w", ty, [k, rows, 1, 1]);
            let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
            let r = g.weight(2, "r", GgmlType::F32, [rows, n, 1, 1]);
            let y = g.mul_mat(w, x, precision);
            let sum = g.add(y, r);
            let data = HashMap::from([
                (w, float_weight(ty, k, rows, &mut rng)),
                (x, bytes_f32(&rng.vec(k * n))),
                (r, bytes_f32(&rng.vec(rows * n))),
            ]);
            let what = format!("tensor-core {ty} k={k} rows={rows} n={n}");
            let e = compare(&mut gpu, &g, &data, &[sum], bound, &what);
            eprintln!("{what}: {e:.1e}");
        }
    }
}

/// A quantized model's Q6_K head for one token runs the CPU's integers (x
/// as Q8_K, exact dp4a sums per block), so only the float sums of the blocks
/// differ: bound 1e-5 of the largest output. The kernel takes a row in rounds
/// of up to 10 blocks, a warp's next round loading while it multiplies the
/// current one: one short round (k 256, 768), one full round (2560), a full
/// and a short one (3072), two full ones (5120). 33 and 301 rows leave warps
/// of the last block without a row, 1000 give each warp one; 4099 and 5000
/// rows take the walk past the first grid of blocks (three an SM), so that
/// some warps' last row is their first and others' their second.
#[test]
fn paired_q6k_one_token_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(41);
    let shapes = [(256usize, 33usize), (2560, 1000), (768, 5000), (3072, 301), (5120, 4099)];
    for &(k, rows) in &shapes {
        let mut g = Graph::new();
        let w = g.weight(0, "w", GgmlType::Q6_K, [k, rows, 1, 1]);
        let x = g.weight(1, "x", GgmlType::F32, [k, 1, 1, 1]);
        let y = g.mul_mat(w, x, Precision::Paired);
        let data = HashMap::from([(w, float_weight(GgmlType::Q6_K, k, rows, &mut rng)), (x, bytes_f32(&rng.vec(k)))]);
        let e = compare(&mut gpu, &g, &data, &[y], 1e-5, &format!("paired Q6_K k={k} rows={rows}"));
        eprintln!("paired Q6_K {k}x{rows}: {e:.1e}");
    }
}

/// A quantized model's final norm folded into its one-token Q6_K head: the
/// head norms x itself with rms_norm's float operations, so it matches the
/// same graph with the normed row also an output (where rms_norm runs as a
/// launch of its own) bit for bit, in one launch instead of two. Against
/// the CPU, whose norm sums in another order (an activation level can move
/// by one at a rounding tie): 1e-4 of the largest output. 2560 is the
/// 2B-4T's width; 5000 rows walk past the first grid of blocks.
#[test]
fn final_norm_folded_into_the_q6k_head_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(43);
    for &(k, rows) in &[(256usize, 33usize), (2560, 5000)] {
        let mut g = Graph::new();
        let w = g.weight(0, "w", GgmlType::Q6_K, [k, rows, 1, 1]);
        let x = g.weight(1, "x", GgmlType::F32, [k, 1, 1, 1]);
        let nw = g.weight(2, "nw", GgmlType::F32, [k, 1, 1, 1]);
        let n = g.rms_norm(x, 1e-5);
        let m = g.mul(n, nw);
        let y = g.mul_mat(w, m, Precision::Paired);
        let norm_w: Vec<f32> = rng.vec(k).iter().map(|v| 1.0 + 0.5 * v).collect();
        let data = HashMap::from([
            (w, float_weight(GgmlType::Q6_K, k, rows, &mut rng)),
            (x, bytes_f32(&rng.vec(k).iter().map(|v| 3.0 * v).collect::<Vec<_>>())),
            (nw, bytes_f32(&norm_w)),
        ]);
        let what = format!("normed Q6_K head k={k} rows={rows}");
        let e = compare(&mut gpu, &g, &data, &[y], 1e-4, &what);
        let folded = (run(&mut gpu, &g, &data, &[y]).remove(0), gpu.stats.last_launches);
        g.mark_output(m);
        let apart = (run(&mut gpu, &g, &data, &[y]).remove(0), gpu.stats.last_launches);
        eprintln!("{what}: {e:.1e}, {} launch(es) against {}", folded.1, apart.1);
        assert!(folded.0 == apart.0, "{what}: the folded norm's head differs from rms_norm then the head");
        assert!(folded.1 < apart.1, "{what}: {} launches, {} with the norm apart: not folded", folded.1, apart.1);
    }
}

/// One token's norm folded into the paired products of int8 levels that
/// read it (`q8p_gemv1x` and its gated pair norm x themselves, with
/// rms_norm's double sum in its order): bit for bit the graph with the
/// normed row also an output (where rms_norm runs as a launch of its own),
/// in fewer launches; against the CPU 1e-4 of the largest output (its norm
/// sums in another order, which can move an activation level at a tie).
/// Two products of Q4_K (offsets) and Q8_0 summed; a gated Q4_K pair and
/// its down product. The residual read of x after them keeps x alive.
#[test]
fn norm_folded_into_paired_levels_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(47);
    for k in [256usize, 2048] {
        for gated in [false, true] {
            let mut g = Graph::new();
            let x = g.weight(0, "x", GgmlType::F32, [k, 1, 1, 1]);
            let nw = g.weight(1, "nw", GgmlType::F32, [k, 1, 1, 1]);
            let wa = g.weight(2, "wa", GgmlType::Q4_K, [k, 512, 1, 1]);
            let wb_ty = if gated { GgmlType::Q4_K } else { GgmlType::Q8_0 };
            let wb = g.weight(3, "wb", wb_ty, [k, 512, 1, 1]);
            let wd = g.weight(4, "wd", GgmlType::Q8_0, [512, k, 1, 1]);
            let n = g.rms_norm(x, 1e-6);
            let m = g.mul(n, nw);
            let (a, b) = (g.mul_mat(wa, m, Precision::Paired), g.mul_mat(wb, m, Precision::Paired));
            let c = if gated { g.gated_act(a, b, tern_graph::Activation::Silu) } else { g.add(a, b) };
            let d = g.mul_mat(wd, c, Precision::Paired);
            let y = g.add(x, d);
            let norm_w: Vec<f32> = rng.vec(k).iter().map(|v| 1.0 + 0.5 * v).collect();
            let data = HashMap::from([
                (x, bytes_f32(&rng.vec(k).iter().map(|v| 3.0 * v).collect::<Vec<_>>())),
                (nw, bytes_f32(&norm_w)),
                (wa, float_weight(GgmlType::Q4_K, k, 512, &mut rng)),
                (wb, float_weight(wb_ty, k, 512, &mut rng)),
                (wd, float_weight(GgmlType::Q8_0, 512, k, &mut rng)),
            ]);
            let what = format!("norm folded into paired levels k={k} gated={gated}");
            let e = compare(&mut gpu, &g, &data, &[y], 1e-4, &what);
            let folded = (run(&mut gpu, &g, &data, &[y]).remove(0), gpu.stats.last_launches);
            g.mark_output(m);
            let apart = (run(&mut gpu, &g, &data, &[y]).remove(0), gpu.stats.last_launches);
            eprintln!("{what}: {e:.1e}, {} launch(es) against {}", folded.1, apart.1);
            assert!(folded.0 == apart.0, "{what}: the folded norm's products differ from rms_norm then them");
            assert!(folded.1 < apart.1, "{what}: {} launches, {} with the norm apart: not folded", folded.1, apart.1);
        }
    }
}
