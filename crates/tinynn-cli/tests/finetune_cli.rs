//! `tnn finetune` / `tnn train` end to end on the tiny HF Llama fixture: LoRA fine-tuning writes
//! checkpoints, metrics, a loss curve and an adapter that changes `tnn run --lora`'s output; a
//! resumed run repeats the uninterrupted run's losses bit for bit; three non-finite steps stop
//! training with the last checkpoint intact; `tnn train` trains from a JSON config.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};

use common::ffi_wait4::Outcome;
use common::{run_measured, tnn};

fn tiny_model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tinynn-models/tests/fixtures/tiny-llama")
}

fn text_file(dir: &Path) -> PathBuf {
    let p = dir.join("data.txt");
    let para = "the license is free software and you can change it. \
                the program is distributed in the hope that it will be useful. ";
    std::fs::write(&p, para.repeat(40)).unwrap();
    p
}

fn finetune(data: &Path, out: &Path, steps: u64, extra: &[&str]) -> common::ffi_wait4::Outcome {
    let mut cmd = tnn();
    cmd.args(["finetune", "-m"])
        .arg(tiny_model())
        .arg("--data")
        .arg(data)
        .args(["--lora", "--alpha", "8", "--dropout", "0.1"])
        .args(["--seq", "16", "--batch", "2"])
        .args(["--lr", "5e-3", "--eval-frac", "0.2", "--eval-every", "2"])
        .args(["-t", "2", "--seed", "3", "--steps"])
        .arg(steps.to_string())
        .arg("--out")
        .arg(out)
        .args(extra);
    // Defaults of this test, unless `extra` sets them.
    for (flag, value) in [("--rank", "4"), ("--targets", "q,v,down")] {
        if !extra.contains(&flag) {
            cmd.args([flag, value]);
        }
    }
    run_measured(&mut cmd)
}

/// (step, loss) of the non-skipped training entries of a metrics log, in order.
fn losses(out: &Path) -> Vec<(u64, u32)> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let mut seen = std::collections::BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v.get("skipped").is_some() || v.get("grad_norm").is_none() {
            continue;
        }
        let loss = v["loss"].as_f64().unwrap() as f32;
        seen.insert(v["step"].as_u64().unwrap(), loss.to_bits());
    }
    seen.into_iter().collect()
}

fn generate(extra: &[&str]) -> String {
    let mut cmd = tnn();
    cmd.args([
        "run",
        "-p",
        "the license",
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "2",
        "-m",
    ])
    .arg(tiny_model())
    .args(extra);
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    out.stdout
}

#[test]
fn lora_finetune_resume_and_run_with_the_adapter() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    // Uninterrupted: 6 steps.
    let full = dir.path().join("full");
    let out = finetune(&data, &full, 6, &["--save-every", "2"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for f in [
        "adapter.gguf",
        "metrics.jsonl",
        "loss.png",
        "latest",
        "checkpoint-6.gguf",
    ] {
        assert!(full.join(f).is_file(), "{f} missing; {}", out.stderr);
    }
    // The baseline before training, then before -> after.
    assert!(
        out.stderr.contains("held-out loss before training"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("held-out loss") && out.stderr.contains(" -> "),
        "{}",
        out.stderr
    );
    assert!(out.max_rss < 1 << 30, "peak RSS {} bytes", out.max_rss);
    let full_losses = losses(&full);
    assert_eq!(full_losses.len(), 6);

    // Interrupted after 4 steps, resumed to 6.
    let part = dir.path().join("part");
    let out = finetune(&data, &part, 4, &["--save-every", "2"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = finetune(&data, &part, 6, &["--save-every", "2", "--resume"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("resumed from"), "{}", out.stderr);
    assert_eq!(losses(&part), full_losses, "resume is bit-exact");

    // A resume with other settings is refused.
    let out = finetune(&data, &part, 8, &["--resume", "--rank", "8"]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("other settings"), "{}", out.stderr);
    let out = finetune(&data, &part, 8, &["--resume", "--bf16"]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("other settings"), "{}", out.stderr);

    // bf16 mixed precision trains the same run to nearly the same losses.
    let bf16 = dir.path().join("bf16");
    let out = finetune(&data, &bf16, 6, &["--bf16"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let bf16_losses = losses(&bf16);
    assert_eq!(bf16_losses.len(), 6);
    for ((s, a), (_, b)) in bf16_losses.iter().zip(&full_losses) {
        let (a, b) = (f32::from_bits(*a), f32::from_bits(*b));
        assert!(
            a.is_finite() && (a - b).abs() <= 0.02 * b.abs(),
            "step {s}: bf16 loss {a} vs f32 {b}"
        );
    }

    // The adapter changes the output; scale 0 does not.
    let adapter = full.join("adapter.gguf");
    let ad = adapter.to_str().unwrap();
    let base = generate(&[]);
    assert_eq!(generate(&["--lora", ad, "--lora-scale", "0"]), base);
    assert_ne!(generate(&["--lora", ad, "--lora-scale", "20"]), base);
    // Repeated adapters add up (llama.cpp's repeated --lora and --lora-scaled FILE S).
    assert_eq!(
        generate(&["--lora-scaled", ad, "20", "--lora-scaled", ad, "-20"]),
        base
    );
    assert_eq!(
        generate(&["--lora", ad, "--lora", ad, "--lora-scale", "10"]),
        generate(&["--lora-scaled", ad, "10", "--lora-scaled", ad, "10"])
    );
}

#[test]
fn three_non_finite_steps_stop_training_with_the_last_checkpoint_intact() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    let out_dir = dir.path().join("run");
    let out = finetune(
        &data,
        &out_dir,
        10,
        &["--save-every", "1", "--inject-nan", "3,4,5"],
    );
    assert_ne!(out.code, Some(0));
    assert!(
        out.stderr.contains("3 non-finite steps in a row")
            && out
                .stderr
                .contains("the last checkpoint (step 2) is intact"),
        "{}",
        out.stderr
    );
    assert_eq!(
        std::fs::read_to_string(out_dir.join("latest"))
            .unwrap()
            .trim(),
        "checkpoint-2.gguf"
    );
    // Two bad steps are skipped and training goes on.
    let ok_dir = dir.path().join("ok");
    let out = finetune(&data, &ok_dir, 4, &["--inject-nan", "2,3"]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stderr.contains("update skipped"), "{}", out.stderr);
    assert_eq!(losses(&ok_dir).len(), 4);
}

/// `tnn train --config CONFIG` on `data` (sequences of 16, batches of 2, 2 threads, no
/// held-out split) for `steps` at learning rate `lr`, exporting F32 into `out`.
fn train_scratch(config: &Path, data: &Path, out: &Path, steps: u32, lr: &str) -> Outcome {
    let steps = steps.to_string();
    let mut cmd = tnn();
    cmd.args(["train", "--config"])
        .arg(config)
        .arg("--data")
        .arg(data)
        .args(["--seq", "16", "--batch", "2", "--steps", &steps, "--lr", lr])
        .args([
            "-t",
            "2",
            "--eval-frac",
            "0",
            "--export-type",
            "f32",
            "--out",
        ])
        .arg(out);
    run_measured(&mut cmd)
}

#[test]
fn train_from_a_config_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    let config = dir.path().join("model.json");
    std::fs::write(
        &config,
        r#"{"n_embd": 32, "n_layer": 1, "n_head": 4, "n_head_kv": 2, "n_ff": 64, "n_ctx": 64}"#,
    )
    .unwrap();
    let out_dir = dir.path().join("scratch");
    let out = train_scratch(&config, &data, &out_dir, 3, "1e-3");
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let model = out_dir.join("model.gguf");
    assert!(model.is_file());
    // The trained model runs.
    let mut cmd = tnn();
    cmd.args([
        "run", "-p", "the", "-n", "4", "--temp", "0", "-t", "1", "-m",
    ])
    .arg(&model);
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    // Bad inputs: one-line errors.
    let bad = dir.path().join("data.csv");
    std::fs::write(&bad, "x").unwrap();
    let out = finetune(&bad, &dir.path().join("x"), 1, &[]);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("unknown data format"), "{}", out.stderr);
    // A file without an extension (like GPL-3) is text.
    let plain = dir.path().join("LICENSE");
    std::fs::copy(&data, &plain).unwrap();
    let out = finetune(&plain, &dir.path().join("plain"), 1, &[]);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let out = finetune(&data, &dir.path().join("y"), 1, &["--targets", "q,zz"]);
    assert!(out.stderr.contains("unknown LoRA target"), "{}", out.stderr);
    let mut cmd = tnn();
    cmd.args(["run", "-p", "x", "-n", "1", "-m"])
        .arg(tiny_model())
        .arg("--lora")
        .arg(&model);
    let out = run_measured(&mut cmd);
    assert_ne!(out.code, Some(0));
    assert!(out.stderr.contains("general.type"), "{}", out.stderr);
}

/// A mixture of experts trained from scratch (`n_expert`, `n_expert_used` in the config): the
/// loss falls, the exported model names its experts and runs; expert settings that cannot
/// work are one-line errors.
#[test]
fn train_a_mixture_of_experts_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    let train = |name: &str, json: &str| {
        let config = dir.path().join(format!("{name}.json"));
        std::fs::write(&config, json).unwrap();
        train_scratch(&config, &data, &dir.path().join(name), 8, "3e-3")
    };
    let out = train(
        "moe",
        r#"{"n_embd": 32, "n_layer": 2, "n_head": 4, "n_ff": 48, "n_ctx": 64, "n_expert": 4, "n_expert_used": 2}"#,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let metrics = std::fs::read_to_string(dir.path().join("moe/metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect();
    assert!(
        losses.len() >= 8 && losses[losses.len() - 1] < losses[0],
        "losses {losses:?}"
    );
    let model = dir.path().join("moe/model.gguf");
    let shown = run_measured(tnn().arg("inspect").arg(&model));
    assert!(
        shown
            .stdout
            .contains("experts         4 per block, 2 per token"),
        "{}",
        shown.stdout
    );
    let mut cmd = tnn();
    cmd.args([
        "run", "-p", "the", "-n", "4", "--temp", "0", "-t", "1", "-m",
    ])
    .arg(&model);
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    for (json, want) in [
        (
            r#"{"n_embd": 32, "n_layer": 1, "n_head": 4, "n_ff": 48, "n_expert": 4}"#,
            "go together",
        ),
        (
            r#"{"n_embd": 32, "n_layer": 1, "n_head": 4, "n_ff": 48, "n_expert": 4, "n_expert_used": 5}"#,
            "n_expert_used 5",
        ),
        (
            r#"{"n_embd": 32, "n_layer": 1, "n_head": 4, "n_ff": 48, "n_expert": 100000, "n_expert_used": 2}"#,
            "n_expert 100000",
        ),
        (
            r#"{"architecture": "gemma", "n_embd": 32, "n_layer": 1, "n_head": 4, "n_ff": 48, "n_expert": 4, "n_expert_used": 2}"#,
            "no mixture-of-experts form",
        ),
    ] {
        let out = train("bad", json);
        assert_ne!(out.code, Some(0), "{json}");
        assert!(out.stderr.contains(want), "{json}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    }
}

/// Mamba trained from scratch (`architecture: "mamba"`, SSM sizes in the config): the loss
/// falls, the export names its SSM sizes and runs; settings that cannot work are one-line
/// errors.
#[test]
fn train_a_mamba_from_scratch() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    let train = |name: &str, json: &str| {
        let config = dir.path().join(format!("{name}.json"));
        std::fs::write(&config, json).unwrap();
        train_scratch(&config, &data, &dir.path().join(name), 8, "3e-3")
    };
    let out = train(
        "mamba",
        r#"{"architecture": "mamba", "n_embd": 32, "n_layer": 2, "n_ctx": 64, "ssm_state": 8}"#,
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let metrics = std::fs::read_to_string(dir.path().join("mamba/metrics.jsonl")).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64())
        .collect();
    assert!(
        losses.len() >= 8 && losses[losses.len() - 1] < losses[0],
        "losses {losses:?}"
    );
    let model = dir.path().join("mamba/model.gguf");
    let shown = run_measured(tnn().arg("inspect").arg(&model));
    for row in [
        "architecture:  mamba",
        "ssm inner       64",
        "ssm state       8",
        "ssm dt rank     2",
    ] {
        assert!(shown.stdout.contains(row), "{row}: {}", shown.stdout);
    }
    let mut cmd = tnn();
    cmd.args([
        "run", "-p", "the", "-n", "4", "--temp", "0", "-t", "1", "-m",
    ])
    .arg(&model);
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);

    for (json, want) in [
        (
            r#"{"architecture": "mamba", "n_embd": 32, "n_layer": 1, "n_head": 4}"#,
            "no attention",
        ),
        (
            r#"{"architecture": "mamba", "n_embd": 32, "n_layer": 1, "ssm_conv": 1}"#,
            "SSM convolution width",
        ),
        (
            r#"{"architecture": "mamba", "n_embd": 32, "n_layer": 1, "ssm_state": 100000}"#,
            "SSM state size",
        ),
        (
            r#"{"n_embd": 32, "n_layer": 1, "n_head": 4, "n_ff": 48, "ssm_state": 8}"#,
            "for Mamba",
        ),
    ] {
        let out = train("bad", json);
        assert_ne!(out.code, Some(0), "{json}");
        assert!(out.stderr.contains(want), "{json}: {}", out.stderr);
        assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    }
}

/// Ctrl-C (SIGINT) saves a checkpoint and exits cleanly; `--resume` continues from it.
#[test]
fn ctrl_c_saves_a_checkpoint_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    let out_dir = dir.path().join("run");
    let err_path = dir.path().join("stderr");
    let mut child = tnn()
        .args(["finetune", "-m"])
        .arg(tiny_model())
        .arg("--data")
        .arg(&data)
        .args(["--lora", "--seq", "16", "--batch", "2", "-t", "1"])
        .args(["--steps", "1000000", "--eval-frac", "0", "--out"])
        .arg(&out_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    // Wait for a few steps in the metrics log.
    let log = out_dir.join("metrics.jsonl");
    let t0 = std::time::Instant::now();
    while std::fs::read_to_string(&log).map_or(0, |s| s.lines().count()) < 3 {
        assert!(t0.elapsed().as_secs() < 120, "no progress");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Ctrl-C, as a terminal sends it (through kill(1), so the test calls no C functions).
    let sent = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    let status = child.wait().unwrap();
    let stderr = std::fs::read_to_string(&err_path).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("interrupted at step"), "{stderr}");
    let latest = std::fs::read_to_string(out_dir.join("latest")).unwrap();
    let step: u64 = latest
        .trim()
        .strip_prefix("checkpoint-")
        .and_then(|s| s.strip_suffix(".gguf"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(step >= 3);
    let mut cmd = tnn();
    cmd.args(["finetune", "-m"])
        .arg(tiny_model())
        .arg("--data")
        .arg(&data)
        .args(["--lora", "--seq", "16", "--batch", "2", "-t", "1"])
        .args(["--eval-frac", "0", "--resume", "--steps"])
        .arg((step + 2).to_string())
        .arg("--out")
        .arg(&out_dir);
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out_dir.join("adapter.gguf").is_file());
}

/// A `tnn` built without the `mpi` feature, started as one of several MPI processes, refuses
/// to train (N copies of one run would fight over --out) and says how to get MPI support.
#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_mpi_feature_a_process_of_an_mpi_job_refuses_to_train() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"] {
        let out = tnn()
            .args(["finetune", "-m"])
            .arg(tiny_model())
            .arg("--data")
            .arg(&data)
            .args(["--lora", "--seq", "16", "--steps", "1", "--out"])
            .arg(dir.path().join("out"))
            .env(var, "2")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert!(
            err.contains("one of 2 started by mpirun") && err.contains("--features mpi"),
            "{err}"
        );
        assert!(!dir.path().join("out").exists(), "nothing is written");
    }
}

/// A run that would end by writing a GGUF model from a Hugging Face directory (full
/// fine-tuning, or LoRA with `--merge`) is refused before its first step, not after training;
/// a LoRA adapter alone trains on the directory.
#[test]
fn a_gguf_model_from_a_hugging_face_directory_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let data = text_file(dir.path());
    for extra in [&[][..], &["--lora", "--merge"][..]] {
        let out_dir = dir.path().join("out");
        let out = tnn()
            .args(["finetune", "-m"])
            .arg(tiny_model())
            .arg("--data")
            .arg(&data)
            .args(["--seq", "16", "--steps", "2", "-t", "1", "--out"])
            .arg(&out_dir)
            .args(extra)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?}");
        assert!(
            err.contains("not loaded") && err.contains("tnn convert"),
            "{extra:?}: {err}"
        );
        assert!(
            !err.contains("step 1"),
            "{extra:?}: it trained first: {err}"
        );
        assert!(
            !out_dir.join("latest").exists(),
            "{extra:?}: a checkpoint was written"
        );
    }
    let out = tnn()
        .args(["finetune", "-m"])
        .arg(tiny_model())
        .arg("--data")
        .arg(&data)
        .args(["--lora", "--seq", "16", "--steps", "2", "-t", "1", "--out"])
        .arg(dir.path().join("adapter-only"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("adapter-only/adapter.gguf").exists());
}

/// QLoRA on the fixture converted to Q8_0: the gradient products through the base are int8 by
/// default and f32 with `--f32-backward`. The first step's loss (forward only) is the same
/// bits; the later ones differ where the packed kernels run, and stay close.
#[test]
fn f32_backward_switches_the_qlora_gradient_products() {
    let dir = tempfile::tempdir().unwrap();
    let q8 = dir.path().join("tiny-q8_0.gguf");
    let mut cmd = tnn();
    cmd.arg("convert").arg(tiny_model()).arg(&q8).arg("q8_0");
    let out = run_measured(&mut cmd);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let data = text_file(dir.path());
    let run = |name: &str, extra: &[&str]| {
        let out_dir = dir.path().join(name);
        let mut cmd = tnn();
        cmd.args(["finetune", "-m"])
            .arg(&q8)
            .arg("--data")
            .arg(&data)
            .args(["--lora", "--rank", "4", "--targets", "q,v,up,down"])
            .args([
                "--seq",
                "16",
                "--batch",
                "2",
                "--lr",
                "1e-2",
                "--eval-frac",
                "0",
            ])
            .args(["-t", "2", "--seed", "3", "--steps", "4", "--out"])
            .arg(&out_dir)
            .args(extra);
        let out = run_measured(&mut cmd);
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        losses(&out_dir)
    };
    let (int8, f32s) = (run("int8", &[]), run("f32", &["--f32-backward"]));
    assert_eq!(int8.len(), 4);
    assert_eq!(int8[0], f32s[0], "step 1 is the same forward pass");
    let mut differ = false;
    for (&(_, a), &(_, b)) in int8.iter().zip(&f32s) {
        let (a, b) = (f32::from_bits(a), f32::from_bits(b));
        assert!((a - b).abs() < 0.02 * b.abs(), "{a} vs {b}");
        differ |= a != b;
    }
    if tinynn_cpu::packed::packs(tinynn_format::GgmlType::Q8_0) {
        assert!(differ, "the int8 products were not taken");
    } else {
        assert!(!differ, "no packed kernels: both runs are f32");
    }
}
