//! Training: a trainer over a model (full fine-tuning, or LoRA / QLoRA on the frozen base),
//! optimizer steps on batches of ids, the learning rate, checkpoints (save and resume bit for
//! bit), and exports (the model as GGUF, or the adapter in llama.cpp's LoRA format). A trainer
//! handle serves one call at a time.

use std::ffi::c_char;
use std::path::Path;
use std::sync::Mutex;

use tinynn::format::GgmlType;
use tinynn::train::data::next_token_labels;
use tinynn::train::schedule::Schedule;
use tinynn::train::train_loop::{restore_matching, save_trainer, RunState};
use tinynn::{LoraConfig, Targets, TrainConfig, Trainer};

use crate::args::{put, slice_arg, str_arg};
use crate::handles::{free, get, register};
use crate::model::{model_of, write_c_string, TnnModel};
use crate::status::{guard, Failure, Outcome, TnnStatus};

/// A trainer. One call at a time.
pub struct TnnTrainer {
    _private: [u8; 0],
}

/// How to train (`tnn_train_default_params`: LoRA rank 8, AdamW, lr 1e-4).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TnnTrainParams {
    /// Tokens per sequence.
    pub seq: u32,
    /// Sequences per micro-batch.
    pub batch: u32,
    /// Micro-batches per optimizer step (gradient accumulation).
    pub accum: u32,
    /// Threads.
    pub n_threads: u32,
    /// true: a LoRA adapter on the frozen base (which keeps its file type: QLoRA on quantized
    /// files); false: every weight (f32 master copies).
    pub lora: bool,
    /// LoRA rank.
    pub lora_rank: u32,
    /// LoRA alpha (the branch is scaled by alpha / rank).
    pub lora_alpha: f32,
    /// Dropout on the adapter's input (0 ≤ p < 1).
    pub lora_dropout: f32,
    /// Projections to adapt, comma-separated (`q,k,v,o,gate,up,down,qkv`, Mamba's
    /// `in,x,dt,out`, or `all`); null: `q,v` (Mamba: `in,out`).
    pub lora_targets: *const c_char,
    /// 0: AdamW, 1: SGD with momentum.
    pub optimizer: u32,
    /// AdamW's β1, β2 and ε.
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// SGD's momentum.
    pub momentum: f32,
    /// Decoupled weight decay.
    pub weight_decay: f32,
    /// Clip the gradient to this global L2 norm (0: no clipping).
    pub clip: f32,
    /// The (peak) learning rate.
    pub lr: f32,
    /// The learning-rate schedule: 0 constant, 1 linear warmup then cosine decay to `min_lr`
    /// at `total_steps`, 2 linear warmup then linear decay (`tnn_trainer_set_lr` replaces it
    /// by a constant rate).
    pub schedule: u32,
    /// Warmup steps (schedules 1 and 2).
    pub warmup_steps: u64,
    /// The step the decay ends at (schedules 1 and 2).
    pub total_steps: u64,
    /// The rate the decay ends at.
    pub min_lr: f32,
    /// Seeds the adapter's initial values and the dropout masks.
    pub seed: u64,
}

/// LoRA (rank 8, alpha 16, dropout 0, default targets), AdamW (0.9, 0.999, 1e-8, weight decay
/// 0.01), lr 1e-4, seq 256 × batch 4, one micro-batch a step, 1 thread, no clipping.
#[no_mangle]
pub extern "C" fn tnn_train_default_params() -> TnnTrainParams {
    TnnTrainParams {
        seq: 256,
        batch: 4,
        accum: 1,
        n_threads: 1,
        lora: true,
        lora_rank: 8,
        lora_alpha: 16.0,
        lora_dropout: 0.0,
        lora_targets: std::ptr::null(),
        optimizer: 0,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        momentum: 0.9,
        weight_decay: 0.01,
        clip: 0.0,
        lr: 1e-4,
        schedule: 0,
        warmup_steps: 0,
        total_steps: 0,
        min_lr: 0.0,
        seed: 0,
    }
}

/// The schedule of `p`, checked.
fn schedule_of(p: &TnnTrainParams) -> Outcome<Schedule> {
    let s = match p.schedule {
        0 => Schedule::Constant { lr: p.lr },
        1 => Schedule::WarmupCosine {
            lr: p.lr,
            min_lr: p.min_lr,
            warmup_steps: p.warmup_steps,
            total_steps: p.total_steps,
        },
        2 => Schedule::WarmupLinear {
            lr: p.lr,
            min_lr: p.min_lr,
            warmup_steps: p.warmup_steps,
            total_steps: p.total_steps,
        },
        k => {
            return Err(Failure::invalid(format!(
                "schedule {k} is not 0 (constant), 1 (cosine) or 2 (linear)"
            )))
        }
    };
    s.validate().map_err(|e| Failure::invalid(e.to_string()))?;
    Ok(s)
}

struct TrainerState {
    trainer: Trainer,
    schedule: Schedule,
    /// The settings a resume must match (their JSON).
    config_json: String,
}

type TrainerObject = Mutex<TrainerState>;

fn with_trainer<T>(
    handle: *const TnnTrainer,
    f: impl FnOnce(&mut TrainerState) -> Outcome<T>,
) -> Outcome<T> {
    let t = get::<TrainerObject, TnnTrainer>(handle, "trainer")?;
    let mut guard = t.lock().unwrap_or_else(|p| p.into_inner());
    f(&mut guard)
}

fn train_config(p: &TnnTrainParams, targets: &str) -> Outcome<TrainConfig> {
    use tinynn::train::Optimizer;
    if p.seq == 0 || p.batch == 0 || p.accum == 0 || p.n_threads == 0 {
        return Err(Failure::invalid(format!(
            "seq, batch, accum and n_threads must be at least 1: {p:?}"
        )));
    }
    if !p.lr.is_finite() || p.lr < 0.0 || !p.clip.is_finite() || p.clip < 0.0 {
        return Err(Failure::invalid(format!(
            "lr and clip must be finite and not negative: {p:?}"
        )));
    }
    let optimizer = match p.optimizer {
        0 => Optimizer::AdamW {
            beta1: p.beta1,
            beta2: p.beta2,
            eps: p.eps,
            weight_decay: p.weight_decay,
        },
        1 => Optimizer::Sgd {
            momentum: p.momentum,
            weight_decay: p.weight_decay,
        },
        o => {
            return Err(Failure::invalid(format!(
                "optimizer {o} is not 0 (AdamW) or 1 (SGD)"
            )))
        }
    };
    let lora = if p.lora {
        Some(LoraConfig {
            rank: p.lora_rank as usize,
            alpha: p.lora_alpha,
            dropout: p.lora_dropout,
            targets: Targets::parse(targets)?,
            seed: p.seed,
        })
    } else {
        None
    };
    Ok(TrainConfig {
        seq: p.seq as usize,
        batch: p.batch as usize,
        accum: p.accum as usize,
        optimizer,
        clip: (p.clip > 0.0).then_some(p.clip),
        threads: p.n_threads as usize,
        lora,
        ..TrainConfig::default()
    })
}

/// Makes a trainer over `model` as `params` says (null: the defaults) into `*out`.
///
/// # Safety
/// `params` is null or readable (its `lora_targets` null or NUL-terminated); `out` writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_new(
    model: *const TnnModel,
    params: *const TnnTrainParams,
    out: *mut *mut TnnTrainer,
) -> TnnStatus {
    guard(|| {
        let m = model_of(model)?;
        let p = if params.is_null() {
            tnn_train_default_params()
        } else {
            // SAFETY: a non-null `params` is readable (the API's contract).
            unsafe { params.read() }
        };
        if out.is_null() {
            return Err(Failure::null("out"));
        }
        let targets = if p.lora_targets.is_null() {
            match m.model.config().ssm {
                Some(_) => "in,out",
                None => "q,v",
            }
        } else {
            str_arg(p.lora_targets, "lora_targets")?
        };
        let cfg = train_config(&p, targets)?;
        let schedule = schedule_of(&p)?;
        let trainer = Trainer::new(m.model.source(), cfg)?;
        let config_json = format!(
            "{{\"c_api\":true,\"lora\":{},\"rank\":{},\"alpha\":{},\"targets\":\"{}\",\"seq\":{},\"batch\":{},\"accum\":{},\"optimizer\":{},\"seed\":{}}}",
            p.lora,
            p.lora_rank,
            p.lora_alpha,
            targets.replace(['"', '\\'], ""),
            p.seq,
            p.batch,
            p.accum,
            p.optimizer,
            p.seed
        );
        let state: TrainerObject = Mutex::new(TrainerState {
            trainer,
            schedule,
            config_json,
        });
        put(out, register(state), "out")
    })
}

/// Frees a trainer handle (null: nothing).
///
/// # Safety
/// `trainer` is null or a handle from `tnn_trainer_new`.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_free(trainer: *mut TnnTrainer) -> TnnStatus {
    guard(|| free::<TrainerObject, TnnTrainer>(trainer, "trainer"))
}

/// One optimizer step on `n` = accum · batch · seq token ids (sequence after sequence) at the
/// trainer's learning rate. `labels` (`n` values, a negative one unscored) may be null: each
/// token then predicts the next of its sequence. `*loss` gets the step's mean cross-entropy.
/// A step whose loss or gradient is not finite is skipped (`*skipped` true when not null):
/// weights and optimizer state stay as they were.
///
/// # Safety
/// `ids` holds `n` values, `labels` null or `n` values; `loss` and `skipped` writable or null.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_step(
    trainer: *mut TnnTrainer,
    ids: *const i32,
    labels: *const i32,
    n: usize,
    loss: *mut f32,
    skipped: *mut bool,
) -> TnnStatus {
    guard(|| {
        let ids = slice_arg(ids, n, "ids")?;
        with_trainer(trainer, |st| {
            let want = st.trainer.micro_batch_tokens() * st.trainer.train_config().accum;
            if ids.len() != want {
                return Err(Failure::invalid(format!(
                    "a step takes accum · batch · seq = {want} ids, not {}",
                    ids.len()
                )));
            }
            let labels = if labels.is_null() {
                next_token_labels(ids, st.trainer.train_config().seq)
            } else {
                slice_arg(labels, n, "labels")?.to_vec()
            };
            let lr = st.schedule.lr(st.trainer.steps_taken());
            let r = st.trainer.step(ids, &labels, lr)?;
            if !loss.is_null() {
                put(loss, r.loss, "loss")?;
            }
            if !skipped.is_null() {
                put(skipped, r.skipped, "skipped")?;
            }
            Ok(())
        })
    })
}

/// The mean cross-entropy of one micro-batch (batch · seq ids; `labels` as in
/// `tnn_trainer_step`) without training.
///
/// # Safety
/// As `tnn_trainer_step`.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_eval_loss(
    trainer: *mut TnnTrainer,
    ids: *const i32,
    labels: *const i32,
    n: usize,
    loss: *mut f32,
) -> TnnStatus {
    guard(|| {
        let ids = slice_arg(ids, n, "ids")?;
        with_trainer(trainer, |st| {
            let want = st.trainer.micro_batch_tokens();
            if ids.len() != want {
                return Err(Failure::invalid(format!(
                    "an evaluation takes batch · seq = {want} ids, not {}",
                    ids.len()
                )));
            }
            let labels = if labels.is_null() {
                next_token_labels(ids, st.trainer.train_config().seq)
            } else {
                slice_arg(labels, n, "labels")?.to_vec()
            };
            let l = st.trainer.eval_loss(ids, &labels)?;
            put(loss, l, "loss")
        })
    })
}

/// The learning rate the next step uses (its schedule's at the current step).
///
/// # Safety
/// `lr` is writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_get_lr(trainer: *mut TnnTrainer, lr: *mut f32) -> TnnStatus {
    guard(|| {
        with_trainer(trainer, |st| {
            let value = st.schedule.lr(st.trainer.steps_taken());
            put(lr, value, "lr")
        })
    })
}

/// Sets a constant learning rate for the next steps (replacing the schedule).
#[no_mangle]
pub extern "C" fn tnn_trainer_set_lr(trainer: *mut TnnTrainer, lr: f32) -> TnnStatus {
    guard(|| {
        if !lr.is_finite() || lr < 0.0 {
            return Err(Failure::invalid(format!("learning rate {lr}")));
        }
        with_trainer(trainer, |st| {
            st.schedule = Schedule::Constant { lr };
            Ok(())
        })
    })
}

/// Optimizer steps taken (a resumed trainer counts the checkpoint's).
///
/// # Safety
/// `steps` is writable.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_steps(trainer: *mut TnnTrainer, steps: *mut u64) -> TnnStatus {
    guard(|| with_trainer(trainer, |st| put(steps, st.trainer.steps_taken(), "steps")))
}

/// Writes a checkpoint (the trained weights or adapter, optimizer moments, step, dropout RNG,
/// the learning-rate schedule) as `dir/checkpoint-<step>.gguf` (the directory is made if needed; older
/// checkpoints are kept); its path goes into `path` (room for `cap` bytes; may be null with
/// `cap` 0).
///
/// # Safety
/// `dir` is NUL-terminated; `path` has room for `cap` bytes or is null.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_save(
    trainer: *mut TnnTrainer,
    dir: *const c_char,
    path: *mut c_char,
    cap: usize,
) -> TnnStatus {
    guard(|| {
        let dir = str_arg(dir, "dir")?;
        with_trainer(trainer, |st| {
            let run = RunState {
                schedule: Some(st.schedule),
                data: None,
                config_json: st.config_json.clone(),
            };
            let written = save_trainer(&st.trainer, Path::new(dir), &run, 0)?;
            if cap > 0 || !path.is_null() {
                write_c_string(
                    &written.display().to_string(),
                    path,
                    cap,
                    std::ptr::null_mut(),
                )?;
            }
            Ok(())
        })
    })
}

/// Restores the trainer from the latest checkpoint in `dir` (made by `tnn_trainer_save` with
/// the same settings): weights or adapter, optimizer moments, step, dropout RNG and learning-rate
/// schedule, so the next steps are those an uninterrupted run takes, bit for bit.
///
/// # Safety
/// `dir` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_resume(
    trainer: *mut TnnTrainer,
    dir: *const c_char,
) -> TnnStatus {
    guard(|| {
        let dir = str_arg(dir, "dir")?;
        with_trainer(trainer, |st| {
            let ck = restore_matching(&mut st.trainer, Path::new(dir), &st.config_json)?;
            if let Some(schedule) = ck.meta.schedule {
                st.schedule = schedule;
            }
            Ok(())
        })
    })
}

/// Writes what was trained to `path` (atomically): a LoRA trainer writes the adapter in
/// llama.cpp's GGUF LoRA format (`tnn_lora_open` and `tnn run --lora` read it); a full one
/// writes the model as GGUF with `f16` false: F32 or true: F16 matrices.
///
/// # Safety
/// `path` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tnn_trainer_export(
    trainer: *mut TnnTrainer,
    path: *const c_char,
    f16: bool,
) -> TnnStatus {
    guard(|| {
        let path = str_arg(path, "path")?;
        with_trainer(trainer, |st| {
            if st.trainer.lora().is_some() {
                st.trainer.export_adapter(Path::new(path))?;
            } else {
                let ty = if f16 { GgmlType::F16 } else { GgmlType::F32 };
                st.trainer.export_gguf(Path::new(path), ty)?;
            }
            Ok(())
        })
    })
}
