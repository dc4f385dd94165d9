//! The three compiled plans a trainer runs on one backend:
//!
//! - **grad**: forward + loss + backward; each parameter's gradient (scaled by 1/accum) is added
//!   into its persistent `grad.<name>` buffer, and the squared global norm of the buffers is an
//!   output. Run once per micro-batch.
//! - **update**: `grad · clip` (clip factor from the host), then the optimizer's in-place update.
//!   Run once per optimizer step, only when the loss and gradient norm are finite.
//! - **eval**: forward + loss only.
//!
//! Parameters and gradient buffers live in the grad pass's memory and are lent (moved, never
//! copied) to the other passes' memories for their runs (`Backend::swap`).

use tinynn_core::backend::Backend;
use tinynn_core::graph::Graph;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;
use tinynn_models::arch::{Arch, Hparams};

use crate::error::{backend_err, Result};
use crate::model::{
    build_forward, causal_mask, positions, scored, BatchShape, HeadBackward, LoraGraph, ParamTable,
    TrainForward,
};
use crate::optim::Optimizer;
use crate::params::ParamSpec;
use crate::source::Frozen;
use crate::tensor_io::{write_f32, write_i32};

const F32: GgmlType = GgmlType::F32;

pub(crate) struct GradPass<B: Backend> {
    pub plan: Plan,
    pub mem: B::Memory,
    pub fwd: TrainForward,
    pub params: Vec<TensorId>,
    /// The frozen base tensors (LoRA), owned here and lent to the eval pass.
    pub frozen: Vec<TensorId>,
    /// Persistent gradient buffers, one per parameter.
    pub buffers: Vec<TensorId>,
    /// The buffers runs add into (rather than overwrite): to zero between optimizer steps.
    pub accumulated: Vec<TensorId>,
    /// F32 `[1]`: Σ over every buffer of its squared elements (after this run's addition).
    pub grad_sq: TensorId,
}

pub(crate) struct UpdatePass<B: Backend> {
    pub plan: Plan,
    pub mem: B::Memory,
    pub params: Vec<TensorId>,
    pub buffers: Vec<TensorId>,
    /// Per parameter, its optimizer state tensors (`Optimizer::state_prefixes` order).
    pub state: Vec<Vec<TensorId>>,
    /// F32 `[Optimizer::n_hyperparams]`, the clipping factor last.
    pub hp: TensorId,
}

pub(crate) struct EvalPass<B: Backend> {
    pub plan: Plan,
    pub mem: B::Memory,
    pub fwd: TrainForward,
    pub params: Vec<TensorId>,
    pub frozen: Vec<TensorId>,
}

/// Leaves for the frozen base tensors (their file types) and the parameters (F32), and the
/// table of both by name.
fn leaves(
    g: &mut Graph,
    specs: &[ParamSpec],
    frozen: &[Frozen],
) -> Result<(Vec<TensorId>, Vec<TensorId>, Vec<String>)> {
    let frozen_ids = frozen
        .iter()
        .map(|f| Ok(g.persistent(&f.name, f.dtype, &f.dims)?))
        .collect::<Result<Vec<_>>>()?;
    let params = param_leaves(g, specs)?;
    let names = frozen
        .iter()
        .map(|f| f.name.clone())
        .chain(specs.iter().map(|s| s.name.clone()))
        .collect();
    Ok((frozen_ids, params, names))
}

fn param_leaves(g: &mut Graph, specs: &[ParamSpec]) -> Result<Vec<TensorId>> {
    specs
        .iter()
        .map(|s| Ok(g.persistent(&s.name, F32, &s.dims)?))
        .collect()
}

/// Writes the constant inputs of a forward pass (positions, mask, RoPE divisors).
fn write_constants<B: Backend>(
    backend: &B,
    (mem, plan): (&mut B::Memory, &Plan),
    fwd: &TrainForward,
    hp: &Hparams,
    shape: BatchShape,
) -> Result<()> {
    if hp.ssm.is_some() {
        // A state-space model reads no positions or masks (its graph plans none).
        return Ok(());
    }
    write_i32(backend, (mem, plan), fwd.pos, &positions(shape))?;
    let window = hp.swa.as_ref().map(|s| s.window);
    for (mask, window) in [(fwd.mask, None), (fwd.mask_swa, window)] {
        if let Some(t) = mask {
            write_f32(backend, (mem, plan), t, &causal_mask(shape.seq, window))?;
        }
    }
    if let (Some(t), Some(f)) = (fwd.freqs, &hp.freq_factors) {
        write_f32(backend, (mem, plan), t, f)?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn grad_pass<B: Backend>(
    backend: &B,
    arch: &Arch,
    hp: &Hparams,
    specs: &[ParamSpec],
    frozen: &[Frozen],
    lora: Option<LoraGraph>,
    shape: BatchShape,
    accum: usize,
) -> Result<GradPass<B>> {
    let mut g = Graph::new();
    let (frozen_ids, params, names) = leaves(&mut g, specs, frozen)?;
    let all: Vec<TensorId> = frozen_ids.iter().chain(&params).copied().collect();
    let table = ParamTable {
        names: &names,
        ids: &all,
    };
    // The mean over k micro-batches: each adds 1/k of its gradient. The head's part of the
    // backward is built with the forward, one chunk of tokens at a time.
    let head = HeadBackward {
        seed: 1.0 / accum as f32,
        params: &params,
    };
    let fwd = build_forward(&mut g, arch, hp, &table, shape, lora, Some(head))?;
    let hg = fwd
        .head_grads
        .ok_or_else(|| crate::TrainError::Invalid("the head has no gradient".into()))?;
    let mut seeds = vec![(hg.hidden, hg.d_hidden)];
    if let Some(d) = hg.d_head {
        seeds.push((hg.head, d));
    }
    let grads = g.backward_from(&seeds, &params)?;
    let mut buffers = Vec::with_capacity(params.len());
    let mut accumulated = Vec::new();
    let mut grad_sq: Option<TensorId> = None;
    for (s, &gr) in specs.iter().zip(&grads) {
        let buf = g.persistent(&format!("grad.{}", s.name), F32, &s.dims)?;
        // One micro-batch per step: the gradient is computed straight into its buffer.
        // Several: each adds into it in place, and the buffers are zeroed between steps.
        let acc = if accum == 1 && g.compute_into(gr, buf)? {
            gr
        } else {
            accumulated.push(buf);
            g.accumulate_into(buf, gr)?
        };
        let sq = g.sum_sq(acc)?; // [1]
        grad_sq = Some(match grad_sq {
            Some(t) => g.add(t, sq)?,
            None => sq,
        });
        buffers.push(buf);
    }
    let grad_sq = match grad_sq {
        Some(t) => t,
        None => g.fill(&[1], 0.0)?,
    };
    g.set_name(grad_sq, "grad_sq")?;
    g.set_output(grad_sq)?;
    let plan = backend.compile(g);
    let mut mem = backend.new_memory(&plan, &[]).map_err(backend_err)?;
    write_constants(backend, (&mut mem, &plan), &fwd, hp, shape)?;
    // The frozen bytes are the caller's to write: a packed copy may replace them.
    Ok(GradPass {
        plan,
        mem,
        fwd,
        params,
        frozen: frozen_ids,
        buffers,
        accumulated,
        grad_sq,
    })
}

pub(crate) fn update_pass<B: Backend>(
    backend: &B,
    specs: &[ParamSpec],
    opt: &Optimizer,
) -> Result<UpdatePass<B>> {
    let mut g = Graph::new();
    let params = param_leaves(&mut g, specs)?;
    // The last hyperparameter is the clipping factor: the optimizer steps scale the gradient
    // as they read it (no pass writing a clipped copy).
    let hp = g.input("optimizer_hp", F32, &[opt.n_hyperparams()])?;
    let mut buffers = Vec::with_capacity(params.len());
    let mut state = Vec::with_capacity(params.len());
    for (s, &p) in specs.iter().zip(&params) {
        let buf = g.persistent(&format!("grad.{}", s.name), F32, &s.dims)?;
        state.push(opt.build(&mut g, &s.name, p, buf, hp)?);
        buffers.push(buf);
    }
    let plan = backend.compile(g);
    let shared: Vec<TensorId> = params.iter().chain(&buffers).copied().collect();
    let mem = backend.new_memory(&plan, &shared).map_err(backend_err)?;
    Ok(UpdatePass {
        plan,
        mem,
        params,
        buffers,
        state,
        hp,
    })
}

/// The eval pass; the frozen tensors (as in `frozen`, bytes unused) and parameters are lent
/// by the grad pass. LoRA branches run without dropout.
pub(crate) fn eval_pass<B: Backend>(
    backend: &B,
    arch: &Arch,
    hp: &Hparams,
    specs: &[ParamSpec],
    frozen: &[Frozen],
    lora: Option<LoraGraph>,
    shape: BatchShape,
) -> Result<EvalPass<B>> {
    let mut g = Graph::new();
    let (frozen_ids, params, names) = leaves(&mut g, specs, frozen)?;
    let all: Vec<TensorId> = frozen_ids.iter().chain(&params).copied().collect();
    let table = ParamTable {
        names: &names,
        ids: &all,
    };
    let lora = lora.map(|l| LoraGraph { dropout: 0.0, ..l });
    let fwd = build_forward(&mut g, arch, hp, &table, shape, lora, None)?;
    let plan = backend.compile(g);
    let mut mem = backend.new_memory(&plan, &all).map_err(backend_err)?;
    write_constants(backend, (&mut mem, &plan), &fwd, hp, shape)?;
    Ok(EvalPass {
        plan,
        mem,
        fwd,
        params,
        frozen: frozen_ids,
    })
}

/// Writes a batch's labels and the count the loss is divided by (`TrainForward::loss_norm`):
/// `norm`, or the labels' own scored count.
pub(crate) fn write_labels<B: Backend>(
    backend: &B,
    (mem, plan): (&mut B::Memory, &Plan),
    fwd: &TrainForward,
    labels: &[i32],
    n_vocab: usize,
    norm: Option<f32>,
) -> Result<()> {
    write_i32(backend, (mem, plan), fwd.labels, labels)?;
    let norm = [norm.unwrap_or_else(|| scored(labels, n_vocab))];
    write_f32(backend, (mem, plan), fwd.loss_norm, &norm)
}

/// Lends `from`'s buffers of each `(from_ids, to_ids)` group to `to`, runs `to`'s plan, and
/// takes them back, also when the run fails (its error is returned after).
pub(crate) fn run_lent<B: Backend>(
    backend: &mut B,
    (from, from_plan): (&mut B::Memory, &Plan),
    (to, to_plan): (&mut B::Memory, &Plan),
    groups: &[(&[TensorId], &[TensorId])],
) -> Result<()> {
    let swap = |backend: &B, from: &mut B::Memory, to: &mut B::Memory| -> Result<()> {
        for (from_ids, to_ids) in groups {
            for (&a, &b) in from_ids.iter().zip(*to_ids) {
                backend
                    .swap(from, from_plan, a, to, to_plan, b)
                    .map_err(backend_err)?;
            }
        }
        Ok(())
    };
    swap(backend, from, to)?;
    let ran = backend.run(to_plan, to);
    swap(backend, from, to)?;
    ran.map_err(backend_err)
}
