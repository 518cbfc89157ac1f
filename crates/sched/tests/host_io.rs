//! The copy protocol between a host backend and a device, without a GPU: a
//! fake device that pins the host arena, does the copies at its split's edges
//! inside `compute_io`, and lands its exports only when `finish_io` is called
//! (as a GPU's asynchronous writes would). The step's result must equal the
//! one computed directly, with the copies done inside compute or by transfer
//! calls.

use std::collections::HashMap;

use tern_backend::{
    Backend, BackendId, BufferId, Error, HostBytes, HostIo, HostSpan, LoadedWeight, Result, TensorLoc, WeightDesc,
};
use tern_graph::{DType, GgmlType, Graph, InputKind, Node, NodeId, Op};
use tern_sched::{Backends, Placement, PlacementRules, Schedule};

/// Plain memory and the three ops of the test graph, on f32 data.
#[derive(Default)]
struct Mem {
    bufs: Vec<Vec<u8>>,
}

impl Mem {
    fn alloc(&mut self, bytes: usize) -> BufferId {
        self.bufs.push(vec![0; bytes]);
        BufferId(self.bufs.len() as u32 - 1)
    }

    fn bytes(&self, l: TensorLoc) -> &[u8] {
        &self.bufs[l.buffer.0 as usize][l.offset..l.offset + l.nbytes]
    }

    fn bytes_mut(&mut self, l: TensorLoc) -> &mut [u8] {
        &mut self.bufs[l.buffer.0 as usize][l.offset..l.offset + l.nbytes]
    }

    fn f32s(&self, l: TensorLoc) -> Vec<f32> {
        self.bytes(l).chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) {
        for &id in nodes {
            let n = graph.node(id);
            let src = |i: usize| locs[n.srcs[i].index()].unwrap();
            let out: Vec<f32> = match n.op {
                Op::GetRows => {
                    let (table, k) = (self.f32s(src(0)), n.ne[0]);
                    let ids = self.bytes(src(1)).chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()));
                    ids.flat_map(|r| table[r as usize * k..(r as usize + 1) * k].to_vec()).collect()
                }
                Op::Mul => {
                    let (a, b) = (self.f32s(src(0)), self.f32s(src(1)));
                    a.iter().enumerate().map(|(i, x)| x * b[i % b.len()]).collect()
                }
                ref op => panic!("the fake backends do not run {}", op.name()),
            };
            let dst = self.bytes_mut(locs[id.index()].unwrap());
            for (d, v) in dst.chunks_exact_mut(4).zip(out) {
                d.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

fn supports(node: &Node) -> bool {
    matches!(node.op, Op::GetRows | Op::Mul) && node.dtype == DType::F32
}

struct Host(Mem);

impl Backend for Host {
    fn id(&self) -> BackendId {
        BackendId::CPU
    }
    fn supports(&self, node: &Node, _: &[&Node]) -> bool {
        supports(node)
    }
    fn alloc(&mut self, bytes: usize) -> Result<BufferId> {
        Ok(self.0.alloc(bytes))
    }
    fn free(&mut self, _: BufferId) {}
    fn load_weight(&mut self, _: HostBytes, _: WeightDesc) -> Result<LoadedWeight> {
        unreachable!("weights are written directly")
    }
    fn write(&mut self, dst: TensorLoc, data: &[u8]) -> Result<()> {
        self.0.bytes_mut(dst).copy_from_slice(&data[..dst.nbytes]);
        Ok(())
    }
    fn read(&self, src: TensorLoc, out: &mut [u8]) -> Result<()> {
        out[..src.nbytes].copy_from_slice(self.0.bytes(src));
        Ok(())
    }
    fn host_bytes(&self, loc: TensorLoc) -> Option<&[u8]> {
        Some(self.0.bytes(loc))
    }
    fn host_bytes_mut(&mut self, loc: TensorLoc) -> Option<&mut [u8]> {
        Some(self.0.bytes_mut(loc))
    }
    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> Result<()> {
        self.0.compute(graph, nodes, locs);
        Ok(())
    }
}

/// A device that reaches pinned host memory, if `reaches`.
struct Device {
    mem: Mem,
    reaches: bool,
    pinned: Vec<HostSpan>,
    /// Exports not landed yet: (host address, bytes).
    pending: Vec<(usize, Vec<u8>)>,
    imported: usize,
    exported: usize,
}

impl Device {
    fn inside_pin(&self, s: HostSpan) -> bool {
        self.pinned.iter().any(|p| s.addr >= p.addr && s.addr + s.len <= p.addr + p.len)
    }
}

impl Backend for Device {
    fn id(&self) -> BackendId {
        BackendId::cuda(0)
    }
    fn supports(&self, node: &Node, _: &[&Node]) -> bool {
        supports(node)
    }
    fn alloc(&mut self, bytes: usize) -> Result<BufferId> {
        Ok(self.mem.alloc(bytes))
    }
    fn free(&mut self, _: BufferId) {}
    fn load_weight(&mut self, _: HostBytes, _: WeightDesc) -> Result<LoadedWeight> {
        unreachable!("weights are written directly")
    }
    fn write(&mut self, dst: TensorLoc, data: &[u8]) -> Result<()> {
        self.mem.bytes_mut(dst).copy_from_slice(&data[..dst.nbytes]);
        Ok(())
    }
    fn read(&self, src: TensorLoc, out: &mut [u8]) -> Result<()> {
        assert!(self.pending.is_empty(), "a read while exports are in flight");
        out[..src.nbytes].copy_from_slice(self.mem.bytes(src));
        Ok(())
    }
    fn pin_host(&mut self, mem: &[u8]) -> Result<bool> {
        self.pinned.push(HostSpan::of(mem));
        Ok(self.reaches)
    }
    fn unpin_host(&mut self, mem: &[u8]) {
        self.pinned.retain(|p| p.addr != mem.as_ptr() as usize);
    }
    fn reaches_host(&self, mem: &[u8]) -> bool {
        self.reaches && self.inside_pin(HostSpan::of(mem))
    }
    fn finish_io(&mut self) -> Result<()> {
        for (addr, bytes) in self.pending.drain(..) {
            // SAFETY: the span lies in a host arena this device pinned, which
            // the scheduler keeps alive and leaves alone until this call.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), addr as *mut u8, bytes.len()) };
        }
        Ok(())
    }
    fn compute(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>]) -> Result<()> {
        self.compute_io(graph, nodes, locs, &HostIo::default())
    }
    fn compute_io(&mut self, graph: &Graph, nodes: &[NodeId], locs: &[Option<TensorLoc>], io: &HostIo) -> Result<()> {
        for &(span, loc) in &io.imports {
            if !self.inside_pin(span) {
                return Err(Error::Device { backend: self.id(), message: "import outside pinned memory".into() });
            }
            // SAFETY: as in `finish_io`.
            let src = unsafe { std::slice::from_raw_parts(span.addr as *const u8, span.len) };
            self.mem.bytes_mut(loc).copy_from_slice(src);
            self.imported += 1;
        }
        self.mem.compute(graph, nodes, locs);
        for &(loc, span) in &io.exports {
            assert!(self.inside_pin(span), "export outside pinned memory");
            self.pending.push((span.addr, self.mem.bytes(loc).to_vec()));
            self.exported += 1;
        }
        Ok(())
    }
}

/// Each weight into a buffer of its backend: weight i's location.
fn upload(backends: &mut Backends, weights: &[(&Vec<f32>, BackendId)]) -> HashMap<usize, TensorLoc> {
    let mut locs = HashMap::new();
    for (i, &(w, on)) in weights.iter().enumerate() {
        let b = backends.get_mut(on).unwrap();
        let buffer = b.alloc(w.len() * 4).unwrap();
        let loc = TensorLoc { buffer, offset: 0, nbytes: w.len() * 4 };
        b.write(loc, &w.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
        locs.insert(i, loc);
    }
    locs
}

/// `out = table[ids] · w1 · w0`: the lookup on the host, the middle product
/// on the device (`w1` lives there), and the last one where `w0` lives. When
/// that is the device, the output is read back through the readback split.
fn run(reaches: bool, w0_on: BackendId) -> (usize, usize) {
    let (k, rows, ids) = (8, 4, [3i32, 1, 2]);
    let table: Vec<f32> = (0..k * rows).map(|i| i as f32 * 0.5 - 3.0).collect();
    let w1: Vec<f32> = (0..k).map(|i| 1.0 + i as f32).collect();
    let w0: Vec<f32> = (0..k).map(|i| 2.0 - 0.25 * i as f32).collect();

    let mut g = Graph::new();
    let t = g.weight(0, "blk.0.table", GgmlType::F32, [k, rows, 1, 1]);
    let a = g.weight(1, "blk.0.w1", GgmlType::F32, [k, 1, 1, 1]);
    let b = g.weight(2, "blk.0.w0", GgmlType::F32, [k, 1, 1, 1]);
    let tokens = g.input(InputKind::Tokens, ids.len());
    let e = g.get_rows(t, tokens);
    let h = g.mul(e, a);
    let o = g.mul(h, b);
    g.mark_output(o);

    let gpu = BackendId::cuda(0);
    let rules =
        PlacementRules::parse_overrides(&["w1=CUDA0".into(), format!("w0={w0_on}")], &[BackendId::CPU, gpu]).unwrap();
    let placement = Placement::new(["blk.0.table", "blk.0.w1", "blk.0.w0"], 1, &rules);
    let host = Host(Mem::default());
    let dev =
        Device { mem: Mem::default(), reaches, pinned: Vec::new(), pending: Vec::new(), imported: 0, exported: 0 };
    let mut backends = Backends::new(vec![Box::new(host), Box::new(dev)]);
    let schedule = Schedule::new(&g, &placement, &backends);
    assert_eq!(schedule.splits.iter().map(|s| s.backend).collect::<Vec<_>>(), [BackendId::CPU, gpu, BackendId::CPU]);
    assert_eq!(schedule.splits[2].nodes.is_empty(), w0_on == gpu, "the last split reads the output back");

    let weights = upload(&mut backends, &[(&table, BackendId::CPU), (&w1, gpu), (&w0, w0_on)]);
    let leaf = |op: &Op, _: BackendId| match op {
        Op::Weight(i) => weights.get(i).copied(),
        _ => None,
    };
    let id_bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    backends.set_profiling(true);
    let out = backends.run(&g, &schedule, &leaf, &[(tokens, &id_bytes)], &mut None).unwrap();
    let got: Vec<f32> = out[0].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let (profile, _) = backends.take_profile();
    let inside: u64 = profile.copies.values().map(|c| c.in_compute).sum();
    let copies: u64 = profile.copies.values().map(|c| c.count).sum();
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&r| (0..k).map(move |i| (r as usize, i)))
        .map(|(r, i)| table[r * k + i] * w1[i] * w0[i])
        .collect();
    assert_eq!(got, want, "reaches_host {reaches}");
    (inside as usize, copies as usize)
}

#[test]
fn copies_inside_device_compute_land_before_the_host_reads_them() {
    for w0_on in [BackendId::CPU, BackendId::cuda(0)] {
        let (inside, copies) = run(true, w0_on);
        assert_eq!((inside, copies), (2, 2), "the import and the export both ran inside the device's compute");
    }
}

#[test]
fn without_host_reach_copies_are_transfer_calls() {
    for w0_on in [BackendId::CPU, BackendId::cuda(0)] {
        assert_eq!(run(false, w0_on), (0, 2));
    }
}

/// `run` keeps where the nodes live between calls with one schedule,
/// and places them again once a larger batch has moved the arenas: each
/// step's output is the one computed directly, before and after.
#[test]
fn cached_homes_are_placed_again_when_an_arena_moves() {
    let (k, rows) = (8, 4);
    let table: Vec<f32> = (0..k * rows).map(|i| i as f32 * 0.5 - 3.0).collect();
    let w1: Vec<f32> = (0..k).map(|i| 1.0 + i as f32).collect();
    let graph = |n: usize| {
        let mut g = Graph::new();
        let t = g.weight(0, "blk.0.table", GgmlType::F32, [k, rows, 1, 1]);
        let a = g.weight(1, "blk.0.w1", GgmlType::F32, [k, 1, 1, 1]);
        let tokens = g.input(InputKind::Tokens, n);
        let e = g.get_rows(t, tokens);
        let o = g.mul(e, a);
        g.mark_output(o);
        (g, tokens)
    };
    let gpu = BackendId::cuda(0);
    let rules = PlacementRules::parse_overrides(&["w1=CUDA0".into()], &[BackendId::CPU, gpu]).unwrap();
    let placement = Placement::new(["blk.0.table", "blk.0.w1"], 1, &rules);
    let dev = Device {
        mem: Mem::default(),
        reaches: true,
        pinned: Vec::new(),
        pending: Vec::new(),
        imported: 0,
        exported: 0,
    };
    let mut backends = Backends::new(vec![Box::new(Host(Mem::default())), Box::new(dev)]);
    let weights = upload(&mut backends, &[(&table, BackendId::CPU), (&w1, gpu)]);
    let leaf = |op: &Op, _: BackendId| match op {
        Op::Weight(i) => weights.get(i).copied(),
        _ => None,
    };
    let (table, w1) = (&table, &w1);
    let want = |ids: &[i32]| -> Vec<f32> {
        ids.iter().flat_map(|&r| (0..k).map(move |i| table[r as usize * k + i] * w1[i])).collect()
    };
    let ((small, t_small), (large, t_large)) = (graph(2), graph(64));
    let (s_small, s_large) =
        (Schedule::new(&small, &placement, &backends), Schedule::new(&large, &placement, &backends));
    let mut homes = None;
    let step = |backends: &mut Backends, homes: &mut Option<_>, ids: &[i32]| {
        let (g, t, s) = if ids.len() == 2 { (&small, t_small, &s_small) } else { (&large, t_large, &s_large) };
        let id_bytes: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
        let out = backends.run(g, s, &leaf, &[(t, &id_bytes)], homes).unwrap();
        let got: Vec<f32> = out[0].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, want(ids), "ids {ids:?}");
    };
    step(&mut backends, &mut homes, &[3, 1]);
    let first = homes.clone().expect("placed by the first run");
    step(&mut backends, &mut homes, &[0, 2]);
    assert_eq!(homes.as_ref(), Some(&first), "same arenas: the homes are kept");
    let mut other = None;
    step(&mut backends, &mut other, &(0..64).map(|i| i % rows as i32).collect::<Vec<_>>());
    step(&mut backends, &mut homes, &[2, 2]);
    assert_ne!(homes.as_ref(), Some(&first), "the large batch grew the arenas: placed again");
}
