//! Hugging Face checkpoints as they are usually saved: bf16, f16, or mixed per tensor. Every
//! f32 fixture directory (tests/fixtures/tiny-*) is rewritten here in each precision, beside a
//! reference f32 copy holding the same rounded values. The half-precision directory must load
//! and, in strict mode, give the reference copy's logits (the existing fixture tests show that
//! strict f32 logits are transformers' within 1e-4, whatever the weights); in normal mode its
//! logits must be finite and near them. Each rewritten directory is also converted to GGUF
//! (`tnn convert`: BF16 from bf16, F16 from f16, F32 from mixed) and must keep its strict
//! logits and greedy tokens.

use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tinynn_cpu::ExecOptions;
use tinynn_format::GgmlType;
use tinynn_models::convert::{convert_hf, ConvertOptions};
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};

/// Every architecture's HF fixture directory (`tests/fixtures/tiny-*`), sorted.
fn fixtures() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut names: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tiny-"))
        .collect();
    names.sort();
    assert!(names.len() >= 13, "fixtures found: {names:?}");
    names
}

/// A value rounded to `dtype` (F32: unchanged), and its little-endian bytes in that type.
fn round(x: f32, dtype: Dtype) -> (f32, Vec<u8>) {
    match dtype {
        Dtype::BF16 => {
            let h = half::bf16::from_f32(x);
            (h.to_f32(), h.to_le_bytes().to_vec())
        }
        Dtype::F16 => {
            let h = half::f16::from_f32(x);
            (h.to_f32(), h.to_le_bytes().to_vec())
        }
        _ => (x, x.to_le_bytes().to_vec()),
    }
}

/// Writes `src`'s directory to `half_dir` with each tensor in the type `pick(name, shape)` gives,
/// and to `ref_dir` as f32 holding the same rounded values.
fn rewrite(src: &Path, half_dir: &Path, ref_dir: &Path, pick: &dyn Fn(&str, &[usize]) -> Dtype) {
    for dir in [half_dir, ref_dir] {
        std::fs::create_dir_all(dir).unwrap();
        for entry in std::fs::read_dir(src).unwrap() {
            let path = entry.unwrap().path();
            if path.file_name().unwrap() != "model.safetensors" {
                std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
            }
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut halves = Vec::new();
    let mut refs = Vec::new();
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), Dtype::F32, "{name}: fixtures are f32");
        let dtype = pick(&name, view.shape());
        let (mut h, mut r) = (Vec::new(), Vec::new());
        for b in view.data().chunks_exact(4) {
            let (v, hb) = round(f32::from_le_bytes([b[0], b[1], b[2], b[3]]), dtype);
            h.extend(hb);
            r.extend(v.to_le_bytes());
        }
        halves.push((name.clone(), dtype, view.shape().to_vec(), h));
        refs.push((name, Dtype::F32, view.shape().to_vec(), r));
    }
    for (dir, tensors) in [(half_dir, &halves), (ref_dir, &refs)] {
        let views: Vec<(String, TensorView<'_>)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    }
}

/// The fixture's token sequence.
fn tokens(dir: &Path) -> Vec<u32> {
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("logits.json")).unwrap()).unwrap();
    reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// Every position's logits of the fixture's token sequence, for the model at `path` (a
/// directory or a GGUF file).
fn logits(dir: &Path, strict: bool) -> Vec<f32> {
    logits_of(dir, &tokens(dir), strict)
}

fn session(path: &Path, strict: bool) -> Session {
    let model = Model::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let so = SessionOptions {
        n_ctx: 32,
        exec: ExecOptions {
            strict,
            threads: 2,
            ..ExecOptions::default()
        },
        all_logits: true,
        ..SessionOptions::default()
    };
    Session::with_options(model, so).unwrap()
}

fn logits_of(path: &Path, tokens: &[u32], strict: bool) -> Vec<f32> {
    let mut s = session(path, strict);
    s.eval_batch(tokens).unwrap();
    s.all_logits().to_vec()
}

/// 12 greedy tokens after the first 4 of `tokens`, in strict mode.
fn greedy(path: &Path, tokens: &[u32]) -> Vec<u32> {
    let mut s = session(path, true);
    let mut logits = s.eval_batch(&tokens[..4]).unwrap().to_vec();
    let mut out = Vec::new();
    for _ in 0..12 {
        let t = tinynn_models::session::argmax(&logits);
        out.push(t);
        logits = s.eval(t).unwrap().to_vec();
    }
    out
}

fn largest_difference(a: &[f32], b: &[f32]) -> f64 {
    tinynn_core::measure::max_abs_diff(a, b)
}

/// `pick` gives each tensor's dtype; `gguf_type` is what `tnn convert` writes the rewritten
/// directory as.
fn check(precision: &str, pick: &dyn Fn(&str, &[usize]) -> Dtype, gguf_type: GgmlType) {
    let tmp = tempfile::tempdir().unwrap();
    for name in fixtures() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(&name);
        let (half_dir, ref_dir) = (
            tmp.path().join(&name),
            tmp.path().join(format!("{name}-ref")),
        );
        rewrite(&src, &half_dir, &ref_dir, pick);
        let want = logits(&ref_dir, true);
        let strict = logits(&half_dir, true);
        let d = largest_difference(&strict, &want);
        eprintln!("{name} {precision}: strict logits differ from the f32 copy's by {d:.2e}");
        assert!(d <= 1e-5, "{name} {precision}: strict {d}");
        let fast = logits(&half_dir, false);
        assert!(fast.iter().all(|x| x.is_finite()), "{name} {precision}");
        let scale = tinynn_core::measure::max_abs(&want);
        let d = largest_difference(&fast, &want);
        eprintln!("{name} {precision}: normal mode differs by {d:.2e} (largest logit {scale:.2})");
        assert!(d <= 0.05 * scale, "{name} {precision}: normal mode {d}");

        // HF → GGUF (`tnn convert`) keeps the values: the same strict logits and greedy text.
        let gguf = tmp.path().join(format!("{name}-{precision}.gguf"));
        let hf = Model::open(&half_dir).unwrap();
        let opts = ConvertOptions {
            out_type: gguf_type,
            tokenizer: half_dir.join("tokenizer.json").is_file(),
        };
        convert_hf(&hf, &gguf, &opts).unwrap();
        let tokens = tokens(&half_dir);
        let d = largest_difference(&logits_of(&gguf, &tokens, true), &strict);
        eprintln!(
            "{name} {precision}: converted to {gguf_type:?}, strict logits differ by {d:.2e}"
        );
        assert!(d <= 1e-5, "{name} {precision}: converted {d}");
        assert_eq!(
            greedy(&gguf, &tokens),
            greedy(&half_dir, &tokens),
            "{name} {precision}: greedy tokens of the converted file"
        );
    }
}

#[test]
fn bf16_checkpoints_load_and_match_their_f32_values() {
    check("bf16", &|_, _| Dtype::BF16, GgmlType::Bf16);
}

#[test]
fn f16_checkpoints_load_and_match_their_f32_values() {
    check("f16", &|_, _| Dtype::F16, GgmlType::F16);
}

/// As real checkpoints mix them: matrices bf16, norms f16, biases and the embeddings f32.
#[test]
fn mixed_precision_checkpoints_load_and_match_their_f32_values() {
    check(
        "mixed",
        &|name, shape| {
            if name.contains("embed") || name.ends_with(".bias") {
                Dtype::F32
            } else if shape.len() == 1 {
                Dtype::F16
            } else {
                Dtype::BF16
            }
        },
        GgmlType::F32,
    );
}
