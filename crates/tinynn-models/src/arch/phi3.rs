//! Phi-3's decoder (Phi-3 and Phi-3.5 mini) for inference and training:
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
//! and llama.cpp, every layer uses it. LongRoPE (`su` / `longrope` scaling: Phi-3 128k,
//! Phi-3.5) divides the frequencies by its short factors, or by its long ones when the
//! context is longer than the original one (llama.cpp's rule; transformers switches when the
//! sequence itself gets that long), and scales cos/sin (`common::rope`).

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;

use super::decoder::Decoder;
use super::hf_names;
use super::hparams::{ArchDefaults, Hparams};
use super::llama::heads;
use crate::common::{rows_of, Attention, AttnParams, Leaves, Norm};
use crate::Result;

/// The Phi-3 decoder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Phi3;

pub static PHI3: Phi3 = Phi3;

impl Decoder for Phi3 {
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
    fn names_map_and_longrope_factors_follow_the_context() {
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
                short_factor: Some(vec![1.0]),
                long_factor: Some(vec![2.0, 4.0]),
                attn_factor: None,
            },
            tie_word_embeddings: Some(false),
            parallel_residual: None,
            attn: Default::default(),
            experts: None,
            ssm: None,
        };
        // Two rotated pairs a head: one short factor is refused, two are taken; the long ones
        // take over past the original 16 tokens, and cos/sin scale by sqrt(1 + ln 4 / ln 16).
        let e = Hparams::from_config(&c, true).unwrap_err().to_string();
        assert!(
            e.contains("short_factor has 1 values") && e.contains("2 pairs"),
            "{e}"
        );
        let mut c = c;
        if let RopeScaling::LongRope { short_factor, .. } = &mut c.rope_scaling {
            *short_factor = Some(vec![1.0, 1.5]);
        }
        let mut hp = Hparams::from_config(&c, true).unwrap();
        assert_eq!(hp.freq_factors.as_deref(), Some(&[1.0f32, 1.5][..]));
        assert!((hp.rope.attn_factor - 1.5f32.sqrt()).abs() < 1e-6);
        hp.for_context(16);
        assert_eq!(hp.freq_factors.as_deref(), Some(&[1.0f32, 1.5][..]));
        hp.for_context(17);
        assert_eq!(hp.freq_factors.as_deref(), Some(&[2.0f32, 4.0][..]));
    }
}
