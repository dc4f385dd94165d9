//! The resource promise of issue 17, from the command line: for a small model file that
//! describes a model wrongly (the corpus of `tinynn-models/tests/hostile`: head counts that do
//! not divide, no KV heads, RoPE wider than a head, vocabulary ≠ embedding rows, missing, extra
//! or misshapen tensors, special ids out of range, absurd sizes), `tnn inspect`, `tnn run` and
//! `tnn finetune` each end within 5 s and 256 MiB of peak resident memory, with output (exit 0)
//! or a one-line error (exit 1) — never a crash.

#[allow(dead_code, unused_imports)]
mod common;
#[path = "../../tinynn-models/tests/hostile/mod.rs"]
mod hostile;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{run_measured, tnn};

/// Runs `tnn args...` and checks the promise; returns whether it succeeded.
fn check(what: &str, args: &[&std::ffi::OsStr]) -> bool {
    let t0 = Instant::now();
    let out = run_measured(tnn().args(args));
    let took = t0.elapsed();
    let cmd = args[0].to_string_lossy();
    assert!(
        took < Duration::from_secs(5),
        "{what}: tnn {cmd} took {took:?}"
    );
    assert!(
        out.max_rss < 256 << 20,
        "{what}: tnn {cmd} peaked at {} MiB",
        out.max_rss >> 20
    );
    match out.code {
        Some(0) => true,
        Some(1) => {
            let last = out.stderr.trim_end().lines().last().unwrap_or("");
            assert!(
                last.starts_with("error: ") && last.len() > 8,
                "{what}: tnn {cmd}: {}",
                out.stderr
            );
            false
        }
        other => panic!("{what}: tnn {cmd} ended with {other:?}: {}", out.stderr),
    }
}

#[test]
fn wrong_models_end_quickly_and_small_with_output_or_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (bases, cases) = hostile::write_corpus(tmp.path());
    let data = tmp.path().join("data.txt");
    std::fs::write(
        &data,
        "Hello world. The quick brown fox jumps over the lazy dog. ".repeat(30),
    )
    .unwrap();
    let out_dir = |i: usize| tmp.path().join(format!("ft-{i}"));
    let commands = |file: &Path, i: usize| -> Vec<Vec<std::ffi::OsString>> {
        let f = file.as_os_str().to_owned();
        vec![
            vec!["inspect".into(), f.clone()],
            vec![
                "run".into(),
                "-m".into(),
                f.clone(),
                "-p".into(),
                "Hello world".into(),
                "-n".into(),
                "2".into(),
                "-c".into(),
                "64".into(),
                "-t".into(),
                "1".into(),
            ],
            vec![
                "finetune".into(),
                "-m".into(),
                f,
                "--data".into(),
                data.clone().into(),
                "--steps".into(),
                "1".into(),
                "--seq".into(),
                "16".into(),
                "--batch".into(),
                "1".into(),
                "--out".into(),
                out_dir(i).into(),
                "-t".into(),
                "1".into(),
            ],
        ]
    };
    // The unmutated bases work in all three commands.
    for (i, (name, path)) in bases.iter().enumerate() {
        for args in commands(path, 10_000 + i) {
            let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
            assert!(check(name, &args), "{name}: {args:?} failed");
        }
    }
    // Every mutant, two at a time.
    let results: Vec<(usize, usize)> = std::thread::scope(|s| {
        let half = cases.len().div_ceil(2);
        let handles: Vec<_> = cases
            .chunks(half)
            .enumerate()
            .map(|(k, chunk)| {
                let commands = &commands;
                s.spawn(move || {
                    let (mut ok, mut refused) = (0, 0);
                    for (j, case) in chunk.iter().enumerate() {
                        let what = format!("{}, {}", case.base, case.what);
                        for args in commands(&case.path, k * half + j) {
                            let args: Vec<&std::ffi::OsStr> =
                                args.iter().map(|a| a.as_os_str()).collect();
                            if check(&what, &args) {
                                ok += 1;
                            } else {
                                refused += 1;
                            }
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (ok, refused) = results.iter().fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
    eprintln!(
        "{} files × 3 commands: {ok} ran, {refused} refused with one line",
        cases.len()
    );
    assert_eq!(ok + refused, cases.len() * 3);
    assert!(
        refused > cases.len(),
        "most wrong models should be refused somewhere"
    );
}
