//! GPT-2's decoder (gpt2, distilgpt2 and the other shapes of the family) for inference and
//! training:
//!
//! ```text
//! x = token_embd[tokens] + position_embd[positions]                   [e, n]
//! per block:  h = ln_1(x);  q | k | v = attn_qkv(h)      (one fused projection, with bias)
//!             x += attn_output(attention(q, k, v))        (no RoPE: positions are learned)
//!             x += ffn_down(gelu(ffn_up(ln_2(x))))        (tanh GELU, biases)
//! logits = head(ln_f(x))          head = token_embd (tied) or output.weight
//! ```
//!
//! Every norm is a LayerNorm with a bias. transformers keeps the projections as `Conv1D`
//! modules whose weights are stored `[in, out]`, the transpose of every other layout:
//! [`hf_transposed`] names them so an HF directory's copies are transposed once, on first use
//! (llama.cpp's converter transposes them into the GGUF file).

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::Rearrange;

use super::decoder::{Decoder, Embedded};
use super::hparams::Hparams;
use crate::common::{rows_of, Attention, AttnParams, Init, Leaves, Mlp, MlpKind, Norm};
use crate::{ModelError, Result};

/// The GPT-2 decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpt2;

pub static GPT2: Gpt2 = Gpt2;

impl Decoder for Gpt2 {
    fn embed(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        at: &Attention<'_>,
        tokens: TensorId,
    ) -> Result<Embedded> {
        let n_pos = hp.n_ctx_train.ok_or_else(|| {
            ModelError::Invalid(
                "the model config lacks the context length (GPT-2's position table has one row \
                 per position)"
                    .into(),
            )
        })?;
        let Embedded { x, table } = super::decoder::token_embedding(g, lv, hp, tokens)?; // x: [e, n]
        let dims = [hp.n_embd, n_pos];
        let positions = lv.tensor(g, "position_embd.weight", &dims, Init::Normal)?; // [e, n_pos]
        let p = g.get_rows(positions, at.rope.pos)?; // [e, n]
        Ok(Embedded {
            x: g.add(x, p)?,
            table,
        })
    }

    fn block(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        at: &mut Attention<'_>,
        l: usize,
        x: TensorId,
    ) -> Result<TensorId> {
        let (e, hd, nh, nkv, eps) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv, hp.norm_eps);
        let (wq, wk) = (nh * hd, nkv * hd);
        let n = at.n_tokens;
        let blk = |s: &str| format!("blk.{l}.{s}");
        // Attention.
        let attn_norm = Norm::layer(g, lv, &blk("attn_norm"), e, eps, true)?;
        let wqkv = lv.linear(g, &blk("attn_qkv"), e, wq + 2 * wk, true)?;
        let wo = lv.linear(g, &blk("attn_output"), wq, e, true)?;
        let h = attn_norm.forward(g, x)?; // [e, n]
        let qkv = wqkv.forward(g, h)?; // [wq + 2·wk, n]
        let q = rows_of(g, qkv, 0, wq, n)?; // [nh·hd, n]
        let k = rows_of(g, qkv, wq, wk, n)?; // [nkv·hd, n]
        let v = rows_of(g, qkv, wq + wk, wk, n)?; // [nkv·hd, n]
        let q = g.reshape(q, &[hd, nh, n])?; // [hd, nh, n]
        let k = g.reshape(k, &[hd, nkv, n])?; // [hd, nkv, n]
        let params = AttnParams::of_layer(hp, l, hp.attn_scale);
        let att = at.attend(g, l, (q, k, v), params)?; // [nh·hd, n]
        let o = wo.forward(g, att)?; // [e, n]
        let x = g.add(x, o)?; // [e, n]

        // Feed-forward.
        let ffn_norm = Norm::layer(g, lv, &blk("ffn_norm"), e, eps, true)?;
        let mlp = Mlp::new(g, lv, &blk(""), MlpKind::Gelu, e, hp.n_ff, true)?;
        let h = ffn_norm.forward(g, x)?; // [e, n]
        let f = mlp.forward(g, h)?; // [e, n]
        Ok(g.add(x, f)?) // [e, n]
    }

    fn output_norm(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        x: TensorId,
    ) -> Result<TensorId> {
        Norm::layer(g, lv, "output_norm", hp.n_embd, hp.norm_eps, true)?.forward(g, x)
    }

    fn fresh_has(&self, c: &ModelConfig, name: &str) -> bool {
        if name == "output.weight" {
            return !c.tie_word_embeddings.unwrap_or(true);
        }
        name.ends_with(".bias")
    }
}

/// The HF (transformers GPT-2 layout) name of a GGUF tensor name. Checkpoints saved from
/// `GPT2LMHeadModel` put `transformer.` in front; those of the bare `GPT2Model` (the original
/// `gpt2` files) do not, which the loader tries next.
pub fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    const FIXED: [(&str, &str); 5] = [
        ("token_embd.weight", "transformer.wte.weight"),
        ("position_embd.weight", "transformer.wpe.weight"),
        ("output_norm.weight", "transformer.ln_f.weight"),
        ("output_norm.bias", "transformer.ln_f.bias"),
        ("output.weight", "lm_head.weight"),
    ];
    super::hf_names::hf_name_in(gguf, &FIXED, "transformer.h", |part| {
        Some(match part {
            "attn_norm" => "ln_1",
            "attn_qkv" => "attn.c_attn",
            "attn_output" => "attn.c_proj",
            "ffn_norm" => "ln_2",
            "ffn_up" => "mlp.c_fc",
            "ffn_down" => "mlp.c_proj",
            _ => return None,
        })
    })
}

/// Whether HF tensor `name` is a `Conv1D` weight (stored `[in, out]`).
pub fn hf_transposed(name: &str) -> bool {
    (name.starts_with("transformer.h.") || name.starts_with("h."))
        && [".c_attn.weight", ".c_proj.weight", ".c_fc.weight"]
            .iter()
            .any(|s| name.ends_with(s))
}

/// The `Conv1D` weights, transposed.
pub fn hf_rearranged(name: &str, _: &ModelConfig) -> Option<Rearrange> {
    hf_transposed(name).then_some(Rearrange::Transpose)
}

#[cfg(test)]
mod tests {
    use super::{hf_name, hf_transposed};

    #[test]
    fn names_map_to_transformers_layout() {
        assert_eq!(
            hf_name("blk.3.attn_qkv.bias").as_deref(),
            Some("transformer.h.3.attn.c_attn.bias")
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.weight").as_deref(),
            Some("transformer.h.0.mlp.c_proj.weight")
        );
        assert_eq!(
            hf_name("output_norm.bias").as_deref(),
            Some("transformer.ln_f.bias")
        );
        assert_eq!(hf_name("blk.0.attn_q.weight"), None);
        assert!(hf_transposed("transformer.h.1.mlp.c_fc.weight"));
        assert!(hf_transposed("h.0.attn.c_attn.weight"));
        assert!(!hf_transposed("transformer.h.1.mlp.c_fc.bias"));
        assert!(!hf_transposed("transformer.wte.weight"));
    }
}
