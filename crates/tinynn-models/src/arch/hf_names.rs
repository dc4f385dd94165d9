//! The HF (transformers) tensor names of GGUF names, for the decoders whose models keep
//! transformers' usual `model.embed_tokens` / `model.layers.N.<module>` / `model.norm` /
//! `lm_head` layout: an architecture gives only its per-block module names.

use std::borrow::Cow;

/// The HF name of GGUF tensor `gguf`: the fixed embedding, final norm and head names, or
/// `model.layers.{N}.{module}.{weight|bias}` with `module(part)` for `blk.{N}.{part}.*`.
pub fn hf_name_with(
    gguf: &str,
    module: impl Fn(&str) -> Option<&'static str>,
) -> Option<Cow<'static, str>> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(Cow::Borrowed(f));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (part, kind) = tail.rsplit_once('.')?;
    let hf = module(part)?;
    Some(Cow::Owned(format!("model.layers.{layer}.{hf}.{kind}")))
}

/// The modules both the Llama and the Gemma layouts name alike.
pub fn common_module(part: &str) -> Option<&'static str> {
    Some(match part {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    })
}
