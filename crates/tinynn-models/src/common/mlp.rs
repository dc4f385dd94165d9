//! Feed-forward networks: gated (SwiGLU for Llama/Qwen/Mistral, GeGLU for Gemma) or plain
//! GELU (GPT-2), with biases where the model has them.

use tinynn_core::graph::Graph;
use tinynn_core::ops::Unary;
use tinynn_core::tensor::TensorId;

use super::leaves::Leaves;
use super::linear::Linear;
use crate::Result;

/// Which feed-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlpKind {
    /// `down(silu(gate(x)) ⊙ up(x))`.
    SwiGlu,
    /// `down(gelu(gate(x)) ⊙ up(x))` (tanh GELU).
    GeGlu,
    /// `down(gelu(up(x)))` (tanh GELU).
    Gelu,
}

/// A feed-forward and its projections.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    kind: MlpKind,
    /// `[n_embd, n_ff]`, gated kinds only.
    gate: Option<Linear>,
    /// `[n_embd, n_ff]`.
    up: Linear,
    /// `[n_ff, n_embd]`.
    down: Linear,
}

impl Mlp {
    /// The feed-forward whose tensors are named `<prefix>ffn_gate` (gated kinds),
    /// `<prefix>ffn_up` and `<prefix>ffn_down`, made in that order; biases when `bias` and the
    /// model has them.
    pub fn new(
        g: &mut Graph,
        lv: &mut dyn Leaves,
        prefix: &str,
        kind: MlpKind,
        n_embd: usize,
        n_ff: usize,
        bias: bool,
    ) -> Result<Mlp> {
        let gate = match kind {
            MlpKind::SwiGlu | MlpKind::GeGlu => {
                Some(lv.linear(g, &format!("{prefix}ffn_gate"), n_embd, n_ff, bias)?)
            }
            MlpKind::Gelu => None,
        };
        let up = lv.linear(g, &format!("{prefix}ffn_up"), n_embd, n_ff, bias)?;
        let down = lv.linear(g, &format!("{prefix}ffn_down"), n_ff, n_embd, bias)?;
        Ok(Mlp {
            kind,
            gate,
            up,
            down,
        })
    }

    /// The feed-forward of x `[n_embd, n]`: `[n_embd, n]`.
    pub fn forward(&self, g: &mut Graph, x: TensorId) -> Result<TensorId> {
        let act = match &self.gate {
            Some(gate) => {
                let gate = gate.forward(g, x)?; // [n_ff, n]
                let up = self.up.forward(g, x)?; // [n_ff, n]
                if self.kind == MlpKind::GeGlu {
                    g.geglu(gate, up)?
                } else {
                    g.swiglu(gate, up)?
                }
            }
            None => {
                let up = self.up.forward(g, x)?; // [n_ff, n]
                g.unary(Unary::GeluTanh, up)?
            }
        }; // [n_ff, n]
        self.down.forward(g, act) // [n_embd, n]
    }
}
