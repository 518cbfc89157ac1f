//! A persistent thread pool with low per-op latency. Token generation runs
//! hundreds of small ops per token, so workers spin on a generation counter
//! between ops instead of being woken by the OS each time; after a while
//! without work they park, and the next job unparks them.
//!
//! `run(f)` calls `f(i, n)` on every thread (the caller is thread 0) and
//! returns when all have finished, so `f` may borrow the caller's stack.

use std::cell::UnsafeCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};

/// A job as stored while it runs (its real lifetime is `run`'s borrow).
type Job = dyn Fn(usize, usize) + Sync + 'static;

/// Spins before a worker parks: long enough to cover the gap between two
/// ops of a decode step, short enough not to burn a core when idle.
const SPINS_BEFORE_PARK: u32 = 1 << 16;
/// Spins before a waiting worker starts yielding its core.
const YIELD_AFTER: u32 = 1 << 12;

struct Shared {
    n: usize,
    /// Bumped once per job; workers run the job when they see it change.
    generation: AtomicU64,
    /// The current job, valid while `pending > 0`.
    job: UnsafeCell<Option<*const Job>>,
    /// Workers that have not finished the current job.
    pending: AtomicUsize,
    parked: Vec<AtomicBool>,
    shutdown: AtomicBool,
}

// SAFETY: `job` is written by the owner only while no job is running
// (pending == 0), published with a Release store of `generation`, and read by
// workers after an Acquire load of it.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

pub struct Pool {
    shared: Arc<Shared>,
    workers: Vec<(JoinHandle<()>, Thread)>,
}

impl Pool {
    /// A pool of `n_threads` threads including the caller.
    pub fn new(n_threads: usize) -> Pool {
        let n = n_threads.max(1);
        let shared = Arc::new(Shared {
            n,
            generation: AtomicU64::new(0),
            job: UnsafeCell::new(None),
            pending: AtomicUsize::new(0),
            parked: (0..n).map(|_| AtomicBool::new(false)).collect(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..n)
            .map(|i| {
                let s = shared.clone();
                let h = std::thread::Builder::new()
                    .name(format!("tern-cpu-{i}"))
                    .spawn(move || worker(&s, i))
                    .expect("spawning a CPU worker thread");
                let t = h.thread().clone();
                (h, t)
            })
            .collect();
        Pool { shared, workers }
    }

    pub fn threads(&self) -> usize {
        self.shared.n
    }

    /// Runs `f(i, n)` on all `n` threads and waits for them.
    pub fn run<'a>(&self, f: &'a (dyn Fn(usize, usize) + Sync + 'a)) {
        let s = &self.shared;
        if s.n == 1 {
            return f(0, 1);
        }
        // SAFETY: no job is running (the previous `run` waited for pending == 0),
        // so no worker reads `job` now. The pointer's lifetime is erased, but
        // this function does not return before every worker is done with it.
        unsafe { *s.job.get() = Some(std::mem::transmute::<*const (dyn Fn(usize, usize) + Sync + 'a), *const Job>(f)) };
        s.pending.store(s.n - 1, Ordering::Relaxed);
        s.generation.fetch_add(1, Ordering::Release);
        for (i, (_, t)) in self.workers.iter().enumerate() {
            if s.parked[i + 1].load(Ordering::Acquire) {
                t.unpark();
            }
        }
        f(0, s.n);
        // Spin for the usual short wait; yield when it is long, so a worker that
        // was descheduled (a busy machine) gets the core back.
        let mut spins = 0u32;
        while s.pending.load(Ordering::Acquire) != 0 {
            spins += 1;
            if spins < YIELD_AFTER {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Splits `0..n` into one contiguous range per thread (none smaller than
    /// `min_per_thread` unless there is only one) and runs `f` on each.
    pub fn for_chunks(&self, n: usize, min_per_thread: usize, f: impl Fn(Range<usize>) + Sync) {
        let threads = self.threads().min(n / min_per_thread.max(1)).max(1);
        if threads == 1 {
            return f(0..n);
        }
        let chunk = n.div_ceil(threads);
        self.run(&|i, _| {
            let range = (i * chunk).min(n)..((i + 1) * chunk).min(n);
            if !range.is_empty() {
                f(range);
            }
        });
    }
}

/// How finely claimed work is cut: each claim takes this fraction of what is
/// left divided by the thread count, so early claims stream long runs of
/// rows and the last ones are small, and threads finish together even when
/// one was slowed by the machine (a busy neighbour, a descheduled vCPU).
const CLAIM_SHARE: usize = 2;

impl Pool {
    /// Like [`Pool::for_chunks`], but threads claim shrinking chunks of
    /// `0..n` (none under `min_per_chunk`, except the last) as they go, so
    /// the op ends when the work does rather than when the slowest thread's
    /// fixed share does. Matrix products use it.
    pub fn for_chunks_claimed(&self, n: usize, min_per_chunk: usize, f: impl Fn(Range<usize>) + Sync) {
        let threads = self.threads();
        if threads == 1 || n < 2 * min_per_chunk.max(1) {
            return f(0..n);
        }
        let min = min_per_chunk.max(1);
        let end_of = |start: usize| (start + ((n - start) / (CLAIM_SHARE * threads)).max(min)).min(n);
        let next = AtomicUsize::new(0);
        self.run(&|_, _| {
            while let Ok(start) =
                next.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |s| (s < n).then(|| end_of(s)))
            {
                f(start..end_of(start));
            }
        });
    }
}

fn worker(s: &Shared, i: usize) {
    let mut seen = 0u64;
    loop {
        let mut spins = 0u32;
        let gen = loop {
            let g = s.generation.load(Ordering::Acquire);
            if g != seen || s.shutdown.load(Ordering::Relaxed) {
                break g;
            }
            if spins < SPINS_BEFORE_PARK {
                spins += 1;
                // Pure spinning first (lowest latency); then yielding, so that an
                // oversubscribed machine still runs the threads with work.
                if spins < YIELD_AFTER {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            } else {
                s.parked[i].store(true, Ordering::Release);
                // Re-check after announcing: a job published in between is not missed.
                if s.generation.load(Ordering::Acquire) == seen && !s.shutdown.load(Ordering::Relaxed) {
                    std::thread::park();
                }
                s.parked[i].store(false, Ordering::Release);
            }
        };
        if s.shutdown.load(Ordering::Relaxed) {
            return;
        }
        seen = gen;
        // SAFETY: published before `generation` (Release/Acquire) and kept
        // alive by `run` until `pending` reaches zero.
        let job = unsafe { (*s.job.get()).expect("a job is published with its generation") };
        unsafe { (*job)(i, s.n) };
        s.pending.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Relaxed);
        self.shared.generation.fetch_add(1, Ordering::Release);
        for (h, t) in self.workers.drain(..) {
            t.unpark();
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_thread_runs_each_job_once() {
        for n in [1, 2, 3] {
            let pool = Pool::new(n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|i, total| {
                    assert_eq!(total, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn claimed_chunks_cover_the_range_once() {
        for (threads, n, min) in [(3, 1000, 1), (2, 7, 1), (4, 5, 2), (1, 9, 1), (3, 0, 1)] {
            let pool = Pool::new(threads);
            let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.for_chunks_claimed(n, min, |r| {
                for i in r {
                    seen[i].fetch_add(1, Ordering::Relaxed);
                }
            });
            assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) == 1), "{threads} threads, n {n}");
        }
    }

    #[test]
    fn chunks_cover_the_range_and_parked_workers_wake() {
        let pool = Pool::new(3);
        let sum = AtomicUsize::new(0);
        pool.for_chunks(1000, 1, |r| {
            sum.fetch_add(r.sum::<usize>(), Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 999 * 1000 / 2);
        // Long enough for the workers to park, then more work.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let count = AtomicUsize::new(0);
        pool.for_chunks(10, 1, |r| {
            count.fetch_add(r.len(), Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 10);
    }
}
