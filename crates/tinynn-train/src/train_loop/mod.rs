//! The training loop as a library: [`fit`] trains a [`Trainer`] on a [`Batcher`]'s batches
//! to [`LoopConfig::steps`] optimizer steps, with the learning-rate schedule, held-out
//! evaluations, checkpoints (every `save_every` steps, at the end, and when the stop flag is
//! set), resume with its run-identity check, the JSONL metrics log, the non-finite-step stop,
//! the loss-curve PNG and the final export (adapter, merged model or model).
//!
//! `tnn finetune` and `tnn train` are this loop plus a progress bar and a Ctrl-C handler; a C
//! or Python front end gets the same by setting the stop flag from its own signal handling and
//! reading the [`LoopObserver`] events it wants.
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use tinynn_train::data::Batcher;
//! use tinynn_train::train_loop::{fit, LoopConfig, Output};
//! use tinynn_train::Trainer;
//!
//! # fn run(trainer: &mut Trainer, batcher: &mut Batcher) -> tinynn_train::Result<()> {
//! let mut cfg = LoopConfig::new("out", 100);
//! cfg.lr = 2e-4;
//! cfg.output = Output::Adapter { merge: false };
//! let stop = AtomicBool::new(false);
//! let outcome = fit(trainer, batcher, &cfg, &stop, &mut ())?;
//! println!("{} steps, last loss {:?}", outcome.steps, outcome.summary.last_loss);
//! # Ok(())
//! # }
//! ```

#![warn(missing_docs)]

mod config;
mod observer;
mod state;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

pub use config::{LoopConfig, Output, ScheduleKind};
pub use observer::{
    CheckpointEvent, EvalEvent, EvalKind, LoopObserver, LoopOutcome, LoopStart, SaveReason,
    TrainSummary,
};
pub use state::{restore_matching, restore_trainer, save_trainer, RunState};

use tinynn_core::backend::Backend;

use crate::checkpoint;
use crate::data::Batcher;
use crate::error::{Result, TrainError};
use crate::metrics::{MetricsLog, StepMetrics};
use crate::trainer::Trainer;

use observer::wrote;
use state::{evaluate, export, resume, write_plot, Saver};

/// Non-finite steps in a row that stop training ([`TrainError::NonFinite`]).
pub const MAX_BAD_STEPS: u32 = 3;

/// Trains `trainer` on `batcher` to `cfg.steps` optimizer steps (in total) and exports the
/// result into `cfg.out`, telling `observer` as it goes.
///
/// `stop` is read before every step: once it is set (by the caller's Ctrl-C handler, say), the
/// loop writes a checkpoint and returns an outcome with `interrupted`; a later call with
/// `cfg.resume` continues from it bit for bit. Three non-finite steps in a row end the run with
/// [`TrainError::NonFinite`], leaving the checkpoints as they were. The trainer's and batcher's
/// settings should be part of `cfg.run_identity` so that a resume with other ones is refused.
pub fn fit<B: Backend>(
    trainer: &mut Trainer<B>,
    batcher: &mut Batcher,
    cfg: &LoopConfig,
    stop: &AtomicBool,
    observer: &mut dyn LoopObserver,
) -> Result<LoopOutcome> {
    let schedule = cfg.validate()?;
    if matches!(cfg.output, Output::Adapter { .. }) && trainer.lora().is_none() {
        return Err(TrainError::Invalid(
            "exporting an adapter needs a LoRA trainer".into(),
        ));
    }
    let dir = cfg.out.as_path();
    std::fs::create_dir_all(dir).map_err(|cause| TrainError::Io {
        action: "creating",
        path: dir.to_path_buf(),
        cause,
    })?;
    // Held until the run returns: two runs writing one directory would interleave
    // checkpoints and metrics.
    let _lock = crate::dir_lock::DirLock::acquire(dir)?;
    let config_json = cfg.run_identity.to_string();
    let metrics_path = dir.join("metrics.jsonl");
    let (mut log, resumed_from) = if cfg.resume {
        let from = resume(trainer, batcher, dir, &config_json, &schedule, observer)?;
        let log = MetricsLog::resume(&metrics_path, trainer.steps_taken())?;
        (log, Some(from))
    } else {
        (MetricsLog::create(&metrics_path)?, None)
    };
    observer.on_start(&LoopStart {
        step: trainer.steps_taken(),
        steps: cfg.steps,
        resumed_from: resumed_from.clone(),
        memory: trainer.memory(),
        data: batcher.stats(),
        seq: batcher.seq(),
        n_train: batcher.n_train(),
        n_eval: batcher.n_eval(),
        trainable: trainer
            .param_specs()
            .iter()
            .map(|p| p.dims.iter().product::<usize>())
            .sum(),
    });
    let saver = Saver {
        dir,
        config_json: &config_json,
        schedule,
        keep: cfg.keep,
    };
    let accum = trainer.train_config().accum;
    let mb = trainer.micro_batch_tokens();
    let n = mb * accum;
    let (mut ids, mut labels) = (vec![0i32; n], vec![0i32; n]);
    let t0 = Instant::now();
    let (mut tokens, mut attempts, mut bad) = (0u64, 0u64, 0u32);
    let mut last_saved = None;
    let mut last_checkpoint = None;
    let mut last_loss = None;
    let first_step = trainer.steps_taken();
    // A fresh run scores the held-out split once before training: the baseline to beat.
    let before = if first_step == 0 {
        evaluate(trainer, batcher, cfg.eval_batches)?
    } else {
        None
    };
    if let Some(loss) = before {
        observer.on_eval(&EvalEvent {
            step: 0,
            loss,
            kind: EvalKind::Before,
        });
    }
    while trainer.steps_taken() < cfg.steps {
        if stop.load(Ordering::SeqCst) {
            let step = trainer.steps_taken();
            let path = saver.save(trainer, batcher)?;
            observer.on_checkpoint(&CheckpointEvent {
                step,
                path: path.clone(),
                reason: SaveReason::Interrupted,
            });
            let secs = t0.elapsed().as_secs_f64();
            let files = write_plot(dir, &metrics_path, observer)
                .into_iter()
                .collect();
            let outcome = LoopOutcome {
                steps: step,
                summary: TrainSummary {
                    steps_run: step - first_step,
                    tokens,
                    secs,
                    last_loss,
                    eval_before: before,
                    eval_after: None,
                },
                interrupted: true,
                resumed_from,
                checkpoint: Some(path),
                metrics: metrics_path,
                files,
            };
            observer.on_end(&outcome);
            return Ok(outcome);
        }
        for k in 0..accum {
            let r = k * mb..(k + 1) * mb;
            batcher.next_into(&mut ids[r.clone()], &mut labels[r])?;
        }
        let lr = schedule.lr(trainer.steps_taken());
        attempts += 1;
        if cfg.inject_nan.contains(&attempts) {
            trainer.poison_next_steps(1);
        }
        let rep = trainer.step(&ids, &labels, lr)?;
        tokens += n as u64;
        let elapsed = t0.elapsed().as_secs_f64();
        let mut m = StepMetrics {
            step: if rep.skipped { rep.step + 1 } else { rep.step },
            loss: rep.loss,
            lr,
            grad_norm: Some(rep.grad_norm),
            tokens_per_s: tokens as f64 / elapsed.max(1e-9),
            elapsed_s: elapsed,
            eval_loss: None,
            skipped: rep.skipped,
        };
        if rep.skipped {
            bad += 1;
            log.log(&m)?;
            observer.on_step(&m);
            observer.on_message(&format!(
                "step {}: non-finite loss or gradient (loss {}, grad norm {}); update skipped",
                m.step, rep.loss, rep.grad_norm
            ));
            if bad >= MAX_BAD_STEPS {
                return Err(TrainError::NonFinite {
                    steps: MAX_BAD_STEPS,
                    last_checkpoint: checkpoint::list(dir)?.last().map(|(step, _)| *step),
                });
            }
            continue;
        }
        bad = 0;
        last_loss = Some(rep.loss);
        let step = rep.step;
        if cfg.eval_every > 0 && step % cfg.eval_every == 0 && step < cfg.steps {
            m.eval_loss = evaluate(trainer, batcher, cfg.eval_batches)?;
            if let Some(loss) = m.eval_loss {
                observer.on_eval(&EvalEvent {
                    step,
                    loss,
                    kind: EvalKind::Periodic,
                });
            }
        }
        log.log(&m)?;
        observer.on_step(&m);
        if cfg.save_every > 0 && step % cfg.save_every == 0 {
            let path = saver.save(trainer, batcher)?;
            observer.on_checkpoint(&CheckpointEvent {
                step,
                path: path.clone(),
                reason: SaveReason::Periodic,
            });
            last_saved = Some(step);
            last_checkpoint = Some(path);
        }
    }
    let steps = trainer.steps_taken();
    let secs = t0.elapsed().as_secs_f64();
    let eval = evaluate(trainer, batcher, cfg.eval_batches)?;
    if let Some(e) = eval {
        observer.on_eval(&EvalEvent {
            step: steps,
            loss: e,
            kind: EvalKind::Final,
        });
        // The final eval goes into the log as its own entry of the last step.
        log.log(&StepMetrics {
            step: steps,
            loss: last_loss.unwrap_or(f32::NAN),
            lr: schedule.lr(steps.saturating_sub(1)),
            grad_norm: None,
            tokens_per_s: tokens as f64 / secs.max(1e-9),
            elapsed_s: secs,
            eval_loss: Some(e),
            skipped: false,
        })?;
    }
    if last_saved != Some(steps) {
        let path = saver.save(trainer, batcher)?;
        observer.on_checkpoint(&CheckpointEvent {
            step: steps,
            path: path.clone(),
            reason: SaveReason::Final,
        });
        last_checkpoint = Some(path);
    }
    let summary = TrainSummary {
        steps_run: steps - first_step,
        tokens,
        secs,
        last_loss,
        eval_before: before,
        eval_after: eval,
    };
    observer.on_train_end(&summary);
    let mut files = export(trainer, dir, cfg.output, cfg.export_type, observer)?;
    files.extend(write_plot(dir, &metrics_path, observer));
    if let (Some(path), Some(json)) = (&cfg.trace, trainer.last_trace()) {
        std::fs::write(path, json).map_err(|cause| TrainError::Io {
            action: "writing",
            path: path.clone(),
            cause,
        })?;
        observer.on_message(&wrote(path));
        files.push(path.clone());
    }
    let outcome = LoopOutcome {
        steps,
        summary,
        interrupted: false,
        resumed_from,
        checkpoint: last_checkpoint,
        metrics: metrics_path,
        files,
    };
    observer.on_end(&outcome);
    Ok(outcome)
}
