//! `tnn tokenize` end to end on the real model: ids as llama.cpp's tokenizer gives them.

mod common;

use common::{real_model, run_measured, tnn};

#[test]
fn tokenize_prints_ids_and_pieces() {
    let model = real_model();
    // A whitespace run before a digit stays one token (the smollm pre-tokenizer splits the
    // digits off first); ids from llama.cpp 0c1e570's tokenizer.
    let out = run_measured(
        tnn()
            .args(["tokenize", "--ids", "-m"])
            .arg(&model)
            .args(["-p", "\n\n  0. Definitions."]),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(out.stdout, "[39892, 32, 30, 39331, 30]\n");

    let out = run_measured(
        tnn()
            .args(["tokenize", "--show-count", "-m"])
            .arg(&model)
            .args(["-p", "Hello world 12"]),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        " 19556 -> 'Hello'\n   905 -> ' world'\n   216 -> ' '\n    33 -> '1'\n    \
         34 -> '2'\nTotal number of tokens: 5\n"
    );
}

#[test]
fn tokenize_a_file_matches_llama_cpp_count() {
    let out = run_measured(
        tnn()
            .args(["tokenize", "--ids", "--no-bos", "-m"])
            .arg(real_model())
            .args(["-f", "/usr/share/common-licenses/GPL-3"]),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let ids: Vec<u32> = serde_json::from_str(&out.stdout).unwrap();
    // llama.cpp 0c1e570's llama_tokenize gives 7639 tokens for this text.
    assert_eq!(ids.len(), 7639);
    // Only the tokenizer's metadata is read, never the weights (the file is 94 MiB).
    assert!(out.max_rss < 64 << 20, "peak RSS {} MiB", out.max_rss >> 20);
}

#[test]
fn tokenize_needs_text() {
    let out = run_measured(tnn().args(["tokenize", "--ids"]));
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("-p TEXT or -f FILE"), "{}", out.stderr);
    let out = run_measured(tnn().args(["tokenize", "-p", "a", "-f", "b"]));
    assert_ne!(out.code, Some(0));
}
