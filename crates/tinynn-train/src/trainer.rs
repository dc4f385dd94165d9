//! `Trainer`: a Llama-family model's f32 master weights, optimizer state and compiled plans on
//! one backend (the CPU's `Executor` unless given another); `step` runs k micro-batches of
//! forward + backward, then one clipped optimizer update — or skips it when the loss or
//! gradient is not finite. Nothing is allocated per step (the plans, memories and arena are
//! made up front). Every read, write, run and move of a tensor goes through [`Backend`].

use std::sync::Arc;

use tinynn_core::backend::Backend;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{ExecOptions, Executor};
use tinynn_format::gguf::Value;
use tinynn_format::model_config::ModelConfig;
use tinynn_models::llama::Hparams;

use crate::collective::Solo;
use crate::error::{backend_err, Result, TrainError};
use crate::grad_reduce::GradReducer;
use crate::int8_backward::wants_int8_backward;
use crate::lora::LoraConfig;
use crate::model::{BatchShape, LoraGraph};
use crate::optim::Optimizer;
use crate::params::{NamedTensor, ParamSpec};
use crate::passes::{
    eval_pass, grad_pass, run_lent, update_pass, write_labels, EvalPass, GradPass, UpdatePass,
};
use crate::rng::Rng;
use crate::source::{resolve, TrainSource};
use crate::tensor_io::{as_f32, read_f32, scalar, write_f32, write_i32};

mod step;

/// How to train.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    /// Tokens per sequence.
    pub seq: usize,
    /// Sequences per micro-batch.
    pub batch: usize,
    /// Micro-batches per optimizer step (gradient accumulation); each step takes
    /// `accum · batch · seq` tokens.
    pub accum: usize,
    pub optimizer: Optimizer,
    /// Clip the gradient to this global L2 norm (PyTorch's `clip_grad_norm_`); `None`: no clipping.
    pub clip: Option<f32>,
    pub threads: usize,
    /// Reference mode (one thread, f64 sums): see `tinynn_cpu::ExecOptions::strict`.
    pub strict: bool,
    /// Keep the last grad pass's timings (`Trainer::last_trace`).
    pub trace: bool,
    /// Train a LoRA adapter on the frozen base instead of the whole model.
    pub lora: Option<LoraConfig>,
    /// Mixed precision: the F32 matrix products (forward and gradients) round their operands
    /// to bf16 and accumulate in f32 (`tinynn_cpu::ExecOptions::bf16_matmul`; needs AVX-512
    /// BF16, f32 otherwise). Off by default.
    pub bf16_matmul: bool,
    /// QLoRA: the gradient products through a quantized frozen base (`Wᵀ·dy`) run on the
    /// backend's integer kernels (`Backend::pack_backward`; the CPU backend: `Wᵀ`
    /// requantized to Q8_0, `dy` quantized to 8 bits per 32 values as activations are), not
    /// on dequantized f32 weights — all but the output head's, whose `dy` is the loss's
    /// gradient (`int8_backward.rs` says why). On by default; off gives the f32 products.
    pub int8_backward: bool,
    /// Data-parallel steps: up to this many bytes of gradients are summed across the ranks
    /// during the last micro-batch's backward pass, each as soon as it is final, from a
    /// staging copy of that size (default [`crate::OVERLAP_BYTES`], 1 GiB; 0:
    /// none, every sum after the pass). The sums are the same either way; only when the time
    /// is spent changes.
    pub overlap_bytes: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            seq: 256,
            batch: 4,
            accum: 1,
            optimizer: Optimizer::default(),
            clip: None,
            threads: 1,
            strict: false,
            trace: false,
            lora: None,
            bf16_matmul: false,
            int8_backward: true,
            overlap_bytes: crate::OVERLAP_BYTES,
        }
    }
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepReport {
    /// Mean of the micro-batches' mean cross-entropies.
    pub loss: f32,
    /// Global L2 norm of the (accumulated) gradient, before clipping.
    pub grad_norm: f32,
    /// True when the loss or the gradient was not finite: weights and optimizer state are
    /// untouched, the gradient is dropped and the step count does not advance.
    pub skipped: bool,
    /// Optimizer steps taken so far (after this one).
    pub step: u64,
}

/// The optimizer's state for checkpoints: updates taken and every state tensor
/// (`adam_m.<param>`, `adam_v.<param>` or `sgd_vel.<param>`).
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerState {
    pub step: u64,
    pub tensors: Vec<NamedTensor>,
}

/// A parameter where it lives: name, dims, values (`Trainer::param_views`).
pub type ParamView<'a> = (&'a str, &'a [usize], &'a [f32]);

/// Bytes the trainer holds, by what they are for (`Trainer::memory`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrainMemory {
    /// The grad pass's arena: saved activations, the logits and every gradient in flight.
    pub grad_arena: usize,
    /// The update pass's arena (the clipped gradient of one tensor at a time).
    pub update_arena: usize,
    /// The eval pass's arena (forward only).
    pub eval_arena: usize,
    /// Trainable parameters (F32).
    pub params: usize,
    /// Gradient accumulation buffers (F32, one per parameter).
    pub grads: usize,
    /// Optimizer moments.
    pub optimizer: usize,
    /// The frozen base (LoRA): the file's bytes, of the tensors that keep them.
    pub frozen: usize,
    /// Interleaved copies of frozen tensors for the packed kernels.
    pub packed: usize,
}

impl TrainMemory {
    pub fn total(&self) -> usize {
        self.grad_arena
            + self.update_arena
            + self.eval_arena
            + self.params
            + self.grads
            + self.optimizer
            + self.frozen
            + self.packed
    }
}

/// A frozen base tensor (LoRA): name, file type, dims.
#[derive(Clone, Debug, PartialEq)]
pub struct FrozenSpec {
    pub name: String,
    pub dtype: tinynn_format::GgmlType,
    pub dims: Vec<usize>,
}

/// A model in training on backend `B` (the CPU by default): see the module docs.
pub struct Trainer<B: Backend = Executor> {
    cfg: TrainConfig,
    config: ModelConfig,
    hparams: Hparams,
    specs: Vec<ParamSpec>,
    pub(crate) frozen: Vec<FrozenSpec>,
    /// Draws the LoRA dropout masks.
    dropout_rng: Rng,
    /// Tests: the next steps to report as non-finite.
    poison: u32,
    backend: B,
    grad: GradPass<B>,
    update: UpdatePass<B>,
    eval: EvalPass<B>,
    /// Scalars read back from runs (loss, Σg²), reused: a step allocates nothing.
    scalar: Vec<f32>,
    /// Data-parallel steps: the staging buffers of the all-reduce, the host values it sums
    /// (loss, votes) and the seconds it took.
    reducer: GradReducer,
    votes: Vec<f32>,
    reduce_secs: f64,
    step: u64,
    pub(crate) gguf_metadata: Option<Vec<(String, Value)>>,
    pub(crate) rope_tensors: Vec<NamedTensor>,
    trace: Option<String>,
}

impl Trainer {
    /// Loads or initializes the model and compiles the plans for `cfg`, on the CPU.
    pub fn new<'a>(source: impl Into<TrainSource<'a>>, cfg: TrainConfig) -> Result<Trainer> {
        let cpu = Executor::cpu(ExecOptions {
            threads: cfg.threads,
            strict: cfg.strict,
            trace: cfg.trace,
            repack: false,
            // Training keeps its thread count: results stay bit-exact across resumes.
            adaptive_threads: false,
            bf16_matmul: cfg.bf16_matmul,
        });
        Trainer::with_backend(source, cfg, cpu)
    }
}

impl<B: Backend> Trainer<B> {
    /// Loads or initializes the model and compiles the plans for `cfg` on `backend`. The
    /// backend is used as it is: `cfg`'s `threads`, `trace` and `bf16_matmul` are settings of
    /// the CPU backend [`Trainer::new`] makes, and `cfg.strict` only keeps frozen tensors
    /// from being packed (a strict backend reads their bytes).
    pub fn with_backend<'a>(
        source: impl Into<TrainSource<'a>>,
        cfg: TrainConfig,
        backend: B,
    ) -> Result<Trainer<B>> {
        if cfg.seq == 0 || cfg.batch == 0 || cfg.accum == 0 || cfg.threads == 0 {
            return Err(TrainError::Invalid(format!(
                "seq, batch, accum and threads must be at least 1: {cfg:?}"
            )));
        }
        if cfg.clip.is_some_and(|c| c.is_nan() || c <= 0.0) {
            return Err(TrainError::Invalid(format!(
                "the clipping norm must be positive, got {:?}",
                cfg.clip
            )));
        }
        cfg.optimizer.check()?;
        if let Some(l) = &cfg.lora {
            l.check()?;
        }
        let mut loaded = resolve(source.into(), cfg.lora.as_ref())?;
        // LongRoPE: sequences past the original context rotate with the long divisors, as
        // transformers rotates such a sequence.
        loaded.hparams.for_context(cfg.seq);
        let shape = BatchShape {
            batch: cfg.batch,
            seq: cfg.seq,
        };
        let lora = cfg.lora.map(|l| LoraGraph {
            scale: l.scale(),
            dropout: l.dropout,
        });
        let (b, fz) = (&backend, &loaded.frozen);
        let (arch, hp, specs) = (loaded.arch, &loaded.hparams, &loaded.specs);
        let grad = grad_pass(b, arch, hp, specs, fz, lora, shape, cfg.accum)?;
        let update = update_pass(b, specs, &cfg.optimizer)?;
        let mut eval = eval_pass(b, arch, hp, specs, fz, lora, shape)?;
        let mut grad = grad;
        // A frozen base (QLoRA) keeps its file type; where the backend has packed kernels its
        // products read one packed copy, shared by both passes (never in strict mode). An F32
        // base stays unpacked: training's F32 products are the f32 GEMM (and its bf16 option).
        for (i, f) in fz.iter().enumerate() {
            let (gt, et) = (grad.frozen[i], eval.frozen[i]);
            let bytes = f.bytes.as_bytes();
            let packed =
                if cfg.strict || f.dims.len() > 2 || f.dtype == tinynn_format::GgmlType::F32 {
                    None
                } else {
                    let ne = [f.dims[0], f.dims.get(1).copied().unwrap_or(1), 1, 1];
                    backend.pack(f.dtype, ne, bytes).map(|mut p| {
                        let graph = grad.plan.graph();
                        if cfg.int8_backward && wants_int8_backward(graph, gt) {
                            backend.pack_backward(&mut p);
                        }
                        p
                    })
                };
            let Some(p) = packed else {
                let written = backend.write(&mut grad.mem, &grad.plan, gt, 0, bytes);
                written.map_err(backend_err)?;
                continue;
            };
            let p = Arc::new(p);
            let (gm, em) = (&mut grad.mem, &mut eval.mem);
            backend
                .bind_packed(gm, &grad.plan, gt, p.clone())
                .map_err(backend_err)?;
            backend
                .bind_packed(em, &eval.plan, et, p)
                .map_err(backend_err)?;
            // Products are all that read most base tensors: the packed copy stands in for the
            // file's bytes, which are never written (one copy of the base in memory, not two).
            if backend.can_release_source(gm, &grad.plan, gt)
                && backend.can_release_source(em, &eval.plan, et)
            {
                backend
                    .release_source(gm, &grad.plan, gt)
                    .map_err(backend_err)?;
                backend
                    .release_source(em, &eval.plan, et)
                    .map_err(backend_err)?;
            } else {
                backend
                    .write(gm, &grad.plan, gt, 0, bytes)
                    .map_err(backend_err)?;
            }
        }
        // The grad pass holds the frozen bytes now.
        let frozen = std::mem::take(&mut loaded.frozen)
            .into_iter()
            .map(|f| FrozenSpec {
                name: f.name,
                dtype: f.dtype,
                dims: f.dims,
            })
            .collect();
        let mut t = Trainer {
            cfg,
            config: loaded.config,
            hparams: loaded.hparams,
            specs: loaded.specs,
            frozen,
            dropout_rng: Rng::new(cfg.lora.map_or(0, |l| l.seed ^ 0x6C6F_7261_6472_6F70)),
            poison: 0,
            backend,
            grad,
            update,
            eval,
            scalar: Vec::with_capacity(1),
            reducer: GradReducer::default(),
            votes: Vec::with_capacity(8),
            reduce_secs: 0.0,
            step: 0,
            gguf_metadata: loaded.gguf_metadata,
            rope_tensors: loaded.rope_tensors,
            trace: None,
        };
        t.load_params(&loaded.values)?;
        if let Some(src) = loaded.deferred {
            t.load_params_from(&src)?;
        }
        Ok(t)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn hparams(&self) -> &Hparams {
        &self.hparams
    }

    pub fn train_config(&self) -> &TrainConfig {
        &self.cfg
    }

    /// The trainable parameters (GGUF names, ggml dims).
    pub fn param_specs(&self) -> &[ParamSpec] {
        &self.specs
    }

    /// Tokens one micro-batch takes (`batch · seq`).
    pub fn micro_batch_tokens(&self) -> usize {
        self.cfg.batch * self.cfg.seq
    }

    /// Optimizer steps taken (skipped ones not counted).
    pub fn steps_taken(&self) -> u64 {
        self.step
    }

    /// Checks a batch of `n_micro` micro-batches of ids and labels.
    fn check_batch(&self, ids: &[i32], labels: &[i32], n_micro: usize) -> Result<()> {
        let want = n_micro * self.micro_batch_tokens();
        if ids.len() != want || labels.len() != want {
            return Err(TrainError::Batch(format!(
                "expected {want} ids and labels ({n_micro} × batch {} × seq {}), got {} and {}",
                self.cfg.batch,
                self.cfg.seq,
                ids.len(),
                labels.len()
            )));
        }
        let v = self.hparams.n_vocab as i32;
        if let Some(bad) = ids.iter().find(|&&i| !(0..v).contains(&i)) {
            return Err(TrainError::Batch(format!(
                "token id {bad} is outside the vocabulary of {v}"
            )));
        }
        if let Some(bad) = labels.iter().find(|&&l| l >= v) {
            return Err(TrainError::Batch(format!(
                "label {bad} is outside the vocabulary of {v}"
            )));
        }
        Ok(())
    }

    /// One optimizer step over `accum` micro-batches (`ids`/`labels`: `accum · batch · seq`
    /// values, sequence after sequence; a negative label is not scored) at learning rate `lr`.
    pub fn step(&mut self, ids: &[i32], labels: &[i32], lr: f32) -> Result<StepReport> {
        self.step_data_parallel(ids, labels, None, lr, &mut [], &mut Solo)
    }

    fn apply_update(&mut self, lr: f32, clip: f32) -> Result<()> {
        let hp = self.cfg.optimizer.hyperparams(lr, self.step + 1, clip);
        let (g, u) = (&mut self.grad, &mut self.update);
        let hp = &hp[..self.cfg.optimizer.n_hyperparams()];
        write_f32(&self.backend, (&mut u.mem, &u.plan), u.hp, hp)?;
        run_lent(
            &mut self.backend,
            (&mut g.mem, &g.plan),
            (&mut u.mem, &u.plan),
            &[(&g.params, &u.params), (&g.buffers, &u.buffers)],
        )?;
        self.step += 1;
        Ok(())
    }

    /// Writes a fresh dropout seed into the grad pass (the `Op::Dropout` masks are drawn from
    /// it on the fly), without allocating.
    fn draw_dropout(&mut self, rank: u64) -> Result<()> {
        let g = &mut self.grad;
        let Some(seed) = g.fwd.dropout_seed else {
            return Ok(());
        };
        // Rank 0 draws what one process draws; the others a seed of their own, the RNG's
        // state staying the same on every rank.
        let s = self.dropout_rng.next_u64() ^ rank.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let seed_values = [s as u32 as i32, (s >> 32) as u32 as i32];
        write_i32(&self.backend, (&mut g.mem, &g.plan), seed, &seed_values)
    }

    /// The LoRA dropout RNG's state (for checkpoints).
    pub fn dropout_rng(&self) -> Rng {
        self.dropout_rng.clone()
    }

    /// Restores the LoRA dropout RNG (resuming).
    pub fn set_dropout_rng(&mut self, rng: Rng) {
        self.dropout_rng = rng;
    }

    /// The LoRA setup, when training an adapter.
    pub fn lora(&self) -> Option<&LoraConfig> {
        self.cfg.lora.as_ref()
    }

    /// The frozen base tensors (LoRA; empty otherwise).
    pub fn frozen_specs(&self) -> &[FrozenSpec] {
        &self.frozen
    }

    /// The bytes of frozen base tensor `name` as the trainer holds them (its file type).
    pub fn frozen_bytes(&self, name: &str) -> Result<std::borrow::Cow<'_, [u8]>> {
        let i = self
            .frozen
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| TrainError::Param {
                name: name.into(),
                message: "not a frozen base tensor".into(),
            })?;
        let (b, g, t) = (&self.backend, &self.grad, self.grad.frozen[i]);
        let need = g.plan.graph().layout(t).contiguous_bytes();
        if b.persistent_len(&g.mem, &g.plan, t) == need {
            let bytes = b.persistent(&g.mem, &g.plan, t).map_err(backend_err)?;
            return Ok(std::borrow::Cow::Borrowed(bytes));
        }
        // It keeps only its packed copy (`Backend::release_source`): unpack the bytes.
        let mut out = Vec::with_capacity(need);
        b.unpacked_persistent(&g.mem, &g.plan, t, &mut out)
            .map_err(backend_err)?;
        Ok(std::borrow::Cow::Owned(out))
    }

    /// `general.architecture` of the model: the source file's, or the config's name.
    pub fn architecture(&self) -> String {
        self.gguf_metadata
            .as_ref()
            .and_then(|m| {
                m.iter()
                    .find(|(k, _)| k == "general.architecture")
                    .and_then(|(_, v)| v.as_str().map(str::to_string))
            })
            .unwrap_or_else(|| self.config.architecture.name().to_string())
    }

    /// The GGUF metadata [`Trainer::export_gguf`] writes (architecture, hyperparameters,
    /// tokenizer), for a model that was not loaded from a GGUF file (e.g. random init).
    pub fn set_export_metadata(&mut self, metadata: Vec<(String, Value)>) {
        self.gguf_metadata = Some(metadata);
    }

    /// Tests only: the next `n` steps report a non-finite loss (and so skip their update).
    #[doc(hidden)]
    pub fn poison_next_steps(&mut self, n: u32) {
        self.poison = n;
    }

    fn zero_grads(&mut self) -> Result<()> {
        let g = &mut self.grad;
        // The other buffers are overwritten by every run.
        for &b in &g.accumulated {
            self.backend
                .zero(&mut g.mem, &g.plan, b)
                .map_err(backend_err)?;
        }
        Ok(())
    }

    /// The mean cross-entropy of one micro-batch (`batch · seq` ids and labels) under the current
    /// weights; changes nothing.
    pub fn eval_loss(&mut self, ids: &[i32], labels: &[i32]) -> Result<f32> {
        self.check_batch(ids, labels, 1)?;
        let (b, g, e) = (&mut self.backend, &mut self.grad, &mut self.eval);
        write_i32(b, (&mut e.mem, &e.plan), e.fwd.tokens, ids)?;
        let n_vocab = self.hparams.n_vocab;
        write_labels(b, (&mut e.mem, &e.plan), &e.fwd, labels, n_vocab, None)?;
        run_lent(
            b,
            (&mut g.mem, &g.plan),
            (&mut e.mem, &e.plan),
            &[(&g.params, &e.params), (&g.frozen, &e.frozen)],
        )?;
        scalar(b, (&e.mem, &e.plan), e.fwd.loss, &mut self.scalar)
    }

    /// Runs forward + backward on one micro-batch and returns every parameter's gradient
    /// (of the mean loss; divided by `accum`), without updating anything. For tests and tools.
    pub fn gradients(&mut self, ids: &[i32], labels: &[i32]) -> Result<(f32, Vec<NamedTensor>)> {
        self.check_batch(ids, labels, 1)?;
        self.zero_grads()?;
        let (b, g) = (&mut self.backend, &mut self.grad);
        write_i32(b, (&mut g.mem, &g.plan), g.fwd.tokens, ids)?;
        write_labels(
            b,
            (&mut g.mem, &g.plan),
            &g.fwd,
            labels,
            self.hparams.n_vocab,
            None,
        )?;
        let ran = b.run(&g.plan, &mut g.mem);
        let out = ran.map_err(backend_err).and_then(|()| {
            let (b, g) = (&self.backend, &self.grad);
            let loss = scalar(b, (&g.mem, &g.plan), g.fwd.loss, &mut self.scalar)?;
            let grads = self
                .specs
                .iter()
                .zip(&g.buffers)
                .map(|(s, &buf)| {
                    Ok(NamedTensor {
                        name: s.name.clone(),
                        dims: s.dims.clone(),
                        data: read_f32(&self.backend, &g.mem, &g.plan, buf)?,
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((loss, grads))
        });
        self.zero_grads()?;
        out
    }

    /// The current weights (f32 master copies), in `param_specs` order.
    pub fn params(&self) -> Result<Vec<NamedTensor>> {
        let g = &self.grad;
        self.specs
            .iter()
            .zip(&g.params)
            .map(|(s, &p)| {
                Ok(NamedTensor {
                    name: s.name.clone(),
                    dims: s.dims.clone(),
                    data: read_f32(&self.backend, &g.mem, &g.plan, p)?,
                })
            })
            .collect()
    }

    /// Replaces weights by name; every tensor given must be a parameter with its dims.
    pub fn load_params(&mut self, tensors: &[NamedTensor]) -> Result<()> {
        for t in tensors {
            let i = self.param_index(&t.name)?;
            check_dims(t, &self.specs[i].dims)?;
            let g = &mut self.grad;
            write_f32(&self.backend, (&mut g.mem, &g.plan), g.params[i], &t.data)?;
        }
        Ok(())
    }

    /// Every parameter's values from `src`, dequantized straight into its buffer.
    fn load_params_from(&mut self, src: &tinynn_models::weights::WeightSource<'_>) -> Result<()> {
        let g = &mut self.grad;
        for (s, &t) in self.specs.iter().zip(&g.params) {
            let mut loaded = Ok(false);
            let mut fill = |bytes: &mut [u8]| {
                loaded = match bytemuck::try_cast_slice_mut(bytes) {
                    Ok(out) => crate::params::dequantize_into(src, &s.name, &s.dims, out),
                    Err(e) => Err(TrainError::Param {
                        name: s.name.clone(),
                        message: format!("the backend's bytes are not f32 values: {e}"),
                    }),
                };
            };
            self.backend
                .fill_persistent(&mut g.mem, &g.plan, t, &mut fill)
                .map_err(backend_err)?;
            if !loaded? {
                return Err(TrainError::Param {
                    name: s.name.clone(),
                    message: "missing from the source".into(),
                });
            }
        }
        Ok(())
    }

    fn param_index(&self, name: &str) -> Result<usize> {
        self.specs
            .iter()
            .position(|s| s.name == name)
            .ok_or_else(|| TrainError::Param {
                name: name.into(),
                message: "not a parameter of this model".into(),
            })
    }

    /// The optimizer's step count and moments, for checkpoints.
    /// The parameters' values where they live, without a copy (checkpoints of large models):
    /// name, dims and values per parameter, in `param_specs` order.
    pub fn param_views(&self) -> Result<Vec<ParamView<'_>>> {
        let g = &self.grad;
        self.specs
            .iter()
            .zip(&g.params)
            .map(|(s, &p)| {
                let bytes = self.backend.persistent(&g.mem, &g.plan, p);
                let data = as_f32(bytes.map_err(backend_err)?, &g.plan, p)?;
                Ok((s.name.as_str(), s.dims.as_slice(), data))
            })
            .collect()
    }

    /// The optimizer's state tensors where they live, without a copy: per parameter (in
    /// `param_specs` order), one per `Optimizer::state_prefixes` prefix.
    pub fn optimizer_views(&self) -> Result<Vec<&[f32]>> {
        let u = &self.update;
        let mut out = Vec::new();
        for state in &u.state {
            for &t in state {
                let bytes = self.backend.persistent(&u.mem, &u.plan, t);
                out.push(as_f32(bytes.map_err(backend_err)?, &u.plan, t)?);
            }
        }
        Ok(out)
    }

    pub fn optimizer_state(&self) -> Result<OptimizerState> {
        let u = &self.update;
        let mut tensors = Vec::new();
        for (s, state) in self.specs.iter().zip(&u.state) {
            for (prefix, &t) in self.cfg.optimizer.state_prefixes().iter().zip(state) {
                tensors.push(NamedTensor {
                    name: format!("{prefix}.{}", s.name),
                    dims: s.dims.clone(),
                    data: read_f32(&self.backend, &u.mem, &u.plan, t)?,
                });
            }
        }
        Ok(OptimizerState {
            step: self.step,
            tensors,
        })
    }

    /// Restores what [`Trainer::optimizer_state`] returned (tensors by name; each must exist).
    pub fn load_optimizer_state(&mut self, state: &OptimizerState) -> Result<()> {
        for t in &state.tensors {
            let (prefix, param) = t.name.split_once('.').ok_or_else(|| TrainError::Param {
                name: t.name.clone(),
                message: "not an optimizer state tensor".into(),
            })?;
            let k = self
                .cfg
                .optimizer
                .state_prefixes()
                .iter()
                .position(|p| *p == prefix)
                .ok_or_else(|| TrainError::Param {
                    name: t.name.clone(),
                    message: "not a state tensor of this optimizer".into(),
                })?;
            let i = self.param_index(param)?;
            check_dims(t, &self.specs[i].dims)?;
            let u = &mut self.update;
            write_f32(&self.backend, (&mut u.mem, &u.plan), u.state[i][k], &t.data)?;
        }
        self.step = state.step;
        Ok(())
    }

    /// What the trainer's buffers take, in bytes (arenas at their full planned size).
    pub fn memory(&self) -> TrainMemory {
        let bytes = |plan: &Plan, t: TensorId| plan.graph().layout(t).contiguous_bytes();
        let g = &self.grad.plan;
        TrainMemory {
            grad_arena: g.arena_bytes(),
            update_arena: self.update.plan.arena_bytes(),
            eval_arena: self.eval.plan.arena_bytes(),
            params: self.grad.params.iter().map(|&t| bytes(g, t)).sum(),
            grads: self.grad.buffers.iter().map(|&t| bytes(g, t)).sum(),
            optimizer: self
                .update
                .state
                .iter()
                .flatten()
                .map(|&t| bytes(&self.update.plan, t))
                .sum(),
            // What is held: tensors that keep only their packed copy hold no bytes.
            frozen: self
                .grad
                .frozen
                .iter()
                .map(|&t| self.backend.persistent_len(&self.grad.mem, g, t))
                .sum(),
            packed: self.backend.packed_persistent_bytes(&self.grad.mem),
        }
    }

    /// The last grad pass's per-step timings as Chrome trace JSON (with `TrainConfig::trace`).
    pub fn last_trace(&self) -> Option<&str> {
        self.trace.as_deref()
    }
}

fn check_dims(t: &NamedTensor, dims: &[usize]) -> Result<()> {
    if t.dims != dims || t.data.len() != dims.iter().product::<usize>() {
        return Err(TrainError::Param {
            name: t.name.clone(),
            message: format!(
                "dims {:?} with {} values, the model has {dims:?}",
                t.dims,
                t.data.len()
            ),
        });
    }
    Ok(())
}
