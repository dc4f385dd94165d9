//! The Llama family's decoder — Llama 2/3, SmolLM, Mistral, Qwen2 (q/k/v biases), Qwen3
//! (per-head q/k RMSNorm), Mixtral (a mixture-of-experts feed-forward, `crate::common::moe`) —
//! for inference and training alike:
//!
//! ```text
//! x = token_embd[tokens]                                    [e, n]
//! per block:  x += o(attention(rope(q(norm(x))), rope(k(norm(x))), v(norm(x))))
//!             x += down(silu(gate(norm(x))) ⊙ up(norm(x)))     (or the experts' mix)
//! logits = head(norm(x))        head = output.weight, or token_embd when tied
//! ```
//!
//! GGUF names throughout; [`hf_name`] maps them to transformers' names for HF directories.

use std::borrow::Cow;

use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::model_config::ModelConfig;

use super::decoder::Decoder;
use super::hparams::{ArchDefaults, Hparams};
use crate::common::{Attention, AttnParams, Leaves, Mlp, MlpKind, Moe, Norm};
use crate::Result;

/// The Llama-family decoder; the flags say which optional tensors a fresh model has (a model
/// file's own tensors decide when it is loaded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Llama {
    /// q/k/v projections with biases (Qwen2).
    pub qkv_bias: bool,
    /// RMSNorm of each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Every layer attends through the config's sliding window, when it gives one
    /// (Mistral); otherwise a window in the config is ignored (Qwen2's is unused).
    pub sliding_window: bool,
}

/// Llama, SmolLM (and Mistral as llama.cpp's converter writes it: a Llama whose file may
/// state a sliding window).
pub static LLAMA: Llama = Llama {
    qkv_bias: false,
    qk_norm: false,
    sliding_window: true,
};
pub static MISTRAL: Llama = Llama {
    qkv_bias: false,
    qk_norm: false,
    sliding_window: true,
};
pub static QWEN2: Llama = Llama {
    qkv_bias: true,
    qk_norm: false,
    sliding_window: false,
};
pub static QWEN3: Llama = Llama {
    qkv_bias: false,
    qk_norm: true,
    sliding_window: false,
};

impl Decoder for Llama {
    fn block(
        &self,
        g: &mut Graph,
        lv: &mut dyn Leaves,
        hp: &Hparams,
        at: &mut Attention<'_>,
        layer: usize,
        x: TensorId,
    ) -> Result<TensorId> {
        block(g, lv, hp, at, layer, x)
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
        if name == "output.weight" {
            return !c.tie_word_embeddings.unwrap_or(false);
        }
        let tail = name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .map_or("", |(_, tail)| tail);
        match tail {
            "attn_q.bias" | "attn_k.bias" | "attn_v.bias" => self.qkv_bias,
            "attn_q_norm.weight" | "attn_k_norm.weight" => self.qk_norm,
            _ => false,
        }
    }

    fn defaults(&self) -> ArchDefaults {
        ArchDefaults {
            sliding_window: self.sliding_window,
            experts: true,
            ..ArchDefaults::default()
        }
    }
}

/// Block `l`: RMSNorm → GQA attention with RoPE → residual → RMSNorm → SwiGLU → residual.
/// Its tensors are asked for first, in the order a trainer lists its parameters; the
/// projections' order also numbers their LoRA dropout sites (q, k, v, o, gate, up, down).
fn block(
    g: &mut Graph,
    lv: &mut dyn Leaves,
    hp: &Hparams,
    at: &mut Attention<'_>,
    l: usize,
    x: TensorId,
) -> Result<TensorId> {
    let (e, hd, nh, nkv, eps) = (hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv, hp.norm_eps);
    let n = at.n_tokens;
    let blk = |s: &str| format!("blk.{l}.{s}");
    // Attention.
    let attn_norm = Norm::rms(g, lv, &blk("attn_norm.weight"), e, eps)?;
    let wq = lv.linear(g, &blk("attn_q"), e, nh * hd, true)?; // biases: Qwen2
    let wk = lv.linear(g, &blk("attn_k"), e, nkv * hd, true)?;
    let wv = lv.linear(g, &blk("attn_v"), e, nkv * hd, true)?;
    let q_norm = Norm::rms_optional(g, lv, &blk("attn_q_norm.weight"), hd, eps)?; // Qwen3
    let k_norm = Norm::rms_optional(g, lv, &blk("attn_k_norm.weight"), hd, eps)?;
    let wo = lv.linear(g, &blk("attn_output"), nh * hd, e, false)?;
    let h = attn_norm.forward(g, x)?; // [e, n]
    let q = wq.forward(g, h)?; // [nh·hd, n]
    let k = wk.forward(g, h)?; // [nkv·hd, n]
    let v = wv.forward(g, h)?; // [nkv·hd, n]
    let q = heads(g, at, hp, l, q, [hd, nh, n], q_norm)?; // [hd, nh, n]
    let k = heads(g, at, hp, l, k, [hd, nkv, n], k_norm)?; // [hd, nkv, n]
    let params = AttnParams::of_layer(hp, l, hp.attn_scale);
    let att = at.attend(g, l, (q, k, v), params)?; // [nh·hd, n]
    let o = wo.forward(g, att)?; // [e, n]
    let x = g.add(x, o)?; // [e, n]

    // Feed-forward.
    let ffn_norm = Norm::rms(g, lv, &blk("ffn_norm.weight"), e, eps)?;
    let ffn = if hp.n_expert > 0 {
        // Mixtral.
        let moe = Moe::new(g, lv, &blk(""), e, hp.n_ff, hp.n_expert, hp.n_expert_used)?;
        let h = ffn_norm.forward(g, x)?; // [e, n]
        moe.forward(g, h)? // [e, n]
    } else {
        let mlp = Mlp::new(g, lv, &blk(""), MlpKind::SwiGlu, e, hp.n_ff, false)?;
        let h = ffn_norm.forward(g, x)?; // [e, n]
        mlp.forward(g, h)? // [e, n]
    };
    Ok(g.add(x, ffn)?) // [e, n]
}

/// q or k `[heads·hd, n]` of layer `l` as heads `dims` = `[hd, heads, n]`, each normalized
/// (when the model has the norm) and rotated with the layer's RoPE: `[hd, heads, n]`.
pub(crate) fn heads(
    g: &mut Graph,
    at: &Attention<'_>,
    hp: &Hparams,
    l: usize,
    t: TensorId,
    dims: [usize; 3],
    norm: Option<Norm>,
) -> Result<TensorId> {
    let t = g.reshape(t, &dims)?; // [hd, heads, n]
    let t = match norm {
        Some(norm) => norm.forward(g, t)?,
        None => t,
    };
    at.rope.apply(g, t, hp.rope_of(l))
}

/// The HF (transformers Llama/Mistral/Qwen2/Qwen3 layout) name of a GGUF tensor name.
pub fn hf_name(gguf: &str) -> Option<Cow<'static, str>> {
    super::hf_names::hf_name_with(gguf, |part| match part {
        "ffn_norm" => Some("post_attention_layernorm"),
        "ffn_gate_inp" => Some("block_sparse_moe.gate"),
        other => super::hf_names::common_module(other),
    })
}

/// Mixtral's per-expert matrices (`[model.]layers.L.block_sparse_moe.experts.E.w1.weight`,
/// `w2`, `w3`) as parts `E` of the GGUF expert tensors `blk.L.ffn_{gate,down,up}_exps.weight`.
pub fn hf_stacked(hf: &str) -> Option<(String, usize)> {
    let rest = hf.strip_prefix("model.").unwrap_or(hf);
    let rest = rest.strip_prefix("layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let rest = rest.strip_prefix("block_sparse_moe.experts.")?;
    let (expert, w) = rest.split_once('.')?;
    let part = match w {
        "w1.weight" => "ffn_gate_exps",
        "w2.weight" => "ffn_down_exps",
        "w3.weight" => "ffn_up_exps",
        _ => return None,
    };
    let layer: usize = layer.parse().ok()?;
    Some((format!("blk.{layer}.{part}.weight"), expert.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use tinynn_format::model_config::{Architecture, ModelConfig, RopeScaling};

    use super::hf_name;
    use crate::arch::{by_name, declare, Hparams};
    use crate::common::Init;

    fn config(architecture: Architecture, tied: bool) -> ModelConfig {
        ModelConfig {
            architecture,
            n_vocab: Some(16),
            n_ctx_train: Some(32),
            n_embd: 8,
            n_layer: 1,
            n_head: 2,
            n_head_kv: 1,
            head_dim: 4,
            n_ff: Some(12),
            norm_eps: None,
            rope_dims: None,
            rope_freq_base: None,
            rope_scaling: RopeScaling::None,
            tie_word_embeddings: Some(tied),
            parallel_residual: None,
            attn: Default::default(),
            experts: None,
            ssm: None,
        }
    }

    /// The tensors of a fresh model, in the order the decoder reads them (the order a trainer's
    /// parameters, their random init and its checkpoints follow).
    fn fresh(arch: &str, architecture: Architecture, tied: bool) -> Vec<(String, Init)> {
        let c = config(architecture, tied);
        let a = by_name(arch).unwrap();
        let hp = Hparams::from_config(&c, false).unwrap();
        let has = |name: &str| Ok(a.decoder.fresh_has(&c, name));
        let d = declare(a.decoder, &hp, &has).unwrap();
        d.into_iter().map(|t| (t.name, t.init)).collect()
    }

    #[test]
    fn declared_tensors_follow_the_forward_pass() {
        use Init::{Normal as N, Ones as O, Zeros as Z};
        let want = |names: &[(&str, Init)]| -> Vec<(String, Init)> {
            names.iter().map(|(n, i)| (n.to_string(), *i)).collect()
        };
        let qwen2 = [
            ("token_embd.weight", N),
            ("blk.0.attn_norm.weight", O),
            ("blk.0.attn_q.weight", N),
            ("blk.0.attn_q.bias", Z),
            ("blk.0.attn_k.weight", N),
            ("blk.0.attn_k.bias", Z),
            ("blk.0.attn_v.weight", N),
            ("blk.0.attn_v.bias", Z),
            ("blk.0.attn_output.weight", N),
            ("blk.0.ffn_norm.weight", O),
            ("blk.0.ffn_gate.weight", N),
            ("blk.0.ffn_up.weight", N),
            ("blk.0.ffn_down.weight", N),
            ("output_norm.weight", O),
            ("output.weight", N),
        ];
        assert_eq!(fresh("qwen2", Architecture::Qwen2, false), want(&qwen2));
        let qwen3 = [
            ("token_embd.weight", N),
            ("blk.0.attn_norm.weight", O),
            ("blk.0.attn_q.weight", N),
            ("blk.0.attn_k.weight", N),
            ("blk.0.attn_v.weight", N),
            ("blk.0.attn_q_norm.weight", O),
            ("blk.0.attn_k_norm.weight", O),
            ("blk.0.attn_output.weight", N),
            ("blk.0.ffn_norm.weight", O),
            ("blk.0.ffn_gate.weight", N),
            ("blk.0.ffn_up.weight", N),
            ("blk.0.ffn_down.weight", N),
            ("output_norm.weight", O),
        ];
        assert_eq!(fresh("qwen3", Architecture::Qwen3, true), want(&qwen3));
        let llama = fresh("llama", Architecture::Llama, true);
        assert_eq!(llama.len(), 11, "{llama:?}");
        assert!(llama.iter().all(|(n, _)| !n.ends_with(".bias")));
    }

    #[test]
    fn names_map_to_transformers_layout() {
        assert_eq!(
            hf_name("blk.3.attn_q.bias").as_deref(),
            Some("model.layers.3.self_attn.q_proj.bias")
        );
        assert_eq!(
            hf_name("blk.0.ffn_down.weight").as_deref(),
            Some("model.layers.0.mlp.down_proj.weight")
        );
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.0.unknown.weight"), None);
        assert_eq!(
            hf_name("blk.1.ffn_gate_inp.weight").as_deref(),
            Some("model.layers.1.block_sparse_moe.gate.weight")
        );
        let part = |hf: &str| super::hf_stacked(hf);
        assert_eq!(
            part("model.layers.2.block_sparse_moe.experts.7.w2.weight"),
            Some(("blk.2.ffn_down_exps.weight".to_string(), 7))
        );
        assert_eq!(
            part("layers.0.block_sparse_moe.experts.0.w3.weight"),
            Some(("blk.0.ffn_up_exps.weight".to_string(), 0))
        );
        assert_eq!(
            part("model.layers.0.block_sparse_moe.experts.x.w1.weight"),
            None
        );
        assert_eq!(part("model.layers.0.mlp.gate_proj.weight"), None);
    }
}
