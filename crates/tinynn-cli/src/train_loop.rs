//! The training loop `tnn finetune` and `tnn train` share: batches, learning-rate schedule,
//! optimizer steps, eval, checkpoints (`--save-every`, at the end, on Ctrl-C), `--resume`,
//! the JSONL metrics log, the progress bar and the loss-curve PNG.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tinynn_format::GgmlType;
use tinynn_train::checkpoint::{self, Checkpoint, CheckpointMeta, SaveOptions, TensorRef};
use tinynn_train::data::{BatchConfig, Batcher, EvalSplit};
use tinynn_train::metrics::{self, MetricsLog, StepMetrics};
use tinynn_train::rng::Rng;
use tinynn_train::schedule::Schedule;
use tinynn_train::{NamedTensor, Optimizer, OptimizerState, TrainConfig, Trainer};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScheduleKind {
    Constant,
    Cosine,
    Linear,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ExportType {
    F32,
    F16,
}

#[derive(Args, Clone, Debug)]
pub struct LoopArgs {
    /// Training data: .txt (packed text), .jsonl (chat samples, loss on assistant tokens) or
    /// .bin (pre-tokenized little-endian i32 ids).
    #[arg(long)]
    pub data: PathBuf,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 256)]
    pub seq: usize,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 4)]
    pub batch: usize,
    /// bf16 mixed precision: the matrix products round their operands to bf16 and sum in f32
    /// (AVX-512 BF16; plain f32 where the CPU lacks it); weights and optimizer state stay f32.
    #[arg(long)]
    pub bf16: bool,
    /// Micro-batches per optimizer step (gradient accumulation).
    #[arg(long, default_value_t = 1)]
    pub accum: usize,
    /// Optimizer steps to train for (in total, counting those before a resume).
    #[arg(long)]
    pub steps: u64,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 1e-4)]
    pub lr: f32,
    /// Learning-rate schedule after the warmup.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Constant)]
    pub schedule: ScheduleKind,
    /// Warmup steps (linear rise to --lr; cosine/linear schedules).
    #[arg(long, default_value_t = 0)]
    pub warmup: u64,
    /// Final learning rate of the cosine/linear decay.
    #[arg(long = "min-lr", default_value_t = 0.0)]
    pub min_lr: f32,
    /// Clip the gradient to this global L2 norm.
    #[arg(long)]
    pub clip: Option<f32>,
    /// AdamW's decoupled weight decay.
    #[arg(long = "weight-decay", default_value_t = 0.01)]
    pub weight_decay: f32,
    /// Evaluate the held-out split every E steps (0: only at the end).
    #[arg(long = "eval-every", default_value_t = 0)]
    pub eval_every: u64,
    /// Fraction of the sequences held out for evaluation (0: none).
    #[arg(long = "eval-frac", default_value_t = 0.1)]
    pub eval_frac: f64,
    /// Evaluate at most this many batches of the held-out split (0: all).
    #[arg(long = "eval-batches", default_value_t = 0)]
    pub eval_batches: usize,
    /// Write a checkpoint every S steps (0: only at the end and on Ctrl-C).
    #[arg(long = "save-every", default_value_t = 0)]
    pub save_every: u64,
    /// Checkpoints to keep (0: all).
    #[arg(long = "keep", default_value_t = 3)]
    pub keep: usize,
    /// Output directory: checkpoints, metrics.jsonl, loss.png and the final model or adapter.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue from the latest checkpoint in --out.
    #[arg(long)]
    pub resume: bool,
    /// Seeds shuffling, LoRA init and dropout (and random init for `tnn train`).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Threads (default: all cores). Results are bit-exact for a fixed thread count.
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Keep the data in file order (no per-epoch shuffle).
    #[arg(long = "no-shuffle")]
    pub no_shuffle: bool,
    /// Tensor type of the exported model (`model.gguf`, `merged.gguf`).
    #[arg(long = "export-type", value_enum, default_value_t = ExportType::F16)]
    pub export_type: ExportType,
    /// Write the last step's per-op timings (forward + backward) as Chrome trace JSON to FILE
    /// (open it in Perfetto or chrome://tracing).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Tests: report a non-finite loss at these step attempts (1-based).
    #[arg(long = "inject-nan", hide = true, value_delimiter = ',')]
    pub inject_nan: Vec<u64>,
}

impl LoopArgs {
    /// The trainer settings these flags give (`lora`: an adapter instead of every weight).
    pub fn train_config(&self, lora: Option<tinynn_train::LoraConfig>) -> TrainConfig {
        TrainConfig {
            seq: self.seq,
            batch: self.batch,
            accum: self.accum,
            optimizer: self.optimizer(),
            clip: self.clip,
            threads: self.threads(),
            bf16_matmul: self.bf16,
            trace: self.trace.is_some(),
            lora,
            ..TrainConfig::default()
        }
    }

    /// The run's identity for `--resume` (a checkpoint must come from the same): these flags'
    /// settings plus the command's own `extra` keys.
    pub fn identity(&self, extra: serde_json::Value) -> serde_json::Value {
        let mut run = serde_json::json!({
            "data": self.data.display().to_string(),
            "seq": self.seq,
            "batch": self.batch,
            "bf16": self.bf16,
            "accum": self.accum,
            "seed": self.seed,
            "eval_frac": self.eval_frac,
            "shuffle": !self.no_shuffle,
            "weight_decay": self.weight_decay,
            "clip": self.clip,
        });
        if let (Some(run), serde_json::Value::Object(extra)) = (run.as_object_mut(), extra) {
            run.extend(extra);
        }
        run
    }

    pub fn threads(&self) -> usize {
        self.threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }

    pub fn optimizer(&self) -> Optimizer {
        Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: self.weight_decay,
        }
    }

    pub fn schedule(&self) -> Result<Schedule> {
        let s = match self.schedule {
            ScheduleKind::Constant => Schedule::Constant { lr: self.lr },
            ScheduleKind::Cosine => Schedule::WarmupCosine {
                lr: self.lr,
                min_lr: self.min_lr,
                warmup_steps: self.warmup,
                total_steps: self.steps,
            },
            ScheduleKind::Linear => Schedule::WarmupLinear {
                lr: self.lr,
                min_lr: self.min_lr,
                warmup_steps: self.warmup,
                total_steps: self.steps,
            },
        };
        s.validate()?;
        Ok(s)
    }

    /// Whether the data file holds chat samples (`.jsonl`), which need a chat template.
    pub fn chat_data(&self) -> bool {
        self.data.extension().is_some_and(|e| e == "jsonl")
    }

    /// The data file, tokenized as `tok` says, and the batcher over it.
    pub fn batcher(&self, tok: &crate::train_data::Tokenization<'_>) -> Result<Batcher> {
        let source = crate::train_data::open(&self.data, self.seq, tok)?;
        let eval = if self.eval_frac > 0.0 {
            EvalSplit::Last {
                fraction: self.eval_frac,
            }
        } else {
            EvalSplit::None
        };
        Ok(Batcher::new(
            source,
            BatchConfig {
                batch: self.batch,
                shuffle: !self.no_shuffle,
                seed: self.seed,
                eval,
            },
        )?)
    }

    pub fn export_type(&self) -> GgmlType {
        match self.export_type {
            ExportType::F32 => GgmlType::F32,
            ExportType::F16 => GgmlType::F16,
        }
    }
}

/// What the run writes at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `adapter.gguf`, and `merged.gguf` with `merge`.
    Adapter { merge: bool },
    /// `model.gguf`.
    Model,
}

/// Non-finite steps in a row that stop training.
const MAX_BAD_STEPS: u32 = 3;

/// Runs the loop to `args.steps` optimizer steps. `config` identifies the run: a resumed
/// checkpoint must have been written with the same.
pub fn train(
    trainer: &mut Trainer,
    batcher: &mut Batcher,
    args: &LoopArgs,
    output: Output,
    config: serde_json::Value,
) -> Result<()> {
    let dir = &args.out;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let schedule = args.schedule()?;
    let config_json = config.to_string();
    let metrics_path = dir.join("metrics.jsonl");
    let mut log = if args.resume {
        resume(trainer, batcher, dir, &config_json, &schedule)?;
        MetricsLog::resume(&metrics_path, trainer.steps_taken())?
    } else {
        MetricsLog::create(&metrics_path)?
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second handler in one process (tests) is refused; the first one keeps working.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }
    let s = batcher.stats();
    let m = trainer.memory();
    let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
    eprintln!(
        "memory: {:.1} MiB planned (arenas: grad {:.1}, eval {:.1}, update {:.1}; parameters {:.1}, gradients {:.1}, optimizer {:.1}, frozen base {:.1} + packed {:.1})",
        mib(m.total()),
        mib(m.grad_arena),
        mib(m.eval_arena),
        mib(m.update_arena),
        mib(m.params),
        mib(m.grads),
        mib(m.optimizer),
        mib(m.frozen),
        mib(m.packed),
    );
    eprintln!(
        "data: {} sequences of {} tokens ({} train, {} held out; {} tokens, {} truncated, {} skipped); {} trainable values",
        s.sequences,
        batcher.seq(),
        batcher.n_train(),
        batcher.n_eval(),
        s.tokens,
        s.truncated,
        s.skipped,
        trainer
            .param_specs()
            .iter()
            .map(|p| p.dims.iter().product::<usize>())
            .sum::<usize>(),
    );
    let ctx = Saver {
        dir,
        config_json: &config_json,
        schedule,
        keep: args.keep,
    };
    let bar = progress_bar(args.steps, trainer.steps_taken());
    let mb = trainer.micro_batch_tokens();
    let n = mb * args.accum;
    let (mut ids, mut labels) = (vec![0i32; n], vec![0i32; n]);
    let t0 = Instant::now();
    let (mut tokens, mut attempts, mut bad) = (0u64, 0u64, 0u32);
    let mut last_saved = None;
    let mut last_loss = f32::NAN;
    let first_step = trainer.steps_taken();
    // A fresh run scores the held-out split once before training: the baseline to beat.
    let before = if first_step == 0 {
        evaluate(trainer, batcher, args.eval_batches)?
    } else {
        None
    };
    if let Some(b) = before {
        say(&bar, &format!("held-out loss before training {b:.4}"));
    }
    while trainer.steps_taken() < args.steps {
        if stop.load(Ordering::SeqCst) {
            let path = ctx.save(trainer, batcher)?;
            bar.abandon();
            eprintln!(
                "interrupted at step {}: saved {}; continue with --resume",
                trainer.steps_taken(),
                path.display()
            );
            write_plot(dir, &metrics_path);
            return Ok(());
        }
        for k in 0..args.accum {
            let r = k * mb..(k + 1) * mb;
            batcher.next_into(&mut ids[r.clone()], &mut labels[r])?;
        }
        let lr = schedule.lr(trainer.steps_taken());
        attempts += 1;
        if args.inject_nan.contains(&attempts) {
            trainer.poison_next_steps(1);
        }
        let rep = trainer.step(&ids, &labels, lr)?;
        tokens += n as u64;
        let elapsed = t0.elapsed().as_secs_f64();
        let tps = tokens as f64 / elapsed.max(1e-9);
        let mut m = StepMetrics {
            step: if rep.skipped { rep.step + 1 } else { rep.step },
            loss: rep.loss,
            lr,
            grad_norm: Some(rep.grad_norm),
            tokens_per_s: tps,
            elapsed_s: elapsed,
            eval_loss: None,
            skipped: rep.skipped,
        };
        if rep.skipped {
            bad += 1;
            log.log(&m)?;
            say(
                &bar,
                &format!(
                    "step {}: non-finite loss or gradient (loss {}, grad norm {}); update skipped",
                    m.step, rep.loss, rep.grad_norm
                ),
            );
            if bad >= MAX_BAD_STEPS {
                bar.abandon();
                let last = match checkpoint::list(dir)?.last() {
                    Some((step, _)) => format!("the last checkpoint (step {step}) is intact"),
                    None => "no checkpoint was written".into(),
                };
                bail!("training stopped: {MAX_BAD_STEPS} non-finite steps in a row; {last}");
            }
            continue;
        }
        bad = 0;
        last_loss = rep.loss;
        let step = rep.step;
        if args.eval_every > 0 && step % args.eval_every == 0 && step < args.steps {
            m.eval_loss = evaluate(trainer, batcher, args.eval_batches)?;
        }
        log.log(&m)?;
        let msg = format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s{}",
            rep.loss,
            lr,
            tps,
            m.eval_loss
                .map_or(String::new(), |e| format!(" eval {e:.4}"))
        );
        bar.set_position(step);
        bar.set_message(msg.clone());
        if bar.is_hidden() {
            eprintln!("step {step}/{}: {msg}", args.steps);
        }
        if args.save_every > 0 && step % args.save_every == 0 {
            ctx.save(trainer, batcher)?;
            last_saved = Some(step);
        }
    }
    bar.finish();
    let steps_run = trainer.steps_taken() - first_step;
    let secs = t0.elapsed().as_secs_f64();
    let eval = evaluate(trainer, batcher, args.eval_batches)?;
    if let Some(e) = eval {
        // The final eval goes into the log as its own entry of the last step.
        log.log(&StepMetrics {
            step: trainer.steps_taken(),
            loss: last_loss,
            lr: schedule.lr(trainer.steps_taken().saturating_sub(1)),
            grad_norm: None,
            tokens_per_s: tokens as f64 / secs.max(1e-9),
            elapsed_s: secs,
            eval_loss: Some(e),
            skipped: false,
        })?;
    }
    if last_saved != Some(trainer.steps_taken()) {
        ctx.save(trainer, batcher)?;
    }
    eprintln!(
        "{steps_run} steps in {secs:.1} s ({:.3} steps/s, {:.0} tokens/s); last loss {last_loss:.4}{}",
        steps_run as f64 / secs.max(1e-9),
        tokens as f64 / secs.max(1e-9),
        match (before, eval) {
            (Some(b), Some(e)) => format!(", held-out loss {b:.4} -> {e:.4}"),
            (_, Some(e)) => format!(", held-out loss {e:.4}"),
            _ => String::new(),
        }
    );
    export(trainer, dir, output, args.export_type())?;
    write_plot(dir, &metrics_path);
    if let (Some(path), Some(json)) = (&args.trace, trainer.last_trace()) {
        std::fs::write(path, json).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// A line above the progress bar (on stderr when there is no bar).
fn say(bar: &ProgressBar, msg: &str) {
    if bar.is_hidden() {
        eprintln!("{msg}");
    } else {
        bar.println(msg);
    }
}

fn progress_bar(steps: u64, at: u64) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new(steps)
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:30} {pos}/{len} {msg} [{elapsed_precise} < {eta_precise}]",
    ) {
        bar.set_style(style);
    }
    bar.set_position(at);
    bar
}

/// Mean loss over the held-out split (weighted by scored tokens); `None` without one.
fn evaluate(trainer: &mut Trainer, batcher: &Batcher, max: usize) -> Result<Option<f32>> {
    if batcher.n_eval() == 0 {
        return Ok(None);
    }
    let (mut sum, mut count) = (0f64, 0usize);
    for (i, b) in batcher.eval_batches().enumerate() {
        if max > 0 && i >= max {
            break;
        }
        let b = b?;
        if b.tokens == 0 {
            continue;
        }
        let loss = trainer.eval_loss(&b.inputs, &b.labels)?;
        sum += f64::from(loss) * b.tokens as f64;
        count += b.tokens;
    }
    Ok((count > 0).then(|| (sum / count as f64) as f32))
}

/// Writes the final files.
fn export(trainer: &Trainer, dir: &Path, output: Output, ty: GgmlType) -> Result<()> {
    match output {
        Output::Adapter { merge } => {
            let p = dir.join("adapter.gguf");
            trainer.export_adapter(&p)?;
            eprintln!("wrote {}", p.display());
            if merge {
                let p = dir.join("merged.gguf");
                trainer
                    .export_gguf(&p, ty)
                    .with_context(|| format!("writing {}", p.display()))?;
                eprintln!("wrote {}", p.display());
            }
        }
        Output::Model => {
            let p = dir.join("model.gguf");
            trainer
                .export_gguf(&p, ty)
                .with_context(|| format!("writing {}", p.display()))?;
            eprintln!("wrote {}", p.display());
        }
    }
    Ok(())
}

/// The loss curve (a failure is reported, not fatal).
fn write_plot(dir: &Path, metrics_path: &Path) {
    let png = dir.join("loss.png");
    let done = metrics::read(metrics_path)
        .map_err(anyhow::Error::from)
        .and_then(|m| Ok(tinynn_train::plot::loss_curve_png(&png, &m, 900, 500)?));
    if let Err(e) = done {
        eprintln!("warning: no loss curve: {e:#}");
    }
}

/// What every checkpoint of the run shares.
struct Saver<'a> {
    dir: &'a Path,
    config_json: &'a str,
    schedule: Schedule,
    keep: usize,
}

impl Saver<'_> {
    fn save(&self, trainer: &Trainer, batcher: &Batcher) -> Result<PathBuf> {
        // Borrowed from the trainer: a checkpoint of a large model makes no copy of it.
        let params = trainer.param_views()?;
        let opt = trainer.optimizer_views()?;
        let prefixes = trainer.train_config().optimizer.state_prefixes();
        let dims: Vec<Vec<u64>> = params
            .iter()
            .map(|p| p.1.iter().map(|&d| d as u64).collect())
            .collect();
        let refs = params
            .iter()
            .zip(&dims)
            .map(|(p, d)| TensorRef {
                name: p.0,
                dims: d,
                data: p.2,
            })
            .collect();
        // The optimizer's views hold, per parameter, one tensor per prefix.
        let groups = prefixes
            .iter()
            .enumerate()
            .map(|(k, prefix)| {
                let tensors = (0..params.len())
                    .map(|i| opt[i * prefixes.len() + k])
                    .collect();
                (format!("{prefix}."), tensors)
            })
            .collect();
        let ckpt = Checkpoint {
            meta: CheckpointMeta {
                step: trainer.steps_taken(),
                architecture: Some(trainer.architecture()),
                schedule: Some(self.schedule),
                data: Some(batcher.position()),
                rngs: vec![("dropout".into(), trainer.dropout_rng().state)],
                config_json: self.config_json.to_string(),
            },
            params: refs,
            groups,
        };
        let opts = SaveOptions {
            keep_last: self.keep,
            ..SaveOptions::default()
        };
        Ok(checkpoint::save(self.dir, &ckpt, &opts)?)
    }
}

/// Restores the trainer and batcher from the latest checkpoint in `dir`.
fn resume(
    trainer: &mut Trainer,
    batcher: &mut Batcher,
    dir: &Path,
    config_json: &str,
    schedule: &Schedule,
) -> Result<()> {
    let ck = checkpoint::load_latest(dir)?;
    if let Some(why) = &ck.fallback {
        eprintln!("warning: {why}");
    }
    if ck.meta.config_json != config_json {
        bail!(
            "--resume: {} was written by a run with other settings ({}); this run has {config_json}",
            ck.path.display(),
            ck.meta.config_json
        );
    }
    if ck.meta.schedule.as_ref() != Some(schedule) {
        eprintln!("note: the learning-rate schedule differs from the checkpoint's");
    }
    let params = ck
        .param_tensors()
        .map(|t| {
            let t = t?;
            Ok(NamedTensor {
                name: t.name.to_string(),
                dims: t.dims.iter().map(|&d| d as usize).collect(),
                data: t.data.to_vec(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    trainer.load_params(&params)?;
    let mut tensors = Vec::new();
    for p in &params {
        for prefix in trainer.train_config().optimizer.state_prefixes() {
            tensors.push(NamedTensor {
                name: format!("{prefix}.{}", p.name),
                dims: p.dims.clone(),
                data: ck.group(&format!("{prefix}."), &p.name)?.to_vec(),
            });
        }
    }
    trainer.load_optimizer_state(&OptimizerState {
        step: ck.meta.step,
        tensors,
    })?;
    let Some(pos) = ck.meta.data else {
        bail!("{}: the checkpoint has no data position", ck.path.display());
    };
    batcher.set_position(pos)?;
    if let Some(state) = ck.rng("dropout") {
        trainer.set_dropout_rng(Rng { state });
    }
    eprintln!("resumed from {} (step {})", ck.path.display(), ck.meta.step);
    Ok(())
}
