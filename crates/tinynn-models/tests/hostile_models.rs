//! Small, well-formed GGUF files that describe a model wrongly (issue 17, "resource promises"):
//! head counts that do not divide, no KV heads, RoPE wider than a head, a vocabulary that is
//! not the embedding's, blocks or tensors missing, wrong shapes, extra tensors, special ids out
//! of range, absurd context and window sizes, non-finite epsilons. Each is made from a real
//! architecture's converted fixture and goes through `Model::open`, a session and one decode
//! step: the result is either logits (all finite) or a one-line error — never a panic — within
//! 5 s, and the whole run stays far below 256 MiB of resident memory.

mod hostile;

use std::path::Path;
use std::time::{Duration, Instant};

use tinynn_cpu::ExecOptions;
use tinynn_models::model::Model;
use tinynn_models::session::Session;

/// Open, a session, one decode step: `Ok` with the logits' finiteness, or the error.
fn open_and_decode(path: &Path) -> Result<bool, String> {
    let model = Model::open(path).map_err(|e| e.to_string())?;
    if model
        .gguf()
        .is_some_and(|f| f.gguf().get_raw("tokenizer.ggml.model").is_some())
    {
        // A file with a vocabulary: its tokenizer (special ids checked) and a text.
        let tok = model.tokenizer().map_err(|e| e.to_string())?;
        tok.encode("Hello world", true).map_err(|e| e.to_string())?;
    }
    let exec = ExecOptions {
        threads: 2,
        ..ExecOptions::default()
    };
    let mut s = Session::new(model, 16, exec).map_err(|e| e.to_string())?;
    let logits = s.eval_batch(&[1, 2, 3]).map_err(|e| e.to_string())?;
    Ok(logits.iter().all(|x| x.is_finite()))
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn wrong_models_give_logits_or_a_one_line_error_quickly() {
    let tmp = tempfile::tempdir().unwrap();
    let (bases, cases) = hostile::write_corpus(tmp.path());
    for (name, path) in &bases {
        assert_eq!(open_and_decode(path), Ok(true), "{name}");
    }
    let (mut refused, mut ran) = (0, 0);
    for case in &cases {
        let t0 = Instant::now();
        let result = std::panic::catch_unwind(|| open_and_decode(&case.path));
        let took = t0.elapsed();
        let what = format!("{}, {}", case.base, case.what);
        match result {
            Err(_) => panic!("{what}: panicked"),
            Ok(Ok(finite)) => {
                ran += 1;
                assert!(finite, "{what}: non-finite logits");
            }
            Ok(Err(e)) => {
                refused += 1;
                assert!(!e.is_empty() && !e.contains('\n'), "{what}: {e:?}");
                eprintln!("{what}: {e}");
            }
        }
        assert!(took < Duration::from_secs(5), "{what}: {took:?}");
    }
    eprintln!("{refused} refused, {ran} ran");
    let peak = peak_rss_kib().unwrap_or(0);
    eprintln!("peak resident memory {} MiB", peak / 1024);
    assert!(peak < 256 * 1024, "peak RSS {peak} KiB");
}
