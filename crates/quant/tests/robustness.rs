//! Valid-length inputs never panic, whatever they hold: arbitrary bytes decode
//! and dot, non-finite floats quantize, and rows need no alignment.

mod common;

use tern_quant::{
    act_row_bytes, act_type, dequantize_row, quantize_acts, quantize_row, row_bytes, vec_dot, vec_dot_f32, GgmlType,
    TensorScale,
};
use tern_testutil::Rng;

#[test]
fn arbitrary_bytes_decode_and_dot_without_panicking() {
    let mut rng = Rng::new(0xbad);
    let n = 512;
    for ty in GgmlType::ALL {
        for _ in 0..20 {
            // One spare byte in front: the row starts at an odd address.
            let rb = row_bytes(ty, n);
            let buf: Vec<u8> = (0..rb + 1).map(|_| rng.next_u64() as u8).collect();
            let row = &buf[1..];
            let scale = TensorScale(rng.normal());
            let mut out = vec![0.0f32; n];
            dequantize_row(ty, row, scale, &mut out);
            let act = act_type(ty);
            let a: Vec<u8> = (0..act_row_bytes(act, n)).map(|_| rng.next_u64() as u8).collect();
            let _ = vec_dot(ty, n, row, scale, &a);
            let _ = vec_dot_f32(ty, row, scale, &out);
        }
    }
}

#[test]
fn non_finite_inputs_quantize_without_panicking() {
    let n = 512;
    for special in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN_POSITIVE / 4.0] {
        let mut x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
        x[3] = special;
        x[300] = special;
        for ty in GgmlType::ALL {
            let mut q = vec![0u8; row_bytes(ty, n)];
            quantize_row(ty, &x, &mut q);
            let act = act_type(ty);
            let mut a = vec![0u8; act_row_bytes(act, n)];
            quantize_acts(act, &x, &mut a);
        }
    }
}
