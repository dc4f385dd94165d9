//! The real Gemma 3 270M (Q4_K_M) from the command line: `tnn finetune --lora` on the GPL-3
//! text lowers the held-out loss, and the adapter it writes loads in `tnn run --lora` and
//! changes the greedy text.

#[allow(dead_code)]
mod common;

use common::{run_measured, tnn};
use tinynn_format::model_cache::{require_model, KnownModel};

fn run(model: &std::path::Path, extra: &[&str]) -> String {
    let mut cmd = tnn();
    cmd.args(["run", "-p", "This program is free software", "-n", "16"])
        .args(["--temp", "0", "-t", "2", "-m"])
        .arg(model)
        .args(extra);
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.stdout
}

/// `held-out loss A -> B` from the summary line.
fn held_out(stderr: &str) -> (f64, f64) {
    let line = stderr
        .lines()
        .find(|l| l.contains("held-out loss") && l.contains("->"))
        .unwrap_or_else(|| panic!("no held-out loss in {stderr}"));
    let tail = line.split("held-out loss").nth(1).unwrap();
    let nums: Vec<f64> = tail
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|s| s.parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[test]
fn lora_finetune_lowers_held_out_loss_and_the_adapter_loads() {
    let model = require_model(KnownModel::Gemma3).unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut cmd = tnn();
    cmd.args(["finetune", "-m"])
        .arg(&model)
        .args(["--data", "/usr/share/common-licenses/GPL-3", "--lora"])
        .args([
            "--seq", "64", "--batch", "2", "--steps", "8", "--lr", "1e-3",
        ])
        .args([
            "--eval-frac",
            "0.1",
            "--eval-batches",
            "2",
            "-t",
            "2",
            "--out",
        ])
        .arg(out.path());
    let r = run_measured(&mut cmd);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let (before, after) = held_out(&r.stderr);
    eprintln!("held-out loss {before} -> {after}");
    assert!(after < before, "{before} -> {after}");
    let adapter = out.path().join("adapter.gguf");
    let adapter = adapter.to_str().unwrap();
    let base = run(&model, &[]);
    let tuned = run(&model, &["--lora", adapter]);
    assert!(base.starts_with("This program is free software"), "{base}");
    assert_ne!(base, tuned);
}
