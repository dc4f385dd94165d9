//! The training loop's settings.

use std::path::PathBuf;

use tinynn_format::GgmlType;

use crate::error::{Result, TrainError};
use crate::schedule::Schedule;

/// The shape of the learning-rate schedule (`LoopConfig::schedule`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ScheduleKind {
    /// `lr` at every step (the warmup and `min_lr` are not used).
    #[default]
    Constant,
    /// Linear warmup, then half a cosine down to `min_lr` at the last step.
    Cosine,
    /// Linear warmup, then a straight line down to `min_lr` at the last step.
    Linear,
}

/// What the run writes into the output directory when it completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `adapter.gguf` (a LoRA trainer's adapter), and with `merge` also `merged.gguf` (the base
    /// with the adapter merged in; GGUF bases only).
    Adapter {
        /// Also write `merged.gguf`.
        merge: bool,
    },
    /// `model.gguf`: every trained weight.
    Model,
}

/// The training loop's settings: plain data, so that any front end (the `tnn` command line, a
/// C or Python binding) can fill them in.
///
/// The trainer's own settings (sequence length, batch, accumulation, optimizer and weight
/// decay, clipping, threads, LoRA) are its [`TrainConfig`](crate::TrainConfig), and the
/// data's (eval split, shuffle, seed) the [`BatchConfig`](crate::data::BatchConfig) of the
/// batcher: both are fixed when those are built, before [`fit`](super::fit) runs. Put what must
/// match for a resume into `run_identity`.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopConfig {
    /// Optimizer steps to train to, in total (counting those before a resume).
    pub steps: u64,
    /// Peak learning rate.
    pub lr: f32,
    /// Learning-rate schedule after the warmup.
    pub schedule: ScheduleKind,
    /// Warmup steps (linear rise to `lr`; cosine and linear schedules).
    pub warmup: u64,
    /// Final learning rate of the cosine / linear decay.
    pub min_lr: f32,
    /// Evaluate the held-out split every this many steps (0: only before and after training).
    pub eval_every: u64,
    /// Evaluate at most this many batches of the held-out split (0: all).
    pub eval_batches: usize,
    /// Write a checkpoint every this many steps (0: only at the end and when stopped).
    pub save_every: u64,
    /// Checkpoints to keep in `out` (0: all).
    pub keep: usize,
    /// Output directory (created if missing): checkpoints, `metrics.jsonl`, `loss.png` and the
    /// exported adapter or model.
    pub out: PathBuf,
    /// Continue from the latest checkpoint in `out` (weights, optimizer state, data position,
    /// dropout RNG): the run then repeats an uninterrupted run bit for bit.
    pub resume: bool,
    /// Tensor type of an exported model (`model.gguf`, `merged.gguf`): F32 or F16.
    pub export_type: GgmlType,
    /// What to export at the end.
    pub output: Output,
    /// The run's identity, stored in every checkpoint: a resumed checkpoint must have been
    /// written with an equal one ([`TrainError::ResumeMismatch`] otherwise).
    pub run_identity: serde_json::Value,
    /// Write the last step's per-op timings (Chrome trace JSON) here at the end; the trainer
    /// must have been built with `TrainConfig::trace`.
    pub trace: Option<PathBuf>,
    /// Tests only: step attempts (1-based, counted by this call) that report a non-finite loss.
    #[doc(hidden)]
    pub inject_nan: Vec<u64>,
}

impl LoopConfig {
    /// `tnn finetune`'s defaults: lr 1e-4 constant, no warmup, eval only before and after,
    /// checkpoints at the end (3 kept), F16 export of the whole model, an empty identity.
    pub fn new(out: impl Into<PathBuf>, steps: u64) -> LoopConfig {
        LoopConfig {
            steps,
            lr: 1e-4,
            schedule: ScheduleKind::Constant,
            warmup: 0,
            min_lr: 0.0,
            eval_every: 0,
            eval_batches: 0,
            save_every: 0,
            keep: 3,
            out: out.into(),
            resume: false,
            export_type: GgmlType::F16,
            output: Output::Model,
            run_identity: serde_json::Value::Object(Default::default()),
            trace: None,
            inject_nan: Vec::new(),
        }
    }

    /// The learning-rate schedule these settings give, validated.
    pub fn lr_schedule(&self) -> Result<Schedule> {
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

    /// Checks what can be checked before training: the schedule and the export type.
    pub fn validate(&self) -> Result<Schedule> {
        if !matches!(self.export_type, GgmlType::F32 | GgmlType::F16) {
            return Err(TrainError::Unsupported(format!(
                "exporting {} tensors (F32 or F16)",
                self.export_type
            )));
        }
        self.lr_schedule()
    }
}
