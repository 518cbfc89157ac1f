//! Every GPU op against the CPU backend on random data, with poisoned outputs
//! (NaN before the run: an element the kernel misses stays NaN and fails),
//! plus a timing table of the ternary GEMV/GEMM at the 2B-4T shapes.
//!
//! Needs a CUDA device: skipped with the reason when there is none, unless
//! `TERN_REQUIRE_GPU=1` (`scripts/gpu check` sets it), which makes that a
//! failure. Bounds, as max |gpu − cpu| / max |cpu|:
//! - ternary matmuls: 0 for one scale per row (the same integer sums and the
//!   same float operations), 1e-5 for per-block scales (summation order);
//! - (float and block-quantized matmuls: gpu_blocks.rs);
//! - norms, rope, pointwise ops, attention: 1e-4 (f16 caches: 2e-3; the
//!   tensor-core prompt attention, which rounds q and P to f16: 5e-3).

use std::collections::HashMap;
use std::sync::Arc;

use tern_backend::{Backend, BackendId, HostBytes, TensorLoc, WeightDesc};
use tern_cpu::CpuBackend;
use tern_cuda::{CudaBackend, CudaOptions};
use tern_graph::{
    Activation, AttentionParams, DType, Graph, InputKind, KvKind, NodeId, Op, Precision, RopeMode, RopeParams,
};
use tern_quant::GgmlType;

mod common;
use common::*;

const TERNARY: [GgmlType; 5] = [GgmlType::TQ2_0, GgmlType::TQ1_0, GgmlType::IQ2_BN, GgmlType::IQ1_BN, GgmlType::I2_S];

/// Whether `ty` stores rows of `k` (block sizes).
fn fits(ty: GgmlType, k: usize) -> bool {
    ty.tensor_bytes(&[k as u64, 1]).is_some()
}

#[test]
fn ternary_matmuls_match_cpu_for_every_format_and_shape() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(11);
    // (k, rows, tokens): odd rows, k not a multiple of 256, GEMV (≤ 8 tokens)
    // and GEMM sizes: 129, 200, 300 and 4,000 rows end inside a tile of 256
    // rows (mma.sync) and of 128 or 192 (wgmma, sm_90: 4,000 × 1,100 tokens
    // is the only shape with enough blocks for 192-row tiles; 1,100 tokens
    // are 9 tiles of 128, the last partial; k 2,560 is 10 chunks, more than
    // the stages).
    let shapes = [
        (256, 1, 1),
        (512, 7, 3),
        (1280, 130, 8),
        (2560, 640, 1),
        (2560, 300, 9),
        (768, 129, 33),
        (2560, 2560, 100),
        (768, 200, 1100),
        (256, 4000, 1100),
    ];
    let mut report = Vec::new();
    for ty in TERNARY {
        for &(k, rows, n) in &shapes {
            if !fits(ty, k) {
                continue;
            }
            let mut g = Graph::new();
            let w = g.weight(0, "w", ty, [k, rows, 1, 1]);
            let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
            let y = g.mul_mat(w, x, Precision::Paired);
            g.mark_output(y);
            let data =
                HashMap::from([(w, ternary_weight(ty, k, rows, false, &mut rng)), (x, bytes_f32(&rng.vec(k * n)))]);
            let e = compare(&mut gpu, &g, &data, &[y], 0.0, &format!("{ty} k={k} rows={rows} n={n}"));
            report.push(format!("{ty} {k}x{rows} n={n}: {e:.1e}"));
        }
    }
    // Per-block scales (a TQ file whose blocks disagree): the grouped paths.
    for (ty, n) in [(GgmlType::TQ2_0, 1), (GgmlType::TQ2_0, 40), (GgmlType::TQ1_0, 4), (GgmlType::TQ2_0, 1030)] {
        let (k, rows) = (1024, 96);
        let mut g = Graph::new();
        let w = g.weight(0, "w", ty, [k, rows, 1, 1]);
        let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
        let y = g.mul_mat(w, x, Precision::Paired);
        let data = HashMap::from([(w, ternary_weight(ty, k, rows, true, &mut rng)), (x, bytes_f32(&rng.vec(k * n)))]);
        let e = compare(&mut gpu, &g, &data, &[y], 1e-5, &format!("{ty} grouped n={n}"));
        report.push(format!("{ty} grouped n={n}: {e:.1e}"));
    }
    eprintln!("{}", report.join("\n"));
}

/// Offloaded matmuls: weights kept as staged copies in host memory are
/// streamed into the device ring (`copy_in`) by each launch that reads them;
/// the products equal the CPU's exactly, alone, as a batched pair next to a
/// resident weight, for GEMV and GEMM token counts and every ternary format.
#[test]
fn staged_weights_stream_in_and_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(23);
    for ty in TERNARY {
        for (k, n) in [(1280usize, 1usize), (1280, 40), (768, 7)] {
            if !fits(ty, k) {
                continue;
            }
            let mut g = Graph::new();
            let x = g.weight(0, "x", GgmlType::F32, [k, n, 1, 1]);
            let wa = g.weight(1, "a", ty, [k, 300, 1, 1]);
            let wb = g.weight(2, "b", ty, [k, 300, 1, 1]);
            let wc = g.weight(3, "c", ty, [k, 130, 1, 1]);
            let (a, b, c) = (
                g.mul_mat(wa, x, Precision::Paired),
                g.mul_mat(wb, x, Precision::Paired),
                g.mul_mat(wc, x, Precision::Paired),
            );
            let mut data = HashMap::from([(x, bytes_f32(&rng.vec(k * n)))]);
            for (w, rows) in [(wa, 300), (wb, 300), (wc, 130)] {
                data.insert(w, ternary_weight(ty, k, rows, false, &mut rng));
            }
            let outs = [a, b, c];
            let want = run(&mut CpuBackend::new(BackendId::CPU, 2), &g, &data, &outs);
            for staged in [&[wa, wb, wc][..], &[wb][..]] {
                let got = run_staged(&mut gpu, &g, &data, &outs, staged);
                for (o, (w, gt)) in want.iter().zip(&got).enumerate() {
                    let (w, gt) = (to_f32(w), to_f32(gt));
                    assert!(gt.iter().all(|v| v.is_finite()), "{ty} k={k} n={n}: output {o} not written");
                    assert_eq!(w, gt, "{ty} k={k} n={n} staged {}: output {o}", staged.len());
                }
            }
        }
    }
}

#[test]
fn fused_norm_batched_projections_and_residual_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(5);
    // 70 tokens take the prompt shape of the fused norm (256 threads a row).
    // `sub`: BitNet's ffn_sub_norm between the gated product and ffn_down
    // (a prompt's product is then formed inside that norm's quantization,
    // as it is for ffn_down's own quantization without it).
    // `act`: relu² (BitNet) and SiLU (llama), each with and without it.
    let variants =
        [(false, Activation::Relu2), (true, Activation::Relu2), (false, Activation::Silu), (true, Activation::Silu)];
    for (n, (sub, act)) in [1usize, 6, 37, 70].into_iter().flat_map(|n| variants.map(|v| (n, v))) {
        let (k, ff) = (768, 1280);
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [k, n, 1, 1]);
        let nw = g.weight(1, "norm", GgmlType::F32, [k, 1, 1, 1]);
        let wq = g.weight(2, "wq", GgmlType::TQ2_0, [k, k, 1, 1]);
        let wk = g.weight(3, "wk", GgmlType::IQ2_BN, [k, 128, 1, 1]);
        let wv = g.weight(4, "wv", GgmlType::I2_S, [k, 128, 1, 1]);
        let wg = g.weight(5, "wg", GgmlType::TQ2_0, [k, ff, 1, 1]);
        let wu = g.weight(6, "wu", GgmlType::TQ2_0, [k, ff, 1, 1]);
        let wd = g.weight(7, "wd", GgmlType::TQ1_0, [ff, k, 1, 1]);
        let h = g.rms_norm(x, 1e-5);
        let h = g.mul(h, nw);
        let q = g.mul_mat(wq, h, Precision::Paired);
        let kk = g.mul_mat(wk, h, Precision::Paired);
        let v = g.mul_mat(wv, h, Precision::Paired);
        let r = g.add(x, q);
        let gate = g.mul_mat(wg, h, Precision::Paired);
        let up = g.mul_mat(wu, h, Precision::Paired);
        let mut a = g.gated_act(gate, up, act);
        let sw = sub.then(|| g.weight(8, "ffn_sub_norm", GgmlType::F32, [ff, 1, 1, 1]));
        if let Some(sw) = sw {
            a = g.rms_norm(a, 1e-5);
            a = g.mul(a, sw);
        }
        let d = g.mul_mat(wd, a, Precision::Paired);
        let out = g.add(r, d);
        for o in [kk, v, out] {
            g.mark_output(o);
        }
        let mut data = HashMap::from([(x, bytes_f32(&rng.vec(k * n))), (nw, bytes_f32(&rng.vec(k)))]);
        if let Some(sw) = sw {
            data.insert(sw, bytes_f32(&rng.vec(ff)));
        }
        for (id, ty, kk_, rows) in [
            (wq, GgmlType::TQ2_0, k, k),
            (wk, GgmlType::IQ2_BN, k, 128),
            (wv, GgmlType::I2_S, k, 128),
            (wg, GgmlType::TQ2_0, k, ff),
            (wu, GgmlType::TQ2_0, k, ff),
            (wd, GgmlType::TQ1_0, ff, k),
        ] {
            data.insert(id, ternary_weight(ty, kk_, rows, false, &mut rng));
        }
        // The norm's sum of squares is accumulated in another order, which can
        // move an int8 activation by one at a rounding tie.
        let e = compare(&mut gpu, &g, &data, &[kk, v, out], 2e-3, &format!("block n={n} sub-norm {sub} {act:?}"));
        eprintln!("fused block n={n} sub-norm {sub} {act:?}: {e:.1e}");
    }
}

/// One token's norm + weight + int8 at the widths that take each path of
/// `norm_quant`: 256 threads in registers (k_pad ≤ 4096), 512 in registers
/// (the 2B-4T ffn_down's 6912), and staged in shared memory past 8192.
#[test]
fn one_token_norm_quant_at_every_width_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(17);
    for k in [768usize, 6912, 9216] {
        let rows = 72;
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [k, 1, 1, 1]);
        let nw = g.weight(1, "norm", GgmlType::F32, [k, 1, 1, 1]);
        let w = g.weight(2, "w", GgmlType::TQ2_0, [k, rows, 1, 1]);
        let h = g.rms_norm(x, 1e-5);
        let h = g.mul(h, nw);
        let y = g.mul_mat(w, h, Precision::Paired);
        g.mark_output(y);
        let data = HashMap::from([
            (x, bytes_f32(&rng.vec(k))),
            (nw, bytes_f32(&rng.vec(k))),
            (w, ternary_weight(GgmlType::TQ2_0, k, rows, false, &mut rng)),
        ]);
        // As in the fused block: the sum of squares in another order can move
        // one int8 activation by one at a rounding tie.
        let e = compare(&mut gpu, &g, &data, &[y], 2e-3, &format!("one-token norm k={k}"));
        eprintln!("one-token norm k={k}: {e:.1e}");
    }
}

/// One token's gate/up pair at row counts that leave a block's second row
/// pairs (or part of them) empty, and `k_pad` at and past the two-fetch limit
/// of the two-pairs-a-warp kernel: act(gate)·up equals the CPU's (1e-6).
/// Levels (Q4_K with offsets, Q8_0) take `q8p_gemv1x_pair`: the CPU's
/// integers, f32 sums in another order (1e-5).
#[test]
fn gated_pairs_of_odd_row_counts_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(29);
    for ty in [GgmlType::TQ2_0, GgmlType::Q4_K, GgmlType::Q8_0] {
        for (k, rows) in [(256usize, 40usize), (768, 37), (4096, 24), (4352, 19)] {
            let mut g = Graph::new();
            let x = g.weight(0, "x", GgmlType::F32, [k, 1, 1, 1]);
            let wg = g.weight(1, "wg", ty, [k, rows, 1, 1]);
            let wu = g.weight(2, "wu", ty, [k, rows, 1, 1]);
            let gate = g.mul_mat(wg, x, Precision::Paired);
            let up = g.mul_mat(wu, x, Precision::Paired);
            let act = if ty == GgmlType::TQ2_0 { Activation::Relu2 } else { Activation::Silu };
            let a = g.gated_act(gate, up, act);
            g.mark_output(a);
            let mut data = HashMap::from([(x, bytes_f32(&rng.vec(k)))]);
            for w in [wg, wu] {
                let bytes = match ty {
                    GgmlType::TQ2_0 => ternary_weight(ty, k, rows, false, &mut rng),
                    _ => float_weight(ty, k, rows, &mut rng),
                };
                data.insert(w, bytes);
            }
            let bound = if ty == GgmlType::TQ2_0 { 1e-6 } else { 1e-5 };
            let e = compare(&mut gpu, &g, &data, &[a], bound, &format!("gated pair {ty} k={k} rows={rows}"));
            eprintln!("gated pair {ty} k={k} rows={rows}: {e:.1e}");
        }
    }
}

#[test]
fn pointwise_norm_and_rope_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(9);
    let (hd, heads, n) = (64usize, 6usize, 7usize);
    for (mode, n_rot, factors) in [(RopeMode::Neox, 64, false), (RopeMode::Norm, 64, true), (RopeMode::Neox, 32, false)]
    {
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [hd * heads, n, 1, 1]);
        let b = g.weight(1, "b", GgmlType::F32, [hd * heads, 1, 1, 1]);
        let c = g.weight(2, "c", GgmlType::F32, [hd * heads, n, 1, 1]);
        let pos = g.input(InputKind::Positions, n);
        let f = factors.then(|| g.weight(3, "f", GgmlType::F32, [n_rot / 2, 1, 1, 1]));
        let hw = g.weight(4, "hw", GgmlType::F32, [hd, 1, 1, 1]);
        let p = RopeParams { mode, n_rot, head_dim: hd, freq_base: 10000.0, freq_scale: 0.5, yarn: None };
        let outs = [
            g.rms_norm(x, 1e-6),
            g.add(x, b),
            g.mul(x, c),
            g.scale(x, 0.37),
            g.gated_act(x, c, Activation::Silu),
            g.gated_act(x, c, Activation::Relu2),
            g.rope(x, pos, f, p),
            g.head_norm(x, hw, 1e-6),
        ];
        let mut data = HashMap::from([
            (x, bytes_f32(&rng.vec(hd * heads * n))),
            (b, bytes_f32(&rng.vec(hd * heads))),
            (c, bytes_f32(&rng.vec(hd * heads * n))),
            (pos, bytes_i32(&[0, 1, 2, 3, 1000, 2047, 5])),
            (hw, bytes_f32(&rng.vec(hd))),
        ]);
        if let Some(f) = f {
            data.insert(f, bytes_f32(&(0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.1).collect::<Vec<_>>()));
        }
        compare(&mut gpu, &g, &data, &outs, 1e-4, &format!("pointwise {mode:?} n_rot={n_rot}"));
    }
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()
}

#[test]
fn attention_matches_cpu_across_splits_and_cache_types() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(21);
    // (head_dim, n_head, n_head_kv, n_ctx, kv_pos, n_tok, llama-style rope)
    // Prompts of more than 8 tokens with f16 caches take the tensor-core kernel;
    // one token ropes q and k inside the attention. The llama-style cases rotate
    // adjacent pairs of half the dims with per-pair frequency factors.
    let cases = [
        (64, 8, 2, 512, 0, 5, false),
        (128, 20, 5, 4096, 300, 1, false),
        (128, 20, 5, 4096, 1000, 3, false),
        (32, 4, 4, 256, 17, 2, false),
        (64, 8, 2, 512, 0, 40, false),
        (128, 20, 5, 4096, 100, 77, false),
        // Several waves of tensor-core blocks, a partial last query tile, and
        // key tiles cut by the causal mask at every offset.
        (128, 20, 5, 4096, 37, 301, false),
        // Tensor-core blocks with their keys in one set of warps: a grid
        // past 2 SMs' worth of blocks (on up to 223 SMs), and a group of 8.
        (64, 64, 64, 512, 3, 100, false),
        (128, 64, 64, 512, 5, 90, false),
        (64, 16, 2, 512, 0, 40, false),
        (64, 8, 2, 512, 45, 1, true),
        (64, 8, 2, 512, 45, 3, true),
    ];
    for &(hd, nh, nkv, n_ctx, kv_pos, n, llama) in &cases {
        for cache_ty in [GgmlType::F32, GgmlType::F16] {
            let row = hd * nkv;
            let mut g = Graph::new();
            let q = g.weight(0, "q", GgmlType::F32, [hd * nh, n, 1, 1]);
            let k = g.weight(1, "k", GgmlType::F32, [row, n, 1, 1]);
            let v = g.weight(2, "v", GgmlType::F32, [row, n, 1, 1]);
            let kc = g.kv_cache(0, KvKind::K, cache_ty, [row, n_ctx, 1, 1]);
            let vc = g.kv_cache(0, KvKind::V, cache_ty, [row, n_ctx, 1, 1]);
            let pos = g.input(InputKind::Positions, n);
            let p = AttentionParams {
                layer: 0,
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                kv_pos,
            };
            // Rope on q and k, as models do: the GPU fuses it with the cache store.
            let (mode, n_rot) = if llama { (RopeMode::Norm, hd / 2) } else { (RopeMode::Neox, hd) };
            let r = RopeParams { mode, n_rot, head_dim: hd, freq_base: 500000.0, freq_scale: 1.0, yarn: None };
            let factors = llama.then(|| g.weight(3, "rope_freqs", GgmlType::F32, [n_rot / 2, 1, 1, 1]));
            let (qr, kr) = (g.rope(q, pos, factors, r), g.rope(k, pos, factors, r));
            let a = g.attention(qr, kr, v, kc, vc, pos, p);
            let cache = |rng: &mut Rng| {
                let vals = rng.vec(row * n_ctx);
                if cache_ty == GgmlType::F16 {
                    f16_bytes(&vals)
                } else {
                    bytes_f32(&vals)
                }
            };
            let positions: Vec<i32> = (kv_pos..kv_pos + n).map(|p| p as i32).collect();
            let mut data = HashMap::from([
                (q, bytes_f32(&rng.vec(hd * nh * n))),
                (k, bytes_f32(&rng.vec(row * n))),
                (v, bytes_f32(&rng.vec(row * n))),
                (kc, cache(&mut rng)),
                (vc, cache(&mut rng)),
                (pos, bytes_i32(&positions)),
            ]);
            if let Some(f) = factors {
                data.insert(f, bytes_f32(&rng.vec(n_rot / 2).iter().map(|v| 1.5 + 0.5 * v).collect::<Vec<_>>()));
            }
            // The caches are compared too: their new rows are written here.
            // The tensor-core kernel rounds q and the softmax weights to f16.
            let bound = match (cache_ty, n > 8) {
                (GgmlType::F16, true) => 5e-3,
                (GgmlType::F16, false) => 2e-3,
                _ => 1e-4,
            };
            let e = compare(
                &mut gpu,
                &g,
                &data,
                &[a, kc, vc],
                bound,
                &format!("attention {hd}/{nh}/{nkv} pos {kv_pos} n {n} {cache_ty} llama rope {llama}"),
            );
            eprintln!(
                "attention hd={hd} heads={nh}/{nkv} kv_pos={kv_pos} n={n} {cache_ty} llama rope {llama}: {e:.1e}"
            );
        }
    }
}

/// A backend decoding through `decode_run` or not (`fuse`), with its
/// weight ring capped at `ring_max` bytes (0: none). `None` without a GPU,
/// or when fusing is asked of one before sm_90, which has no fused kernel
/// (said so).
fn gpu_with(fuse: bool, ring_max: usize) -> Option<CudaBackend> {
    let arch = tern_cuda::devices().ok()?.first()?.arch;
    if fuse && arch.0 < 9 {
        eprintln!("skipped: decode_run needs sm_90, device is sm_{}{}", arch.0, arch.1);
        return None;
    }
    gpu_with_options(&CudaOptions { fused_decode: fuse, ring_max, ..options() })
}

/// A graph with random leaf data, built a weight at a time.
struct Built {
    g: Graph,
    data: HashMap<NodeId, Vec<u8>>,
    rng: Rng,
    ids: usize,
}

impl Built {
    fn weight(&mut self, ty: GgmlType, ne: [usize; 4], bytes: Vec<u8>) -> NodeId {
        self.ids += 1;
        let w = self.g.weight(self.ids, "w", ty, ne);
        self.data.insert(w, bytes);
        w
    }

    /// RMS norm of x (n wide) times a random weight near 1.
    fn norm(&mut self, x: NodeId, n: usize) -> NodeId {
        let v: Vec<f32> = self.rng.vec(n).iter().map(|v| 1.0 + 0.5 * v).collect();
        let w = self.weight(GgmlType::F32, [n, 1, 1, 1], bytes_f32(&v));
        let h = self.g.rms_norm(x, 1e-5);
        self.g.mul(h, w)
    }

    /// A random ternary [k, rows] matrix of `ty` times h.
    fn mat(&mut self, ty: GgmlType, k: usize, rows: usize, h: NodeId) -> NodeId {
        let bytes = ternary_weight(ty, k, rows, false, &mut self.rng);
        let w = self.weight(ty, [k, rows, 1, 1], bytes);
        self.g.mul_mat(w, h, Precision::Paired)
    }
}

/// Two BitNet layers for one token, on random weights, inputs and caches,
/// through the persistent decoding kernel (`att_head`: f16 caches, rope in
/// the kernel; gpu_golden's f32 caches take the (KV head, split) units), with
/// its weight ring whole and capped at 2 KiB, against the
/// CPU: the residual stream, the new cache rows, and fewer launches than
/// without fusing (so the fused kernel did run). Its norms quantize from
/// the writers' statistics in another order, which can move an int8
/// activation by one at a rounding tie, and attention merges in another
/// order: bound 5e-3 of the largest output. Heads of 64 dims (two V dims a
/// lane in `att_head`) at four cache positions, and of 128 (the 2B-4T's:
/// four a lane, a group of four q heads) at three. Past 448 keys
/// `att_head` cuts the cache into chunks that the last of a KV group's
/// blocks merges (at 600, 700, 500 and 600 keys: groups of 4, 4, 2 and 8);
/// from 2,048 keys a block takes a KV head's whole group of q heads
/// (decode_attention_kv.cu), in 33 or 66 chunks on a 132-SM GPU, so that the merge loads
/// them in several rounds (at 2,100 keys: groups of 4, 2 and 8).
#[test]
fn fused_decoding_layers_match_cpu() {
    let Some(mut plain) = gpu_with(false, 0) else { return };
    let (k, ff) = (512usize, 768usize);
    let cases = [
        (64usize, 8usize, 2usize, 0usize, 256usize),
        (64, 8, 2, 45, 256),
        (64, 8, 2, 200, 256),
        (64, 8, 2, 600, 1024),
        (128, 4, 1, 3, 256),
        (128, 4, 1, 130, 256),
        (128, 4, 1, 700, 1024),
        (128, 4, 2, 500, 512),
        (64, 8, 1, 600, 1024),
        (128, 4, 1, 2100, 4096),
        (128, 4, 2, 2100, 4096),
        (64, 8, 1, 2100, 4096),
    ];
    for (hd, nh, nkv, kv_pos, n_ctx) in cases {
        let row = hd * nkv;
        let mut b = Built { g: Graph::new(), data: HashMap::new(), rng: Rng::new(31 + (kv_pos + hd) as u64), ids: 0 };
        let x0 = b.rng.vec(k);
        let mut x = b.weight(GgmlType::F32, [k, 1, 1, 1], bytes_f32(&x0));
        let pos = b.g.input(InputKind::Positions, 1);
        b.data.insert(pos, bytes_i32(&[kv_pos as i32]));
        let rope = RopeParams {
            mode: RopeMode::Neox,
            n_rot: hd,
            head_dim: hd,
            freq_base: 500000.0,
            freq_scale: 1.0,
            yarn: None,
        };
        let mut outs = Vec::new();
        for layer in 0..2 {
            let h = b.norm(x, k);
            let q = b.mat(GgmlType::IQ2_BN, k, hd * nh, h);
            let kk = b.mat(GgmlType::I2_S, k, row, h);
            let v = b.mat(GgmlType::IQ2_BN, k, row, h);
            let kc = b.g.kv_cache(layer, KvKind::K, GgmlType::F16, [row, n_ctx, 1, 1]);
            let vc = b.g.kv_cache(layer, KvKind::V, GgmlType::F16, [row, n_ctx, 1, 1]);
            let (kv, vv) = (f16_bytes(&b.rng.vec(row * n_ctx)), f16_bytes(&b.rng.vec(row * n_ctx)));
            b.data.insert(kc, kv);
            b.data.insert(vc, vv);
            let (qr, kr) = (b.g.rope(q, pos, None, rope), b.g.rope(kk, pos, None, rope));
            let p = AttentionParams {
                layer,
                n_head: nh,
                n_head_kv: nkv,
                head_dim: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                kv_pos,
            };
            let a = b.g.attention(qr, kr, v, kc, vc, pos, p);
            let s = b.norm(a, k);
            let o = b.mat(GgmlType::IQ2_BN, k, k, s);
            let x2 = b.g.add(x, o);
            let h2 = b.norm(x2, k);
            let gate = b.mat(GgmlType::IQ2_BN, k, ff, h2);
            let up = b.mat(GgmlType::I2_S, k, ff, h2);
            let act = b.g.gated_act(gate, up, Activation::Relu2);
            let s2 = b.norm(act, ff);
            let d = b.mat(GgmlType::IQ2_BN, ff, k, s2);
            x = b.g.add(x2, d);
            outs.extend([kc, vc]);
        }
        outs.push(x);
        for &o in &outs {
            b.g.mark_output(o);
        }
        run(&mut plain, &b.g, &b.data, &outs);
        let unfused = plain.stats.last_launches;
        // The last: a 2 KiB weight ring (each block's segments here are 0.5–1.5
        // KiB), so the ring wraps and waits for space many times a launch.
        for ring_max in [0, 2 << 10] {
            let Some(mut fused) = gpu_with(true, ring_max) else { return };
            let what = format!("fused decoding head_dim {hd} kv_pos {kv_pos} ring_max {ring_max}");
            let e = compare(&mut fused, &b.g, &b.data, &outs, 5e-3, &what);
            let launches = fused.stats.last_launches;
            eprintln!("{what}: {e:.1e}, {launches} launches against {unfused}");
            assert!(
                launches < unfused,
                "{what}: {launches} launches, {unfused} without fusing: decode_run did not run"
            );
        }
    }
}

/// Kernel times at the 2B-4T shapes, against the bytes each one must read.
#[test]
fn timing_table_for_2b4t_shapes() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(1);
    let mut lines = vec![
        format!("{} ({} SMs)", gpu.info().name, gpu.info().sm_count),
        "| kernel | shape k×rows | tokens | µs | GB/s |".into(),
        "|---|---|---|---|---|".into(),
    ];
    let shapes = [
        ("attn_q/o", 2560usize, 2560usize),
        ("attn_k/v", 2560, 640),
        ("ffn_gate/up", 2560, 6912),
        ("ffn_down", 6912, 2560),
    ];
    for &(name, k, rows) in &shapes {
        for n in [1usize, 512] {
            let mut g = Graph::new();
            let w = g.weight(0, "w", GgmlType::TQ2_0, [k, rows, 1, 1]);
            let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
            g.mul_mat(w, x, Precision::Paired);
            let data = HashMap::from([
                (w, ternary_weight(GgmlType::TQ2_0, k, rows, false, &mut rng)),
                (x, bytes_f32(&rng.vec(k * n))),
            ]);
            let ms = time(&mut gpu, &g, &data);
            let bytes = (k * rows / 4 + k * n + rows * n * 4) as f64;
            // The prompt GEMM is wgmma on sm_90 unless TERN_CUDA_WGMMA=0.
            let what = if n == 1 { "W2A8 GEMV (+quantize)" } else { "int8 tensor-core GEMM (+quantize)" };
            let tops = 2.0 * (k * rows * n) as f64 / (ms * 1e-3) / 1e12;
            lines.push(format!(
                "| {what} {name} | {k}×{rows} | {n} | {:.1} | {:.0} ({tops:.1} TOPS) |",
                ms * 1e3,
                bytes / (ms * 1e-3) / 1e9
            ));
        }
    }
    // A quantized model's head pairs int8 activations (Q6_K); a float
    // model's keeps f32.
    let heads = [
        (GgmlType::Q6_K, Precision::Paired),
        (GgmlType::Q6_K, Precision::Float),
        (GgmlType::Q8_0, Precision::Float),
        (GgmlType::F16, Precision::Float),
    ];
    for (ty, precision) in heads {
        let (k, rows, n) = (2560, 128256, 1);
        let mut g = Graph::new();
        let w = g.weight(0, "w", ty, [k, rows, 1, 1]);
        let x = g.weight(1, "x", GgmlType::F32, [k, n, 1, 1]);
        g.mul_mat(w, x, precision);
        let data = HashMap::from([(w, timing_bytes(ty, k, rows, &mut rng)), (x, bytes_f32(&rng.vec(k * n)))]);
        let ms = time(&mut gpu, &g, &data);
        let bytes = ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as f64;
        lines.push(format!(
            "| head {ty} GEMV ({precision:?}) | {k}×{rows} | {n} | {:.1} | {:.0} |",
            ms * 1e3,
            bytes / (ms * 1e-3) / 1e9
        ));
    }
    eprintln!("{}", lines.join("\n"));
}

/// Valid but unquantized head bytes (quantizing 328 M values takes too long
/// for a timing run): random levels with a small finite f16 scale per block.
fn timing_bytes(ty: GgmlType, k: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let n = ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize;
    let mut out: Vec<u8> = (0..n / 8).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
    out.resize(n, 0);
    let small = half::f16::from_f32(1e-3).to_le_bytes();
    match ty {
        GgmlType::Q6_K => out.chunks_exact_mut(210).for_each(|b| b[208..].copy_from_slice(&small)),
        _ => out.chunks_exact_mut(2).for_each(|h| h.copy_from_slice(&small)),
    }
    out
}

fn time(gpu: &mut CudaBackend, g: &Graph, data: &HashMap<NodeId, Vec<u8>>) -> f64 {
    let mut locs: Vec<Option<TensorLoc>> = vec![None; g.nodes.len()];
    let mut computed = Vec::new();
    for id in g.ids() {
        let n = g.node(id);
        locs[id.index()] = Some(match n.op {
            Op::Weight(_) => {
                let d = data[&id].clone();
                let len = d.len();
                let DType::Ggml(ty) = n.dtype else { unreachable!() };
                gpu.load_weight(HostBytes::new(Arc::new(Owned(d)), 0..len), WeightDesc { ty, ne: n.ne }).unwrap().loc
            }
            _ => {
                computed.push(id);
                let buffer = gpu.alloc(n.nbytes()).unwrap();
                TensorLoc { buffer, offset: 0, nbytes: n.nbytes() }
            }
        });
    }
    gpu.time_compute(g, &computed, &locs, 50).unwrap()
}
