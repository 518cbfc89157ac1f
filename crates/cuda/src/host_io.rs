//! Host memory the device reaches: pinned ranges with their device
//! addresses, and the copies a split does at its edges inside its own work
//! (`Backend::compute_io`).

use std::borrow::Cow;

use tern_backend::{BufferId, HostIo, HostSpan, Result, TensorLoc};
use tern_graph::{Graph, NodeId, Op};

use crate::args::CopyInArgs;
use crate::kernels::Kernel;
use crate::launch::{Arg, Launch, Step};
use crate::lower::is_q6k_q8;
use crate::CudaBackend;

/// A pinned host range, the device's address of it, and the buffer that
/// aliases it on the device (`Backing::Borrowed`).
#[derive(Clone, Copy)]
pub(crate) struct PinnedHost {
    pub host: usize,
    pub len: usize,
    pub dev: u64,
    pub buffer: BufferId,
}

impl PinnedHost {
    /// The device's address of `span`, when it lies inside this range.
    fn dev_addr(&self, span: HostSpan) -> Option<u64> {
        let inside = span.addr >= self.host && span.addr + span.len <= self.host + self.len;
        inside.then(|| self.dev + (span.addr - self.host) as u64)
    }
}

/// Exports at most this large run as a copy kernel (stores cross the link
/// without waiting for each other); larger ones, and imports, as DMA copies.
const KERNEL_EXPORT_MAX: usize = 64 << 10;

/// Imports at most this large, read only by elementwise ops, are not copied
/// at all: those ops read them from host memory in place, which saves the
/// copy node and its hand-over between the copy engine and the kernels.
const IN_PLACE_MAX: usize = 64 << 10;

/// Which way a copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    ToDevice,
    ToHost,
}

impl CudaBackend {
    /// The device's address of host bytes inside a pinned range.
    pub(crate) fn pinned_addr(&self, span: HostSpan) -> Option<u64> {
        self.pinned.iter().find_map(|p| p.dev_addr(span))
    }

    /// A copy between device memory and mapped host memory as a step of a
    /// plan, so that it can be captured with a split's kernels.
    pub(crate) fn copy_step(&self, dir: Dir, src: u64, dst: u64, bytes: usize) -> Step {
        let words = (src | dst | bytes as u64).is_multiple_of(16);
        if dir == Dir::ToHost && words && bytes <= KERNEL_EXPORT_MAX {
            let n16 = bytes / 16;
            // One 16-byte word per thread. Serial: the copy must see its
            // producer finished, and its consumer may not overwrite what it reads.
            let grid = (n16.div_ceil(256).max(1) as u32, 1, 1);
            let args = CopyInArgs { src, dst, n16: n16 as u64 };
            return Step::Kernel(Launch::new(Kernel::HostWrite, grid, 256, args).serial());
        }
        Step::Dma { src, dst, bytes }
    }

    /// Whether a split's copies to and from these host bytes can be part of
    /// its work.
    pub(crate) fn copies_inside(&self, span: HostSpan) -> bool {
        self.pinned_addr(span).is_some()
    }

    /// The steps of `io`'s imports and exports, in that order.
    pub(crate) fn io_steps(&self, io: &HostIo) -> Result<(Vec<Step>, Vec<Step>)> {
        let bad = |what: &str| self.dev_err(format!("{what} copy outside pinned host memory"));
        let mut imports = Vec::with_capacity(io.imports.len());
        for &(span, loc) in &io.imports {
            let (src, dst) = (self.pinned_addr(span).ok_or_else(|| bad("import"))?, self.loc_ptr(loc)?);
            imports.push(self.copy_step(Dir::ToDevice, src, dst, span.len));
        }
        let mut exports = Vec::with_capacity(io.exports.len());
        for &(loc, span) in &io.exports {
            let (src, dst) = (self.loc_ptr(loc)?, self.pinned_addr(span).ok_or_else(|| bad("export"))?);
            exports.push(self.copy_step(Dir::ToHost, src, dst, span.len));
        }
        Ok((imports, exports))
    }

    /// Takes the copies that the split's ops can do themselves out of `io`,
    /// and points those ops at the host bytes:
    /// * imports of small tensors read only by elementwise ops, which touch
    ///   each element once (a matmul would read its input over the link once
    ///   per block);
    /// * exports of a one-token Q6_K head's output that nothing in the split
    ///   reads (the logits of a decoding step): its launch writes runs of
    ///   128 bytes while it streams the weights, so the link's time hides
    ///   under the head's instead of following it as a DMA copy.
    pub(crate) fn in_place<'a>(
        &self,
        graph: &Graph,
        nodes: &[NodeId],
        locs: &'a [Option<TensorLoc>],
        io: &'a HostIo,
    ) -> (Cow<'a, [Option<TensorLoc>]>, Cow<'a, HostIo>) {
        let host_loc = |span: HostSpan, nbytes: usize| {
            let pin = self.pinned.iter().find(|p| p.dev_addr(span).is_some())?;
            Some(TensorLoc { buffer: pin.buffer, offset: span.addr - pin.host, nbytes })
        };
        let mut imports = Vec::new();
        for (i, &(span, dst)) in io.imports.iter().enumerate() {
            if span.len > IN_PLACE_MAX {
                continue;
            }
            let Some(loc) = host_loc(span, dst.nbytes) else { continue };
            let Some(id) = nodes.iter().flat_map(|&n| &graph.node(n).srcs).find(|s| locs[s.index()] == Some(dst))
            else {
                continue;
            };
            let readers = nodes.iter().map(|&n| graph.node(n)).filter(|n| n.srcs.contains(id));
            if readers.clone().all(|n| matches!(n.op, Op::Add | Op::Mul)) {
                imports.push((i, *id, loc));
            }
        }
        let mut exports = Vec::new();
        for (i, &(src, span)) in io.exports.iter().enumerate() {
            let Some(loc) = host_loc(span, src.nbytes) else { continue };
            let Some(&id) = nodes.iter().find(|n| locs[n.index()] == Some(src)) else { continue };
            let read_here = nodes.iter().any(|&n| graph.node(n).srcs.contains(&id));
            if !read_here && self.is_q6k_head(graph, id, locs) {
                exports.push((i, id, loc));
            }
        }
        if imports.is_empty() && exports.is_empty() {
            return (Cow::Borrowed(locs), Cow::Borrowed(io));
        }
        let mut locs = locs.to_vec();
        let mut io = io.clone();
        for &(i, id, loc) in imports.iter().rev() {
            locs[id.index()] = Some(loc);
            io.imports.remove(i);
        }
        for &(i, id, loc) in exports.iter().rev() {
            locs[id.index()] = Some(loc);
            io.exports.remove(i);
        }
        (Cow::Owned(locs), Cow::Owned(io))
    }

    /// Whether `id` is a head that writes its output in runs (`is_q6k_q8`).
    fn is_q6k_head(&self, graph: &Graph, id: NodeId, locs: &[Option<TensorLoc>]) -> bool {
        let n = graph.node(id);
        let weight = locs[n.srcs[0].index()].and_then(|l| self.buffers.get(l.buffer)).and_then(|b| b.weight.as_ref());
        is_q6k_q8(n, weight)
    }

    /// Whether step `s` reads or writes pinned host memory: its time is the
    /// link's as much as the kernel's, and the profile counts it as a copy.
    pub(crate) fn touches_host(&self, s: &Step) -> bool {
        match s {
            Step::Dma { .. } => true,
            Step::Kernel(l) => {
                l.kernel == Kernel::HostWrite
                    || l.params().iter().any(|a| {
                        let Arg::Ptr(p) = *a else { return false };
                        self.pinned.iter().any(|h| p >= h.dev && p < h.dev + h.len as u64)
                    })
            }
        }
    }
}
