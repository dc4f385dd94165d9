//! A projection: `y = W·x (+ b)` for a weight `W` of any type (F32 parameter, file weight,
//! frozen quantized base), plus an optional LoRA branch `scale·B·(A·dropout(x))` — at
//! inference an adapter's A/B bound from its file with the adapter's scale, in training
//! trainable A/B with dropout on the branch's input.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;

use crate::Result;

/// Dropout on a LoRA branch's input (`Graph::dropout`): each element's mask is a hash of the
/// run's seed, the site and the element's index, so the backward recomputes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    /// I32 `[2]`: the seed, written before every run.
    pub seed: TensorId,
    /// Probability of zeroing an element.
    pub p: f32,
    /// This branch's salt (1, 2, ... in the order the projections are made).
    pub site: u32,
}

/// A low-rank branch on a projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraBranch {
    /// `[n_in, r]`.
    pub a: TensorId,
    /// `[r, n_out]`.
    pub b: TensorId,
    /// The branch's factor (`alpha/r`, times a user scale at inference).
    pub scale: f32,
    pub dropout: Option<Dropout>,
}

/// `W` (`[n_in, n_out]`), its bias and LoRA branches (one per adapter that adapts it).
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub w: TensorId,
    /// `[n_out]`.
    pub bias: Option<TensorId>,
    pub lora: Vec<LoraBranch>,
}

/// Rows `from..from + rows` of every column of `t` (F32 `[_, n]`, e.g. one part of a fused
/// q/k/v or gate/up projection's output), contiguous: `[rows, n]`.
pub fn rows_of(g: &mut Graph, t: TensorId, from: usize, rows: usize, n: usize) -> Result<TensorId> {
    let stride = g.layout(t).nb[1];
    let v = g.view(t, &[rows, n], &[stride], from * 4)?;
    Ok(g.cont(v)?)
}

impl Linear {
    /// `W·x + Σ scale·B·(A·dropout(x)) + b` of x `[n_in, n]`: `[n_out, n]`.
    pub fn forward(&self, g: &mut Graph, x: TensorId) -> Result<TensorId> {
        let mut y = g.mul_mat(self.w, x)?; // [n_out, n]
        for l in &self.lora {
            let xin = match l.dropout {
                Some(d) => g.dropout(x, d.seed, d.p, d.site)?, // [n_in, n]
                None => x,
            };
            let ax = g.mul_mat(l.a, xin)?; // [r, n]
            let bax = g.mul_mat(l.b, ax)?; // [n_out, n]
            let branch = g.scale(bax, l.scale)?;
            y = g.add(y, branch)?;
        }
        Ok(match self.bias {
            Some(b) => g.add(y, b)?,
            None => y,
        })
    }
}
