//! Row lookups (`get_rows`) on the CPU backend against the scalar dequantize:
//! a prompt's rows are split over threads, so every row of a long id list,
//! in any order and with repeats, must be exactly the reference row.

use std::sync::Arc;

use tern_backend::{Backend, BackendId, HostBytes, TensorLoc, WeightDesc};
use tern_cpu::CpuBackend;
use tern_graph::{GgmlType, Graph, InputKind};

struct Owned(Vec<u8>);

impl AsRef<[u8]> for Owned {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

#[test]
fn long_lookups_on_many_threads_equal_the_reference_rows() {
    let (k, rows) = (512usize, 97usize);
    let mut s = 7u64;
    let mut next = || {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        s >> 33
    };
    let ids: Vec<i32> = (0..100).map(|_| (next() % rows as u64) as i32).collect();
    for ty in [GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::TQ2_0, GgmlType::TQ1_0, GgmlType::IQ2_BN] {
        let values: Vec<f32> = (0..k * rows)
            .map(|_| if ty.is_ternary() { (next() % 3) as f32 - 1.0 } else { (next() % 2001) as f32 / 1000.0 - 1.0 })
            .collect();
        let mut table = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
        tern_quant::quantize_tensor(ty, &values, k, &mut table);

        let mut g = Graph::new();
        let t = g.weight(0, "table", ty, [k, rows, 1, 1]);
        let i = g.input(InputKind::Tokens, ids.len());
        let y = g.get_rows(t, i);
        let mut b = CpuBackend::new(BackendId::CPU, 3);
        let len = table.len();
        let tl = b
            .load_weight(HostBytes::new(Arc::new(Owned(table.clone())), 0..len), WeightDesc { ty, ne: [k, rows, 1, 1] })
            .unwrap()
            .loc;
        let id_bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
        let il = TensorLoc { buffer: b.alloc(id_bytes.len()).unwrap(), offset: 0, nbytes: id_bytes.len() };
        b.write(il, &id_bytes).unwrap();
        let n = g.node(y).nbytes();
        let yl = TensorLoc { buffer: b.alloc(n).unwrap(), offset: 0, nbytes: n };
        b.write(yl, &vec![0xffu8; n]).unwrap();
        let mut locs = vec![None; g.nodes.len()];
        (locs[t.index()], locs[i.index()], locs[y.index()]) = (Some(tl), Some(il), Some(yl));
        b.compute(&g, &[y], &locs).unwrap();
        let mut out = vec![0u8; n];
        b.read(yl, &mut out).unwrap();
        let got: Vec<f32> = out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();

        let row_bytes = table.len() / rows;
        let scale = tern_quant::TensorScale::of(ty, &table, k * rows);
        let mut want = vec![0f32; k];
        for (j, &id) in ids.iter().enumerate() {
            let r = id as usize;
            tern_quant::dequantize_row(ty, &table[r * row_bytes..(r + 1) * row_bytes], scale, &mut want);
            assert_eq!(&got[j * k..(j + 1) * k], &want[..], "{ty}: lookup {j} (row {id})");
        }
    }
}
