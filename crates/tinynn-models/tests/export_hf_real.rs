//! The default model (SmolLM2-135M-Instruct, GGUF Q4_1) written as a Hugging Face directory by
//! `tinynn_models::convert::to_hf` — how the suite gets a real bf16 safetensors checkpoint
//! without PyTorch — and run from it:
//! - bf16: perplexity on Debian's GPL-3 text (512-token windows) within 1% of the GGUF's;
//! - f32 (the Q4_1 values exactly): the same strict logits as the same values in an F32 GGUF
//!   file, although the HF run rotates un-permuted q/k rows the NEOX way, and at every step of
//!   the greedy text of several prompts logits within 0.5% of the largest in normal mode;
//! - the written `tokenizer.json` tokenizes texts of every kind exactly as the GGUF vocabulary
//!   does, and the chat template comes along.

use std::path::Path;
use std::sync::Arc;

use tinynn_cpu::ExecOptions;
use tinynn_format::model_cache::require_default_model;
use tinynn_format::GgmlType;
use tinynn_models::convert::to_hf::{export_hf, ExportOptions};
use tinynn_models::model::Model;
use tinynn_models::perplexity::perplexity;
use tinynn_models::quantize::{quantize_file, Options, Target};
use tinynn_models::session::{argmax, Session, SessionOptions};

const GPL3: &str = "/usr/share/common-licenses/GPL-3";

fn export(gguf: &Model, dir: &Path, dtype: GgmlType) -> Arc<Model> {
    let opts = ExportOptions {
        dtype,
        tokenizer: true,
    };
    let r = export_hf(gguf, dir, &opts).unwrap();
    assert_eq!((r.architecture.as_str(), r.tensors), ("llama", 272));
    assert_eq!(r.tokens, 49152);
    Model::open(dir).unwrap()
}

fn exec(strict: bool) -> ExecOptions {
    ExecOptions {
        strict,
        threads: 2,
        ..ExecOptions::default()
    }
}

fn gpl3_perplexity(model: Arc<Model>) -> f64 {
    let text = std::fs::read_to_string(GPL3).unwrap();
    let tokens = model.tokenizer().unwrap().encode(&text, false).unwrap();
    let bos = model.tokenizer().unwrap().bos();
    let so = SessionOptions {
        n_ctx: 512,
        exec: exec(false),
        all_logits: true,
        ..SessionOptions::default()
    };
    let mut s = Session::with_options(model, so).unwrap();
    perplexity(&mut s, &tokens, bos, None, |_| {}).unwrap().ppl
}

/// The greedy continuation of `prompt` by `lead` (`n` tokens), and the largest difference
/// between `lead`'s and `follow`'s logits over every step relative to the largest logit,
/// `follow` fed the same tokens.
fn greedy_and_largest_difference(
    lead: Arc<Model>,
    follow: Arc<Model>,
    prompt: &str,
    n: usize,
) -> (Vec<u32>, f64) {
    let ids = lead.tokenizer().unwrap().encode(prompt, true).unwrap();
    let mut a = Session::new(lead, 128, exec(false)).unwrap();
    let mut b = Session::new(follow, 128, exec(false)).unwrap();
    let diff = |x: &[f32], y: &[f32]| {
        tinynn_core::measure::max_abs_diff(x, y) / tinynn_core::measure::max_abs(x)
    };
    let mut la = a.eval_batch(&ids).unwrap().to_vec();
    let mut worst = diff(&la, b.eval_batch(&ids).unwrap());
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(&la);
        out.push(t);
        la = a.eval(t).unwrap().to_vec();
        worst = tinynn_core::measure::nan_max(worst, diff(&la, b.eval(t).unwrap()));
    }
    (out, worst)
}

#[test]
fn the_default_model_as_bf16_safetensors_keeps_its_perplexity() {
    let gguf = Model::open(require_default_model().unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let hf = export(&gguf, &tmp.path().join("bf16"), GgmlType::Bf16);
    let st = tinynn_format::safetensors::SafetensorsFile::open(
        tmp.path().join("bf16/model.safetensors"),
    )
    .unwrap();
    assert!(st
        .tensors()
        .iter()
        .all(|t| t.dtype == tinynn_format::safetensors::Dtype::BF16));
    let (p_gguf, p_hf) = (gpl3_perplexity(gguf), gpl3_perplexity(hf));
    eprintln!("GPL-3 perplexity: GGUF {p_gguf:.4}, bf16 HF directory {p_hf:.4}");
    assert!((p_hf / p_gguf - 1.0).abs() < 0.01, "{p_hf} vs {p_gguf}");
}

#[test]
fn the_default_model_as_f32_safetensors_gives_the_same_greedy_text_and_tokens() {
    let gguf = Model::open(require_default_model().unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let hf = export(&gguf, &tmp.path().join("f32"), GgmlType::F32);
    // The same values in GGUF layout: the default model dequantized to F32.
    let f32_gguf = tmp.path().join("f32.gguf");
    let opts = Options {
        target: Target::parse("F32").unwrap(),
        allow_requantize: false,
        threads: 2,
    };
    quantize_file(gguf.gguf().unwrap(), &f32_gguf, &opts, &mut |_| {}).unwrap();
    let f32_gguf = Model::open(&f32_gguf).unwrap();
    for prompt in [
        "The capital of France is",
        "def fibonacci(n):",
        "Dear Sir or Madam,\nI am writing to",
        "La receta tradicional de la paella",
        "Q: Why is the sky blue?\nA:",
    ] {
        let (tokens, worst) =
            greedy_and_largest_difference(f32_gguf.clone(), hf.clone(), prompt, 24);
        let text = gguf.tokenizer().unwrap().decode(&tokens).unwrap();
        eprintln!(
            "{prompt:?}: HF logits within {worst:.2e} (of the largest) of the GGUF's over {text:?}"
        );
        assert!(worst <= 5e-3, "{prompt:?}: {worst}");
    }
    // In strict mode (one summation order) the two layouts agree exactly.
    let ids = gguf
        .tokenizer()
        .unwrap()
        .encode("Hello, world", true)
        .unwrap();
    let logits = |m: &Arc<Model>| {
        let mut s = Session::new(m.clone(), 16, exec(true)).unwrap();
        s.eval_batch(&ids).unwrap().to_vec()
    };
    assert_eq!(logits(&hf), logits(&f32_gguf), "strict logits");
    let gpl = std::fs::read_to_string(GPL3).unwrap();
    let texts = [
        gpl.as_str(),
        "  leading spaces, 12345 digits, émigré façade, 日本語のテキスト, emoji 🙂🙂\n\n\ttabs",
        "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n",
        "",
    ];
    let (a, b) = (gguf.tokenizer().unwrap(), hf.tokenizer().unwrap());
    for text in texts {
        for special in [false, true] {
            let ids = a.encode(text, special).unwrap();
            assert_eq!(
                b.encode(text, special).unwrap(),
                ids,
                "{:?}",
                &text[..text.len().min(40)]
            );
            assert_eq!(b.decode(&ids).unwrap(), a.decode(&ids).unwrap());
        }
    }
    assert_eq!((b.bos(), b.eos()), (a.bos(), a.eos()));
    assert_eq!(hf.chat_template_source(), gguf.chat_template_source());
}

#[test]
fn what_cannot_be_written_is_refused_and_nothing_is_overwritten() {
    let gguf = Model::open(require_default_model().unwrap()).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("keep.txt"), "mine").unwrap();
    let opts = ExportOptions {
        dtype: GgmlType::Bf16,
        tokenizer: true,
    };
    let e = export_hf(&gguf, tmp.path(), &opts).unwrap_err().to_string();
    assert!(e.contains("not empty"), "{e}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("keep.txt")).unwrap(),
        "mine"
    );
    let q8 = ExportOptions {
        dtype: GgmlType::Q8_0,
        tokenizer: true,
    };
    let e = export_hf(&gguf, &tmp.path().join("q8"), &q8)
        .unwrap_err()
        .to_string();
    assert!(e.contains("F32, F16 or BF16"), "{e}");
    assert!(!tmp.path().join("q8").exists());
}
