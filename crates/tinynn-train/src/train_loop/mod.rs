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

use crate::collective::{agree, fnv1a, Collective, Solo, FNV_START};

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
    fit_data_parallel(trainer, batcher, cfg, stop, observer, &mut Solo)
}

/// [`fit`] as one rank of a data-parallel group (`comm`; every rank calls it with the same
/// settings, data and model). Each global micro-batch is `batcher`'s batch, which must be
/// `comm.size()` × the trainer's batch: every rank reads all of it (so the data position stays
/// the same on every rank) and trains on its own rows, rank `r` on rows `r·b..(r+1)·b`; the
/// gradients are summed across the ranks ([`Trainer::step_data_parallel`]) and every rank
/// takes the same step. Rank 0 alone writes the output directory (lock, metrics, checkpoints,
/// exports) and tells `observer`; a resume reads the checkpoint on every rank, which must see
/// the same directory. A stop request on any rank stops every rank after the step in flight.
/// The ranks check that they agree on the settings, on the state after a resume and on the
/// trained weights; an error on one rank must end the group (the caller's job: MPI's abort).
pub fn fit_data_parallel<B: Backend>(
    trainer: &mut Trainer<B>,
    batcher: &mut Batcher,
    cfg: &LoopConfig,
    stop: &AtomicBool,
    observer: &mut dyn LoopObserver,
    comm: &mut dyn Collective,
) -> Result<LoopOutcome> {
    let schedule = cfg.validate()?;
    if matches!(cfg.output, Output::Adapter { .. }) && trainer.lora().is_none() {
        return Err(TrainError::Invalid(
            "exporting an adapter needs a LoRA trainer".into(),
        ));
    }
    // Found out before training, not after it.
    let writes_model = matches!(cfg.output, Output::Model | Output::Adapter { merge: true });
    if writes_model && !trainer.can_export_gguf() {
        return Err(TrainError::Unsupported(
            "the run would end by writing a GGUF model (model.gguf, or merged.gguf), which \
             takes its metadata and tokenizer from a GGUF source, and this model was not loaded \
             from one: convert a Hugging Face directory to GGUF first (`tnn convert DIR \
             model.gguf f32`), or train a LoRA adapter without merging"
                .into(),
        ));
    }
    let (rank, ranks) = (comm.rank(), comm.size());
    let lead = rank == 0;
    let per_rank = trainer.train_config().batch;
    if batcher.batch_size() != per_rank * ranks {
        return Err(TrainError::Invalid(format!(
            "the data's batch is {} sequences; {ranks} ranks of batch {per_rank} need {}",
            batcher.batch_size(),
            per_rank * ranks
        )));
    }
    let mut quiet = ();
    let observer: &mut dyn LoopObserver = if lead { observer } else { &mut quiet };
    let dir = cfg.out.as_path();
    let config_json = cfg.run_identity.to_string();
    agree(
        comm,
        "the run's settings",
        fnv1a(FNV_START, config_json.as_bytes()),
    )?;
    if lead {
        std::fs::create_dir_all(dir).map_err(|cause| TrainError::Io {
            action: "creating",
            path: dir.to_path_buf(),
            cause,
        })?;
    }
    // Held until the run returns: two runs writing one directory would interleave
    // checkpoints and metrics.
    let _lock = match lead {
        true => Some(crate::dir_lock::DirLock::acquire(dir)?),
        false => None,
    };
    let metrics_path = dir.join("metrics.jsonl");
    let (mut log, resumed_from) = if cfg.resume {
        let from = resume(trainer, batcher, dir, &config_json, &schedule, observer)?;
        let log = match lead {
            true => Some(MetricsLog::resume(&metrics_path, trainer.steps_taken())?),
            false => None,
        };
        (log, Some(from))
    } else {
        let log = match lead {
            true => Some(MetricsLog::create(&metrics_path)?),
            false => None,
        };
        (log, None)
    };
    if ranks > 1 {
        let mut h = fnv1a(FNV_START, &trainer.steps_taken().to_le_bytes());
        let pos = batcher.position();
        for v in [pos.epoch, pos.index, pos.rng] {
            h = fnv1a(h, &v.to_le_bytes());
        }
        agree(comm, "the step and data position", h)?;
        agree(comm, "the starting weights", weights_fingerprint(trainer)?)?;
    }
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
    // A data-parallel rank reads each global micro-batch whole and keeps its rows; the loss
    // of each is normalized by the group's count of scored labels.
    let global = if ranks > 1 { mb * ranks } else { 0 };
    let (mut all_ids, mut all_labels) = (vec![0i32; global], vec![0i32; global]);
    let mut norms = vec![0f32; accum];
    let n_vocab = trainer.hparams().n_vocab;
    let mut votes = [0f32; 1];
    let mut stop_agreed = false;
    let t0 = Instant::now();
    let (mut tokens, mut attempts, mut bad) = (0u64, 0u64, 0u32);
    let mut last_saved = None;
    let mut last_checkpoint = None;
    let mut last_loss = None;
    let first_step = trainer.steps_taken();
    // A fresh run scores the held-out split once before training: the baseline to beat.
    let before = if first_step == 0 {
        evaluate(trainer, batcher, cfg.eval_batches, comm)?
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
        let stopping = match ranks {
            1 => stop.load(Ordering::SeqCst),
            _ => stop_agreed,
        };
        if stopping {
            let step = trainer.steps_taken();
            let path = match lead {
                true => Some(saver.save(trainer, batcher)?),
                false => None,
            };
            if let Some(path) = &path {
                observer.on_checkpoint(&CheckpointEvent {
                    step,
                    path: path.clone(),
                    reason: SaveReason::Interrupted,
                });
            }
            let secs = t0.elapsed().as_secs_f64();
            let files = match lead {
                true => write_plot(dir, &metrics_path, observer)
                    .into_iter()
                    .collect(),
                false => Vec::new(),
            };
            let outcome = LoopOutcome {
                steps: step,
                summary: TrainSummary {
                    steps_run: step - first_step,
                    tokens,
                    secs,
                    last_loss,
                    eval_before: before,
                    eval_after: None,
                    ranks,
                    reduce_secs: trainer.reduce_secs(),
                    reduce_comm_secs: trainer.reduce_comm_secs(),
                },
                interrupted: true,
                resumed_from,
                checkpoint: path,
                metrics: metrics_path,
                files,
            };
            observer.on_end(&outcome);
            return Ok(outcome);
        }
        for (k, norm) in norms.iter_mut().enumerate() {
            let r = k * mb..(k + 1) * mb;
            if ranks == 1 {
                batcher.next_into(&mut ids[r.clone()], &mut labels[r])?;
                continue;
            }
            batcher.next_into(&mut all_ids, &mut all_labels)?;
            *norm = crate::model::scored(&all_labels, n_vocab);
            let mine = rank * mb..(rank + 1) * mb;
            ids[r.clone()].copy_from_slice(&all_ids[mine.clone()]);
            labels[r].copy_from_slice(&all_labels[mine]);
        }
        let lr = schedule.lr(trainer.steps_taken());
        attempts += 1;
        if cfg.inject_nan.contains(&attempts) {
            trainer.poison_next_steps(1);
        }
        let rep = if ranks == 1 {
            trainer.step(&ids, &labels, lr)?
        } else {
            votes[0] = f32::from(u8::from(stop.load(Ordering::SeqCst)));
            let rep =
                trainer.step_data_parallel(&ids, &labels, Some(&norms), lr, &mut votes, comm)?;
            stop_agreed = votes[0] > 0.0;
            rep
        };
        tokens += (n * ranks) as u64;
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
            if let Some(log) = log.as_mut() {
                log.log(&m)?;
            }
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
            m.eval_loss = evaluate(trainer, batcher, cfg.eval_batches, comm)?;
            if let Some(loss) = m.eval_loss {
                observer.on_eval(&EvalEvent {
                    step,
                    loss,
                    kind: EvalKind::Periodic,
                });
            }
        }
        if let Some(log) = log.as_mut() {
            log.log(&m)?;
        }
        observer.on_step(&m);
        if cfg.save_every > 0 && step % cfg.save_every == 0 {
            if lead {
                let path = saver.save(trainer, batcher)?;
                observer.on_checkpoint(&CheckpointEvent {
                    step,
                    path: path.clone(),
                    reason: SaveReason::Periodic,
                });
                last_checkpoint = Some(path);
            }
            last_saved = Some(step);
        }
    }
    let steps = trainer.steps_taken();
    let secs = t0.elapsed().as_secs_f64();
    let eval = evaluate(trainer, batcher, cfg.eval_batches, comm)?;
    if let Some(e) = eval {
        observer.on_eval(&EvalEvent {
            step: steps,
            loss: e,
            kind: EvalKind::Final,
        });
        // The final eval goes into the log as its own entry of the last step.
        if let Some(log) = log.as_mut() {
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
    }
    if ranks > 1 {
        // Every rank took the same steps from the same start: a difference now would be a
        // reduction that handed the ranks different sums.
        agree(comm, "the trained weights", weights_fingerprint(trainer)?)?;
    }
    if last_saved != Some(steps) && lead {
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
        ranks,
        reduce_secs: trainer.reduce_secs(),
        reduce_comm_secs: trainer.reduce_comm_secs(),
    };
    observer.on_train_end(&summary);
    let mut files = Vec::new();
    if lead {
        files = export(trainer, dir, cfg.output, cfg.export_type, observer)?;
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

/// A fingerprint of the trainer's parameters (their bits, 8 bytes at a time).
fn weights_fingerprint<B: Backend>(trainer: &Trainer<B>) -> Result<u64> {
    let mut h = FNV_START;
    for (name, _, values) in trainer.param_views()? {
        h = fnv1a(h, name.as_bytes());
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let words = bytes.chunks_exact(8);
        h = fnv1a(h, words.remainder());
        for w in words {
            let mut word = [0u8; 8];
            word.copy_from_slice(w);
            h = (h ^ u64::from_le_bytes(word)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    Ok(h)
}
