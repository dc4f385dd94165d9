//! A mixture-of-experts feed-forward (Mixtral): a router picks `k` of the block's experts for
//! each token, each chosen expert runs a SwiGLU feed-forward, and their outputs are summed with
//! the router's weights — the softmax over all experts, renormalized over the chosen ones
//! (transformers' `MixtralSparseMoeBlock`, llama.cpp's `build_moe_ffn` with weight norm).
//!
//! Tensors, by llama.cpp's names: `ffn_gate_inp` (the router, `[n_embd, n_expert]`, kept F32
//! by quantizers) and the experts stacked on the outer dimension, `ffn_gate_exps` /
//! `ffn_up_exps` `[n_embd, n_ff, n_expert]` and `ffn_down_exps` `[n_ff, n_embd, n_expert]`.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;

use super::leaves::{Init, Leaves};
use crate::Result;

/// A block's router and experts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    /// `[n_embd, n_expert]`.
    router: TensorId,
    /// `[n_embd, n_ff, n_expert]`.
    gate: TensorId,
    /// `[n_embd, n_ff, n_expert]`.
    up: TensorId,
    /// `[n_ff, n_embd, n_expert]`.
    down: TensorId,
    n_embd: usize,
    /// Experts each token uses.
    n_used: usize,
}

impl Moe {
    /// The router and experts named `<prefix>ffn_gate_inp`, `<prefix>ffn_{gate,up,down}_exps`
    /// (`.weight`), asked for in that order.
    pub fn new(
        g: &mut Graph,
        lv: &mut dyn Leaves,
        prefix: &str,
        n_embd: usize,
        n_ff: usize,
        n_expert: usize,
        n_used: usize,
    ) -> Result<Moe> {
        let mut t = |name: &str, dims: &[usize]| {
            lv.tensor(g, &format!("{prefix}{name}.weight"), dims, Init::Normal)
        };
        Ok(Moe {
            router: t("ffn_gate_inp", &[n_embd, n_expert])?,
            gate: t("ffn_gate_exps", &[n_embd, n_ff, n_expert])?,
            up: t("ffn_up_exps", &[n_embd, n_ff, n_expert])?,
            down: t("ffn_down_exps", &[n_ff, n_embd, n_expert])?,
            n_embd,
            n_used,
        })
    }

    /// The feed-forward of x `[n_embd, n]` (contiguous): `[n_embd, n]`.
    pub fn forward(&self, g: &mut Graph, x: TensorId) -> Result<TensorId> {
        let (e, k) = (self.n_embd, self.n_used);
        let n = g.layout(x).ne[1];
        let logits = g.mul_mat(self.router, x)?; // [n_expert, n]
        let probs = g.soft_max(logits, None, 1.0)?; // [n_expert, n]
        let chosen = g.top_k(probs, k)?; // I32 [k, n]
        let w = g.take_rows(probs, chosen)?; // [k, n]
        let total = g.sum_rows(w)?; // [1, n]
        let w = g.div(w, total)?; // [k, n]
        let xe = g.reshape(x, &[e, 1, n])?; // [e, 1, n]
        let gate = g.mul_mat_id(self.gate, xe, chosen)?; // [ff, k, n]
        let up = g.mul_mat_id(self.up, xe, chosen)?; // [ff, k, n]
        let act = g.swiglu(gate, up)?; // [ff, k, n]
        let out = g.mul_mat_id(self.down, act, chosen)?; // [e, k, n]
        let w = g.reshape(w, &[1, k, n])?; // [1, k, n]
        let out = g.mul(out, w)?; // [e, k, n]
        let out = g.reduce_to(out, &[e, 1, n])?; // [e, 1, n]
        Ok(g.reshape(out, &[e, n])?) // [e, n]
    }
}
