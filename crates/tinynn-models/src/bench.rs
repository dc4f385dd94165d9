//! Speed tests as llama-bench and llama-batched-bench measure them, for any front end:
//! `pp N` evaluates N prompt tokens as one batch from an empty cache; `tg N` evaluates N tokens
//! one at a time from an empty cache; `tg N par S` decodes N tokens in each of S sequences, one
//! token of every sequence per run (aggregate tokens/s). With a depth `d` (llama-bench's
//! `-d`), `pp N @ dD` and `tg N @ dD` run with D tokens already in the cache (filled before
//! each repetition, untimed). Each test runs once to warm up, then `reps` times.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tinynn_cpu::ExecOptions;

use crate::model::Model;
use crate::session::{BatchToken, Session, SessionOptions};
use crate::weights::WeightSource;
use crate::{ModelError, Result};

/// Which tests to run.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchConfig {
    /// Prompt lengths (`pp`); zeros are skipped.
    pub n_prompt: Vec<usize>,
    /// Generation lengths (`tg`); zeros are skipped.
    pub n_gen: Vec<usize>,
    /// Sequence counts decoded together for each generation length (`tg N par S`).
    pub parallel: Vec<usize>,
    /// Tokens in the cache before each `pp`/`tg` test (llama-bench's `-d`); 0: empty. Each
    /// test runs at each depth.
    pub depths: Vec<usize>,
    /// Timed repetitions of each test (after one warm-up run).
    pub reps: usize,
    /// Most prompt tokens per batch (`None`: the whole prompt in one batch).
    pub n_batch: Option<usize>,
    /// Threads, strict mode, repacking.
    pub exec: ExecOptions,
    /// Other threads kept spinning during the tests (a busy machine: how much speed survives
    /// when the cores are shared); a test's name then ends in ` busyN`.
    pub busy: usize,
}

/// One test's result.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchResult {
    /// `pp512`, `tg128`, `tg128 par4`.
    pub test: String,
    /// Tokens processed per repetition.
    pub n_tokens: usize,
    /// Tokens/s of each repetition.
    pub samples_ts: Vec<f64>,
    /// Mean tokens/s.
    pub avg_ts: f64,
    /// Standard deviation of the tokens/s.
    pub stddev_ts: f64,
}

/// What the tests ran on, beside their results.
#[derive(Clone, Debug, PartialEq)]
pub struct BenchReport {
    /// One result per test, in the order run.
    pub results: Vec<BenchResult>,
    /// Bytes of the packed weight copies.
    pub packed_bytes: usize,
    /// Bytes of the one-sequence session's KV cache.
    pub kv_cache_bytes: usize,
}

/// Mean and sample standard deviation.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
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

/// Times `f` (which processes `n` tokens) once to warm up and `reps` times.
fn timed(
    test: String,
    n: usize,
    reps: usize,
    f: impl FnMut() -> Result<()>,
) -> Result<BenchResult> {
    timed_after(test, n, reps, || Ok(()), f)
}

/// [`timed`], running `setup` (untimed) before each run of `f`.
fn timed_after(
    test: String,
    n: usize,
    reps: usize,
    mut setup: impl FnMut() -> Result<()>,
    mut f: impl FnMut() -> Result<()>,
) -> Result<BenchResult> {
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..=reps {
        setup()?;
        let t0 = Instant::now();
        f()?;
        let secs = t0.elapsed().as_secs_f64();
        if rep > 0 {
            samples.push(n as f64 / secs.max(1e-9));
        }
    }
    let (avg_ts, stddev_ts) = mean_sd(&samples);
    Ok(BenchResult {
        test,
        n_tokens: n,
        samples_ts: samples,
        avg_ts,
        stddev_ts,
    })
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

/// Peak resident set size of this process (Linux `VmHWM`), in bytes; `None` elsewhere.
pub fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Starts the peak-RSS count ([`peak_rss`]) afresh from the current RSS (Linux: writes 5 to
/// `/proc/self/clear_refs`); whether it could.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Runs the tests `cfg` names on `model`.
pub fn bench(model: &Arc<Model>, cfg: &BenchConfig) -> Result<BenchReport> {
    let busy = Busy::start(cfg.busy);
    let mut report = run_tests(model, cfg)?;
    drop(busy);
    if cfg.busy > 0 {
        for r in &mut report.results {
            r.test = format!("{} busy{}", r.test, cfg.busy);
        }
    }
    Ok(report)
}

fn run_tests(model: &Arc<Model>, cfg: &BenchConfig) -> Result<BenchReport> {
    if cfg.reps == 0 {
        return Err(ModelError::Invalid("repetitions must be at least 1".into()));
    }
    if let Some(&s) = cfg.parallel.iter().find(|&&s| s == 0 || s > 64) {
        return Err(ModelError::Invalid(format!(
            "{s} parallel sequences: give 1 to 64"
        )));
    }
    let n_prompt: Vec<usize> = cfg.n_prompt.iter().copied().filter(|&n| n > 0).collect();
    let n_gen: Vec<usize> = cfg.n_gen.iter().copied().filter(|&n| n > 0).collect();
    let depths: Vec<usize> = match cfg.depths.is_empty() {
        true => vec![0],
        false => cfg.depths.clone(),
    };
    let deepest = depths.iter().copied().max().unwrap_or(0);
    let longest = n_prompt.iter().chain(&n_gen).copied().max().unwrap_or(1);
    let n_ctx = longest
        .checked_add(deepest)
        .ok_or_else(|| ModelError::Invalid(format!("a depth of {deepest} tokens is too deep")))?;
    if let Some(train) = model.config().n_ctx_train {
        if n_ctx as u64 > train.max(1) && deepest > 0 {
            return Err(ModelError::Invalid(format!(
                "depth {deepest} + {longest} tokens is past the model's context of {train}"
            )));
        }
    }
    let mut session = Session::new(model.clone(), n_ctx, cfg.exec)?;
    if cfg.n_batch == Some(0) {
        return Err(ModelError::Invalid(
            "a batch size must be at least 1".into(),
        ));
    }
    let n_batch = cfg.n_batch.unwrap_or(longest).min(longest);
    session.set_n_batch(n_batch);
    let vocab = session.model().config().n_vocab.unwrap_or(8) as usize;
    let mut results = Vec::new();
    let session = std::cell::RefCell::new(session);
    for &d in &depths {
        // The cache's first `d` tokens, filled (in batches) before each run, untimed.
        let context = tokens(d + 1, vocab).split_off(1);
        let fill = || -> Result<()> {
            let mut s = session.borrow_mut();
            s.reset();
            if !context.is_empty() {
                s.set_n_batch(n_batch.max(512).min(d));
                s.eval_batch(&context)?;
                s.set_n_batch(n_batch);
            }
            Ok(())
        };
        let at = |test: String| match d {
            0 => test,
            d => format!("{test} @ d{d}"),
        };
        for &n in &n_prompt {
            let ids = tokens(n, vocab);
            let run = || session.borrow_mut().eval_batch(&ids).map(|_| ());
            results.push(timed_after(at(format!("pp{n}")), n, cfg.reps, fill, run)?);
        }
        for &n in &n_gen {
            let ids = tokens(n, vocab);
            let run = || {
                let mut s = session.borrow_mut();
                ids.iter().try_for_each(|&t| s.eval(t).map(|_| ()))
            };
            results.push(timed_after(at(format!("tg{n}")), n, cfg.reps, fill, run)?);
        }
    }
    let session = session.into_inner();
    let report = |results| BenchReport {
        results,
        packed_bytes: session.packed_bytes(),
        kv_cache_bytes: session.kv_cache_bytes(),
    };
    let Some(&max_seq) = cfg.parallel.iter().max() else {
        return Ok(report(results));
    };
    let max_gen = n_gen.iter().copied().max().unwrap_or(0);
    if max_gen == 0 {
        return Ok(report(results));
    }
    let mut batched = Session::with_options(
        model.clone(),
        SessionOptions {
            n_ctx: max_seq * max_gen,
            n_seq: max_seq,
            exec: cfg.exec,
            ..SessionOptions::default()
        },
    )?;
    for &n in &n_gen {
        for &seqs in &cfg.parallel {
            let ids = tokens(n * seqs, vocab);
            let mut batch = Vec::with_capacity(seqs);
            let r = timed(format!("tg{n} par{seqs}"), n * seqs, cfg.reps, || {
                (0..seqs).for_each(|s| batched.clear_seq(s));
                for step in ids.chunks_exact(seqs) {
                    batch.clear();
                    batch.extend(BatchToken::one_each(step));
                    batched.decode(&batch)?;
                }
                Ok(())
            })?;
            results.push(r);
        }
    }
    Ok(report(results))
}

/// The memory read bandwidth `threads` threads reach streaming through a buffer far larger
/// than the caches (256 MiB, each thread summing its own slice), in bytes/s: the best of five
/// passes of each of two access patterns (one stream; four interleaved streams — which of
/// them a CPU and a compiler's code generation serve best varies: built for the native CPU,
/// the one-stream loop ran at a tenth of the memory's speed here), so a figure beside a
/// decode speed says what the memory gave during those minutes. The buffer lives in the
/// memory the packed weights live in (`tinynn_cpu::huge_slab`: huge pages where the kernel
/// gives them), since one core streams 4 KiB pages a quarter slower here.
pub fn read_bandwidth(threads: usize) -> f64 {
    const BYTES: usize = 256 << 20;
    let threads = threads.max(1);
    let mut owned: Vec<u64>;
    let mut slab = tinynn_cpu::huge_slab::SlabBuf::try_zeroed(BYTES).ok();
    let buf: &mut [u64] = match slab.as_mut() {
        Some(b) => bytemuck::cast_slice_mut(b.as_bytes_mut()),
        None => {
            owned = vec![0; BYTES / 8];
            &mut owned
        }
    };
    // Written first, so the passes read mapped pages.
    for (i, v) in buf.iter_mut().enumerate() {
        *v = i as u64;
    }
    let buf: &[u64] = buf;
    let slice = buf.len().div_ceil(threads);
    let mut best = 0f64;
    for pass in 0..10 {
        let sum: fn(&[u64]) -> u64 = if pass % 2 == 0 {
            sum_lanes
        } else {
            sum_streams
        };
        let t0 = Instant::now();
        let total = std::thread::scope(|s| {
            let sums: Vec<_> = buf
                .chunks(slice)
                .map(|part| s.spawn(move || sum(part)))
                .collect();
            sums.into_iter()
                .map(|h| h.join().unwrap_or(0))
                .fold(0u64, u64::wrapping_add)
        });
        std::hint::black_box(total);
        best = best.max(BYTES as f64 / t0.elapsed().as_secs_f64().max(1e-9));
    }
    best
}

/// A wrapping sum of `v` in eight independent lanes (the loop vectorizes, so it runs at the
/// speed memory delivers).
fn sum_lanes(v: &[u64]) -> u64 {
    let mut lanes = [0u64; 8];
    let mut chunks = v.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = l.wrapping_add(x);
        }
    }
    let rest = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    lanes.iter().fold(rest, |a, &x| a.wrapping_add(x))
}

/// [`sum_lanes`] over four quarters of `v` read side by side (four prefetch streams).
fn sum_streams(v: &[u64]) -> u64 {
    let n = v.len() / 32 * 8;
    let (quarters, tail) = v.split_at(4 * n);
    let q: Vec<&[u64]> = quarters.chunks_exact(n.max(1)).collect();
    let mut lanes = [[0u64; 8]; 4];
    if n > 0 {
        for j in (0..n).step_by(8) {
            for (acc, part) in lanes.iter_mut().zip(&q) {
                for (l, &x) in acc.iter_mut().zip(&part[j..j + 8]) {
                    *l = l.wrapping_add(x);
                }
            }
        }
    }
    let rest = sum_lanes(tail);
    lanes.iter().flatten().fold(rest, |a, &x| a.wrapping_add(x))
}

/// Bytes one decode step reads, as stored in the file (a repacked copy holds the same
/// weights), when the cache holds `depth` tokens: every weight matrix once; of the token
/// embedding table one row, unless it is also the output head (tied: read whole); of a
/// mixture-of-experts block's expert tensors the routed share (`used / count`); and the KV
/// cache's `depth` keys and values per layer (f16; f32 in strict mode, `kv_bytes = 4`).
pub fn decode_bytes_per_token(model: &Model, depth: f64, kv_bytes: u64) -> u64 {
    let config = model.config();
    let expert_share = config
        .experts
        .map_or(1.0, |e| e.used as f64 / e.count.max(1) as f64);
    let mut weights = 0f64;
    if let WeightSource::Gguf(f) = model.source() {
        let tensors = f.gguf().tensors();
        let untied = tensors.iter().any(|t| t.name == "output.weight");
        for t in tensors {
            let bytes = t.n_bytes as f64;
            weights += if t.name == "token_embd.weight" && untied {
                let rows = t.dims.get(1).copied().unwrap_or(1).max(1);
                bytes / rows as f64
            } else if t.name.contains("_exps") {
                bytes * expert_share
            } else {
                bytes
            };
        }
    } else {
        weights = describe(model).map_or(0, |(_, bytes, _)| bytes) as f64;
    }
    let kv = if config.ssm.is_some() {
        0.0
    } else {
        let per_token = 2 * config.n_layer * config.n_head_kv * config.head_dim * kv_bytes;
        per_token as f64 * depth
    };
    (weights + kv).round() as u64
}

/// Parameter count, tensor bytes and a llama-bench style name ("llama 135M Q4_1").
pub fn describe(model: &Model) -> Result<(u64, u64, String)> {
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

#[cfg(test)]
mod tests {
    use super::{sum_lanes, sum_streams};

    #[test]
    fn the_probe_sums_every_word() {
        for n in [0u64, 1, 7, 8, 9, 31, 32, 33, 1000, 4097] {
            let v: Vec<u64> = (0..n).map(|i| i * 3 + 1).collect();
            assert_eq!(sum_lanes(&v), v.iter().sum::<u64>(), "{n}");
            assert_eq!(sum_streams(&v), v.iter().sum::<u64>(), "{n}");
        }
    }
}
