//! A backend that exists only on paper: it answers `supports` for a device
//! this machine may not have, so plans (`tern info --plan --devices ...`) can
//! be made and tested anywhere. It holds no memory and computes nothing.

use tern_backend::{Backend, BackendId, BufferId, Error, HostBytes, LoadedWeight, Result, TensorLoc, WeightDesc};
use tern_graph::{Graph, Node, NodeId};

/// What a device can run: the real backend's `supports`, as a function.
pub type Supports = fn(&Node, &[&Node]) -> bool;

pub struct VirtualBackend {
    id: BackendId,
    supports: Supports,
}

impl VirtualBackend {
    pub fn new(id: BackendId, supports: Supports) -> VirtualBackend {
        VirtualBackend { id, supports }
    }

    fn refuse<T>(&self) -> Result<T> {
        Err(Error::Device { backend: self.id, message: "a planning backend holds no memory and runs nothing".into() })
    }
}

impl Backend for VirtualBackend {
    fn id(&self) -> BackendId {
        self.id
    }

    fn supports(&self, node: &Node, srcs: &[&Node]) -> bool {
        (self.supports)(node, srcs)
    }

    fn alloc(&mut self, _bytes: usize) -> Result<BufferId> {
        self.refuse()
    }

    fn free(&mut self, _buffer: BufferId) {}

    fn load_weight(&mut self, _bytes: HostBytes, _desc: WeightDesc) -> Result<LoadedWeight> {
        self.refuse()
    }

    fn write(&mut self, _dst: TensorLoc, _data: &[u8]) -> Result<()> {
        self.refuse()
    }

    fn read(&self, _src: TensorLoc, _out: &mut [u8]) -> Result<()> {
        self.refuse()
    }

    fn compute(&mut self, _graph: &Graph, _nodes: &[NodeId], _locs: &[Option<TensorLoc>]) -> Result<()> {
        self.refuse()
    }
}
