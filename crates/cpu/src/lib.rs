//! The CPU backend: host buffers (owned, or aliases of the mmapped model
//! file) and kernels by op family. Kernels here are the plain scalar versions;
//! the per-format dot products come from `tern-quant`.

mod buffer;
mod calibrate;
pub mod isa;
pub mod kernels;
mod ops;
pub mod pool;

use tern_backend::{
    Backend, BackendId, BufferId, Error, HostBytes, LoadedWeight, OpProfile, Result, TensorLoc, WeightDesc,
};
use tern_graph::{DType, Graph, Node, NodeId, Op};
use tern_quant::ternary::rows::Packing;
use tern_quant::GgmlType;

pub use calibrate::Rates;

use buffer::{Buffers, Storage};
pub use isa::Isa;
use kernels::ternary::{Base3Decode, PackedTernary};
use pool::Pool;

/// Options of [`CpuBackend::with_options`]. The library reads no
/// environment; the CLI fills this from its table (`docs/environment.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Threads that compute (the caller's included).
    pub threads: usize,
    /// The highest ISA level kernels may use (`None`: the best detected).
    pub isa: Option<Isa>,
}

pub struct CpuBackend {
    id: BackendId,
    pool: Pool,
    isa: Isa,
    buffers: Buffers,
    profile: Option<OpProfile>,
}

impl CpuBackend {
    /// A CPU backend named `id` (`CPU`, `CPU1`, ...) computing on `n_threads`
    /// threads with the best kernels the processor has.
    pub fn new(id: BackendId, n_threads: usize) -> CpuBackend {
        CpuBackend::with_options(id, &CpuOptions { threads: n_threads, isa: None })
    }

    /// A CPU backend named `id` with `opts` (see `isa::active`).
    pub fn with_options(id: BackendId, opts: &CpuOptions) -> CpuBackend {
        let isa = isa::active(opts.isa);
        CpuBackend { id, pool: Pool::new(opts.threads), isa, buffers: Buffers::default(), profile: None }
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }
}

/// The in-memory layout a ternary file type is repacked into. Both layouts
/// hold the same trits, so results do not depend on the choice. Where
/// base-3 bytes decode by table lookups (AVX-512 VBMI) fast enough to keep
/// up with memory, every file goes to 1.6 bits: a token then reads 20% fewer
/// weight bytes. Elsewhere 1.6-bit files stay 1.6-bit and the rest become 2-bit.
/// Bytes a whole pass over a weight reads on a CPU backend of ISA level
/// `isa` (`None`: the machine's): the repacked layout of a ternary matrix
/// (rows of packed codes and an f32 scale per row, the case of a per-row or
/// per-tensor scale, which BitNet files have; per-block scales add a few
/// per row), else the file's `file_bytes`, which the kernels read in place.
pub fn weight_read_bytes(ty: GgmlType, ne: [usize; 4], file_bytes: u64, isa: Option<Isa>) -> u64 {
    let isa = isa.unwrap_or_else(Isa::detected).min(Isa::detected());
    if !ty.is_ternary() || ne[2] != 1 || ne[3] != 1 {
        return file_bytes;
    }
    let layout = tern_quant::ternary::rows::Layout::new(packing(ty, isa), ne[0], true);
    (ne[1] as u64).saturating_mul(layout.row_bytes as u64 + 4)
}

pub fn packing(ty: GgmlType, isa: Isa) -> Packing {
    let lookups = isa == Isa::Avx512 && Base3Decode::best() == Base3Decode::Lookup;
    match ty {
        GgmlType::TQ1_0 | GgmlType::IQ1_BN => Packing::Base3,
        _ if lookups => Packing::Base3,
        _ => Packing::Bits2,
    }
}

impl Backend for CpuBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn supports(&self, node: &Node, srcs: &[&Node]) -> bool {
        let f32_only = |ns: &[&Node]| ns.iter().all(|n| n.dtype == DType::F32);
        // A multi-sequence attention's last source: i32 sequence starts.
        let seqs = |at: usize| srcs.get(at).is_none_or(|n| n.dtype == DType::I32);
        match &node.op {
            Op::Weight(_) | Op::Input(_) | Op::KvCache { .. } => true,
            Op::GetRows | Op::MulMat { .. } => matches!(srcs.first().map(|n| n.dtype), Some(DType::Ggml(_))),
            Op::Rope(_) => f32_only(&srcs[..1]),
            Op::Attention(_) => {
                let cache = |n: &Node| matches!(n.dtype, DType::Ggml(GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0));
                f32_only(&srcs[..3]) && srcs[3..5].iter().all(|n| cache(n)) && seqs(6)
            }
            Op::RmsNorm { .. } | Op::HeadNorm { .. } | Op::Mul | Op::Add | Op::Scale { .. } | Op::GatedAct(_) => {
                f32_only(srcs)
            }
            Op::Columns { .. } | Op::ExpertSum => f32_only(srcs),
            Op::MulMatHeads { .. } => matches!(srcs[0].dtype, DType::Ggml(_)) && f32_only(&srcs[1..]),
            Op::LatentAttention(_) => {
                let cache = |n: &Node| matches!(n.dtype, DType::Ggml(GgmlType::F32 | GgmlType::F16 | GgmlType::Q8_0));
                f32_only(&srcs[..4]) && cache(srcs[4]) && seqs(6)
            }
            Op::Route(_) => f32_only(srcs),
            Op::RouteWeights(_) => f32_only(&srcs[..1]) && srcs[1].dtype == DType::I32,
            Op::MulMatId { .. } => matches!(srcs[0].dtype, DType::Ggml(_)) && f32_only(&srcs[1..2]),
            Op::MoeUpGate { .. } => {
                srcs[..2].iter().all(|n| matches!(n.dtype, DType::Ggml(_))) && f32_only(&srcs[2..3])
            }
        }
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId> {
        self.buffers.alloc(bytes).ok_or(Error::OutOfMemory { backend: self.id, bytes })
    }

    fn free(&mut self, buffer: BufferId) {
        self.buffers.free(buffer);
    }

    fn load_weight(&mut self, bytes: HostBytes, desc: WeightDesc) -> Result<LoadedWeight> {
        let nbytes = bytes.as_slice().len();
        let is_matrix = desc.ne[2] == 1 && desc.ne[3] == 1;
        let (storage, aliases_host) = if desc.ty.is_ternary() && is_matrix {
            // Repacked once into the kernels' layout; the file bytes are no longer read.
            let (k, rows) = (desc.ne[0], desc.ne[1]);
            (
                Storage::Ternary(PackedTernary::new(desc.ty, bytes.as_slice(), k, rows, packing(desc.ty, self.isa))),
                false,
            )
        } else {
            (Storage::Host(bytes), true)
        };
        let buffer = self.buffers.insert(storage);
        Ok(LoadedWeight { loc: TensorLoc { buffer, offset: 0, nbytes }, aliases_host })
    }

    fn write(&mut self, dst: TensorLoc, data: &[u8]) -> Result<()> {
        let id = self.id;
        let bytes = self.buffers.bytes_mut(dst).ok_or_else(|| bad_loc(id, dst))?;
        bytes.copy_from_slice(&data[..dst.nbytes]);
        Ok(())
    }

    fn read(&self, src: TensorLoc, out: &mut [u8]) -> Result<()> {
        let bytes = self.buffers.bytes(src).ok_or_else(|| bad_loc(self.id, src))?;
        out[..src.nbytes].copy_from_slice(bytes);
        Ok(())
    }

    fn host_bytes(&self, loc: TensorLoc) -> Option<&[u8]> {
        self.buffers.bytes(loc)
    }

    fn host_bytes_mut(&mut self, loc: TensorLoc) -> Option<&mut [u8]> {
        self.buffers.bytes_mut(loc)
    }

    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> Result<()> {
        // A readback split (a device's outputs copied to this host) has no
        // nodes: nothing to count readers for, every decoded token.
        if nodes.is_empty() {
            return Ok(());
        }
        let cx = ops::Ctx { pool: &self.pool, isa: self.isa, acts: Default::default() };
        let readers = readers(graph);
        let mut i = 0;
        while i < nodes.len() {
            let id = nodes[i];
            let node = graph.node(id);
            let view = |n: NodeId| -> Result<ops::Tensor> {
                let loc = locs[n.index()].ok_or_else(|| unbound(self.id, n))?;
                if let Some(packed) = self.buffers.packed(loc) {
                    return Ok(ops::Tensor { ptr: std::ptr::null_mut(), node: graph.node(n), packed: Some(packed) });
                }
                let ptr = self.buffers.ptr(loc).ok_or_else(|| bad_loc(self.id, loc))?;
                Ok(ops::Tensor { ptr, node: graph.node(n), packed: None })
            };
            let start = self.profile.as_ref().map(|_| std::time::Instant::now());
            // An RMS norm whose only reader is the next node, a multiply by
            // one weight row: both in one pass, written where the multiply's
            // result goes (the norm's own bytes are never read).
            let fused = nodes.get(i + 1).map(|&m| (m, graph.node(m))).filter(|(_, m)| {
                matches!(node.op, Op::RmsNorm { .. })
                    && matches!(m.op, Op::Mul)
                    && m.srcs[0] == id
                    && readers[id.index()] == 1
                    && graph.node(m.srcs[1]).ne == [node.ne[0], 1, 1, 1]
                    && graph.node(m.srcs[1]).dtype == DType::F32
            });
            let fused = match (fused, &node.op) {
                (Some((m, mul)), Op::RmsNorm { eps }) => {
                    let (x, w, dst) = (view(node.srcs[0])?, view(mul.srcs[1])?, view(m)?);
                    // The plan may give the multiply's result the bytes of the
                    // norm's input (its last reader was the norm): a row-wise
                    // pass may write over the row it reads, but over nothing else.
                    let (xs, ds) = (x.ptr as usize, dst.ptr as usize);
                    let apart = xs + x.node.nbytes() <= ds || ds + dst.node.nbytes() <= xs;
                    (apart || xs == ds).then_some((x, w, dst, *eps))
                }
                _ => None,
            };
            if let Some((x, w, dst, eps)) = fused {
                // SAFETY: `dst` is `x` itself or apart from it, and apart from `w`
                // (a weight); nobody else uses them during the op.
                unsafe { ops::rms_norm_mul(&x, &w, eps, dst, &cx) }
                i += 2;
            } else {
                let dst = view(id)?;
                let srcs = node.srcs.iter().map(|&s| view(s)).collect::<Result<Vec<_>>>()?;
                // SAFETY: the memory plan gives every live tensor its own bytes, so
                // `dst` never overlaps a source it reads, and mmapped weights are
                // only read. Caches are written only by the attention op of their layer.
                unsafe { ops::run(node, dst, &srcs, &cx) }
                i += 1;
            }
            if let (Some(p), Some(t)) = (self.profile.as_mut(), start) {
                let ns = t.elapsed().as_nanos() as u64;
                OpProfile::add(&mut p.by_op, node.op.name(), ns);
                if let (Op::MulMat { .. }, Some(w)) = (&node.op, node.srcs.first()) {
                    let label = graph.node(*w).label.as_deref().unwrap_or("?");
                    OpProfile::add(&mut p.by_label, label.trim_end_matches(".weight"), ns);
                }
            }
        }
        Ok(())
    }

    fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(OpProfile::default);
    }

    fn take_profile(&mut self) -> OpProfile {
        self.profile.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

/// How many nodes read each node, the graph's outputs counting as readers.
fn readers(graph: &Graph) -> Vec<u32> {
    let mut n = vec![0u32; graph.ids().count()];
    for id in graph.ids() {
        for s in &graph.node(id).srcs {
            n[s.index()] += 1;
        }
    }
    for o in &graph.outputs {
        n[o.index()] += 1;
    }
    n
}

fn bad_loc(backend: BackendId, loc: TensorLoc) -> Error {
    Error::Device { backend, message: format!("invalid tensor location {loc:?}") }
}

fn unbound(backend: BackendId, n: NodeId) -> Error {
    Error::Device { backend, message: format!("node {} has no location", n.0) }
}
