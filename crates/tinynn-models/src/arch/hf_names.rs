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
    const FIXED: [(&str, &str); 3] = [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
    ];
    hf_name_in(gguf, &FIXED, "model.layers", module)
}

/// The HF name of GGUF tensor `gguf` in a layout whose whole-model tensors are `fixed` (GGUF
/// name, HF name) and whose block tensors are `{layers}.{N}.{module}.{weight|bias}` with
/// `module(part)` for `blk.{N}.{part}.*`.
pub fn hf_name_in(
    gguf: &str,
    fixed: &[(&str, &'static str)],
    layers: &str,
    module: impl Fn(&str) -> Option<&'static str>,
) -> Option<Cow<'static, str>> {
    if let Some(&(_, hf)) = fixed.iter().find(|(g, _)| *g == gguf) {
        return Some(Cow::Borrowed(hf));
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let (part, kind) = tail.rsplit_once('.')?;
    let hf = module(part)?;
    Some(Cow::Owned(format!("{layers}.{layer}.{hf}.{kind}")))
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
