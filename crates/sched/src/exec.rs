//! Running a scheduled graph: keep one arena per backend, write the step
//! inputs, then for each split copy in what it needs and let its backend
//! compute. Copies go through host memory; with only host backends that is
//! one memcpy.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Instant;

use tern_backend::{Backend, BackendId, BufferId, HostIo, HostSpan, OpProfile, TensorLoc};
use tern_graph::{Graph, NodeId, Op};

use crate::assign::{assign, split, Assigned, Split};
use crate::memory::{plan_memory, MemoryPlan};
use crate::placement::Placement;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Backend(#[from] tern_backend::Error),
    #[error("no backend {0} is loaded")]
    MissingBackend(BackendId),
    #[error("graph leaf {node} ({op}) has no data bound to it")]
    UnboundLeaf { node: u32, op: &'static str },
    #[error("step input for node {node} has {got} bytes, expected {want}")]
    InputSize { node: u32, got: usize, want: usize },
}

/// A graph's assignment, splits and memory plan. Pure data.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub assigned: Vec<Assigned>,
    pub splits: Vec<Split>,
    pub memory: MemoryPlan,
}

impl Schedule {
    pub fn new(graph: &Graph, placement: &Placement, backends: &Backends) -> Schedule {
        let refs: Vec<&dyn Backend> = backends.list.iter().map(|b| b.as_ref()).collect();
        let assigned = assign(graph, placement, &refs);
        let host = backends.list.iter().map(|b| b.id()).find(|id| id.is_host());
        let splits = split(graph, &assigned, host);
        let memory = plan_memory(graph, &assigned, &splits);
        Schedule { assigned, splits, memory }
    }

    /// Bytes copied between backends per run.
    pub fn copy_bytes(&self, graph: &Graph) -> usize {
        self.splits.iter().flat_map(|s| &s.copies).map(|c| graph.node(c.src).nbytes()).sum()
    }
}

/// The loaded backends, plus the arena each keeps for per-step tensors.
pub struct Backends {
    list: Vec<Box<dyn Backend>>,
    arenas: BTreeMap<BackendId, (BufferId, usize)>,
    /// Host arenas page-locked by a device (its index in `list`), so that
    /// the copies of every split are direct DMA.
    pinned: BTreeMap<BackendId, usize>,
    profile: Option<RunProfile>,
}

/// Where `run` spent its time (`--profile`). Compute on an asynchronous
/// device is only the launching, unless the device records per-op times
/// (it then waits for each op); its remaining time shows as readback.
#[derive(Clone, Debug, Default)]
pub struct RunProfile {
    pub runs: u64,
    /// Writing the step inputs.
    pub input_ns: u64,
    /// Copies between backends by direction (from, to).
    pub copies: BTreeMap<(BackendId, BackendId), CopyTimes>,
    /// Waiting before a host split for devices to finish their copies to or
    /// from host memory (the GPU's work before them included).
    pub sync_ns: u64,
    /// `Backend::compute` per backend.
    pub compute_ns: BTreeMap<BackendId, u64>,
    /// Reading the outputs back, which waits for the devices.
    pub readback_ns: u64,
}

impl RunProfile {
    /// Time in copies between backends, every direction.
    pub fn copy_ns(&self) -> u64 {
        self.copies.values().map(|c| c.ns).sum()
    }

    /// Bytes copied between backends, every direction.
    pub fn copy_bytes(&self) -> u64 {
        self.copies.values().map(|c| c.bytes).sum()
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct CopyTimes {
    pub ns: u64,
    pub bytes: u64,
    pub count: u64,
    /// Of `count`, those the device did inside its compute (their time is
    /// the device's).
    pub in_compute: u64,
}

impl Backends {
    pub fn new(list: Vec<Box<dyn Backend>>) -> Backends {
        Backends { list, arenas: BTreeMap::new(), pinned: BTreeMap::new(), profile: None }
    }

    /// Starts or stops recording times, here and in every backend.
    pub fn set_profiling(&mut self, on: bool) {
        self.profile = on.then(RunProfile::default);
        for b in &mut self.list {
            b.set_profiling(on);
        }
    }

    /// The times recorded since the last call, with each backend's per-op times.
    pub fn take_profile(&mut self) -> (RunProfile, Vec<(BackendId, OpProfile)>) {
        let run = self.profile.as_mut().map(std::mem::take).unwrap_or_default();
        (run, self.list.iter_mut().map(|b| (b.id(), b.take_profile())).collect())
    }

    fn book(&mut self, f: impl FnOnce(&mut RunProfile)) {
        if let Some(p) = self.profile.as_mut() {
            f(p);
        }
    }

    pub fn ids(&self) -> Vec<BackendId> {
        self.list.iter().map(|b| b.id()).collect()
    }

    pub fn get(&self, id: BackendId) -> Result<&dyn Backend, Error> {
        self.list.iter().find(|b| b.id() == id).map(|b| b.as_ref()).ok_or(Error::MissingBackend(id))
    }

    pub fn get_mut(&mut self, id: BackendId) -> Result<&mut (dyn Backend + 'static), Error> {
        self.list.iter_mut().find(|b| b.id() == id).map(|b| b.as_mut()).ok_or(Error::MissingBackend(id))
    }

    fn index(&self, id: BackendId) -> Result<usize, Error> {
        self.list.iter().position(|b| b.id() == id).ok_or(Error::MissingBackend(id))
    }

    /// Copies `src` on backend `from` to `dst` on `to`. When either side is
    /// host memory the other backend reads or writes it in place; only
    /// device-to-device copies go through `staging`.
    fn copy(
        &mut self,
        from: BackendId,
        src: TensorLoc,
        to: BackendId,
        dst: TensorLoc,
        staging: &mut Vec<u8>,
    ) -> Result<(), Error> {
        let (i, j) = (self.index(from)?, self.index(to)?);
        if i == j {
            staging.resize(src.nbytes, 0);
            self.list[i].read(src, staging)?;
            return Ok(self.list[j].write(dst, staging)?);
        }
        let (a, to_b) = self.pair(i, j);
        let from_b: &dyn Backend = a.as_ref();
        if let Some(bytes) = from_b.host_bytes(src) {
            return Ok(to_b.write(dst, bytes)?);
        }
        if let Some(out) = to_b.host_bytes_mut(dst) {
            return Ok(from_b.read(src, out)?);
        }
        staging.resize(src.nbytes, 0);
        from_b.read(src, staging)?;
        Ok(to_b.write(dst, staging)?)
    }

    /// Backends `i` and `j` (different) at once.
    fn pair(&mut self, i: usize, j: usize) -> (&mut Box<dyn Backend>, &mut Box<dyn Backend>) {
        if i < j {
            let (lo, hi) = self.list.split_at_mut(j);
            (&mut lo[i], &mut hi[0])
        } else {
            let (lo, hi) = self.list.split_at_mut(i);
            (&mut hi[0], &mut lo[j])
        }
    }

    /// The arena buffer of `id`, grown to at least `bytes`.
    fn arena(&mut self, id: BackendId, bytes: usize) -> Result<BufferId, Error> {
        if let Some(&(buf, cap)) = self.arenas.get(&id) {
            if cap >= bytes {
                return Ok(buf);
            }
            self.unpin(id)?;
            self.get_mut(id)?.free(buf);
            self.arenas.remove(&id);
        }
        // Grow with headroom so a growing KV position does not reallocate every step.
        let cap = bytes + bytes / 4;
        let buf = self.get_mut(id)?.alloc(cap)?;
        self.arenas.insert(id, (buf, cap));
        if id.is_host() {
            self.pin(id, TensorLoc { buffer: buf, offset: 0, nbytes: cap })?;
        }
        Ok(buf)
    }

    /// Page-locks host arena `loc` of `id` with the first device that does it.
    fn pin(&mut self, id: BackendId, loc: TensorLoc) -> Result<(), Error> {
        let h = self.index(id)?;
        for d in 0..self.list.len() {
            if self.list[d].id().is_host() {
                continue;
            }
            let (host, dev) = self.pair(h, d);
            let Some(mem) = host.host_bytes(loc) else { return Ok(()) };
            match dev.pin_host(mem) {
                Ok(true) => {
                    self.pinned.insert(id, d);
                    return Ok(());
                }
                Ok(false) => {}
                // Copies still work from pageable memory, only slower.
                Err(e) => eprintln!("warning: host memory stays pageable: {e}"),
            }
        }
        Ok(())
    }

    /// Undoes `pin` for the arena of `id`, once no copy reads it.
    fn unpin(&mut self, id: BackendId) -> Result<(), Error> {
        let (Some(d), Some(&(buf, cap))) = (self.pinned.remove(&id), self.arenas.get(&id)) else { return Ok(()) };
        let h = self.index(id)?;
        let (host, dev) = self.pair(h, d);
        dev.finish_io()?;
        if let Some(mem) = host.host_bytes(TensorLoc { buffer: buf, offset: 0, nbytes: cap }) {
            dev.unpin_host(mem);
        }
        Ok(())
    }

    /// The host bytes at `loc` of host backend `host`, when device `dev` can
    /// copy them inside its compute.
    fn reach(&self, host: BackendId, loc: TensorLoc, dev: BackendId) -> Result<Option<HostSpan>, Error> {
        if !host.is_host() || dev.is_host() {
            return Ok(None);
        }
        let Some(bytes) = self.get(host)?.host_bytes(loc) else { return Ok(None) };
        Ok(self.get(dev)?.reaches_host(bytes).then(|| HostSpan::of(bytes)))
    }

    /// Waits until no device still reads host memory from a copy, before
    /// host code may change it.
    fn finish_io(&mut self) -> Result<(), Error> {
        for b in self.list.iter_mut().filter(|b| !b.id().is_host()) {
            b.finish_io()?;
        }
        Ok(())
    }

    /// Runs `graph` under `schedule`. `leaf` gives the location of weight and
    /// cache leaves on the backend a leaf is assigned to; `inputs` are the
    /// bytes of the step inputs. Returns the bytes of each graph output,
    /// borrowed from a host arena where they were computed or read back.
    /// `homes` keeps where every node lives for the next call with the same
    /// graph shape, schedule and leaves (placing a decoding step's ~1,000
    /// nodes again every token costs more than the step's host work); pass
    /// `&mut None` for a one-off run. The
    /// caller owns that promise; the homes are placed again whenever an
    /// arena moved.
    pub fn run(
        &mut self,
        graph: &Graph,
        schedule: &Schedule,
        leaf: &dyn Fn(&Op, BackendId) -> Option<TensorLoc>,
        inputs: &[(NodeId, &[u8])],
        homes: &mut Option<Homes>,
    ) -> Result<Vec<Cow<'_, [u8]>>, Error> {
        let mut arenas = Vec::with_capacity(schedule.memory.arena_bytes.len());
        for (&id, &bytes) in &schedule.memory.arena_bytes {
            arenas.push((id, self.arena(id, bytes)?));
        }
        let arena_of: BTreeMap<BackendId, BufferId> = arenas.iter().copied().collect();
        if homes.as_ref().is_none_or(|h| h.arenas != arenas) {
            *homes = None;
            *homes = Some(Homes { home: place(graph, schedule, leaf, &arenas)?, arenas });
        }
        let home = &homes.as_ref().expect("placed above").home;
        let t = Instant::now();
        for &(id, bytes) in inputs {
            let loc = home[id.index()].ok_or(Error::UnboundLeaf { node: id.0, op: "input" })?;
            if bytes.len() != loc.nbytes {
                return Err(Error::InputSize { node: id.0, got: bytes.len(), want: loc.nbytes });
            }
            self.get_mut(schedule.assigned[id.index()].backend)?.write(loc, bytes)?;
        }
        self.book(|p| {
            p.runs += 1;
            p.input_ns += t.elapsed().as_nanos() as u64;
        });

        let mut staging = Vec::new();
        // Copies that a device does inside its compute (`compute_io`): its
        // imports from host memory, and its exports to the next split when
        // that one runs on a host (whose copy slots nothing else uses then).
        let mut in_compute: Vec<Vec<bool>> = schedule.splits.iter().map(|s| vec![false; s.copies.len()]).collect();
        for (si, s) in schedule.splits.iter().enumerate() {
            let mut locs = home.clone();
            let mut io = HostIo::default();
            for (ci, c) in s.copies.iter().enumerate() {
                let src = home[c.src.index()].ok_or(Error::UnboundLeaf { node: c.src.0, op: "copy source" })?;
                let dst = TensorLoc {
                    buffer: arena_of[&s.backend],
                    offset: schedule.memory.copy_offsets[si][ci],
                    nbytes: src.nbytes,
                };
                locs[c.src.index()] = Some(dst);
                let import = if s.backend.is_host() { None } else { self.reach(c.from, src, s.backend)? };
                if let Some(span) = import {
                    io.imports.push((span, dst));
                    in_compute[si][ci] = true;
                }
                let t_copy = Instant::now();
                if !in_compute[si][ci] {
                    self.copy(c.from, src, s.backend, dst, &mut staging)?;
                }
                let done_inside = in_compute[si][ci];
                self.book(|p| {
                    let e = p.copies.entry((c.from, s.backend)).or_default();
                    e.ns += t_copy.elapsed().as_nanos() as u64;
                    e.bytes += src.nbytes as u64;
                    e.count += 1;
                    e.in_compute += done_inside as u64;
                });
            }
            if let Some(next) = schedule.splits.get(si + 1).filter(|n| !s.backend.is_host() && n.backend.is_host()) {
                for (cj, c) in next.copies.iter().enumerate() {
                    let from_arena = schedule.memory.node_offsets[c.src.index()].is_some();
                    let Some(src) = home[c.src.index()].filter(|_| c.from == s.backend && from_arena) else { continue };
                    let dst = TensorLoc {
                        buffer: arena_of[&next.backend],
                        offset: schedule.memory.copy_offsets[si + 1][cj],
                        nbytes: src.nbytes,
                    };
                    if let Some(span) = self.reach(next.backend, dst, s.backend)? {
                        io.exports.push((src, span));
                        in_compute[si + 1][cj] = true;
                    }
                }
            }
            let t_sync = Instant::now();
            if s.backend.is_host() {
                self.finish_io()?;
            }
            let t_compute = Instant::now();
            self.book(|p| {
                p.sync_ns += (t_compute - t_sync).as_nanos() as u64;
            });
            self.get_mut(s.backend)?.compute_io(graph, &s.nodes, &locs, &io)?;
            let backend = s.backend;
            self.book(|p| *p.compute_ns.entry(backend).or_default() += t_compute.elapsed().as_nanos() as u64);
        }
        let t = Instant::now();
        // The readback split's copies have landed, and the next step's
        // inputs may be written into the arenas.
        self.finish_io()?;
        // Outputs computed on a device were copied to the host by the
        // readback split; the caller reads them there, in place.
        let last = schedule.splits.len().wrapping_sub(1);
        let readback = schedule.splits.last().filter(|s| s.nodes.is_empty());
        let mut at = Vec::with_capacity(graph.outputs.len());
        for &o in &graph.outputs {
            let copied = readback.and_then(|s| s.copies.iter().position(|c| c.src == o).map(|ci| (s.backend, ci)));
            at.push(match copied {
                Some((host, ci)) => {
                    let offset = schedule.memory.copy_offsets[last][ci];
                    (host, TensorLoc { buffer: arena_of[&host], offset, nbytes: graph.node(o).nbytes() })
                }
                None => {
                    let loc = home[o.index()].ok_or(Error::UnboundLeaf { node: o.0, op: "output" })?;
                    (schedule.assigned[o.index()].backend, loc)
                }
            });
        }
        // Without a host backend to read them on, outputs are read from the device.
        let mut owned = Vec::with_capacity(at.len());
        for &(backend, loc) in &at {
            let b = self.get(backend)?;
            owned.push(match b.host_bytes(loc) {
                Some(_) => None,
                None => {
                    let mut bytes = vec![0u8; loc.nbytes];
                    b.read(loc, &mut bytes)?;
                    Some(bytes)
                }
            });
        }
        self.book(|p| p.readback_ns += t.elapsed().as_nanos() as u64);
        let mut outputs = Vec::with_capacity(at.len());
        for (&(backend, loc), bytes) in at.iter().zip(owned) {
            outputs.push(match bytes {
                Some(v) => Cow::Owned(v),
                None => Cow::Borrowed(self.get(backend)?.host_bytes(loc).expect("host bytes checked above")),
            });
        }
        Ok(outputs)
    }
}

/// Where a run's nodes live: each backend's arena buffer, and every node's
/// location (leaves where they are bound, the rest in arenas).
#[derive(Clone, Debug, PartialEq)]
pub struct Homes {
    arenas: Vec<(BackendId, BufferId)>,
    home: Vec<Option<TensorLoc>>,
}

fn place(
    graph: &Graph,
    schedule: &Schedule,
    leaf: &dyn Fn(&Op, BackendId) -> Option<TensorLoc>,
    arenas: &[(BackendId, BufferId)],
) -> Result<Vec<Option<TensorLoc>>, Error> {
    let arena = |b: BackendId| arenas.iter().find(|a| a.0 == b).map(|a| a.1);
    let mut home: Vec<Option<TensorLoc>> = vec![None; graph.nodes.len()];
    for id in graph.ids() {
        let node = graph.node(id);
        let backend = schedule.assigned[id.index()].backend;
        home[id.index()] = match (&node.op, schedule.memory.node_offsets[id.index()]) {
            (_, Some(offset)) => {
                let buffer = arena(backend).ok_or(Error::UnboundLeaf { node: id.0, op: "arena" })?;
                Some(TensorLoc { buffer, offset, nbytes: node.nbytes() })
            }
            (Op::Weight(_) | Op::KvCache { .. }, None) => {
                Some(leaf(&node.op, backend).ok_or(Error::UnboundLeaf { node: id.0, op: node.op.name() })?)
            }
            _ => None,
        };
    }
    Ok(home)
}

impl Drop for Backends {
    fn drop(&mut self) {
        let pinned: Vec<BackendId> = self.pinned.keys().copied().collect();
        for id in pinned {
            // Nothing is left to do about a device that fails while shutting down.
            let _ = self.unpin(id);
        }
    }
}
