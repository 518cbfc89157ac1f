//! Prometheus metrics, formatted by hand: a handful of counters, two gauges
//! and two histograms do not justify a metrics registry and its exporter.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::Duration;

/// Latency buckets in seconds, for both time to first token and inter-token latency.
const BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Default)]
struct Histogram {
    /// Per bucket (not cumulative), then the sum in seconds and the count.
    inner: Mutex<(Vec<u64>, f64, u64)>,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if g.0.is_empty() {
            g.0 = vec![0; BUCKETS.len()];
        }
        if let Some(i) = BUCKETS.iter().position(|&b| s <= b) {
            g.0[i] += 1;
        }
        g.1 += s;
        g.2 += 1;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cum += g.0.get(i).copied().unwrap_or(0);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cum}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}", g.2, g.1, g.2);
    }
}

/// What the server counts. The engine thread and the handlers share it.
#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub requests_failed: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prompt_tokens_evaluated: AtomicU64,
    pub prompt_tokens_cached: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Forward passes, and the sequences they held (summed over passes).
    pub steps: AtomicU64,
    pub step_sequences: AtomicU64,
    ttft: Histogram,
    itl: Histogram,
}

/// The gauges, read from the engine's slot accounting at render time.
pub struct Gauges {
    pub slots_total: usize,
    pub slots_busy: usize,
    pub queue_depth: usize,
}

impl Metrics {
    pub fn first_token(&self, d: Duration) {
        self.ttft.observe(d);
    }

    pub fn next_token(&self, d: Duration) {
        self.itl.observe(d);
    }

    /// The text exposition format (version 0.0.4).
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        let counters = [
            ("tern_requests_total", "Completion requests accepted.", &self.requests),
            (
                "tern_requests_failed_total",
                "Completion requests answered with an error, refused ones included.",
                &self.requests_failed,
            ),
            ("tern_prompt_tokens_total", "Prompt tokens of the requests that took a slot.", &self.prompt_tokens),
            ("tern_prompt_tokens_evaluated_total", "Prompt tokens evaluated.", &self.prompt_tokens_evaluated),
            (
                "tern_prompt_tokens_cached_total",
                "Prompt tokens a slot's cache held already (cache_prompt), not evaluated again.",
                &self.prompt_tokens_cached,
            ),
            ("tern_generated_tokens_total", "Tokens generated.", &self.generated_tokens),
            ("tern_steps_total", "Forward passes (steps of the batched decoding loop).", &self.steps),
            ("tern_step_sequences_total", "Sequences in those passes, summed over passes.", &self.step_sequences),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
        let gauges = [
            ("tern_slots_total", "Slots (-np).", g.slots_total),
            ("tern_slots_busy", "Slots holding a request.", g.slots_busy),
            ("tern_queue_depth", "Requests waiting for a slot.", g.queue_depth),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.ttft.render(&mut out, "tern_time_to_first_token_seconds", "From arrival to the first token.");
        self.itl.render(&mut out, "tern_inter_token_latency_seconds", "Between consecutive tokens of a request.");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_cumulative() {
        let m = Metrics::default();
        m.first_token(Duration::from_millis(3));
        m.first_token(Duration::from_millis(40));
        m.first_token(Duration::from_secs(99));
        let text = m.render(&Gauges { slots_total: 2, slots_busy: 1, queue_depth: 0 });
        assert!(text.contains("tern_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("tern_time_to_first_token_seconds_bucket{le=\"0.05\"} 2\n"));
        assert!(text.contains("tern_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("tern_time_to_first_token_seconds_count 3\n"));
        assert!(text.contains("tern_slots_busy 1\n"));
        assert!(text.contains("tern_inter_token_latency_seconds_count 0\n"));
    }
}
