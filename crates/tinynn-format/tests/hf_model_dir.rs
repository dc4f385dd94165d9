//! safetensors files, config.json and whole Hugging Face model directories.

use std::path::Path;

use serde_json::json;
use tinynn_format::hf_config::HfConfig;
use tinynn_format::model_config::{Architecture, ModelConfig, RopeScaling, SwaPattern};
use tinynn_format::model_dir::{HfModelDir, Rearrange};
use tinynn_format::safetensors::{Dtype, SafetensorsFile, SafetensorsHeader};
use tinynn_format::Error;

/// A safetensors file: (name, dtype, shape, byte value) per tensor, element sizes from the dtype.
fn safetensors_bytes(tensors: &[(&str, &str, &[usize], u8)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for &(name, dtype, shape, fill) in tensors {
        let elem = match dtype {
            "F32" | "I32" => 4,
            "F16" | "BF16" => 2,
            _ => 8,
        };
        let n = shape.iter().product::<usize>() * elem;
        header.insert(
            name.into(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + n]}),
        );
        data.resize(data.len() + n, fill);
    }
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let h = serde_json::to_vec(&header).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    out
}

fn llama_config() -> serde_json::Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
        "rms_norm_eps": 1e-6, "rope_theta": 500000.0, "vocab_size": 100,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        "tie_word_embeddings": false, "torch_dtype": "bfloat16", "eos_token_id": [1, 2]
    })
}

fn write_config(dir: &Path) {
    write(dir, "config.json", llama_config().to_string().as_bytes());
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

#[test]
fn safetensors_tensors_are_zero_copy_views() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    write(
        dir.path(),
        "m.safetensors",
        &safetensors_bytes(&[("a", "F32", &[2, 3], 7), ("b", "BF16", &[5], 9)]),
    );
    let f = SafetensorsFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 2);
    let a = f.tensor("a").unwrap();
    assert_eq!(
        (a.dtype, a.shape.as_slice(), a.n_elements()),
        (Dtype::F32, &[2usize, 3][..], 6)
    );
    assert_eq!(f.tensor_data(a), &[7u8; 24][..]);
    assert_eq!(f.tensor_data(f.tensor("b").unwrap()), &[9u8; 10][..]);
    assert_eq!(
        f.header().metadata.get("format").map(String::as_str),
        Some("pt")
    );
}

#[test]
fn bad_safetensors_are_errors_naming_the_file() {
    let good = safetensors_bytes(&[("a", "F32", &[4], 1)]);
    let mut cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("short_len", vec![1, 2, 3]),
        ("huge_header", u64::MAX.to_le_bytes().to_vec()),
        ("truncated", good[..good.len() - 1].to_vec()),
        ("trailing", [good.clone(), vec![0]].concat()),
        (
            "not_json",
            [8u64.to_le_bytes().to_vec(), b"not json".to_vec()].concat(),
        ),
    ];
    let overflow =
        br#"{"a":{"dtype":"F32","shape":[4611686018427387904,8],"data_offsets":[0,16]}}"#;
    cases.push((
        "shape_overflow",
        [
            (overflow.len() as u64).to_le_bytes().to_vec(),
            overflow.to_vec(),
            vec![0; 16],
        ]
        .concat(),
    ));
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in cases {
        assert!(SafetensorsHeader::parse(&bytes).is_err(), "{name} parsed");
        let path = dir.path().join(format!("{name}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let err = SafetensorsFile::open(&path).err().unwrap().to_string();
        assert!(err.contains(&format!("{name}.safetensors")), "{err}");
    }
}

#[test]
fn config_json_becomes_a_typed_config() {
    let c: HfConfig = serde_json::from_value(llama_config()).unwrap();
    let m = ModelConfig::from_hf(&c).unwrap();
    assert_eq!(m.architecture, Architecture::Llama);
    assert_eq!(
        (m.n_embd, m.n_layer, m.n_head, m.n_head_kv, m.head_dim),
        (64, 2, 4, 2, 16)
    );
    assert_eq!(
        (m.n_ff, m.n_vocab, m.n_ctx_train),
        (Some(128), Some(100), Some(256))
    );
    assert_eq!(
        (m.rope_freq_base, m.rope_dims, m.norm_eps),
        (Some(500000.0), Some(16), Some(1e-6))
    );
    assert_eq!(m.tie_word_embeddings, Some(false));
    assert!(
        matches!(m.rope_scaling, RopeScaling::Llama3 { factor, original_context: Some(8192), .. } if factor == 8.0)
    );
    assert_eq!(c.weight_dtype(), Some("bfloat16"));
}

#[test]
fn other_families_parse() {
    let qwen2 = json!({"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
        "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
        "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": true,
        "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}});
    let m = ModelConfig::from_hf(&serde_json::from_value(qwen2).unwrap()).unwrap();
    assert_eq!(
        (m.architecture, m.head_dim, m.n_head_kv),
        (Architecture::Qwen2, 64, 2)
    );
    assert!(matches!(m.rope_scaling, RopeScaling::Yarn { factor, .. } if factor == 4.0));

    let gemma = json!({"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
        "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 256});
    let m = ModelConfig::from_hf(&serde_json::from_value(gemma).unwrap()).unwrap();
    assert_eq!((m.architecture, m.head_dim), (Architecture::Gemma2, 256));
    assert_eq!(
        (m.attn.attn_logit_softcap, m.attn.final_logit_softcap),
        (Some(50.0), Some(30.0))
    );
    assert_eq!(m.attn.query_pre_attn_scalar, Some(256.0));

    // Gemma 3 as transformers >= 5 writes it: per-layer types, RoPE settings per layer type.
    let gemma3 = json!({"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
        "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}});
    let m = ModelConfig::from_hf(&serde_json::from_value(gemma3).unwrap()).unwrap();
    assert_eq!(m.architecture, Architecture::Gemma3);
    assert_eq!(m.rope_freq_base, Some(1_000_000.0));
    assert!(matches!(m.rope_scaling, RopeScaling::Linear { factor } if factor == 8.0));
    assert_eq!(m.attn.sliding_window, Some(512));
    assert_eq!(m.attn.rope_freq_base_swa, Some(10_000.0));
    assert_eq!(
        m.attn.swa_pattern,
        Some(SwaPattern::Layers(vec![true, true, false]))
    );
    // ... and as older versions do: a period and a local base.
    let gemma3_old = json!({"model_type": "gemma3_text", "hidden_size": 640, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512,
        "sliding_window_pattern": 6, "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0});
    let m = ModelConfig::from_hf(&serde_json::from_value(gemma3_old).unwrap()).unwrap();
    assert_eq!(m.attn.swa_pattern, Some(SwaPattern::Period(6)));
    assert_eq!(
        (m.rope_freq_base, m.attn.rope_freq_base_swa),
        (Some(1_000_000.0), Some(10_000.0))
    );

    let gpt2 = json!({"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12,
        "n_positions": 1024, "layer_norm_epsilon": 1e-5, "vocab_size": 50257});
    let m = ModelConfig::from_hf(&serde_json::from_value(gpt2).unwrap()).unwrap();
    assert_eq!(
        (m.architecture, m.n_embd, m.n_ff, m.n_ctx_train),
        (Architecture::Gpt2, 768, Some(3072), Some(1024))
    );
    assert_eq!(
        (m.rope_freq_base, m.tie_word_embeddings),
        (None, Some(true))
    );

    let mistral = json!({"model_type": "mistral", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096});
    let m = ModelConfig::from_hf(&serde_json::from_value(mistral).unwrap()).unwrap();
    assert_eq!(
        (m.architecture, m.head_dim, m.rope_freq_base),
        (Architecture::Mistral, 128, Some(10000.0))
    );
}

#[test]
fn inconsistent_configs_are_errors() {
    for (patch, needle) in [
        (json!({"num_attention_heads": 0}), "head count"),
        (json!({"num_key_value_heads": 3}), "must divide"),
        (json!({"hidden_size": 66}), "not a multiple"),
        (json!({"model_type": null}), "model_type"),
        // Hostile sizes are refused before anything is sized from them, naming key, value and
        // limit.
        (
            json!({"num_hidden_layers": 1u64 << 45}),
            "block count is 35184372088832: more than the limit of 4096",
        ),
        (
            json!({"hidden_size": 1u64 << 40, "num_attention_heads": 1, "num_key_value_heads": 1}),
            "embedding length is 1099511627776: more than the limit of 1048576",
        ),
        (
            json!({"num_attention_heads": 1 << 15, "num_key_value_heads": 1 << 15, "hidden_size": 1 << 15}),
            "head count is 32768",
        ),
        (json!({"head_dim": 1 << 15}), "head dimension is 32768"),
        (
            json!({"head_dim": 1 << 14, "num_attention_heads": 128, "num_key_value_heads": 128}),
            "attention width",
        ),
        (
            json!({"intermediate_size": 1u64 << 30}),
            "feed-forward length is 1073741824",
        ),
        (
            json!({"intermediate_size": 0}),
            "feed-forward length is 0: must be at least 1",
        ),
        (
            json!({"vocab_size": 4294967295u64}),
            "vocabulary size is 4294967295",
        ),
        (json!({"vocab_size": 0}), "vocabulary size is 0"),
        (
            json!({"partial_rotary_factor": 1e9}),
            "partial_rotary_factor is 1000000000: must be in (0, 1]",
        ),
        (
            json!({"partial_rotary_factor": 0.0}),
            "partial_rotary_factor is 0",
        ),
        (
            json!({"rope_theta": -1.0}),
            "RoPE frequency base is -1: must be finite and positive",
        ),
        (json!({"rms_norm_eps": -1.0}), "norm epsilon is -1"),
        (json!({"sliding_window": 0}), "sliding window is 0"),
        (
            json!({"sliding_window": 1u64 << 40}),
            "sliding window is 1099511627776: more than the limit",
        ),
        (
            json!({"sliding_window": 8, "layer_types": ["full_attention"]}),
            "sliding window pattern is 1 flags: must give one flag per block",
        ),
        (
            json!({"sliding_window": 8, "layer_types": ["full_attention", "chunked"]}),
            "layer_types is \"chunked\"",
        ),
        (
            json!({"final_logit_softcapping": -3.0}),
            "final logit softcap is -3: must be finite and positive",
        ),
        (
            json!({"query_pre_attn_scalar": 0.0}),
            "query_pre_attn_scalar is 0",
        ),
        (
            json!({"rope_scaling": {"rope_type": "linear", "factor": 0.0}}),
            "RoPE scaling factor is 0",
        ),
        (
            json!({"model_type": "gpt2", "n_embd": 1u64 << 62, "hidden_size": null, "intermediate_size": null, "num_attention_heads": 1, "num_key_value_heads": 1}),
            "embedding length is 4611686018427387904",
        ),
    ] {
        let mut c = llama_config();
        for (k, v) in patch.as_object().unwrap() {
            c[k] = v.clone();
        }
        let c: HfConfig = serde_json::from_value(c).unwrap();
        let err = ModelConfig::from_hf(&c).unwrap_err().to_string();
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn model_dir_single_file() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    write(
        dir.path(),
        "model.safetensors",
        &safetensors_bytes(&[("x", "BF16", &[4, 4], 1), ("y", "F32", &[4], 2)]),
    );
    write(dir.path(), "tokenizer.json", b"{}");
    let m = HfModelDir::open(dir.path()).unwrap();
    assert!(HfModelDir::is_model_dir(dir.path()));
    assert_eq!(m.n_tensors(), 2);
    assert_eq!(
        m.tokenizer_json.as_deref(),
        Some(dir.path().join("tokenizer.json").as_path())
    );
    let (file, t) = m.tensor("y").unwrap();
    assert_eq!(file.tensor_data(t), &[2u8; 16][..]);
}

#[test]
fn model_dir_sharded_with_index() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    write(
        dir.path(),
        "model-00001-of-00002.safetensors",
        &safetensors_bytes(&[("a", "F16", &[8], 1)]),
    );
    write(
        dir.path(),
        "model-00002-of-00002.safetensors",
        &safetensors_bytes(&[("b", "F16", &[8], 2)]),
    );
    let index = json!({"metadata": {"total_size": 32}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}});
    write(
        dir.path(),
        "model.safetensors.index.json",
        index.to_string().as_bytes(),
    );
    let m = HfModelDir::open(dir.path()).unwrap();
    assert_eq!(
        (m.shards.len(), m.n_tensors(), m.tokenizer_json.is_none()),
        (2, 2, true)
    );
    assert_eq!(
        m.tensor("b").unwrap().0.path().file_name().unwrap(),
        "model-00002-of-00002.safetensors"
    );

    // The index must not point outside the directory, and must agree with the shards.
    for (weight_map, needle) in [
        (
            json!({"a": "../model-00001-of-00002.safetensors"}),
            "not a plain file name",
        ),
        (
            json!({"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}),
            "but found in",
        ),
        (
            json!({"zzz": "model-00001-of-00002.safetensors"}),
            "not found there",
        ),
        (json!({"a": "missing.safetensors"}), "missing.safetensors"),
    ] {
        let index = json!({"weight_map": weight_map});
        write(
            dir.path(),
            "model.safetensors.index.json",
            index.to_string().as_bytes(),
        );
        let err = HfModelDir::open(dir.path()).err().unwrap().to_string();
        assert!(err.contains(needle), "{err}");
    }
}

#[test]
fn model_dir_problems_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let err = HfModelDir::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("config.json is missing"), "{err}");
    write_config(dir.path());
    let err = HfModelDir::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("no *.safetensors"), "{err}");
    write(
        dir.path(),
        "config.json",
        b"{\n  \"hidden_size\": \"big\"\n}",
    );
    match HfModelDir::open(dir.path()) {
        Err(Error::Json {
            line,
            column,
            message,
            ..
        }) => {
            assert_eq!(line, 2, "{message}");
            assert!(column > 0 && message.contains("invalid type"), "{message}");
        }
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("a string hidden_size was accepted"),
    }
    write_config(dir.path());
    write(
        dir.path(),
        "a.safetensors",
        &safetensors_bytes(&[("x", "F32", &[1], 0)]),
    );
    write(
        dir.path(),
        "b.safetensors",
        &safetensors_bytes(&[("x", "F32", &[1], 0)]),
    );
    let err = HfModelDir::open(dir.path()).err().unwrap().to_string();
    assert!(err.contains("more than one weight file"), "{err}");
}

/// A GGUF whose block count names blocks the file does not hold is refused before any buffer
/// is sized from it; a file without block tensors (vocabulary only) is not held to it.
#[test]
fn gguf_block_count_must_match_the_blocks_present() {
    use tinynn_format::gguf::{Gguf, GgufWriter, Key, Value};
    use tinynn_format::GgmlType;
    let data = [0u8; 64 * 4];
    let config = |blocks: u32, with_tensors: bool| {
        let mut w = GgufWriter::new();
        w.set_str("general.architecture", "llama");
        w.set_key(Key::BlockCount, Value::U32(blocks)).unwrap();
        w.set_key(Key::EmbeddingLength, Value::U32(64)).unwrap();
        w.set_key(Key::HeadCount, Value::U32(4)).unwrap();
        if with_tensors {
            for b in 0..2 {
                let name = format!("blk.{b}.attn_norm.weight");
                w.add_tensor(&name, GgmlType::F32, &[64], &data).unwrap();
            }
        }
        let mut bytes = Vec::new();
        w.write_to(&mut bytes).unwrap();
        ModelConfig::from_gguf(&Gguf::parse(&bytes).unwrap())
    };
    assert_eq!(config(2, true).unwrap().n_layer, 2);
    assert_eq!(config(3, false).unwrap().n_layer, 3);
    let err = config(3, true).unwrap_err().to_string();
    assert!(
        err.contains("llama.block_count is 3: the file has no tensors of its last block"),
        "{err}"
    );
    let err = config(1 << 30, true).unwrap_err().to_string();
    assert!(err.contains("more than the limit of 4096"), "{err}");
}

/// `rearrange` copies the selected matrices transposed (F32 and F16 alike), leaves the others
/// to the file, is done once, refuses what does not fit, and regroups rows part-major.
#[test]
fn selected_matrices_are_transposed_once() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    // a: F32 [2, 3] = 0..6; b: F16 [3, 2] = 10..16; c: F32 [4].
    let a: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let b: Vec<u8> = (10..16)
        .flat_map(|i| half::f16::from_f32(i as f32).to_le_bytes())
        .collect();
    let c: Vec<u8> = (0..4).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let header = json!({
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "F16", "shape": [3, 2], "data_offsets": [24, 36]},
        "c": {"dtype": "F32", "shape": [4], "data_offsets": [36, 52]},
    });
    let h = serde_json::to_vec(&header).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend(a.iter().chain(&b).chain(&c));
    write(dir.path(), "model.safetensors", &bytes);

    let d = HfModelDir::open(dir.path()).unwrap();
    assert!(d.transposed("a").is_none() && d.transposed_bytes().is_empty());
    let t = |n: &str| (n == "a" || n == "b").then_some(Rearrange::Transpose);
    let refused = d
        .rearrange(|n| (n == "c").then_some(Rearrange::Transpose))
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("c: shape [4] does not fit Transpose"),
        "{refused}"
    );
    d.rearrange(t).unwrap();
    let f32s = |x: &[u8]| -> Vec<f32> {
        x.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    assert_eq!(f32s(d.transposed("a").unwrap()), [0., 3., 1., 4., 2., 5.]);
    let b_t: Vec<f32> = d
        .transposed("b")
        .unwrap()
        .chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect();
    assert_eq!(b_t, [10., 12., 14., 11., 13., 15.]);
    assert_eq!(d.transposed("b").unwrap().as_ptr() as usize % 64, 0);
    assert!(d.transposed("c").is_none());
    // A later call with another selection changes nothing.
    d.rearrange(|_| Some(Rearrange::Transpose)).unwrap();
    assert!(d.transposed("c").is_none());

    // Rows of 2 groups × 3 parts (1 row each) of a [6, 1] tensor regrouped part-major.
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let rows: Vec<u8> = (0..6).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let header = json!({"qkv": {"dtype": "F32", "shape": [6, 1], "data_offsets": [0, 24]}});
    let h = serde_json::to_vec(&header).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend(&rows);
    write(dir.path(), "model.safetensors", &bytes);
    let d = HfModelDir::open(dir.path()).unwrap();
    let bad = d.rearrange(|_| {
        Some(Rearrange::GroupRows {
            groups: 4,
            parts: 3,
        })
    });
    assert!(bad.unwrap_err().to_string().contains("does not fit"));
    d.rearrange(|_| {
        Some(Rearrange::GroupRows {
            groups: 2,
            parts: 3,
        })
    })
    .unwrap();
    assert_eq!(f32s(d.transposed("qkv").unwrap()), [0., 3., 1., 4., 2., 5.]);

    // A 1-D BF16 tensor (GPT-NeoX's fused q/k/v bias) is regrouped from its F32 copy.
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    let rows: Vec<u8> = (0..6)
        .flat_map(|i| half::bf16::from_f32(i as f32).to_le_bytes())
        .collect();
    let header = json!({"bias": {"dtype": "BF16", "shape": [6], "data_offsets": [0, 12]}});
    let h = serde_json::to_vec(&header).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend(&rows);
    write(dir.path(), "model.safetensors", &bytes);
    let d = HfModelDir::open(dir.path()).unwrap();
    d.rearrange(|_| {
        Some(Rearrange::GroupRows {
            groups: 2,
            parts: 3,
        })
    })
    .unwrap();
    let r = d.rearranged("bias").unwrap();
    assert_eq!(r.dtype, tinynn_format::safetensors::Dtype::F32);
    assert_eq!(f32s(r.bytes), [0., 3., 1., 4., 2., 5.]);
}
