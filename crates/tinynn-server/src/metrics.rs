//! Counters, gauges and latency histograms, rendered as Prometheus text at `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// A Prometheus histogram of seconds.
#[derive(Default)]
pub struct Histogram {
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    /// Sum in microseconds.
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation of `seconds`.
    pub fn observe(&self, seconds: f64) {
        if let Some(i) = BUCKETS.iter().position(|&b| seconds <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (b, c) in BUCKETS.iter().zip(&self.counts) {
            cumulative += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
    }
}

/// What the server counts.
#[derive(Default)]
pub struct Metrics {
    /// HTTP requests received on the API routes.
    pub requests: AtomicUsize,
    /// Requests that ended normally.
    pub requests_done: AtomicUsize,
    /// Requests that ended with an engine error.
    pub requests_failed: AtomicUsize,
    /// Requests refused because the queue was full.
    pub requests_rejected: AtomicUsize,
    /// Requests whose client went away before the end.
    pub cancelled: AtomicUsize,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: AtomicUsize,
    /// Of those, tokens found in a slot's cache and not evaluated again.
    pub prompt_tokens_cached: AtomicUsize,
    /// Tokens generated.
    pub completion_tokens: AtomicUsize,
    /// Slots generating now.
    pub slots_busy: AtomicUsize,
    /// Slots in all.
    pub slots_total: AtomicUsize,
    /// Requests waiting for a slot.
    pub queue_depth: AtomicUsize,
    /// Time from receiving a request to its first token.
    pub ttft: Histogram,
    /// Time between consecutive tokens of a request.
    pub token_latency: Histogram,
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let counters = [
            (
                "tinynn_requests_total",
                "HTTP API requests received.",
                &self.requests,
            ),
            (
                "tinynn_requests_done_total",
                "Generations that ended normally.",
                &self.requests_done,
            ),
            (
                "tinynn_requests_failed_total",
                "Generations that failed.",
                &self.requests_failed,
            ),
            (
                "tinynn_requests_rejected_total",
                "Requests refused with 429 (queue full).",
                &self.requests_rejected,
            ),
            (
                "tinynn_requests_cancelled_total",
                "Requests whose client disconnected.",
                &self.cancelled,
            ),
            (
                "tinynn_prompt_tokens_total",
                "Prompt tokens of admitted requests.",
                &self.prompt_tokens,
            ),
            (
                "tinynn_prompt_tokens_cached_total",
                "Prompt tokens reused from a slot's cache.",
                &self.prompt_tokens_cached,
            ),
            (
                "tinynn_completion_tokens_total",
                "Tokens generated.",
                &self.completion_tokens,
            ),
        ];
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        let gauges = [
            (
                "tinynn_slots_busy",
                "Slots generating now.",
                &self.slots_busy,
            ),
            ("tinynn_slots_total", "Slots in all.", &self.slots_total),
            (
                "tinynn_queue_depth",
                "Requests waiting for a slot.",
                &self.queue_depth,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {}",
                v.load(Ordering::Relaxed)
            );
        }
        self.ttft.render(
            &mut out,
            "tinynn_time_to_first_token_seconds",
            "Time from receiving a request to its first generated token.",
        );
        self.token_latency.render(
            &mut out,
            "tinynn_token_latency_seconds",
            "Time between consecutive generated tokens of a request.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_counts_add_up() {
        let m = Metrics::default();
        for s in [0.001, 0.015, 0.015, 3.0, 500.0] {
            m.ttft.observe(s);
        }
        m.completion_tokens.store(7, Ordering::Relaxed);
        let text = m.render();
        assert!(text.contains("tinynn_completion_tokens_total 7\n"));
        assert!(text.contains("tinynn_time_to_first_token_seconds_bucket{le=\"0.005\"} 1\n"));
        assert!(text.contains("tinynn_time_to_first_token_seconds_bucket{le=\"0.02\"} 3\n"));
        assert!(text.contains("tinynn_time_to_first_token_seconds_bucket{le=\"5\"} 4\n"));
        assert!(text.contains("tinynn_time_to_first_token_seconds_bucket{le=\"+Inf\"} 5\n"));
        assert!(text.contains("tinynn_time_to_first_token_seconds_count 5\n"));
    }
}
