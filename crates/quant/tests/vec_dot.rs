//! Dot products of weight rows with quantized activation rows, for every weight
//! type, against float references.

mod common;

use common::dot64;
use tern_quant::{
    act_row_bytes, act_type, dequantize_acts, dequantize_row, quantize_acts, quantize_row, quantize_tensor, row_bytes,
    vec_dot, vec_dot_f32, ActType, GgmlType, TensorScale,
};
use tern_testutil::Rng;

/// One quantized weight row of `ty` from `w` plus its tensor scale (I2_S
/// goes through the whole-tensor quantizer: a one-row tensor).
fn weight_row(ty: GgmlType, w: &[f32]) -> (Vec<u8>, TensorScale) {
    if ty == GgmlType::I2_S {
        let mut t = vec![0u8; w.len() / 4 + 32];
        quantize_tensor(ty, w, w.len(), &mut t);
        let scale = TensorScale(tern_quant::i2s_tensor_scale(&t, w.len()));
        t.truncate(w.len() / 4);
        (t, scale)
    } else {
        let mut q = vec![0u8; row_bytes(ty, w.len())];
        quantize_row(ty, w, &mut q);
        (q, TensorScale::ONE)
    }
}

/// Bound on `|vec_dot − Σ w_deq·x| / (‖w_deq‖·‖x‖)`, the error the activation
/// quantization alone adds (the weights are the same dequantized values).
/// Rounding to an int8 grid of step `h` adds independent errors uniform in
/// ±h/2, so that normalized error has standard deviation at most
/// `h_max/√12/‖x‖` with `h_max = max|x|/127` (block formats have finer steps).
/// The bound is 5 standard deviations; measured worst ratios (error / one
/// standard deviation) are printed: 0.2–2.2 across types and sizes. Float
/// activations (f64 accumulation) are bounded by 1e-6 absolute.
fn act_bound(act: ActType, x: &[f32]) -> f64 {
    match act {
        ActType::F32 => 1e-6,
        ActType::Q8_0 | ActType::Q8_K | ActType::Q8_Row => 5.0 * act_sigma(x),
    }
}

/// One standard deviation of the normalized activation-rounding error (see [`act_bound`]).
fn act_sigma(x: &[f32]) -> f64 {
    let h = x.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
    h / 12f64.sqrt() / norm(x)
}

fn norm(x: &[f32]) -> f64 {
    dot64(x, x).sqrt()
}

#[test]
fn vec_dot_matches_float_references_for_every_type() {
    for ty in GgmlType::ALL {
        let act = act_type(ty);
        let mut worst = 0.0f64;
        for (case, n) in [1024usize, 2560, 256].into_iter().enumerate() {
            let mut rng = Rng::new(0xd07 ^ ty.id() as u64 ^ ((case as u64) << 32));
            let w = rng.normals(n, 0.02);
            // Activations with an outlier channel, as real hidden states have.
            let mut x = rng.normals(n, 1.0);
            x[n / 3] = 9.0;
            let (wq, scale) = weight_row(ty, &w);
            let mut w_deq = vec![0.0f32; n];
            dequantize_row(ty, &wq, scale, &mut w_deq);

            let mut a = vec![0u8; act_row_bytes(act, n)];
            quantize_acts(act, &x, &mut a);
            let mut a_deq = vec![0.0f32; n];
            dequantize_acts(act, &a, &mut a_deq);

            let got = vec_dot(ty, n, &wq, scale, &a) as f64;

            // 1. Same quantized operands in f64: only rounding differs.
            let exact = dot64(&w_deq, &a_deq);
            let mag: f64 = w_deq.iter().zip(&a_deq).map(|(&p, &q)| (p as f64 * q as f64).abs()).sum();
            assert!(
                (got - exact).abs() <= 2e-6 * mag + 1e-30,
                "{ty} n={n}: vec_dot {got} vs dequantized operands {exact}"
            );

            // 2. Against unquantized activations: the activation rounding error.
            let float = dot64(&w_deq, &x);
            let err = (got - float).abs() / (norm(&w_deq) * norm(&x));
            worst = worst.max(err / act_sigma(&x));
            assert!(err <= act_bound(act, &x), "{ty} n={n}: normalized error {err} vs the float-activation dot");

            // 3. The precise path: dequantize-on-the-fly with f32 activations.
            let precise = vec_dot_f32(ty, &wq, scale, &x) as f64;
            assert!(
                (precise - float).abs() <= 1e-7 * float.abs() + 1e-12 * mag,
                "{ty} n={n}: vec_dot_f32 {precise} vs {float}"
            );
        }
        println!("{ty} × {act:?}: worst activation error / its standard deviation {worst:.2}");
    }
}

#[test]
fn q8_row_is_training_faithful() {
    // amax = 127 → s_a = 1: the quants are x rounded half to even.
    let mut x = vec![0.0f32; 8];
    x[..6].copy_from_slice(&[127.0, 2.5, 3.5, -2.5, 0.5, -126.6]);
    let mut a = vec![0u8; act_row_bytes(ActType::Q8_Row, 8)];
    quantize_acts(ActType::Q8_Row, &x, &mut a);
    let (d, sum, qs) = tern_quant::act::q8_row_parts(&a);
    assert_eq!(d, 1.0);
    assert_eq!(qs, [127, 2, 4, -2, 0, -127, 0, 0]);
    assert_eq!(sum, 127 + 2 + 4 - 2 - 127);
    // An all-zero row uses the 1e-5 floor instead of dividing by zero.
    quantize_acts(ActType::Q8_Row, &[0.0; 8], &mut a);
    let (d, sum, qs) = tern_quant::act::q8_row_parts(&a);
    assert_eq!((d, sum), (1e-5 / 127.0, 0));
    assert!(qs.iter().all(|&q| q == 0));
}

#[test]
fn i2s_dot_is_the_ms_kernel_formula() {
    // y = (Σ code·q − Σ q) · w_scale / s_a with integer codes and quants.
    let mut rng = Rng::new(0x125);
    let n = 512;
    let w: Vec<f32> = (0..n).map(|_| rng.trit(0.35) * 0.375).collect();
    let x = rng.normals(n, 1.0);
    let (wq, scale) = weight_row(GgmlType::I2_S, &w);
    let mut a = vec![0u8; act_row_bytes(ActType::Q8_Row, n)];
    quantize_acts(ActType::Q8_Row, &x, &mut a);
    let s_a = 127.0 / x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let acc: i32 = w.iter().zip(&x).map(|(&t, &v)| (t / 0.375) as i32 * (v * s_a).round_ties_even() as i32).sum();
    let expected = acc as f32 * 0.375 / s_a;
    let got = vec_dot(GgmlType::I2_S, n, &wq, scale, &a);
    assert!((got - expected).abs() <= 1e-6 * expected.abs().max(1.0), "{got} vs {expected}");
}
