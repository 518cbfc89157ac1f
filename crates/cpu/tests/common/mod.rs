//! What the op tests share: a seeded generator, and a harness that drives a
//! graph through the public CPU backend (leaves loaded with `load_weight` or
//! written into buffers of their own, every other node given a buffer of its
//! own, `compute`, results read back).

#![allow(dead_code)] // each test file uses its own part

use std::sync::Arc;

use tern_backend::{Backend, BackendId, HostBytes, TensorLoc, WeightDesc};
use tern_cpu::isa::Isa;
use tern_cpu::{CpuBackend, CpuOptions};
use tern_graph::{DType, GgmlType, Graph, InputKind, Node, NodeId, Op};

pub use tern_testutil::Rng;

/// The test data these ops see, drawn from the shared generator.
pub trait Data {
    /// Roughly normal (sum of four uniforms), occasionally a 10× outlier.
    fn normalish(&mut self) -> f32;
    /// `n` values of [`Data::normalish`] times `scale`.
    fn scaled(&mut self, n: usize, scale: f32) -> Vec<f32>;
}

impl Data for Rng {
    fn normalish(&mut self) -> f32 {
        let v = (0..4).map(|_| self.f32()).sum::<f32>() * 0.87;
        if self.next_u64().is_multiple_of(97) {
            v * 10.0
        } else {
            v
        }
    }

    fn scaled(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normalish() * scale).collect()
    }
}

struct Owned(Vec<u8>);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub fn to_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The (threads, ISA level) pairs every op test runs: 1 and 3 threads on
/// every level this machine has.
pub fn setups() -> Vec<(usize, Isa)> {
    let isas: Vec<Isa> = Isa::ALL.into_iter().filter(|i| i.available()).collect();
    [1, 3].into_iter().flat_map(|t| isas.iter().map(move |&i| (t, i))).collect()
}

/// A backend and the buffers it holds, kept across graphs (a cache written
/// by one step is read by the next).
pub struct Dev {
    pub b: CpuBackend,
}

impl Dev {
    pub fn new(threads: usize, isa: Isa) -> Dev {
        Dev { b: CpuBackend::with_options(BackendId::CPU, &CpuOptions { threads, isa: Some(isa) }) }
    }

    /// A zeroed buffer of `n` bytes.
    pub fn alloc(&mut self, n: usize) -> TensorLoc {
        TensorLoc { buffer: self.b.alloc(n).unwrap(), offset: 0, nbytes: n }
    }

    pub fn read(&self, loc: TensorLoc) -> Vec<u8> {
        let mut out = vec![0u8; loc.nbytes];
        self.b.read(loc, &mut out).unwrap();
        out
    }
}

/// One graph under construction, with the locations of its nodes.
#[derive(Default)]
pub struct Step {
    pub g: Graph,
    locs: Vec<Option<TensorLoc>>,
}

impl Step {
    pub fn new() -> Step {
        Step::default()
    }

    fn bind(&mut self, id: NodeId, loc: TensorLoc) {
        self.locs.resize(self.g.nodes.len(), None);
        self.locs[id.index()] = Some(loc);
    }

    /// A weight leaf of type `ty` holding `bytes` (file format), loaded as a
    /// model weight is (ternary matrices are repacked).
    pub fn weight(&mut self, dev: &mut Dev, ty: GgmlType, ne: [usize; 4], bytes: Vec<u8>) -> NodeId {
        let id = self.g.weight(self.g.nodes.len(), "w", ty, ne);
        assert_eq!(bytes.len(), self.g.node(id).nbytes(), "{ty} {ne:?}");
        let len = bytes.len();
        let desc = WeightDesc { ty, ne };
        let loc = dev.b.load_weight(HostBytes::new(Arc::new(Owned(bytes)), 0..len), desc).unwrap().loc;
        self.bind(id, loc);
        id
    }

    /// An f32 leaf.
    pub fn f32(&mut self, dev: &mut Dev, ne: [usize; 4], v: &[f32]) -> NodeId {
        self.weight(dev, GgmlType::F32, ne, f32_bytes(v))
    }

    /// An i32 leaf of shape `ne` (the router's `[k, n]` expert lists, or
    /// positions), written into a buffer of its own.
    pub fn i32(&mut self, dev: &mut Dev, ne: [usize; 4], v: &[i32]) -> NodeId {
        let id = NodeId(self.g.nodes.len() as u32);
        let node = Node { op: Op::Input(InputKind::Positions), srcs: vec![], ne, dtype: DType::I32, label: None };
        self.g.nodes.push(node);
        let loc = dev.alloc(self.g.node(id).nbytes());
        dev.b.write(loc, &i32_bytes(v)).unwrap();
        self.bind(id, loc);
        id
    }

    /// A KV cache leaf living in `loc` (kept by the caller across steps).
    pub fn cache(&mut self, ty: GgmlType, ne: [usize; 4], loc: TensorLoc) -> NodeId {
        let id = self.g.kv_cache(0, tern_graph::KvKind::K, ty, ne);
        assert_eq!(loc.nbytes, self.g.node(id).nbytes());
        self.bind(id, loc);
        id
    }

    /// Gives every op node a zeroed buffer of its own and runs them all in order.
    pub fn run(&mut self, dev: &mut Dev) {
        self.locs.resize(self.g.nodes.len(), None);
        let ops: Vec<NodeId> = self.g.ids().filter(|&id| !self.g.node(id).op.is_leaf()).collect();
        for &id in &ops {
            let loc = dev.alloc(self.g.node(id).nbytes());
            self.locs[id.index()] = Some(loc);
        }
        dev.b.compute(&self.g, &ops, &self.locs).unwrap();
    }

    pub fn bytes(&self, dev: &Dev, id: NodeId) -> Vec<u8> {
        dev.read(self.locs[id.index()].expect("bound"))
    }

    pub fn read_f32(&self, dev: &Dev, id: NodeId) -> Vec<f32> {
        to_f32(&self.bytes(dev, id))
    }

    pub fn read_i32(&self, dev: &Dev, id: NodeId) -> Vec<i32> {
        to_i32(&self.bytes(dev, id))
    }
}

/// The unit roundoff of f32.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// `n` weight rows of `k` random values quantized to `ty` (rows of varied
/// magnitude).
pub fn weight_rows(rng: &mut Rng, ty: GgmlType, k: usize, n: usize) -> Vec<u8> {
    let rb = tern_quant::row_bytes(ty, k);
    let mut out = vec![0u8; rb * n];
    for row in out.chunks_exact_mut(rb) {
        let scale = 0.02 * (1 + rng.below(50)) as f32;
        tern_quant::quantize_row(ty, &rng.scaled(k, scale), row);
    }
    out
}

/// The scalar twin of one weight row (`ty`, file bytes) against one f32
/// activation column, as `precision` asks: `vec_dot` on the activation
/// quantized to the type `ty` pairs with, or `vec_dot_f32`. Also returns
/// `S = Σ|w_i·a_i|` over the values the product multiplies; for Q2_K, Q4_K
/// and Q5_K with paired activations, where `w = d·sc·q − dmin·m` and both sides
/// round the two parts separately, `S` also counts the parts:
/// `+ 2·Σ|dmin·m·a|` (then `Σ|d·sc·q·a| + Σ|dmin·m·a| ≤ S`).
pub fn twin_dot(ty: GgmlType, precision: tern_graph::Precision, row: &[u8], x: &[f32]) -> (f32, f64) {
    use tern_quant::{act_row_bytes, act_type, dequantize_acts, quantize_acts, TensorScale};
    let k = x.len();
    let mut w = vec![0f32; k];
    tern_quant::dequantize_row(ty, row, TensorScale::ONE, &mut w);
    let s = |w: &[f32], a: &[f32]| w.iter().zip(a).map(|(&w, &a)| (w as f64 * a as f64).abs()).sum::<f64>();
    match precision {
        tern_graph::Precision::Float => (tern_quant::vec_dot_f32(ty, row, TensorScale::ONE, x), s(&w, x)),
        tern_graph::Precision::Paired => {
            let act = act_type(ty);
            let mut q = vec![0u8; act_row_bytes(act, k)];
            quantize_acts(act, x, &mut q);
            let mut a = vec![0f32; k];
            dequantize_acts(act, &q, &mut a);
            let mut sum = s(&w, &a);
            if let Some(codes) = min_format_codes(ty) {
                // Codes zeroed: each element is −dmin·m.
                let mut mins = row.to_vec();
                mins.chunks_exact_mut(ty.layout().block_bytes).for_each(|b| b[codes.clone()].fill(0));
                tern_quant::dequantize_row(ty, &mins, TensorScale::ONE, &mut w);
                sum += 2.0 * s(&w, &a);
            }
            (tern_quant::vec_dot(ty, k, row, TensorScale::ONE, &q), sum)
        }
    }
}

/// Where a block's codes are, for the formats with a separate min
/// (`w = d·sc·q − dmin·m`): after the scales at 16 (Q4_K; Q5_K's fifth bits
/// too), or 16..80 (Q2_K). Zeroing them leaves `−dmin·m` per element.
pub fn min_format_codes(ty: GgmlType) -> Option<std::ops::Range<usize>> {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => Some(16..ty.layout().block_bytes),
        GgmlType::Q2_K => Some(16..80),
        _ => None,
    }
}

/// How far a row product of the CPU backend may be from [`twin_dot`], as a
/// multiple of `S` (the bounds `blocks/mod.rs` and `blocks/gemm.rs` state
/// for their kernels, made explicit; `u = 2⁻²⁴`, `N` the row's blocks):
/// * f32 activations (float weights, or `Precision::Float`): the float
///   kernels accumulate in f32 lanes, `|Δ| ≤ (k/32 + 16)·u·S` (`float.rs`),
///   and the twin rounds its f64 sum once (`u·S`): `(k/32 + 17)·u·S`;
/// * K-quants with their Q8_K activations: the row dots return the
///   reference's bits; the GEMM (four tokens or more) forms the same block
///   integers in 8 lanes, converts them (`u` each), scales them by a rounded
///   `d·d_a` (`u`) and sums them in f32 lanes by FMA, two terms a block
///   (`2N` roundings) and across lanes (3): within `(2N + 6)·u·S` of exact;
///   the reference rounds `d·sumi`, `dmin·summ`, their difference, the
///   product with `d_a` and its running sum: `(N + 4)·u·S`; together
///   `(3N + 10)·u·S`;
/// * the 32-element formats with Q8_0 activations: both sides sum the same
///   `N = k/32` block terms `fl(d_w·d_a)·isum` (exact integers, the same
///   scale), in different orders and with or without rounding the products
///   (FMA), the row dots within `(N + 1)·u·Σ|term|` of exact, the GEMM (per
///   lane, then across 8 lanes) within `(N + 4)·u·Σ|term|`, and
///   `Σ|term| ≤ (1 + u)·S`, so `|Δ| ≤ 2(N + 3)·u·S`.
pub fn dot_tol(ty: GgmlType, k: usize, precision: tern_graph::Precision) -> f64 {
    use tern_quant::ActType;
    let act = match precision {
        tern_graph::Precision::Paired => tern_quant::act_type(ty),
        tern_graph::Precision::Float => ActType::F32,
    };
    let n = (k / ty.block_elems()) as f64;
    match act {
        ActType::F32 => (k / 32 + 17) as f64 * U,
        ActType::Q8_K => (3.0 * n + 10.0) * U,
        _ => 2.0 * (n + 3.0) * U,
    }
}
