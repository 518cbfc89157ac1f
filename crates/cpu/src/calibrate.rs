//! Quick measurements of this backend's rates, for the offload policy's
//! `auto` mode: how fast a ternary GEMM multiplies, and how fast all threads
//! read memory (the bound of a one-token product). Short passes, so that a
//! load can afford them.

use std::time::Instant;

use tern_quant::ternary::rows::Packing;
use tern_quant::GgmlType;

use crate::kernels::ternary::{self, Out, PackedActs, PackedTernary};
use crate::CpuBackend;

/// Measured rates: multiply-adds per second in a prompt-sized ternary GEMM,
/// and bytes per second read by all threads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rates {
    pub macs_per_s: f64,
    pub bytes_per_s: f64,
}

/// The best of `reps` timings of `f`, in seconds.
fn best_of(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

impl CpuBackend {
    pub fn measure_rates(&self) -> Rates {
        // A 2560 × 1024 TQ2_0 weight (a 2B-4T-sized row) against 64 tokens.
        let (k, rows, tokens) = (2560, 1024, 64);
        let values: Vec<f32> = (0..k * rows).map(|i| ((i * 7919 + 13) % 3) as f32 - 1.0).collect();
        let ty = GgmlType::TQ2_0;
        let mut bytes = vec![0u8; ty.tensor_bytes(&[k as u64, rows as u64]).expect("a valid shape") as usize];
        tern_quant::quantize_tensor(ty, &values, k, &mut bytes);
        let w = PackedTernary::new(ty, &bytes, k, rows, Packing::Bits2);
        let x: Vec<f32> = (0..k * tokens).map(|i| ((i * 31 % 17) as f32 - 8.0) / 8.0).collect();
        let mut acts = PackedActs::new(k, w.layout.k_pad, tokens);
        acts.quantize(&x, self.isa);
        let mut y = vec![0f32; rows * tokens];
        let out = Out { ptr: y.as_mut_ptr(), ld: rows };
        let (isa, groups) = (self.isa, rows.div_ceil(16));
        let gemm = || {
            self.pool.for_chunks(groups, 1, |g| {
                let r = (g.start * 16).min(rows)..(g.end * 16).min(rows);
                // SAFETY: every thread writes its own rows of `y`; the ISA is this backend's.
                unsafe { ternary::gemm(&w, r, &acts, out, isa) };
            })
        };
        let gemm_s = best_of(3, gemm);

        // 64 MiB read by every thread, a contiguous share each.
        let buf = vec![1u64; 8 << 20];
        let read = || {
            self.pool.for_chunks(buf.len(), 1 << 16, |r| {
                let s: u64 = buf[r].iter().fold(0u64, |a, &v| a.wrapping_add(v));
                std::hint::black_box(s);
            })
        };
        let read_s = best_of(3, read);
        Rates {
            macs_per_s: (k * rows * tokens) as f64 / gemm_s.max(1e-9),
            bytes_per_s: (buf.len() * 8) as f64 / read_s.max(1e-9),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tern_backend::BackendId;

    /// Both measurements ran to completion and gave usable rates (finite and
    /// positive); their size depends on the machine, so it is not asserted.
    #[test]
    fn rates_are_finite_and_positive() {
        let r = CpuBackend::new(BackendId::CPU, 2).measure_rates();
        eprintln!("CPU rates: {:.3} TMAC/s, {:.1} GB/s", r.macs_per_s / 1e12, r.bytes_per_s / 1e9);
        assert!(r.macs_per_s.is_finite() && r.macs_per_s > 0.0, "{r:?}");
        assert!(r.bytes_per_s.is_finite() && r.bytes_per_s > 0.0, "{r:?}");
    }
}
