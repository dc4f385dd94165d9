//! `tnn convert MODEL.gguf OUT_DIR`: a GGUF model written as a Hugging Face directory
//! (`config.json`, `model.safetensors`, `tokenizer.json`, `tokenizer_config.json`,
//! `generation_config.json`) that transformers and tinynn load: for sharing a fine-tuned
//! model, or for running a GGUF file where only HF checkpoints are read.
//!
//! - **Architectures**: those of transformers' Llama layout (Llama, Mistral, Qwen2, Qwen3,
//!   and Mixtral: a Llama with experts, whose stacked `ffn_*_exps` tensors are written as
//!   transformers' per-expert `w1` / `w2` / `w3` matrices); others are refused by name.
//! - **Tensors**: exactly those the decoder reads, dequantized (any GGUF type) and stored as
//!   F32, F16 or BF16 under their HF names; q/k rows un-permuted where llama.cpp's converter
//!   permuted them for RoPE on adjacent pairs. Written one at a time, never the model whole.
//! - **Config**: shape, norms, RoPE base and scaling (none, linear, YaRN, Llama 3's
//!   parameters), sliding window, tied head, BOS/EOS. RoPE divisors that only exist as a
//!   `rope_freqs.weight` tensor (Llama 3 GGUF files) have no config form and are refused.
//! - **Tokenizer**: a byte-level BPE vocabulary (`tokenizer.ggml.model = gpt2`) as
//!   `tokenizer.json`; the chat template in `tokenizer_config.json`. SentencePiece
//!   vocabularies are refused (write the weights alone with `tokenizer: false`).

use std::path::Path;

use serde_json::{json, Map, Value as Json};
use tinynn_core::quant::{dequantize_row, quantize_row};
use tinynn_format::gguf::Key;
use tinynn_format::model_config::RopeScaling;
use tinynn_format::safetensors::Dtype;
use tinynn_format::safetensors_writer::{write_safetensors, SafetensorsEntry};
use tinynn_format::GgmlType;

use crate::arch::{self, declare, Hparams};
use crate::model::Model;
use crate::{ModelError, Result};

/// The architectures written, with transformers' class names.
const CLASSES: [(&str, &str); 4] = [
    ("llama", "LlamaForCausalLM"),
    ("mistral", "MistralForCausalLM"),
    ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"),
];

/// How to write the directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportOptions {
    /// F32, F16 or BF16 for every tensor.
    pub dtype: GgmlType,
    /// Write `tokenizer.json` (an error when the vocabulary cannot be written); false: the
    /// weights and config only.
    pub tokenizer: bool,
}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportReport {
    pub architecture: String,
    pub tensors: usize,
    /// Bytes of `model.safetensors`.
    pub bytes: u64,
    /// Tokens of `tokenizer.json` (0: none written).
    pub tokens: usize,
}

/// Writes the GGUF model `model` as a Hugging Face directory `out`, which must not exist or be
/// empty (nothing is overwritten).
pub fn export_hf(model: &Model, out: &Path, opts: &ExportOptions) -> Result<ExportReport> {
    let invalid = |m: String| ModelError::Invalid(m);
    let (st_dtype, torch_dtype) = match opts.dtype {
        GgmlType::F32 => (Dtype::F32, "float32"),
        GgmlType::F16 => (Dtype::F16, "float16"),
        GgmlType::Bf16 => (Dtype::BF16, "bfloat16"),
        other => {
            return Err(invalid(format!(
                "a Hugging Face directory holds F32, F16 or BF16 tensors, not {other}"
            )))
        }
    };
    let Some(file) = model.gguf() else {
        return Err(invalid(format!(
            "{} is a Hugging Face directory already (this writes a GGUF model as one)",
            model.path().display()
        )));
    };
    let config = model.config();
    let arch = arch::of_config(config)?;
    let Some(&(_, class)) = CLASSES.iter().find(|(a, _)| *a == arch.name) else {
        let names: Vec<&str> = CLASSES.iter().map(|(a, _)| *a).collect();
        return Err(invalid(format!(
            "writing a '{}' model as a Hugging Face directory is not supported yet ({} are)",
            arch.name,
            names.join(", ")
        )));
    };
    let hp = Hparams::from_config(config, false)?;
    // llama.cpp writes Mixtral as a Llama with experts, and Mistral as a Llama (tinynn's
    // converter keeps the window key, which makes it a Mistral again).
    let (arch_name, class) = if hp.n_expert > 0 {
        ("mixtral", "MixtralForCausalLM")
    } else if arch.name == "llama" && hp.swa.is_some() {
        ("mistral", "MistralForCausalLM")
    } else {
        (arch.name, class)
    };
    let src = model.source();
    let has = |name: &str| Ok(src.get(name)?.is_some());
    if has("rope_freqs.weight")? && !matches!(config.rope_scaling, RopeScaling::Llama3 { .. }) {
        return Err(invalid(
            "the RoPE divisors of this file (rope_freqs.weight, as in Llama 3 GGUF files) have no \
             Hugging Face config form: the llama3 scaling parameters they were made from are not \
             in the file"
                .into(),
        ));
    }
    if hp.rope.n_dims != hp.head_dim {
        return Err(invalid(format!(
            "RoPE on {} of {} head dimensions has no {class} config form",
            hp.rope.n_dims, hp.head_dim
        )));
    }
    if let Some(swa) = &hp.swa {
        // Mistral and Mixtral configs window every layer.
        if !matches!(arch_name, "mistral" | "mixtral") || !swa.layers.iter().all(|&w| w) {
            return Err(invalid(format!(
                "sliding-window layers in a '{}' model have no {class} config form",
                arch.name
            )));
        }
    }
    let g = file.gguf();
    let tokenizer_json = if opts.tokenizer {
        match g.get_str(Key::TokenizerModel)? {
            Some("gpt2") => Some(model.tokenizer()?.to_hf_json()?),
            other => {
                return Err(invalid(format!(
                    "the vocabulary (tokenizer.ggml.model = {other:?}) is not written yet \
                     (byte-level BPE, gpt2, is): write the weights alone (`--no-tokenizer`)"
                )))
            }
        }
    } else {
        None
    };
    prepare_dir(out)?;

    let decls = declare(arch.decoder, &hp, &has)?;
    // Each entry: its declaration, and the part of it (an expert of a stacked tensor).
    let mut entries = Vec::with_capacity(decls.len());
    let mut parts: Vec<(usize, Option<usize>)> = Vec::with_capacity(decls.len());
    for (i, d) in decls.iter().enumerate() {
        if let Some(w) = expert_matrix(&d.name) {
            let layer = d.name.split('.').nth(1).unwrap_or("0");
            for x in 0..d.dims[2] {
                entries.push(SafetensorsEntry {
                    name: format!("model.layers.{layer}.block_sparse_moe.experts.{x}.{w}.weight"),
                    dtype: st_dtype,
                    shape: vec![d.dims[1], d.dims[0]],
                });
                parts.push((i, Some(x)));
            }
            continue;
        }
        let hf = (arch.hf_name)(&d.name)
            .ok_or_else(|| invalid(format!("{}: no Hugging Face name", d.name)))?;
        entries.push(SafetensorsEntry {
            name: hf.into_owned(),
            dtype: st_dtype,
            shape: d.dims.iter().rev().copied().collect(),
        });
        parts.push((i, None));
    }
    let weights = out.join("model.safetensors");
    // A tensor that cannot be read stops the writer; its own error is the one returned.
    let mut failed = None;
    // The last stacked tensor's bytes, which its experts' entries (in a row) slice.
    let mut stacked: Option<(usize, Vec<u8>)> = None;
    let written = write_safetensors(&weights, &entries, &[("format", "pt")], |e| {
        let (i, part) = parts[e];
        let d = &decls[i];
        let bytes = |d: &crate::arch::TensorDecl| {
            tensor_bytes(
                model,
                &hp,
                arch.gguf_qk_permuted,
                &d.name,
                &d.dims,
                opts.dtype,
            )
        };
        let result = match part {
            None => bytes(d),
            Some(x) => {
                let made = match stacked.take() {
                    Some((j, b)) if j == i => Ok(b),
                    _ => bytes(d),
                };
                made.map(|all| {
                    let each = all.len() / d.dims[2];
                    let part = all[x * each..(x + 1) * each].to_vec();
                    stacked = Some((i, all));
                    part
                })
            }
        };
        result.map_err(|e| {
            failed = Some(e);
            tinynn_format::Error::Invalid {
                path: weights.clone(),
                message: format!("{}: not written", d.name),
            }
        })
    });
    let bytes = match (written, failed) {
        (Ok(n), _) => n,
        (Err(_), Some(e)) => return Err(e),
        (Err(e), None) => return Err(e.into()),
    };

    let bos = g.get_u64(Key::TokenizerBosId)?;
    let eos = g.get_u64(Key::TokenizerEosId)?;
    let n_vocab = decls
        .iter()
        .find(|d| d.name == "token_embd.weight")
        .and_then(|d| d.dims.get(1).copied())
        .unwrap_or(hp.n_vocab);
    let cfg = config_json(
        arch_name,
        class,
        model,
        &hp,
        n_vocab,
        torch_dtype,
        &has,
        bos,
        eos,
    )?;
    write_json(&out.join("config.json"), &cfg)?;
    let mut generation = Map::new();
    for (k, v) in [("bos_token_id", bos), ("eos_token_id", eos)] {
        if let Some(v) = v {
            generation.insert(k.into(), json!(v));
        }
    }
    write_json(
        &out.join("generation_config.json"),
        &Json::Object(generation),
    )?;

    let mut tokens = 0;
    if let Some(text) = tokenizer_json {
        // Every token's string, made once (a table of the whole vocabulary).
        let strings = model.tokenizer()?.token_strings();
        tokens = strings.len();
        write_text(&out.join("tokenizer.json"), &text)?;
        let piece = |id: Option<u64>| {
            id.and_then(|i| strings.get(i as usize).cloned())
                .map_or(Json::Null, Json::from)
        };
        let mut tc = Map::new();
        tc.insert("tokenizer_class".into(), json!("PreTrainedTokenizerFast"));
        tc.insert("bos_token".into(), piece(bos));
        tc.insert("eos_token".into(), piece(eos));
        tc.insert("clean_up_tokenization_spaces".into(), json!(false));
        if let Some(t) = model.chat_template_source() {
            tc.insert("chat_template".into(), json!(t));
        }
        write_json(&out.join("tokenizer_config.json"), &Json::Object(tc))?;
    }
    Ok(ExportReport {
        architecture: arch_name.to_string(),
        tensors: entries.len(),
        bytes,
        tokens,
    })
}

/// transformers' Mixtral name (`w1`, `w2`, `w3`) of the expert matrices stacked in GGUF tensor
/// `name`, when it is one.
fn expert_matrix(name: &str) -> Option<&'static str> {
    let part = name.strip_suffix(".weight")?.rsplit('.').next()?;
    Some(match part {
        "ffn_gate_exps" => "w1",
        "ffn_down_exps" => "w2",
        "ffn_up_exps" => "w3",
        _ => return None,
    })
}

/// `out` made, or checked empty.
fn prepare_dir(out: &Path) -> Result<()> {
    let err = |e: std::io::Error| ModelError::Invalid(format!("{}: {e}", out.display()));
    if out.exists() {
        if !out.is_dir() {
            return Err(ModelError::Invalid(format!(
                "{}: exists and is not a directory",
                out.display()
            )));
        }
        if std::fs::read_dir(out).map_err(err)?.next().is_some() {
            return Err(ModelError::Invalid(format!(
                "{}: the directory is not empty (nothing is overwritten)",
                out.display()
            )));
        }
    }
    std::fs::create_dir_all(out).map_err(err)
}

/// GGUF tensor `name` (`dims`) as HF bytes of type `ty`: dequantized, q/k rows un-permuted
/// when the file's architecture permutes them.
fn tensor_bytes(
    model: &Model,
    hp: &Hparams,
    qk_permuted: bool,
    name: &str,
    dims: &[usize],
    ty: GgmlType,
) -> Result<Vec<u8>> {
    let weight = model
        .source()
        .get(name)?
        .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
    let n: usize = dims.iter().product();
    let mut values = vec![0f32; n];
    dequantize_row(weight.dtype, weight.data, &mut values)
        .map_err(|e| ModelError::Invalid(format!("{name}: {e}")))?;
    if qk_permuted {
        let heads = match name.rsplit('.').nth(1) {
            Some("attn_q") => Some(hp.n_head),
            Some("attn_k") => Some(hp.n_head_kv),
            _ => None,
        };
        if let Some(heads) = heads {
            let row = if dims.len() == 2 { dims[0] } else { 1 };
            values = super::unpermute_for_rope(&values, heads, row);
        }
    }
    let mut bytes = vec![0u8; n * if ty == GgmlType::F32 { 4 } else { 2 }];
    quantize_row(ty, &values, &mut bytes)
        .map_err(|e| ModelError::Invalid(format!("{name}: {e}")))?;
    Ok(bytes)
}

/// transformers' `config.json` for the model.
#[allow(clippy::too_many_arguments)]
fn config_json(
    arch: &str,
    class: &str,
    model: &Model,
    hp: &Hparams,
    n_vocab: usize,
    torch_dtype: &str,
    has: &dyn Fn(&str) -> Result<bool>,
    bos: Option<u64>,
    eos: Option<u64>,
) -> Result<Json> {
    let c = model.config();
    let mut m = Map::new();
    let mut put = |k: &str, v: Json| {
        m.insert(k.to_string(), v);
    };
    put("architectures", json!([class]));
    put("model_type", json!(arch));
    put("hidden_size", json!(hp.n_embd));
    put("intermediate_size", json!(hp.n_ff));
    put("num_hidden_layers", json!(hp.n_layer));
    put("num_attention_heads", json!(hp.n_head));
    put("num_key_value_heads", json!(hp.n_head_kv));
    put("head_dim", json!(hp.head_dim));
    put("vocab_size", json!(n_vocab));
    put(
        "rms_norm_eps",
        json!(c.norm_eps.unwrap_or(f64::from(hp.norm_eps))),
    );
    put("hidden_act", json!("silu"));
    let theta = c.rope_freq_base.unwrap_or(10_000.0);
    put("rope_theta", json!(theta));
    if let Some(n) = c.n_ctx_train {
        put("max_position_embeddings", json!(n));
    }
    put("tie_word_embeddings", json!(!has("output.weight")?));
    put("torch_dtype", json!(torch_dtype));
    put("bos_token_id", json!(bos));
    put("eos_token_id", json!(eos));
    if arch == "llama" {
        put("attention_bias", json!(has("blk.0.attn_q.bias")?));
        put("mlp_bias", json!(false));
    }
    if hp.n_expert > 0 {
        put("num_local_experts", json!(hp.n_expert));
        put("num_experts_per_tok", json!(hp.n_expert_used));
    }
    match (&hp.swa, arch) {
        (Some(s), "mistral" | "mixtral") => put("sliding_window", json!(s.window)),
        (_, "mistral" | "mixtral" | "qwen2" | "qwen3") => put("sliding_window", Json::Null),
        _ => {}
    }
    if matches!(arch, "qwen2" | "qwen3") {
        put("use_sliding_window", json!(false));
    }
    let scaling = match &c.rope_scaling {
        RopeScaling::None => None,
        RopeScaling::Linear { factor } => Some(json!({"rope_type": "linear", "factor": factor})),
        RopeScaling::Yarn {
            factor,
            original_context,
            attn_factor,
            beta_fast,
            beta_slow,
        } => {
            let mut s = json!({"rope_type": "yarn", "factor": factor});
            for (k, v) in [
                (
                    "original_max_position_embeddings",
                    original_context.map(Json::from),
                ),
                ("attention_factor", attn_factor.map(Json::from)),
                ("beta_fast", beta_fast.map(Json::from)),
                ("beta_slow", beta_slow.map(Json::from)),
            ] {
                if let Some(v) = v {
                    s[k] = v;
                }
            }
            Some(s)
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_context,
        } => Some(json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_context,
        })),
        other => {
            return Err(ModelError::Invalid(format!(
                "RoPE scaling {other:?} has no {class} config form"
            )))
        }
    };
    if let Some(s) = scaling {
        put("rope_scaling", s);
    }
    Ok(Json::Object(m))
}

fn write_text(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))
}

fn write_json(path: &Path, value: &Json) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?;
    write_text(path, &(text + "\n"))
}
