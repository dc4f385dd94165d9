//! Where a block's tensors come from: the one thing inference and training do differently when
//! a block asks for a tensor.
//!
//! - Inference (`crate::forward`): the model file's weights as read-only leaves of their file
//!   types, recorded with their names for the session to bind, and a LoRA adapter's A/B.
//! - Training (`tinynn_train`): the trainer's persistent F32 parameters or frozen base tensors
//!   (QLoRA), and trainable LoRA branches with dropout on their input.
//! - Declaring (`crate::arch::declare`): only the list of tensors, for a trainer's parameters.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;

use super::linear::{Linear, LoraBranch};
use crate::Result;

/// How a fresh (randomly initialized) model starts a tensor, as transformers'
/// `_init_weights`: matrices and embeddings normal(0, 0.02), biases 0, norm weights 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Init {
    /// normal(0, 0.02): matrices and the embedding.
    Normal,
    Zeros,
    Ones,
    /// Mamba's A `[d_state, d_inner]`: `−(n + 1)` for state n of every channel (S4D-real, as
    /// `mamba_ssm` starts it), or `ln(n + 1)` when the tensor is transformers' `A_log`.
    SsmA {
        log: bool,
    },
}

impl Init {
    /// The value of element `k` of a tensor whose rows are `row` long, for the inits that are
    /// not random (`None` for [`Init::Normal`]).
    pub fn fixed(self, k: usize, row: usize) -> Option<f32> {
        match self {
            Init::Normal => None,
            Init::Zeros => Some(0.0),
            Init::Ones => Some(1.0),
            Init::SsmA { log } => {
                let n = (k % row.max(1) + 1) as f32;
                Some(if log { n.ln() } else { -n })
            }
        }
    }
}

/// The source of a graph's tensors, by GGUF name.
pub trait Leaves {
    /// The leaf of tensor `name`, whose ggml dims must be `dims`; `init` says how a fresh model
    /// starts it.
    fn tensor(&mut self, g: &mut Graph, name: &str, dims: &[usize], init: Init)
        -> Result<TensorId>;

    /// Whether the model has the optional tensor `name`.
    fn has(&self, name: &str) -> Result<bool>;

    /// The LoRA branch of weight `name`, when it has one.
    fn lora(&mut self, g: &mut Graph, name: &str) -> Result<Option<LoraBranch>>;

    /// Every adapter's branch for weight `name` (inference may apply several adapters; the
    /// default is [`Leaves::lora`]'s one).
    fn loras(&mut self, g: &mut Graph, name: &str) -> Result<Vec<LoraBranch>> {
        Ok(self.lora(g, name)?.into_iter().collect())
    }

    /// [`Leaves::tensor`] when the model has `name`, else `None`.
    fn optional(
        &mut self,
        g: &mut Graph,
        name: &str,
        dims: &[usize],
        init: Init,
    ) -> Result<Option<TensorId>> {
        if !self.has(name)? {
            return Ok(None);
        }
        self.tensor(g, name, dims, init).map(Some)
    }

    /// The projection `<stem>.weight` (`[n_in, n_out]`) with its LoRA branch, and `<stem>.bias`
    /// (`[n_out]`) when `bias` and the model has it.
    fn linear(
        &mut self,
        g: &mut Graph,
        stem: &str,
        n_in: usize,
        n_out: usize,
        bias: bool,
    ) -> Result<Linear> {
        let name = format!("{stem}.weight");
        let w = self.tensor(g, &name, &[n_in, n_out], Init::Normal)?;
        let bias = if bias {
            self.optional(g, &format!("{stem}.bias"), &[n_out], Init::Zeros)?
        } else {
            None
        };
        let lora = self.loras(g, &name)?;
        Ok(Linear { w, bias, lora })
    }
}
