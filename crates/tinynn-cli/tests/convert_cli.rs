//! `tnn convert`: a Hugging Face fixture directory to GGUF (F32, and quantized through a
//! temporary F32 file that is removed), `tnn inspect` naming the architecture; refusals are
//! one-line errors and leave no file behind.

use std::path::PathBuf;
use std::process::Command;

fn tnn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tnn"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tinynn-models/tests/fixtures")
        .join(name)
}

fn run(args: &[&std::ffi::OsStr]) -> (bool, String, String) {
    let out = tnn().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn converts_a_directory_and_quantizes_in_the_same_pass() {
    let dir = tempfile::tempdir().unwrap();
    let (src, f32_out, q8_out) = (
        fixture("tiny-gpt2"),
        dir.path().join("gpt2-f32.gguf"),
        dir.path().join("gpt2-q8_0.gguf"),
    );
    // Without tokenizer.json the vocabulary has to be left out explicitly.
    let (ok, _, err) = run(&[
        "convert".as_ref(),
        src.as_ref(),
        f32_out.as_ref(),
        "F32".as_ref(),
    ]);
    assert!(
        !ok && err.contains("no tokenizer.json") && err.contains("--no-tokenizer"),
        "{err}"
    );
    assert!(!f32_out.exists());
    let (ok, _, err) = run(&[
        "convert".as_ref(),
        src.as_ref(),
        f32_out.as_ref(),
        "F32".as_ref(),
        "--no-tokenizer".as_ref(),
    ]);
    assert!(ok, "{err}");
    assert!(
        err.contains("28 tensors") && err.contains("no tokenizer"),
        "{err}"
    );
    let (ok, out, _) = run(&["inspect".as_ref(), f32_out.as_ref()]);
    assert!(
        ok && out.contains("architecture:  gpt2") && out.contains("file type:     F32"),
        "{out}"
    );

    let (ok, _, err) = run(&[
        "convert".as_ref(),
        src.as_ref(),
        q8_out.as_ref(),
        "Q8_0".as_ref(),
        "--no-tokenizer".as_ref(),
        "-t".as_ref(),
        "2".as_ref(),
    ]);
    assert!(ok, "{err}");
    let (ok, out, _) = run(&["inspect".as_ref(), q8_out.as_ref()]);
    assert!(ok && out.contains("Q8_0"), "{out}");
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 2, "the temporary F32 file is removed: {left:?}");

    for (args, want) in [
        (
            vec![src.as_os_str(), "x.gguf".as_ref(), "Q9".as_ref()],
            "unknown type 'Q9'",
        ),
        (
            vec![f32_out.as_os_str(), "x.gguf".as_ref()],
            "is a GGUF file already",
        ),
    ] {
        let mut all = vec!["convert".as_ref()];
        all.extend(args);
        let (ok, _, err) = run(&all);
        assert!(!ok && err.contains(want), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// `tnn convert MODEL.gguf DIR`: the default model as a bf16 Hugging Face directory that
/// `tnn run` reads; a non-empty directory or a quantized type is refused in one line.
#[test]
fn converts_a_gguf_file_to_a_hugging_face_directory() {
    let model = tinynn_format::model_cache::require_default_model().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("smol-hf");
    let (ok, _, err) = run(&["convert".as_ref(), model.as_os_str(), out.as_os_str()]);
    assert!(ok, "{err}");
    assert!(
        err.contains("llama 272 tensors") && err.contains("49152 tokens"),
        "{err}"
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.join(f).is_file(), "{f}");
    }
    let config = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(config.contains("\"torch_dtype\": \"bfloat16\""), "{config}");
    let (ok, text, err) = run(&[
        "run".as_ref(),
        "-m".as_ref(),
        out.as_os_str(),
        "-p".as_ref(),
        "The capital of France is".as_ref(),
        "-n".as_ref(),
        "8".as_ref(),
        "--temp".as_ref(),
        "0".as_ref(),
    ]);
    assert!(
        ok && text.starts_with("The capital of France is") && text.len() > 30,
        "{err}"
    );

    // Into the same (now non-empty) directory, or to a quantized type: refused.
    let (ok, _, err) = run(&[
        "convert".as_ref(),
        model.as_os_str(),
        out.as_os_str(),
        "F32".as_ref(),
    ]);
    assert!(
        !ok && err.contains("not empty") && err.lines().count() == 1,
        "{err}"
    );
    let other = tmp.path().join("q8");
    let (ok, _, err) = run(&[
        "convert".as_ref(),
        model.as_os_str(),
        other.as_os_str(),
        "Q8_0".as_ref(),
    ]);
    assert!(!ok && err.contains("BF16, F16, F32"), "{err}");
    assert!(!other.exists());
}
