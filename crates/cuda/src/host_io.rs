//! Host memory the device reaches: pinned ranges with their device
//! addresses, and the copies a split does at its edges inside its own work
//! (`Backend::compute_io`).

use tern_backend::{HostIo, HostSpan, Result};

use crate::kernels::Kernel;
use crate::launch::Launch;
use crate::CudaBackend;

/// A pinned host range and the device's address of it.
#[derive(Clone, Copy)]
pub(crate) struct PinnedHost {
    pub host: usize,
    pub len: usize,
    pub dev: u64,
}

impl PinnedHost {
    /// The device's address of `span`, when it lies inside this range.
    fn dev_addr(&self, span: HostSpan) -> Option<u64> {
        let inside = span.addr >= self.host && span.addr + span.len <= self.host + self.len;
        inside.then(|| self.dev + (span.addr - self.host) as u64)
    }
}

/// Copies at most this large, in whole 16-byte words, run inside a split's
/// work when zero-copy is on.
pub(crate) const ZERO_COPY_MAX: usize = 256 << 10;

impl CudaBackend {
    /// The device's address of host bytes inside a pinned range.
    pub(crate) fn pinned_addr(&self, span: HostSpan) -> Option<u64> {
        self.pinned.iter().find_map(|p| p.dev_addr(span))
    }

    /// A small copy between device memory and mapped host memory as an entry
    /// of a launch list (imports run as DMA copy nodes, exports as a copy
    /// kernel), so that it is captured with the split's kernels. `None` when
    /// the copy is large or not in whole, aligned 16-byte words.
    pub(crate) fn copy_kernel(&self, kernel: Kernel, src: u64, dst: u64, bytes: usize) -> Option<Launch> {
        let words = self.copies_inside(src | dst, bytes);
        let n16 = bytes / 16;
        // One 16-byte word per thread, for the copy kernel of exports.
        let grid = (n16.div_ceil(256).max(1) as u32, 1, 1);
        // Serial: the copy must see its producer finished, and its consumer
        // may not overwrite what it reads.
        words.then(|| Launch::new(kernel, grid, 256).ptr(src).ptr(dst).u64(n16 as u64).serial())
    }

    /// Whether a copy of `bytes` between addresses whose bits OR to `addrs`
    /// can be part of a split's work.
    pub(crate) fn copies_inside(&self, addrs: u64, bytes: usize) -> bool {
        self.zero_copy && bytes <= ZERO_COPY_MAX && (addrs | bytes as u64).is_multiple_of(16)
    }

    /// The launches of `io`'s imports and exports, in that order.
    pub(crate) fn io_launches(&self, io: &HostIo) -> Result<(Vec<Launch>, Vec<Launch>)> {
        let bad = |what: &str| self.dev_err(format!("{what} copy outside pinned host memory or not in 16-byte words"));
        let mut imports = Vec::with_capacity(io.imports.len());
        for &(span, loc) in &io.imports {
            let (src, dst) = (self.pinned_addr(span).ok_or_else(|| bad("import"))?, self.loc_ptr(loc)?);
            imports.push(self.copy_kernel(Kernel::HostRead, src, dst, span.len).ok_or_else(|| bad("import"))?);
        }
        let mut exports = Vec::with_capacity(io.exports.len());
        for &(loc, span) in &io.exports {
            let (src, dst) = (self.loc_ptr(loc)?, self.pinned_addr(span).ok_or_else(|| bad("export"))?);
            exports.push(self.copy_kernel(Kernel::HostWrite, src, dst, span.len).ok_or_else(|| bad("export"))?);
        }
        Ok((imports, exports))
    }
}
