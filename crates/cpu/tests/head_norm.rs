//! The per-head RMS norm (`Op::HeadNorm`, Qwen3's q/k norms) on the CPU
//! backend against a float64 formula: each `head_dim` slice of a row is
//! normalised on its own and multiplied by the one weight row.
//! Bound: |Δ| ≤ 1e-5 · (1 + |y|) (one f32 rounding per operation).

use std::sync::Arc;

use tern_backend::{Backend, BackendId, HostBytes, TensorLoc, WeightDesc};
use tern_cpu::CpuBackend;
use tern_graph::{GgmlType, Graph};

struct Owned(Vec<u8>);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn every_head_is_normed_alone() {
    let mut s = 11u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (s >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for (head_dim, heads, tokens, threads) in [(64usize, 4usize, 3usize, 1usize), (128, 8, 17, 3), (48, 2, 1, 2)] {
        // Heads of very different magnitude: a whole-row norm would not match.
        let x: Vec<f32> = (0..head_dim * heads * tokens).map(|i| next() * (1 + i / head_dim % 5) as f32).collect();
        let w: Vec<f32> = (0..head_dim).map(|_| next()).collect();
        let eps = 1e-6f32;

        let mut g = Graph::new();
        let xn = g.weight(0, "x", GgmlType::F32, [head_dim * heads, tokens, 1, 1]);
        let wn = g.weight(1, "w", GgmlType::F32, [head_dim, 1, 1, 1]);
        let y = g.head_norm(xn, wn, eps);
        let mut b = CpuBackend::new(BackendId::CPU, threads);
        let mut load = |data: &[f32], ne: [usize; 4]| {
            let v = bytes(data);
            let len = v.len();
            b.load_weight(HostBytes::new(Arc::new(Owned(v)), 0..len), WeightDesc { ty: GgmlType::F32, ne }).unwrap().loc
        };
        let xl = load(&x, [head_dim * heads, tokens, 1, 1]);
        let wl = load(&w, [head_dim, 1, 1, 1]);
        let n = g.node(y).nbytes();
        let yl = TensorLoc { buffer: b.alloc(n).unwrap(), offset: 0, nbytes: n };
        let mut locs = vec![None; g.nodes.len()];
        (locs[xn.index()], locs[wn.index()], locs[y.index()]) = (Some(xl), Some(wl), Some(yl));
        b.compute(&g, &[y], &locs).unwrap();
        let mut out = vec![0u8; n];
        b.read(yl, &mut out).unwrap();
        let got: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();

        for (h, (xs, ys)) in x.chunks_exact(head_dim).zip(got.chunks_exact(head_dim)).enumerate() {
            let ms = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / head_dim as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            for (i, (&xv, &yv)) in xs.iter().zip(ys).enumerate() {
                let want = xv as f64 * inv * w[i] as f64;
                let d = (yv as f64 - want).abs();
                assert!(d <= 1e-5 * (1.0 + want.abs()), "head_dim {head_dim}, head {h}, dim {i}: {yv} against {want}");
            }
        }
    }
}
