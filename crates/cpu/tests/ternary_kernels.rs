//! The packed ternary kernels against the scalar reference (`tern_quant::vec_dot`
//! on the file formats), for every ternary format, both packings, every ISA
//! this machine has, and shapes that are not multiples of the tiles or chunks.
//! Bound: bit-identical (the kernels do the reference's integer sums and its
//! float operations in its order).

use tern_cpu::isa::Isa;
use tern_cpu::kernels::ternary::{gemm, gemm_with, Base3Decode, Out, PackedActs, PackedTernary};
use tern_quant::ternary::rows::Packing;
use tern_quant::{act_row_bytes, quantize_acts, quantize_tensor, vec_dot, ActType, GgmlType, TensorScale};
use tern_testutil::Rng;

/// A ternary value: 0 and +1 with probability 7/20 each, −1 with 6/20.
fn ternary(rng: &mut Rng) -> f32 {
    match rng.below(20) {
        0..=6 => 0.0,
        7..=13 => 1.0,
        _ => -1.0,
    }
}

fn isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.available()).collect()
}

/// Weights `rows × k` of `ty`, ternary-valued with row scales (or block
/// scales when `grouped`), as the file bytes.
fn weights(ty: GgmlType, k: usize, rows: usize, grouped: bool, rng: &mut Rng) -> Vec<u8> {
    let mut x = vec![0f32; k * rows];
    for (r, row) in x.chunks_exact_mut(k).enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            let s = if grouped { 0.25 * (1 + (i / 256) % 3) as f32 } else { 0.0625 * (1 + r % 5) as f32 };
            *v = ternary(rng) * s;
        }
    }
    let mut bytes = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
    quantize_tensor(ty, &x, k, &mut bytes);
    bytes
}

fn check(ty: GgmlType, k: usize, rows: usize, n: usize, grouped: bool, packing: Packing, rng: &mut Rng) {
    let w = weights(ty, k, rows, grouped, rng);
    let x: Vec<f32> = (0..k * n).map(|_| rng.f32() * 3.0).collect();
    compare(ty, [k, rows, n], &w, &x, grouped, packing);
}

/// Every ISA's `gemm` of the file-format weights `w` (`rows` of `k`) and
/// activations `x` (`n` rows of `k`) against the reference, bit for bit.
fn compare(ty: GgmlType, [k, rows, n]: [usize; 3], w: &[u8], x: &[f32], grouped: bool, packing: Packing) {
    let scale = TensorScale::of(ty, w, k * rows);
    let row_bytes = ty.row_bytes(k as u64).unwrap() as usize;
    let ab = act_row_bytes(ActType::Q8_Row, k);
    let mut want = vec![0f32; rows * n];
    for t in 0..n {
        let mut act = vec![0u8; ab];
        quantize_acts(ActType::Q8_Row, &x[t * k..(t + 1) * k], &mut act);
        for r in 0..rows {
            want[t * rows + r] = vec_dot(ty, k, &w[r * row_bytes..(r + 1) * row_bytes], scale, &act);
        }
    }
    let packed = PackedTernary::new(ty, w, k, rows, packing);
    assert_eq!(packed.layout.groups > 1, grouped);
    let decodes = match Base3Decode::best() {
        Base3Decode::Lookup => vec![Base3Decode::Lookup, Base3Decode::Compare],
        Base3Decode::Compare => vec![Base3Decode::Compare],
    };
    for isa in isas() {
        for &base3 in &decodes {
            let mut acts = PackedActs::new(k, packed.layout.k_pad, n);
            acts.quantize(x, isa);
            let mut got = vec![f32::NAN; rows * n];
            // Two row ranges, as two threads would split them.
            let mid = rows / 2;
            for range in [0..mid, mid..rows] {
                unsafe { gemm_with(&packed, range, &acts, Out { ptr: got.as_mut_ptr(), ld: rows }, isa, base3) };
            }
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let what = format!("{ty} {packing:?} {isa:?} {base3:?} k={k} rows={rows} n={n}: out {i}");
                assert_eq!(g.to_bits(), w.to_bits(), "{what}: {g} vs {w}");
            }
        }
    }
}

#[test]
fn every_format_packing_and_isa_matches_the_reference() {
    let mut rng = Rng::new(7);
    let cases: [(GgmlType, &[usize]); 5] = [
        (GgmlType::TQ2_0, &[256, 768, 2560]),
        (GgmlType::TQ1_0, &[256, 1280]),
        (GgmlType::IQ2_BN, &[64, 192, 704, 2560]),
        (GgmlType::IQ1_BN, &[64, 320, 960]),
        (GgmlType::I2_S, &[128, 384, 2560]),
    ];
    for (ty, ks) in cases {
        for &k in ks {
            for packing in [Packing::Bits2, Packing::Base3] {
                for (rows, n) in [(1, 1), (5, 1), (9, 1), (21, 1), (8, 3), (9, 4), (6, 5), (3, 9), (5, 70), (13, 70)] {
                    check(ty, k, rows, n, false, packing, &mut rng);
                }
            }
        }
    }
}

/// Prompt-sized batches take decoded panels of up to 64 rows: full and
/// partial panels, rows left over past the last 16, token tiles cut by the
/// 64-token block, and ranges (halves) that start off a panel boundary.
#[test]
fn prompt_panels_match_the_reference() {
    let mut rng = Rng::new(11);
    for (ty, k) in [(GgmlType::TQ2_0, 512), (GgmlType::IQ1_BN, 320), (GgmlType::I2_S, 384)] {
        for packing in [Packing::Bits2, Packing::Base3] {
            for (rows, n) in [(16, 12), (64, 13), (81, 70), (150, 77), (224, 140), (48, 6)] {
                check(ty, k, rows, n, false, packing, &mut rng);
            }
        }
    }
}

/// Batches of the sizes a server's steps take (every count from 1 to 64 at
/// a small k; a spread of them at the models' k), on both packings: on AVX2
/// they cross from the direct tiles to the 16-row panels of 2-row units and
/// 6-token tiles, so these cover every tile width and its remainders, whole
/// and partial panels, a lone odd row left to the direct tiles, and ranges
/// (halves) that start off a panel boundary.
#[test]
fn panels_match_the_reference_at_every_batch_size() {
    let mut rng = Rng::new(13);
    let ty = GgmlType::IQ2_BN;
    for packing in [Packing::Bits2, Packing::Base3] {
        for n in 1..=64 {
            check(ty, 256, 35, n, false, packing, &mut rng);
        }
        for (k, rows, ns) in [(2560, 37, &[2, 8, 9, 13, 16, 31, 64][..]), (6912, 19, &[3, 12, 17, 64][..])] {
            for &n in ns {
                check(ty, k, rows, n, false, packing, &mut rng);
            }
        }
    }
}

/// The largest sums the kernels' 16-bit lanes hold: every weight +1 (code
/// 2) against activations all at +127 or all at −127, over the models' k.
#[test]
fn extreme_sums_do_not_overflow() {
    let ty = GgmlType::IQ2_BN;
    for k in [2560, 6912] {
        let (rows, n) = (17, 12);
        let mut w = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).unwrap() as usize];
        quantize_tensor(ty, &vec![1.0; k * rows], k, &mut w);
        for sign in [1.0, -1.0] {
            let x = vec![sign; k * n];
            for packing in [Packing::Bits2, Packing::Base3] {
                compare(ty, [k, rows, n], &w, &x, false, packing);
            }
        }
    }
}

#[test]
fn rows_with_several_block_scales_are_exact_too() {
    let mut rng = Rng::new(11);
    for ty in [GgmlType::TQ2_0, GgmlType::TQ1_0] {
        for packing in [Packing::Bits2, Packing::Base3] {
            check(ty, 768, 5, 3, true, packing, &mut rng);
        }
    }
}

#[test]
fn activation_quantization_agrees_across_isas() {
    let mut rng = Rng::new(3);
    for k in [1, 15, 64, 100, 2560] {
        let x: Vec<f32> = (0..k * 2).map(|_| rng.f32() * 10.0).collect();
        let mut reference = PackedActs::new(k, k.next_multiple_of(320), 2);
        reference.quantize(&x, Isa::Scalar);
        for isa in isas() {
            let mut a = PackedActs::new(k, k.next_multiple_of(320), 2);
            a.quantize(&x, isa);
            for t in 0..2 {
                assert_eq!(a.q(t), reference.q(t), "{isa:?} k={k}");
                assert_eq!((a.d[t], a.sum[t]), (reference.d[t], reference.sum[t]));
            }
        }
    }
}

/// Kernel throughput on the 2B-4T shapes (not a test: run with
/// `cargo test --release -p tern-cpu --test ternary_kernels -- --ignored --nocapture`).
#[test]
#[ignore]
fn bench_ternary_kernels() {
    let mut rng = Rng::new(5);
    let isa = Isa::detected();
    for (k, rows) in [(2560, 6912), (6912, 2560)] {
        let w = weights(GgmlType::TQ2_0, k, rows, false, &mut rng);
        for packing in [Packing::Bits2, Packing::Base3] {
            let packed = PackedTernary::new(GgmlType::TQ2_0, &w, k, rows, packing);
            for n in [1, 16, 64] {
                let x: Vec<f32> = (0..k * n).map(|_| rng.f32()).collect();
                let mut acts = PackedActs::new(k, packed.layout.k_pad, n);
                acts.quantize(&x, isa);
                let mut y = vec![0f32; rows * n];
                let reps = if n == 1 { 200 } else { 10 };
                let t = std::time::Instant::now();
                for _ in 0..reps {
                    unsafe { gemm(&packed, 0..rows, &acts, Out { ptr: y.as_mut_ptr(), ld: rows }, isa) };
                }
                let s = t.elapsed().as_secs_f64() / reps as f64;
                eprintln!(
                    "{packing:?} {k}x{rows} n={n} ({isa:?}, 1 thread): {:.3} ms, {:.1} GB/s of weights, {:.1} GMAC/s",
                    s * 1e3,
                    packed.bytes() as f64 / s / 1e9,
                    (k * rows * n) as f64 / s / 1e9
                );
            }
        }
    }
}

/// `weight_read_bytes` (what `tern info --plan` counts per token) is the
/// size of the layout the backend repacks a ternary matrix into, on every
/// ISA level; other weights are read as the file holds them.
#[test]
fn read_bytes_are_the_repacked_layouts() {
    let mut rng = Rng::new(5);
    for (ty, k) in [
        (GgmlType::TQ2_0, 2560),
        (GgmlType::TQ1_0, 1280),
        (GgmlType::IQ2_BN, 704),
        (GgmlType::IQ1_BN, 960),
        (GgmlType::I2_S, 384),
    ] {
        let rows = 7;
        let bytes = weights(ty, k, rows, false, &mut rng);
        for isa in isas() {
            let packed = PackedTernary::new(ty, &bytes, k, rows, tern_cpu::packing(ty, isa));
            let read = tern_cpu::weight_read_bytes(ty, [k, rows, 1, 1], bytes.len() as u64, Some(isa));
            assert_eq!(read, packed.bytes() as u64, "{ty} k={k} {isa:?}");
        }
    }
    let q4k = tern_cpu::weight_read_bytes(GgmlType::Q4_K, [2048, 8, 1, 1], 9216, None);
    assert_eq!(q4k, 9216, "a block format is read in place");
    let experts = tern_cpu::weight_read_bytes(GgmlType::TQ2_0, [256, 4, 8, 1], 1000, None);
    assert_eq!(experts, 1000, "a 3-D ternary weight stays in its file layout");
}
