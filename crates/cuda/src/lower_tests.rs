//! The lowering's fusions, checked on the host: a BitNet layer becomes the
//! launch sequence the kernels expect, and overlapping tensors turn a fusion
//! off. No GPU is needed (the pointers are never dereferenced).

use tern_backend::TensorLoc;
use tern_graph::{Activation, AttentionParams, Graph, InputKind, KvKind, NodeId, Op, Precision, RopeMode, RopeParams};
use tern_quant::GgmlType;

use crate::args::{Act, Args, TernaryGemvArgs};
use crate::buffers::{Backing, Buffers, DevBuf};
use crate::kernels::Kernel;
use crate::lower::{lower, Scratch};
use crate::qlayout::QLayout;
use crate::weights::TernaryShape;
use crate::Weight;

const E: usize = 256; // n_embd
const F: usize = 512; // n_ff
const HD: usize = 64;

struct Layer {
    g: Graph,
    x: NodeId,
    norm_out: NodeId,
}

/// One BitNet block (attention with sub-norm, relu² FFN with sub-norm).
fn layer(n: usize) -> Layer {
    let mut g = Graph::new();
    let w = |g: &mut Graph, i, name: &str, ty, k, rows| g.weight(i, name, ty, [k, rows, 1, 1]);
    let x = w(&mut g, 0, "x", GgmlType::F32, E, n);
    let pos = g.input(InputKind::Positions, n);
    let (wn, wsub, wn2, wfs) = (
        w(&mut g, 1, "attn_norm", GgmlType::F32, E, 1),
        w(&mut g, 2, "attn_sub_norm", GgmlType::F32, E, 1),
        w(&mut g, 3, "ffn_norm", GgmlType::F32, E, 1),
        w(&mut g, 4, "ffn_sub_norm", GgmlType::F32, F, 1),
    );
    let t = GgmlType::TQ2_0;
    let (wq, wk, wv, wo) = (
        w(&mut g, 5, "q", t, E, E),
        w(&mut g, 6, "k", t, E, 128),
        w(&mut g, 7, "v", t, E, 128),
        w(&mut g, 8, "o", t, E, E),
    );
    let (wg, wu, wd) = (w(&mut g, 9, "gate", t, E, F), w(&mut g, 10, "up", t, E, F), w(&mut g, 11, "down", t, F, E));
    let kc = g.kv_cache(0, KvKind::K, GgmlType::F16, [128, 256, 1, 1]);
    let vc = g.kv_cache(0, KvKind::V, GgmlType::F16, [128, 256, 1, 1]);
    let p = Precision::Paired;
    let n1 = g.rms_norm(x, 1e-5);
    let h = g.mul(n1, wn);
    let (q, k, v) = (g.mul_mat(wq, h, p), g.mul_mat(wk, h, p), g.mul_mat(wv, h, p));
    let r = RopeParams { mode: RopeMode::Neox, n_rot: HD, head_dim: HD, freq_base: 1e4, freq_scale: 1.0, yarn: None };
    let (qr, kr) = (g.rope(q, pos, None, r), g.rope(k, pos, None, r));
    let ap = AttentionParams { layer: 0, n_head: 4, n_head_kv: 2, head_dim: HD, scale: 0.125, kv_pos: 0 };
    let a = g.attention(qr, kr, v, kc, vc, pos, ap);
    let s = g.rms_norm(a, 1e-5);
    let s = g.mul(s, wsub);
    let o = g.mul_mat(wo, s, p);
    let res = g.add(x, o);
    let n2 = g.rms_norm(res, 1e-5);
    let h2 = g.mul(n2, wn2);
    let (gt, up) = (g.mul_mat(wg, h2, p), g.mul_mat(wu, h2, p));
    let act = g.gated_act(gt, up, Activation::Relu2);
    let f = g.rms_norm(act, 1e-5);
    let f = g.mul(f, wfs);
    let d = g.mul_mat(wd, f, p);
    let out = g.add(res, d);
    g.mark_output(out);
    Layer { g, x, norm_out: h }
}

/// Ternary weights labelled with this prefix have a scale per 256-chunk.
const GROUPED: &str = "grouped ";

/// Fake device memory: every node its own range of buffer 0, weights their
/// own buffers with GPU-layout metadata. `alias` puts one node's bytes on another's.
fn bind(g: &Graph, alias: Option<(NodeId, NodeId)>, staged: &[&str]) -> (Buffers, Vec<Option<TensorLoc>>) {
    let mut bufs = Buffers::default();
    let arena = bufs.insert(DevBuf { ptr: 1 << 40, bytes: 1 << 30, weight: None, backing: Backing::Device });
    let mut locs = vec![None; g.nodes.len()];
    let mut offset = 0;
    for id in g.ids() {
        let n = g.node(id);
        let loc = match n.op {
            Op::Weight(_) if n.label.as_deref() != Some("x") => {
                let ty = match n.dtype {
                    tern_graph::DType::Ggml(t) => t,
                    tern_graph::DType::I32 => unreachable!(),
                };
                let name = n.label.as_deref().unwrap_or_default();
                let groups = if name.starts_with(GROUPED) { n.ne[0] / 256 } else { 1 };
                let ternary = ty.is_ternary().then_some(TernaryShape { k_pad: n.ne[0], rows: n.ne[1], groups });
                let ptr = (1 << 41) + (id.0 as u64) * (1 << 24);
                let staged = staged.contains(&name).then_some(1 << 20);
                let quant = match crate::weights::Held::of(ty, n.ne) {
                    Some(crate::weights::Held::Quant(l)) if ternary.is_none() => Some(l),
                    _ => None,
                };
                let ptr_offsets = if quant == Some(QLayout::LevelsOffset) { ptr + 8192 } else { 0 };
                let ptr_native = if crate::weights::keeps_native(ty, n.ne[0]) { ptr + 12288 } else { 0 };
                let weight = Weight {
                    ty,
                    ptr_codes: ptr,
                    ptr_scales: ptr + 4096,
                    ptr_offsets,
                    ptr_native,
                    ternary,
                    quant,
                    staged,
                };
                let backing = if staged.is_some() { Backing::Mapped(ptr as usize) } else { Backing::Device };
                let buffer = bufs.insert(DevBuf { ptr, bytes: 1 << 24, weight: Some(weight), backing });
                TensorLoc { buffer, offset: 0, nbytes: n.nbytes() }
            }
            _ => {
                let loc = TensorLoc { buffer: arena, offset, nbytes: n.nbytes() };
                offset += n.nbytes().next_multiple_of(256);
                loc
            }
        };
        locs[id.index()] = Some(loc);
    }
    if let Some((a, b)) = alias {
        locs[a.index()] = Some(TensorLoc { nbytes: locs[a.index()].unwrap().nbytes, ..locs[b.index()].unwrap() });
    }
    (bufs, locs)
}

const SCRATCH: Scratch = Scratch {
    base: 1 << 42,
    cap: 1 << 30,
    counters: 1 << 43,
    counters_cap: 1 << 20,
    stage_base: 1 << 44,
    stage_cap: 0,
};

fn launches(l: &Layer, alias: Option<(NodeId, NodeId)>) -> Vec<crate::launch::Launch> {
    lowered(l, alias, &[], SCRATCH).unwrap_or_else(|e| panic!("{e:?}"))
}

fn lowered(
    l: &Layer,
    alias: Option<(NodeId, NodeId)>,
    staged: &[&str],
    scratch: Scratch,
) -> Result<Vec<crate::launch::Launch>, crate::lower::Need> {
    lowered_on(l, alias, staged, scratch, 132, false)
}

/// `lowered` for a device of `sms` multiprocessors, with wgmma (sm_90) or without.
fn lowered_on(
    l: &Layer,
    alias: Option<(NodeId, NodeId)>,
    staged: &[&str],
    scratch: Scratch,
    sms: usize,
    wgmma: bool,
) -> Result<Vec<crate::launch::Launch>, crate::lower::Need> {
    let (bufs, locs) = bind(&l.g, alias, staged);
    let nodes: Vec<NodeId> = l.g.ids().filter(|id| !l.g.node(*id).op.is_leaf()).collect();
    lower(&l.g, &nodes, &locs, &bufs, scratch, sms, wgmma).map(|l| l.launches)
}

fn kernels(ls: &[crate::launch::Launch]) -> Vec<Kernel> {
    ls.iter().map(|l| l.kernel).collect()
}

fn batch(l: &crate::launch::Launch) -> crate::launch::TernaryBatch {
    match l.args {
        Args::TernaryGemv(a) => a.b,
        Args::TernaryGemm(a) => a.b,
        Args::TernaryGemmWg(a) => a.b,
        _ => panic!("{:?} takes no batch", l.kernel),
    }
}

fn gemv_args(l: &crate::launch::Launch) -> TernaryGemvArgs {
    let Args::TernaryGemv(a) = l.args else { panic!("{:?} is not a GEMV", l.kernel) };
    a
}

#[test]
fn decoding_a_layer_takes_nine_launches() {
    use Kernel::*;
    let l = layer(1);
    let ls = launches(&l, None);
    let want = [
        NormQuant,        // attn_norm + weight + int8
        TernaryGemv1,     // q, k, v in one launch
        Attention,        // rope of q and k, cache store, flash-decoding with its merge
        NormQuant,        // attn_sub_norm
        TernaryGemv1,     // attn_output + residual
        NormQuant,        // ffn_norm
        TernaryGemv1Pair, // gate and up + relu², two row pairs a warp
        NormQuant,        // ffn_sub_norm
        TernaryGemv1,     // ffn_down + residual
    ];
    assert_eq!(kernels(&ls), want);
    assert_eq!(batch(&ls[1]).n, 3);
    // The attention reads the GEMV's unrotated q and k and rotates them itself.
    let Args::Attention(a) = ls[2].args else { panic!("not an attention: {:?}", ls[2].args) };
    let (r, b) = (a.r, batch(&ls[1]));
    assert_eq!((r.on, r.k, r.n_rot, r.mode), (1, b.m[1].out, HD as i32, crate::args::RopeMode::Neox));
    assert_eq!(a.q, b.m[0].out, "q as the GEMV wrote it");
    assert_eq!(r.v, b.m[2].out);
    // The GEMV pairs gate/up with relu², and nothing elsewhere.
    assert_eq!(gemv_args(&ls[6]).pair_act, Act::Relu2);
    assert_eq!(gemv_args(&ls[1]).pair_act, Act::None);
    for i in [4, 8] {
        assert_ne!(batch(&ls[i]).m[0].res, 0, "launch {i} adds the residual");
    }
    assert_eq!(batch(&ls[6]).n, 2, "gate and up");
    // One warp per row, 8 rows a block: q, k, v need 32 + 16 + 16 blocks;
    // paired gate/up cover the gate's 512 rows only, two row pairs a warp.
    assert_eq!(ls[1].grid, (64, 1, 1));
    assert_eq!(batch(&ls[1]).block_start, [0, 32, 48, 64]);
    assert_eq!(ls[6].grid, (32, 1, 1));
    assert_eq!(ls[1].block, 256);
}

/// The lowering says how far a decoding step's attention reads (which of
/// decode_run's modules runs it).
#[test]
fn a_step_past_long_cache_keys_says_so() {
    use crate::decode::{cache_span, CacheSpan};
    let mut l = layer(1);
    let span = |l: &Layer| {
        let (bufs, locs) = bind(&l.g, None, &[]);
        let nodes: Vec<NodeId> = l.g.ids().filter(|id| !l.g.node(*id).op.is_leaf()).collect();
        lower(&l.g, &nodes, &locs, &bufs, SCRATCH, 132, false).unwrap_or_else(|e| panic!("{e:?}")).span
    };
    assert_eq!(span(&l), CacheSpan::Short);
    // Two q heads a KV head: all three spans.
    for (kv_pos, want) in [(447, CacheSpan::Short), (448, CacheSpan::Chunked), (2047, CacheSpan::Grouped)] {
        for n in &mut l.g.nodes {
            if let Op::Attention(p) = &mut n.op {
                p.kv_pos = kv_pos;
                assert_eq!(cache_span(p, 1), want, "kv_pos {kv_pos}");
            }
        }
        assert_eq!(span(&l), want, "kv_pos {kv_pos}");
    }
}

/// The final norm and its weight, then a Q6_K head, for `n` tokens.
fn head(n: usize) -> Layer {
    let mut g = Graph::new();
    let x = g.weight(0, "x", GgmlType::F32, [E, n, 1, 1]);
    let wn = g.weight(1, "output_norm", GgmlType::F32, [E, 1, 1, 1]);
    let wo = g.weight(2, "output", GgmlType::Q6_K, [E, 1000, 1, 1]);
    let h = g.rms_norm(x, 1e-5);
    let h = g.mul(h, wn);
    let y = g.mul_mat(wo, h, Precision::Paired);
    g.mark_output(y);
    Layer { g, x, norm_out: h }
}

/// Decoding, the head norms its input itself: one launch, which reads the
/// norm's input and weight. Not when the head's output would be written over
/// that input, nor for a prompt (another kernel).
#[test]
fn the_final_norm_folds_into_a_one_token_q6k_head() {
    use Kernel::*;
    let l = head(1);
    let (bufs, locs) = bind(&l.g, None, &[]);
    let ls = launches(&l, None);
    assert_eq!(kernels(&ls), [Q6KGemv1Q8]);
    let ptr =
        |id: NodeId| bufs.get(locs[id.index()].unwrap().buffer).unwrap().ptr + locs[id.index()].unwrap().offset as u64;
    let wn = l.g.ids().find(|&id| l.g.node(id).label.as_deref() == Some("output_norm")).unwrap();
    let Args::Q6KGemv1Q8(a) = ls[0].args else { panic!("{:?}", ls[0].args) };
    assert_eq!(a.io.x, ptr(l.x), "x, not the normed row");
    assert_eq!((a.nw, a.eps), (ptr(wn), 1e-5));
    let y = *l.g.outputs.first().unwrap();
    assert_eq!(kernels(&launches(&l, Some((y, l.x))))[1..], [Q6KGemv1Q8]);
    assert!(!kernels(&launches(&head(2), None)).contains(&Q6KGemv1Q8));
}

/// When the attention's output shares bytes with the unrotated k, the
/// rotation goes back to its own launch before the attention.
#[test]
fn an_attention_output_over_its_inputs_keeps_the_rope_launch() {
    use Kernel::*;
    let l = layer(1);
    let k = l.g.ids().filter(|&id| matches!(l.g.node(id).op, Op::MulMat { .. })).nth(1).unwrap();
    let att = l.g.ids().find(|&id| matches!(l.g.node(id).op, Op::Attention(_))).unwrap();
    let ls = launches(&l, Some((att, k)));
    assert_eq!(kernels(&ls)[..4], [NormQuant, TernaryGemv1, RopeStore, Attention]);
    assert!(matches!(ls[3].args, Args::Attention(a) if a.r.on == 0));
}

#[test]
fn a_prompt_uses_the_gemm_and_tensor_core_attention() {
    use Kernel::*;
    let ls = launches(&layer(64), None);
    let want = [
        NormQuant,
        TernaryGemm,
        RopeStore,
        FlashAttnSplit,
        NormQuant,
        TernaryGemm,
        NormQuant,
        TernaryGemm,
        GatedNormQuant,
        TernaryGemm,
    ];
    assert_eq!(kernels(&ls), want);
    assert_eq!(batch(&ls[1]).n, 3);
    assert_eq!(batch(&ls[7]).n, 2);
    // relu², then ffn_sub_norm's norm and weight.
    let Args::GatedNormQuant(a) = ls[8].args else { panic!("{:?}", ls[8].args) };
    assert_eq!((a.act, a.norm), (Act::Relu2, 1));
    // 256-row tiles (q: 1, k: 1, v: 1) by 32-token tiles, a thread a row;
    // the GEMM takes no activation argument.
    assert_eq!(ls[1].grid, (3, 2, 1));
    assert_eq!(batch(&ls[1]).block_start, [0, 1, 2, 3]);
    let Args::TernaryGemm(a) = ls[1].args else { panic!("{:?}", ls[1].args) };
    assert_eq!((ls[1].block, a.n_tok), (256, 64));
    assert_eq!(ls[7].grid, (4, 2, 1));
}

/// A prompt attention block takes two sets of warps over its key tiles
/// while the grid is small against the SMs, and one set beyond.
#[test]
fn prompt_attention_splits_its_keys_while_the_grid_is_small() {
    // The layer has 2 KV heads of 2 query heads: 64 tokens are 8 blocks.
    let l = layer(64);
    let tiles = |sets: usize| 2 * 2 * sets * 32 * (HD + 8) * 2;
    let merge = 2 * (HD / 2 + 4) * 32 * 4;
    let split = (Kernel::FlashAttnSplit, 128, tiles(2).max(merge));
    for (sms, (kernel, block, smem)) in [(132, split), (4, split), (3, (Kernel::FlashAttn, 64, tiles(1)))] {
        // 8 blocks split on 4 SMs (at most 2 SMs' worth), not on 3.
        let ls = lowered_on(&l, None, &[], SCRATCH, sms, false).unwrap_or_else(|e| panic!("{e:?}"));
        let fa = ls.iter().find(|l| matches!(l.kernel, Kernel::FlashAttn | Kernel::FlashAttnSplit)).unwrap();
        assert_eq!((fa.kernel, fa.grid, fa.block, fa.smem as usize), (kernel, (2, 4, 1), block, smem), "{sms} SMs");
    }
}

/// llama's FFN: gate and up, their SiLU product, down; `keep` also makes
/// the product an output.
fn ffn(n: usize, keep: bool) -> Layer {
    let mut g = Graph::new();
    let t = GgmlType::TQ2_0;
    let x = g.weight(0, "x", GgmlType::F32, [E, n, 1, 1]);
    let (wg, wu, wd) = (
        g.weight(1, "gate", t, [E, F, 1, 1]),
        g.weight(2, "up", t, [E, F, 1, 1]),
        g.weight(3, "down", t, [F, E, 1, 1]),
    );
    let p = Precision::Paired;
    let (gt, up) = (g.mul_mat(wg, x, p), g.mul_mat(wu, x, p));
    let act = g.gated_act(gt, up, Activation::Silu);
    let d = g.mul_mat(wd, act, p);
    g.mark_output(d);
    if keep {
        g.mark_output(act);
    }
    Layer { g, x, norm_out: act }
}

/// A prompt's SiLU product goes to ffn_down through its levels alone,
/// formed as they are quantized; not when the product is also an output,
/// nor for one token (the gate/up GEMV pair forms it then).
#[test]
fn a_prompts_gated_product_is_quantized_as_it_loads() {
    use Kernel::*;
    let ls = launches(&ffn(64, false), None);
    assert_eq!(kernels(&ls), [NormQuant, TernaryGemm, GatedNormQuant, TernaryGemm]);
    let Args::GatedNormQuant(a) = ls[2].args else { panic!("{:?}", ls[2].args) };
    assert_eq!((a.act, a.norm), (Act::Silu, 0), "SiLU, no norm");
    let kept = kernels(&launches(&ffn(64, true), None));
    assert_eq!(kept, [NormQuant, TernaryGemm, GatedAct, NormQuant, TernaryGemm]);
    assert!(!kernels(&launches(&ffn(4, false), None)).contains(&GatedNormQuant));
}

/// Matrices with a scale per 256-chunk take the GEMM that folds them, on
/// 128-row tiles; a batch with one such matrix takes it for all.
#[test]
fn per_chunk_scales_take_the_grouped_gemm() {
    use Kernel::*;
    let mut g = Graph::new();
    let t = GgmlType::TQ2_0;
    let x = g.weight(0, "x", GgmlType::F32, [F, 64, 1, 1]);
    let (wa, wb) = (g.weight(1, "a", t, [F, F, 1, 1]), g.weight(2, "grouped b", t, [F, F, 1, 1]));
    let wc = g.weight(3, "c", t, [F, 384, 1, 1]);
    let p = Precision::Paired;
    let outs = [g.mul_mat(wa, x, p), g.mul_mat(wb, x, p)];
    let lone = g.mul_mat(wc, outs[0], p);
    for o in [outs[1], lone] {
        g.mark_output(o);
    }
    let l = Layer { g, x, norm_out: x };
    let ls = launches(&l, None);
    let gemms: Vec<_> = ls.iter().filter(|l| matches!(l.kernel, TernaryGemm | TernaryGemmGrouped)).collect();
    let shape = |l: &crate::launch::Launch| (l.kernel, l.grid, l.block);
    assert_eq!(shape(gemms[0]), (TernaryGemmGrouped, (8, 2, 1), 128), "a and b: 512 rows each");
    assert_eq!(shape(gemms[1]), (TernaryGemm, (2, 2, 1), 256), "c: 384 rows");
    // On sm_90 too the scales per chunk keep the grouped GEMM (wgmma sums a
    // row in one scale); c takes wgmma.
    let ls = lowered_on(&l, None, &[], SCRATCH, 132, true).unwrap_or_else(|e| panic!("{e:?}"));
    let gemms: Vec<_> = ls.iter().map(|l| l.kernel).filter(|k| !matches!(k, NormQuant)).collect();
    assert_eq!(gemms, [TernaryGemmGrouped, TernaryGemmWgNarrow]);
}

/// On sm_90 the prompt GEMMs with one scale a row take wgmma: 192-row
/// tiles of 128 tokens where they fill the SMs, else 128-row tiles; the
/// levels and each matrix's codes go as tensor maps (a batch of two repeats
/// the first matrix's in the third slot); a few tokens keep the GEMV.
#[test]
fn sm_90_prompts_take_the_wgmma_gemm_with_its_tensor_maps() {
    use crate::lower::GEMV_MAX_TOKENS;
    use crate::tma::Swizzle;
    use Kernel::*;
    // Two tiles of tokens, the second partial (the layer's cache holds 256).
    let n = 200;
    let l = layer(n);
    let k_pad = |k: usize| k.next_multiple_of(256) as u64;
    // (kernel, rows a block, threads, stages) of the two shapes.
    let (wide, narrow) = ((TernaryGemmWg, 192, 416, 4), (TernaryGemmWgNarrow, 128, 288, 5));
    // Each GEMM takes the shape whose rounds over the SMs cost less (a wide
    // block 5, a narrow one 4). gate/up is two 512-row matrices: 6 wide or 8
    // narrow blocks a token tile, 12 or 16 in all; q/k/v (256 + 128 + 128
    // rows) and o and down (256 rows) take as many blocks of either shape.
    // On 132 SMs everything is one round: narrow. On 12, gate/up is one
    // round wide (5) or two narrow (8).
    for (sms, gate_up) in [(132, narrow), (12, wide)] {
        let ls = lowered_on(&l, None, &[], SCRATCH, sms, true).unwrap_or_else(|e| panic!("{e:?}"));
        let wg: Vec<_> = ls.iter().filter(|l| matches!(l.kernel, TernaryGemmWg | TernaryGemmWgNarrow)).collect();
        assert_eq!(wg.len(), 4, "q/k/v, o, gate/up, down: {:?}", kernels(&ls));
        assert!(!kernels(&ls).contains(&TernaryGemm));
        for (i, (launch, shape, k)) in
            [(wg[0], narrow, E), (wg[1], narrow, E), (wg[2], gate_up, E), (wg[3], narrow, F)].into_iter().enumerate()
        {
            let (kernel, rows, threads, stages) = shape;
            let Args::TernaryGemmWg(a) = launch.args else { panic!("{:?}", launch.args) };
            let b = a.b;
            let blocks: usize = (0..b.n as usize).map(|m| (b.m[m].rows as usize).div_ceil(rows)).sum();
            let smem = stages * (128 * 256 + rows * 64) + 2048;
            assert_eq!(
                (launch.kernel, launch.grid, launch.block, launch.smem as usize),
                (kernel, (blocks as u32, 2, 1), threads, smem),
                "GEMM {i} on {sms} SMs"
            );
            let maps = [a.tq, a.tw0, a.tw1, a.tw2];
            let kp = k_pad(k);
            assert_eq!(
                (maps[0].row_bytes, maps[0].rows, maps[0].box_bytes, maps[0].box_rows),
                (kp, n as u64, 128, 128)
            );
            assert_eq!(maps[0].swizzle, Swizzle::B128);
            for (j, m) in maps[1..=b.n as usize].iter().enumerate() {
                assert_eq!((m.ptr, m.rows), (b.m[j].w, b.m[j].rows as u64), "GEMM {i} matrix {j}");
                assert_eq!((m.row_bytes, m.box_bytes, m.box_rows, m.swizzle), (kp / 4, 64, rows as u32, Swizzle::B64));
            }
            assert_eq!((a.k_pad, a.n_tok), (kp as i32, n as i32));
        }
        let Args::TernaryGemmWg(a) = wg[2].args else { panic!() };
        assert_eq!(a.b.n, 2);
        assert_eq!(a.tw2, a.tw0, "the unused slot repeats matrix 0's map");
    }
    // Levels the copy engine cannot read (a workspace off 16 bytes) take mma.sync.
    let odd = Scratch { base: SCRATCH.base + 8, ..SCRATCH };
    let ls = lowered_on(&l, None, &[], odd, 132, true).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(kernels(&ls).contains(&TernaryGemm) && !kernels(&ls).contains(&TernaryGemmWgNarrow));
    // A few tokens stay on the GEMV, with or without wgmma.
    let few = lowered_on(&layer(GEMV_MAX_TOKENS), None, &[], SCRATCH, 132, true).unwrap();
    assert!(kernels(&few).iter().all(|k| !matches!(k, TernaryGemmWg | TernaryGemmWgNarrow | TernaryGemm)));
}

#[test]
fn overlapping_bytes_turn_the_norm_fusion_off() {
    use Kernel::*;
    // The normalised row would be written over the row the kernel reads.
    let l = layer(1);
    let ls = launches(&l, Some((l.norm_out, l.x)));
    assert_eq!(kernels(&ls)[..4], [RmsNorm, Binary, NormQuant, TernaryGemv1]);
}

/// Offloaded matmuls on staged weights: each launch first streams its
/// weights into the staging ring, with no programmatic early start around
/// the copies, and reads them there.
#[test]
fn staged_weights_are_streamed_in_before_their_matmul() {
    use Kernel::*;
    let l = layer(64);
    let need = lowered(&l, None, &["gate", "up", "down"], SCRATCH).expect_err("a ring is needed");
    let crate::lower::Need::Staging(ring) = need else { panic!("{need:?}") };
    assert!(ring >= 2 << 20, "gate and up together: {ring}");
    let ls = lowered(&l, None, &["gate", "up", "down"], Scratch { stage_cap: ring, ..SCRATCH }).unwrap();
    let want = [
        NormQuant,
        TernaryGemm,
        RopeStore,
        FlashAttnSplit,
        NormQuant,
        TernaryGemm,
        NormQuant,
        CopyIn, // gate
        CopyIn, // up
        TernaryGemm,
        GatedNormQuant,
        CopyIn, // down
        TernaryGemm,
    ];
    assert_eq!(kernels(&ls), want);
    let serial: Vec<bool> = ls.iter().map(|l| l.serial).collect();
    assert_eq!(serial.iter().filter(|s| **s).count(), 5, "the copies and the two GEMMs that read them");
    assert!(serial[7] && serial[8] && serial[9] && serial[11] && serial[12]);
    // The GEMM reads the ring, not the host copy.
    let b = batch(&ls[9]);
    assert_eq!((b.m[0].w, b.m[1].w), (1 << 44, (1 << 44) + (1 << 20)));
    assert!(matches!(ls[7].args, Args::CopyIn(a) if a.dst == 1 << 44));
    assert!(b.m[0].scales > b.m[0].w && b.m[0].scales < b.m[1].w);
}

/// A plan is replayed by its key: moving any one tensor, or any one node
/// to another shape, must give another key, and the same call the same key.
#[test]
fn plan_keys_change_with_every_location_and_shape() {
    let l = layer(1);
    let (_bufs, locs) = bind(&l.g, None, &[]);
    let nodes: Vec<NodeId> = l.g.ids().filter(|id| !l.g.node(*id).op.is_leaf()).collect();
    let key = crate::plan_key::fingerprint(&l.g, &nodes, &locs);
    assert_eq!(key, crate::plan_key::fingerprint(&l.g, &nodes, &locs.clone()));
    let mut moved = 0;
    for i in 0..locs.len() {
        let Some(loc) = locs[i] else { continue };
        let mut other = locs.clone();
        other[i] = Some(TensorLoc { offset: loc.offset + 256, ..loc });
        assert_ne!(crate::plan_key::fingerprint(&l.g, &nodes, &other), key, "node {i} moved");
        moved += 1;
    }
    assert!(moved > 20);
    for &id in &nodes {
        let mut g = l.g.clone();
        g.nodes[id.index()].ne[1] += 1;
        assert_ne!(crate::plan_key::fingerprint(&g, &nodes, &locs), key, "node {} reshaped", id.0);
    }
    let mm = nodes.iter().find(|&&id| matches!(l.g.node(id).op, Op::MulMat { .. })).unwrap();
    let mut g = l.g.clone();
    g.nodes[mm.index()].op = Op::MulMat { precision: tern_graph::Precision::Float };
    assert_ne!(crate::plan_key::fingerprint(&g, &nodes, &locs), key, "a product's precision picks its kernel");
    // The cache position matters only as the span it puts the step in.
    let at = |kv_pos: usize| {
        let mut g = l.g.clone();
        for n in &mut g.nodes {
            if let Op::Attention(p) = &mut n.op {
                p.kv_pos = kv_pos;
            }
        }
        crate::plan_key::fingerprint(&g, &nodes, &locs)
    };
    assert_eq!(at(200), key);
    assert_eq!(at(447), key);
    assert_ne!(at(448), key);
    assert_eq!(at(448), at(2046));
    assert_ne!(at(2047), at(2046));
    assert_eq!(at(2047), at(3000));
}

/// DeepSeek's MLA (16 heads, rank 512, rope 64, F16 per-head weights:
/// stored, `heads_dq`) in a cache of 2048 rows, as `models::mla` builds it:
/// q's columns and q_pe's YaRN rope are one `mla_q_split`, kv's columns,
/// the latent's norm, k_pe's rope and the cache store one `mla_kv_store`,
/// both carrying the ramp. Decoding cuts the cache into 32 splits of 64
/// rows and merges them, a prompt takes one split and no merge. Over an F16
/// cache the attention runs on tensor cores (two tokens × 16 heads a
/// block), over an F32 cache on CUDA cores (a token's 16 heads a block).
/// Without the latent's norm, or with q_pe's rope placed over q, the
/// launches stay apart.
#[test]
fn latent_attention_lowers_to_store_splits_and_merge() {
    use tern_graph::{HeadMatMul, LatentAttentionParams, Yarn};
    use Kernel::*;
    let (nh, rank, rope, nope) = (16, 512, 64, 128);
    let yarn = Yarn { n_ctx_orig: 4096, beta_fast: 32.0, beta_slow: 1.0, ext_factor: 1.0, magnitude: 1.0 };
    let r = RopeParams {
        mode: RopeMode::Norm,
        n_rot: rope,
        head_dim: rope,
        freq_base: 1e4,
        freq_scale: 0.025,
        yarn: Some(yarn),
    };
    // (q, the rope of q_pe, the graph).
    let graph = |n: usize, cache_ty, norm: bool| {
        let mut g = Graph::new();
        let q = g.weight(0, "x", GgmlType::F32, [(nope + rope) * nh, n, 1, 1]);
        let kv = g.weight(1, "x", GgmlType::F32, [rank + rope, n, 1, 1]);
        let wk = g.weight(2, "attn_k_b", GgmlType::F16, [nope, rank, nh, 1]);
        let wn = g.weight(3, "kv_a_norm", GgmlType::F32, [rank, 1, 1, 1]);
        let cache = g.kv_cache(0, KvKind::K, cache_ty, [rank + rope, 2048, 1, 1]);
        let pos = g.input(InputKind::Positions, n);
        let q_nope = g.columns(q, nope + rope, 0, nope);
        let q_pe = g.columns(q, nope + rope, nope, rope);
        let mut c = g.columns(kv, rank + rope, 0, rank);
        let k_pe = g.columns(kv, rank + rope, rank, rope);
        if norm {
            let c_n = g.rms_norm(c, 1e-6);
            c = g.mul(c_n, wn);
        }
        let (q_pe, k_pe) = (g.rope(q_pe, pos, None, r), g.rope(k_pe, pos, None, r));
        let mm = HeadMatMul { n_head: nh, stride: rank, offset: 0, len: rank, transposed: false };
        let q_lat = g.mul_mat_heads(wk, q_nope, mm, Precision::Float);
        let p = LatentAttentionParams { layer: 0, n_head: nh, rank, rope, scale: 0.1, kv_pos: 0 };
        let a = g.latent_attention(q_lat, q_pe, c, k_pe, cache, pos, p);
        g.mark_output(a);
        (q, q_pe, Layer { g, x: q, norm_out: q })
    };
    for (cache_ty, attention) in [(GgmlType::F16, MlaAttentionMma), (GgmlType::F32, MlaAttention)] {
        for n in [1usize, 70] {
            let (_, _, l) = graph(n, cache_ty, true);
            let ls = launches(&l, None);
            let mut want = vec![MlaQSplit, MlaKvStore, HeadsDq, attention];
            if n == 1 {
                want.push(MlaMerge);
            }
            assert_eq!(kernels(&ls), want, "{n} tokens, {cache_ty} cache");
            let Args::MlaQSplit(qa) = ls[0].args else { panic!("{:?}", ls[0].args) };
            assert_eq!((qa.n_head, qa.n_tok, qa.nope, qa.rope), (nh as i32, n as i32, nope as i32, rope as i32));
            assert_eq!((qa.y_low, qa.y_high, qa.y_ext, qa.y_mag), (10.0, 23.0, 1.0, 1.0));
            let Args::MlaKvStore(ka) = ls[1].args else { panic!("{:?}", ls[1].args) };
            assert_eq!((ka.rank, ka.rope, ka.eps, ka.ty), (rank as i32, rope as i32, 1e-6, cache_ty.id() as i32));
            assert!(ka.w != 0 && ka.y_high == 23.0, "the norm's weight and the ramp");
            assert_eq!(ls[1].grid, (n as u32, 1, 1), "a block a token");
            assert_eq!(ls[2].grid, (64, nh as u32, n.div_ceil(8) as u32), "a warp a row, 8 tokens a block");
            let splits = if n == 1 { 32 } else { 1 };
            let (n_split, part) = match ls[3].args {
                Args::MlaAttention(aa) => {
                    assert_eq!(ls[3].grid, (splits as u32, n as u32, 1), "{n} tokens");
                    (aa.n_split, aa.part)
                }
                Args::MlaMma(aa) => {
                    assert_eq!(ls[3].grid, (splits as u32, n.div_ceil(2) as u32, 1), "{n} tokens");
                    (aa.n_split, aa.part)
                }
                ref a => panic!("{a:?}"),
            };
            assert_eq!(n_split, splits, "{n} tokens, {cache_ty} cache");
            assert_eq!(part != 0, n == 1, "only splits leave states");
        }
    }
    let (_, _, l) = graph(1, GgmlType::F16, false);
    let want = [MlaQSplit, Columns, Columns, Rope, HeadsDq, MlaStore, MlaAttentionMma, MlaMerge];
    assert_eq!(kernels(&launches(&l, None)), want, "no norm: kv's launches stay apart");
    let (q, q_pe, l) = graph(1, GgmlType::F16, true);
    let want = [Columns, Columns, MlaKvStore, Rope, HeadsDq, MlaAttentionMma, MlaMerge];
    assert_eq!(kernels(&launches(&l, Some((q_pe, q)))), want, "q_pe's rope over q");
}

/// A YaRN rope is never fused into the attention (`rope_store`, the
/// one-token attention's rope have no ramp): it runs alone, the cache store
/// after it.
#[test]
fn yarn_ropes_stay_out_of_the_attention() {
    use tern_graph::Yarn;
    use Kernel::*;
    let mut l = layer(1);
    let yarn = Yarn { n_ctx_orig: 4096, beta_fast: 32.0, beta_slow: 1.0, ext_factor: 1.0, magnitude: 1.1 };
    for n in &mut l.g.nodes {
        if let Op::Rope(p) = &mut n.op {
            p.yarn = Some(yarn);
        }
    }
    let ls = launches(&l, None);
    assert_eq!(kernels(&ls)[..5], [NormQuant, TernaryGemv1, Rope, Rope, KvStore]);
    let Args::Attention(a) = ls[5].args else { panic!("{:?}", ls[5].args) };
    assert_eq!(a.r.on, 0, "q arrives rotated");
}

/// One token's norm read only by paired products of int8 levels (Q4_K,
/// read in the file's blocks by `q4k_gemv1x`; Q8_0 as levels by
/// `q8p_gemv1x`) folds into them: no `rms_norm` launch, each product norms x
/// with the weight row itself. Not when nothing after them reads x (its
/// bytes may be reused), nor when a reader is a float matrix (its kernel
/// takes no norm).
#[test]
fn a_norm_read_by_paired_levels_folds_into_them() {
    use Kernel::*;
    let graph = |keep_x: bool, wb_ty| {
        let mut g = Graph::new();
        let x = g.weight(0, "x", GgmlType::F32, [E, 1, 1, 1]);
        let wn = g.weight(1, "attn_norm", GgmlType::F32, [E, 1, 1, 1]);
        let wa = g.weight(2, "a", GgmlType::Q4_K, [E, E, 1, 1]);
        let wb = g.weight(3, "b", wb_ty, [E, E, 1, 1]);
        let n = g.rms_norm(x, 1e-6);
        let h = g.mul(n, wn);
        let (a, b) = (g.mul_mat(wa, h, Precision::Paired), g.mul_mat(wb, h, Precision::Paired));
        let c = g.add(a, b);
        let out = if keep_x { g.add(x, c) } else { c };
        g.mark_output(out);
        Layer { g, x, norm_out: h }
    };
    let norm_of = |l: &crate::launch::Launch| match l.args {
        Args::Q8pGemv1x(a) => (a.nw, a.eps, a.res),
        Args::Q4kGemv1x(a) => (a.nw, a.eps, a.res),
        ref a => panic!("{a:?}"),
    };
    let ls = launches(&graph(true, GgmlType::Q8_0), None);
    assert_eq!(kernels(&ls), [Q4kGemv1x, Q8pGemv1x, Binary]);
    for l in &ls[..2] {
        let (nw, eps, _) = norm_of(l);
        assert!(nw != 0 && eps == 1e-6, "the norm's weight and eps");
    }
    assert!(norm_of(&ls[1]).2 != 0, "the second product adds the first");
    for (keep_x, ty, want) in [
        (false, GgmlType::Q8_0, vec![RmsNorm, Q4kGemv1x, Q8pGemv1x]),
        (true, GgmlType::F32, vec![RmsNorm, Q4kGemv1x, F32Gemv, Binary]),
    ] {
        let ls = launches(&graph(keep_x, ty), None);
        assert_eq!(kernels(&ls), want, "keep x {keep_x}, {ty}");
        assert_eq!(norm_of(&ls[1]).0, 0, "keep x {keep_x}, {ty}: x arrives normed");
    }
}
