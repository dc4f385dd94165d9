//! Tiny random Llama and Qwen2 models made by transformers (scripts/make-torch-fixtures.py),
//! loaded from their HF directories (config.json + model.safetensors): in strict mode every
//! position's logits match transformers' f32 logits within 1e-4.

use std::path::Path;

use tinynn_cpu::ExecOptions;
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};

/// The fixture's model, fed tokens and transformers' logits (one row per position).
fn fixture(name: &str) -> (std::sync::Arc<Model>, Vec<u32>, Vec<Vec<f64>>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let model = Model::open(&dir).unwrap();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let want: Vec<Vec<f64>> = reference["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect();
    (model, tokens, want)
}

/// The largest difference of logits `got` (rows of n_vocab) from `want`.
fn worst_diff(name: &str, got: &[f32], want: &[Vec<f64>]) -> f64 {
    let n_vocab = want[0].len();
    assert_eq!(got.len(), want.len() * n_vocab);
    let mut worst = 0f64;
    for (i, row) in want.iter().enumerate() {
        for (j, &w) in row.iter().enumerate() {
            let g = f64::from(got[i * n_vocab + j]);
            assert!(g.is_finite(), "{name}: logit [{i}, {j}] is {g}");
            worst = worst.max((g - w).abs());
        }
    }
    worst
}

fn strict() -> ExecOptions {
    ExecOptions {
        strict: true,
        ..ExecOptions::default()
    }
}

fn check(name: &str) {
    let (model, tokens, want) = fixture(name);
    let opts = strict();
    let so = SessionOptions {
        n_ctx: 32,
        exec: opts,
        all_logits: true,
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(model, so).unwrap();
    s.eval_batch(&tokens).unwrap();
    let worst = worst_diff(name, s.all_logits(), &want);
    eprintln!("{name}: largest logit difference from transformers {worst:.2e}");
    assert!(worst <= 1e-4, "{name}: {worst}");
}

/// The fixture's tokens decoded one at a time through the KV cache (a lone token's sliding
/// window hides old rows too): every position's logits still match transformers'.
fn check_decode(name: &str) {
    let (model, tokens, want) = fixture(name);
    let mut s = Session::new(model, 32, strict()).unwrap();
    let mut got = Vec::new();
    for &t in &tokens {
        got.extend_from_slice(s.eval(t).unwrap());
    }
    let worst = worst_diff(name, &got, &want);
    eprintln!("{name}: one token at a time, largest logit difference {worst:.2e}");
    assert!(worst <= 1e-4, "{name}: {worst}");
}

/// Three sequences of the fixture in one cache, decoded together a token of each per run,
/// each starting at a different offset of the tokens: each sequence's logits are its
/// logits decoded alone.
fn check_batched(name: &str) {
    use tinynn_models::session::BatchToken;
    let (model, tokens, _) = fixture(name);
    let starts = [0usize, 3, 7];
    let alone: Vec<Vec<f32>> = starts
        .iter()
        .map(|&k| {
            let mut s = Session::new(model.clone(), 32, strict()).unwrap();
            let mut out = Vec::new();
            for &t in &tokens[k..] {
                out.extend_from_slice(s.eval(t).unwrap());
            }
            out
        })
        .collect();
    let so = SessionOptions {
        n_ctx: 64,
        n_seq: starts.len(),
        exec: strict(),
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(model, so).unwrap();
    let mut together = vec![Vec::new(); starts.len()];
    for step in 0..tokens.len() {
        let batch: Vec<BatchToken> = starts
            .iter()
            .enumerate()
            .filter_map(|(seq, &k)| {
                tokens.get(k + step).map(|&token| BatchToken {
                    token,
                    seq,
                    logits: true,
                })
            })
            .collect();
        s.decode(&batch).unwrap();
        for (i, b) in batch.iter().enumerate() {
            together[b.seq].extend_from_slice(s.output(i));
        }
    }
    for (seq, (a, t)) in alone.iter().zip(&together).enumerate() {
        let worst = tinynn_core::measure::max_abs_diff(a, t);
        assert!(worst <= 1e-5, "{name}: sequence {seq} differs by {worst}");
    }
}

#[test]
fn tiny_llama_matches_transformers() {
    check("tiny-llama");
}

#[test]
fn tiny_qwen2_with_biases_matches_transformers() {
    check("tiny-qwen2");
}

#[test]
fn tiny_qwen3_with_qk_norms_matches_transformers() {
    check("tiny-qwen3");
}

#[test]
fn tiny_llama3_rope_scaling_matches_transformers() {
    check("tiny-llama3");
}

/// The fixture's tokenizer.json (trained by the fixture script with HF tokenizers): the ids
/// Python printed, and an exact round trip of the GPL-3 text.
#[test]
fn hf_tokenizer_json() {
    use tinynn_models::tokenizer::Tokenizer;
    use tinynn_models::vocab::Vocab;
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-llama/tokenizer.json");
    let tok = Tokenizer::from_hf_file(&path, Some(1), Some(2)).unwrap();
    assert_eq!(
        tok.encode("the license", true).unwrap(),
        [309, 70, 315, 302]
    );
    let text = std::fs::read_to_string("/usr/share/common-licenses/GPL-3").unwrap();
    let ids = tok.encode(&text, false).unwrap();
    assert_eq!(tok.decode(&ids).unwrap(), text);
    assert_eq!(
        tok.vocab_kind(),
        tinynn_models::vocab::VocabKind::ByteLevelBpe
    );
    let vocab = Vocab::from_strings(tok.token_strings(), tok.vocab_kind());
    assert_eq!(String::from_utf8(vocab.decode(&ids)).unwrap(), text);
    assert!(tok.is_end(2));
    // A huge id (once 4294967295 strings for `token_strings`) and special ids the tokenizer
    // lacks are refused at open.
    let err = |r: tinynn_models::Result<Tokenizer>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    let e = err(Tokenizer::from_hf_file(&path, Some(1), Some(1 << 30)));
    assert!(e.contains("eos_token_id 1073741824 is not a token"), "{e}");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    json["model"]["vocab"]["zzzz"] = serde_json::json!(4294967295u64);
    let dir = tempfile::tempdir().unwrap();
    let sparse = dir.path().join("tokenizer.json");
    std::fs::write(&sparse, json.to_string()).unwrap();
    let e = err(Tokenizer::from_hf_file(&sparse, None, None));
    assert!(
        e.contains("token id 4294967295 in a vocabulary of") && e.contains("dense"),
        "{e}"
    );
}

#[test]
fn tiny_llama_yarn_matches_transformers() {
    check("tiny-llama-yarn");
}

#[test]
fn tiny_gemma_matches_transformers() {
    check("tiny-gemma");
}

/// Soft-capped attention and logits, a 4-token window on every other layer.
#[test]
fn tiny_gemma2_matches_transformers() {
    check("tiny-gemma2");
    check_decode("tiny-gemma2");
    check_batched("tiny-gemma2");
}

/// q/k norms, two window layers with their own RoPE base, then a global layer.
#[test]
fn tiny_gemma3_matches_transformers() {
    check("tiny-gemma3");
    check_decode("tiny-gemma3");
    check_batched("tiny-gemma3");
}

/// Mistral's sliding window (4 tokens) on every layer: all at once, one token at a time, and
/// three sequences together.
#[test]
fn tiny_mistral_sliding_window_matches_transformers() {
    check("tiny-mistral-swa");
    check_decode("tiny-mistral-swa");
    check_batched("tiny-mistral-swa");
}

/// GPT-2: learned positions (each sequence of a batch from its own position 0), LayerNorm
/// with biases, the fused q/k/v projection and HF's transposed `Conv1D` weights, tanh GELU,
/// tied head.
#[test]
fn tiny_gpt2_matches_transformers() {
    check("tiny-gpt2");
    check_decode("tiny-gpt2");
    check_batched("tiny-gpt2");
    // The default (fast) path too: packed weights, f16 cache, quantized activations.
    let (model, tokens, want) = fixture("tiny-gpt2");
    let mut s = Session::new(model, 32, ExecOptions::default()).unwrap();
    let mut got = Vec::new();
    for &t in &tokens {
        got.extend_from_slice(s.eval(t).unwrap());
    }
    let worst = worst_diff("tiny-gpt2", &got, &want);
    eprintln!("tiny-gpt2: default mode, largest logit difference {worst:.2e}");
    assert!(worst <= 0.05, "tiny-gpt2 default mode: {worst}");
}

/// GPT-NeoX: parallel residual, RoPE on a quarter of each head, q/k/v fused and interleaved
/// per head in HF (regrouped at load), LayerNorm with biases, exact GELU, untied head.
#[test]
fn tiny_gptneox_matches_transformers() {
    check("tiny-gptneox");
    check_decode("tiny-gptneox");
    check_batched("tiny-gptneox");
}

/// Phi-3: fused q/k/v and gate/up projections, a 4-token sliding window on every layer.
#[test]
fn tiny_phi3_matches_transformers() {
    check("tiny-phi3");
    check_decode("tiny-phi3");
    check_batched("tiny-phi3");
}

/// Mixtral: a mixture of experts (4 a block, 2 per token) stacked from the checkpoint's
/// per-expert matrices, through `mul_mat_id`.
#[test]
fn tiny_mixtral_matches_transformers() {
    check("tiny-mixtral");
    check_decode("tiny-mixtral");
    check_batched("tiny-mixtral");
}

/// The logits of `tokens` from `model` with a context of `n_ctx` (strict), against the
/// reference `file` of the fixture.
fn longrope_diff(model: std::sync::Arc<Model>, n_ctx: usize, file: &str) -> f64 {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-phi3-longrope");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
    let tokens: Vec<u32> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let want: Vec<Vec<f64>> = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    let so = SessionOptions {
        n_ctx,
        exec: strict(),
        all_logits: true,
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(model, so).unwrap();
    s.eval_batch(&tokens).unwrap();
    worst_diff(file, s.all_logits(), &want)
}

/// Phi-3 LongRoPE: with a context of at most the original 16 tokens the short factors rotate
/// (transformers' logits of 14 tokens), past it the long ones (its logits of 24 tokens, which
/// switch it to them); cos/sin scaled. The same from the GGUF file the converter writes (the
/// factors as rope_factors_short/long tensors).
#[test]
fn tiny_phi3_longrope_matches_transformers_short_and_long() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-phi3-longrope");
    let hf = Model::open(&dir).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gguf_path = tmp.path().join("phi3-longrope.gguf");
    let opts = tinynn_models::convert::ConvertOptions {
        out_type: tinynn_format::GgmlType::F32,
        tokenizer: false,
    };
    tinynn_models::convert::convert_hf(&hf, &gguf_path, &opts).unwrap();
    let gguf = Model::open(&gguf_path).unwrap();
    for (name, model) in [("hf", hf), ("gguf", gguf)] {
        let short = longrope_diff(model.clone(), 16, "logits.json");
        let long = longrope_diff(model.clone(), 32, "logits_long.json");
        // The other factors are far off: the test can fail.
        let wrong = longrope_diff(model, 32, "logits.json");
        eprintln!("tiny-phi3-longrope ({name}): short {short:.2e}, long {long:.2e}, wrong factors {wrong:.2e}");
        assert!(short <= 1e-4 && long <= 1e-4, "{name}: {short} {long}");
        assert!(wrong > 1e-2, "{name}: {wrong}");
    }
}

/// Mamba: no attention, a recurrent state per sequence; the whole prompt at once, one token
/// at a time and several sequences per run all match transformers.
#[test]
fn tiny_mamba_matches_transformers() {
    check("tiny-mamba");
    check_decode("tiny-mamba");
    check_batched("tiny-mamba");
}

/// A recurrent model's state follows its sequence through every session call: truncating and
/// continuing, clearing and reusing a slot, copying a whole sequence (the state is copied) or
/// a prefix (the state is rebuilt), a failed batch (nothing changes), and a prompt decoded
/// beside another sequence's single tokens — each equals the same tokens run fresh.
#[test]
fn mamba_state_follows_truncation_copies_and_failures() {
    use tinynn_models::session::BatchToken;
    let (model, tokens, _) = fixture("tiny-mamba");
    let fresh = |toks: &[u32]| -> Vec<f32> {
        let mut s = Session::new(model.clone(), 32, strict()).unwrap();
        s.eval_batch(toks).unwrap().to_vec()
    };
    let close = |what: &str, a: &[f32], b: &[f32]| {
        let d = tinynn_core::measure::max_abs_diff(a, b);
        assert!(d <= 1e-5, "{what}: differs by {d}");
    };
    let so = SessionOptions {
        n_ctx: 64,
        n_seq: 3,
        exec: strict(),
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(model.clone(), so).unwrap();
    s.eval_batch(&tokens[..10]).unwrap();
    // Truncate to 6 and continue with other tokens: the state is rebuilt from the 6 kept.
    for cut in [6usize, 1, 9] {
        s.truncate(cut);
        let mut toks = tokens[..cut].to_vec();
        toks.extend_from_slice(&tokens[10..13]);
        let got = s.eval_batch(&tokens[10..13]).unwrap().to_vec();
        close(&format!("truncated to {cut}"), &got, &fresh(&toks));
        assert_eq!(s.seq_tokens(0), &toks[..]);
        s.reset();
        s.eval_batch(&tokens[..10]).unwrap();
    }
    // A whole copy takes the state; a prefix copy rebuilds it; both continue as fresh runs.
    s.truncate(0);
    s.eval_batch(&tokens[..8]).unwrap();
    s.copy_seq(0, 1, 8).unwrap();
    s.copy_seq(0, 2, 5).unwrap();
    let step = [
        BatchToken {
            token: tokens[8],
            seq: 0,
            logits: true,
        },
        BatchToken {
            token: tokens[9],
            seq: 1,
            logits: true,
        },
        BatchToken {
            token: tokens[11],
            seq: 2,
            logits: true,
        },
    ];
    s.decode(&step).unwrap();
    close("sequence 0", s.output(0), &fresh(&tokens[..9]));
    let mut one = tokens[..8].to_vec();
    one.push(tokens[9]);
    close("whole copy", s.output(1), &fresh(&one));
    let mut two = tokens[..5].to_vec();
    two.push(tokens[11]);
    close("prefix copy", s.output(2), &fresh(&two));
    // A batch that fails (a token id past the model's table) changes nothing.
    let bad = [
        BatchToken {
            token: tokens[9],
            seq: 0,
            logits: true,
        },
        BatchToken {
            token: 1 << 30,
            seq: 1,
            logits: true,
        },
    ];
    assert!(s.decode(&bad).is_err());
    assert_eq!((s.seq_len(0), s.seq_len(1)), (9, 9));
    // A cleared slot starts from zeros; a prompt runs beside another sequence's one token.
    s.clear_seq(2);
    let mixed: Vec<BatchToken> = BatchToken::sequence(&tokens[2..9], 2, true)
        .chain(std::iter::once(BatchToken {
            token: tokens[9],
            seq: 0,
            logits: true,
        }))
        .collect();
    s.decode(&mixed).unwrap();
    let alone = {
        let mut a = Session::new(model.clone(), 32, strict()).unwrap();
        let mut rows = Vec::new();
        for &t in &tokens[2..9] {
            rows.extend_from_slice(a.eval(t).unwrap());
        }
        rows
    };
    let n_vocab = s.output(0).len();
    for i in 0..7 {
        close(
            &format!("prompt row {i}"),
            s.output(i),
            &alone[i * n_vocab..(i + 1) * n_vocab],
        );
    }
    close("beside the prompt", s.output(7), &fresh(&tokens[..10]));
}
