//! The prompt GEMMs (`tern_cpu::kernels::blocks::gemm`) against the scalar
//! reference `tern_quant::vec_dot`, result by result.
//!
//! Bound (derived in `tests/common/mod.rs`, `dot_tol`): `|Δ| ≤ (3N + 10)·u·S`
//! for the k-quants and `2(N + 3)·u·S` for the 32-element formats, `N` the
//! row's blocks, `u = 2⁻²⁴`, `S = Σ|w_i·a_i|` over the dequantized values.
//! Every block's integer sums are exact in both; only the f32 scaling and
//! the order of the sums differ (per i32 lane, then across lanes, against
//! the reference's per-block order). In Q2_K/Q4_K/Q5_K the two parts of
//! `w = d·sc·q − dmin·m` are rounded separately and may cancel, so their
//! `S` also counts the parts (see [`bound_scale`]).
//!
//! `cargo test --release -p tern-cpu --test gemm_kernels -- --ignored --nocapture`
//! prints single-thread GMAC/s of the GEMMs against the four-row and one-row
//! kernels on prompt-like shapes.

use std::time::Instant;

mod common;

use tern_cpu::isa::Isa;
use tern_cpu::kernels::blocks::{dot4_fn, dot_fn, gemm_fn, gemm_registry, Gemm};
use tern_graph::Precision;
use tern_quant::{
    act_row_bytes, act_type, dequantize_acts, dequantize_row, quantize_acts, quantize_row, row_bytes, vec_dot,
    GgmlType, TensorScale,
};
use tern_testutil::Rng;

const TYPES: [GgmlType; 9] = [
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::Q5_0,
];

/// Offsets of the f16 scales in a block (made finite in random bytes).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        _ => &[0],
    }
}

fn weight_row(ty: GgmlType, k: usize, rng: &mut Rng, raw: bool) -> Vec<u8> {
    let mut out = vec![0u8; row_bytes(ty, k)];
    if raw {
        out.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
        for block in out.chunks_exact_mut(ty.layout().block_bytes) {
            for &f in f16_fields(ty) {
                block[f..f + 2].copy_from_slice(&half::f16::from_f32(rng.f32() * 0.01).to_le_bytes());
            }
        }
    } else {
        let scale = 0.02 * (1.0 + rng.below(100) as f32);
        let x = rng.normals(k, scale);
        quantize_row(ty, &x, &mut out);
    }
    out
}

fn act_row(ty: GgmlType, k: usize, rng: &mut Rng) -> Vec<u8> {
    let scale = 0.1 * (1.0 + rng.below(50) as f32);
    let x = rng.normals(k, scale);
    let mut out = vec![0u8; act_row_bytes(act_type(ty), k)];
    quantize_acts(act_type(ty), &x, &mut out);
    out
}

/// `S` of the bound: `Σ|w·a|`, and for Q2_K/Q4_K/Q5_K twice the min's part
/// `Σ|dmin·m·a|` on top (the dequantized row with its codes zeroed is
/// `−dmin·m` per element; `|d·sc·q| ≤ |w| + |dmin·m|`).
fn bound_scale(ty: GgmlType, k: usize, w: &[u8], a: &[u8]) -> f64 {
    let (mut wf, mut af) = (vec![0f32; k], vec![0f32; k]);
    dequantize_row(ty, w, TensorScale::ONE, &mut wf);
    dequantize_acts(act_type(ty), a, &mut af);
    let mut s: f64 = wf.iter().zip(&af).map(|(&w, &a)| (w as f64 * a as f64).abs()).sum();
    if let Some(codes) = common::min_format_codes(ty) {
        let mut zeroed = w.to_vec();
        let bb = ty.layout().block_bytes;
        for block in zeroed.chunks_exact_mut(bb) {
            block[codes.clone()].fill(0);
        }
        dequantize_row(ty, &zeroed, TensorScale::ONE, &mut wf);
        s += 2.0 * wf.iter().zip(&af).map(|(&m, &a)| (m as f64 * a as f64).abs()).sum::<f64>();
    }
    s
}

fn isas() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|i| i.available() && *i != Isa::Scalar)
}

/// Every (rows, tokens) remainder of the 2 × 4 tiles and the 8-row groups.
const SHAPES: [(usize, usize); 8] = [(1, 1), (2, 4), (3, 5), (8, 8), (9, 3), (17, 7), (5, 2), (16, 13)];

#[test]
fn gemms_match_the_reference() {
    let mut rng = Rng::new(0x6e33);
    let mut checked = 0;
    for ty in TYPES {
        let ks: &[usize] = if ty.block_elems() == 256 { &[256, 768, 2048] } else { &[32, 96, 1408] };
        let mut worst = 0.0f64;
        for isa in isas() {
            let Some(f) = gemm_fn(ty, isa) else { continue };
            for &k in ks {
                for (si, &(nr, nt)) in SHAPES.iter().enumerate() {
                    let raw = si % 2 == 1;
                    let rows: Vec<Vec<u8>> = (0..nr).map(|_| weight_row(ty, k, &mut rng, raw)).collect();
                    let acts: Vec<Vec<u8>> = (0..nt).map(|_| act_row(ty, k, &mut rng)).collect();
                    let (rr, aa): (Vec<&[u8]>, Vec<&[u8]>) =
                        (rows.iter().map(|r| &r[..]).collect(), acts.iter().map(|a| &a[..]).collect());
                    let mut out = vec![f32::NAN; nr * nt];
                    // SAFETY: gemm_fn returns only kernels this machine supports.
                    unsafe { f(&mut Gemm { k, rows: &rr, acts: &aa, out: &mut out }) };
                    for t in 0..nt {
                        for r in 0..nr {
                            let want = vec_dot(ty, k, &rows[r], TensorScale::ONE, &acts[t]) as f64;
                            let got = out[t * nr + r] as f64;
                            let s = bound_scale(ty, k, &rows[r], &acts[t]);
                            let err = (got - want).abs();
                            let tol = common::dot_tol(ty, k, Precision::Paired);
                            assert!(
                                err <= tol * s,
                                "{ty} {isa:?} k={k} {nr}x{nt} raw={raw} (r {r}, t {t}): got {got}, want {want}, S={s}"
                            );
                            if s > 0.0 {
                                worst = worst.max(err / s);
                            }
                            checked += 1;
                        }
                    }
                }
            }
        }
        println!("{ty:>7}: max |Δ|/S = {worst:.3e}");
    }
    assert!(checked > 0 || !Isa::Avx2.available(), "no GEMM ran on an AVX2 machine");
}

#[test]
fn every_registered_gemm_is_checked() {
    for e in gemm_registry() {
        assert!(TYPES.contains(&e.ty), "{} has a GEMM the tests do not cover", e.ty);
    }
}

#[test]
#[should_panic(expected = "weight row byte length")]
fn wrong_lengths_panic() {
    let Some(f) = gemm_fn(GgmlType::Q4_K, Isa::detected()) else {
        panic!("weight row byte length (no kernel on this machine)");
    };
    let (w, a) = (vec![0u8; 100], vec![0u8; 292]);
    let mut out = [0f32; 1];
    // SAFETY: gemm_fn returns only kernels this machine supports.
    unsafe { f(&mut Gemm { k: 256, rows: &[&w], acts: &[&a], out: &mut out }) };
}

/// Single-thread GMAC/s of `f` over `nr` rows × `nt` tokens of length `k`.
fn gmacs(k: usize, nr: usize, nt: usize, f: &mut dyn FnMut()) -> f64 {
    f();
    let (start, mut runs) = (Instant::now(), 0);
    while start.elapsed().as_secs_f64() < 0.5 || runs < 2 {
        f();
        runs += 1;
    }
    (k * nr * nt * runs) as f64 / start.elapsed().as_secs_f64() / 1e9
}

#[test]
#[ignore = "micro-benchmark; run in release with --ignored --nocapture"]
fn bench_gemms() {
    let mut rng = Rng::new(7);
    let isa = Isa::detected();
    println!("single thread, GMAC/s ({isa:?}): gemm vs four-row vs one-row kernels");
    for ty in TYPES {
        for (k, nr, nt) in [(2048usize, 64usize, 512usize), (2048, 768, 32), (1408, 256, 32)] {
            if !k.is_multiple_of(ty.block_elems()) {
                continue;
            }
            let rows: Vec<Vec<u8>> = (0..nr).map(|_| weight_row(ty, k, &mut rng, false)).collect();
            let acts: Vec<Vec<u8>> = (0..nt).map(|_| act_row(ty, k, &mut rng)).collect();
            let (rr, aa): (Vec<&[u8]>, Vec<&[u8]>) =
                (rows.iter().map(|r| &r[..]).collect(), acts.iter().map(|a| &a[..]).collect());
            let mut out = vec![0f32; nr * nt];
            let g = gemm_fn(ty, isa).expect("a GEMM");
            // SAFETY: as above.
            let gemm = gmacs(k, nr, nt, &mut || unsafe { g(&mut Gemm { k, rows: &rr, acts: &aa, out: &mut out }) });
            let one = dot_fn(ty, isa).expect("a kernel");
            let d4 = dot4_fn(ty, isa);
            let mut sink = 0f32;
            let rows_dot = gmacs(k, nr, nt, &mut || {
                for r in &rr {
                    let mut t = 0;
                    if let Some(d4) = d4 {
                        while t + 4 <= nt {
                            // SAFETY: as above.
                            sink += unsafe { d4(k, r, [aa[t], aa[t + 1], aa[t + 2], aa[t + 3]]) }[0];
                            t += 4;
                        }
                    }
                    for a in &aa[t..] {
                        // SAFETY: as above.
                        sink += unsafe { one(k, r, a) };
                    }
                }
            });
            std::hint::black_box(sink);
            println!("{ty:>7} k={k} {nr} rows x {nt} tokens: gemm {gemm:6.2}  row dots {rows_dot:6.2}");
        }
    }
}
