//! `tnn bench`: prompt processing (pp) and generation (tg) speed, measured as llama-bench
//! measures them, printed as its markdown table (or JSON with `-o json`).
//!
//! pp N: N prompt tokens evaluated as one batch from an empty cache; tg N: N tokens evaluated
//! one at a time from an empty cache; tg N par S (`--parallel S`): S sequences decoding N tokens
//! each, one token of every sequence per run (llama-batched-bench's aggregate tokens/s). Each
//! test runs once to warm up, then `-r` times; t/s is the mean over the repetitions ± their
//! standard deviation.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tinynn_models::model::Model;
use tinynn_models::session::{BatchToken, Session, SessionOptions};
use tinynn_models::weights::WeightSource;

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

/// Threads that spin until dropped.
struct Busy {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(n: usize) -> Busy {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = Arc::clone(&stop);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        Busy { stop, threads }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
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

/// Peak resident set size of this process (Linux `VmHWM`), in bytes.
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

/// Token ids to feed: spread over the vocabulary, never id 0..3 (special tokens).
fn tokens(n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| (4 + (i * 7919) % (vocab.max(8) - 4)) as u32)
        .collect()
}

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.reps == 0 {
        bail!("-r must be at least 1");
    }
    if let Some(&s) = args.parallel.iter().find(|&&s| s == 0 || s > 64) {
        bail!("--parallel {s}: give 1 to 64 sequences");
    }
    let path = args.model.path()?;
    let model = Model::open(&path)?;
    let tests: Vec<(&str, usize)> = args
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| ("pp", n))
        .chain(args.n_gen.iter().filter(|&&n| n > 0).map(|&n| ("tg", n)))
        .collect();
    let longest = tests.iter().map(|t| t.1).max().unwrap_or(1);
    let opts = args.model.exec_options();
    let mut session = Session::new(
        model.clone(),
        longest.max(args.model.ctx.min(longest)),
        opts,
    )
    .with_context(|| format!("loading {}", path.display()))?;
    session.set_n_batch(longest);
    let (params, size, name) = describe(&model)?;
    let threads = if opts.strict { 1 } else { opts.threads };
    let vocab = session
        .plan()
        .graph()
        .layout(session.plan().graph().outputs()[0])
        .ne[0];
    let mut rows = Vec::new();
    let busy = Busy::start(args.busy);
    for (kind, n) in tests {
        let ids = tokens(n, vocab);
        let mut samples = Vec::with_capacity(args.reps);
        for rep in 0..=args.reps {
            session.reset();
            let t0 = Instant::now();
            if kind == "pp" {
                session.eval_batch(&ids)?;
            } else {
                for &t in &ids {
                    session.eval(t)?;
                }
            }
            let secs = t0.elapsed().as_secs_f64();
            if rep > 0 {
                samples.push(n as f64 / secs.max(1e-9));
            }
        }
        let (avg, sd) = mean_sd(&samples);
        rows.push(Row {
            model: name.clone(),
            size_bytes: size,
            params,
            backend: "CPU",
            threads,
            test: if args.busy > 0 {
                format!("{kind}{n} busy{}", args.busy)
            } else {
                format!("{kind}{n}")
            },
            n_tokens: n,
            avg_ts: avg,
            stddev_ts: sd,
            samples_ts: samples,
            peak_rss_bytes: None,
            repacked_bytes: 0,
            kv_cache_bytes: 0,
        });
    }
    let n_gen = args.n_gen.iter().copied().filter(|&n| n > 0);
    let parallel: Vec<(usize, usize)> = n_gen
        .flat_map(|n| args.parallel.iter().map(move |&s| (s, n)))
        .collect();
    if let Some(max_seq) = parallel.iter().map(|p| p.0).max() {
        let max_gen = parallel.iter().map(|p| p.1).max().unwrap_or(1);
        let mut batched = Session::with_options(
            model.clone(),
            SessionOptions {
                n_ctx: max_seq * max_gen,
                n_seq: max_seq,
                exec: opts,
                ..SessionOptions::default()
            },
        )?;
        for &(seqs, n) in &parallel {
            let ids = tokens(n * seqs, vocab);
            let mut samples = Vec::with_capacity(args.reps);
            for rep in 0..=args.reps {
                (0..seqs).for_each(|s| batched.clear_seq(s));
                let t0 = Instant::now();
                for step in ids.chunks_exact(seqs) {
                    let batch: Vec<BatchToken> = step
                        .iter()
                        .enumerate()
                        .map(|(seq, &token)| BatchToken {
                            token,
                            seq,
                            logits: true,
                        })
                        .collect();
                    batched.decode(&batch)?;
                }
                let secs = t0.elapsed().as_secs_f64();
                if rep > 0 {
                    samples.push((n * seqs) as f64 / secs.max(1e-9));
                }
            }
            let (avg, sd) = mean_sd(&samples);
            rows.push(Row {
                model: name.clone(),
                size_bytes: size,
                params,
                backend: "CPU",
                threads,
                test: format!("tg{n} par{seqs}"),
                n_tokens: n * seqs,
                avg_ts: avg,
                stddev_ts: sd,
                samples_ts: samples,
                peak_rss_bytes: None,
                repacked_bytes: 0,
                kv_cache_bytes: 0,
            });
        }
    }
    drop(busy);
    let rss = if args.mem { peak_rss() } else { None };
    let (repacked, kv) = (
        session.packed_bytes() as u64,
        session.kv_cache_bytes() as u64,
    );
    for r in rows.iter_mut() {
        r.peak_rss_bytes = rss;
        r.repacked_bytes = repacked;
        r.kv_cache_bytes = kv;
    }
    let out = match args.output.as_str() {
        "json" => serde_json::to_string_pretty(&rows)? + "\n",
        "md" => markdown(&rows, rss.map(|r| (r, repacked, kv))),
        other => bail!("unknown output format '{other}' (md or json)"),
    };
    crate::print(&out)
}

/// Parameter count, tensor bytes and a llama-bench style name ("llama 135M Q4_1").
fn describe(model: &Model) -> Result<(u64, u64, String)> {
    let (params, bytes, arch, ftype) = match model.source() {
        WeightSource::Gguf(f) => {
            let g = f.gguf();
            let params = g.tensors().iter().map(|t| t.n_elements).sum();
            let bytes = g.tensors().iter().map(|t| t.n_bytes).sum();
            let ftype = g
                .get_u64(tinynn_format::gguf::Key::GeneralFileType)?
                .and_then(tinynn_format::gguf::file_type_name)
                .unwrap_or("?")
                .to_string();
            (
                params,
                bytes,
                g.architecture().unwrap_or("?").to_string(),
                ftype,
            )
        }
        WeightSource::Hf(d) => {
            let (mut params, mut bytes) = (0, 0);
            for shard in &d.shards {
                for t in shard.tensors() {
                    params += t.n_elements();
                    bytes += t.n_bytes as u64;
                }
            }
            let arch = d.config.model_type.clone().unwrap_or_else(|| "?".into());
            (
                params,
                bytes,
                arch,
                d.config.weight_dtype().unwrap_or("?").to_string(),
            )
        }
    };
    let label = if params >= 1_000_000_000 {
        format!("{:.1}B", params as f64 / 1e9)
    } else {
        format!("{}M", (params as f64 / 1e6).round())
    };
    Ok((params, bytes, format!("{arch} {label} {ftype}")))
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
