//! Fusing decoding launches into one persistent kernel (`kernels/decode.cu`).
//!
//! After lowering, each run of one-token launches that `decode_run` knows
//! (`norm_quant` of one row, `ternary_gemv1`, `ternary_gemv1_pair`, one-token
//! `attention`) becomes a table of phases and a single launch; the other
//! launches (embedding rows, the head) stay as they are. A `norm_quant`
//! whose levels only the GEMV right after it reads is folded into that GEMV:
//! every block quantizes the input itself.
//!
//! The pass reads the launches' argument structs (`args.rs`); those of
//! `norm_quant` and `attention` are also the table's records of their
//! phases.
//!
//! `decode_run` (sm_90, on by default there; `CudaOptions::fused_decode`)
//! runs one 256-thread block per SM through the table's phases behind grid
//! barriers: a counter each block adds to once (`red.release`) and polls
//! (`ld.acquire`); a launch count in the table's header gives each launch its
//! targets. One counter, because counters spread over several lines cost the
//! same and a flag a block that one warp polls costs more; the release fence
//! is much of the barrier's cost, but it is what publishes the rows written
//! before it. Every spin wait traps after two seconds, so a bug fails the
//! launch instead of hanging the GPU. Phases with a scale per chunk, rows over
//! 8192 or more than 256 rows a block stay launches.
//!
//! - *Weights never depend on activations.* The table holds a `Copy` record per
//!   GEMV phase; thread 32 of each block refills a ring of shared memory with
//!   the block's rows of the coming phases by bulk copies on one mbarrier a
//!   phase, while thread 0 waits at the barrier.
//! - *A row's writer leaves what its reader's norm needs.* A phase that writes a
//!   whole row also leaves each block's (Σx², max |x·w|) for the next norm's
//!   weight w in the header (`link_stats` picks these phases), so the next
//!   GEMV norms and quantizes with no block reduction (partials summed in a
//!   fixed order) and a float rsqrt.
//! - *Rows on tensor cores*, in tiles of 16 with m16n8k32 fragments; each 2-bit
//!   plane is accumulated apart and summed exactly at the end.
//! - *Attention as a block per q head and chunk of keys* (`att_head`). Caches
//!   past `LONG_CACHE_KEYS` (448) are cut into chunks merged by the last block
//!   of a KV group; from `GROUP_CACHE_KEYS` (2,048) keys with 2, 4 or 8 q heads
//!   a KV head, a block takes the whole group (`decode_attention_kv.cu`). Each
//!   path is its own module (`decode`, `decode_long`, `decode_grouped`), picked
//!   by the step's `CacheSpan`; the plan key counts the span.
//!   `CudaOptions::fuse_trace` prints where each phase kind spends its time.

use tern_quant::GgmlType;

use crate::args::{Act, Args, AttentionArgs, DecodeRunArgs, FusedMode, NormQuantArgs, TernaryGemvArgs};
use crate::kernels::Kernel;
use crate::launch::{Arg, Launch, TernaryBatch};

/// `struct NqArgs` in decode_table.cu: `norm_quant`'s arguments for one row.
const _: () = assert!(std::mem::size_of::<NormQuantArgs>() == 64);

/// `struct GemvArgs`: a ternary GEMV phase (an attention phase uses its
/// statistics fields alone).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GemvArgs {
    pub b: TernaryBatch,
    pub nq: NormQuantArgs,
    /// The next norm's weight, for the statistics this phase leaves (0: an
    /// unweighted norm).
    pub stat_w: u64,
    pub fused: FusedMode,
    /// Not `None`: (gate, up) pairs with this activation.
    pub pair_act: Act,
    /// Virtual rows: pairs, or the batch's rows end to end.
    pub rows: i32,
    pub k_pad: i32,
    /// ≥ 0: each block leaves (Σ out², max |out · stat_w|) of its rows in
    /// this slot of the table's header, for the norm of the next phase.
    pub stat_out: i32,
    pub stat_in: i32,
}
const _: () = assert!(std::mem::size_of::<GemvArgs>() == 240);

impl Default for GemvArgs {
    fn default() -> Self {
        GemvArgs {
            b: TernaryBatch::default(),
            nq: NormQuantArgs::default(),
            stat_w: 0,
            fused: FusedMode::Levels,
            pair_act: Act::None,
            rows: 0,
            k_pad: 0,
            stat_out: -1,
            stat_in: -1,
        }
    }
}

/// `struct AttArgs` in attention.cu: `attention`'s arguments.
const _: () = assert!(std::mem::size_of::<AttentionArgs>() == 136);

#[repr(i32)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PhaseKind {
    /// `norm_quant` of one row into global memory, by one block.
    #[default]
    NormQuant = 0,
    Gemv = 1,
    Attention = 2,
}

/// `struct Phase`: one step of a fused run. No padding anywhere, so a table
/// is uploaded as its bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Phase {
    pub kind: PhaseKind,
    /// Attention phases: 1 runs it as a block per (q head, chunk of keys) (`att_head`).
    pub att_block: i32,
    pub g: GemvArgs,
    pub a: AttentionArgs,
}
const _: () = assert!(std::mem::size_of::<Phase>() == 384);

/// `struct Copy`: what the producer of `decode_run`'s weight ring needs of
/// a GEMV phase. The table holds one per GEMV phase, in order, after the
/// phases.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Copy {
    pub w: [u64; 3],
    pub rows: [i32; 3],
    pub n: i32,
    /// Virtual rows (pairs, or the matrices' rows end to end).
    pub vrows: i32,
    pub k_pad: i32,
    /// 1: (gate, up) pairs, read from w[0] and w[1].
    pub pair: i32,
    pub pad: i32,
}
const _: () = assert!(std::mem::size_of::<Copy>() == 56);

impl Copy {
    fn of(g: &GemvArgs) -> Copy {
        let n = (g.b.n as usize).min(3);
        let mut c = Copy {
            n: n as i32,
            vrows: g.rows,
            k_pad: g.k_pad,
            pair: (g.pair_act != Act::None) as i32,
            ..Default::default()
        };
        for (i, m) in g.b.m[..n].iter().enumerate() {
            c.w[i] = m.w;
            c.rows[i] = m.rows;
        }
        c
    }
}

fn copies(phases: &[Phase]) -> Vec<Copy> {
    phases.iter().filter(|p| p.kind == PhaseKind::Gemv).map(|p| Copy::of(&p.g)).collect()
}

/// `decode_run`'s block size, warps, descriptor ring and head_dim bound
/// (DEC_THREADS, DEC_WARPS_MAX, DEC_RING, DEC_MAX_HEAD_DIM in decode.cu);
/// longer heads keep the standalone attention.
pub const THREADS: u32 = 256;
const WARPS: usize = 8;
const RING: usize = 6;
const MAX_HEAD_DIM: usize = 128;
/// Blocks the statistics slots have room for (STAT_BLOCKS).
pub const STAT_BLOCKS: usize = 1024;
/// The longest row a writer leaves weighted by the next norm (ROW_MAX).
const ROW_MAX: usize = 8192;
/// In front of each table: the barrier words (64 u32), two statistics slots
/// of STAT_BLOCKS (f32, f32), and two weighted rows of ROW_MAX f32.
pub const HEADER_BYTES: usize = 256 + 2 * STAT_BLOCKS * 8 + 2 * ROW_MAX * 4;
/// The longest rows a fused GEMV takes (what a thread quantizes in
/// registers, NQS_WORDS · 4 · THREADS).
const MAX_K_PAD: i32 = 8192;
/// The most rows of a GEMV one block takes (a thread finishes each; 16
/// tiles of 16, MMA_ITEMS / 2 for pairs).
const MAX_BLOCK_ROWS: usize = 256;
/// Slack for aligning the weight ring to 128 bytes.
const RING_ALIGN: usize = 128;
/// Shorter runs stay as launches: a run of two gains little over PDL.
const MIN_PHASES: usize = 4;

/// How the backend runs `decode_run`.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// One per SM: every block must be resident at once.
    pub blocks: u32,

    /// Phase descriptors each block loads ahead into shared memory (≤ 4).
    pub look: i32,
    /// Dynamic shared memory a block may have and still be resident.
    pub smem_max: usize,
    /// Device memory (`private_cap` bytes, 0 if none) where an attention
    /// output may be moved when the projection after it writes over it (see
    /// `phases_at`); one row of it serves every layer in turn.
    pub private: u64,
    pub private_cap: usize,
    /// The most shared memory the weight ring may take (0: all there is):
    /// what a block leaves unused is L1 cache, which attention reads through.
    pub ring_max: usize,
    /// How many keys this step's attention reads: which module the launch
    /// runs.
    pub span: CacheSpan,
}

/// Keys past which `att_head` cuts a cache into chunks of at least
/// `ATH_CHUNK_MIN` (256, decode_attention.cu), and steps run
/// `DecodeRunLong`. Below, one block a q head walks the whole cache: a
/// cache that short costs less read in one pass than cut and merged.
pub const LONG_CACHE_KEYS: usize = 448;
/// Keys from which a block takes a KV head's whole group of q heads
/// (decode_attention_kv.cu), and steps run `DecodeRunGrouped`. Below, a
/// block per q head and chunk: there the grouped merge of more chunks costs
/// more than reading each row once saves.
pub const GROUP_CACHE_KEYS: usize = 2048;

/// How far back a decoding step's attention reads, in the three ranges
/// whose attention code `decode_run` is built three times for: each
/// module holds only its own, as the code of another, even unused, costs
/// registers, and registers cost speed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CacheSpan {
    /// Up to LONG_CACHE_KEYS keys (or no one-token attention): a block a
    /// q head.
    #[default]
    Short,
    /// More: the cache cut into chunks, a block per q head and chunk.
    Chunked,
    /// GROUP_CACHE_KEYS keys or more with 2, 4 or 8 q heads a KV head: a
    /// block per KV head and chunk, for the group's q heads together.
    Grouped,
}

/// The span of an attention of `n_tok` tokens (one token: a decoding step,
/// the attention `decode_run` takes): the lowering's report and the plan
/// key both ask this.
pub fn cache_span(p: &tern_graph::AttentionParams, n_tok: usize) -> CacheSpan {
    let keys = p.kv_pos + n_tok;
    let group = p.n_head / p.n_head_kv.max(1);
    if n_tok != 1 || keys <= LONG_CACHE_KEYS {
        CacheSpan::Short
    } else if keys >= GROUP_CACHE_KEYS && p.n_head == group * p.n_head_kv && matches!(group, 2 | 4 | 8) {
        CacheSpan::Grouped
    } else {
        CacheSpan::Chunked
    }
}

/// The launches with each fused run as one `decode_run` launch, and the
/// phase table of each such launch by its index. The backend uploads each
/// table and gives its launch the addresses (`bind`).
pub struct Fused {
    pub launches: Vec<Launch>,
    pub tables: Vec<(usize, Vec<Phase>)>,
}

/// u64 stamps per (phase, block) in a trace (TR_SLOTS in decode.cu).
pub const TRACE_SLOTS: usize = 8;

/// What `TERN_CUDA_FUSE_TRACE=1` prints for one traced run: `trace` holds
/// [phase][block] TRACE_SLOTS nanoseconds: start, input quantized, done,
/// input staged, weights ready, rows done, ring refilled, and in phase 0
/// the kernel's entry. Each column is
/// the last block's stamp less the last block's stamp before it (the first
/// start for "stage"), so a phase's columns add up to its time; "starts
/// over" is how far apart the blocks began it, "refill" how long the ring's
/// producer ran past the phase's end, and "barrier" the gap from the last
/// block done to the next phase's first start. Averaged over phases of one
/// kind and size.
pub fn trace_summary(phases: &[Phase], blocks: usize, trace: &[u64]) -> Vec<String> {
    const START: usize = 0;
    const QUANT: usize = 1;
    const DONE: usize = 2;
    const STAGED: usize = 3;
    const READY: usize = 4;
    const ROWS: usize = 5;
    const ISSUED: usize = 6;
    const COLUMNS: [&str; 8] = ["starts over", "stage", "sync", "weights", "rows", "stats", "refill", "barrier"];
    let at = |p: usize, b: usize, i: usize| trace[(p * blocks + b) * TRACE_SLOTS + i];
    let first = |p: usize, i: usize| (0..blocks).map(|b| at(p, b, i)).min().unwrap_or(0);
    let last = |p: usize, i: usize| (0..blocks).map(|b| at(p, b, i)).max().unwrap_or(0);
    let us = |a: u64, b: u64| b.saturating_sub(a) as f64 / 1e3;
    let mut rows: Vec<(String, usize, [f64; 8])> = Vec::new();
    for (p, ph) in phases.iter().enumerate() {
        let (start, done) = (first(p, START), last(p, DONE));
        let next = if p + 1 < phases.len() { first(p + 1, START) } else { done };
        let t = if ph.kind == PhaseKind::Gemv {
            let (staged, quant, ready, rows_done) = (last(p, STAGED), last(p, QUANT), last(p, READY), last(p, ROWS));
            let folded = ph.g.fused != FusedMode::Levels;
            let staged = if folded { staged } else { start };
            let quant = if folded { quant } else { start };
            [
                us(start, last(p, START)),
                us(start, staged),
                us(staged, quant),
                us(quant, ready),
                us(ready, rows_done),
                us(rows_done, done),
                us(done, last(p, ISSUED)),
                us(done, next),
            ]
        } else if ph.kind == PhaseKind::Attention && ph.att_block == 1 {
            // att_head stamps its q/k/v staged and its keys done.
            let (staged, keys) = (last(p, STAGED), last(p, ROWS));
            [
                us(start, last(p, START)),
                us(start, staged),
                0.0,
                0.0,
                us(staged, keys),
                us(keys, done),
                us(done, last(p, ISSUED)),
                us(done, next),
            ]
        } else {
            [us(start, last(p, START)), 0.0, 0.0, 0.0, us(start, done), 0.0, us(done, last(p, ISSUED)), us(done, next)]
        };
        let label = match ph.kind {
            PhaseKind::Gemv => {
                format!(
                    "gemv {} rows k {}{}",
                    ph.g.rows,
                    ph.g.k_pad,
                    if ph.g.pair_act != Act::None { " pairs" } else { "" }
                )
            }
            PhaseKind::Attention => "attention".to_string(),
            PhaseKind::NormQuant => "norm_quant".to_string(),
        };
        match rows.iter_mut().find(|r| r.0 == label) {
            Some(r) => {
                r.1 += 1;
                (0..8).for_each(|i| r.2[i] += t[i]);
            }
            None => rows.push((label, 1, t)),
        }
    }
    const ENTRY: usize = 7;
    let (entry, end) = (first(0, ENTRY), last(phases.len() - 1, DONE));
    let mut out = vec![format!(
        "  entry to the first phase {:.2} µs, first phase to the last done {:.2} µs",
        us(entry, first(0, START)),
        us(first(0, START), end)
    )];
    out.push(format!("  {:<30} {:>6} {}", "phase (µs each)", "count", COLUMNS.map(|c| format!("{c:>11}")).join("")));
    out.extend(rows.iter().map(|(l, n, t)| {
        let n = *n as f64;
        format!("  {l:<30} {n:>6} {}", t.map(|v| format!("{:>11.2}", v / n)).join(""))
    }));
    out
}

/// A table as `decode_run` reads it: the phases, then their Copy records.
pub fn table_bytes(phases: &[Phase]) -> Vec<u8> {
    let copies = copies(phases);
    // SAFETY: Phase and Copy are repr(C) plain data without padding (the size asserts above).
    let (p, c) = unsafe {
        (
            std::slice::from_raw_parts(phases.as_ptr() as *const u8, std::mem::size_of_val(phases)),
            std::slice::from_raw_parts(copies.as_ptr() as *const u8, std::mem::size_of_val(copies.as_slice())),
        )
    };
    [p, c].concat()
}

/// One row's `norm_quant`.
fn norm_quant(l: &Launch) -> Option<NormQuantArgs> {
    match l.args {
        Args::NormQuant(a) if l.grid == (1, 1, 1) && !l.serial => Some(a),
        _ => None,
    }
}

/// A one-token GEMV reading its levels from global memory.
fn gemv(l: &Launch) -> Option<GemvArgs> {
    let Args::TernaryGemv(TernaryGemvArgs { b, k_pad, q, d, lsum, n_tok, pair_act }) = l.args else { return None };
    if !matches!(l.kernel, Kernel::TernaryGemv1 | Kernel::TernaryGemv1Pair) || l.serial || n_tok != 1 {
        return None;
    }
    let n = (b.n as usize).min(3);
    let rows = if pair_act != Act::None { b.m[0].rows } else { b.m[..n].iter().map(|m| m.rows).sum() };
    // decode_run's tiles take rows with one scale (per-chunk scales stay
    // launches), at most MAX_BLOCK_ROWS a block.
    if k_pad > MAX_K_PAD || b.m[..n].iter().any(|m| m.groups != 1) {
        return None;
    }
    let nq = NormQuantArgs { q, d, lsum, k_pad, ..Default::default() };
    Some(GemvArgs { b, nq, pair_act, rows, k_pad, ..Default::default() })
}

/// A one-token attention that `decode_run`'s units can take.
fn attention(l: &Launch) -> Option<AttentionArgs> {
    let Args::Attention(a) = l.args else { return None };
    if l.grid.1 != 1 || l.serial {
        return None;
    }
    let group = (a.n_head / a.n_head_kv.max(1)) as usize;
    let fits = a.n_head_kv > 0 && (1..=WARPS).contains(&group) && a.head_dim as usize <= MAX_HEAD_DIM;
    fits.then_some(a)
}

fn disjoint(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a + a_len <= b || b + b_len <= a
}

/// Whether every block may quantize `nq`'s row itself while the GEMV `g`
/// writes its outputs: no output (nor the f32 copy `y`, written by block 0)
/// may land on a row another block is still reading.
fn can_fold(nq: &NormQuantArgs, g: &GemvArgs) -> bool {
    let x = (nq.x, 4 * nq.ne0 as u64);
    let n = if g.pair_act != Act::None { 1 } else { (g.b.n as usize).min(3) };
    let mut writes: Vec<(u64, u64)> = g.b.m[..n].iter().map(|m| (m.out, 4 * m.rows as u64)).collect();
    let reads: Vec<(u64, u64)> = g.b.m[..n].iter().filter(|m| m.res != 0).map(|m| (m.res, 4 * m.rows as u64)).collect();
    if nq.y != 0 {
        let y = (nq.y, x.1);
        if !reads.iter().chain(&writes).all(|r| disjoint(y.0, y.1, r.0, r.1)) {
            return false;
        }
        writes.push(y);
    }
    nq.k_pad == g.k_pad && writes.iter().all(|w| disjoint(x.0, x.1, w.0, w.1))
}

/// Whether any launch from `from` on reads pointer `p` (directly, or through
/// a tensor map based there).
fn read_later(launches: &[Launch], from: usize, p: u64) -> bool {
    let reads = |a: &Arg| match a {
        Arg::Ptr(v) => *v == p,
        Arg::Map(m) => m.ptr == p,
        _ => false,
    };
    launches[from..].iter().any(|l| l.params().iter().any(reads))
}

/// The phases of launches[i..] that one step of the walk takes, and how
/// many launches they cover; `None` when launch i is not fusable. `prev` is
/// the run's last phase so far.
fn phases_at(launches: &[Launch], i: usize, prev: Option<&mut Phase>, cfg: &Config) -> Option<(Phase, usize)> {
    let l = &launches[i];
    if let Some(a) = attention(l) {
        return Some((Phase { kind: PhaseKind::Attention, a, ..Default::default() }, 1));
    }
    if let Some(g) = gemv(l) {
        return Some((Phase { kind: PhaseKind::Gemv, g, ..Default::default() }, 1));
    }
    let mut nq = norm_quant(l)?;
    let alone = Phase { kind: PhaseKind::NormQuant, g: GemvArgs { nq, ..Default::default() }, ..Default::default() };
    let Some(mut g) =
        launches.get(i + 1).and_then(gemv).filter(|g| g.nq.q == nq.q && !read_later(launches, i + 2, nq.q))
    else {
        return Some((alone, 1));
    };
    if !can_fold(&nq, &g) {
        // The memory plan put the projection's output on its input, an
        // attention output nothing else reads (the 2B-4T's O projection):
        // the attention writes to the private row instead.
        let overwritten = g.b.m[..(g.b.n as usize).min(3)].iter().any(|m| m.out == nq.x && m.rows == nq.ne0);
        let room = cfg.private != 0 && 4 * nq.ne0 as usize <= cfg.private_cap;
        match prev {
            Some(p) if p.kind == PhaseKind::Attention && p.a.out == nq.x && overwritten && room => {
                let moved = NormQuantArgs { x: cfg.private, ..nq };
                if !can_fold(&moved, &g) {
                    return Some((alone, 1));
                }
                p.a.out = cfg.private;
                nq = moved;
            }
            _ => return Some((alone, 1)),
        }
    }
    g.nq = nq;
    g.fused = FusedMode::Block;
    Some((Phase { kind: PhaseKind::Gemv, g, ..Default::default() }, 2))
}

/// Dynamic shared memory `decode_run` needs for `phases` before its weight
/// ring (its layout), the ring's alignment slack included.
fn smem_fixed(phases: &[Phase], span: CacheSpan) -> usize {
    let (ne0, k_pad) = staged_sizes(phases);
    let n_copies = phases.iter().filter(|p| p.kind == PhaseKind::Gemv).count();
    let fixed = RING * std::mem::size_of::<Phase>()
        + 4 * ne0.next_multiple_of(4)
        + k_pad
        + k_pad / 16
        + 4 * att_floats(phases, span)
        + n_copies * std::mem::size_of::<Copy>();
    fixed + RING_ALIGN
}

/// decode_run's `ne0_max` and `k_pad_max`: the longest row a block stages as
/// floats (norms with block reductions, lone norm phases) and the longest
/// input of levels it holds in shared memory.
fn staged_sizes(phases: &[Phase]) -> (usize, usize) {
    let (mut ne0, mut k_pad) = (0usize, 0usize);
    for p in phases {
        match p.kind {
            PhaseKind::Gemv => {
                if p.g.fused == FusedMode::Block {
                    ne0 = ne0.max(p.g.nq.ne0 as usize);
                }
                k_pad = k_pad.max(p.g.k_pad as usize);
            }
            PhaseKind::NormQuant => ne0 = ne0.max(p.g.nq.ne0 as usize),
            _ => {}
        }
    }
    (ne0, k_pad)
}

/// The bytes of weights block `blk` of `blocks` copies into its ring for a
/// GEMV phase (decode.cu's block_rows and segment_bytes).
fn segment_bytes(g: &GemvArgs, blk: usize, blocks: usize) -> usize {
    let rows = g.rows.max(0) as usize;
    let per = rows.div_ceil(blocks);
    let r0 = (blk * per).min(rows);
    let r1 = (r0 + per).min(rows);
    (r1 - r0) * (g.k_pad as usize / 4) * if g.pair_act != Act::None { 2 } else { 1 }
}

/// The largest segment any block copies for `phases`.
fn max_segment(phases: &[Phase], blocks: usize) -> usize {
    phases.iter().filter(|p| p.kind == PhaseKind::Gemv).map(|p| segment_bytes(&p.g, 0, blocks)).max().unwrap_or(0)
}

/// Gives each fused GEMV whose input row the phase before it writes whole
/// (a GEMV with one output, or an attention) the statistics of that row and
/// the row times its norm weight: the writer leaves them in slot `i % 2`,
/// and the GEMV quantizes from them with no block reductions and no norm
/// weight to read. Two slots, so that a phase's writers never
/// overwrite what its own readers still read.
fn link_stats(phases: &mut [Phase]) {
    for i in 1..phases.len() {
        let (before, after) = phases.split_at_mut(i);
        let (prev, cur) = (&mut before[i - 1], &mut after[0]);
        let nq = cur.g.nq;
        let aligned = nq.ne0 % 4 == 0 && nq.ne0 as usize <= ROW_MAX;
        if cur.kind != PhaseKind::Gemv || cur.g.fused != FusedMode::Block || !aligned {
            continue;
        }
        let writes_row = match prev.kind {
            PhaseKind::Gemv => {
                let single = prev.g.pair_act != Act::None || prev.g.b.n == 1;
                let m = &prev.g.b.m[0];
                single && m.out == nq.x && m.rows == nq.ne0
            }
            PhaseKind::Attention => prev.a.out == nq.x && prev.a.n_head * prev.a.head_dim == nq.ne0,
            PhaseKind::NormQuant => false,
        };
        if writes_row {
            let slot = ((i - 1) % 2) as i32;
            prev.g.stat_out = slot;
            prev.g.stat_w = nq.w;
            cur.g.fused = FusedMode::Stats;
            cur.g.stat_in = slot;
        }
    }
}

/// Floats of scratch `att_head` needs for heads of `d` dims: q, the new k
/// and v as f16, and each of 8 warps' max, sum and V sums.
fn att_head_floats(d: usize) -> usize {
    d + d + 2 * 8 + 8 * d
}

/// Marks the one-token attentions that `att_head` (a block per q head and chunk of keys) can
/// take: rope applied in the kernel, f16 caches, head_dim a multiple of 32
/// up to 128 (a quad of lanes splits a K row in whole 16-byte words).
fn block_attention(phases: &mut [Phase]) {
    let f16 = GgmlType::F16.id() as i32;
    for p in phases.iter_mut().filter(|p| p.kind == PhaseKind::Attention) {
        let a = &p.a;
        let (g, d) = ((a.n_head / a.n_head_kv.max(1)) as usize, a.head_dim as usize);
        let fits = a.r.on != 0
            && a.k_type == f16
            && a.v_type == f16
            && d % 32 == 0
            && d <= MAX_HEAD_DIM
            && g >= 1
            && g * a.n_head_kv as usize == a.n_head as usize;
        if fits {
            p.att_block = 1;
        }
    }
}

/// Chunks a KV head's cache may be cut into on the grouped path (AKV_MAX_CHUNKS).
const KV_MAX_CHUNKS: usize = 128;

/// Floats of scratch the grouped path (decode_attention_kv.cu, with `g` = 2,
/// 4 or 8 q heads a KV head) needs for heads of `d` dims: q of the group,
/// the new k and v as f16, each of 8 warps' max, sum and V sums of each
/// head; and what its merge of up to `n_split` chunks needs.
fn att_kv_floats(g: usize, d: usize, n_split: usize) -> Option<usize> {
    let units = g * d + d + 2 * 8 * g + 8 * g * d;
    let merge = 2 * g * n_split.min(KV_MAX_CHUNKS) + g;
    matches!(g, 2 | 4 | 8).then_some(units.max(merge))
}

/// decode_run's `att_floats`: the attention region, the units' q heads or
/// the largest `att_head` scratch (the grouped path's, where the launch
/// runs its module).
fn att_floats(phases: &[Phase], span: CacheSpan) -> usize {
    let block = phases.iter().filter(|p| p.kind == PhaseKind::Attention && p.att_block == 1).map(|p| {
        let (d, g) = (p.a.head_dim as usize, (p.a.n_head / p.a.n_head_kv.max(1)) as usize);
        let kv = if span == CacheSpan::Grouped { att_kv_floats(g, d, p.a.n_split.max(0) as usize) } else { None };
        kv.unwrap_or(0).max(att_head_floats(d))
    });
    block.fold(WARPS * MAX_HEAD_DIM, usize::max).next_multiple_of(4)
}

/// The positions tensor every attention of a run reads (0 if none or
/// several): `decode_run` reads it once.
fn shared_pos(phases: &[Phase]) -> u64 {
    let mut pos = phases.iter().filter(|p| p.kind == PhaseKind::Attention).map(|p| p.a.pos);
    match pos.next() {
        Some(first) if pos.all(|p| p == first) => first,
        _ => 0,
    }
}

fn fused_launch(phases: &[Phase], cfg: &Config) -> Option<Launch> {
    // The ring takes the rest of what a block may have, and must hold the
    // largest segment (decode.cu would wait for it forever).
    let fixed = smem_fixed(phases, cfg.span);
    let mut ring = cfg.smem_max.saturating_sub(fixed) / 16 * 16;
    if cfg.ring_max > 0 {
        ring = ring.min(cfg.ring_max / 16 * 16);
    }
    let blocks = cfg.blocks as usize;
    let rows_fit = phases
        .iter()
        .all(|p| p.kind != PhaseKind::Gemv || (p.g.rows.max(0) as usize).div_ceil(blocks) <= MAX_BLOCK_ROWS);
    if phases.len() < MIN_PHASES || ring < max_segment(phases, blocks) || blocks > STAT_BLOCKS || !rows_fit {
        return None;
    }
    let (ne0, k_pad) = staged_sizes(phases);
    let kernel = match cfg.span {
        CacheSpan::Short => Kernel::DecodeRun,
        CacheSpan::Chunked => Kernel::DecodeRunLong,
        CacheSpan::Grouped => Kernel::DecodeRunGrouped,
    };
    let args = DecodeRunArgs {
        phases: None,
        n: phases.len() as i32,
        bar: None,
        look: cfg.look,
        ne0_max: ne0 as i32,
        k_pad_max: k_pad as i32,
        trace: 0,
        pos: shared_pos(phases),
        ring_cap: ring as u32,
        n_copies: copies(phases).len() as i32,
        // The barrier's poll backoff in ns (none: a backoff only delays each
        // block's wake-up).
        spin_ns: 0,
        att_floats: att_floats(phases, cfg.span) as i32,
        // Bytes a block's producer may copy at one barrier beyond the next
        // GEMV phase's own (no limit: limiting it did not help).
        refill: 0,
    };
    Some(Launch::new(kernel, (cfg.blocks, 1, 1), THREADS, args).smem(fixed + ring))
}

/// Gives fused launch `l` its table, uploaded at `table` (the header, then
/// the phases), and where a traced run leaves its stamps.
pub fn bind(l: &mut Launch, table: u64, trace: Option<u64>) {
    let Args::DecodeRun(a) = &mut l.args else { panic!("{:?} is not a decode_run launch", l.kernel) };
    a.phases = Some(table + HEADER_BYTES as u64);
    a.bar = Some(table);
    a.trace = trace.unwrap_or(0);
}

/// Replaces each run of fusable launches by one `decode_run` launch.
pub fn fuse(launches: Vec<Launch>, cfg: &Config) -> Fused {
    let mut out = Fused { launches: Vec::with_capacity(launches.len()), tables: Vec::new() };
    let mut i = 0;
    while i < launches.len() {
        let start = i;
        let mut phases: Vec<Phase> = Vec::new();
        while let Some((p, n)) = (i < launches.len()).then(|| phases_at(&launches, i, phases.last_mut(), cfg)).flatten()
        {
            phases.push(p);
            i += n;
        }
        link_stats(&mut phases);
        block_attention(&mut phases);
        match fused_launch(&phases, cfg) {
            Some(l) => {
                out.tables.push((out.launches.len(), phases));
                out.launches.push(l);
            }
            None => {
                // Too short or too big: the launches as lowered, and the one that ended the run.
                let end = if i == start { i + 1 } else { i };
                out.launches.extend_from_slice(&launches[start..end]);
                i = end;
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "decode_tests.rs"]
mod tests;
