//! Phi-3's decoder (Phi-3 mini / small context variants, Phi-3.5 mini without LongRoPE) for
//! inference and training:
//!
//! ```text
//! x = token_embd[tokens]                                              [e, n]
//! per block:  q | k | v = attn_qkv(norm(x))               (one fused projection, no bias)
//!             x += attn_output(attention(rope(q), rope(k), v))   (sliding window, all layers)
//!             gate | up = ffn_up(norm(x))                 (one fused projection)
//!             x += ffn_down(silu(gate) ⊙ up)
//! logits = output(norm(x))
//! ```
//!
//! RMSNorm, RoPE on halves (NEOX). The window comes from the config and, as in transformers
//! and llama.cpp, every layer uses it. LongRoPE (`su` / `longrope` scaling, the 128k models)
//! is refused when the RoPE parameters are read.

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;

use super::decoder::{Decoder, Embedded};
use super::hf_names;
use super::hparams::{ArchDefaults, Hparams};
use super::llama::heads;
use crate::common::{Attention, AttnParams, Init, Leaves, Norm};
use crate::Result;

/// The Phi-3 decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phi3;

pub static PHI3: Phi3 = Phi3;

/// Rows `from..from + rows` of each column of `t` (`[_, n]` F32), contiguous: `[rows, n]`.
fn rows_of(g: &mut Graph, t: TensorId, from: usize, rows: usize, n: usize) -> Result<TensorId> {
    let stride = g.layout(t).nb[1];
    let v = g.view(t, &[rows, n], &[stride], from * 4)?;
    Ok(g.cont(v)?)
}

impl Decoder for Phi3 {
    fn embed(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        _: &Attention<'_>,
        tokens: TensorId,
    ) -> Result<Embedded> {
        let dims = [hp.n_embd, hp.n_vocab];
        let table = lv.tensor(g, "token_embd.weight", &dims, Init::Normal)?; // [e, n_vocab]
        let x = g.get_rows(table, tokens)?; // [e, n]
        Ok(Embedded { x, table })
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
        let (wq, wk, ff) = (nh * hd, nkv * hd, hp.n_ff);
        let n = at.n_tokens;
        let blk = |s: &str| format!("blk.{l}.{s}");
        // Attention.
        let attn_norm = Norm::rms(g, lv, &blk("attn_norm.weight"), e, eps)?;
        let wqkv = lv.linear(g, &blk("attn_qkv"), e, wq + 2 * wk, false)?;
        let wo = lv.linear(g, &blk("attn_output"), wq, e, false)?;
        let h = attn_norm.forward(g, x)?; // [e, n]
        let qkv = wqkv.forward(g, h)?; // [wq + 2·wk, n]
        let q = rows_of(g, qkv, 0, wq, n)?; // [nh·hd, n]
        let k = rows_of(g, qkv, wq, wk, n)?; // [nkv·hd, n]
        let v = rows_of(g, qkv, wq + wk, wk, n)?; // [nkv·hd, n]
        let q = heads(g, at, hp, l, q, [hd, nh, n], None)?; // [hd, nh, n]
        let k = heads(g, at, hp, l, k, [hd, nkv, n], None)?; // [hd, nkv, n]
        let params = AttnParams::of_layer(hp, l, hp.attn_scale);
        let att = at.attend(g, l, (q, k, v), params)?; // [nh·hd, n]
        let o = wo.forward(g, att)?; // [e, n]
        let x = g.add(x, o)?; // [e, n]

        // Feed-forward: the fused projection holds the gate rows, then the up rows.
        let ffn_norm = Norm::rms(g, lv, &blk("ffn_norm.weight"), e, eps)?;
        let up = lv.linear(g, &blk("ffn_up"), e, 2 * ff, false)?;
        let down = lv.linear(g, &blk("ffn_down"), ff, e, false)?;
        let h = ffn_norm.forward(g, x)?; // [e, n]
        let gu = up.forward(g, h)?; // [2·ff, n]
        let gate = rows_of(g, gu, 0, ff, n)?; // [ff, n]
        let u = rows_of(g, gu, ff, ff, n)?; // [ff, n]
        let act = g.swiglu(gate, u)?; // [ff, n]
        let f = down.forward(g, act)?; // [e, n]
        Ok(g.add(x, f)?) // [e, n]
    }

    fn output_norm(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        x: TensorId,
    ) -> Result<TensorId> {
        Norm::rms(g, lv, "output_norm.weight", hp.n_embd, hp.norm_eps)?.forward(g, x)
    }

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

    fn fresh_has(&self, c: &ModelConfig, name: &str) -> bool {
        name == "output.weight" && !c.tie_word_embeddings.unwrap_or(false)
    }

    fn defaults(&self) -> ArchDefaults {
        ArchDefaults {
            sliding_window: true,
            ..ArchDefaults::default()
        }
    }
}

/// The HF (transformers Phi-3 layout) name of a GGUF tensor name.
pub fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    hf_names::hf_name_with(gguf, |part| match part {
        "attn_qkv" => Some("self_attn.qkv_proj"),
        "ffn_up" => Some("mlp.gate_up_proj"),
        "ffn_norm" => Some("post_attention_layernorm"),
        other => hf_names::common_module(other),
    })
}

#[cfg(test)]
mod tests {
    use tinynn_format::model_config::{Architecture, ModelConfig, RopeScaling};

    use super::hf_name;
    use crate::arch::Hparams;

    #[test]
    fn names_map_and_longrope_is_refused() {
        assert_eq!(
            hf_name("blk.2.attn_qkv.weight").as_deref(),
            Some("model.layers.2.self_attn.qkv_proj.weight")
        );
        assert_eq!(
            hf_name("blk.0.ffn_up.weight").as_deref(),
            Some("model.layers.0.mlp.gate_up_proj.weight")
        );
        let c = ModelConfig {
            architecture: Architecture::Phi3,
            n_vocab: Some(16),
            n_ctx_train: Some(64),
            n_embd: 8,
            n_layer: 1,
            n_head: 2,
            n_head_kv: 2,
            head_dim: 4,
            n_ff: Some(12),
            norm_eps: None,
            rope_dims: None,
            rope_freq_base: None,
            rope_scaling: RopeScaling::LongRope {
                original_context: Some(16),
            },
            tie_word_embeddings: Some(false),
            parallel_residual: None,
            attn: Default::default(),
        };
        let e = Hparams::from_config(&c, true).unwrap_err().to_string();
        assert!(e.contains("LongRope") && e.contains("not supported"), "{e}");
    }
}
