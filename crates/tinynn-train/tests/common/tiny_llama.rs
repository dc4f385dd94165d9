//! A tiny random Llama (2 layers, dim 32, 4 heads / 2 KV, head size 8, vocab 64, tied head)
//! shared by the LoRA, export and allocation tests, and a GGUF writer for a trainer's weights.

use std::path::Path;

use tinynn_format::gguf::{GgufWriter, Value};
use tinynn_format::model_config::{Architecture, ModelConfig, RopeScaling};
use tinynn_format::GgmlType;
use tinynn_train::{TrainSource, Trainer};

pub const V: usize = 64;

/// The model's config with feed-forward size `n_ff`.
pub fn config(n_ff: u64) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        n_vocab: Some(V as u64),
        n_ctx_train: Some(64),
        n_embd: 32,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 8,
        n_ff: Some(n_ff),
        norm_eps: Some(1e-5),
        rope_dims: None,
        rope_freq_base: Some(10000.0),
        rope_scaling: RopeScaling::None,
        tie_word_embeddings: Some(true),
        parallel_residual: None,
        attn: Default::default(),
        experts: None,
        ssm: None,
    }
}

/// Random init of [`config`]`(n_ff)` with `seed`.
pub fn random(n_ff: u64, seed: u64) -> TrainSource<'static> {
    TrainSource::Random {
        config: Box::new(config(n_ff)),
        seed,
    }
}

/// Writes `t`'s weights as a GGUF file with Llama metadata from its config: matrices as `ty`,
/// 1-D tensors as F32, and the string keys `extra`.
pub fn write_gguf(t: &Trainer, path: &Path, ty: GgmlType, extra: &[(&str, &str)]) {
    let c = t.config();
    let mut w = GgufWriter::new();
    w.set_str("general.architecture", "llama");
    for (k, v) in extra {
        w.set_str(k, v);
    }
    for (k, v) in [
        ("llama.block_count", c.n_layer),
        ("llama.context_length", c.n_ctx_train.unwrap()),
        ("llama.embedding_length", c.n_embd),
        ("llama.feed_forward_length", c.n_ff.unwrap()),
        ("llama.attention.head_count", c.n_head),
        ("llama.attention.head_count_kv", c.n_head_kv),
        ("llama.vocab_size", c.n_vocab.unwrap()),
    ] {
        w.set(k, Value::U32(v as u32));
    }
    w.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
    w.set("llama.rope.freq_base", Value::F32(10000.0));
    let params = t.params().unwrap();
    let encoded: Vec<(GgmlType, Vec<u8>)> = params
        .iter()
        .map(|p| {
            let tt = if p.dims.len() == 1 { GgmlType::F32 } else { ty };
            let row = tinynn_core::quant::row_bytes(tt, p.dims[0]).unwrap();
            let mut b = vec![0u8; row * p.data.len() / p.dims[0]];
            tinynn_core::quant::quantize_row(tt, &p.data, &mut b).unwrap();
            (tt, b)
        })
        .collect();
    for (p, (tt, b)) in params.iter().zip(&encoded) {
        let dims: Vec<u64> = p.dims.iter().map(|&d| d as u64).collect();
        w.add_tensor(&p.name, *tt, &dims, b).unwrap();
    }
    w.write_atomic(path).unwrap();
}
