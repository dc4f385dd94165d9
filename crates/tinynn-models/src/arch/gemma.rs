//! The Gemma family's decoder — Gemma, Gemma 2, Gemma 3 (text) — for inference and training:
//!
//! ```text
//! x = token_embd[tokens] · sqrt(n_embd)                               [e, n]
//! per block:  a = o(attention(rope(qn(q(norm(x)))), rope(kn(k(norm(x)))), v(norm(x))))
//!             x += post_attention_norm(a)          (Gemma: x += a)
//!             f = down(gelu(gate(norm(x))) ⊙ up(norm(x)))
//!             x += post_ffw_norm(f)                (Gemma: x += f)
//! logits = softcap(head(norm(x)))     head = token_embd (tied) or output.weight
//! ```
//!
//! - Gemma 2: attention and final logit soft-capping, every other layer in a sliding window.
//! - Gemma 3: no soft-capping; RMSNorm of each q/k head (`qn`, `kn`); five window layers to
//!   one global, the window layers rotating with a RoPE base of their own (10 000).
//!
//! Norm weights: transformers multiplies by `1 + w` and stores `w`; llama.cpp's converter
//! stores `1 + w` in GGUF files. Both are read as stored ([`Norm::rms_gemma`]).

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;

use super::decoder::{Decoder, Embedded};
use super::hf_names;
use super::hparams::{ArchDefaults, Hparams};
use super::llama::heads;
use crate::common::{Attention, AttnParams, Leaves, Mlp, MlpKind, Norm};
use crate::Result;

/// A Gemma generation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gemma {
    /// Norms after attention and after the feed-forward, before the residual adds (2, 3).
    pub post_norms: bool,
    /// RMSNorm of each q/k head before RoPE (3).
    pub qk_norm: bool,
    /// Of every `swa_period` layers all but the last use the sliding window, when the file
    /// states no pattern (0: no sliding window).
    pub swa_period: u64,
    /// RoPE base of the window layers when the file gives none.
    pub rope_freq_base_swa: Option<f64>,
}

pub static GEMMA: Gemma = Gemma {
    post_norms: false,
    qk_norm: false,
    swa_period: 0,
    rope_freq_base_swa: None,
};
pub static GEMMA2: Gemma = Gemma {
    post_norms: true,
    qk_norm: false,
    swa_period: 2,
    rope_freq_base_swa: None,
};
pub static GEMMA3: Gemma = Gemma {
    post_norms: true,
    qk_norm: true,
    swa_period: 6,
    rope_freq_base_swa: Some(10_000.0),
};

/// llama.cpp's attention scale for Gemma 2/3 GGUF files (which do not store
/// `query_pre_attn_scalar`): `1/sqrt(n_embd/n_head)` for the 27B shape (62 blocks), else
/// `1/sqrt(head_dim)`.
fn gguf_attn_scale(c: &ModelConfig) -> f32 {
    let d = if c.n_layer == 62 {
        c.n_embd / c.n_head
    } else {
        c.head_dim
    };
    1.0 / (d as f32).sqrt()
}

impl Gemma {
    fn norm(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        name: &str,
        n: usize,
    ) -> Result<Norm> {
        Norm::rms_gemma(g, lv, name, n, hp.norm_eps, hp.hf_layout)
    }
}

impl Decoder for Gemma {
    fn embed(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        _: &Attention<'_>,
        tokens: TensorId,
    ) -> Result<Embedded> {
        let Embedded { x, table } = super::decoder::token_embedding(g, lv, hp, tokens)?; // x: [e, n]
        let x = match hp.embd_scale {
            Some(s) => g.scale(x, s)?,
            None => x,
        };
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
        let (e, hd, nh, nkv) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv);
        let n = at.n_tokens;
        let blk = |s: &str| format!("blk.{l}.{s}");
        // Attention.
        let attn_norm = self.norm(g, lv, hp, &blk("attn_norm.weight"), e)?;
        let wq = lv.linear(g, &blk("attn_q"), e, nh * hd, false)?;
        let wk = lv.linear(g, &blk("attn_k"), e, nkv * hd, false)?;
        let wv = lv.linear(g, &blk("attn_v"), e, nkv * hd, false)?;
        let (q_norm, k_norm) = if self.qk_norm {
            (
                Some(self.norm(g, lv, hp, &blk("attn_q_norm.weight"), hd)?),
                Some(self.norm(g, lv, hp, &blk("attn_k_norm.weight"), hd)?),
            )
        } else {
            (None, None)
        };
        let wo = lv.linear(g, &blk("attn_output"), nh * hd, e, false)?;
        let post_attn = match self.post_norms {
            true => Some(self.norm(g, lv, hp, &blk("post_attention_norm.weight"), e)?),
            false => None,
        };
        let h = attn_norm.forward(g, x)?; // [e, n]
        let q = wq.forward(g, h)?; // [nh·hd, n]
        let k = wk.forward(g, h)?; // [nkv·hd, n]
        let v = wv.forward(g, h)?; // [nkv·hd, n]
        let q = heads(g, at, hp, l, q, [hd, nh, n], q_norm)?; // [hd, nh, n]
        let k = heads(g, at, hp, l, k, [hd, nkv, n], k_norm)?; // [hd, nkv, n]
        let params = AttnParams::of_layer(hp, l, hp.attn_scale);
        let att = at.attend(g, l, (q, k, v), params)?; // [nh·hd, n]
        let mut o = wo.forward(g, att)?; // [e, n]
        if let Some(norm) = post_attn {
            o = norm.forward(g, o)?;
        }
        let x = g.add(x, o)?; // [e, n]

        // Feed-forward.
        let ffn_norm = self.norm(g, lv, hp, &blk("ffn_norm.weight"), e)?;
        let mlp = Mlp::new(g, lv, &blk(""), MlpKind::GeGlu, e, hp.n_ff, false)?;
        let post_ffw = match self.post_norms {
            true => Some(self.norm(g, lv, hp, &blk("post_ffw_norm.weight"), e)?),
            false => None,
        };
        let h = ffn_norm.forward(g, x)?; // [e, n]
        let mut f = mlp.forward(g, h)?; // [e, n]
        if let Some(norm) = post_ffw {
            f = norm.forward(g, f)?;
        }
        Ok(g.add(x, f)?) // [e, n]
    }

    fn output_norm(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        x: TensorId,
    ) -> Result<TensorId> {
        self.norm(g, lv, hp, "output_norm.weight", hp.n_embd)?
            .forward(g, x)
    }

    fn fresh_has(&self, c: &ModelConfig, name: &str) -> bool {
        name == "output.weight" && !c.tie_word_embeddings.unwrap_or(true)
    }

    fn defaults(&self) -> ArchDefaults {
        ArchDefaults {
            sliding_window: self.swa_period > 0,
            swa_period: self.swa_period,
            rope_freq_base_swa: self.rope_freq_base_swa,
            scale_embeddings: true,
            attn_scale: (self.swa_period > 0).then_some(gguf_attn_scale as fn(&ModelConfig) -> f32),
            parallel_residual: false,
            experts: false,
        }
    }
}

/// The HF (transformers Gemma 2/3 layout) name of a GGUF tensor name.
pub fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    hf_names::hf_name_with(gguf, |part| match part {
        "post_attention_norm" => Some("post_attention_layernorm"),
        "ffn_norm" => Some("pre_feedforward_layernorm"),
        "post_ffw_norm" => Some("post_feedforward_layernorm"),
        other => hf_names::common_module(other),
    })
}

/// The HF (transformers Gemma layout, whose pre-feed-forward norm is
/// `post_attention_layernorm`) name of a GGUF tensor name.
pub fn hf_name_gemma1(gguf: &str) -> Option<Cow<'static, str>> {
    hf_names::hf_name_with(gguf, |part| match part {
        "ffn_norm" => Some("post_attention_layernorm"),
        other => hf_names::common_module(other),
    })
}

#[cfg(test)]
mod tests {
    use super::{hf_name, hf_name_gemma1};

    #[test]
    fn names_map_to_transformers_layout() {
        assert_eq!(
            hf_name("blk.2.ffn_norm.weight").as_deref(),
            Some("model.layers.2.pre_feedforward_layernorm.weight")
        );
        assert_eq!(
            hf_name("blk.2.post_attention_norm.weight").as_deref(),
            Some("model.layers.2.post_attention_layernorm.weight")
        );
        assert_eq!(
            hf_name("blk.0.post_ffw_norm.weight").as_deref(),
            Some("model.layers.0.post_feedforward_layernorm.weight")
        );
        assert_eq!(
            hf_name_gemma1("blk.1.ffn_norm.weight").as_deref(),
            Some("model.layers.1.post_attention_layernorm.weight")
        );
        assert_eq!(hf_name_gemma1("blk.1.post_attention_norm.weight"), None);
        assert_eq!(
            hf_name("token_embd.weight").as_deref(),
            Some("model.embed_tokens.weight")
        );
    }
}
