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
use tinynn_models::bench::{bench, describe, peak_rss, BenchConfig};
use tinynn_models::model::Model;

use crate::generate::ModelArgs;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Output format: md or json.
    #[arg(short = 'o', long = "output", default_value = "md")]
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

#[derive(Serialize)]
struct Row {
    model: String,
    size_bytes: u64,
    params: u64,
    backend: &'static str,
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
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let path = args.model.path()?;
    let model = Model::open(&path)?;
    let exec = args.model.exec_options();
    let cfg = BenchConfig {
        n_prompt: args.n_prompt.clone(),
        n_gen: args.n_gen.clone(),
        parallel: args.parallel.clone(),
        reps: args.reps,
        exec,
        busy: args.busy,
    };
    let fmt = args.output.as_str();
    if !matches!(fmt, "md" | "json") {
        bail!("unknown output format '{fmt}' (md or json)");
    }
    let (params, size, name) = describe(&model)?;
    let report = bench(&model, &cfg).with_context(|| format!("benchmarking {}", path.display()))?;
    let rss = if args.mem { peak_rss() } else { None };
    let (repacked, kv) = (report.packed_bytes as u64, report.kv_cache_bytes as u64);
    let rows: Vec<Row> = report
        .results
        .into_iter()
        .map(|r| Row {
            model: name.clone(),
            size_bytes: size,
            params,
            backend: "CPU",
            threads: if exec.strict { 1 } else { exec.threads },
            test: r.test,
            n_tokens: r.n_tokens,
            avg_ts: r.avg_ts,
            stddev_ts: r.stddev_ts,
            samples_ts: r.samples_ts,
            peak_rss_bytes: rss,
            repacked_bytes: repacked,
            kv_cache_bytes: kv,
        })
        .collect();
    let out = match fmt {
        "json" => serde_json::to_string_pretty(&rows)? + "\n",
        _ => markdown(&rows, rss.map(|r| (r, repacked, kv))),
    };
    crate::generate::emit(&out)
}

/// The table, then (with `--mem`) peak RSS, repacked weight copies and KV cache.
fn markdown(rows: &[Row], mem: Option<(u64, u64, u64)>) -> String {
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
