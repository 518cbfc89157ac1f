//! Multi-head latent attention's ops on the GPU against the CPU backend, on
//! random data with poisoned outputs (`common::run`): `Columns`, the YaRN
//! rope, `MulMatHeads` and `LatentAttention`, alone and as DeepSeek's MLA
//! chains them (`crates/models/src/mla.rs`).
//!
//! Needs a CUDA device: skipped with the reason when there is none, unless
//! `TERN_REQUIRE_GPU=1`. Bounds, as max |gpu − cpu| / max |cpu|:
//! - `Columns`: 0 (a copy).
//! - YaRN rope: 1e-5. Both sides compute the frequency, angle and rotation
//!   in f64 and round once to f32, so they differ only where the two f64
//!   libraries' pow/sin/cos differ in the last bits and move an f32 rounding:
//!   an ulp of one element (6e-8 of it). The general 1e-4 bound of the other
//!   pointwise ops is for f32 arithmetic, which this does not do.
//! - `MulMatHeads`: 1e-4 with `Precision::Float` (f32 summation order);
//!   with `Precision::Paired` (block types, rows-side products) both sides
//!   quantize each head's slice to the type's int8 blocks bit for bit and
//!   form the same integers: 1e-5. Transposed products (a legacy
//!   `attn_kv_b`'s k rows) are f32 on both sides, with the CPU's rounded
//!   products and sums in its order: 0, bit for bit.
//! - `LatentAttention`: 1e-4 with an F32 cache (CUDA cores, f32); 5e-3
//!   with F16, which runs on tensor cores with q and P rounded to f16 (the
//!   other prompt attention's bound). The caches are compared too,
//!   exactly: their new rows are written by the op.
//! - The chained block: 1e-4 (F32 cache), 5e-3 (F16, on tensor cores).

use std::collections::HashMap;

use tern_graph::{
    Graph, HeadMatMul, InputKind, KvKind, LatentAttentionParams, NodeId, Precision, RopeMode, RopeParams, Yarn,
};
use tern_quant::GgmlType;

mod common;
use common::*;

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::f16::from_f32(x).to_le_bytes()).collect()
}

fn cache_bytes(ty: GgmlType, v: &[f32]) -> Vec<u8> {
    if ty == GgmlType::F16 {
        f16_bytes(v)
    } else {
        bytes_f32(v)
    }
}

/// DeepSeek-V2-Lite's YaRN: a 40× longer context than the 4096 positions it
/// was trained on.
fn yarn(magnitude: f32) -> Yarn {
    Yarn { n_ctx_orig: 4096, beta_fast: 32.0, beta_slow: 1.0, ext_factor: 1.0, magnitude }
}

#[test]
fn columns_copy_every_piece_exactly() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(61);
    // (width, start, len, pieces a row, tokens): q's nope and rope slices of
    // 16 heads, kv's latent and rope parts, an odd width.
    for (width, start, len, pieces, n) in
        [(192, 0, 128, 16, 7), (192, 128, 64, 16, 1), (576, 0, 512, 1, 70), (576, 512, 64, 1, 3), (7, 2, 3, 5, 2)]
    {
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [width * pieces, n, 1, 1]);
        let y = g.columns(x, width, start, len);
        let data = HashMap::from([(x, bytes_f32(&rng.vec(width * pieces * n)))]);
        compare(&mut gpu, &g, &data, &[y], 0.0, &format!("columns {start}+{len} of {width} × {pieces}, n {n}"));
    }
}

#[test]
fn yarn_rope_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(62);
    let (hd, heads) = (64usize, 4usize);
    let positions = [0, 1, 70, 3000, 40000, 5, 163839];
    let n = positions.len();
    // DeepSeek's (magnitude 1), a magnitude other than 1, both pairings, a
    // partial rotation and per-pair frequency factors.
    for (mode, n_rot, magnitude, factors) in [
        (RopeMode::Norm, 64, 1.0, false),
        (RopeMode::Neox, 64, 1.369, false),
        (RopeMode::Norm, 32, 1.0, false),
        (RopeMode::Neox, 64, 1.0, true),
    ] {
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [hd * heads, n, 1, 1]);
        let pos = g.input(InputKind::Positions, n);
        let f = factors.then(|| g.weight(1, "f", GgmlType::F32, [n_rot / 2, 1, 1, 1]));
        let p = RopeParams {
            mode,
            n_rot,
            head_dim: hd,
            freq_base: 10000.0,
            freq_scale: 0.025,
            yarn: Some(yarn(magnitude)),
        };
        let y = g.rope(x, pos, f, p);
        let mut data = HashMap::from([(x, bytes_f32(&rng.vec(hd * heads * n))), (pos, bytes_i32(&positions))]);
        if let Some(f) = f {
            data.insert(f, bytes_f32(&(0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.1).collect::<Vec<_>>()));
        }
        let what = format!("yarn rope {mode:?} n_rot {n_rot} magnitude {magnitude} factors {factors}");
        let e = compare(&mut gpu, &g, &data, &[y], 1e-5, &what);
        eprintln!("{what}: {e:.1e}");
    }
}

/// The per-head products as DeepSeek's layers hold them, for F32, F16,
/// BF16, Q8_0 (int8 levels) and Q4_K (levels with offsets) weights: 3-D
/// `attn_k_b` `[nope, rank, n_head]` and `attn_v_b` `[rank, v, n_head]`
/// (stride = rows), the same 3-D weight transposed, and a legacy 2-D
/// `attn_kv_b` `[rank, n_head · (nope + v)]` read through stride and offset,
/// its k rows transposed and its v rows not. 5 heads, and v = 36 rows a head
/// (a block's last warps idle); 1, 5 and 70 tokens (the last token block
/// partial).
#[test]
fn mul_mat_heads_match_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(63);
    let (nh, rank, nope, v) = (5usize, 512usize, 64usize, 36usize);
    let hm = |stride, offset, len, transposed| HeadMatMul { n_head: nh, stride, offset, len, transposed };
    // (what, weight dims, products)
    let cases = [
        ("attn_k_b", [nope, rank, nh, 1], hm(rank, 0, rank, false)),
        ("attn_v_b", [rank, v, nh, 1], hm(v, 0, v, false)),
        ("3-D transposed", [rank, v, nh, 1], hm(v, 0, v, true)),
        ("attn_kv_b k rows", [rank, nh * (nope + v), 1, 1], hm(nope + v, 0, nope, true)),
        ("attn_kv_b v rows", [rank, nh * (nope + v), 1, 1], hm(nope + v, nope, v, false)),
    ];
    let types = [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K];
    for ty in types {
        for (what, ne, mm) in cases {
            let (k, rows) = (ne[0], ne[1] * ne[2]);
            if ty.tensor_bytes(&[k as u64, 1]).is_none() {
                continue; // Q4_K rows are 256 wide at least
            }
            let weight = float_weight(ty, k, rows, &mut rng);
            let k_in = if mm.transposed { mm.len } else { k };
            let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            let precisions: &[Precision] =
                if float { &[Precision::Float] } else { &[Precision::Float, Precision::Paired] };
            for (n, &precision) in [1usize, 5, 70].into_iter().flat_map(|n| precisions.iter().map(move |p| (n, p))) {
                let mut g = Graph::new();
                let w = g.weight(0, "w", ty, ne);
                let x = g.weight(1, "x", GgmlType::F32, [k_in * nh, n, 1, 1]);
                let y = g.mul_mat_heads(w, x, mm, precision);
                let data = HashMap::from([(w, weight.clone()), (x, bytes_f32(&rng.vec(k_in * nh * n)))]);
                let what = format!("{what} {ty} {ne:?} n {n} {precision:?}");
                let bound = match (mm.transposed, precision) {
                    (true, _) => 0.0,
                    (false, Precision::Paired) => 1e-5,
                    (false, Precision::Float) => 1e-4,
                };
                let e = compare(&mut gpu, &g, &data, &[y], bound, &what);
                eprintln!("{what}: {e:.1e}");
            }
        }
    }
}

/// The latent attention at V2-Lite's shapes (16 heads, rank 512, rope 64)
/// and 20 heads (a second block of heads, 4 of them live), on F32 and F16
/// caches of 4096 rows: a 70-token prompt at position 0 (one split), one
/// token at 70 (decoding splits, two live) and at 3000 (47 live: the merge
/// over many), and 5 tokens at 2000; 37 tokens (an odd count: a block with
/// one token) at 100, 20 heads × 9 tokens at 1000, and rank 64 with rope 16
/// (the tiny models' shape, one value n-tile a warp). F16 caches take the
/// tensor cores, in splits when decoding. Rows past each token's position
/// hold random data, which the causal mask must hide.
#[test]
fn latent_attention_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(64);
    let n_ctx = 4096usize;
    let shapes = [
        (16usize, 0usize, 70usize, 512usize, 64usize),
        (16, 70, 1, 512, 64),
        (16, 3000, 1, 512, 64),
        (16, 2000, 5, 512, 64),
        (20, 100, 3, 512, 64),
        (16, 100, 37, 512, 64),
        (20, 1000, 9, 512, 64),
        (4, 10, 27, 64, 16),
    ];
    for (nh, kv_pos, n, rank, rope) in shapes {
        for cache_ty in [GgmlType::F32, GgmlType::F16] {
            let mut g = Graph::new();
            let q_lat = g.weight(0, "q_lat", GgmlType::F32, [rank * nh, n, 1, 1]);
            let q_pe = g.weight(1, "q_pe", GgmlType::F32, [rope * nh, n, 1, 1]);
            let c = g.weight(2, "c", GgmlType::F32, [rank, n, 1, 1]);
            let k_pe = g.weight(3, "k_pe", GgmlType::F32, [rope, n, 1, 1]);
            let cache = g.kv_cache(0, KvKind::K, cache_ty, [rank + rope, n_ctx, 1, 1]);
            let pos = g.input(InputKind::Positions, n);
            // DeepSeek's scale, (1 + 0.1·ln 40)² / √192, sharpens the softmax.
            let p = LatentAttentionParams { layer: 0, n_head: nh, rank, rope, scale: 0.135, kv_pos };
            let a = g.latent_attention(q_lat, q_pe, c, k_pe, cache, pos, p);
            let positions: Vec<i32> = (kv_pos..kv_pos + n).map(|p| p as i32).collect();
            let scaled = |rng: &mut Rng, len: usize| rng.vec(len).iter().map(|v| 2.0 * v).collect::<Vec<_>>();
            let data = HashMap::from([
                (q_lat, bytes_f32(&scaled(&mut rng, rank * nh * n))),
                (q_pe, bytes_f32(&scaled(&mut rng, rope * nh * n))),
                (c, bytes_f32(&rng.vec(rank * n))),
                (k_pe, bytes_f32(&rng.vec(rope * n))),
                (cache, cache_bytes(cache_ty, &rng.vec((rank + rope) * n_ctx))),
                (pos, bytes_i32(&positions)),
            ]);
            let bound = if cache_ty == GgmlType::F16 { 5e-3 } else { 1e-4 };
            let what = format!("latent attention {nh} heads at {kv_pos}, n {n}, rank {rank}, {cache_ty} cache");
            let e = compare(&mut gpu, &g, &data, &[a, cache], bound, &what);
            eprintln!("{what}: {e:.1e}");
        }
    }
}

/// DeepSeek's MLA from q and kv_a's output to the heads' values, as
/// `models::mla` builds it: the slices, the latent's norm, the YaRN ropes of
/// q_pe and k_pe (on the GPU `mla_q_split` and `mla_kv_store`), the absorbed
/// key product (3-D Q8_0 `attn_k_b`), the attention, and the value product
/// (3-D Q8_0 `attn_v_b`); one decoding token at 900, and a 9-token batch
/// after it.
#[test]
fn mla_chain_matches_cpu() {
    let Some(mut gpu) = gpu() else { return };
    let mut rng = Rng::new(65);
    let (nh, rank, rope, nope, v, n_ctx) = (16usize, 512usize, 64usize, 128usize, 128usize, 2048usize);
    let dk = nope + rope;
    let k_b = float_weight(GgmlType::Q8_0, nope, rank * nh, &mut rng);
    let v_b = float_weight(GgmlType::Q8_0, rank, v * nh, &mut rng);
    for (kv_pos, n) in [(900usize, 1usize), (901, 9)] {
        for cache_ty in [GgmlType::F32, GgmlType::F16] {
            let mut g = Graph::new();
            let q = g.weight(0, "q", GgmlType::F32, [dk * nh, n, 1, 1]);
            let kv = g.weight(1, "kv", GgmlType::F32, [rank + rope, n, 1, 1]);
            let wk = g.weight(2, "attn_k_b", GgmlType::Q8_0, [nope, rank, nh, 1]);
            let wv = g.weight(3, "attn_v_b", GgmlType::Q8_0, [rank, v, nh, 1]);
            let wn = g.weight(4, "kv_a_norm", GgmlType::F32, [rank, 1, 1, 1]);
            let cache = g.kv_cache(0, KvKind::K, cache_ty, [rank + rope, n_ctx, 1, 1]);
            let pos = g.input(InputKind::Positions, n);
            let r = RopeParams {
                mode: RopeMode::Norm,
                n_rot: rope,
                head_dim: rope,
                freq_base: 10000.0,
                freq_scale: 0.025,
                yarn: Some(yarn(1.0)),
            };
            let q_nope = g.columns(q, dk, 0, nope);
            let q_pe = g.columns(q, dk, nope, rope);
            let latent = g.columns(kv, rank + rope, 0, rank);
            let k_pe = g.columns(kv, rank + rope, rank, rope);
            let latent = g.rms_norm(latent, 1e-6);
            let latent = g.mul(latent, wn);
            let q_pe = g.rope(q_pe, pos, None, r);
            let k_pe = g.rope(k_pe, pos, None, r);
            let head = |stride, len| HeadMatMul { n_head: nh, stride, offset: 0, len, transposed: false };
            let q_lat = g.mul_mat_heads(wk, q_nope, head(rank, rank), Precision::Float);
            let p = LatentAttentionParams { layer: 0, n_head: nh, rank, rope, scale: 0.135, kv_pos };
            let o = g.latent_attention(q_lat, q_pe, latent, k_pe, cache, pos, p);
            let y = g.mul_mat_heads(wv, o, head(v, v), Precision::Float);
            g.mark_output(y);
            let positions: Vec<i32> = (kv_pos..kv_pos + n).map(|p| p as i32).collect();
            let data: HashMap<NodeId, Vec<u8>> = HashMap::from([
                (q, bytes_f32(&rng.vec(dk * nh * n))),
                (kv, bytes_f32(&rng.vec((rank + rope) * n))),
                (wk, k_b.clone()),
                (wv, v_b.clone()),
                (wn, bytes_f32(&rng.vec(rank))),
                (cache, cache_bytes(cache_ty, &rng.vec((rank + rope) * n_ctx))),
                (pos, bytes_i32(&positions)),
            ]);
            let bound = if cache_ty == GgmlType::F16 { 5e-3 } else { 1e-4 };
            let what = format!("MLA chain at {kv_pos}, n {n}, {cache_ty} cache");
            let e = compare(&mut gpu, &g, &data, &[y, cache], bound, &what);
            eprintln!("{what}: {e:.1e}");
        }
    }
}
