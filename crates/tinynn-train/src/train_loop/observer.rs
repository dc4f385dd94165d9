//! What the training loop tells its caller while it runs ([`LoopObserver`]) and what it returns
//! ([`LoopOutcome`]).

use std::path::{Path, PathBuf};

use crate::data::SourceStats;
use crate::metrics::StepMetrics;
use crate::trainer::TrainMemory;

/// The loop's view of the run once it is set up (after a resume), before any step.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopStart {
    /// Optimizer steps already taken (0 for a fresh run; the checkpoint's step after a resume).
    pub step: u64,
    /// The step the loop trains to (`LoopConfig::steps`).
    pub steps: u64,
    /// The checkpoint the run resumed from.
    pub resumed_from: Option<PathBuf>,
    /// Bytes the trainer holds, by purpose.
    pub memory: TrainMemory,
    /// What the data source made of its input.
    pub data: SourceStats,
    /// Tokens per sequence.
    pub seq: usize,
    /// Sequences in the training split.
    pub n_train: usize,
    /// Sequences held out for evaluation.
    pub n_eval: usize,
    /// Trainable values (the parameters' element count).
    pub trainable: usize,
}

/// When a held-out evaluation ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EvalKind {
    /// Before the first step of a fresh run: the baseline to beat.
    Before,
    /// Every `LoopConfig::eval_every` steps (not at the last step).
    Periodic,
    /// After the last step.
    Final,
}

/// One held-out evaluation: the mean loss over the evaluated batches, weighted by scored tokens.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EvalEvent {
    /// Optimizer steps taken when it ran.
    pub step: u64,
    /// The held-out loss.
    pub loss: f32,
    /// Before training, periodic or final.
    pub kind: EvalKind,
}

/// Why a checkpoint was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveReason {
    /// Every `LoopConfig::save_every` steps.
    Periodic,
    /// After the last step (unless a periodic save just wrote that step).
    Final,
    /// The stop flag was set.
    Interrupted,
}

/// A checkpoint written (atomically, with the `latest` pointer updated).
#[derive(Clone, Debug, PartialEq)]
pub struct CheckpointEvent {
    /// The step it holds.
    pub step: u64,
    /// The checkpoint file (`out/checkpoint-<step>.gguf`).
    pub path: PathBuf,
    /// Periodic, final or on the stop flag.
    pub reason: SaveReason,
}

/// The training part of a run, as the loop measured it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainSummary {
    /// Optimizer steps taken by this call (not counting those before a resume).
    pub steps_run: u64,
    /// Tokens fed to the trainer by this call (skipped steps included).
    pub tokens: u64,
    /// Seconds spent in the steps (the held-out baseline included, the final eval not).
    pub secs: f64,
    /// Loss of the last step that was not skipped; `None` when no step ran.
    pub last_loss: Option<f32>,
    /// Held-out loss before the first step (fresh runs with an eval split only).
    pub eval_before: Option<f32>,
    /// Held-out loss after the last step (with an eval split; `None` when interrupted).
    pub eval_after: Option<f32>,
    /// Ranks of the data-parallel group (1: one process); `tokens` counts all of theirs.
    pub ranks: usize,
    /// Seconds this rank's steps waited for the gradient all-reduce after their backward
    /// passes (0 for one process).
    pub reduce_secs: f64,
    /// Seconds this rank spent in the all-reduce's sums, overlapped with the backward pass or
    /// not (0 for one process).
    pub reduce_comm_secs: f64,
}

/// What [`fit`](super::fit) did.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopOutcome {
    /// Optimizer steps taken in total (those before a resume included).
    pub steps: u64,
    /// The training part: steps run, tokens, time, last loss, held-out loss before and after.
    pub summary: TrainSummary,
    /// The stop flag ended the run early; a checkpoint of `steps` was written and nothing was
    /// exported.
    pub interrupted: bool,
    /// The checkpoint the run resumed from.
    pub resumed_from: Option<PathBuf>,
    /// The last checkpoint this call wrote.
    pub checkpoint: Option<PathBuf>,
    /// The JSONL metrics log.
    pub metrics: PathBuf,
    /// The other files written, in order: the exported adapter / model / merged model, the
    /// loss-curve PNG and the trace (each when written).
    pub files: Vec<PathBuf>,
}

/// Receives the loop's events: drives a progress bar, prints, records, or stops the run by
/// setting the stop flag. Every method does nothing by default; `()` is the observer that
/// ignores everything.
///
/// Order: `on_message` (resume notices), `on_start`, `on_eval(Before)`, then per step
/// `on_eval(Periodic)`, `on_step`, `on_message` (a skipped step), `on_checkpoint`; at the end
/// `on_eval(Final)`, `on_checkpoint`, `on_train_end`, `on_message` per file written, `on_end`.
/// An interrupted run goes from its last step to `on_checkpoint(Interrupted)` and `on_end`.
/// When `fit` returns an error, `on_end` is not called.
pub trait LoopObserver {
    /// The run is set up (resumed when asked), before the baseline eval and the first step.
    fn on_start(&mut self, _start: &LoopStart) {}

    /// An optimizer step was attempted. `m.skipped`: the loss or the gradient was not finite
    /// and nothing was updated (`m.step` is then the step it tried to take). `m` is the entry
    /// just appended to the metrics log; `m.eval_loss` is set on periodic eval steps.
    fn on_step(&mut self, _m: &StepMetrics) {}

    /// A held-out evaluation finished.
    fn on_eval(&mut self, _eval: &EvalEvent) {}

    /// A human-readable notice the command line prints as a line of its own: resume notes and
    /// warnings, skipped steps, files written, a loss curve that could not be drawn.
    fn on_message(&mut self, _msg: &str) {}

    /// A checkpoint was written.
    fn on_checkpoint(&mut self, _ckpt: &CheckpointEvent) {}

    /// The last step is done, and the final eval and checkpoint; exports follow. Not called
    /// for an interrupted run.
    fn on_train_end(&mut self, _summary: &TrainSummary) {}

    /// The loop is about to return `Ok(outcome)`.
    fn on_end(&mut self, _outcome: &LoopOutcome) {}
}

/// Ignores every event.
impl LoopObserver for () {}

/// Formats the notice for a file written.
pub(crate) fn wrote(path: &Path) -> String {
    format!("wrote {}", path.display())
}
