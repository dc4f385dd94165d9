//! `tnn convert`: a Hugging Face directory as the GGUF file llama.cpp's converter would write —
//! its tensor names, its layout changes and its metadata keys — for every registered
//! architecture.
//!
//! - **Tensors**: exactly those the architecture's decoder reads ([`crate::arch::declare`] over
//!   the directory), fetched through [`crate::weights::WeightSource`] (HF names mapped, GPT-2's `Conv1D` weights
//!   transposed); q/k rows permuted for RoPE on adjacent pairs where llama.cpp does it
//!   (`Arch::gguf_qk_permuted`: Llama, Mistral); Gemma's norm weights stored as `1 + w`.
//!   Matrices become F32, F16 or BF16; 1-D tensors stay F32, as llama.cpp writes them.
//!   Quantized outputs are this file requantized by `crate::quantize` (the CLI does that).
//!   Llama 3's RoPE frequency divisors become a `rope_freqs.weight` tensor.
//! - **Metadata**: the config's shape, RoPE, sliding window and soft-caps under llama.cpp's
//!   keys, the chat template, and the vocabulary of `tokenizer.json` (byte-level or
//!   SentencePiece BPE, [`vocab_json`]).

pub mod to_hf;
pub mod vocab_json;

use std::path::Path;

use tinynn_core::quant::{dequantize_row, quantize_row};
use tinynn_format::gguf::{Array, GgufWriter, Key, Value};
use tinynn_format::model_config::{ModelConfig, RopeScaling};
use tinynn_format::GgmlType;

use crate::arch::{self, declare, Hparams};
use crate::model::Model;
use crate::{ModelError, Result};

/// How to convert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvertOptions {
    /// F32, F16 or BF16 for the matrices.
    pub out_type: GgmlType,
    /// Write the vocabulary of `tokenizer.json` (an error when it is missing or not
    /// convertible); false: a file of weights and shape only.
    pub tokenizer: bool,
}

/// What was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConvertReport {
    pub architecture: String,
    pub tensors: usize,
    pub bytes: u64,
    /// Tokens of the vocabulary written (0: none).
    pub tokens: usize,
}

/// Converts the HF model `model` (opened from a directory) into a GGUF file at `out`, written
/// atomically.
pub fn convert_hf(model: &Model, out: &Path, opts: &ConvertOptions) -> Result<ConvertReport> {
    if !matches!(
        opts.out_type,
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16
    ) {
        return Err(ModelError::Invalid(format!(
            "converting to {} directly: write F32, F16 or BF16 (then `tnn quantize`)",
            opts.out_type
        )));
    }
    let src = model.source();
    if !src.is_hf() {
        return Err(ModelError::Invalid(format!(
            "{} is a GGUF file already (convert takes a Hugging Face directory)",
            model.path().display()
        )));
    }
    let config = model.config();
    let arch = arch::of_config(config)?;
    let hp = Hparams::from_config(config, true)?;
    let has = |name: &str| Ok(src.get(name)?.is_some());
    let decls = declare(arch.decoder, &hp, &has)?;

    let mut w = GgufWriter::new();
    // llama.cpp's converter writes Mistral as a Llama (llama.cpp has no `mistral`
    // architecture); the window key stays, which tinynn's Llama decoder honours.
    let gguf_arch = match arch.name {
        "mistral" => "llama",
        name => name,
    };
    write_config(&mut w, gguf_arch, config, &hp, opts.out_type)?;
    if let Some(t) = model.chat_template_source() {
        w.set_str(&Key::TokenizerChatTemplate.resolve(""), t);
    }
    let tokens = if opts.tokenizer {
        vocab(model, &mut w)?
    } else {
        0
    };

    let mut encoded: Vec<(String, GgmlType, Vec<u64>, Vec<u8>)> = Vec::with_capacity(decls.len());
    for d in &decls {
        let weight = src
            .get(&d.name)?
            .ok_or_else(|| ModelError::MissingTensor(d.name.clone()))?;
        let n: usize = d.dims.iter().product();
        let mut values = vec![0f32; n];
        dequantize_row(weight.dtype, weight.data, &mut values)
            .map_err(|e| ModelError::Invalid(format!("{}: {e}", d.name)))?;
        if arch.gguf_qk_permuted {
            let heads = match d.name.rsplit('.').nth(1) {
                Some("attn_q") => Some(hp.n_head),
                Some("attn_k") => Some(hp.n_head_kv),
                _ => None,
            };
            if let Some(heads) = heads {
                let row = if d.dims.len() == 2 { d.dims[0] } else { 1 };
                values = permute_for_rope(&values, heads, row);
            }
        }
        if arch.gguf_norm_plus_one && d.name.ends_with("norm.weight") {
            // transformers multiplies by 1 + w; llama.cpp's converter stores 1 + w.
            values.iter_mut().for_each(|v| *v += 1.0);
        }
        let mut dims = d.dims.clone();
        if let Some((to_gguf, _)) = arch.gguf_rewrite {
            to_gguf(&d.name, &mut dims, &mut values);
        }
        // Vectors, and Mamba's A and convolution (which llama.cpp keeps in F32), stay F32.
        let keep_f32 = d.name.ends_with(".ssm_a") || d.name.contains(".ssm_conv1d.");
        let ty = if dims.len() == 1 || keep_f32 {
            GgmlType::F32
        } else {
            opts.out_type
        };
        let bytes_per = if ty == GgmlType::F32 { 4 } else { 2 };
        let mut bytes = vec![0u8; n * bytes_per];
        quantize_row(ty, &values, &mut bytes)
            .map_err(|e| ModelError::Invalid(format!("{}: {e}", d.name)))?;
        let dims = dims.iter().map(|&x| x as u64).collect();
        encoded.push((d.name.clone(), ty, dims, bytes));
    }
    // RoPE divisors as llama.cpp keeps them: Llama 3's one set, LongRoPE's short and long.
    let divisors: Vec<(&str, Option<&Vec<f32>>)> = match &hp.longrope {
        None => vec![("rope_freqs.weight", hp.freq_factors.as_ref())],
        Some(l) => vec![
            ("rope_factors_short.weight", hp.freq_factors.as_ref()),
            ("rope_factors_long.weight", l.long.as_ref()),
        ],
    };
    for (name, f) in divisors {
        if let Some(f) = f {
            let bytes = f.iter().flat_map(|x| x.to_le_bytes()).collect();
            encoded.push((name.into(), GgmlType::F32, vec![f.len() as u64], bytes));
        }
    }
    for (name, ty, dims, bytes) in &encoded {
        w.add_tensor(name, *ty, dims, bytes)?;
    }
    let bytes = w.write_atomic(out)?;
    Ok(ConvertReport {
        architecture: arch.name.to_string(),
        tensors: encoded.len(),
        bytes,
        tokens,
    })
}

/// The rows of q or k (`heads` heads of `rows/heads` rows, each `row` values) reordered as
/// llama.cpp's converter does for RoPE on adjacent pairs: within each head, rows
/// `0, h, 1, h+1, …` of the two halves interleaved (`h` = half the head's rows).
fn permute_for_rope(values: &[f32], heads: usize, row: usize) -> Vec<f32> {
    reorder_for_rope(values, heads, row, true)
}

/// The inverse of [`permute_for_rope`]: a GGUF file's q or k rows back in transformers' order.
pub(crate) fn unpermute_for_rope(values: &[f32], heads: usize, row: usize) -> Vec<f32> {
    reorder_for_rope(values, heads, row, false)
}

/// Row `half·j + i` of each head in transformers' order is row `2i + j` in llama.cpp's;
/// `to_gguf` moves rows that way, else back.
fn reorder_for_rope(values: &[f32], heads: usize, row: usize, to_gguf: bool) -> Vec<f32> {
    let rows = values.len() / row;
    let per_head = rows / heads;
    let half = per_head / 2;
    let mut out = vec![0f32; values.len()];
    for h in 0..heads {
        for i in 0..half {
            for (j, hf) in [i, half + i].into_iter().enumerate() {
                let (hf, gguf) = (h * per_head + hf, h * per_head + 2 * i + j);
                let (src, dst) = if to_gguf { (hf, gguf) } else { (gguf, hf) };
                out[dst * row..][..row].copy_from_slice(&values[src * row..][..row]);
            }
        }
    }
    out
}

/// The vocabulary of the directory's `tokenizer.json` into `w`; the token count.
fn vocab(model: &Model, w: &mut GgufWriter<'_>) -> Result<usize> {
    let crate::weights::WeightSource::Hf(d) = model.source() else {
        return Ok(0);
    };
    let Some(path) = &d.tokenizer_json else {
        return Err(ModelError::Invalid(format!(
            "{}: no tokenizer.json (convert without the tokenizer, `tnn convert --no-tokenizer`, to write the weights alone)",
            d.dir.display()
        )));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))?;
    use crate::model::first;
    vocab_json::write_vocab(
        w,
        &json,
        first(&d.config.bos_token_id),
        first(&d.config.eos_token_id),
    )
    .map_err(|e| ModelError::Invalid(format!("{}: {e}", path.display())))
}

/// llama.cpp's metadata keys for a Mamba model: no attention or feed-forward (their counts
/// 0), a context of 2^20 when the config states none (the scan has no position limit), and
/// the SSM sizes.
fn write_ssm_config(
    w: &mut GgufWriter<'_>,
    arch: &str,
    c: &ModelConfig,
    x: &tinynn_format::model_config::Ssm,
    eps: f32,
) -> Result<()> {
    let key = |k: Key| k.resolve(arch).into_owned();
    let u32_of = |what: &str, v: u64| {
        u32::try_from(v)
            .map_err(|_| ModelError::Invalid(format!("{what} {v} does not fit a GGUF u32")))
    };
    let n_ctx = c.n_ctx_train.unwrap_or(1 << 20);
    for (k, what, v) in [
        (Key::ContextLength, "context length", n_ctx),
        (Key::EmbeddingLength, "embedding", c.n_embd),
        (Key::BlockCount, "blocks", c.n_layer),
        (Key::FeedForwardLength, "feed-forward", 0),
        (Key::HeadCount, "heads", 0),
        (Key::SsmConvKernel, "SSM convolution", x.conv_kernel),
        (Key::SsmInnerSize, "SSM inner size", x.inner_size),
        (Key::SsmStateSize, "SSM state size", x.state_size),
        (Key::SsmTimeStepRank, "SSM time-step rank", x.time_step_rank),
    ] {
        w.set(&key(k), Value::U32(u32_of(what, v)?));
    }
    w.set(&key(Key::LayerNormRmsEpsilon), Value::F32(eps));
    if let Some(n) = c.n_vocab {
        w.set(&key(Key::VocabSize), Value::U32(u32_of("vocabulary", n)?));
    }
    Ok(())
}

/// llama.cpp's metadata keys for `c`.
fn write_config(
    w: &mut GgufWriter<'_>,
    arch: &str,
    c: &ModelConfig,
    hp: &Hparams,
    ty: GgmlType,
) -> Result<()> {
    let key = |k: Key| k.resolve(arch).into_owned();
    let u32_of = |what: &str, v: u64| {
        u32::try_from(v)
            .map_err(|_| ModelError::Invalid(format!("{what} {v} does not fit a GGUF u32")))
    };
    w.set_str("general.architecture", arch);
    // llama.cpp's LLAMA_FTYPE: ALL_F32 0, MOSTLY_F16 1, MOSTLY_BF16 32.
    let ftype = match ty {
        GgmlType::F16 => 1,
        GgmlType::Bf16 => 32,
        _ => 0,
    };
    w.set("general.file_type", Value::U32(ftype));
    if let Some(x) = &c.ssm {
        return write_ssm_config(w, arch, c, x, hp.norm_eps);
    }
    if let Some(n) = c.n_ctx_train {
        w.set(
            &key(Key::ContextLength),
            Value::U32(u32_of("context length", n)?),
        );
    }
    w.set(
        &key(Key::EmbeddingLength),
        Value::U32(u32_of("embedding", c.n_embd)?),
    );
    w.set(
        &key(Key::BlockCount),
        Value::U32(u32_of("blocks", c.n_layer)?),
    );
    w.set(
        &key(Key::FeedForwardLength),
        Value::U32(u32_of("feed-forward", hp.n_ff as u64)?),
    );
    w.set(&key(Key::HeadCount), Value::U32(u32_of("heads", c.n_head)?));
    w.set(
        &key(Key::HeadCountKv),
        Value::U32(u32_of("KV heads", c.n_head_kv)?),
    );
    if c.head_dim * c.n_head != c.n_embd {
        let hd = Value::U32(u32_of("head dimension", c.head_dim)?);
        w.set(&key(Key::KeyLength), hd.clone());
        w.set(&key(Key::ValueLength), hd);
    }
    // GPT-2 and GPT-NeoX use LayerNorms; GPT-2 alone has no RoPE.
    let eps = Value::F32(hp.norm_eps);
    if matches!(arch, "gpt2" | "gptneox") {
        w.set(&key(Key::LayerNormEpsilon), eps);
    } else {
        w.set(&key(Key::LayerNormRmsEpsilon), eps);
    }
    if arch != "gpt2" {
        let base = c.rope_freq_base.unwrap_or(10_000.0) as f32;
        w.set(
            &key(Key::RopeDimensionCount),
            Value::U32(hp.rope.n_dims as u32),
        );
        w.set(&key(Key::RopeFreqBase), Value::F32(base));
    }
    if arch == "gptneox" {
        w.set(
            &key(Key::UseParallelResidual),
            Value::Bool(hp.parallel_residual),
        );
    }
    match &c.rope_scaling {
        RopeScaling::None => {}
        RopeScaling::Linear { factor } => {
            w.set_str(&key(Key::RopeScalingType), "linear");
            w.set(&key(Key::RopeScalingFactor), Value::F32(*factor as f32));
        }
        RopeScaling::Yarn {
            factor,
            original_context,
            attn_factor,
            beta_fast,
            beta_slow,
        } => {
            w.set_str(&key(Key::RopeScalingType), "yarn");
            w.set(&key(Key::RopeScalingFactor), Value::F32(*factor as f32));
            if let Some(n) = original_context {
                let n = u32_of("original context", *n)?;
                w.set(&key(Key::RopeScalingOriginalContextLength), Value::U32(n));
            }
            for (k, v) in [
                (Key::RopeScalingAttnFactor, attn_factor),
                (Key::RopeScalingYarnBetaFast, beta_fast),
                (Key::RopeScalingYarnBetaSlow, beta_slow),
            ] {
                if let Some(v) = v {
                    w.set(&key(k), Value::F32(*v as f32));
                }
            }
        }
        // Llama 3: the frequency divisors go in a `rope_freqs.weight` tensor, as llama.cpp
        // writes them (see `convert_hf`).
        RopeScaling::Llama3 { .. } => {}
        // LongRoPE: the divisors are tensors too; the cos/sin scale and the context the short
        // ones serve are keys (no scaling type, as llama.cpp writes Phi-3 files).
        RopeScaling::LongRope {
            original_context, ..
        } => {
            w.set(
                &key(Key::RopeScalingAttnFactor),
                Value::F32(hp.rope.attn_factor),
            );
            if let Some(n) = original_context {
                let n = u32_of("original context", *n)?;
                w.set(&key(Key::RopeScalingOriginalContextLength), Value::U32(n));
            }
        }
        other => {
            return Err(ModelError::Invalid(format!(
                "RoPE scaling {other:?} is not converted yet"
            )))
        }
    }
    if let Some(n) = c.n_vocab {
        w.set(&key(Key::VocabSize), Value::U32(u32_of("vocabulary", n)?));
    }
    if let Some(s) = &hp.swa {
        w.set(
            &key(Key::SlidingWindow),
            Value::U32(u32_of("sliding window", s.window as u64)?),
        );
        w.set(
            &key(Key::SlidingWindowPattern),
            Value::Array(Array::Bool(s.layers.clone())),
        );
        if let Some(base) = c.attn.rope_freq_base_swa {
            w.set(&key(Key::RopeFreqBaseSwa), Value::F32(base as f32));
        }
    }
    if let Some(cap) = c.attn.attn_logit_softcap {
        w.set(&key(Key::AttnLogitSoftcapping), Value::F32(cap as f32));
    }
    if let Some(cap) = c.attn.final_logit_softcap {
        w.set(&key(Key::FinalLogitSoftcapping), Value::F32(cap as f32));
    }
    if let Some(x) = c.experts {
        w.set(
            &key(Key::ExpertCount),
            Value::U32(u32_of("experts", x.count)?),
        );
        w.set(
            &key(Key::ExpertUsedCount),
            Value::U32(u32_of("experts used", x.used)?),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{permute_for_rope, unpermute_for_rope};

    #[test]
    fn rope_permutation_interleaves_each_heads_halves() {
        // 2 heads of 4 rows, rows of 1 value: head h rows [a0 a1 b0 b1] → [a0 b0 a1 b1].
        let v: Vec<f32> = (0..8).map(|i| i as f32).collect();
        assert_eq!(permute_for_rope(&v, 2, 1), [0., 2., 1., 3., 4., 6., 5., 7.]);
        // Rows of 3 values move whole.
        let v: Vec<f32> = (0..12).map(|i| i as f32).collect();
        assert_eq!(
            permute_for_rope(&v, 1, 3),
            [0., 1., 2., 6., 7., 8., 3., 4., 5., 9., 10., 11.]
        );
    }

    #[test]
    fn unpermuting_undoes_the_permutation() {
        for (heads, per_head, row) in [(1, 4, 1), (2, 4, 3), (3, 8, 5), (4, 16, 2)] {
            let v: Vec<f32> = (0..heads * per_head * row).map(|i| i as f32).collect();
            let p = permute_for_rope(&v, heads, row);
            assert_ne!(p, v);
            assert_eq!(unpermute_for_rope(&p, heads, row), v);
        }
    }
}
