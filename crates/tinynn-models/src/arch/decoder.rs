//! What an architecture's file provides ([`Decoder`]), the part of the forward pass inference
//! and training share ([`trunk`]: embeddings and every block), and the list of a model's
//! tensors read off that same code ([`declare`]).

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::GgmlType;

use super::hparams::{ArchDefaults, Hparams};
use crate::common::{Attention, AttnMode, Init, Leaves, LoraBranch, RopeInputs};
use crate::Result;

/// The embedding stage's outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Embedded {
    /// F32 `[n_embd, n]`: the hidden states (after the blocks, in [`trunk`]'s result).
    pub x: TensorId,
    /// `[n_embd, n_vocab]`: the embedding table, which a tied head reads.
    pub table: TensorId,
}

/// An architecture's forward pass, stated once on `crate::common`'s pieces: every tensor comes
/// from a [`Leaves`], attention from an [`Attention`] (KV cache or full sequences), so the same
/// code builds the inference and the training graph.
pub trait Decoder: Sync {
    /// The embeddings of `tokens` (I32 `[n]`); `at` gives their positions (`at.rope.pos`) to
    /// architectures with learned position embeddings. By default the rows of
    /// `token_embd.weight`.
    fn embed(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        at: &Attention<'_>,
        tokens: TensorId,
    ) -> Result<Embedded> {
        let _ = at;
        token_embedding(g, lv, hp, tokens)
    }

    /// Block `layer` of x `[n_embd, n]`: `[n_embd, n]`.
    fn block(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        at: &mut Attention<'_>,
        layer: usize,
        x: TensorId,
    ) -> Result<TensorId>;

    /// The final norm of x `[n_embd, m]`: `[n_embd, m]`.
    fn output_norm(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        x: TensorId,
    ) -> Result<TensorId>;

    /// The output head `[n_embd, n_vocab]`: `output.weight`, or `table` when the model has
    /// none (tied embeddings).
    fn head(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        table: TensorId,
    ) -> Result<TensorId> {
        let dims = [hp.n_embd, hp.n_vocab];
        Ok(lv
            .optional(g, "output.weight", &dims, Init::Normal)?
            .unwrap_or(table)) // [e, n_vocab]
    }

    /// Whether a fresh (randomly initialized) model of config `c` has the optional tensor
    /// `name` (biases, per-head norms, an untied head).
    fn fresh_has(&self, c: &ModelConfig, name: &str) -> bool;

    /// What the architecture assumes where a file is silent (sliding-window pattern,
    /// embedding scale, attention scale).
    fn defaults(&self) -> ArchDefaults {
        ArchDefaults::default()
    }
}

/// The rows of `token_embd.weight` (`[n_embd, n_vocab]`) for `tokens` (I32 `[n]`).
pub fn token_embedding(
    g: &mut Graph,
    lv: &mut dyn Leaves,
    hp: &Hparams,
    tokens: TensorId,
) -> Result<Embedded> {
    let dims = [hp.n_embd, hp.n_vocab];
    let table = lv.tensor(g, "token_embd.weight", &dims, Init::Normal)?; // [e, n_vocab]
    let x = g.get_rows(table, tokens)?; // [e, n]
    Ok(Embedded { x, table })
}

/// The logits `[n_vocab, m]` of the final hidden states h `[n_embd, m]` through `head`
/// (`[n_embd, n_vocab]`), soft-capped when the model asks for it.
pub fn logits(g: &mut Graph, hp: &Hparams, head: TensorId, h: TensorId) -> Result<TensorId> {
    let logits = g.mul_mat(head, h)?; // [n_vocab, m]
    softcap(g, logits, hp.final_softcap)
}

/// `cap·tanh(x/cap)` when `cap` is set, else x.
pub fn softcap(g: &mut Graph, x: TensorId, cap: Option<f32>) -> Result<TensorId> {
    let Some(cap) = cap else { return Ok(x) };
    let t = g.scale(x, 1.0 / cap)?;
    let t = g.unary(tinynn_core::ops::Unary::Tanh, t)?;
    Ok(g.scale(t, cap)?)
}

/// Embeddings and every block of `dec`: the hidden states `[n_embd, n]` before the final
/// norm, and the embedding table.
pub fn trunk(
    dec: &dyn Decoder,
    g: &mut Graph,
    lv: &mut dyn Leaves,
    hp: &Hparams,
    at: &mut Attention<'_>,
    tokens: TensorId,
) -> Result<Embedded> {
    let Embedded { mut x, table } = dec.embed(g, lv, hp, at, tokens)?; // x: [e, n]
    for layer in 0..hp.n_layer {
        x = dec.block(g, lv, hp, at, layer, x)?; // [e, n]
    }
    Ok(Embedded { x, table })
}

/// One tensor of a model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorDecl {
    /// GGUF name.
    pub name: String,
    /// ggml dims.
    pub dims: Vec<usize>,
    pub init: Init,
}

/// Records what a graph asks for.
struct Declare<'a> {
    has: &'a dyn Fn(&str) -> Result<bool>,
    out: Vec<TensorDecl>,
}

impl Leaves for Declare<'_> {
    fn tensor(
        &mut self,
        g: &mut Graph,
        name: &str,
        dims: &[usize],
        init: Init,
    ) -> Result<TensorId> {
        let t = g.persistent(name, GgmlType::F32, dims)?;
        self.out.push(TensorDecl {
            name: name.to_string(),
            dims: dims.to_vec(),
            init,
        });
        Ok(t)
    }

    fn has(&self, name: &str) -> Result<bool> {
        (self.has)(name)
    }

    fn lora(&mut self, _: &mut Graph, _: &str) -> Result<Option<LoraBranch>> {
        Ok(None)
    }
}

/// Every tensor `dec` reads for a model of `hp` (embeddings, blocks, final norm, head), in
/// the order it reads them; `has` says which optional ones the model has. The forward pass is
/// built once on a one-token scratch graph to find out, so the list cannot disagree with it.
pub fn declare(
    dec: &dyn Decoder,
    hp: &Hparams,
    has: &dyn Fn(&str) -> Result<bool>,
) -> Result<Vec<TensorDecl>> {
    let mut g = Graph::new();
    let mut lv = Declare {
        has,
        out: Vec::new(),
    };
    let tokens = g.input("tokens", GgmlType::I32, &[1])?;
    let pos = g.input("pos", GgmlType::I32, &[1])?;
    let mask = g.input("mask", GgmlType::F32, &[1, 1])?;
    let mut at = Attention {
        n_tokens: 1,
        rope: RopeInputs { pos, freqs: None },
        mode: AttnMode::Full {
            batch: 1,
            seq: 1,
            mask: Some(mask),
            mask_swa: Some(mask),
        },
    };
    let t = trunk(dec, &mut g, &mut lv, hp, &mut at, tokens)?;
    dec.output_norm(&mut g, &mut lv, hp, t.x)?;
    dec.head(&mut g, &mut lv, hp, t.table)?;
    Ok(lv.out)
}
