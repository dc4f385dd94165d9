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
            "not a directory",
        ),
    ] {
        let mut all = vec!["convert".as_ref()];
        all.extend(args);
        let (ok, _, err) = run(&all);
        assert!(!ok && err.contains(want), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
