//! `tnn bench`: prompt processing (pp) and generation (tg) speed, measured as llama-bench
//! measures them, printed as its markdown table (or JSON with `-o json`).
//!
//! pp N: N prompt tokens evaluated as one batch from an empty cache; tg N: N tokens evaluated
//! one at a time from an empty cache; tg N par S (`--parallel S`): S sequences decoding N tokens
//! each, one token of every sequence per run (llama-batched-bench's aggregate tokens/s). Each
//! test runs once to warm up, then `-r` times; t/s is the mean over the repetitions ± their
//! standard deviation.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tinynn_models::bench::{
    bench, decode_bytes_per_token, describe, peak_rss, read_bandwidth, reset_peak_rss, BenchConfig,
};
use tinynn_models::model::Model;

#[derive(Args)]
pub struct BenchArgs {
    /// Model file, or a model name: smollm2, gemma3 (default: smollm2, fetched into the cache if missing).
    #[arg(short = 'm', long = "model")]
    pub model: Option<std::path::PathBuf>,
    /// Thread counts to test, comma-separated (default: all cores).
    #[arg(short = 't', long = "threads", value_delimiter = ',')]
    pub threads: Vec<usize>,
    /// Most prompt tokens per batch (default: the whole prompt in one batch).
    #[arg(short = 'b', long = "batch-size")]
    pub batch: Option<usize>,
    /// Reference mode: one thread, f64 accumulation, unquantized activations.
    #[arg(long)]
    pub strict: bool,
    /// Use the file's weight layout as is (no interleaved copy for the matrix kernels).
    #[arg(long = "no-repack")]
    pub no_repack: bool,
    /// Prompt lengths to test, comma-separated (0 or empty: none).
    #[arg(
        short = 'p',
        long = "n-prompt",
        default_value = "512",
        value_delimiter = ','
    )]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to test, comma-separated (0 or empty: none).
    #[arg(
        short = 'n',
        long = "n-gen",
        default_value = "128",
        value_delimiter = ','
    )]
    pub n_gen: Vec<usize>,
    /// Tokens already in the cache for each test, comma-separated (llama-bench's `-d`):
    /// `pp512 @ d4096` evaluates 512 prompt tokens after 4096, `tg128 @ d4096` generates
    /// after them (the cache is filled before each repetition, untimed).
    #[arg(
        short = 'd',
        long = "n-depth",
        default_value = "0",
        value_delimiter = ','
    )]
    pub depths: Vec<usize>,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format: md or json.
    #[arg(short = 'o', long = "output", default_value = "md", value_parser = ["md", "json"])]
    pub output: String,
    /// Also report the process's peak resident memory.
    #[arg(long)]
    pub mem: bool,
    /// Keep N other threads spinning during the tests (a busy machine: how much speed
    /// survives when the cores are shared).
    #[arg(long, default_value_t = 0)]
    pub busy: usize,
    /// Also decode S sequences together for each S given (comma-separated, e.g. 1,2,4,8):
    /// aggregate generation tokens/s of a batch of sequences sharing one plan run.
    #[arg(long, value_delimiter = ',')]
    pub parallel: Vec<usize>,
}

/// A result row: llama-bench's JSON keys (`model_type`, `n_threads`, `avg_ts`, …) and
/// tinynn's own (`model`, `threads`, `test`, memory).
#[derive(Serialize)]
struct Row {
    model_filename: String,
    model_type: String,
    model_size: u64,
    model_n_params: u64,
    backends: &'static str,
    n_batch: usize,
    n_threads: usize,
    n_prompt: usize,
    n_gen: usize,
    n_depth: usize,
    test_time: String,
    avg_ns: u64,
    stddev_ns: u64,
    samples_ns: Vec<u64>,
    model: String,
    size_bytes: u64,
    params: u64,
    backend: &'static str,
    /// The instruction-set level the kernels ran at (`TINYNN_ISA` caps it).
    isa: &'static str,
    threads: usize,
    test: String,
    n_tokens: usize,
    avg_ts: f64,
    stddev_ts: f64,
    samples_ts: Vec<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    peak_rss_bytes: Option<u64>,
    /// Bytes of weights copied into the matrix kernels' packed layout.
    repacked_bytes: u64,
    kv_cache_bytes: u64,
    /// Memory read bandwidth at this row's thread count (bytes/s), the mean of a probe before
    /// and one after the tests.
    read_bandwidth: f64,
    /// Generation rows: bytes read per generated token (weights, and the KV cache at the
    /// test's mean depth), the tokens/s that bandwidth allows, and the fraction reached.
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes_per_token: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    roofline_ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    roofline_fraction: Option<f64>,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let path = crate::models::resolve(args.model.as_deref())?;
    let model = Model::open(&path).with_context(|| format!("loading {}", path.display()))?;
    let fmt = args.output.as_str();
    let (params, size, name) = describe(&model)?;
    let thread_counts = if args.threads.is_empty() {
        vec![crate::generate::all_cores()]
    } else {
        args.threads.clone()
    };
    if let Some(&t) = thread_counts.iter().find(|&&t| t == 0) {
        bail!("{t} threads: give 1 or more");
    }
    let mut rows = Vec::new();
    let mut mem = None;
    let mut probes = Vec::new();
    for threads in thread_counts {
        let exec = crate::generate::exec_options(Some(threads), args.strict, args.no_repack);
        let cfg = BenchConfig {
            n_prompt: args.n_prompt.clone(),
            n_gen: args.n_gen.clone(),
            parallel: args.parallel.clone(),
            depths: args.depths.clone(),
            reps: args.reps,
            n_batch: args.batch,
            exec,
            busy: args.busy,
        };
        let started = std::time::SystemTime::now();
        let probe_threads = if exec.strict { 1 } else { exec.threads };
        let bw_before = read_bandwidth(probe_threads);
        // The probe's buffer is not the model's memory: the peak counts from here.
        let rss_counted = reset_peak_rss();
        let report =
            bench(&model, &cfg).with_context(|| format!("benchmarking {}", path.display()))?;
        let rss = if args.mem && rss_counted {
            peak_rss()
        } else {
            None
        };
        let bw_after = read_bandwidth(probe_threads);
        let bw = (bw_before + bw_after) / 2.0;
        probes.push((probe_threads, bw_before, bw_after));
        let kv_bytes = if exec.strict { 4 } else { 2 };
        let weights = decode_bytes_per_token(&model, 0.0, kv_bytes);
        let (repacked, kv) = (report.packed_bytes as u64, report.kv_cache_bytes as u64);
        mem = rss.map(|r| (r, repacked, kv));
        for r in report.results {
            let is_pp = r.test.starts_with("pp");
            let depth = r
                .test
                .split(" @ d")
                .nth(1)
                .and_then(|d| d.split(' ').next()?.parse::<usize>().ok())
                .unwrap_or(0);
            // `tgN`, `tgN @ dD` or `tgN parS`: S tokens a step share one read of the
            // weights; each reads its own sequence's KV cache, D + (N + 1) / 2 entries on
            // average.
            let per_token = (!is_pp).then(|| {
                let seqs = r
                    .test
                    .split(" par")
                    .nth(1)
                    .and_then(|p| p.split(' ').next());
                let seqs = seqs.and_then(|p| p.parse::<f64>().ok()).unwrap_or(1.0);
                let n = r.n_tokens as f64 / seqs;
                let mean_depth = depth as f64 + (n + 1.0) / 2.0;
                let kv = decode_bytes_per_token(&model, mean_depth, kv_bytes) - weights;
                (weights as f64 / seqs + kv as f64).round() as u64
            });
            let roofline = per_token.map(|b| bw / b.max(1) as f64);
            let ns = |ts: f64| (r.n_tokens as f64 / ts.max(1e-12) * 1e9) as u64;
            let samples_ns: Vec<u64> = r.samples_ts.iter().map(|&t| ns(t)).collect();
            let avg_ns = samples_ns.iter().sum::<u64>() / samples_ns.len().max(1) as u64;
            let var = samples_ns
                .iter()
                .map(|&x| (x as f64 - avg_ns as f64).powi(2))
                .sum::<f64>()
                / (samples_ns.len().max(2) - 1) as f64;
            rows.push(Row {
                model_filename: path.display().to_string(),
                model_type: name.clone(),
                model_size: size,
                model_n_params: params,
                backends: "CPU",
                n_batch: args.batch.unwrap_or(r.n_tokens),
                n_threads: if exec.strict { 1 } else { exec.threads },
                n_prompt: if is_pp { r.n_tokens } else { 0 },
                n_gen: if is_pp { 0 } else { r.n_tokens },
                n_depth: depth,
                test_time: rfc3339(started),
                avg_ns,
                stddev_ns: var.sqrt() as u64,
                samples_ns,
                model: name.clone(),
                size_bytes: size,
                params,
                backend: "CPU",
                isa: tinynn_cpu::simd::Isa::detected().name(),
                threads: if exec.strict { 1 } else { exec.threads },
                test: r.test,
                n_tokens: r.n_tokens,
                avg_ts: r.avg_ts,
                stddev_ts: r.stddev_ts,
                samples_ts: r.samples_ts,
                peak_rss_bytes: rss,
                repacked_bytes: repacked,
                kv_cache_bytes: kv,
                read_bandwidth: bw,
                bytes_per_token: per_token,
                roofline_ts: roofline,
                roofline_fraction: roofline.map(|t| r.avg_ts / t),
            });
        }
    }
    let out = match fmt {
        "json" => serde_json::to_string_pretty(&rows)? + "\n",
        _ => markdown(&rows, mem, &probes),
    };
    crate::generate::emit(&out)
}

/// `time` as UTC `YYYY-MM-DDTHH:MM:SSZ` (llama-bench's `test_time`).
fn rfc3339(time: std::time::SystemTime) -> String {
    let secs = time
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The table, then the memory bandwidth and each generation test's share of the decode
/// roofline, then (with `--mem`) peak RSS, repacked weight copies and KV cache.
fn markdown(rows: &[Row], mem: Option<(u64, u64, u64)>, probes: &[(usize, f64, f64)]) -> String {
    let mut s = String::from("| model | size | params | backend | threads | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: | ---: |\n");
    for r in rows {
        s.push_str(&format!(
            "| {} | {:.2} MiB | {:.2} M | {} | {} | {} | {:.2} ± {:.2} |\n",
            r.model,
            r.size_bytes as f64 / (1024.0 * 1024.0),
            r.params as f64 / 1e6,
            r.backend,
            r.threads,
            r.test,
            r.avg_ts,
            r.stddev_ts
        ));
    }
    if let Some(r) = rows.first() {
        s.push_str(&format!("\ninstruction set: {}\n", r.isa));
    }
    let gbs = |b: f64| b / 1e9;
    for &(threads, before, after) in probes {
        s.push_str(&format!(
            "\nread bandwidth, {threads} thread{}: {:.1} GB/s before the tests, {:.1} GB/s after\n",
            if threads == 1 { "" } else { "s" },
            gbs(before),
            gbs(after)
        ));
        for r in rows.iter().filter(|r| r.threads == threads) {
            if let (Some(bytes), Some(roof), Some(frac)) =
                (r.bytes_per_token, r.roofline_ts, r.roofline_fraction)
            {
                s.push_str(&format!(
                    "{}: {:.1} MB read per token, roofline {:.0} t/s at {:.1} GB/s; {:.2} t/s \
                     is {:.0}% of it\n",
                    r.test,
                    bytes as f64 / 1e6,
                    roof,
                    gbs(r.read_bandwidth),
                    r.avg_ts,
                    100.0 * frac
                ));
            }
        }
    }
    if let Some((rss, repacked, kv)) = mem {
        let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
        s.push_str(&format!(
            "\npeak RSS: {:.1} MiB (repacked weights {:.1} MiB, KV cache {:.1} MiB)\n",
            mib(rss),
            mib(repacked),
            mib(kv)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::rfc3339;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn test_times_are_utc_rfc3339() {
        let at = |s: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_796_181_142), "2026-12-02T03:12:22Z");
    }
}
