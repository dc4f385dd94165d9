//! `tnn quantize`'s K-quant mixes against llama-quantize's (fixtures/llama-quantize-types.json,
//! from scripts/make-quantize-types.py): for Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_M and Q5_K_M,
//! every tensor of both real models gets the type llama-quantize gave it, and every tensor of
//! the default model (dequantized to F32 first, as the script did) the same bytes.

use std::collections::BTreeMap;
use std::path::Path;

use sha2::{Digest, Sha256};
use tinynn_format::gguf::GgufFile;
use tinynn_format::model_cache::{require_model, KnownModel};
use tinynn_models::quantize::{plan, quantize_file, Options, Target};

#[derive(serde::Deserialize)]
struct Entry {
    #[serde(rename = "type")]
    ty: String,
    sha256: Option<String>,
}

/// model → target → tensor → what llama-quantize wrote.
type Fixture = BTreeMap<String, BTreeMap<String, BTreeMap<String, Entry>>>;

fn fixture() -> Fixture {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-quantize-types.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn opts(target: &str) -> Options {
    Options {
        target: Target::parse(target).unwrap(),
        allow_requantize: true,
        threads: 2,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn plans_give_every_tensor_llama_quantizes_type() {
    let fx = fixture();
    for (model, m) in [
        ("gemma3", KnownModel::Gemma3),
        ("smollm2", KnownModel::SmolLm2),
    ] {
        let file = GgufFile::open(require_model(m).unwrap()).unwrap();
        assert_eq!(fx[model].len(), 6);
        for (target, want) in &fx[model] {
            let p = plan(&file, &opts(target)).unwrap();
            assert_eq!(p.len(), want.len(), "{model} {target}");
            for t in &p {
                assert_eq!(
                    t.choice.ty.name(),
                    want[&t.name].ty,
                    "{model} {target} {}: llama-quantize chose {}",
                    t.name,
                    want[&t.name].ty
                );
            }
        }
    }
}

#[test]
fn default_model_quantizes_to_llama_quantizes_bytes() {
    let fx = fixture();
    let dir = tempfile::tempdir().unwrap();
    let src = GgufFile::open(require_model(KnownModel::SmolLm2).unwrap()).unwrap();
    let f32_path = dir.path().join("f32.gguf");
    quantize_file(&src, &f32_path, &opts("F32"), &mut |_| {}).unwrap();
    let f32_file = GgufFile::open(&f32_path).unwrap();
    for (target, want) in &fx["smollm2"] {
        let out = dir.path().join(format!("{target}.gguf"));
        quantize_file(&f32_file, &out, &opts(target), &mut |_| {}).unwrap();
        let got = GgufFile::open(&out).unwrap();
        let mut n = 0;
        for t in got.tensors() {
            let w = &want[t.name()];
            assert_eq!(t.ggml_type().name(), w.ty, "{target} {}", t.name());
            assert_eq!(
                Some(hex(&Sha256::digest(t.data))),
                w.sha256,
                "{target} {} ({}): bytes differ from llama-quantize's",
                t.name(),
                w.ty
            );
            n += 1;
        }
        assert_eq!(n, want.len(), "{target}");
        std::fs::remove_file(&out).unwrap();
    }
}
