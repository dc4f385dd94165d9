//! tinynn-train against PyTorch on tiny random models (committed fixtures from
//! scripts/make-train-fixtures.py and scripts/make-zoo-train-fixtures.py): the loss and EVERY
//! parameter gradient of one step within 1e-4 (per tensor, max|a − b| / max|b|), and 10 AdamW
//! steps' losses within 1e-4 relative; and LoRA against peft (scripts/make-lora-fixtures.py):
//! with every projection adapted and A, B both non-zero, the loss and every A and B gradient.
//! Normal (multi-threaded, non-strict) mode.

mod common;

use common::{expected, fixture_dir, rel_err, torch_grads, train_config};
use tinynn_format::model_dir::HfModelDir;
use tinynn_train::Trainer;

const TOL: f64 = 1e-4;

/// Every gradient of `grads` within [`TOL`] of the reference `want(name)` gives: the worst
/// relative error and its tensor.
fn worst_gradient(
    name: &str,
    grads: &[tinynn_train::NamedTensor],
    want: impl Fn(&str) -> Option<Vec<f32>>,
) -> (f64, String) {
    let mut worst = (0f64, String::new());
    for g in grads {
        let w = want(&g.name)
            .unwrap_or_else(|| panic!("{name}: the reference has no gradient for {}", g.name));
        let err = rel_err(&g.data, &w);
        assert!(
            err <= TOL,
            "{name}: gradient of {} off by {err:.3e}",
            g.name
        );
        if err > worst.0 {
            worst = (err, g.name.clone());
        }
    }
    worst
}

fn gradients_match(name: &str, threads: usize, strict: bool) {
    let e = expected(name);
    let dir = HfModelDir::open(fixture_dir(name)).unwrap();
    let mut t = Trainer::new(&dir, train_config(&e, threads, strict)).unwrap();
    let (loss, grads) = t.gradients(&e.ids, &e.labels).unwrap();
    let want = torch_grads(name);
    assert_eq!(grads.len(), want.len(), "parameter count");
    let loss_err = f64::from((loss - e.loss).abs()) / f64::from(e.loss.abs());
    let worst = worst_gradient(name, &grads, |n| want.get(n).cloned());
    println!(
        "{name} (threads {threads}, strict {strict}): loss {loss} vs {} (rel {loss_err:.2e}); worst gradient {} rel {:.2e}",
        e.loss, worst.1, worst.0
    );
    assert!(loss_err <= TOL, "{name}: loss {loss} vs {}", e.loss);
}

/// LoRA (`--targets all`, rank 4, alpha 8, no dropout) from peft's A and B: the loss and the
/// gradient of every adapter tensor within 1e-4 of peft's, and peft adapted exactly the
/// projections tinynn does.
fn lora_gradients_match(name: &str) {
    use tinynn_format::safetensors::SafetensorsFile;
    use tinynn_train::{LoraConfig, NamedTensor, Targets};
    let e = expected(name);
    let dir = HfModelDir::open(fixture_dir(name)).unwrap();
    let want: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir(name).join("lora.json")).unwrap(),
    )
    .unwrap();
    let mut cfg = train_config(&e, 2, false);
    cfg.lora = Some(LoraConfig {
        rank: want["rank"].as_u64().unwrap() as usize,
        alpha: want["alpha"].as_f64().unwrap() as f32,
        dropout: 0.0,
        targets: Targets::parse(want["targets"].as_str().unwrap_or("all")).unwrap(),
        seed: 1,
    });
    let mut t = Trainer::new(&dir, cfg).unwrap();
    let f = SafetensorsFile::open(fixture_dir(name).join("lora.safetensors")).unwrap();
    let values = |t: &tinynn_format::safetensors::SafetensorsTensor| -> Vec<f32> {
        f.tensor_data(t)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let init: Vec<NamedTensor> = f
        .tensors()
        .iter()
        .filter(|t| !t.name.ends_with(".grad"))
        .map(|t| NamedTensor {
            name: t.name.clone(),
            dims: t.shape.iter().rev().copied().collect(),
            data: values(t),
        })
        .collect();
    let mut ours: Vec<&str> = t.param_specs().iter().map(|p| p.name.as_str()).collect();
    let mut theirs: Vec<&str> = init.iter().map(|t| t.name.as_str()).collect();
    ours.sort_unstable();
    theirs.sort_unstable();
    assert_eq!(ours, theirs, "{name}: adapted tensors");
    t.load_params(&init).unwrap();
    let (loss, grads) = t.gradients(&e.ids, &e.labels).unwrap();
    let want_loss = want["loss"].as_f64().unwrap();
    let loss_err = (f64::from(loss) - want_loss).abs() / want_loss;
    let worst = worst_gradient(name, &grads, |n| {
        let grad = format!("{n}.grad");
        f.tensors().iter().find(|t| t.name == grad).map(&values)
    });
    println!(
        "{name} LoRA: loss {loss} vs peft {want_loss} (rel {loss_err:.2e}); worst of {} adapter gradients {} rel {:.2e}",
        grads.len(),
        worst.1,
        worst.0
    );
    assert!(loss_err <= TOL, "{name}: LoRA loss {loss} vs {want_loss}");
}

/// Every architecture's LoRA against peft.
#[test]
fn lora_loss_and_adapter_gradients_match_peft_on_every_architecture() {
    for name in [
        "train-llama",
        "train-qwen2-tied",
        "train-gemma",
        "train-gemma2",
        "train-gemma3",
        "train-gpt2",
        "train-gptneox",
        "train-phi3",
        "train-mixtral",
        "train-mamba",
    ] {
        lora_gradients_match(name);
    }
}

fn adamw_losses_match(name: &str) {
    let e = expected(name);
    let dir = HfModelDir::open(fixture_dir(name)).unwrap();
    let mut t = Trainer::new(&dir, train_config(&e, 2, false)).unwrap();
    let mut worst = 0f64;
    for (s, &want) in e.adamw_losses.iter().enumerate() {
        let r = t.step(&e.ids, &e.labels, 1e-3).unwrap();
        assert!(!r.skipped);
        let err = f64::from((r.loss - want).abs()) / f64::from(want.abs());
        println!(
            "{name} step {}: loss {} vs {want} (rel {err:.2e})",
            s + 1,
            r.loss
        );
        assert!(
            err <= TOL,
            "{name}: step {} loss {} vs {want}",
            s + 1,
            r.loss
        );
        worst = worst.max(err);
    }
    println!("{name}: 10 AdamW steps, worst loss rel {worst:.2e}");
}

#[test]
fn llama_loss_and_every_gradient_match_pytorch() {
    gradients_match("train-llama", 2, false);
}

#[test]
fn tied_qwen2_loss_and_every_gradient_match_pytorch() {
    gradients_match("train-qwen2-tied", 2, false);
}

#[test]
fn strict_mode_gradients_match_pytorch_too() {
    gradients_match("train-llama", 1, true);
}

#[test]
fn llama_ten_adamw_steps_match_pytorch() {
    adamw_losses_match("train-llama");
}

#[test]
fn tied_qwen2_ten_adamw_steps_match_pytorch() {
    adamw_losses_match("train-qwen2-tied");
}

/// Gemma (scripts/make-zoo-train-fixtures.py): embeddings × √d, GeGLU, norms on 1 + w.
#[test]
fn gemma_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gemma", 2, false);
    adamw_losses_match("train-gemma");
}

/// Gemma 2: soft-capped attention and logits, a 5-token window on the first layer.
#[test]
fn gemma2_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gemma2", 2, false);
    adamw_losses_match("train-gemma2");
}

/// Gemma 3: per-head q/k norms, a window layer with its own RoPE base, then a global one.
#[test]
fn gemma3_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gemma3", 2, false);
    gradients_match("train-gemma3", 1, true);
    adamw_losses_match("train-gemma3");
}

/// GPT-2: learned positions, LayerNorm with biases, the fused q/k/v projection (a view per
/// part), tanh GELU, tied head; its HF `Conv1D` weights are read transposed.
#[test]
fn gpt2_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gpt2", 2, false);
    gradients_match("train-gpt2", 1, true);
    adamw_losses_match("train-gpt2");
}

/// GPT-NeoX: parallel residual, partial RoPE, HF's per-head interleaved q/k/v regrouped at
/// load, exact GELU, untied head.
#[test]
fn gptneox_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gptneox", 2, false);
    gradients_match("train-gptneox", 1, true);
    adamw_losses_match("train-gptneox");
}

/// Phi-3: fused q/k/v and gate/up projections (views), a sliding window on every layer.
#[test]
fn phi3_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-phi3", 2, false);
    gradients_match("train-phi3", 1, true);
    adamw_losses_match("train-phi3");
}

/// Mixtral: a mixture of experts (4 a block, 2 per token): the experts' gradients through
/// `mul_mat_id`'s backward, the router's through the chosen experts' renormalized weights.
#[test]
fn mixtral_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-mixtral", 2, false);
    gradients_match("train-mixtral", 1, true);
    adamw_losses_match("train-mixtral");
}

/// Mamba: the causal convolution's and the selective scan's backward (A's gradient through
/// transformers' A_log), no attention.
#[test]
fn mamba_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-mamba", 2, false);
    gradients_match("train-mamba", 1, true);
    adamw_losses_match("train-mamba");
}

/// A sliding window on every layer (Mistral; tinynn-models' `tiny-mistral-swa` fixture, window
/// 4 of 13 tokens) in the training graph: the loss equals the cross-entropy of transformers'
/// logits for the same tokens.
#[test]
fn mistral_window_training_loss_matches_transformers_logits() {
    use tinynn_train::TrainConfig;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tinynn-models/tests/fixtures/tiny-mistral-swa");
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    let tokens: Vec<i32> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_i64().unwrap() as i32)
        .collect();
    let logits = reference["logits"].as_array().unwrap();
    let n = tokens.len() - 1;
    let mut want = 0f64;
    for i in 0..n {
        let row: Vec<f64> = logits[i]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let max = row.iter().copied().fold(f64::MIN, f64::max);
        let lse = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        want += lse - row[tokens[i + 1] as usize];
    }
    want /= n as f64;
    let cfg = TrainConfig {
        seq: n,
        batch: 1,
        threads: 2,
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(&HfModelDir::open(&dir).unwrap(), cfg).unwrap();
    let got = f64::from(t.eval_loss(&tokens[..n], &tokens[1..]).unwrap());
    let err = (got - want).abs() / want;
    println!("tiny-mistral-swa: training loss {got} vs transformers {want} (rel {err:.2e})");
    assert!(err < 1e-5, "{got} vs {want}");
}

/// Phi-3 LongRoPE in training: a 14-token sequence (within the original 16) rotates with the
/// short divisors, a 24-token one with the long ones, as transformers does for such sequences
/// (the loss of its logits, committed by make-zoo-fixtures.py) — from the HF directory, and
/// from the converted GGUF file, whose export keeps both divisor tensors.
#[test]
fn phi3_longrope_training_follows_the_sequence_length() {
    use tinynn_format::gguf::GgufFile;
    use tinynn_train::TrainConfig;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tinynn-models/tests/fixtures/tiny-phi3-longrope");
    let reference = |file: &str| -> (Vec<i32>, Vec<i32>, f32) {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        let tokens: Vec<i32> = v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap() as i32)
            .collect();
        let rows = v["logits"].as_array().unwrap();
        let mut nll = 0f64;
        for (i, row) in rows.iter().enumerate().take(tokens.len() - 1) {
            let row: Vec<f64> = row
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
            nll += lse - row[tokens[i + 1] as usize];
        }
        let labels: Vec<i32> = tokens[1..].iter().copied().chain([-100]).collect();
        let loss = (nll / (tokens.len() - 1) as f64) as f32;
        (tokens, labels, loss)
    };
    let cfg = |seq: usize| TrainConfig {
        seq,
        batch: 1,
        threads: 2,
        ..TrainConfig::default()
    };
    let hf = HfModelDir::open(&dir).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("phi3-longrope.gguf");
    let model = tinynn_models::model::Model::open(&dir).unwrap();
    let opts = tinynn_models::convert::ConvertOptions {
        out_type: tinynn_format::GgmlType::F32,
        tokenizer: false,
    };
    tinynn_models::convert::convert_hf(&model, &gguf_path, &opts).unwrap();
    let gguf = GgufFile::open(&gguf_path).unwrap();
    for file in ["logits.json", "logits_long.json"] {
        let (ids, labels, want) = reference(file);
        for (from, mut t) in [
            ("hf", Trainer::new(&hf, cfg(ids.len())).unwrap()),
            ("gguf", Trainer::new(&gguf, cfg(ids.len())).unwrap()),
        ] {
            let got = t.eval_loss(&ids, &labels).unwrap();
            let rel = f64::from((got - want).abs()) / f64::from(want);
            println!(
                "phi3 LongRoPE {file} ({from}, seq {}): loss {got} vs {want} (rel {rel:.1e})",
                ids.len()
            );
            assert!(rel <= TOL, "{file} from {from}: {got} vs {want}");
            if from == "gguf" && file == "logits_long.json" {
                let out = tmp.path().join("exported.gguf");
                t.export_gguf(&out, tinynn_format::GgmlType::F32).unwrap();
                let e = GgufFile::open(&out).unwrap();
                for name in ["rope_factors_short.weight", "rope_factors_long.weight"] {
                    assert!(e.tensor(name).is_some(), "the export lost {name}");
                }
            }
        }
    }
}
