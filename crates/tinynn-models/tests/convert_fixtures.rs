//! `tinynn_models::convert` on every HF fixture (scripts/make-torch-fixtures.py and
//! scripts/make-zoo-fixtures.py): the GGUF file it writes — llama.cpp's names, q/k rows
//! permuted for RoPE where llama.cpp permutes them, Gemma's norms as 1 + w, GPT-2's Conv1D
//! weights transposed, llama.cpp's metadata keys — gives transformers' logits in strict mode
//! (every position within 1e-4), the same greedy tokens as the directory, F16 close to F32,
//! and, quantized to Q8_0 with `tnn quantize`'s rules, a perplexity within 2% of F32's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tinynn_cpu::ExecOptions;
use tinynn_format::gguf::GgufFile;
use tinynn_format::GgmlType;
use tinynn_models::convert::{convert_hf, ConvertOptions};
use tinynn_models::model::Model;
use tinynn_models::quantize::{quantize_file, Options, Target};
use tinynn_models::session::{Session, SessionOptions};

const FIXTURES: [&str; 14] = [
    "tiny-llama",
    "tiny-llama3",
    "tiny-llama-yarn",
    "tiny-qwen2",
    "tiny-qwen3",
    "tiny-mistral-swa",
    "tiny-gemma",
    "tiny-gemma2",
    "tiny-gemma3",
    "tiny-gpt2",
    "tiny-gptneox",
    "tiny-phi3",
    "tiny-mixtral",
    "tiny-mamba",
];

fn dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn reference(name: &str) -> (Vec<u32>, Vec<Vec<f64>>) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir(name).join("logits.json")).unwrap())
            .unwrap();
    let tokens = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let logits = v["logits"]
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
    (tokens, logits)
}

/// The largest difference between the reference rows `want` and `got` (row after row).
fn largest_difference(want: &[Vec<f64>], got: &[f32]) -> f64 {
    let v = want[0].len();
    want.iter()
        .enumerate()
        .flat_map(|(i, row)| row.iter().enumerate().map(move |(j, &w)| (i, j, w)))
        .map(|(i, j, w)| (f64::from(got[i * v + j]) - w).abs())
        .fold(0f64, tinynn_core::measure::nan_max)
}

fn strict() -> ExecOptions {
    ExecOptions {
        strict: true,
        ..ExecOptions::default()
    }
}

/// Every position's logits of `tokens`.
fn all_logits(model: Arc<Model>, tokens: &[u32], exec: ExecOptions) -> Vec<f32> {
    let so = SessionOptions {
        n_ctx: 32,
        exec,
        all_logits: true,
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(model, so).unwrap();
    s.eval_batch(tokens).unwrap();
    s.all_logits().to_vec()
}

/// `n` greedy tokens after `prompt`.
fn greedy(model: Arc<Model>, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(model, 32, strict()).unwrap();
    let mut logits = s.eval_batch(prompt).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = tinynn_models::session::argmax(&logits);
        out.push(t);
        logits = s.eval(t).unwrap().to_vec();
    }
    out
}

/// exp of the mean next-token cross-entropy over `tokens`.
fn perplexity(logits: &[f32], tokens: &[u32]) -> f64 {
    let v = logits.len() / tokens.len();
    let mut nll = 0f64;
    for (i, &next) in tokens.iter().enumerate().skip(1) {
        let row = &logits[(i - 1) * v..][..v];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        nll += lse - row[next as usize] as f64;
    }
    (nll / (tokens.len() - 1) as f64).exp()
}

fn convert(name: &str, out: &Path, ty: GgmlType) -> Arc<Model> {
    let hf = Model::open(dir(name)).unwrap();
    let opts = ConvertOptions {
        out_type: ty,
        tokenizer: false,
    };
    let report = convert_hf(&hf, out, &opts).unwrap();
    assert_eq!(report.tokens, 0);
    Model::open(out).unwrap()
}

#[test]
fn every_fixture_converts_to_a_gguf_file_that_matches_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let (tokens, want) = reference(name);
        let f32_path = tmp.path().join(format!("{name}-f32.gguf"));
        let gguf = convert(name, &f32_path, GgmlType::F32);
        // llama.cpp's converter writes Mistral as a Llama.
        let want_arch = match Model::open(dir(name)).unwrap().config().architecture.name() {
            "mistral" => "llama".to_string(),
            other => other.to_string(),
        };
        assert_eq!(
            GgufFile::open(&f32_path).unwrap().gguf().architecture(),
            Some(want_arch.as_str())
        );
        let got = all_logits(gguf.clone(), &tokens, strict());
        let worst = largest_difference(&want, &got);
        assert!(worst <= 1e-4, "{name}: GGUF logits off by {worst}");

        let hf = Model::open(dir(name)).unwrap();
        let (g_hf, g_gguf) = (
            greedy(hf, &tokens[..4], 12),
            greedy(gguf.clone(), &tokens[..4], 12),
        );
        assert_eq!(g_hf, g_gguf, "{name}: greedy tokens");

        let f16 = convert(
            name,
            &tmp.path().join(format!("{name}-f16.gguf")),
            GgmlType::F16,
        );
        let got16 = all_logits(f16, &tokens, strict());
        let worst16 = tinynn_core::measure::max_abs_diff(&got16, &got);
        let scale = tinynn_core::measure::max_abs(&got);
        assert!(
            worst16 <= 0.02 * scale,
            "{name}: F16 off by {worst16} (scale {scale})"
        );

        let q8_path = tmp.path().join(format!("{name}-q8_0.gguf"));
        let opts = Options {
            target: Target::parse("Q8_0").unwrap(),
            allow_requantize: false,
            threads: 2,
        };
        quantize_file(
            &GgufFile::open(&f32_path).unwrap(),
            &q8_path,
            &opts,
            &mut |_| {},
        )
        .unwrap();
        let q8 = Model::open(&q8_path).unwrap();
        let (p32, p8) = (
            perplexity(&all_logits(gguf, &tokens, ExecOptions::default()), &tokens),
            perplexity(&all_logits(q8, &tokens, ExecOptions::default()), &tokens),
        );
        eprintln!(
            "{name}: GGUF vs transformers {worst:.2e}; F16 vs F32 {worst16:.2e}; perplexity F32 {p32:.4} Q8_0 {p8:.4}"
        );
        assert!(
            (p8 / p32 - 1.0).abs() <= 0.02,
            "{name}: Q8_0 perplexity {p8} vs F32 {p32}"
        );
    }
}

/// HF → GGUF (`tnn convert`) → HF (`tnn convert` back): the Llama-layout fixtures give
/// transformers' logits from the directory written back (q/k rows un-permuted, config and
/// tokenizer rewritten); the others are refused by name, and Llama 3's RoPE divisors, which
/// GGUF keeps only as a tensor, are refused with the reason.
#[test]
fn llama_layout_fixtures_survive_the_round_trip_back_to_hugging_face() {
    use tinynn_models::convert::to_hf::{export_hf, ExportOptions};
    let tmp = tempfile::tempdir().unwrap();
    for name in FIXTURES {
        let has_tokenizer = dir(name).join("tokenizer.json").is_file();
        let gguf_path = tmp.path().join(format!("{name}.gguf"));
        let opts = ConvertOptions {
            out_type: GgmlType::F32,
            tokenizer: has_tokenizer,
        };
        convert_hf(&Model::open(dir(name)).unwrap(), &gguf_path, &opts).unwrap();
        let gguf = Model::open(&gguf_path).unwrap();
        let back = tmp.path().join(format!("{name}-back"));
        let opts = ExportOptions {
            dtype: GgmlType::F32,
            tokenizer: has_tokenizer,
        };
        let mut arch = gguf.config().architecture.name().to_string();
        if gguf.config().experts.is_some() {
            arch = "mixtral".into();
        }
        let written = export_hf(&gguf, &back, &opts);
        match (arch.as_str(), name) {
            (_, "tiny-llama3") => {
                let e = written.unwrap_err().to_string();
                assert!(e.contains("rope_freqs.weight"), "{name}: {e}");
                continue;
            }
            ("llama" | "mistral" | "mixtral" | "qwen2" | "qwen3", _) => {}
            _ => {
                let e = written.unwrap_err().to_string();
                assert!(
                    e.contains(&format!("writing a '{arch}' model")) && e.contains("qwen3"),
                    "{name}: {e}"
                );
                continue;
            }
        }
        written.unwrap_or_else(|e| panic!("{name}: {e}"));
        let (tokens, want) = reference(name);
        let got = all_logits(Model::open(&back).unwrap(), &tokens, strict());
        let worst = largest_difference(&want, &got);
        eprintln!("{name}: HF → GGUF → HF logits within {worst:.2e} of transformers'");
        assert!(worst <= 1e-4, "{name}: round-trip logits off by {worst}");
        if has_tokenizer {
            let (a, b) = (Model::open(dir(name)).unwrap(), Model::open(&back).unwrap());
            let text = "Hello world, 1234 tokens!\n\n  spaced";
            assert_eq!(
                a.tokenizer().unwrap().encode(text, true).unwrap(),
                b.tokenizer().unwrap().encode(text, true).unwrap(),
                "{name}: tokens"
            );
        }
    }
}
