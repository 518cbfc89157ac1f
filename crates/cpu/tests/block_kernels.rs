//! The SIMD block-format dot products (`tern_cpu::kernels::blocks`) against the
//! scalar reference `tern_quant::vec_dot`, on every ISA level this machine has.
//!
//! Bounds, with `S = Σ|w_i·a_i|` over the dequantized weights and activations:
//! * integer formats: `|Δ| ≤ 1e-5·S` (the block integer sums are exact; only
//!   the f32 summation of block results may be reordered), and the k-quants,
//!   IQ4_XS, Q4_1 and Q5_1 (which keep the reference's block order) must
//!   match it bit for bit;
//! * F32/F16/BF16: `|Δ| ≤ 1e-6·S` (f32 lanes against the reference's f64).
//!
//! `cargo test --release -p tern-cpu --test block_kernels -- --ignored --nocapture`
//! prints a single-thread GB/s micro-benchmark (`BENCH_TYPES=Q6_K,F16` to
//! limit it to some types).

use std::time::{Duration, Instant};

use tern_cpu::isa::Isa;
use tern_cpu::kernels::blocks::{dot_fn, registry, tile_registry, DotFn};
use tern_quant::{
    act_row_bytes, act_type, dequantize_acts, dequantize_row, quantize_acts, quantize_row, row_bytes, vec_dot,
    GgmlType, TensorScale,
};
use tern_testutil::Rng;

/// Roughly normal (sum of four uniforms), occasionally a 10× outlier.
fn normalish(rng: &mut Rng) -> f32 {
    let v = (0..4).map(|_| rng.f32()).sum::<f32>() * 0.87;
    if rng.next_u64().is_multiple_of(97) {
        v * 10.0
    } else {
        v
    }
}

const INT_TYPES: [GgmlType; 13] = [
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::IQ4_NL,
    GgmlType::Q1_0,
    GgmlType::Q5_0,
    GgmlType::Q4_1,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::IQ4_XS,
];
const FLOAT_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];

/// The formats whose kernels sum blocks in the reference's order, and so
/// return its bits.
fn is_bit_exact(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::IQ4_XS
            | GgmlType::Q4_1
            | GgmlType::Q5_1
    )
}

/// Row lengths: several multiples of the block, odd block counts included, and
/// counts that leave every batch tail of the kernels (8/16 blocks, 8/16/32/64
/// float lanes, 8/16 activation blocks of the 64- and 128-element formats)
/// non-empty.
fn lengths(ty: GgmlType) -> &'static [usize] {
    match ty.block_elems() {
        256 => &[256, 768, 1792, 2560, 6912],
        128 => &[128, 384, 896, 1024, 1152, 2176, 2560, 4224, 6912],
        64 => &[64, 192, 448, 512, 576, 1088, 2560, 4160, 6912],
        32 => &[32, 96, 256, 544, 864, 2560, 2592, 6912],
        _ => &[1, 7, 8, 15, 31, 33, 64, 100, 127, 1000, 2560, 6912],
    }
}

/// Offsets of the f16 scale fields inside one block (finite values are
/// written there when weights are random bytes).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q8_0
        | GgmlType::Q4_0
        | GgmlType::IQ4_NL
        | GgmlType::Q2_0
        | GgmlType::Q1_0
        | GgmlType::Q5_0
        | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        _ => &[],
    }
}

/// A weight row of `n` elements: quantized random data (`raw == false`), or
/// random bytes with finite random f16 scales (`raw == true`, integer types
/// only: every code and sub-scale bit pattern, e.g. Q8_0's −128 and Q6_K's
/// −128 sub-scale, which the quantizers never write).
fn weight_row(ty: GgmlType, n: usize, rng: &mut Rng, raw: bool) -> Vec<u8> {
    let mut out = vec![0u8; row_bytes(ty, n)];
    if raw {
        out.iter_mut().for_each(|b| *b = rng.next_u64() as u8);
        let bb = ty.layout().block_bytes;
        for block in out.chunks_exact_mut(bb) {
            for &f in f16_fields(ty) {
                let d = half::f16::from_f32(rng.f32() * 0.01);
                block[f..f + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
    } else {
        let scale = 0.02 * (1.0 + rng.below(100) as f32);
        let x: Vec<f32> = (0..n).map(|_| normalish(rng) * scale).collect();
        quantize_row(ty, &x, &mut out);
    }
    out
}

fn act_row(ty: GgmlType, n: usize, rng: &mut Rng) -> Vec<u8> {
    let scale = 0.1 * (1.0 + rng.below(50) as f32);
    let x: Vec<f32> = (0..n).map(|_| normalish(rng) * scale).collect();
    let mut out = vec![0u8; act_row_bytes(act_type(ty), n)];
    quantize_acts(act_type(ty), &x, &mut out);
    out
}

/// `Σ|w_i·a_i|` over the values the dot product multiplies.
fn abs_dot(ty: GgmlType, n: usize, w: &[u8], act: &[u8]) -> f64 {
    let mut wf = vec![0.0f32; n];
    let mut af = vec![0.0f32; n];
    dequantize_row(ty, w, TensorScale::ONE, &mut wf);
    dequantize_acts(act_type(ty), act, &mut af);
    wf.iter().zip(&af).map(|(&w, &a)| (w as f64 * a as f64).abs()).sum()
}

/// Copies `bytes` to `offset` bytes into a fresh buffer (misaligns the data).
fn at_offset(bytes: &[u8], offset: usize) -> Vec<u8> {
    let mut v = vec![0u8; offset + bytes.len()];
    v[offset..].copy_from_slice(bytes);
    v
}

fn isas() -> impl Iterator<Item = Isa> {
    Isa::ALL.into_iter().filter(|i| i.available() && *i != Isa::Scalar)
}

/// Checks every kernel of `ty` on every available ISA against `vec_dot`;
/// returns the largest `|Δ|/S` seen per ISA.
fn check_type(ty: GgmlType, tol: f64, seed: u64) -> Vec<(Isa, f64)> {
    let mut rng = Rng::new(seed);
    let mut worst: Vec<(Isa, f64)> = isas().map(|i| (i, 0.0)).collect();
    let raw_variants: &[bool] = if FLOAT_TYPES.contains(&ty) { &[false] } else { &[false, true] };
    for &n in lengths(ty) {
        for &raw in raw_variants {
            for rep in 0..4 {
                let w = weight_row(ty, n, &mut rng, raw);
                let a = act_row(ty, n, &mut rng);
                let want = vec_dot(ty, n, &w, TensorScale::ONE, &a);
                let s = abs_dot(ty, n, &w, &a);
                let (wo, ao) = (at_offset(&w, 1 + rep), at_offset(&a, 3 - rep));
                let (w2, a2) = (&wo[1 + rep..], &ao[3 - rep..]);
                for (isa, worst) in worst.iter_mut() {
                    let f = dot_fn(ty, *isa).unwrap_or_else(|| panic!("no {ty} kernel for {isa:?}"));
                    // SAFETY: `isa` is available on this machine.
                    let got = unsafe { f(n, w2, a2) };
                    let err = (got as f64 - want as f64).abs();
                    let ctx = format!("{ty} {isa:?} n={n} raw={raw} rep={rep}: got {got}, want {want}, S={s}");
                    assert!(got.is_finite(), "{ctx}");
                    assert!(err <= tol * s, "{ctx}: |Δ| = {err:e} > {tol:e}·S");
                    if is_bit_exact(ty) {
                        assert_eq!(got.to_bits(), want.to_bits(), "{ctx}: the kernels keep the reference's order");
                    }
                    if s > 0.0 {
                        *worst = worst.max(err / s);
                    }
                }
            }
        }
    }
    worst
}

fn report(ty: GgmlType, tol: f64, worst: &[(Isa, f64)]) {
    for (isa, e) in worst {
        println!("{ty:>7} {:>7}: max |Δ|/Σ|w·a| = {e:.3e} (bound {tol:e})", isa.name());
    }
}

/// Every four-row kernel returns, for each of its rows, the bits of its
/// type's one-row kernel at the same ISA level (random and raw weight bytes,
/// every length the format's tests use).
#[test]
fn four_row_kernels_are_four_one_row_kernels() {
    let mut rng = Rng::new(0x4444);
    let mut checked = 0;
    for e in tile_registry().filter(|e| e.isa.available()) {
        let one = dot_fn(e.ty, e.isa).expect("a one-row kernel beside the tile");
        for &n in lengths(e.ty) {
            for raw in [false, true] {
                let w = weight_row(e.ty, n, &mut rng, raw);
                let acts: Vec<Vec<u8>> = (0..4).map(|_| act_row(e.ty, n, &mut rng)).collect();
                // SAFETY: both kernels are for an available ISA level.
                let got = unsafe { (e.dot4)(n, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]) };
                for (t, a) in acts.iter().enumerate() {
                    let want = unsafe { one(n, &w, a) };
                    assert_eq!(got[t].to_bits(), want.to_bits(), "{} {:?} n={n} row {t}", e.ty, e.isa);
                }
                checked += 1;
            }
        }
    }
    if Isa::Avx2.available() {
        assert!(checked > 0, "no four-row kernel ran");
    }
}

#[test]
fn integer_formats_match_reference() {
    for (i, ty) in INT_TYPES.into_iter().enumerate() {
        let worst = check_type(ty, 1e-5, 0x1234_5678 + i as u64);
        report(ty, 1e-5, &worst);
    }
}

#[test]
fn float_formats_match_reference() {
    for (i, ty) in FLOAT_TYPES.into_iter().enumerate() {
        let worst = check_type(ty, 1e-6, 0xABCD_0000 + i as u64);
        report(ty, 1e-6, &worst);
    }
}

/// The AVX-512 kernels of the Q8_0-activation formats are exact for every
/// activation byte, −128 included (which `quantize_acts` never writes and the
/// AVX2 sign trick cannot take); so are the AVX2 kernels of Q4_1 and Q5_1,
/// whose codes are unsigned.
#[test]
fn q8_0_acts_take_any_byte() {
    let mut rng = Rng::new(0x5EED);
    let q8_0_weights = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::IQ4_NL, GgmlType::Q1_0, GgmlType::Q5_0];
    let with_min = [GgmlType::Q4_1, GgmlType::Q5_1];
    let avx512 = Isa::Avx512.available().then_some(Isa::Avx512);
    let cases = q8_0_weights.into_iter().chain(with_min).filter_map(|ty| avx512.map(|isa| (ty, isa)));
    let avx2 = with_min.into_iter().filter(|_| Isa::Avx2.available()).map(|ty| (ty, Isa::Avx2));
    for (ty, isa) in cases.chain(avx2) {
        let f = dot_fn(ty, isa).unwrap();
        for &n in lengths(ty).iter().filter(|&&n| n % 32 == 0 && n <= 2560) {
            for _ in 0..4 {
                let w = weight_row(ty, n, &mut rng, true);
                let mut a = weight_row(GgmlType::Q8_0, n, &mut rng, true);
                a[2] = 0x80; // an activation quant of −128
                let want = vec_dot(ty, n, &w, TensorScale::ONE, &a);
                let s = abs_dot(ty, n, &w, &a);
                // SAFETY: `isa` is available.
                let got = unsafe { f(n, &w, &a) };
                assert!(
                    (got as f64 - want as f64).abs() <= 1e-5 * s,
                    "{ty} {isa:?} n={n}: got {got}, want {want}, S={s}"
                );
                assert!(!is_bit_exact(ty) || got.to_bits() == want.to_bits(), "{ty} {isa:?} n={n}: {got} != {want}");
            }
        }
    }
}

/// Q1_0 rows of each sign alone and mixed, with random f16 scales, odd
/// block counts, and an activation quant of −128 (these kernels take any
/// byte): within the integer formats' bound of the scalar twin on every ISA
/// level. (Q2_0's kernels are tested in `q2_0_kernels.rs`.)
#[test]
fn low_bit_formats_every_code() {
    let mut rng = Rng::new(0x0202);
    for ty in [GgmlType::Q1_0] {
        for &n in lengths(ty) {
            for fill in [0x00u8, 0x55, 0xAA, 0xFF, 0xE4, 0x1B] {
                let mut w = weight_row(ty, n, &mut rng, true);
                for b in w.chunks_exact_mut(18) {
                    b[2..].fill(fill);
                }
                let mut a = act_row(ty, n, &mut rng);
                a[2 + 34 * (n / 64)] = 0x80;
                let want = vec_dot(ty, n, &w, TensorScale::ONE, &a);
                let s = abs_dot(ty, n, &w, &a);
                for isa in isas() {
                    let f = dot_fn(ty, isa).unwrap();
                    // SAFETY: `isa` is available on this machine.
                    let got = unsafe { f(n, &w, &a) };
                    let ctx = format!("{ty} {isa:?} n={n} codes {fill:#04x}: got {got}, want {want}, S={s}");
                    assert!((got as f64 - want as f64).abs() <= 1e-5 * s, "{ctx}");
                }
            }
        }
    }
}

/// Q5_0 and Q5_1 rows with every fifth bit clear, set, alternating and
/// random, over nibbles of one value and mixed, with random f16 scales (and
/// minimums), odd block counts, and for Q5_1 an activation quant of −128:
/// within the integer formats' bound of the scalar twin on every ISA level
/// (Q5_1: its bits).
#[test]
fn five_bit_formats_every_code() {
    let mut rng = Rng::new(0x0505);
    for (ty, qh_at) in [(GgmlType::Q5_0, 2), (GgmlType::Q5_1, 4)] {
        let bb = ty.layout().block_bytes;
        for &n in lengths(ty) {
            for qh in [0x0000_0000u32, 0xFFFF_FFFF, 0x5555_5555, 0x0F0F_F0F0, rng.next_u64() as u32] {
                for fill in [None, Some(0x00u8), Some(0xFF), Some(0x8F), Some(0x1E)] {
                    let mut w = weight_row(ty, n, &mut rng, true);
                    for b in w.chunks_exact_mut(bb) {
                        b[qh_at..qh_at + 4].copy_from_slice(&qh.to_le_bytes());
                        if let Some(fill) = fill {
                            b[qh_at + 4..].fill(fill);
                        }
                    }
                    let mut a = act_row(ty, n, &mut rng);
                    if ty == GgmlType::Q5_1 {
                        a[2 + 34 * (n / 64)] = 0x80;
                    }
                    let want = vec_dot(ty, n, &w, TensorScale::ONE, &a);
                    let s = abs_dot(ty, n, &w, &a);
                    for isa in isas() {
                        let f = dot_fn(ty, isa).unwrap();
                        // SAFETY: `isa` is available on this machine.
                        let got = unsafe { f(n, &w, &a) };
                        let ctx =
                            format!("{ty} {isa:?} n={n} qh {qh:#010x} qs {fill:?}: got {got}, want {want}, S={s}");
                        assert!((got as f64 - want as f64).abs() <= 1e-5 * s, "{ctx}");
                        assert!(!is_bit_exact(ty) || got.to_bits() == want.to_bits(), "{ctx}");
                    }
                }
            }
        }
    }
}

/// Q2_K, Q3_K and IQ4_XS rows whose code bytes are all one pattern (every
/// code and scale field at 0, at its top, alternating, mixed) around random
/// f16 scales, against activations at ±127 (the largest `maddubs` pair sums)
/// and random ones; Q2_K and Q3_K also with a −128 activation quant, which
/// their unsigned codes take: the scalar twin's bits on every ISA level.
#[test]
fn low_k_quants_every_pattern() {
    let mut rng = Rng::new(0x2323);
    for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_XS] {
        let bb = ty.layout().block_bytes;
        for &n in lengths(ty) {
            for fill in [0x00u8, 0xFF, 0x55, 0xAA, 0x0F, 0xF0, 0x1B] {
                for acts in 0..3 {
                    let mut w = weight_row(ty, n, &mut rng, true);
                    for b in w.chunks_exact_mut(bb) {
                        for (i, byte) in b.iter_mut().enumerate() {
                            if !f16_fields(ty).iter().any(|&f| i == f || i == f + 1) {
                                *byte = fill;
                            }
                        }
                    }
                    let mut a = act_row(ty, n, &mut rng);
                    if acts < 2 {
                        // Every quant at +127 or alternating ±127 (bsums follow).
                        let x: Vec<f32> = (0..n).map(|i| if acts == 0 || i % 2 == 0 { 1.0 } else { -1.0 }).collect();
                        quantize_acts(act_type(ty), &x, &mut a);
                    }
                    if ty != GgmlType::IQ4_XS {
                        // Quant 5 of the first block to −128, its group sum (bsums[0]) to match.
                        let bsum = i16::from_le_bytes([a[260], a[261]]) - a[4 + 5] as i8 as i16 - 128;
                        a[4 + 5] = 0x80;
                        a[260..262].copy_from_slice(&bsum.to_le_bytes());
                    }
                    let want = vec_dot(ty, n, &w, TensorScale::ONE, &a);
                    let s = abs_dot(ty, n, &w, &a);
                    for isa in isas() {
                        let f = dot_fn(ty, isa).unwrap();
                        // SAFETY: `isa` is available on this machine.
                        let got = unsafe { f(n, &w, &a) };
                        let ctx =
                            format!("{ty} {isa:?} n={n} fill {fill:#04x} acts {acts}: got {got}, want {want}, S={s}");
                        assert_eq!(got.to_bits(), want.to_bits(), "{ctx}");
                    }
                }
            }
        }
    }
}

/// Zero rows give exactly zero; one non-zero element gives the reference
/// exactly (not for Q1_0, which has no zero: its row is ±d throughout).
#[test]
fn zeros_and_single_elements() {
    for ty in INT_TYPES.into_iter().chain(FLOAT_TYPES) {
        let n = 2 * 256;
        let mut rng = Rng::new(7);
        let a = act_row(ty, n, &mut rng);
        let w = vec![0u8; row_bytes(ty, n)];
        let mut x = vec![0.0f32; n];
        x[n - 3] = 0.75;
        let mut w1 = vec![0u8; row_bytes(ty, n)];
        quantize_row(ty, &x, &mut w1);
        for isa in isas() {
            let f = dot_fn(ty, isa).unwrap();
            // SAFETY: `isa` is available on this machine.
            unsafe {
                assert_eq!(f(n, &w, &a), 0.0, "{ty} {isa:?} zero row");
                if ty != GgmlType::Q1_0 {
                    let want = vec_dot(ty, n, &w1, TensorScale::ONE, &a);
                    assert_eq!(f(n, &w1, &a), want, "{ty} {isa:?} one element");
                }
            }
        }
    }
}

#[test]
fn dispatch_gives_the_best_kernel() {
    let best = Isa::detected();
    for ty in INT_TYPES.into_iter().chain(FLOAT_TYPES) {
        assert!(dot_fn(ty, Isa::Scalar).is_none(), "{ty}: scalar level has no SIMD kernel");
        let top = isas().last();
        let got = dot_fn(ty, best).map(|f| f as usize);
        assert_eq!(got, top.and_then(|i| dot_fn(ty, i)).map(|f| f as usize), "{ty}");
        // Asking above the processor's level is capped at the detected one.
        assert_eq!(dot_fn(ty, Isa::Avx512).map(|f| f as usize), got, "{ty}");
        if cfg!(target_arch = "x86_64") && best >= Isa::Avx2 {
            assert!(got.is_some(), "{ty}: a SIMD kernel on {best:?}");
        }
        if best == Isa::Avx512 {
            assert_ne!(got, dot_fn(ty, Isa::Avx2).map(|f| f as usize), "{ty}: AVX-512 has its own kernel");
        }
    }
    for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::I2_S, GgmlType::IQ1_BN, GgmlType::IQ2_BN] {
        assert!(dot_fn(ty, best).is_none(), "{ty}: ternary formats are not block kernels");
    }
}

/// The registry holds one kernel per (type, ISA level), each for a type this
/// file checks against the scalar reference.
#[test]
fn every_registered_kernel_is_checked() {
    let mut seen = std::collections::HashSet::new();
    for e in registry() {
        assert!(seen.insert((e.ty, e.isa)), "{} {:?} is registered twice", e.ty, e.isa);
        assert!(INT_TYPES.contains(&e.ty) || FLOAT_TYPES.contains(&e.ty), "{}: a kernel no test checks", e.ty);
        assert_ne!(e.isa, Isa::Scalar, "{}: the scalar level is tern_quant's", e.ty);
    }
}

#[test]
#[should_panic(expected = "weight row byte length")]
fn wrong_lengths_panic() {
    if let Some(f) = dot_fn(GgmlType::Q6_K, Isa::detected()) {
        let a = vec![0u8; act_row_bytes(act_type(GgmlType::Q6_K), 256)];
        // SAFETY: the kernel is for a detected ISA level.
        unsafe { f(256, &[0u8; 200], &a) };
    } else {
        panic!("weight row byte length (no kernel on this machine)");
    }
}

/// GB/s of weight bytes for one thread computing `rows` dots of length `k`
/// against one activation row.
fn bench(ty: GgmlType, k: usize, rows: usize, f: &dyn Fn(&[u8], &[u8]) -> f32) -> f64 {
    let mut rng = Rng::new(99);
    let rb = row_bytes(ty, k);
    // Quantize 64 distinct rows and tile them (the content does not matter for speed).
    let distinct: Vec<Vec<u8>> = (0..64.min(rows)).map(|_| weight_row(ty, k, &mut rng, false)).collect();
    let mut w = Vec::with_capacity(rb * rows);
    for r in 0..rows {
        w.extend_from_slice(&distinct[r % distinct.len()]);
    }
    let a = act_row(ty, k, &mut rng);
    let mut sink = 0.0f32;
    let pass = |sink: &mut f32| {
        for row in w.chunks_exact(rb) {
            *sink += f(row, &a);
        }
    };
    pass(&mut sink);
    let (mut passes, start, cpu0) = (0u32, Instant::now(), on_cpu_ns());
    while start.elapsed() < Duration::from_millis(400) || passes < 2 {
        pass(&mut sink);
        passes += 1;
    }
    std::hint::black_box(sink);
    let secs = match (cpu0, on_cpu_ns()) {
        (Some(a), Some(b)) if b > a => (b - a) as f64 * 1e-9,
        _ => start.elapsed().as_secs_f64(),
    };
    (w.len() as f64 * passes as f64) / secs / 1e9
}

/// Nanoseconds this thread has spent on a CPU (Linux `schedstat`), so that a
/// busy machine does not count other processes' time slices.
fn on_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

#[test]
#[ignore = "micro-benchmark; run in release with --ignored --nocapture"]
fn bench_block_kernels() {
    let k = 2560;
    // BENCH_TYPES=Q6_K,F16 limits the run to those types.
    let only = std::env::var("BENCH_TYPES").ok();
    let clock = if on_cpu_ns().is_some() { "on-CPU time" } else { "wall time" };
    println!("single thread, weight GB/s by {clock}, k = {k} (scalar = tern_quant::vec_dot)");
    for (ty, rows_list) in [
        (GgmlType::Q6_K, &[256usize, 32768][..]),
        (GgmlType::F16, &[256, 16384][..]),
        (GgmlType::Q8_0, &[256, 16384][..]),
        (GgmlType::Q4_0, &[256, 32768][..]),
        (GgmlType::IQ4_NL, &[256, 32768][..]),
        (GgmlType::Q5_0, &[256, 32768][..]),
        (GgmlType::Q4_1, &[256, 32768][..]),
        (GgmlType::Q5_1, &[256, 32768][..]),
        (GgmlType::Q1_0, &[256, 32768][..]),
        (GgmlType::Q4_K, &[256, 32768][..]),
        (GgmlType::Q5_K, &[256, 32768][..]),
        (GgmlType::Q2_K, &[256, 32768][..]),
        (GgmlType::Q3_K, &[256, 32768][..]),
        (GgmlType::IQ4_XS, &[256, 32768][..]),
        (GgmlType::BF16, &[256, 16384][..]),
        (GgmlType::F32, &[128, 8192][..]),
    ] {
        if only.as_deref().is_some_and(|o| !o.split(',').any(|t| t.eq_ignore_ascii_case(&ty.to_string()))) {
            continue;
        }
        for &rows in rows_list {
            let mb = (row_bytes(ty, k) * rows) as f64 / 1e6;
            let mut line = format!("{ty:>7} {k}x{rows:<6} ({mb:7.1} MB):");
            let scalar = bench(ty, k, rows, &|w, a| vec_dot(ty, k, w, TensorScale::ONE, a));
            line += &format!("  scalar {scalar:6.2}");
            for isa in isas() {
                let f: DotFn = dot_fn(ty, isa).unwrap();
                // SAFETY: `isa` is available on this machine.
                let gbs = bench(ty, k, rows, &|w, a| unsafe { f(k, w, a) });
                line += &format!("  {} {gbs:6.2}", isa.name());
            }
            println!("{line}");
        }
    }
}
