//! `tern bench --mem-bw`: the machine's streaming-read bandwidth, the bound
//! that tg speed is compared against. A 256 MiB buffer is written first (so
//! its pages exist and are not the shared zero page), then read by N threads,
//! each its own contiguous part, with the widest loads the CPU has; the loads
//! are xor-accumulated so none can be dropped. Median of 10 reads.

use std::sync::Barrier;
use std::time::Instant;

use super::{csv_row, emit, md_header, md_row, Col, Format, JsonArray, Plan};
use crate::json;
use crate::CliError;

const BUF_BYTES: usize = 256 << 20;
const REPS: usize = 10;

/// One cache line, so the buffer is 64-byte aligned.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Loads {
    Avx512,
    Avx2,
    Scalar,
}

impl Loads {
    fn detect() -> Loads {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return Loads::Avx512;
            }
            if is_x86_feature_detected!("avx2") {
                return Loads::Avx2;
            }
        }
        Loads::Scalar
    }

    fn name(self) -> &'static str {
        match self {
            Loads::Avx512 => "AVX-512 64B",
            Loads::Avx2 => "AVX2 32B",
            Loads::Scalar => "u64 8B",
        }
    }

    /// Reads every byte of `lines`; the result depends on all of them.
    fn read(self, lines: &[Line]) -> u64 {
        match self {
            // SAFETY: the features were detected at run time before choosing these.
            #[cfg(target_arch = "x86_64")]
            Loads::Avx512 => unsafe { read_avx512(lines) },
            #[cfg(target_arch = "x86_64")]
            Loads::Avx2 => unsafe { read_avx2(lines) },
            _ => read_scalar(lines),
        }
    }
}

/// The SIMD extensions, for the header line.
pub fn isa() -> &'static str {
    match Loads::detect() {
        Loads::Avx512 => "AVX-512",
        Loads::Avx2 => "AVX2",
        Loads::Scalar => std::env::consts::ARCH,
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn read_avx512(lines: &[Line]) -> u64 {
    use std::arch::x86_64::*;
    let p = lines.as_ptr() as *const __m512i;
    let mut acc = [_mm512_setzero_si512(); 4];
    let quads = lines.len() / 4;
    for i in 0..quads {
        for (j, a) in acc.iter_mut().enumerate() {
            *a = _mm512_xor_si512(*a, _mm512_load_si512(p.add(4 * i + j)));
        }
    }
    for i in 4 * quads..lines.len() {
        acc[0] = _mm512_xor_si512(acc[0], _mm512_load_si512(p.add(i)));
    }
    let all = _mm512_xor_si512(_mm512_xor_si512(acc[0], acc[1]), _mm512_xor_si512(acc[2], acc[3]));
    _mm512_reduce_add_epi64(all) as u64
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_avx2(lines: &[Line]) -> u64 {
    use std::arch::x86_64::*;
    let p = lines.as_ptr() as *const __m256i;
    let mut acc = [_mm256_setzero_si256(); 4];
    for i in 0..lines.len() {
        // Two 32-byte loads per line, into alternating accumulators.
        let k = 2 * (i & 1);
        acc[k] = _mm256_xor_si256(acc[k], _mm256_load_si256(p.add(2 * i)));
        acc[k + 1] = _mm256_xor_si256(acc[k + 1], _mm256_load_si256(p.add(2 * i + 1)));
    }
    let all = _mm256_xor_si256(_mm256_xor_si256(acc[0], acc[1]), _mm256_xor_si256(acc[2], acc[3]));
    let mut out = [0u64; 4];
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, all);
    out.iter().fold(0, |a, &x| a.wrapping_add(x))
}

fn read_scalar(lines: &[Line]) -> u64 {
    let mut acc = [0u64; 8];
    for l in lines {
        for (a, &x) in acc.iter_mut().zip(&l.0) {
            *a ^= x;
        }
    }
    std::hint::black_box(acc).iter().fold(0, |a, &x| a.wrapping_add(x))
}

/// GB/s (1e9 bytes) of `threads` threads reading `buf` together: each rep's
/// time runs from the common start to the last thread's finish. The calling
/// thread reads the first share itself, so `-t` equal to the core count does
/// not oversubscribe the machine (a timer thread descheduled past the start
/// would see the readers' work as already done).
fn measure(buf: &[Line], threads: usize, loads: Loads) -> Vec<f64> {
    let share = |i: usize| &buf[i * buf.len() / threads..(i + 1) * buf.len() / threads];
    let start = Barrier::new(threads);
    let done = Barrier::new(threads);
    let mut gbs = Vec::with_capacity(REPS);
    std::thread::scope(|s| {
        for i in 1..threads {
            let (chunk, start, done) = (share(i), &start, &done);
            s.spawn(move || {
                let mut sink = 0u64;
                for _ in 0..REPS {
                    start.wait();
                    sink ^= loads.read(chunk);
                    done.wait();
                }
                std::hint::black_box(sink);
            });
        }
        let mut sink = 0u64;
        for _ in 0..REPS {
            let t0 = Instant::now();
            start.wait();
            sink ^= loads.read(share(0));
            done.wait();
            gbs.push(std::mem::size_of_val(buf) as f64 / t0.elapsed().as_secs_f64().max(1e-9) / 1e9);
        }
        std::hint::black_box(sink);
    });
    gbs
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

pub fn main(plan: &Plan) -> Result<(), CliError> {
    let loads = Loads::detect();
    let n_lines = BUF_BYTES / std::mem::size_of::<Line>();
    let mut threads: Vec<usize> = std::iter::once(1).chain(plan.threads.iter().copied()).collect();
    threads.sort_unstable();
    threads.dedup();
    if let Some(&t) = threads.iter().find(|&&t| t > n_lines) {
        return Err(CliError(format!("-t {t} is more threads than the buffer has cache lines")));
    }
    // Written (not just allocated) so every page is real memory.
    let buf: Vec<Line> = (0..n_lines as u64).map(|i| Line([i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1; 8])).collect();
    eprintln!("mem-bw: {} MiB buffer, {} loads, median of {REPS} reads", BUF_BYTES >> 20, loads.name());
    let cols: Vec<Col> =
        [("threads", 7, false), ("loads", 11, true), ("buffer", 8, false), ("GB/s", 8, false), ("max GB/s", 8, false)]
            .iter()
            .map(|&(n, w, l)| Col::new(n, w, l))
            .collect();
    let mut json_out = None;
    match plan.format {
        Format::Md => emit(&md_header(&cols)),
        Format::Csv => emit("n_threads,loads,buffer_bytes,median_gbs,max_gbs,samples_gbs"),
        Format::Json => json_out = Some(JsonArray::start()),
    }
    for t in threads {
        let mut gbs = measure(&buf, t, loads);
        let max = gbs.iter().copied().fold(0.0, f64::max);
        let samples: Vec<String> = gbs.iter().map(|g| format!("{g:.3}")).collect();
        let med = median(&mut gbs);
        match plan.format {
            Format::Md => {
                let cells = [
                    t.to_string(),
                    loads.name().to_string(),
                    "256 MiB".into(),
                    format!("{med:.2}"),
                    format!("{max:.2}"),
                ];
                emit(&md_row(&cols, &cells));
            }
            Format::Csv => emit(&csv_row(&[
                t.to_string(),
                loads.name().to_string(),
                BUF_BYTES.to_string(),
                format!("{med:.3}"),
                format!("{max:.3}"),
                samples.join(" "),
            ])),
            Format::Json => json_out.as_mut().expect("json").push(&[
                ("n_threads", t.to_string()),
                ("loads", json::string(loads.name())),
                ("buffer_bytes", BUF_BYTES.to_string()),
                ("median_gbs", format!("{med:.3}")),
                ("max_gbs", format!("{max:.3}")),
                ("samples_gbs", format!("[ {} ]", samples.join(", "))),
            ]),
        }
    }
    if let Some(j) = json_out {
        j.finish();
    }
    Ok(())
}
