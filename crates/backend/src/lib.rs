//! The backend interface: the one small trait every compute device implements,
//! the names of devices, and the handles for memory they own.
//!
//! A backend owns buffers. The scheduler decides which backend runs which
//! nodes and where every tensor lives (a [`TensorLoc`] in some buffer); the
//! backend only allocates, moves bytes, and computes the nodes it is handed.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;

use tern_graph::{GgmlType, Graph, Node, NodeId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

/// A device name as users write it: `CPU` (= `CPU0`), `CPU1`, `CUDA0`, ...
/// Extra CPU instances exist to test graph splits without a GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BackendId {
    pub kind: BackendKind,
    pub index: u8,
}

impl BackendId {
    pub const CPU: BackendId = BackendId { kind: BackendKind::Cpu, index: 0 };

    pub fn cpu(index: u8) -> BackendId {
        BackendId { kind: BackendKind::Cpu, index }
    }

    pub fn cuda(index: u8) -> BackendId {
        BackendId { kind: BackendKind::Cuda, index }
    }

    /// Host backends read host memory directly (weights can stay mmapped).
    pub fn is_host(self) -> bool {
        self.kind == BackendKind::Cpu
    }
}

impl fmt::Display for BackendId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.kind, self.index) {
            (BackendKind::Cpu, 0) => f.write_str("CPU"),
            (BackendKind::Cpu, i) => write!(f, "CPU{i}"),
            (BackendKind::Cuda, i) => write!(f, "CUDA{i}"),
        }
    }
}

impl FromStr for BackendId {
    type Err = String;

    fn from_str(s: &str) -> Result<BackendId, String> {
        let upper = s.trim().to_ascii_uppercase();
        let (kind, digits) = if let Some(d) = upper.strip_prefix("CUDA") {
            (BackendKind::Cuda, d)
        } else if let Some(d) = upper.strip_prefix("CPU") {
            (BackendKind::Cpu, d)
        } else {
            return Err(format!("unknown backend {s:?}"));
        };
        let index = match (kind, digits) {
            (BackendKind::Cpu, "") => 0,
            (_, d) => d.parse::<u8>().map_err(|_| format!("unknown backend {s:?}"))?,
        };
        Ok(BackendId { kind, index })
    }
}

/// A buffer owned by one backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BufferId(pub u32);

/// Where a tensor's bytes live inside a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TensorLoc {
    pub buffer: BufferId,
    pub offset: usize,
    pub nbytes: usize,
}

/// Bytes on the host that outlive the engine (normally the mmapped model
/// file). Host backends alias them; devices upload them.
#[derive(Clone)]
pub struct HostBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    range: Range<usize>,
}

impl HostBytes {
    /// `range` must lie inside `owner`.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, range: Range<usize>) -> HostBytes {
        assert!(range.end <= (*owner).as_ref().len(), "host range outside its owner");
        HostBytes { owner, range }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.range.clone()]
    }
}

/// Where a loaded weight lives, and whether the backend still reads the host
/// bytes it was given (if not, the loader may release them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadedWeight {
    pub loc: TensorLoc,
    pub aliases_host: bool,
}

/// A weight tensor as stored in the model file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightDesc {
    pub ty: GgmlType,
    pub ne: [usize; 4],
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{backend}: out of memory allocating {bytes} bytes")]
    OutOfMemory { backend: BackendId, bytes: usize },
    #[error("{backend} cannot run {op} on {types}")]
    Unsupported { backend: BackendId, op: &'static str, types: String },
    #[error("{backend}: {message}")]
    Device { backend: BackendId, message: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Time a backend spent computing, by op and by labelled matmul (`--profile`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OpProfile {
    /// Per op (or kernel) name: (nanoseconds, count).
    pub by_op: BTreeMap<String, (u64, u64)>,
    /// Per matmul, by the weight it reads: (nanoseconds, count).
    pub by_label: BTreeMap<String, (u64, u64)>,
    /// Of the compute time, copies to and from host memory done inside it
    /// (`compute_io`), also listed in `by_op`.
    pub io_ns: u64,
}

impl OpProfile {
    pub fn add(map: &mut BTreeMap<String, (u64, u64)>, key: &str, ns: u64) {
        let e = map.entry(key.to_string()).or_default();
        e.0 += ns;
        e.1 += 1;
    }

    pub fn total_ns(&self) -> u64 {
        self.by_op.values().map(|v| v.0).sum()
    }
}

/// Host bytes a device reaches, by address (they belong to a host backend's
/// arena, which outlives the copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostSpan {
    pub addr: usize,
    pub len: usize,
}

impl HostSpan {
    pub fn of(bytes: &[u8]) -> HostSpan {
        HostSpan { addr: bytes.as_ptr() as usize, len: bytes.len() }
    }
}

/// The copies a device does inside one `compute_io`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostIo {
    /// Host bytes copied into a tensor of this device before the nodes run.
    pub imports: Vec<(HostSpan, TensorLoc)>,
    /// A tensor of this device copied to host bytes after the nodes ran.
    pub exports: Vec<(TensorLoc, HostSpan)>,
}

impl HostIo {
    pub fn is_empty(&self) -> bool {
        self.imports.is_empty() && self.exports.is_empty()
    }
}

/// A compute device. Kept deliberately small: what a device can run, how its
/// memory is filled and read, and running a list of nodes.
pub trait Backend: Send {
    fn id(&self) -> BackendId;

    /// Whether this backend can compute `node` whose sources are `srcs`.
    fn supports(&self, node: &Node, srcs: &[&Node]) -> bool;

    /// A new zeroed buffer of `bytes`.
    fn alloc(&mut self, bytes: usize) -> Result<BufferId>;

    /// Releases a buffer (its `TensorLoc`s become invalid).
    fn free(&mut self, buffer: BufferId);

    /// Makes a weight resident in the layout this backend computes with. A host
    /// backend may alias `bytes`; a device uploads (and may repack) them.
    fn load_weight(&mut self, bytes: HostBytes, desc: WeightDesc) -> Result<LoadedWeight>;

    /// Keeps a second copy of a host-resident weight for the ops that the
    /// offload policy moves here. A device keeps it in (pinned) host memory
    /// in its own layout and streams it in whenever an op reads it; a host
    /// backend simply loads it.
    fn load_staged(&mut self, bytes: HostBytes, desc: WeightDesc) -> Result<LoadedWeight> {
        self.load_weight(bytes, desc)
    }

    fn write(&mut self, dst: TensorLoc, data: &[u8]) -> Result<()>;

    fn read(&self, src: TensorLoc, out: &mut [u8]) -> Result<()>;

    /// The bytes at `loc` when they are plain host memory, so that a copy to
    /// or from another backend can use them in place instead of staging
    /// them. Devices return `None`.
    fn host_bytes(&self, _loc: TensorLoc) -> Option<&[u8]> {
        None
    }

    /// [`Backend::host_bytes`], writable.
    fn host_bytes_mut(&mut self, _loc: TensorLoc) -> Option<&mut [u8]> {
        None
    }

    /// Page-locks host memory that copies to and from this device use on
    /// every step (the host backends' arenas), so that they run as direct
    /// DMA rather than through the driver's bounce buffer. Returns whether
    /// it did. While pinned, a `write` from these bytes may return before
    /// the device has read them: the caller keeps them unchanged until
    /// `finish_io` (or a `read` from this device) returns.
    fn pin_host(&mut self, _mem: &[u8]) -> Result<bool> {
        Ok(false)
    }

    /// Undoes [`Backend::pin_host`]; called before the memory is freed.
    fn unpin_host(&mut self, _mem: &[u8]) {}

    /// Whether [`Backend::compute_io`] can copy to and from these host bytes.
    fn reaches_host(&self, _mem: &[u8]) -> bool {
        false
    }

    /// Waits until the device has done every copy between it and host memory
    /// that may still be running: writes from pinned memory, and the copies
    /// of `compute_io`.
    fn finish_io(&mut self) -> Result<()> {
        Ok(())
    }

    /// Computes `nodes` of `graph` in order. `locs[i]` is where node `i` lives
    /// for this call: every source and destination of `nodes` is present, and
    /// sources computed elsewhere already point at copies in this backend.
    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> Result<()>;

    /// [`Backend::compute`], with copies between this device and host memory
    /// it reaches done as part of the same work (no transfer call each):
    /// `io.imports` before the nodes, `io.exports` after. Until `finish_io`
    /// returns, the host leaves the imported bytes as they are and does not
    /// read the exported ones.
    fn compute_io(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>], io: &HostIo) -> Result<()> {
        if io.is_empty() {
            return self.compute(graph, nodes, locs);
        }
        Err(Error::Unsupported { backend: self.id(), op: "copies to and from the host", types: String::new() })
    }

    /// Starts (or stops) recording per-op times. A device that runs
    /// asynchronously may synchronise after every op while it records.
    fn set_profiling(&mut self, _on: bool) {}

    /// The times recorded since the last call.
    fn take_profile(&mut self) -> OpProfile {
        OpProfile::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in ["CPU", "CPU1", "CUDA0", "CUDA12"] {
            assert_eq!(s.parse::<BackendId>().unwrap().to_string(), s);
        }
        assert_eq!("cpu0".parse::<BackendId>().unwrap(), BackendId::CPU);
        assert!("GPU0".parse::<BackendId>().is_err());
        assert!("CUDA".parse::<BackendId>().is_err());
    }
}
