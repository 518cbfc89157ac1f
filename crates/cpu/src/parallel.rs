//! Splitting work across threads. Scoped threads per call are fine for the
//! scalar kernels here; a persistent low-latency pool replaces this when the
//! kernels become fast enough for spawn cost to matter.

/// Calls `f(range)` on up to `n_threads` disjoint chunks covering `0..n`.
/// Work below `min_per_thread` items per thread stays on the calling thread.
pub fn for_chunks(n: usize, n_threads: usize, min_per_thread: usize, f: impl Fn(std::ops::Range<usize>) + Sync) {
    let threads = n_threads.min(n / min_per_thread.max(1)).max(1);
    if threads == 1 {
        return f(0..n);
    }
    let chunk = n.div_ceil(threads);
    std::thread::scope(|s| {
        for t in 1..threads {
            let f = &f;
            let range = (t * chunk).min(n)..((t + 1) * chunk).min(n);
            s.spawn(move || f(range));
        }
        f(0..chunk.min(n));
    });
}
