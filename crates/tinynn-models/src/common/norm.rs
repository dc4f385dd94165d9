//! Normalization of each row with a learned weight (and bias): `norm(x)·w (+ b)`.

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;

use super::leaves::{Init, Leaves};
use crate::Result;

/// Which normalization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// `x / rms(x)` (Llama, Qwen, Mistral; Gemma's GGUF files, which store `1 + w`).
    Rms,
    /// `x / rms(x)` times `1 + w` (Gemma as transformers stores it).
    RmsPlusOne,
    /// `(x − mean) / std` (GPT-2).
    Layer,
}

/// A norm and its tensors.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Norm {
    pub kind: NormKind,
    pub eps: f32,
    /// `[n]`.
    pub weight: TensorId,
    /// `[n]`.
    pub bias: Option<TensorId>,
}

impl Norm {
    /// RMSNorm with weight `name` (`[n]`).
    pub fn rms(g: &mut Graph, lv: &mut dyn Leaves, name: &str, n: usize, eps: f32) -> Result<Norm> {
        let weight = lv.tensor(g, name, &[n], Init::Ones)?;
        Ok(Norm {
            kind: NormKind::Rms,
            eps,
            weight,
            bias: None,
        })
    }

    /// RMSNorm with weight `name` (`[n]`) applied as `1 + w` when `plus_one` (Gemma's HF
    /// weights; a fresh one starts at 0), else as [`Norm::rms`].
    pub fn rms_gemma(
        g: &mut Graph,
        lv: &mut dyn Leaves,
        name: &str,
        n: usize,
        eps: f32,
        plus_one: bool,
    ) -> Result<Norm> {
        if !plus_one {
            return Norm::rms(g, lv, name, n, eps);
        }
        let weight = lv.tensor(g, name, &[n], Init::Zeros)?;
        Ok(Norm {
            kind: NormKind::RmsPlusOne,
            eps,
            weight,
            bias: None,
        })
    }

    /// RMSNorm when the model has weight `name` (Qwen3's per-head q/k norms), else `None`.
    pub fn rms_optional(
        g: &mut Graph,
        lv: &mut dyn Leaves,
        name: &str,
        n: usize,
        eps: f32,
    ) -> Result<Option<Norm>> {
        if !lv.has(name)? {
            return Ok(None);
        }
        Norm::rms(g, lv, name, n, eps).map(Some)
    }

    /// LayerNorm with weight `<stem>.weight` and, when `bias` and the model has it,
    /// `<stem>.bias` (`[n]` each).
    pub fn layer(
        g: &mut Graph,
        lv: &mut dyn Leaves,
        stem: &str,
        n: usize,
        eps: f32,
        bias: bool,
    ) -> Result<Norm> {
        let weight = lv.tensor(g, &format!("{stem}.weight"), &[n], Init::Ones)?;
        let bias = if bias {
            lv.optional(g, &format!("{stem}.bias"), &[n], Init::Zeros)?
        } else {
            None
        };
        Ok(Norm {
            kind: NormKind::Layer,
            eps,
            weight,
            bias,
        })
    }

    /// `norm(x)·w (+ b)` over the rows of x (`[n, ...]`): the same shape.
    pub fn forward(&self, g: &mut Graph, x: TensorId) -> Result<TensorId> {
        match self.kind {
            NormKind::Rms => {
                let h = g.rms_norm(x, self.eps)?;
                let h = g.mul(h, self.weight)?;
                Ok(match self.bias {
                    Some(b) => g.add(h, b)?,
                    None => h,
                })
            }
            NormKind::RmsPlusOne => {
                let h = g.rms_norm(x, self.eps)?;
                let hw = g.mul(h, self.weight)?;
                Ok(g.add(hw, h)?)
            }
            NormKind::Layer => Ok(g.layer_norm(x, self.eps, Some(self.weight), self.bias)?),
        }
    }
}
