//! GPT-NeoX's decoder (Pythia, GPT-NeoX-20B and their fine-tunes) for inference and training:
//!
//! ```text
//! x = token_embd[tokens]                                              [e, n]
//! per block:  a = attn_output(attention(rope(q), rope(k), v))   q | k | v = attn_qkv(ln_1(x))
//!             f = ffn_down(gelu(ffn_up(ln_2(·))))
//!             parallel residual:    x = x + a + f(ln_2(x))
//!             sequential residual:  x = x + a;  x = x + f(ln_2(x))
//! logits = output(ln_f(x))
//! ```
//!
//! RoPE turns only the first `rope_dims` of each head (`rotary_pct`), on halves (NEOX); every
//! norm is a LayerNorm with a bias; the GELU is exact (erf). transformers keeps q, k and v
//! interleaved per head in `query_key_value` (`[q_h, k_h, v_h]` for each head h); llama.cpp's
//! converter regroups them as all q, then all k, then all v, which is how the block reads them:
//! [`hf_rearranged`] names the tensors an HF directory's copies are regrouped for.

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::ops::Unary;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;
use tinynn_format::model_dir::Rearrange;

use super::decoder::Decoder;
use super::hparams::{ArchDefaults, Hparams};
use super::llama::heads;
use crate::common::{rows_of, Attention, AttnParams, Leaves, Norm};
use crate::Result;

/// The GPT-NeoX decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GptNeox;

pub static GPTNEOX: GptNeox = GptNeox;

impl Decoder for GptNeox {
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
        let attn_norm = Norm::layer(g, lv, &blk("attn_norm"), e, eps, true)?;
        let wqkv = lv.linear(g, &blk("attn_qkv"), e, wq + 2 * wk, true)?;
        let wo = lv.linear(g, &blk("attn_output"), wq, e, true)?;
        let ffn_norm = Norm::layer(g, lv, &blk("ffn_norm"), e, eps, true)?;
        let up = lv.linear(g, &blk("ffn_up"), e, hp.n_ff, true)?;
        let down = lv.linear(g, &blk("ffn_down"), hp.n_ff, e, true)?;

        let h = attn_norm.forward(g, x)?; // [e, n]
        let qkv = wqkv.forward(g, h)?; // [wq + 2·wk, n]
        let q = rows_of(g, qkv, 0, wq, n)?; // [nh·hd, n]
        let k = rows_of(g, qkv, wq, wk, n)?; // [nkv·hd, n]
        let v = rows_of(g, qkv, wq + wk, wk, n)?; // [nkv·hd, n]
        let q = heads(g, at, hp, l, q, [hd, nh, n], None)?; // [hd, nh, n]
        let k = heads(g, at, hp, l, k, [hd, nkv, n], None)?; // [hd, nkv, n]
        let params = AttnParams::of_layer(hp, l, hp.attn_scale);
        let att = at.attend(g, l, (q, k, v), params)?; // [nh·hd, n]
        let a = wo.forward(g, att)?; // [e, n]

        let mlp = |g: &mut Graph, input: TensorId| -> Result<TensorId> {
            let h = ffn_norm.forward(g, input)?; // [e, n]
            let u = up.forward(g, h)?; // [n_ff, n]
            let u = g.unary(Unary::GeluErf, u)?;
            down.forward(g, u) // [e, n]
        };
        if hp.parallel_residual {
            let f = mlp(g, x)?;
            let xa = g.add(x, a)?;
            Ok(g.add(xa, f)?) // [e, n]
        } else {
            let x = g.add(x, a)?;
            let f = mlp(g, x)?;
            Ok(g.add(x, f)?) // [e, n]
        }
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
            return !c.tie_word_embeddings.unwrap_or(false);
        }
        name.ends_with(".bias")
    }

    fn defaults(&self) -> ArchDefaults {
        ArchDefaults {
            parallel_residual: true,
            ..ArchDefaults::default()
        }
    }
}

/// The HF (transformers GPT-NeoX layout) name of a GGUF tensor name.
pub fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    const FIXED: [(&str, &str); 4] = [
        ("token_embd.weight", "gpt_neox.embed_in.weight"),
        ("output_norm.weight", "gpt_neox.final_layer_norm.weight"),
        ("output_norm.bias", "gpt_neox.final_layer_norm.bias"),
        ("output.weight", "embed_out.weight"),
    ];
    super::hf_names::hf_name_in(gguf, &FIXED, "gpt_neox.layers", |part| {
        Some(match part {
            "attn_norm" => "input_layernorm",
            "attn_qkv" => "attention.query_key_value",
            "attn_output" => "attention.dense",
            "ffn_norm" => "post_attention_layernorm",
            "ffn_up" => "mlp.dense_h_to_4h",
            "ffn_down" => "mlp.dense_4h_to_h",
            _ => return None,
        })
    })
}

/// The fused q/k/v weight and bias, whose rows transformers interleaves per head.
pub fn hf_rearranged(name: &str, c: &ModelConfig) -> Option<Rearrange> {
    let fused = name.ends_with(".attention.query_key_value.weight")
        || name.ends_with(".attention.query_key_value.bias");
    fused.then_some(Rearrange::GroupRows {
        groups: c.n_head as usize,
        parts: 3,
    })
}
