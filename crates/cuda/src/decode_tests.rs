//! `decode.rs` on the host: a BitNet layer's launches become the phases
//! `decode_run` expects, with statistics linked between writers and
//! readers, and what cannot be fused stays launches. No GPU is needed (the
//! pointers are never dereferenced).

use super::*;
use crate::args::{GetRowsArgs, Q8GemvArgs};
use crate::launch::{AttRope, TernaryMat};

const CFG: Config = Config {
    blocks: 132,
    look: 3,
    smem_max: 200 << 10,
    private: 0xf00_0000,
    private_cap: 1 << 16,
    ring_max: 0,
    span: CacheSpan::Short,
};

fn nq(x: u64, q: u64, ne0: i32) -> Launch {
    let (d, lsum, k_pad) = (q + 0x10000, q + 0x20000, (ne0 + 255) / 256 * 256);
    let args = NormQuantArgs { x, w: 0x9000, y: 0, q, d, lsum, ne0, k_pad, norm: 1, eps: 1e-5 };
    Launch::new(Kernel::NormQuant, (1, 1, 1), 1024, args)
}

fn gemv(q: u64, mats: &[(u64, u64, i32)], k_pad: i32, pair_act: Act) -> Launch {
    let mut b = TernaryBatch { n: mats.len() as i32, ..Default::default() };
    for (i, &(out, res, rows)) in mats.iter().enumerate() {
        b.m[i] = TernaryMat { w: 0x100_0000 * (i as u64 + 1), scales: 1, out, res, rows, groups: 1 };
    }
    let kernel = if pair_act != Act::None { Kernel::TernaryGemv1Pair } else { Kernel::TernaryGemv1 };
    let args = TernaryGemvArgs { b, k_pad, q, d: q + 0x10000, lsum: q + 0x20000, n_tok: 1, pair_act };
    Launch::new(kernel, (1, 1, 1), 256, args)
}

/// 20 q heads over 5 KV heads of 128 dims, f16 caches (type 1) in 4
/// splits of 32 keys; the rope done before it.
fn att(q: u64, out: u64) -> Launch {
    let args = AttentionArgs {
        q,
        kc: 0xa000,
        vc: 0xb000,
        pos: 0xc000,
        out,
        part: 0xd000,
        counters: 0xe000,
        n_head: 20,
        n_head_kv: 5,
        head_dim: 128,
        scale: 0.088,
        split: 32,
        n_split: 128,
        k_type: 1,
        v_type: 1,
        r: AttRope::default(),
    };
    Launch::new(Kernel::Attention, (5, 1, 128), 128, args).smem(2048)
}

/// The arguments of `decode_run` launch `l`.
fn run_args(l: &Launch) -> DecodeRunArgs {
    let Args::DecodeRun(a) = l.args else { panic!("{:?} is not decode_run", l.kernel) };
    a
}

/// Launch `l`'s attention arguments, to change.
fn att_args(l: &mut Launch) -> &mut AttentionArgs {
    let Args::Attention(a) = &mut l.args else { panic!("{:?} is not an attention", l.kernel) };
    a
}

/// One BitNet layer as lowering emits it: x at 0x1_0000, then q/k/v,
/// attention out, h; each quantization in its own workspace.
fn layer() -> Vec<Launch> {
    layer_ws(0)
}

/// `layer()` with its quantization workspaces moved by `ws`.
fn layer_ws(ws: u64) -> Vec<Launch> {
    let (q1, q2, q3, q4) = (0x100_0000 + ws, 0x200_0000 + ws, 0x300_0000 + ws, 0x400_0000 + ws);
    vec![
        nq(0x1_0000, q1, 2560),
        gemv(q1, &[(0x2_0000, 0, 2560), (0x3_0000, 0, 640), (0x4_0000, 0, 640)], 2560, Act::None),
        att(0x2_0000, 0x5_0000),
        nq(0x5_0000, q2, 2560),
        gemv(q2, &[(0x6_0000, 0x1_0000, 2560)], 2560, Act::None),
        nq(0x6_0000, q3, 2560),
        gemv(q3, &[(0x7_0000, 0, 6912), (0x8_0000, 0, 6912)], 2560, Act::Relu2),
        nq(0x7_0000, q4, 6912),
        gemv(q4, &[(0x1_0000, 0x6_0000, 2560)], 6912, Act::None),
    ]
}

#[test]
fn a_layer_becomes_five_phases_of_one_launch() {
    let head = Launch::new(Kernel::Q8Gemv1, (1, 1, 1), 256, Q8GemvArgs { q: 0x1_0000, ..Default::default() });
    let mut launches = layer();
    launches.push(head.clone());
    let f = fuse(launches, &CFG);
    assert_eq!(f.launches.len(), 2);
    assert_eq!(f.launches[0].kernel, Kernel::DecodeRun);
    assert_eq!(f.launches[1], head);
    let (at, phases) = &f.tables[0];
    assert_eq!(*at, 0);
    let kinds: Vec<_> = phases.iter().map(|p| p.kind).collect();
    use PhaseKind::*;
    assert_eq!(kinds, [Gemv, Attention, Gemv, Gemv, Gemv]);
    // The first norm reduces in each block (the embedding wrote its
    // row); the others read what the phase before left.
    let fused: Vec<_> = phases.iter().map(|p| p.g.fused).collect();
    use FusedMode::{Block, Levels, Stats};
    assert_eq!(fused, [Block, Levels, Stats, Stats, Stats]);
    let outs: Vec<_> = phases.iter().map(|p| (p.g.stat_out, p.g.stat_in)).collect();
    assert_eq!(outs, [(-1, -1), (1, -1), (0, 1), (1, 0), (-1, 1)], "a writer at phase i uses slot i % 2");
    assert_eq!(phases[1].g.stat_w, 0x9000, "the attention's stats weigh by the next norm");
    assert_eq!(phases[0].g.rows, 2560 + 640 + 640);
    assert_eq!(phases[3].g.rows, 6912, "a pair phase counts pairs");
    assert_eq!(phases[4].g.nq.ne0, 6912);
    let a = run_args(&f.launches[0]);
    assert_eq!(a.n, 5);
    assert_eq!(a.ne0_max, 2560, "ne0_max: only the first norm stages floats");
    assert_eq!(a.k_pad_max, 6912, "k_pad_max");
    assert_eq!((a.phases, a.bar), (None, None), "the table's addresses come with the upload");
    assert_eq!(table_bytes(phases).len(), 5 * 384 + 4 * 56, "the phases, then a Copy per GEMV");
    // Block 0's gate/up rows: 53 pairs of 640-byte rows.
    assert_eq!(max_segment(phases, 132), 53 * 2 * 640);
    let c = copies(phases);
    assert_eq!((c[2].pair, c[2].vrows, c[2].w[1]), (1, 6912, 0x200_0000));
}

/// A step whose cache has passed LONG_CACHE_KEYS runs the module whose
/// attention cuts caches into chunks, and from GROUP_CACHE_KEYS the one
/// that takes a KV head's q heads together; the phases are the same.
#[test]
fn a_long_cache_runs_the_long_module() {
    let short = fuse(layer(), &CFG);
    for (span, kernel) in [(CacheSpan::Chunked, Kernel::DecodeRunLong), (CacheSpan::Grouped, Kernel::DecodeRunGrouped)]
    {
        let long = fuse(layer(), &Config { span, ..CFG });
        assert_eq!(long.launches[0].kernel, kernel);
        assert_eq!(long.tables, short.tables);
    }
}

/// Which module a step's attention picks: by the keys it reads, and the
/// grouped one only for 2, 4 or 8 q heads a KV head.
#[test]
fn cache_spans_follow_keys_and_groups() {
    let p = |kv_pos: usize, n_head: usize, n_head_kv: usize| tern_graph::AttentionParams {
        layer: 0,
        n_head,
        n_head_kv,
        head_dim: 128,
        scale: 0.088,
        kv_pos,
    };
    use CacheSpan::*;
    assert_eq!(cache_span(&p(447, 20, 5), 1), Short);
    assert_eq!(cache_span(&p(448, 20, 5), 1), Chunked);
    assert_eq!(cache_span(&p(2046, 20, 5), 1), Chunked);
    assert_eq!(cache_span(&p(2047, 20, 5), 1), Grouped);
    assert_eq!(cache_span(&p(4000, 32, 32), 1), Chunked, "no grouped q heads");
    assert_eq!(cache_span(&p(4000, 24, 8), 1), Chunked, "groups of 3");
    assert_eq!(cache_span(&p(4000, 64, 8), 1), Grouped);
    assert_eq!(cache_span(&p(4000, 20, 5), 2), Short, "not a decoding step");
}

#[test]
fn an_output_over_the_input_keeps_the_quantization_apart() {
    // The O projection's sum lands on the attention output it reads.
    let mut launches = layer();
    launches[4] = gemv(0x200_0000, &[(0x5_0000, 0x1_0000, 2560)], 2560, Act::None);
    let f = fuse(launches.clone(), &Config { private: 0, ..CFG });
    let kinds: Vec<_> = f.tables[0].1.iter().map(|p| (p.kind, p.g.fused)).collect();
    use PhaseKind::*;
    assert_eq!(kinds[2..4], [(NormQuant, FusedMode::Levels), (Gemv, FusedMode::Levels)]);
    // With a private row the attention writes there and the norm folds.
    let f = fuse(launches, &CFG);
    let phases = &f.tables[0].1;
    assert_eq!(phases.len(), 5);
    assert_eq!(phases[1].a.out, CFG.private);
    assert_eq!((phases[2].g.fused, phases[2].g.nq.x), (FusedMode::Stats, CFG.private));
    assert_eq!(phases[2].g.b.m[0].out, 0x5_0000);
}

#[test]
fn a_ring_too_small_for_a_segment_keeps_the_launches() {
    let launches = layer();
    let tight = Config { smem_max: 40 << 10, ..CFG };
    let f = fuse(launches.clone(), &tight);
    assert!(f.tables.is_empty());
    assert_eq!(f.launches, launches);
}

#[test]
fn rows_written_by_several_matrices_or_elsewhere_carry_no_statistics() {
    let mut launches = layer();
    // The O projection writes somewhere else than gate/up's norm reads.
    launches[4] = gemv(0x200_0000, &[(0x6_4000, 0x1_0000, 2560)], 2560, Act::None);
    let f = fuse(launches, &CFG);
    let p = &f.tables[0].1;
    assert_eq!((p[2].g.stat_out, p[3].g.fused), (-1, FusedMode::Block));
    // Q/K/V write three rows: the attention after reads no norm anyway.
    assert_eq!(p[0].g.stat_out, -1);
}

#[test]
fn levels_read_again_later_are_not_folded() {
    let mut launches = layer();
    launches.push(gemv(0x100_0000, &[(0x9_0000, 0, 100)], 2560, Act::None));
    let f = fuse(launches, &CFG);
    assert_eq!(f.tables[0].1[0].kind, PhaseKind::NormQuant);
}

#[test]
fn short_runs_and_other_kernels_stay_launches() {
    let other = Launch::new(Kernel::GetRows, (1, 1, 1), 256, GetRowsArgs { table: 1, ..Default::default() });
    let launches = vec![other.clone(), nq(0x1_0000, 0x100_0000, 2560), layer()[1].clone(), other.clone()];
    let f = fuse(launches.clone(), &CFG);
    assert!(f.tables.is_empty());
    assert_eq!(f.launches, launches);
    // An attention over several tokens is not fused, and splits the
    // layer into runs of one and three phases, both too short.
    let mut wide = layer();
    wide[2].grid.1 = 4;
    let f = fuse(wide.clone(), &CFG);
    assert_eq!(f.launches, wide);
}

#[test]
fn rows_with_a_scale_per_chunk_stay_launches() {
    // Two layers whose gate/up has a scale per 256-chunk: the tiles take
    // one scale a row, so both gate/up stay launches, with their norms as
    // phases of the runs before them.
    let mut launches = layer();
    launches.extend(layer_ws(0x80_0000));
    for i in [6, 15] {
        let Args::TernaryGemv(TernaryGemvArgs { b, .. }) = &mut launches[i].args else { panic!("a GEMV") };
        b.m[1].groups = 10;
    }
    let f = fuse(launches, &CFG);
    assert_eq!(f.launches.iter().filter(|l| l.kernel == Kernel::TernaryGemv1Pair).count(), 2);
    let kinds: Vec<Vec<_>> = f.tables.iter().map(|(_, p)| p.iter().map(|p| p.kind).collect()).collect();
    use PhaseKind::*;
    assert_eq!(kinds, [vec![Gemv, Attention, Gemv, NormQuant], vec![Gemv, Gemv, Attention, Gemv, NormQuant]]);
    // The down projection's statistics feed the next layer's q/k/v.
    let second = &f.tables[1].1;
    assert_eq!((second[0].g.stat_out, second[1].g.fused), (0, FusedMode::Stats));
}

#[test]
fn block_attention_takes_f16_caches_with_rope_in_the_kernel() {
    let cfg = CFG;
    let mut launches = layer();
    let rope = AttRope { on: 1, n_rot: 128, ..Default::default() };
    att_args(&mut launches[2]).r = rope;
    let f = fuse(launches.clone(), &cfg);
    assert_eq!(f.tables[0].1[1].att_block, 1, "rope on, f16 caches, head_dim 128");
    // Its scratch: q of 128, the new k and v as f16, 8 warps' max, sum and sums.
    assert_eq!(att_floats(&f.tables[0].1, CacheSpan::Short), 128 + 128 + 16 + 8 * 128);
    assert_eq!(run_args(&f.launches[0]).att_floats, 128 + 128 + 16 + 8 * 128);
    // The grouped path's scratch for a group of 4 q heads: the group's q,
    // the new k and v, 8 warps' max and sum a head and V sums.
    let long = fuse(launches.clone(), &Config { span: CacheSpan::Grouped, ..cfg });
    let kv = 4 * 128 + 128 + 2 * 8 * 4 + 8 * 4 * 128;
    assert_eq!(f.tables[0].1[1].a.n_head / f.tables[0].1[1].a.n_head_kv, 4);
    assert_eq!(run_args(&long.launches[0]).att_floats, kv);
    let ring = |f: &Fused| run_args(&f.launches[0]).ring_cap as i32;
    assert_eq!(ring(&f) - ring(&long), 4 * (kv - (128 + 128 + 16 + 8 * 128)), "the ring makes room");
    assert_eq!(run_args(&f.launches[0]).refill, 0, "no cap on the producer's copies at a barrier");
    assert_eq!(att_floats(&fuse(layer(), &cfg).tables[0].1, CacheSpan::Short), 8 * 128, "the units' q heads");
    // Rope done before the attention, or an f32 cache: units.
    let f = fuse(layer(), &cfg);
    assert_eq!(f.tables[0].1[1].att_block, 0);
    att_args(&mut launches[2]).k_type = 0;
    assert_eq!(fuse(launches, &cfg).tables[0].1[1].att_block, 0);
}
