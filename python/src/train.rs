//! Training from Python: `Trainer` (step by step: steps, evaluation, learning rate,
//! checkpoints, exports) and `finetune` (the library's training loop on text files, with a
//! progress callback; Ctrl-C saves a checkpoint and raises KeyboardInterrupt).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use tinynn::format::GgmlType;
use tinynn::train::data::next_token_labels;
use tinynn::train::data::{BatchConfig, Batcher, EvalSplit, PackedText};
use tinynn::train::metrics::StepMetrics;
use tinynn::train::schedule::Schedule;
use tinynn::train::train_loop::{restore_matching, save_trainer, Output, RunState};
use tinynn::train::Optimizer;
use tinynn::{fit, LoopConfig, LoopObserver, LoraConfig, Targets, TrainConfig};

use crate::err;
use crate::model::Model;

/// A trainer over a model: full fine-tuning or LoRA (QLoRA on quantized files).
#[pyclass(module = "tinynn")]
pub struct Trainer {
    inner: Mutex<Inner>,
}

struct Inner {
    trainer: tinynn::Trainer,
    schedule: Schedule,
    config_json: String,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[allow(clippy::too_many_arguments)]
fn train_config(
    model: &tinynn::Model,
    lora: bool,
    rank: usize,
    alpha: f32,
    dropout: f32,
    targets: Option<&str>,
    seq: usize,
    batch: usize,
    accum: usize,
    optimizer: &str,
    weight_decay: f32,
    clip: Option<f32>,
    threads: usize,
    seed: u64,
) -> PyResult<TrainConfig> {
    let optimizer = match optimizer {
        "adamw" => Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
        },
        "sgd" => Optimizer::Sgd {
            momentum: 0.9,
            weight_decay,
        },
        o => {
            return Err(PyValueError::new_err(format!(
                "optimizer '{o}' is not 'adamw' or 'sgd'"
            )))
        }
    };
    let default_targets = if model.config().ssm.is_some() {
        "in,out"
    } else {
        "q,v"
    };
    let lora = if lora {
        Some(LoraConfig {
            rank,
            alpha,
            dropout,
            targets: Targets::parse(targets.unwrap_or(default_targets)).map_err(err)?,
            seed,
        })
    } else {
        None
    };
    Ok(TrainConfig {
        seq,
        batch,
        accum,
        optimizer,
        clip,
        threads,
        lora,
        ..TrainConfig::default()
    })
}

#[pymethods]
impl Trainer {
    /// A trainer over `model` (a `tinynn.Model`). `lora`: train an adapter of `rank` /
    /// `alpha` on `targets` (default "q,v"; Mamba "in,out"), else every weight. Each step
    /// takes `accum · batch · seq` token ids. `schedule`: "constant", "cosine" or "linear"
    /// (after `warmup` steps, down to `min_lr` at `total_steps`). `f32_backward`: QLoRA's
    /// gradient products through the quantized base in f32 instead of int8 (the default,
    /// faster: `tnn finetune --f32-backward`).
    #[new]
    #[pyo3(signature = (model, lora=true, rank=8, alpha=16.0, dropout=0.0, targets=None, seq=256, batch=4, accum=1, lr=1e-4, optimizer="adamw", weight_decay=0.01, clip=None, threads=2, seed=0, schedule="constant", warmup=0, total_steps=0, min_lr=0.0, f32_backward=false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: PyRef<'_, Model>,
        lora: bool,
        rank: usize,
        alpha: f32,
        dropout: f32,
        targets: Option<String>,
        seq: usize,
        batch: usize,
        accum: usize,
        lr: f32,
        optimizer: &str,
        weight_decay: f32,
        clip: Option<f32>,
        threads: usize,
        seed: u64,
        schedule: &str,
        warmup: u64,
        total_steps: u64,
        min_lr: f32,
        f32_backward: bool,
    ) -> PyResult<Trainer> {
        let schedule = match schedule {
            "constant" => Schedule::Constant { lr },
            "cosine" => Schedule::WarmupCosine {
                lr,
                min_lr,
                warmup_steps: warmup,
                total_steps,
            },
            "linear" => Schedule::WarmupLinear {
                lr,
                min_lr,
                warmup_steps: warmup,
                total_steps,
            },
            s => {
                return Err(PyValueError::new_err(format!(
                    "schedule '{s}' is not 'constant', 'cosine' or 'linear'"
                )))
            }
        };
        schedule
            .validate()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let m = model.model.clone();
        let mut cfg = train_config(
            &m,
            lora,
            rank,
            alpha,
            dropout,
            targets.as_deref(),
            seq,
            batch,
            accum,
            optimizer,
            weight_decay,
            clip,
            threads,
            seed,
        )?;
        cfg.int8_backward = !f32_backward;
        let config_json = serde_json::json!({
            "python": true, "lora": lora, "rank": rank, "alpha": alpha, "targets": targets,
            "seq": seq, "batch": batch, "accum": accum, "optimizer": optimizer, "seed": seed,
        })
        .to_string();
        let trainer = py
            .allow_threads(|| tinynn::Trainer::new(m.source(), cfg))
            .map_err(err)?;
        Ok(Trainer {
            inner: Mutex::new(Inner {
                trainer,
                schedule,
                config_json,
            }),
        })
    }

    /// One optimizer step on `ids` (`accum · batch · seq` token ids, sequence after
    /// sequence); `labels` (same length, negative: unscored) default to each token's next
    /// one. Returns the loss.
    #[pyo3(signature = (ids, labels=None))]
    fn step(&self, py: Python<'_>, ids: Vec<i32>, labels: Option<Vec<i32>>) -> PyResult<f32> {
        py.allow_threads(|| {
            let mut st = lock(&self.inner);
            let cfg = *st.trainer.train_config();
            let want = st.trainer.micro_batch_tokens() * cfg.accum;
            if ids.len() != want {
                return Err(format!(
                    "a step takes accum · batch · seq = {want} ids, not {}",
                    ids.len()
                ));
            }
            let labels = labels.unwrap_or_else(|| next_token_labels(&ids, cfg.seq));
            let lr = st.schedule.lr(st.trainer.steps_taken());
            st.trainer
                .step(&ids, &labels, lr)
                .map(|r| r.loss)
                .map_err(|e| e.to_string())
        })
        .map_err(err)
    }

    /// The mean cross-entropy of one micro-batch (`batch · seq` ids) without training.
    #[pyo3(signature = (ids, labels=None))]
    fn eval_loss(&self, py: Python<'_>, ids: Vec<i32>, labels: Option<Vec<i32>>) -> PyResult<f32> {
        py.allow_threads(|| {
            let mut st = lock(&self.inner);
            let seq = st.trainer.train_config().seq;
            let want = st.trainer.micro_batch_tokens();
            if ids.len() != want {
                return Err(format!(
                    "an evaluation takes batch · seq = {want} ids, not {}",
                    ids.len()
                ));
            }
            let labels = labels.unwrap_or_else(|| next_token_labels(&ids, seq));
            st.trainer
                .eval_loss(&ids, &labels)
                .map_err(|e| e.to_string())
        })
        .map_err(err)
    }

    /// The learning rate of the next step (its schedule's); setting it makes the rate
    /// constant from then on.
    #[getter]
    fn get_lr(&self) -> f32 {
        let st = lock(&self.inner);
        st.schedule.lr(st.trainer.steps_taken())
    }

    #[setter]
    fn set_lr(&self, lr: f32) -> PyResult<()> {
        if !lr.is_finite() || lr < 0.0 {
            return Err(PyValueError::new_err(format!("learning rate {lr}")));
        }
        lock(&self.inner).schedule = Schedule::Constant { lr };
        Ok(())
    }

    /// Optimizer steps taken.
    #[getter]
    fn steps(&self) -> u64 {
        lock(&self.inner).trainer.steps_taken()
    }

    /// Writes a checkpoint to `directory` (checkpoint-<step>.gguf); returns its path.
    fn save(&self, py: Python<'_>, directory: PathBuf) -> PyResult<String> {
        py.allow_threads(|| {
            let st = lock(&self.inner);
            let run = RunState {
                schedule: Some(st.schedule),
                data: None,
                config_json: st.config_json.clone(),
            };
            save_trainer(&st.trainer, &directory, &run, 0).map(|p| p.display().to_string())
        })
        .map_err(err)
    }

    /// Restores the latest checkpoint of `directory` (same settings): the next steps are
    /// those of an uninterrupted run, bit for bit.
    fn resume(&self, py: Python<'_>, directory: PathBuf) -> PyResult<()> {
        py.allow_threads(|| {
            let mut guard = lock(&self.inner);
            let st = &mut *guard;
            let ck = restore_matching(&mut st.trainer, &directory, &st.config_json)?;
            if let Some(schedule) = ck.meta.schedule {
                st.schedule = schedule;
            }
            Ok::<(), tinynn::TrainError>(())
        })
        .map_err(err)
    }

    /// Writes what was trained to `path`: the adapter (llama.cpp's LoRA format) for a LoRA
    /// trainer, else the model as GGUF (F16 matrices with `f16`, else F32).
    #[pyo3(signature = (path, f16=false))]
    fn export(&self, py: Python<'_>, path: PathBuf, f16: bool) -> PyResult<()> {
        py.allow_threads(|| {
            let st = lock(&self.inner);
            if st.trainer.lora().is_some() {
                st.trainer.export_adapter(&path).map(|_| ())
            } else {
                let ty = if f16 { GgmlType::F16 } else { GgmlType::F32 };
                st.trainer.export_gguf(&path, ty).map(|_| ())
            }
        })
        .map_err(err)
    }
}

/// Calls the Python progress callback with each step's metrics; Ctrl-C stops the loop.
struct Progress<'a> {
    callback: Option<Py<PyAny>>,
    stop: &'a AtomicBool,
    error: Option<PyErr>,
}

impl LoopObserver for Progress<'_> {
    fn on_step(&mut self, m: &StepMetrics) {
        Python::with_gil(|py| {
            if let Err(e) = py.check_signals() {
                self.error.get_or_insert(e);
                self.stop.store(true, Ordering::Relaxed);
                return;
            }
            let Some(cb) = &self.callback else { return };
            let d = PyDict::new(py);
            let filled = (|| -> PyResult<()> {
                d.set_item("step", m.step)?;
                d.set_item("loss", m.loss)?;
                d.set_item("lr", m.lr)?;
                d.set_item("tokens_per_s", m.tokens_per_s)?;
                cb.call1(py, (d,))?;
                Ok(())
            })();
            if let Err(e) = filled {
                self.error.get_or_insert(e);
                self.stop.store(true, Ordering::Relaxed);
            }
        });
    }
}

/// Fine-tunes `model` on text files (`data`: a path or a list of paths, packed into
/// sequences of `seq` tokens) for `steps` optimizer steps, writing checkpoints, metrics and the
/// result (`adapter.gguf` with `lora`, else `model.gguf`) into `out`. `progress(metrics)` is
/// called after each step with a dict (step, loss, lr, tokens_per_s). Returns a dict: steps,
/// last_loss, eval_loss, out. Ctrl-C saves a checkpoint and raises KeyboardInterrupt.
/// `f32_backward` as for `Trainer`.
#[pyfunction]
#[pyo3(signature = (model, data, out, lora=true, steps=100, seq=256, batch=4, lr=1e-4, rank=8, alpha=16.0, dropout=0.05, targets=None, threads=2, seed=0, eval_fraction=0.1, progress=None, f32_backward=false))]
#[allow(clippy::too_many_arguments)]
pub fn finetune<'py>(
    py: Python<'py>,
    model: PyRef<'_, Model>,
    data: Bound<'py, PyAny>,
    out: PathBuf,
    lora: bool,
    steps: u64,
    seq: usize,
    batch: usize,
    lr: f32,
    rank: usize,
    alpha: f32,
    dropout: f32,
    targets: Option<String>,
    threads: usize,
    seed: u64,
    eval_fraction: f64,
    progress: Option<Py<PyAny>>,
    f32_backward: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let files: Vec<PathBuf> = match data.extract::<PathBuf>() {
        Ok(p) => vec![p],
        Err(_) => data.extract::<Vec<PathBuf>>()?,
    };
    if files.is_empty() {
        return Err(PyValueError::new_err("no data files"));
    }
    if !(0.0..1.0).contains(&eval_fraction) {
        return Err(PyValueError::new_err(format!(
            "eval_fraction {eval_fraction} is not in [0, 1)"
        )));
    }
    let m = model.model.clone();
    let mut cfg = train_config(
        &m,
        lora,
        rank,
        alpha,
        dropout,
        targets.as_deref(),
        seq,
        batch,
        1,
        "adamw",
        0.01,
        None,
        threads,
        seed,
    )?;
    cfg.int8_backward = !f32_backward;
    let stop = AtomicBool::new(false);
    let mut observer = Progress {
        callback: progress,
        stop: &stop,
        error: None,
    };
    let result = py.allow_threads(|| -> Result<_, String> {
        let tokenizer = m.tokenizer().map_err(|e| e.to_string())?;
        let eos = tokenizer
            .eos()
            .ok_or("the tokenizer has no end-of-text token")?;
        let text = PackedText::from_files(&files, tokenizer, eos, seq).map_err(|e| e.to_string())?;
        let eval = if eval_fraction > 0.0 {
            EvalSplit::Last {
                fraction: eval_fraction,
            }
        } else {
            EvalSplit::None
        };
        let mut batcher = Batcher::new(
            Box::new(text),
            BatchConfig {
                batch,
                shuffle: true,
                seed,
                eval,
            },
        )
        .map_err(|e| e.to_string())?;
        let mut trainer = tinynn::Trainer::new(m.source(), cfg).map_err(|e| e.to_string())?;
        let mut lc = LoopConfig::new(Path::new(&out), steps);
        lc.lr = lr;
        lc.output = if lora {
            Output::Adapter { merge: false }
        } else {
            Output::Model
        };
        lc.run_identity = serde_json::json!({"model": m.path().display().to_string(), "seq": seq, "batch": batch, "lora": lora});
        fit(&mut trainer, &mut batcher, &lc, &stop, &mut observer).map_err(|e| e.to_string())
    });
    if let Some(e) = observer.error.take() {
        return Err(e);
    }
    let outcome = result.map_err(err)?;
    let s = &outcome.summary;
    let d = PyDict::new(py);
    d.set_item("steps", s.steps_run)?;
    d.set_item("last_loss", s.last_loss)?;
    d.set_item("eval_loss", s.eval_after)?;
    d.set_item("out", out.display().to_string())?;
    Ok(d)
}
