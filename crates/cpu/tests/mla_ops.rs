//! The multi-head latent attention ops of the CPU backend (`Op::Columns`,
//! `Op::MulMatHeads`, `Op::LatentAttention`), each driven through the public
//! backend (a graph, weights loaded with `load_weight`, `compute`, results
//! read back) on 1 and 3 threads and every ISA level the machine has.
//!
//! * `Columns`: bit for bit (a copy).
//! * `MulMatHeads`, normal (`y_h = W_h·x_h`), with a 3-D weight
//!   `[k, rows, n_head]` (all its rows, or a block of them) and with the
//!   legacy `attn_kv_b` layout (a 2-D weight of `n_head·(nope + v)` rows, the
//!   v part at offset `nope`), for 1, 3 and 6 tokens (6: the GEMM path):
//!   `Precision::Float` against float64 from the
//!   dequantized rows, `Precision::Paired` against `tern_quant::vec_dot` on
//!   the head's slice quantized to the paired type. Bound: `common::dot_tol`
//!   (the block kernels' bound, derived there: `(k/32 + 17)·u·S` with f32
//!   activations, `(3N + 10)·u·S` for the K-quants, `2(N + 3)·u·S` for the
//!   32-element formats, `N` the row's blocks; `S = Σ|w·a|`, `u = 2⁻²⁴`). Transposed
//!   (`y_h = W_hᵀ·x_h`, the legacy layout's k part at offset 0, and a 3-D
//!   weight): float64 from the dequantized rows, `|Δ| ≤ (len + 1)·u·S` per
//!   output (an f32 sum of `len` products in any order), under 1e-5·S for
//!   every `len` here. Weights F32, F16, Q8_0, Q4_0, Q4_K, Q6_K, and the
//!   ternary TQ1_0/TQ2_0 (repacked at load; float activations) in the
//!   2-D layout.
//! * `LatentAttention` against a naive float64 attention: scores
//!   `scale·(q_lat·c + q_pe·k_pe)` over cache rows `0..=kv_pos + i`, softmax,
//!   output `Σ softmax·c`. The cache holds what the op stored, so the
//!   reference reads the cache bytes back after each step and dequantizes
//!   them; the stored rows are checked too (F32 bytes, F16 rounding, Q8_0 as
//!   `quantize_row`), and no other row may change. Steps: 1 token at 0, 4 at
//!   1, 66 at 5 (a prompt over two 64-position blocks), 1 at 71 (a decode
//!   past the first block), 3 at 72; caches F32, F16, Q8_0; 1, 4 and 16
//!   heads; rank + rope 64 + 16, 32 + 8, 64 + 32, 512 + 64 (Q8_0 rows must
//!   be whole blocks of 32). As the reference uses the stored values, what
//!   remains is the f32 scoring, softmax and accumulation; the bound is
//!   their first-order error, per output (`attend64`): the scores' f32 dot
//!   error `δ_p ≤ (width/8 + 10)·u·scale·Σ|q·k_p|` and the exponentials'
//!   and sums' roundings, weighted by `Σ_p w_p·|c_p|`. A flat
//!   `1e-5·max|o|` is not a bound: the scores' error grows with
//!   `|scale·q·k|` (on these data 5.3e-6·max|o| is reached, at 5% of the
//!   bound).

mod common;

use common::{dot_tol, setups, twin_dot, weight_rows, Data, Dev, Rng, Step, U};
use tern_graph::{GgmlType, HeadMatMul, LatentAttentionParams, Precision};
use tern_quant::TensorScale;

#[test]
fn columns_are_copied() {
    let mut rng = Rng::new(0x3A1A_0001);
    // (width, start, len, pieces, tokens)
    for (width, start, len, g, n) in [(80usize, 64usize, 16usize, 4usize, 3usize), (48, 0, 32, 1, 5), (16, 3, 5, 16, 1)]
    {
        let x = rng.scaled(width * g * n, 1.0);
        let want: Vec<f32> = x.chunks_exact(width).flat_map(|p| p[start..start + len].to_vec()).collect();
        for (threads, isa) in setups() {
            let mut dev = Dev::new(threads, isa);
            let mut st = Step::new();
            let xn = st.f32(&mut dev, [width * g, n, 1, 1], &x);
            let y = st.g.columns(xn, width, start, len);
            st.run(&mut dev);
            let got = st.read_f32(&dev, y);
            assert!(got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()), "{width} {start} {len}");
            assert_eq!(got.len(), want.len());
        }
    }
}

// --------------------------------------------------------- mul_mat_heads --

/// Dequantized rows of a weight, from its file bytes.
fn dequantized(ty: GgmlType, bytes: &[u8], k: usize) -> Vec<Vec<f32>> {
    let rb = tern_quant::row_bytes(ty, k);
    bytes
        .chunks_exact(rb)
        .map(|r| {
            let mut out = vec![0f32; k];
            tern_quant::dequantize_row(ty, r, TensorScale::ONE, &mut out);
            out
        })
        .collect()
}

/// Runs MulMatHeads on a weight of `ty` and shape `ne` (rows of `kd`) and
/// checks it against the twin; returns the largest `|Δ|/S`.
fn check_heads(
    rng: &mut Rng,
    ty: GgmlType,
    ne: [usize; 4],
    mm: HeadMatMul,
    precisions: &[Precision],
    what: &str,
) -> f64 {
    let kd = ne[0];
    let w = weight_rows(rng, ty, kd, ne[1] * ne[2]);
    let rows = dequantized(ty, &w, kd);
    let rb = tern_quant::row_bytes(ty, kd);
    let h = mm.n_head;
    let (k_in, k_out) = if mm.transposed { (mm.len, kd) } else { (kd, mm.len) };
    let mut worst = 0f64;
    for n in [1usize, 3, 6] {
        let x = rng.scaled(k_in * h * n, 0.7);
        for &precision in precisions {
            // (want, S, tolerance factor) per output.
            let mut want = vec![(0f64, 0f64, 0f64); k_out * h * n];
            for t in 0..n {
                for hd in 0..h {
                    let xh = &x[(t * h + hd) * k_in..][..k_in];
                    let first = hd * mm.stride + mm.offset;
                    let out = &mut want[(t * h + hd) * k_out..][..k_out];
                    if mm.transposed {
                        for (c, o) in out.iter_mut().enumerate() {
                            let terms = (0..mm.len).map(|i| rows[first + i][c] as f64 * xh[i] as f64);
                            let (v, s) = terms.fold((0.0, 0.0), |(v, s), p| (v + p, s + p.abs()));
                            *o = (v, s, (mm.len + 1) as f64 * U);
                        }
                    } else {
                        for (i, o) in out.iter_mut().enumerate() {
                            let row = &w[(first + i) * rb..][..rb];
                            let (v, s) = match precision {
                                // float64 from the dequantized row.
                                Precision::Float => rows[first + i]
                                    .iter()
                                    .zip(xh)
                                    .map(|(&a, &b)| a as f64 * b as f64)
                                    .fold((0.0, 0.0), |(v, s), p| (v + p, s + p.abs())),
                                Precision::Paired => {
                                    let (v, s) = twin_dot(ty, precision, row, xh);
                                    (v as f64, s)
                                }
                            };
                            *o = (v, s, dot_tol(ty, kd, precision));
                        }
                    }
                }
            }
            for (threads, isa) in setups() {
                let mut dev = Dev::new(threads, isa);
                let mut st = Step::new();
                let wn = st.weight(&mut dev, ty, ne, w.clone());
                let xn = st.f32(&mut dev, [k_in * h, n, 1, 1], &x);
                let y = st.g.mul_mat_heads(wn, xn, mm, precision);
                st.run(&mut dev);
                let got = st.read_f32(&dev, y);
                assert_eq!(got.len(), want.len());
                for (i, (&g, &(v, s, tol))) in got.iter().zip(&want).enumerate() {
                    let err = (g as f64 - v).abs();
                    let (c, hd, t) = (i % k_out, i / k_out % h, i / (k_out * h));
                    assert!(
                        err <= tol * s,
                        "{what} {ty} {mm:?} {precision:?} n={n} {threads} threads {isa:?}: token {t} head {hd} \
                         element {c}: {g} against {v}, S={s}, bound {tol:.2e}·S"
                    );
                    if s > 0.0 {
                        worst = worst.max(err / s);
                    }
                }
            }
        }
    }
    worst
}

const TYPES: [GgmlType; 6] =
    [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K, GgmlType::Q6_K];

/// A row length that is whole blocks of `ty` (and of its paired activations).
fn kdim(ty: GgmlType) -> usize {
    if ty.block_elems() >= 256 {
        256
    } else {
        64
    }
}

#[test]
fn mul_mat_heads_3d_weight() {
    let mut rng = Rng::new(0x3A1A_0002);
    let both = [Precision::Paired, Precision::Float];
    for ty in TYPES {
        let kd = kdim(ty);
        let rows = 24;
        let mut worst = [0f64; 3];
        for h in [1usize, 4, 16] {
            let ne = [kd, rows, h, 1];
            // Every row of each head (`attn_k_b`, `attn_v_b`), then a block of them.
            let all = HeadMatMul { n_head: h, stride: rows, offset: 0, len: rows, transposed: false };
            worst[0] = worst[0].max(check_heads(&mut rng, ty, ne, all, &both, "3-D"));
            let part = HeadMatMul { offset: 2, len: rows - 3, ..all };
            worst[1] = worst[1].max(check_heads(&mut rng, ty, ne, part, &both, "3-D block"));
            let tr = HeadMatMul { offset: 1, len: rows - 1, transposed: true, ..all };
            worst[2] = worst[2].max(check_heads(&mut rng, ty, ne, tr, &both, "3-D transposed"));
        }
        println!(
            "mul_mat_heads 3-D {ty}: max |Δ|/S {:.2e} (all rows), {:.2e} (a block), {:.2e} (transposed)",
            worst[0], worst[1], worst[2]
        );
    }
}

#[test]
fn mul_mat_heads_legacy_kv_b() {
    let mut rng = Rng::new(0x3A1A_0003);
    let both = [Precision::Paired, Precision::Float];
    let ternary = [GgmlType::TQ1_0, GgmlType::TQ2_0];
    for ty in TYPES.into_iter().chain(ternary) {
        // The latent rank is the row length; per head, nope k rows then v rows.
        let (kvl, nope, dv) = (kdim(ty), 16, 24);
        // Ternary matrices are repacked and multiplied in float.
        let precisions: &[Precision] = if ternary.contains(&ty) { &[Precision::Float] } else { &both };
        let mut worst = [0f64; 2];
        for h in [1usize, 4, 16] {
            let ne = [kvl, h * (nope + dv), 1, 1];
            let k_part = HeadMatMul { n_head: h, stride: nope + dv, offset: 0, len: nope, transposed: true };
            worst[0] = worst[0].max(check_heads(&mut rng, ty, ne, k_part, &both, "kv_b k"));
            let v_part = HeadMatMul { n_head: h, stride: nope + dv, offset: nope, len: dv, transposed: false };
            worst[1] = worst[1].max(check_heads(&mut rng, ty, ne, v_part, precisions, "kv_b v"));
        }
        println!("mul_mat_heads kv_b {ty}: max |Δ|/S {:.2e} (k, transposed), {:.2e} (v)", worst[0], worst[1]);
    }
}

// ------------------------------------------------------ latent attention --

/// `(n_tokens, kv_pos)` of the steps run one after the other on one cache.
const STEPS: [(usize, usize); 5] = [(1, 0), (4, 1), (66, 5), (1, 71), (3, 72)];
const N_CTX: usize = 80;

/// A cache row as the op stores it.
fn encode(ty: GgmlType, row: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; tern_quant::row_bytes(ty, row.len())];
    match ty {
        GgmlType::F32 => out.copy_from_slice(&common::f32_bytes(row)),
        GgmlType::F16 => {
            for (o, &v) in out.chunks_exact_mut(2).zip(row) {
                o.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
            }
        }
        _ => tern_quant::quantize_row(ty, row, &mut out),
    }
    out
}

/// Naive attention of one query over the `visible` cache rows (widened
/// stored values) in float64: each output `o_i = Σ_p w_p·c_{p,i}` with the
/// bound its f32 evaluation keeps to (first order, `u = 2⁻²⁴`):
/// * a score `s_p = scale·(q·k_p)` (an f32 dot in 8 lanes, then the scale)
///   is off by at most `δ_p = (width/8 + 10)·u·scale·Σ_j|q_j·k_{p,j}|`;
/// * `exp(s_p − m)` adds `u·|s_p − m|` (the rounded difference) and 5u
///   (the `vec` kernels' polynomial exp, under 3e-7 relative; the rescale
///   by `exp` when a later block raises the running max, 2u more);
/// * a weight below e⁻⁸⁰ may be lost (f32's subnormals), or come out as
///   up to e⁻⁸⁷ (the `vec` kernels' exp floors its argument at −87, and the
///   normaliser is at least 1): absolute `1.01·e⁻⁸⁷·|c_{p,i}|`; any other is off
///   by `δ_p + 2u·|s_p − m| + 7u` relative, the normaliser by the
///   `w`-weighted mean of those plus `(n + 2)·u` (a sum of `n` positive
///   terms), the accumulation `Σ w_p·c_p` by `(n + 1)·u·A_i`
///   (`A_i = Σ_p w_p·|c_{p,i}|`), the final product by 2u; a decoding
///   step split into parts along the cache (one token on 3 threads) merges
///   the parts' states by `e^(max_p − M)` (3u) in sums of at most 3 terms:
///   6u more on the accumulation and on the normaliser (1% on top for the
///   second-order terms).
fn attend64(q: &[f64], visible: &[Vec<f64>], rank: usize, scale: f64) -> Vec<(f64, f64)> {
    let n = visible.len();
    let width = q.len();
    let (scores, deltas): (Vec<f64>, Vec<f64>) = visible
        .iter()
        .map(|k| {
            let (dot, abs) = q.iter().zip(k).fold((0.0, 0.0), |(d, a), (x, y)| (d + x * y, a + (x * y).abs()));
            (scale * dot, (width / 8 + 10) as f64 * U * scale * abs)
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    let w: Vec<f64> = e.iter().map(|e| e / sum).collect();
    // Relative error of each weight's numerator, and of the normaliser.
    let eps: Vec<f64> = (0..n)
        .map(|p| if scores[p] - max < -80.0 { 1.0 } else { deltas[p] + 2.0 * U * (scores[p] - max).abs() + 7.0 * U })
        .collect();
    let eps_norm = w.iter().zip(&eps).map(|(w, e)| w * e).sum::<f64>() + (n + 8) as f64 * U;
    (0..rank)
        .map(|i| {
            let (mut o, mut a, mut b) = (0.0, 0.0, 0.0);
            for p in 0..n {
                let c = visible[p][i];
                o += w[p] * c;
                a += w[p] * c.abs();
                b += w[p] * c.abs() * eps[p];
                if scores[p] - max < -80.0 {
                    b += 1.01 * (-87f64).exp() * c.abs();
                }
            }
            (o, 1.01 * (b + a * (eps_norm + (n + 9) as f64 * U)))
        })
        .collect()
}

/// Runs the steps on a cache of `ty` and checks every output; returns the
/// largest `|Δ| / bound` and `|Δ| / max|o|`.
fn check_latent(ty: GgmlType, rank: usize, rope: usize, h: usize, threads: usize, isa: tern_cpu::isa::Isa) -> [f64; 2] {
    let mut rng = Rng::new(0x3A1A_1000 + (rank * 131 + rope * 7 + h) as u64);
    let width = rank + rope;
    let rb = tern_quant::row_bytes(ty, width);
    let scale = 2.5 / (width as f32).sqrt();
    let mut dev = Dev::new(threads, isa);
    let cache_loc = dev.alloc(rb * N_CTX);
    let mut before = dev.read(cache_loc);
    let mut worst = [0f64; 2];
    for (step, &(n, kv_pos)) in STEPS.iter().enumerate() {
        let (q_lat, q_pe) = (rng.scaled(rank * h * n, 1.0), rng.scaled(rope * h * n, 1.0));
        let (c, k_pe) = (rng.scaled(rank * n, 1.0), rng.scaled(rope * n, 1.0));
        let positions: Vec<i32> = (kv_pos..kv_pos + n).map(|p| p as i32).collect();
        let mut st = Step::new();
        let ql = st.f32(&mut dev, [rank * h, n, 1, 1], &q_lat);
        let qp = st.f32(&mut dev, [rope * h, n, 1, 1], &q_pe);
        let cn = st.f32(&mut dev, [rank, n, 1, 1], &c);
        let kp = st.f32(&mut dev, [rope, n, 1, 1], &k_pe);
        let cache = st.cache(ty, [width, N_CTX, 1, 1], cache_loc);
        let pos = st.i32(&mut dev, [n, 1, 1, 1], &positions);
        let p = LatentAttentionParams { layer: 0, n_head: h, rank, rope, scale, kv_pos };
        let y = st.g.latent_attention(ql, qp, cn, kp, cache, pos, p);
        st.run(&mut dev);
        let got = st.read_f32(&dev, y);
        let ctx =
            format!("{ty} rank {rank} rope {rope} heads {h} {threads} threads {isa:?} step {step} ({n} at {kv_pos})");

        // The cache: this step's rows as stored, every other row untouched.
        let after = dev.read(cache_loc);
        for (r, (a, b)) in after.chunks_exact(rb).zip(before.chunks_exact(rb)).enumerate() {
            if (kv_pos..kv_pos + n).contains(&r) {
                let t = r - kv_pos;
                let row = [&c[t * rank..(t + 1) * rank], &k_pe[t * rope..(t + 1) * rope]].concat();
                assert_eq!(a, encode(ty, &row), "{ctx}: stored row {r}");
            } else {
                assert_eq!(a, b, "{ctx}: row {r} changed");
            }
        }
        let cached: Vec<Vec<f64>> = after
            .chunks_exact(rb)
            .take(kv_pos + n)
            .map(|r| {
                let mut v = vec![0f32; width];
                tern_quant::dequantize_row(ty, r, TensorScale::ONE, &mut v);
                v.into_iter().map(f64::from).collect()
            })
            .collect();
        before = after;

        for t in 0..n {
            for hd in 0..h {
                let q: Vec<f64> = [&q_lat[(t * h + hd) * rank..][..rank], &q_pe[(t * h + hd) * rope..][..rope]]
                    .concat()
                    .into_iter()
                    .map(f64::from)
                    .collect();
                let visible = &cached[..kv_pos + t + 1];
                let want = attend64(&q, visible, rank, scale as f64);
                let big = want.iter().fold(0f64, |m, &(o, _)| m.max(o.abs()));
                let g = &got[(t * h + hd) * rank..][..rank];
                for (i, (&g, &(o, bound))) in g.iter().zip(&want).enumerate() {
                    let err = (g as f64 - o).abs();
                    assert!(err <= bound, "{ctx}: token {t} head {hd} element {i}: {g} against {o}, bound {bound:e}");
                    // (The statistic leaves out outputs made of underflowed terms.)
                    if bound > 1e-20 * big {
                        worst[0] = worst[0].max(err / bound);
                    }
                    worst[1] = worst[1].max(err / big);
                }
            }
        }
    }
    worst
}

#[test]
fn latent_attention_matches_float64() {
    let dims: [(GgmlType, &[(usize, usize)]); 3] = [
        (GgmlType::F32, &[(64, 16), (32, 8), (512, 64)]),
        (GgmlType::F16, &[(64, 16), (32, 8)]),
        (GgmlType::Q8_0, &[(64, 32), (512, 64)]),
    ];
    for (ty, dims) in dims {
        let mut worst = [0f64; 2];
        for &(rank, rope) in dims {
            for h in [1usize, 4, 16] {
                for (threads, isa) in setups() {
                    let w = check_latent(ty, rank, rope, h, threads, isa);
                    worst = [worst[0].max(w[0]), worst[1].max(w[1])];
                }
            }
        }
        println!("latent_attention {ty} cache: max |Δ|/bound {:.2e}, max |Δ|/max|o| {:.2e}", worst[0], worst[1]);
    }
}
