//! Lowering: the nodes of one split become a list of kernel launches. This is
//! where fusions happen, because only here are the consumers of every node
//! known:
//!
//! * `rms_norm` followed by `mul` with its weight becomes one kernel, which
//!   also quantizes the result to int8 when a ternary matmul reads it;
//! * consecutive ternary matmuls of one input (q/k/v, gate/up) share one GEMV
//!   launch and one quantization;
//! * a matmul whose only reader is the `add` that follows writes the sum
//!   itself (the residual connections);
//! * the ropes of q and k that only an attention reads go with the cache
//!   store into one launch, and at one token into the attention itself.
//!
//! Also fused: gate/up with its activation in one GEMV, and for prompts
//! act(gate)·up formed inside the quantization that reads it (the product
//! never goes to memory). A fused kernel that reads one node while writing
//! another checks that their bytes do not overlap (the arena reuses dead
//! tensors' bytes).
//!
//! On sm_90 the prompt GEMM is `ternary_gemm_wg` (`kernels/ternary_wgmma.cu`):
//! a producer warp's bulk tensor copies (`tma.rs`) fill four shared-memory
//! stages on mbarriers, and three or two consumer warpgroups, whichever costs
//! fewer rounds of blocks over the SMs, decode codes into A fragments and
//! multiply with `wgmma`, with no block barrier. Feeding the tensor cores is
//! what bounds it, not the cores: `wgmma` on fixed operands, A from registers
//! or shared memory, runs several times the GEMM's rate. Elsewhere, or with
//! `CudaOptions::wgmma` off, the mma.sync GEMM takes 256-row tiles; where a
//! matrix has a scale per 256-chunk, 128-row tiles on every device.

use std::collections::{HashMap, HashSet};

use tern_backend::TensorLoc;
use tern_graph::{DType, Graph, NodeId, Op};

use crate::args::{
    Act, BinOp, BinaryArgs, CopyInArgs, GatedActArgs, GetRowsArgs, GetRowsQ6KArgs, GetRowsQ8Args, RmsNormArgs,
    ScaleArgs, TernaryGemmArgs, TernaryGemmWgArgs, TernaryGemvArgs,
};
use crate::buffers::Buffers;
use crate::decode::CacheSpan;
use crate::kernels::Kernel;
use crate::launch::{Launch, TernaryBatch, TernaryMat};
use crate::qlayout::QLayout;
use crate::tma::{MatrixMap, Swizzle};
use crate::Weight;

mod attention;
mod experts;
mod fmat;
mod mla;
mod mla_prep;
mod quant;
mod route;
pub(crate) use fmat::is_q6k_q8;
pub(crate) use mla::supports as mla_supports;
pub(crate) use route::supports as route_supports;

/// Tokens above which ternary products use the tensor-core GEMM.
pub const GEMV_MAX_TOKENS: usize = 8;
/// The largest `k_pad` of `ternary_gemv1_pair`: each lane fetches two
/// chunks of a row, 8 chunks apart: 16 chunks of 256.
const PAIR_MAX_K_PAD: usize = 4096;
/// Tokens per `fmat_gemv` launch.
const FMAT_TOKENS: usize = 8;

/// levels_mma.cu's block: `MMA_ROWS` rows, k in whole chunks of `MMA_K`,
/// three stages (`MMA_STAGES`) of `MmaStage` in shared memory.
const MMA_ROWS: usize = 64;
const MMA_COLS: usize = 64;
const MMA_K: usize = 64;
const MMA_SMEM: usize = 3 * (3 * 64 * 80 + 6 * 64 * 16);
/// Rows a block of the prompt GEMM computes: one scale a row, and a scale
/// per 256-chunk (`ternary_gemm` and `ternary_gemm_grouped`); 32 tokens each.
const GEMM_ROWS: usize = 256;
const GEMM_ROWS_GROUPED: usize = 128;
const GEMM_TOKENS: usize = 32;
/// The prompt GEMM on wgmma (`ternary_gemm_wg*`, sm_90a): a block
/// multiplies 64 rows a consumer warpgroup by WG_TOKENS tokens, with
/// `stages` chunks of both operands in shared memory.
const WG_TOKENS: usize = 128;
#[derive(Clone, Copy)]
struct WgShape {
    kernel: Kernel,
    warpgroups: usize,
    stages: usize,
    /// A block's time, relative: an SM runs one block of either shape at a
    /// time, and three warpgroups, sharing each stage's levels, take less
    /// than the rows' ratio of two's time (fitted costs, not 3:2).
    block_cost: usize,
}
/// Three consumer warpgroups, or two: each GEMM takes the shape whose
/// rounds of blocks over the SMs cost less (`WgShape::rounds_cost`).
const WG_WIDE: WgShape = WgShape { kernel: Kernel::TernaryGemmWg, warpgroups: 3, stages: 4, block_cost: 5 };
const WG_NARROW: WgShape = WgShape { kernel: Kernel::TernaryGemmWgNarrow, warpgroups: 2, stages: 5, block_cost: 4 };

impl WgShape {
    fn rows(self) -> usize {
        64 * self.warpgroups
    }
    /// `blocks` of this shape on `sms` SMs: rounds of one block an SM, times
    /// a block's cost. A grid a little past the SMs pays a whole round (at
    /// 1,024 tokens ffn_down's 160 two-warpgroup blocks take two rounds of
    /// 132 SMs where 112 three-warpgroup ones take one).
    fn rounds_cost(self, blocks: usize, sms: usize) -> usize {
        blocks.div_ceil(sms) * self.block_cost
    }
    /// The consumer warpgroups and the producer warp.
    fn threads(self) -> u32 {
        128 * self.warpgroups as u32 + 32
    }
    /// A stage holds the chunk's levels (256 bytes a token) and codes (64
    /// bytes a row); then 1 KiB for the mbarriers and 1 KiB to align the
    /// stages.
    fn smem(self) -> usize {
        self.stages * (WG_TOKENS * 256 + self.rows() * 64) + 2048
    }
}

/// Scratch memory one lowering needs beyond the graph's own tensors.
#[derive(Clone, Copy, Debug, Default)]
pub struct Scratch {
    pub base: u64,
    pub cap: usize,
    pub counters: u64,
    pub counters_cap: usize,
    /// The ring that staged weights stream into.
    pub stage_base: u64,
    pub stage_cap: usize,
}

/// Smallest staging ring: several weights' worth, so a copy rarely waits on
/// the matmul before it to free its slot.
const STAGE_MIN: usize = 64 << 20;

/// What a lowering ran out of; the caller grows it and lowers again.
#[derive(Debug)]
pub enum Need {
    Workspace(usize),
    Counters(usize),
    Staging(usize),
    Error(String),
}

/// A quantized activation in the workspace.
#[derive(Clone, Copy)]
struct Quant {
    q: u64,
    d: u64,
    lsum: u64,
    k_pad: usize,
}

pub struct Lowered {
    pub launches: Vec<Launch>,
    /// The longest span of the one-token attentions (`decode::cache_span`).
    pub span: CacheSpan,
}

struct Lower<'a> {
    graph: &'a Graph,
    locs: &'a [Option<TensorLoc>],
    bufs: &'a Buffers,
    uses: Vec<u32>,
    /// The nodes that read each node.
    readers: Vec<Vec<NodeId>>,
    scratch: Scratch,
    ws_used: usize,
    counters_used: usize,
    /// Next free byte of the staging ring, and the most one launch streams.
    stage_used: usize,
    stage_need: usize,
    quant: HashMap<NodeId, Quant>,
    /// Activations quantized by `act_q8` (node, block shift) → (q, d).
    acts: HashMap<(NodeId, i32), (u64, u64)>,
    /// Each router output's pairs grouped by expert, made once.
    moe_plans: HashMap<(NodeId, usize), experts::MoePlan>,
    /// Normed rows that no launch writes: the head that reads them norms
    /// its input itself.
    head_norm: HashMap<NodeId, fmat::HeadNorm>,
    /// Rope nodes left for the attention that reads them (fused with its cache store).
    deferred_rope: Vec<NodeId>,
    /// Nodes whose work an earlier fused launch did (MLA's columns, norm
    /// and ropes): they get no launch of their own.
    absorbed: HashSet<NodeId>,
    /// Latent attentions whose cache rows `mla_kv_store` already wrote.
    stored: HashSet<NodeId>,
    in_split: Vec<bool>,
    /// Multiprocessors of the device, for kernels whose blocks walk rows.
    sms: usize,
    /// Prompt GEMMs on wgmma (`ternary_gemm_wg`): an sm_90 device.
    wgmma: bool,
    span: CacheSpan,
    out: Vec<Launch>,
}

/// `ternary_gemm_wg*`'s launch: the batch `b` over `grid`, and the tensor
/// maps its copies read: the levels of `q` in boxes of 128 bytes ×
/// WG_TOKENS tokens (128-byte swizzle), each matrix's codes in 64 bytes ×
/// the block's rows (64-byte swizzle); the unused map slots repeat the
/// first.
fn wg_gemm(shape: WgShape, b: TernaryBatch, q: Quant, n_tok: usize, grid: (u32, u32, u32)) -> Result<Launch, Need> {
    let map = |ptr, row_bytes: usize, rows, box_bytes, box_rows: usize, swizzle| {
        let m = MatrixMap { ptr, row_bytes: row_bytes as u64, rows, box_bytes, box_rows: box_rows as u32, swizzle };
        m.check().map(|()| m).map_err(|e| Need::Error(e.to_string()))
    };
    let codes = |k: usize| {
        let m = &b.m[if k < b.n as usize { k } else { 0 }];
        map(m.w, q.k_pad / 4, m.rows as u64, 64, shape.rows(), Swizzle::B64)
    };
    let args = TernaryGemmWgArgs {
        b,
        tq: map(q.q, q.k_pad, n_tok as u64, 128, WG_TOKENS, Swizzle::B128)?,
        tw0: codes(0)?,
        tw1: codes(1)?,
        tw2: codes(2)?,
        k_pad: q.k_pad as i32,
        d: q.d,
        lsum: q.lsum,
        n_tok: n_tok as i32,
    };
    Ok(Launch::new(shape.kernel, grid, shape.threads(), args).smem(shape.smem()))
}

fn fail<T>(m: impl Into<String>) -> Result<T, Need> {
    Err(Need::Error(m.into()))
}

pub fn lower(
    graph: &Graph,
    nodes: &[NodeId],
    locs: &[Option<TensorLoc>],
    bufs: &Buffers,
    scratch: Scratch,
    sms: usize,
    wgmma: bool,
) -> Result<Lowered, Need> {
    let mut uses = vec![0u32; graph.nodes.len()];
    let mut readers = vec![Vec::new(); graph.nodes.len()];
    for id in graph.ids() {
        for s in &graph.node(id).srcs {
            uses[s.index()] += 1;
            readers[s.index()].push(id);
        }
    }
    for o in &graph.outputs {
        uses[o.index()] += 1;
    }
    let mut in_split = vec![false; graph.nodes.len()];
    for n in nodes {
        in_split[n.index()] = true;
    }
    let mut l = Lower {
        graph,
        locs,
        bufs,
        uses,
        readers,
        scratch,
        ws_used: 0,
        counters_used: 0,
        stage_used: 0,
        stage_need: 0,
        quant: HashMap::new(),
        acts: HashMap::new(),
        moe_plans: HashMap::new(),
        head_norm: HashMap::new(),
        deferred_rope: Vec::new(),
        absorbed: HashSet::new(),
        stored: HashSet::new(),
        in_split,
        sms,
        wgmma,
        span: CacheSpan::Short,
        out: Vec::with_capacity(nodes.len()),
    };
    let mut i = 0;
    while i < nodes.len() {
        i += l.node(nodes, i)?;
    }
    if l.ws_used > scratch.cap {
        return Err(Need::Workspace(l.ws_used));
    }
    if l.counters_used > scratch.counters_cap {
        return Err(Need::Counters(l.counters_used));
    }
    if l.stage_need > scratch.stage_cap {
        return Err(Need::Staging((2 * l.stage_need).max(STAGE_MIN)));
    }
    Ok(Lowered { launches: l.out, span: l.span })
}

fn grid1(n: usize, per: usize) -> (u32, u32, u32) {
    (n.div_ceil(per).clamp(1, 65535 * 16) as u32, 1, 1)
}

impl Lower<'_> {
    fn ptr(&self, n: NodeId) -> Result<u64, Need> {
        let Some(loc) = self.locs[n.index()] else { return fail(format!("node {} has no location", n.0)) };
        match self.bufs.get(loc.buffer) {
            Some(b) => Ok(b.ptr + loc.offset as u64),
            None => fail(format!("node {} is in a buffer this device does not have", n.0)),
        }
    }

    /// Whether two nodes' bytes intersect. The memory plan lets a tensor
    /// reuse the bytes of one that died at the step before, so a fused kernel
    /// that reads an earlier node while writing a later one must check.
    fn overlaps(&self, a: NodeId, b: NodeId) -> bool {
        match (self.locs[a.index()], self.locs[b.index()]) {
            (Some(x), Some(y)) => {
                x.buffer == y.buffer && x.offset < y.offset + y.nbytes && y.offset < x.offset + x.nbytes
            }
            _ => true,
        }
    }

    fn weight(&self, n: NodeId) -> Option<&Weight> {
        let loc = self.locs[n.index()]?;
        self.bufs.get(loc.buffer)?.weight.as_ref()
    }

    /// Scratch bytes, 256-aligned; past the capacity only the size is counted.
    fn take(&mut self, bytes: usize) -> u64 {
        let off = self.ws_used;
        self.ws_used = (off + bytes).next_multiple_of(256);
        self.scratch.base + off as u64
    }

    /// Streams the staged weights among `ws` into the staging ring (one
    /// copy launch each) and returns them as device-resident weights. All of
    /// one launch's weights sit in the ring at once; the launches around the
    /// copies are serial, so a slot is reused only after its reader finished.
    fn stream_in(&mut self, ws: &mut [&mut Weight]) {
        let total: usize = ws.iter().filter_map(|w| w.staged).sum();
        if total == 0 {
            return;
        }
        self.stage_need = self.stage_need.max(total);
        if self.stage_used + total > self.scratch.stage_cap {
            self.stage_used = 0;
        }
        for w in ws.iter_mut() {
            let Some(bytes) = w.staged else { continue };
            let slot = self.scratch.stage_base + self.stage_used as u64;
            self.stage_used = (self.stage_used + bytes).next_multiple_of(256);
            let n16 = bytes / 16;
            let blocks = n16.div_ceil(1024).clamp(1, 1024) as u32;
            let args = CopyInArgs { src: w.ptr_codes, dst: slot, n16: n16 as u64 };
            let l = Launch::new(Kernel::CopyIn, (blocks, 1, 1), 256, args).serial();
            self.out.push(l);
            w.ptr_scales = slot + (w.ptr_scales - w.ptr_codes);
            w.ptr_codes = slot;
            w.staged = None;
        }
    }

    fn node_ref(&self, id: NodeId) -> &tern_graph::Node {
        self.graph.node(id)
    }

    /// Lowers `nodes[i]` (and any nodes fused into it); returns how many were consumed.
    fn node(&mut self, nodes: &[NodeId], i: usize) -> Result<usize, Need> {
        let id = nodes[i];
        if self.absorbed.contains(&id) {
            return Ok(1);
        }
        let node = self.node_ref(id).clone();
        match &node.op {
            Op::Weight(_) | Op::Input(_) | Op::KvCache { .. } => Ok(1),
            Op::Columns { .. } if self.mla_kv_store(id)? || self.mla_q_split(id)? => Ok(1),
            Op::Columns { width, start, len } => self.columns(id, *width, *start, *len).map(|()| 1),
            Op::MulMatHeads { .. } => self.mul_mat_heads(id).map(|()| 1),
            Op::LatentAttention(p) => self.latent_attention(id, p).map(|()| 1),
            Op::MulMatId { .. } | Op::MoeUpGate { .. } => self.expert_product(id),
            Op::Route(p) => self.route(nodes, i, p),
            Op::RouteWeights(p) => self.route_weights(id, p),
            Op::ExpertSum => self.expert_sum(id),
            Op::RmsNorm { eps } => self.rms_norm(nodes, i, *eps),
            Op::HeadNorm { eps, head_dim } => {
                // The heads of a contiguous row are rows of `head_dim`: the
                // norm kernel with its weight, a block per head.
                let rows = node.n_elements() / head_dim;
                let (x, w, y) = (self.ptr(node.srcs[0])?, self.ptr(node.srcs[1])?, self.ptr(id)?);
                let args = RmsNormArgs { x, w, y, ne0: *head_dim as i32, eps: *eps };
                let l = Launch::new(Kernel::RmsNorm, (rows as u32, 1, 1), 128, args);
                self.out.push(l);
                Ok(1)
            }
            Op::MulMat { .. } => self.mul_mat(nodes, i),
            Op::GetRows if self.weight(node.srcs[0]).is_some_and(|w| w.quant.is_some()) => {
                let w = self.weight(node.srcs[0]).cloned().expect("checked by the guard");
                let (k, ids, out) = (node.ne[0] as i32, self.ptr(node.srcs[1])?, self.ptr(id)?);
                let l = match w.quant {
                    Some(QLayout::Q6K) => {
                        let rows = self.node_ref(node.srcs[0]).ne[1] as i32;
                        let args = GetRowsQ6KArgs { base: w.ptr_codes, rows, k, ids, out };
                        let grid = (node.ne[1] as u32, node.ne[0].div_ceil(256) as u32, 1);
                        Launch::new(Kernel::GetRowsQ6K, grid, 256, args)
                    }
                    _ => {
                        let args = GetRowsQ8Args { q: w.ptr_codes, s: w.ptr_scales, o: w.ptr_offsets, k, ids, out };
                        Launch::new(Kernel::GetRowsQ8, (node.ne[1] as u32, 1, 1), 256, args)
                    }
                };
                self.out.push(l);
                Ok(1)
            }
            Op::GetRows => {
                let table = self.node_ref(node.srcs[0]);
                let DType::Ggml(ty) = table.dtype else { return fail("get_rows on a non-float table") };
                let row_bytes = ty.row_bytes(table.ne[0] as u64).unwrap_or(0);
                let args = GetRowsArgs {
                    table: self.ptr(node.srcs[0])?,
                    row_bytes,
                    ty: ty.id() as i32,
                    ids: self.ptr(node.srcs[1])?,
                    out: self.ptr(id)?,
                    ne0: node.ne[0] as i32,
                };
                let l = Launch::new(Kernel::GetRows, (node.ne[1] as u32, 1, 1), 256, args);
                self.out.push(l);
                Ok(1)
            }
            Op::Mul | Op::Add => {
                let n = node.n_elements();
                let nb = self.node_ref(node.srcs[1]).n_elements();
                let op = if matches!(node.op, Op::Add) { BinOp::Add } else { BinOp::Mul };
                let args = BinaryArgs {
                    a: self.ptr(node.srcs[0])?,
                    b: self.ptr(node.srcs[1])?,
                    out: self.ptr(id)?,
                    n: n as u64,
                    nb: nb as u64,
                    op,
                };
                let l = Launch::new(Kernel::Binary, grid1(n, 256), 256, args);
                self.out.push(l);
                Ok(1)
            }
            Op::Scale { factor } => {
                let n = node.n_elements();
                let args = ScaleArgs { x: self.ptr(node.srcs[0])?, out: self.ptr(id)?, n: n as u64, f: *factor };
                let l = Launch::new(Kernel::Scale, grid1(n, 256), 256, args);
                self.out.push(l);
                Ok(1)
            }
            Op::GatedAct(act) => {
                if let Some(n) = self.gated_into_levels(nodes, i, *act)? {
                    return Ok(n);
                }
                let n = node.n_elements();
                let args = GatedActArgs {
                    gate: self.ptr(node.srcs[0])?,
                    up: self.ptr(node.srcs[1])?,
                    out: self.ptr(id)?,
                    n: n as u64,
                    act: Act::of(*act),
                };
                let l = Launch::new(Kernel::GatedAct, grid1(n, 256), 256, args);
                self.out.push(l);
                Ok(1)
            }
            Op::Rope(_) if self.rope_feeds_attention(id) => {
                self.deferred_rope.push(id);
                Ok(1)
            }
            Op::Rope(_) => {
                self.rope(id)?;
                Ok(1)
            }
            Op::Attention(p) => {
                self.attention(id, &node, p)?;
                Ok(1)
            }
        }
    }

    /// A matmul's output and residual: when the only reader of `mm` is the
    /// next node, an `add` of it and a same-shaped tensor, write the sum.
    fn residual(&self, mm: NodeId, next: Option<NodeId>) -> Result<Option<(NodeId, u64)>, Need> {
        let Some(a) = next else { return Ok(None) };
        let an = self.node_ref(a);
        if !matches!(an.op, Op::Add) || self.uses[mm.index()] != 1 || !an.srcs.contains(&mm) {
            return Ok(None);
        }
        let other = if an.srcs[0] == mm { an.srcs[1] } else { an.srcs[0] };
        if other == mm || self.node_ref(other).ne != an.ne {
            return Ok(None);
        }
        Ok(Some((a, self.ptr(other)?)))
    }

    fn mul_mat(&mut self, nodes: &[NodeId], i: usize) -> Result<usize, Need> {
        let id = nodes[i];
        let node = self.node_ref(id).clone();
        let Some(w) = self.weight(node.srcs[0]).cloned() else { return fail("mul_mat weight is not on this device") };
        let x = node.srcs[1];
        let n_tok = node.ne[1];
        let Some(t) = w.ternary else {
            return self.fmat(nodes, i, &w);
        };
        let q = match self.quant.get(&x) {
            Some(q) => *q,
            None => {
                let xn = self.node_ref(x).clone();
                let xp = self.ptr(x)?;
                let q = self.quantize(xp, 0, 0, xn.ne[0], xn.n_rows(), false, 0.0);
                self.quant.insert(x, q);
                q
            }
        };
        // Gather the run of matmuls that read the same input (at most three).
        let mut group = vec![(id, w.clone())];
        while group.len() < 3 {
            let Some(&j) = nodes.get(i + group.len()) else { break };
            let jn = self.node_ref(j);
            let same = matches!(jn.op, Op::MulMat { .. }) && jn.srcs[1] == x;
            match self.weight(jn.srcs[0]).filter(|_| same) {
                Some(wj) if wj.ternary.is_some_and(|tj| tj.k_pad == t.k_pad) => group.push((j, wj.clone())),
                _ => break,
            }
        }
        let streamed = group.iter().any(|(_, w)| w.staged.is_some());
        {
            let mut ws: Vec<&mut Weight> = group.iter_mut().map(|(_, w)| w).collect();
            self.stream_in(&mut ws);
        }
        let mut consumed = group.len();
        // gate/up read only by the activation that follows: one launch writes act(gate) * up.
        let pair = match (&group[..], nodes.get(i + 2)) {
            ([(g, wg), (u, wu)], Some(&a)) if n_tok <= GEMV_MAX_TOKENS => {
                let an = self.node_ref(a);
                let same_rows = wg.ternary.map(|t| t.rows) == wu.ternary.map(|t| t.rows);
                match an.op {
                    Op::GatedAct(act)
                        if an.srcs == [*g, *u]
                            && self.uses[g.index()] == 1
                            && self.uses[u.index()] == 1
                            && same_rows =>
                    {
                        Some((a, Act::of(act)))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let mut mats = Vec::with_capacity(group.len());
        for (gi, (mm, wm)) in group.iter().enumerate() {
            let tm = wm.ternary.expect("grouped only ternary weights");
            let last = gi + 1 == group.len();
            let fused =
                if last && pair.is_none() { self.residual(*mm, nodes.get(i + consumed).copied())? } else { None };
            let (out, res) = match fused {
                Some((add, r)) => {
                    consumed += 1;
                    (self.ptr(add)?, r)
                }
                None => (self.ptr(*mm)?, 0),
            };
            mats.push(TernaryMat {
                w: wm.ptr_codes,
                scales: wm.ptr_scales,
                out,
                res,
                rows: tm.rows as i32,
                groups: tm.groups as i32,
            });
        }
        if let Some((act, _)) = pair {
            mats[0].out = self.ptr(act)?;
            consumed += 1;
        }
        // The wgmma shape, when the GEMM is one.
        let mut wg = None;
        let (kernel, rows_per_block, covered, grid_y, threads) =
            if n_tok == 1 && pair.is_some() && q.k_pad <= PAIR_MAX_K_PAD {
                (Kernel::TernaryGemv1Pair, 16, 1, 1, 256)
            } else if n_tok <= GEMV_MAX_TOKENS {
                let kernel = if n_tok == 1 { Kernel::TernaryGemv1 } else { Kernel::TernaryGemv };
                // In pair mode the blocks cover the first matrix; each warp does both rows.
                (kernel, 8, if pair.is_some() { 1 } else { mats.len() }, 1, 256)
            } else if mats.iter().all(|m| m.groups == 1) {
                // The copy engine reads 16-byte aligned matrices (the
                // workspace and weights are; anything else takes mma.sync).
                if self.wgmma && q.q % 16 == 0 && mats.iter().all(|m| m.w % 16 == 0) {
                    let grid_y = n_tok.div_ceil(WG_TOKENS);
                    let blocks = |s: WgShape| mats.iter().map(|m| (m.rows as usize).div_ceil(s.rows())).sum::<usize>();
                    let cost = |s: WgShape| s.rounds_cost(blocks(s) * grid_y, self.sms);
                    let s = if cost(WG_WIDE) <= cost(WG_NARROW) { WG_WIDE } else { WG_NARROW };
                    wg = Some(s);
                    (s.kernel, s.rows(), mats.len(), grid_y, s.threads())
                } else {
                    // A warp a 32-row slice of the block: as many threads as rows.
                    (Kernel::TernaryGemm, GEMM_ROWS, mats.len(), n_tok.div_ceil(GEMM_TOKENS), GEMM_ROWS as u32)
                }
            } else {
                let rows = GEMM_ROWS_GROUPED;
                (Kernel::TernaryGemmGrouped, rows, mats.len(), n_tok.div_ceil(GEMM_TOKENS), rows as u32)
            };
        let mut b = TernaryBatch { n: mats.len() as i32, ..Default::default() };
        let mut blocks = 0;
        for (k, m) in mats.iter().enumerate() {
            b.m[k] = *m;
            b.block_start[k] = blocks;
            if k < covered {
                blocks += (m.rows as usize).div_ceil(rows_per_block) as i32;
            }
        }
        b.block_start[mats.len()] = blocks;
        let l = if let Some(shape) = wg {
            wg_gemm(shape, b, q, n_tok, (blocks as u32, grid_y as u32, 1))?
        } else {
            let (k_pad, n_tok) = (q.k_pad as i32, n_tok as i32);
            let grid = (blocks as u32, grid_y as u32, 1);
            if matches!(kernel, Kernel::TernaryGemm | Kernel::TernaryGemmGrouped) {
                let args = TernaryGemmArgs { b, k_pad, q: q.q, d: q.d, lsum: q.lsum, n_tok };
                Launch::new(kernel, grid, threads, args)
            } else {
                let pair_act = pair.map_or(Act::None, |(_, a)| a);
                let args = TernaryGemvArgs { b, k_pad, q: q.q, d: q.d, lsum: q.lsum, n_tok, pair_act };
                Launch::new(kernel, grid, threads, args)
            }
        };
        self.out.push(if streamed { l.serial() } else { l });
        Ok(consumed)
    }
}
