//! Every malformed file yields a typed error (the expected one where the case names it), never a
//! panic, and the parser's peak heap use stays tiny: counts are checked before allocating.

use std::sync::atomic::Ordering;

use tinynn_format::gguf::Gguf;
use tinynn_format::malformed_corpus::{cases, valid_small_file};

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
    // Files found by `cargo fuzz` (and the seeds) live under fuzz/corpus; valid ones may parse.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/gguf exists") {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap();
        let _ = Gguf::parse(&bytes);
        let _ = tinynn_format::safetensors::SafetensorsHeader::parse(&bytes);
        n += 1;
    }
    assert!(n > 0, "no files in {}", dir.display());
}
