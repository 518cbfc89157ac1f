//! The CPU backend: host buffers (owned, or aliases of the mmapped model
//! file) and kernels by op family. Kernels here are the plain scalar versions;
//! the per-format dot products come from `tern-quant`.

mod buffer;
pub mod isa;
pub mod kernels;
mod ops;
mod parallel;

use tern_backend::{Backend, BackendId, BufferId, Error, HostBytes, Result, TensorLoc, WeightDesc};
use tern_graph::{DType, Graph, Node, NodeId, Op};

use buffer::{Buffers, Storage};

pub struct CpuBackend {
    id: BackendId,
    n_threads: usize,
    buffers: Buffers,
}

impl CpuBackend {
    /// A CPU backend named `id` (`CPU`, `CPU1`, ...) computing on `n_threads` threads.
    pub fn new(id: BackendId, n_threads: usize) -> CpuBackend {
        CpuBackend { id, n_threads: n_threads.max(1), buffers: Buffers::default() }
    }
}

impl Backend for CpuBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn supports(&self, node: &Node, srcs: &[&Node]) -> bool {
        let f32_only = |ns: &[&Node]| ns.iter().all(|n| n.dtype == DType::F32);
        match &node.op {
            Op::Weight(_) | Op::Input(_) | Op::KvCache { .. } => true,
            Op::GetRows | Op::MulMat { .. } => matches!(srcs.first().map(|n| n.dtype), Some(DType::Ggml(_))),
            Op::Rope(_) => f32_only(&srcs[..1]),
            Op::Attention(_) => f32_only(&srcs[..3]),
            Op::RmsNorm { .. } | Op::Mul | Op::Add | Op::Scale { .. } | Op::GatedAct(_) => f32_only(srcs),
        }
    }

    fn alloc(&mut self, bytes: usize) -> Result<BufferId> {
        self.buffers.alloc(bytes).ok_or(Error::OutOfMemory { backend: self.id, bytes })
    }

    fn free(&mut self, buffer: BufferId) {
        self.buffers.free(buffer);
    }

    fn load_weight(&mut self, bytes: HostBytes, _desc: WeightDesc) -> Result<TensorLoc> {
        let nbytes = bytes.as_slice().len();
        let buffer = self.buffers.insert(Storage::Host(bytes));
        Ok(TensorLoc { buffer, offset: 0, nbytes })
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

    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> Result<()> {
        for &id in nodes {
            let node = graph.node(id);
            let view = |n: NodeId| -> Result<ops::Tensor> {
                let loc = locs[n.index()].ok_or_else(|| unbound(self.id, n))?;
                let ptr = self.buffers.ptr(loc).ok_or_else(|| bad_loc(self.id, loc))?;
                Ok(ops::Tensor { ptr, node: graph.node(n) })
            };
            let dst = view(id)?;
            let srcs = node.srcs.iter().map(|&s| view(s)).collect::<Result<Vec<_>>>()?;
            // SAFETY: the memory plan gives every live tensor its own bytes, so
            // `dst` never overlaps a source it reads, and mmapped weights are
            // only read. Caches are written only by the attention op of their layer.
            unsafe { ops::run(node, dst, &srcs, self.n_threads) }
        }
        Ok(())
    }
}

fn bad_loc(backend: BackendId, loc: TensorLoc) -> Error {
    Error::Device { backend, message: format!("invalid tensor location {loc:?}") }
}

fn unbound(backend: BackendId, n: NodeId) -> Error {
    Error::Device { backend, message: format!("node {} has no location", n.0) }
}
