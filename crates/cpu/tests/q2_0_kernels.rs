//! The Q2_0 kernels (one-token GEMV and prompt panels, AVX2) against the
//! reference arithmetic written out in float64 from the raw bytes: per
//! 32-weight half `d_w · d_a · Σ (code − 1)·q`, summed. Every code 0..=3
//! (so +2 too), random f16 scales of both signs, odd block and row counts.
//! Bound: |Δ| ≤ 1e-5 · Σ |d_w · d_a| · Σ (code·|q| + |q|) + 1e-30 (f32 sums
//! of partial sums of `code·q` and `q` in another order).
#![cfg(target_arch = "x86_64")]

use tern_cpu::kernels::q2_0::{gemm, gemv, Out, Q2Acts};
use tern_cpu::pool::Pool;
use tern_quant::{ActType, BlockQ8_0};
use tern_testutil::Rng;

fn weights(rows: usize, k: usize, rng: &mut Rng) -> Vec<u8> {
    let mut w = Vec::with_capacity(rows * k / 64 * 18);
    for _ in 0..rows * k / 64 {
        let d = half::f16::from_f32(rng.f32() * 0.1);
        w.extend_from_slice(&d.to_le_bytes());
        w.extend((0..16).map(|_| rng.next_u64() as u8));
    }
    w
}

/// (reference value, bound) of row `r` against token `x`.
fn reference(w: &[u8], r: usize, k: usize, x: &[f32]) -> (f64, f64) {
    let mut act = vec![0u8; tern_quant::act_row_bytes(ActType::Q8_0, k)];
    tern_quant::quantize_acts(ActType::Q8_0, x, &mut act);
    let acts = tern_quant::cast_blocks::<BlockQ8_0>(&act);
    let row = &w[r * k / 64 * 18..(r + 1) * k / 64 * 18];
    let (mut sum, mut mag) = (0f64, 0f64);
    for (b, blk) in row.chunks_exact(18).enumerate() {
        let dw = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32() as f64;
        for h in 0..2 {
            let a = &acts[2 * b + h];
            let (mut isum, mut abs) = (0i32, 0i32);
            for e in 0..32 {
                let j = 32 * h + e;
                let code = ((blk[2 + j / 4] >> (2 * (j % 4))) & 3) as i32;
                let q = a.qs[e] as i32;
                isum += (code - 1) * q;
                // The kernels' partial sums are of c·q and of q apart.
                abs += code * q.abs() + q.abs();
            }
            let scale = dw * a.scale() as f64;
            sum += scale * isum as f64;
            mag += (scale * abs as f64).abs();
        }
    }
    (sum, 1e-5 * mag + 1e-30)
}

fn check(rows: usize, k: usize, m: usize, seed: u64) {
    check_codes(rows, k, m, seed, None)
}

/// As `check`, with every code byte `fill` when given (0x00, 0x55, 0xAA,
/// 0xFF: −1, 0, +1, +2 throughout).
fn check_codes(rows: usize, k: usize, m: usize, seed: u64, fill: Option<u8>) {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
        eprintln!("skipped: no AVX2");
        return;
    }
    let mut rng = Rng::new(seed);
    let mut w = weights(rows, k, &mut rng);
    if let Some(f) = fill {
        for b in w.chunks_exact_mut(18) {
            b[2..].fill(f);
        }
    }
    let x: Vec<f32> = (0..m * k).map(|i| rng.f32() * (1 + i % 7) as f32).collect();
    for planes in [true, false] {
        let acts = Q2Acts::new(&x, k, planes, &Pool::new(2));
        let mut y = vec![f32::NAN; m * rows];
        let out = Out { ptr: y.as_mut_ptr(), ld: rows };
        // Two row ranges, as two threads would take them.
        let split = rows / 3;
        unsafe {
            if planes {
                gemv(&w, 0..split, &acts, out);
                gemv(&w, split..rows, &acts, out);
            } else {
                let mut panel = Vec::new();
                gemm(&w, 0..split, &acts, out, &mut panel);
                gemm(&w, split..rows, &acts, out, &mut panel);
            }
        }
        for t in 0..m {
            for r in 0..rows {
                let (want, bound) = reference(&w, r, k, &x[t * k..(t + 1) * k]);
                let got = y[t * rows + r] as f64;
                assert!(
                    (got - want).abs() <= bound,
                    "{} rows {rows} k {k} m {m}: row {r} token {t}: {got} against {want} (bound {bound:e})",
                    if planes { "gemv" } else { "gemm" }
                );
            }
        }
    }
}

#[test]
fn one_token() {
    check(37, 64 * 7, 1, 1);
    check(5, 64, 1, 2);
}

#[test]
fn each_code_alone() {
    for (i, fill) in [0x00u8, 0x55, 0xAA, 0xFF, 0xE4].into_iter().enumerate() {
        check_codes(19, 64 * 3, 1, 10 + i as u64, Some(fill));
        check_codes(19, 64 * 3, 5, 20 + i as u64, Some(fill));
    }
}

#[test]
fn a_few_tokens_and_prompts() {
    check(33, 64 * 5, 3, 3);
    check(16, 128, 2, 4);
    check(47, 64 * 9, 7, 5);
}
