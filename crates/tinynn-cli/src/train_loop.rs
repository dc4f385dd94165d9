//! The flags `tnn finetune` and `tnn train` share, turned into the library's
//! [`LoopConfig`], and the terminal side of the training
//! loop (`tinynn_train::train_loop::fit`): the Ctrl-C handler that sets the stop flag, and the
//! progress bar and messages on stderr.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Result;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use tinynn_format::GgmlType;
use tinynn_train::collective::Collective;
use tinynn_train::data::{BatchConfig, Batcher, EvalSplit, Tokenization};
use tinynn_train::metrics::StepMetrics;
pub use tinynn_train::train_loop::Output;
use tinynn_train::train_loop::{
    self as lib, EvalEvent, EvalKind, LoopConfig, LoopObserver, LoopOutcome, LoopStart,
    TrainSummary,
};
use tinynn_train::{Optimizer, TrainConfig, Trainer};

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
    /// QLoRA: gradient products through the quantized base in f32 (dequantized weights)
    /// instead of int8 (the base's transpose requantized to Q8_0 and the gradients quantized
    /// to 8 bits per 32 values, as activations are in the forward pass: faster, the
    /// default).
    #[arg(long)]
    pub f32_backward: bool,
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
    /// Under mpirun: sum each gradient across the ranks as soon as the backward pass has
    /// finished it (`on`), or all after the pass (`off`). `auto`: on when each rank has a core
    /// beyond its threads for MPI (which waits by spinning). The model is the same either way.
    #[arg(long, value_enum, default_value_t = Overlap::Auto)]
    pub overlap: Overlap,
    /// Tests: report a non-finite loss at these step attempts (1-based).
    #[arg(long = "inject-nan", hide = true, value_delimiter = ',')]
    pub inject_nan: Vec<u64>,
}

/// `--overlap`: when a data-parallel step sums its gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Overlap {
    Auto,
    On,
    Off,
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
            int8_backward: !self.f32_backward,
            trace: self.trace.is_some(),
            lora,
            overlap_bytes: match self.overlap {
                Overlap::On => TrainConfig::default().overlap_bytes,
                Overlap::Auto if crate::ranks::overlap_by_default(self.threads()) => {
                    TrainConfig::default().overlap_bytes
                }
                _ => 0,
            },
            ..TrainConfig::default()
        }
    }

    /// The run's identity for `--resume` (a checkpoint must come from the same): these flags'
    /// settings, the number of data-parallel ranks (when more than one: a checkpoint resumes
    /// with the ranks that wrote it) and the command's own `extra` keys.
    pub fn identity(&self, ranks: usize, extra: serde_json::Value) -> serde_json::Value {
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
        if ranks > 1 {
            run["ranks"] = ranks.into();
        }
        if self.f32_backward {
            run["f32_backward"] = true.into();
        }
        if let (Some(run), serde_json::Value::Object(extra)) = (run.as_object_mut(), extra) {
            run.extend(extra);
        }
        run
    }

    pub fn threads(&self) -> usize {
        self.threads.unwrap_or_else(crate::ranks::cores_per_rank)
    }

    pub fn optimizer(&self) -> Optimizer {
        Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: self.weight_decay,
        }
    }

    /// The loop's settings these flags give: `output` to export, `identity` for `--resume`.
    pub fn loop_config(&self, output: Output, identity: serde_json::Value) -> LoopConfig {
        LoopConfig {
            steps: self.steps,
            lr: self.lr,
            schedule: match self.schedule {
                ScheduleKind::Constant => lib::ScheduleKind::Constant,
                ScheduleKind::Cosine => lib::ScheduleKind::Cosine,
                ScheduleKind::Linear => lib::ScheduleKind::Linear,
            },
            warmup: self.warmup,
            min_lr: self.min_lr,
            eval_every: self.eval_every,
            eval_batches: self.eval_batches,
            save_every: self.save_every,
            keep: self.keep,
            out: self.out.clone(),
            resume: self.resume,
            export_type: self.export_type(),
            output,
            run_identity: identity,
            trace: self.trace.clone(),
            inject_nan: self.inject_nan.clone(),
        }
    }

    /// The data file, tokenized as `tok` says, and the batcher over it: global batches of
    /// `ranks` × `--batch` sequences, which the ranks share.
    pub fn batcher(&self, tok: &Tokenization<'_>, ranks: usize) -> Result<Batcher> {
        let source = tinynn_train::data::open(&self.data, self.seq, tok)?;
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
                batch: self.batch * ranks,
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

/// Runs the loop to `args.steps` optimizer steps as a rank of `comm`, with a progress bar on a
/// terminal (lines on stderr otherwise; rank 0 only); Ctrl-C saves a checkpoint and ends the
/// run cleanly. `config` identifies the run: a resumed checkpoint must have been written with
/// the same.
pub fn train(
    trainer: &mut Trainer,
    batcher: &mut Batcher,
    args: &LoopArgs,
    output: Output,
    config: serde_json::Value,
    comm: &mut dyn Collective,
) -> Result<()> {
    let cfg = args.loop_config(output, config);
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // A second handler in one process (tests) is refused; the first one keeps working.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }
    let mut progress = Progress {
        bar: None,
        steps: cfg.steps,
    };
    match lib::fit_data_parallel(trainer, batcher, &cfg, &stop, &mut progress, comm) {
        Ok(_) => Ok(()),
        Err(e) => {
            if let Some(bar) = &progress.bar {
                bar.abandon();
            }
            Err(e.into())
        }
    }
}

/// The loop's events on stderr: a progress bar on a terminal, a line per step otherwise.
struct Progress {
    /// Made once the loop starts (messages before it are plain lines).
    bar: Option<ProgressBar>,
    /// The step training goes to.
    steps: u64,
}

impl Progress {
    /// A line above the progress bar (on stderr when there is no bar).
    fn say(&self, msg: &str) {
        match &self.bar {
            Some(bar) if !bar.is_hidden() => bar.println(msg),
            _ => eprintln!("{msg}"),
        }
    }
}

impl LoopObserver for Progress {
    fn on_start(&mut self, s: &LoopStart) {
        let m = &s.memory;
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
        let d = &s.data;
        eprintln!(
            "data: {} sequences of {} tokens ({} train, {} held out; {} tokens, {} truncated, {} skipped); {} trainable values",
            d.sequences, s.seq, s.n_train, s.n_eval, d.tokens, d.truncated, d.skipped, s.trainable,
        );
        self.bar = Some(progress_bar(s.steps, s.step));
    }

    fn on_eval(&mut self, e: &EvalEvent) {
        if e.kind == EvalKind::Before {
            self.say(&format!("held-out loss before training {:.4}", e.loss));
        }
    }

    fn on_step(&mut self, m: &StepMetrics) {
        // A skipped step is reported by its message.
        let Some(bar) = self.bar.as_ref().filter(|_| !m.skipped) else {
            return;
        };
        let msg = format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s{}",
            m.loss,
            m.lr,
            m.tokens_per_s,
            m.eval_loss
                .map_or(String::new(), |e| format!(" eval {e:.4}"))
        );
        bar.set_position(m.step);
        bar.set_message(msg.clone());
        if bar.is_hidden() {
            eprintln!("step {}/{}: {msg}", m.step, self.steps);
        }
    }

    fn on_message(&mut self, msg: &str) {
        self.say(msg);
    }

    fn on_train_end(&mut self, s: &TrainSummary) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
        let secs = s.secs.max(1e-9);
        eprintln!(
            "{} steps in {:.1} s ({:.3} steps/s, {:.0} tokens/s); last loss {:.4}{}",
            s.steps_run,
            s.secs,
            s.steps_run as f64 / secs,
            s.tokens as f64 / secs,
            s.last_loss.unwrap_or(f32::NAN),
            match (s.eval_before, s.eval_after) {
                (Some(b), Some(e)) => format!(", held-out loss {b:.4} -> {e:.4}"),
                (_, Some(e)) => format!(", held-out loss {e:.4}"),
                _ => String::new(),
            }
        );
        if s.ranks > 1 {
            eprintln!(
                "{} ranks: the gradient all-reduce took {:.1} ms per step in MPI's sums and held \
                 each step {:.1} ms after its backward pass ({:.1}% of the time)",
                s.ranks,
                1e3 * s.reduce_comm_secs / s.steps_run.max(1) as f64,
                1e3 * s.reduce_secs / s.steps_run.max(1) as f64,
                100.0 * s.reduce_secs / secs
            );
        }
    }

    fn on_end(&mut self, outcome: &LoopOutcome) {
        if !outcome.interrupted {
            return;
        }
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
        if let Some(path) = &outcome.checkpoint {
            eprintln!(
                "interrupted at step {}: saved {}; continue with --resume",
                outcome.steps,
                path.display()
            );
        }
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
