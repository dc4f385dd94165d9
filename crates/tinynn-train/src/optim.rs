//! Optimizers as graph ops: each parameter gets persistent state tensors and an in-place update
//! reading its hyperparameters from a run-time F32 tensor (so the learning rate and AdamW's bias
//! corrections change per step without rebuilding anything).

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use crate::error::{Result, TrainError};

/// The update rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Optimizer {
    /// Adam with bias correction and decoupled weight decay (PyTorch's `AdamW`):
    /// `m = β1·m + (1−β1)·g; v = β2·v + (1−β2)·g²;
    /// w = w·(1 − lr·wd) − lr·(m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + eps)`.
    AdamW {
        beta1: f32,
        beta2: f32,
        eps: f32,
        weight_decay: f32,
    },
    /// SGD with momentum and decoupled weight decay:
    /// `vel = momentum·vel + g; w = w·(1 − lr·wd) − lr·vel`.
    Sgd { momentum: f32, weight_decay: f32 },
}

impl Default for Optimizer {
    /// AdamW with PyTorch's defaults (betas 0.9/0.999, eps 1e-8, weight decay 0.01).
    fn default() -> Self {
        Optimizer::AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl Optimizer {
    /// Length of the hyperparameter tensor its kernel reads.
    pub fn n_hyperparams(&self) -> usize {
        match self {
            Optimizer::AdamW { .. } => 8,
            Optimizer::Sgd { .. } => 4,
        }
    }

    /// Name prefixes of the per-parameter state tensors (`<prefix>.<param name>`).
    pub fn state_prefixes(&self) -> &'static [&'static str] {
        match self {
            Optimizer::AdamW { .. } => &["adam_m", "adam_v"],
            Optimizer::Sgd { .. } => &["sgd_vel"],
        }
    }

    pub(crate) fn check(&self) -> Result<()> {
        let ok = match *self {
            Optimizer::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                (0.0..1.0).contains(&beta1)
                    && (0.0..1.0).contains(&beta2)
                    && eps >= 0.0
                    && weight_decay >= 0.0
            }
            Optimizer::Sgd {
                momentum,
                weight_decay,
            } => (0.0..1.0).contains(&momentum) && weight_decay >= 0.0,
        };
        if ok {
            Ok(())
        } else {
            Err(TrainError::Invalid(format!(
                "optimizer hyperparameters out of range: {self:?}"
            )))
        }
    }

    /// Adds the state tensors and the in-place update of `param` (named `name`) by `grad`;
    /// returns the state tensors in `state_prefixes` order.
    pub(crate) fn build(
        &self,
        g: &mut Graph,
        name: &str,
        param: TensorId,
        grad: TensorId,
        hp: TensorId,
    ) -> Result<Vec<TensorId>> {
        let ne = g.layout(param).ne;
        let mut state = Vec::new();
        for prefix in self.state_prefixes() {
            state.push(g.persistent(&format!("{prefix}.{name}"), GgmlType::F32, &ne)?);
        }
        match self {
            Optimizer::AdamW { .. } => g.adamw_step(param, grad, state[0], state[1], hp)?,
            Optimizer::Sgd { .. } => g.sgd_step(param, grad, state[0], hp)?,
        };
        Ok(state)
    }

    /// The hyperparameter values of update number `t` (1-based) at learning rate `lr`.
    /// The hyperparameter values of update `t` (1-based) at learning rate `lr`, the gradient
    /// multiplied by `grad_scale` (clipping); the first `n_hyperparams` count.
    pub(crate) fn hyperparams(&self, lr: f32, t: u64, grad_scale: f32) -> [f32; 8] {
        match *self {
            Optimizer::AdamW {
                beta1,
                beta2,
                eps,
                weight_decay,
            } => {
                let t = t.min(i32::MAX as u64) as i32;
                let c1 = 1.0 / (1.0 - f64::from(beta1).powi(t));
                let c2 = 1.0 / (1.0 - f64::from(beta2).powi(t));
                [
                    lr,
                    beta1,
                    beta2,
                    eps,
                    weight_decay,
                    c1 as f32,
                    c2 as f32,
                    grad_scale,
                ]
            }
            Optimizer::Sgd {
                momentum,
                weight_decay,
            } => [lr, momentum, weight_decay, grad_scale, 0.0, 0.0, 0.0, 0.0],
        }
    }
}
