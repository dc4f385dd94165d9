//! Every malformed file yields a typed error (the expected one where the case names it), never a
//! panic, and the parser's peak heap use stays tiny: counts are checked before allocating.

use std::sync::atomic::Ordering;

use tinynn_format::gguf::Gguf;
use tinynn_format::malformed_corpus::{cases, fuzz_corpus, valid_small_file};

#[path = "support/counting_alloc_ffi.rs"]
mod counting_alloc;

use counting_alloc::{LIVE, PEAK};

/// A parse of a ≤ 2 KiB file may use at most this much heap (the CLI bound is 64 MiB of RSS).
const PEAK_LIMIT: usize = 1 << 20;

#[test]
fn the_valid_seed_parses() {
    Gguf::parse(&valid_small_file()).expect("the seed of the truncation cases must be valid");
}

#[test]
fn every_malformed_file_gets_its_typed_error() {
    let all = cases();
    assert!(all.len() >= 100, "corpus has only {} files", all.len());
    let mut failures = Vec::new();
    for case in &all {
        let base = LIVE.load(Ordering::Relaxed);
        PEAK.store(base, Ordering::Relaxed);
        let result = std::panic::catch_unwind(|| Gguf::parse(&case.bytes));
        let peak = PEAK.load(Ordering::Relaxed) - base;
        match result {
            Err(_) => failures.push(format!("{}: panicked", case.name)),
            Ok(Ok(_)) => failures.push(format!("{}: parsed without error", case.name)),
            Ok(Err(e)) => {
                if let Some(code) = case.expect {
                    if e.kind.code() != code {
                        failures.push(format!(
                            "{}: expected {code}, got {} ({e})",
                            case.name,
                            e.kind.code()
                        ));
                    }
                }
                if e.field.is_empty() || e.offset > case.bytes.len() as u64 + (1 << 20) {
                    failures.push(format!("{}: error lacks a field or offset: {e}", case.name));
                }
            }
        }
        if peak > PEAK_LIMIT {
            failures.push(format!("{}: peak heap {peak} bytes", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        all.len(),
        failures.join("\n")
    );
}

#[test]
fn the_committed_fuzz_corpus_never_panics() {
    // Valid files may parse; nothing panics.
    for (_, bytes) in fuzz_corpus("gguf") {
        let _ = Gguf::parse(&bytes);
        let _ = tinynn_format::safetensors::SafetensorsHeader::parse(&bytes);
    }
}

/// The safetensors target's corpus, through its checks: an error, or tensors inside the input.
#[test]
fn the_safetensors_fuzz_corpus_parses_within_its_bytes() {
    let mut parsed = 0;
    for (path, bytes) in fuzz_corpus("safetensors") {
        let Ok(h) = tinynn_format::safetensors::SafetensorsHeader::parse(&bytes) else {
            continue;
        };
        for t in &h.tensors {
            let end = t.data_start.checked_add(t.n_bytes);
            assert!(
                end.is_some_and(|e| e <= bytes.len()),
                "{}: a tensor past the end",
                path.display()
            );
        }
        parsed += 1;
    }
    assert!(parsed >= 3, "the valid seeds parse: {parsed}");
}

/// The hf_config target's corpus: config.json text gives a config or an error, never a panic,
/// and the real configs among the seeds give a model config.
#[test]
fn the_hf_config_fuzz_corpus_never_panics() {
    use tinynn_format::hf_config::HfConfig;
    use tinynn_format::model_config::ModelConfig;
    let mut configs = 0;
    for (_, bytes) in fuzz_corpus("hf_config") {
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        if let Ok(c) = HfConfig::from_json(text) {
            if ModelConfig::from_hf(&c).is_ok() {
                configs += 1;
            }
        }
    }
    assert!(configs >= 2, "the seed configs load: {configs}");
}
