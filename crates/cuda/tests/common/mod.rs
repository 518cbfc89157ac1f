//! What the GPU op tests share: the device (or the reason there is none),
//! seeded random data, running a graph on a backend with poisoned outputs,
//! and comparing the GPU's outputs with the CPU's within a bound.
#![allow(dead_code)] // each test file uses its own part

use std::collections::HashMap;
use std::sync::Arc;

use tern_backend::{Backend, BackendId, HostBytes, TensorLoc, WeightDesc};
use tern_cpu::CpuBackend;
use tern_cuda::{CudaBackend, CudaOptions};
use tern_graph::{DType, Graph, NodeId, Op};
use tern_quant::GgmlType;
pub use tern_testutil::Rng;

/// The options tests open a backend with: the kernel cache `tern` uses, and
/// the mma.sync prompt GEMM under `TERN_CUDA_WGMMA=0` (`scripts/gpu check`
/// runs the tests both ways).
pub fn options() -> CudaOptions {
    let var = |k| std::env::var_os(k);
    CudaOptions {
        kernel_cache: tern_cuda::kernel_cache_dir(var("TERN_KERNEL_CACHE"), var("XDG_CACHE_HOME"), var("HOME")),
        wgmma: !std::env::var("TERN_CUDA_WGMMA").is_ok_and(|v| v == "0"),
        ..CudaOptions::default()
    }
}

/// Device 0 with [`options`], or `None` (said why) without a GPU.
pub fn gpu() -> Option<CudaBackend> {
    gpu_with_options(&options())
}

pub fn gpu_with_options(opts: &CudaOptions) -> Option<CudaBackend> {
    match tern_cuda::devices() {
        Ok(_) => Some(CudaBackend::with_options(0, opts).expect("opening CUDA0")),
        Err(why) => {
            if std::env::var("TERN_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("TERN_REQUIRE_GPU=1 but no GPU: {why}");
            }
            eprintln!("skipped: {why}");
            None
        }
    }
}

pub fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn bytes_i32(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

pub struct Owned(pub Vec<u8>);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Binds leaf data, poisons every computed node, runs all computed nodes, and
/// returns the bytes of `outputs` and the locations.
pub fn run(b: &mut dyn Backend, g: &Graph, data: &HashMap<NodeId, Vec<u8>>, outputs: &[NodeId]) -> Vec<Vec<u8>> {
    run_staged(b, g, data, outputs, &[])
}

/// [`run`], with the weights in `staged` loaded as staged copies
/// (`Backend::load_staged`: kept in host memory, streamed in by each use).
pub fn run_staged(
    b: &mut dyn Backend,
    g: &Graph,
    data: &HashMap<NodeId, Vec<u8>>,
    outputs: &[NodeId],
    staged: &[NodeId],
) -> Vec<Vec<u8>> {
    let mut locs: Vec<Option<TensorLoc>> = vec![None; g.nodes.len()];
    let mut computed = Vec::new();
    for id in g.ids() {
        let n = g.node(id);
        let loc = match n.op {
            Op::Weight(_) => {
                let d = data[&id].clone();
                let len = d.len();
                let DType::Ggml(ty) = n.dtype else { panic!("weights are ggml types") };
                let hb = HostBytes::new(Arc::new(Owned(d)), 0..len);
                let desc = WeightDesc { ty, ne: n.ne };
                if staged.contains(&id) {
                    b.load_staged(hb, desc).unwrap().loc
                } else {
                    b.load_weight(hb, desc).unwrap().loc
                }
            }
            Op::Input(_) | Op::KvCache { .. } => {
                let d = &data[&id];
                let buffer = b.alloc(d.len()).unwrap();
                let loc = TensorLoc { buffer, offset: 0, nbytes: d.len() };
                b.write(loc, d).unwrap();
                loc
            }
            _ => {
                computed.push(id);
                let nbytes = n.nbytes();
                let buffer = b.alloc(nbytes).unwrap();
                let loc = TensorLoc { buffer, offset: 0, nbytes };
                b.write(loc, &vec![0xffu8; nbytes]).unwrap();
                loc
            }
        };
        locs[id.index()] = Some(loc);
    }
    b.compute(g, &computed, &locs).unwrap();
    outputs
        .iter()
        .map(|o| {
            let loc = locs[o.index()].unwrap();
            let mut out = vec![0u8; loc.nbytes];
            b.read(loc, &mut out).unwrap();
            out
        })
        .collect()
}

/// Runs `g` on the CPU and the GPU and checks every output within `bound`
/// (relative to the CPU output's largest magnitude). Returns the worst error.
pub fn compare(
    gpu: &mut CudaBackend,
    g: &Graph,
    data: &HashMap<NodeId, Vec<u8>>,
    outs: &[NodeId],
    bound: f64,
    what: &str,
) -> f64 {
    let mut cpu = CpuBackend::new(BackendId::CPU, 2);
    let want = run(&mut cpu, g, data, outs);
    let got = run(gpu, g, data, outs);
    let mut worst = 0.0f64;
    for (k, (w, gt)) in want.iter().zip(&got).enumerate() {
        let (w, gt) = (to_f32(w), to_f32(gt));
        let scale = w.iter().fold(0f64, |m, &v| m.max(v.abs() as f64)).max(1e-30);
        for (i, (&a, &b)) in w.iter().zip(&gt).enumerate() {
            assert!(b.is_finite(), "{what}: output {k} element {i} not written or not finite ({b})");
            let e = (a as f64 - b as f64).abs() / scale;
            assert!(e <= bound, "{what}: output {k} element {i}: cpu {a} gpu {b} (rel {e:.3e} > {bound:.0e})");
            worst = worst.max(e);
        }
    }
    worst
}

/// A ternary weight `[k, rows]` of `ty`: random values in {−1, 0, 1} times
/// one scale, or (with `blocky`) a scale per 256-block (TQ formats only).
pub fn ternary_weight(ty: GgmlType, k: usize, rows: usize, blocky: bool, rng: &mut Rng) -> Vec<u8> {
    let x: Vec<f32> = (0..k * rows)
        .map(|i| {
            let t = (rng.next_u64() % 3) as f32 - 1.0;
            let s = if blocky { 0.5 + ((i / 256) % 5) as f32 * 0.25 } else { 0.75 };
            t * s
        })
        .collect();
    let n = ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize;
    let mut out = vec![0u8; n];
    tern_quant::quantize_tensor(ty, &x, k, &mut out);
    out
}

pub fn float_weight(ty: GgmlType, k: usize, rows: usize, rng: &mut Rng) -> Vec<u8> {
    let x = rng.vec(k * rows);
    let n = ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize;
    let mut out = vec![0u8; n];
    tern_quant::quantize_tensor(ty, &x, k, &mut out);
    out
}
