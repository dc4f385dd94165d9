//! The loop's side effects on the output directory: checkpoints (save and resume), the held-out
//! evaluation, the exports and the loss curve.

use std::path::{Path, PathBuf};

use tinynn_core::backend::Backend;
use tinynn_format::GgmlType;

use crate::checkpoint::{self, Checkpoint, CheckpointMeta, SaveOptions, TensorRef};
use crate::collective::Collective;
use crate::data::{Batcher, IGNORE};
use crate::error::{Result, TrainError};
use crate::metrics;
use crate::params::NamedTensor;
use crate::rng::Rng;
use crate::schedule::Schedule;
use crate::trainer::{OptimizerState, Trainer};

use super::config::Output;
use super::observer::{wrote, LoopObserver};

/// What every checkpoint of the run shares.
pub(super) struct Saver<'a> {
    pub dir: &'a Path,
    pub config_json: &'a str,
    pub schedule: Schedule,
    pub keep: usize,
}

impl Saver<'_> {
    /// Writes a checkpoint of the trainer and the batcher's position; returns its path.
    pub fn save<B: Backend>(&self, trainer: &Trainer<B>, batcher: &Batcher) -> Result<PathBuf> {
        let extra = RunState {
            schedule: Some(self.schedule),
            data: Some(batcher.position()),
            config_json: self.config_json.to_string(),
        };
        save_trainer(trainer, self.dir, &extra, self.keep)
    }
}

/// What a checkpoint holds besides the trainer's own state (weights, optimizer moments, step,
/// dropout RNG): the run's schedule, data position and configuration (free-form JSON).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunState {
    /// The learning-rate schedule.
    pub schedule: Option<Schedule>,
    /// Where the data reader is.
    pub data: Option<crate::data::DataPosition>,
    /// The run's settings as JSON (`{}` when empty); a resume compares it.
    pub config_json: String,
}

/// Writes a checkpoint of `trainer` (its parameters — every weight, or the adapter —, the
/// optimizer moments, the step and the dropout RNG) and `run` as `dir/checkpoint-<step>.gguf`,
/// keeping the newest `keep` (0: all); returns its path.
pub fn save_trainer<B: Backend>(
    trainer: &Trainer<B>,
    dir: &Path,
    run: &RunState,
    keep: usize,
) -> Result<PathBuf> {
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
    let config_json = if run.config_json.is_empty() {
        "{}".to_string()
    } else {
        run.config_json.clone()
    };
    let ckpt = Checkpoint {
        meta: CheckpointMeta {
            step: trainer.steps_taken(),
            architecture: Some(trainer.architecture()),
            schedule: run.schedule,
            data: run.data,
            rngs: vec![("dropout".into(), trainer.dropout_rng().state())],
            config_json,
        },
        params: refs,
        groups,
    };
    let opts = SaveOptions {
        keep_last: keep,
        ..SaveOptions::default()
    };
    Ok(checkpoint::save(dir, &ckpt, &opts)?)
}

/// Restores `trainer` (parameters, optimizer moments, step, dropout RNG) from the latest
/// checkpoint in `dir`, which must hold every parameter of the trainer; returns the
/// checkpoint (its path, metadata and the note of a fallback to an older one).
pub fn restore_trainer<B: Backend>(
    trainer: &mut Trainer<B>,
    dir: &Path,
) -> Result<checkpoint::LoadedCheckpoint> {
    let ck = checkpoint::load_latest(dir)?;
    restore_from(trainer, &ck)?;
    Ok(ck)
}

/// [`restore_trainer`] from a checkpoint that must have been made with `config_json` (the
/// run's settings); another checkpoint is [`TrainError::ResumeMismatch`].
pub fn restore_matching<B: Backend>(
    trainer: &mut Trainer<B>,
    dir: &Path,
    config_json: &str,
) -> Result<checkpoint::LoadedCheckpoint> {
    let ck = checkpoint::load_latest(dir)?;
    check_identity(&ck, config_json)?;
    restore_from(trainer, &ck)?;
    Ok(ck)
}

fn check_identity(ck: &checkpoint::LoadedCheckpoint, config_json: &str) -> Result<()> {
    if ck.meta.config_json != config_json {
        return Err(TrainError::ResumeMismatch {
            path: ck.path.clone(),
            checkpoint: ck.meta.config_json.clone(),
            run: config_json.to_string(),
        });
    }
    Ok(())
}

/// [`restore_trainer`] from a loaded checkpoint.
fn restore_from<B: Backend>(
    trainer: &mut Trainer<B>,
    ck: &checkpoint::LoadedCheckpoint,
) -> Result<()> {
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
    // Every parameter of the run must come from the checkpoint: one it lacks would silently
    // keep its initial values.
    let saved: std::collections::HashSet<&str> = params.iter().map(|p| p.name.as_str()).collect();
    let specs = trainer.param_specs();
    if let Some(missing) = specs.iter().find(|s| !saved.contains(s.name.as_str())) {
        return Err(TrainError::Invalid(format!(
            "{}: the checkpoint lacks parameter '{}' (it holds {} of the run's {})",
            ck.path.display(),
            missing.name,
            saved.len(),
            specs.len()
        )));
    }
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
    if let Some(state) = ck.rng("dropout") {
        trainer.set_dropout_rng(Rng::from_state(state));
    }
    Ok(())
}

/// Restores the trainer and batcher from the latest checkpoint in `dir`; returns its path.
pub(super) fn resume<B: Backend>(
    trainer: &mut Trainer<B>,
    batcher: &mut Batcher,
    dir: &Path,
    config_json: &str,
    schedule: &Schedule,
    observer: &mut dyn LoopObserver,
) -> Result<PathBuf> {
    let ck = checkpoint::load_latest(dir)?;
    check_identity(&ck, config_json)?;
    let Some(pos) = ck.meta.data else {
        return Err(TrainError::Invalid(format!(
            "{}: the checkpoint has no data position",
            ck.path.display()
        )));
    };
    restore_from(trainer, &ck)?;
    if let Some(why) = &ck.fallback {
        observer.on_message(&format!("warning: {why}"));
    }
    if ck.meta.schedule.as_ref() != Some(schedule) {
        observer.on_message("note: the learning-rate schedule differs from the checkpoint's");
    }
    batcher.set_position(pos)?;
    observer.on_message(&format!(
        "resumed from {} (step {})",
        ck.path.display(),
        ck.meta.step
    ));
    Ok(ck.path)
}

/// Mean loss over the held-out split (weighted by scored tokens), over at most `max` batches
/// (0: all); `None` without one. A data-parallel rank scores its rows of each batch and the
/// group sums the weighted losses.
pub(super) fn evaluate<B: Backend>(
    trainer: &mut Trainer<B>,
    batcher: &Batcher,
    max: usize,
    comm: &mut dyn Collective,
) -> Result<Option<f32>> {
    if batcher.n_eval() == 0 {
        return Ok(None);
    }
    let (rank, ranks) = (comm.rank(), comm.size());
    let mb = trainer.micro_batch_tokens();
    let mut acc = [0f64; 2];
    for (i, b) in batcher.eval_batches().enumerate() {
        if max > 0 && i >= max {
            break;
        }
        let b = b?;
        let (ids, labels) = match ranks {
            1 => (&b.inputs[..], &b.labels[..]),
            _ => {
                let mine = rank * mb..(rank + 1) * mb;
                (&b.inputs[mine.clone()], &b.labels[mine])
            }
        };
        let tokens = labels.iter().filter(|&&l| l != IGNORE).count();
        if tokens == 0 {
            continue;
        }
        let loss = trainer.eval_loss(ids, labels)?;
        acc[0] += f64::from(loss) * tokens as f64;
        acc[1] += tokens as f64;
    }
    if ranks > 1 {
        comm.all_reduce_sum_f64(&mut acc)?;
    }
    Ok((acc[1] > 0.0).then(|| (acc[0] / acc[1]) as f32))
}

/// Writes the final files; returns their paths.
pub(super) fn export<B: Backend>(
    trainer: &Trainer<B>,
    dir: &Path,
    output: Output,
    ty: GgmlType,
    observer: &mut dyn LoopObserver,
) -> Result<Vec<PathBuf>> {
    let model = |name: &str, observer: &mut dyn LoopObserver| -> Result<PathBuf> {
        let p = dir.join(name);
        trainer
            .export_gguf(&p, ty)
            .map_err(|e| TrainError::Export {
                path: p.clone(),
                cause: Box::new(e),
            })?;
        observer.on_message(&wrote(&p));
        Ok(p)
    };
    let mut files = Vec::new();
    match output {
        Output::Adapter { merge } => {
            let p = dir.join("adapter.gguf");
            trainer.export_adapter(&p)?;
            observer.on_message(&wrote(&p));
            files.push(p);
            if merge {
                files.push(model("merged.gguf", observer)?);
            }
        }
        Output::Model => files.push(model("model.gguf", observer)?),
    }
    Ok(files)
}

/// Draws the loss curve of `metrics_path` into `dir/loss.png`; a failure is a warning to the
/// observer, not an error.
pub(super) fn write_plot(
    dir: &Path,
    metrics_path: &Path,
    observer: &mut dyn LoopObserver,
) -> Option<PathBuf> {
    let png = dir.join("loss.png");
    let done = metrics::read(metrics_path)
        .map_err(|e| e.to_string())
        .and_then(|m| crate::plot::loss_curve_png(&png, &m, 900, 500).map_err(|e| e.to_string()));
    match done {
        Ok(()) => Some(png),
        Err(e) => {
            observer.on_message(&format!("warning: no loss curve: {e}"));
            None
        }
    }
}
