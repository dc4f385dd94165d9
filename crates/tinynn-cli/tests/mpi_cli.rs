//! `mpirun -np 2 tnn finetune` (the `mpi` feature; `scripts/test-mpi.sh` installs Open MPI and
//! runs this test): data-parallel training across two processes on the tiny Llama fixture.
//!
//! - Equivalence: 2 ranks × `--batch 2` give the per-step losses of 1 process × `--batch 4`
//!   within 1e-5 (relative), and final weights within 1e-5 (relative L2, tensor by tensor),
//!   for full fine-tuning and LoRA, with gradient accumulation.
//! - Summing gradients during the backward pass (`--overlap on`) changes no bit.
//! - Resume under MPI is bit-exact; a resume with another number of ranks is refused.
//! - A rank killed mid-run ends the job with an error within a bounded time, and the last
//!   checkpoint resumes.
#![cfg(feature = "mpi")]

#[allow(dead_code, unused_imports)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::tnn;
use tinynn_format::gguf::GgufFile;
use tinynn_format::GgmlType;

fn tiny_hf() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tinynn-models/tests/fixtures/tiny-llama")
}

/// The fixture as a GGUF file (a full fine-tune exports a GGUF model only from one).
fn tiny_gguf(dir: &Path) -> PathBuf {
    let p = dir.join("tiny.gguf");
    let out = tnn()
        .arg("convert")
        .arg(tiny_hf())
        .arg(&p)
        .arg("f32")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    p
}

fn text_file(dir: &Path) -> PathBuf {
    let p = dir.join("data.txt");
    let para = "the license is free software and you can change it. \
                the program is distributed in the hope that it will be useful. ";
    std::fs::write(&p, para.repeat(40)).unwrap();
    p
}

/// `mpirun` for `n` ranks on this machine (as root too; no single-copy shared memory, which
/// containers often forbid), marked with `tag` in every rank's environment.
fn mpirun(n: usize, tag: &str) -> Command {
    let mut cmd = Command::new("mpirun");
    cmd.args(["--oversubscribe", "-np", &n.to_string()])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .env("TNN_MPI_TEST", tag)
        .arg(env!("CARGO_BIN_EXE_tnn"));
    cmd
}

/// The finetune arguments shared by every run here.
fn finetune_args(model: &Path, data: &Path, out: &Path, batch: usize, steps: u64) -> Vec<String> {
    let mut a: Vec<String> = ["finetune", "-m"].map(String::from).to_vec();
    a.push(model.display().to_string());
    a.extend(["--data".to_string(), data.display().to_string()]);
    for s in [
        "--seq",
        "16",
        "--accum",
        "2",
        "--lr",
        "5e-3",
        "--eval-frac",
        "0.2",
        "--eval-every",
        "5",
        "--save-every",
        "2",
        "--export-type",
        "f32",
        "-t",
        "1",
        "--seed",
        "3",
    ] {
        a.push(s.to_string());
    }
    a.extend(["--batch".into(), batch.to_string()]);
    a.extend(["--steps".into(), steps.to_string()]);
    a.extend(["--out".into(), out.display().to_string()]);
    a
}

const LORA: [&str; 8] = [
    "--lora",
    "--rank",
    "4",
    "--alpha",
    "8",
    "--dropout",
    "0",
    "--targets=q,v,down",
];

fn ok(out: Output, what: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{what}: {err}");
    err
}

/// (step, loss) of the training entries of a metrics log.
fn losses(out: &Path) -> Vec<(u64, f32)> {
    let text = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    text.lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("grad_norm").is_some_and(|g| !g.is_null()))
        .map(|v| {
            (
                v["step"].as_u64().unwrap(),
                v["loss"].as_f64().unwrap() as f32,
            )
        })
        .collect()
}

/// Every F32 tensor of a GGUF file, by name.
fn tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let f = GgufFile::open(path).unwrap();
    f.tensors()
        .filter(|t| t.ggml_type() == GgmlType::F32)
        .map(|t| {
            let v = t
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (t.name().to_string(), v)
        })
        .collect()
}

/// ‖a − b‖₂ / ‖a‖₂ of the worst tensor, and of all tensors together.
fn weights_rel(a: &Path, b: &Path) -> (f64, f64) {
    let (x, y) = (tensors(a), tensors(b));
    assert_eq!(x.len(), y.len());
    assert!(!x.is_empty());
    let (mut worst, mut d_all, mut n_all) = (0f64, 0f64, 0f64);
    for ((na, va), (nb, vb)) in x.iter().zip(&y) {
        assert_eq!(na, nb);
        let (mut d2, mut n2) = (0f64, 0f64);
        for (&p, &q) in va.iter().zip(vb) {
            d2 += (f64::from(p) - f64::from(q)).powi(2);
            n2 += f64::from(p).powi(2);
        }
        let d = (d2 / n2.max(1e-300)).sqrt();
        worst = if d.is_nan() {
            f64::INFINITY
        } else {
            worst.max(d)
        };
        d_all += d2;
        n_all += n2;
    }
    let all = (d_all / n_all.max(1e-300)).sqrt();
    (worst, if all.is_nan() { f64::INFINITY } else { all })
}

/// What a run of [`equivalence`] trains.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// Every weight of the F32 fixture.
    Full,
    /// A LoRA adapter on the F32 fixture.
    Lora,
    /// A LoRA adapter on the fixture quantized to Q8_0.
    Qlora,
    /// A model from scratch (`tnn train`, the fixture's tokenizer).
    Scratch,
}

fn equivalence(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let (mut model, data) = (tiny_gguf(dir.path()), text_file(dir.path()));
    if kind == Kind::Qlora {
        let q = dir.path().join("tiny-q8_0.gguf");
        let out = tnn()
            .arg("quantize")
            .arg(&model)
            .arg(&q)
            .arg("q8_0")
            .output();
        ok(out.unwrap(), "quantize");
        model = q;
    }
    let config = dir.path().join("scratch.json");
    let scratch = r#"{"n_embd": 32, "n_layer": 2, "n_head": 4, "n_head_kv": 2, "n_ff": 64}"#;
    std::fs::write(&config, scratch).unwrap();
    let (one, two) = (dir.path().join("one"), dir.path().join("two"));
    let lora = matches!(kind, Kind::Lora | Kind::Qlora);
    let args = |out: &Path, batch: usize| -> Vec<String> {
        let mut a = finetune_args(&model, &data, out, batch, 10);
        if kind == Kind::Scratch {
            // `tnn train --config C --tokenizer MODEL` in place of `tnn finetune -m MODEL`.
            a[0] = "train".into();
            a[1] = "--tokenizer".into();
            a.splice(0..0, ["--config".to_string(), config.display().to_string()]);
            a.rotate_left(2);
        }
        if lora {
            // A LoRA factor starts at zero, where Adam's steps are all rounding-sensitive
            // signs at first: a lower rate keeps 10 steps well inside the tolerance (at 5e-3
            // the worst step's loss differs by 1.0e-5).
            let i = a.iter().position(|s| s == "--lr").unwrap();
            a[i + 1] = "1e-3".into();
            a.extend(LORA.map(String::from));
        }
        a
    };
    ok(tnn().args(args(&one, 4)).output().unwrap(), "one process");
    let out = mpirun(2, "equivalence").args(args(&two, 2)).output();
    let err = ok(out.unwrap(), "two ranks");
    assert!(
        err.contains("2 ranks:") && err.contains("all-reduce"),
        "{err}"
    );
    let (a, b) = (losses(&one), losses(&two));
    assert_eq!(a.len(), 10);
    assert_eq!(a.len(), b.len());
    let mut worst_loss = 0f64;
    for ((s, x), (t, y)) in a.iter().zip(&b) {
        assert_eq!(s, t);
        let rel = ((x - y).abs() / x.abs().max(1e-30)) as f64;
        assert!(rel < 1e-5, "{kind:?}, step {s}: loss {x} vs {y}");
        worst_loss = worst_loss.max(rel);
    }
    let file = if lora { "adapter.gguf" } else { "model.gguf" };
    let (worst, all) = weights_rel(&one.join(file), &two.join(file));
    eprintln!(
        "{kind:?}: losses within {worst_loss:.1e}; final weights differ by {all:.2e} \
         (relative L2; worst tensor {worst:.2e})"
    );
    // Every weight of a model is held to 1e-5 tensor by tensor. A LoRA `B` starts at zero
    // and after 10 steps is ~20× smaller than `A`: the same absolute rounding (~4e-7, sums of
    // per-token gradients taken in another order) is ~2e-5 of it, so an adapter is held to
    // 1e-5 as a whole.
    let w = if lora { all } else { worst };
    assert!(w < 1e-5, "{kind:?}: weights differ by {w:e}");
    // Summing during the backward pass (forced: each rank here has one core, so `auto` sums
    // after it) adds the same two numbers for every value: the same run, bit for bit.
    let overlapped = dir.path().join("overlapped");
    let out = mpirun(2, "overlap")
        .args(args(&overlapped, 2))
        .args(["--overlap", "on"])
        .output();
    ok(out.unwrap(), "two ranks, overlapped");
    let bits = |p: &Path| -> Vec<(u64, u32)> {
        losses(p)
            .into_iter()
            .map(|(s, l)| (s, l.to_bits()))
            .collect()
    };
    assert_eq!(bits(&two), bits(&overlapped), "{kind:?}");
    let read = |p: &Path| std::fs::read(p.join(file)).unwrap();
    assert!(
        read(&two) == read(&overlapped),
        "{kind:?}: overlap changed the weights"
    );
}

#[test]
fn two_ranks_of_batch_2_match_one_process_of_batch_4_full() {
    equivalence(Kind::Full);
}

#[test]
fn two_ranks_of_batch_2_match_one_process_of_batch_4_lora() {
    equivalence(Kind::Lora);
}

#[test]
fn two_ranks_of_batch_2_match_one_process_of_batch_4_qlora() {
    equivalence(Kind::Qlora);
}

#[test]
fn two_ranks_of_batch_2_match_one_process_of_batch_4_from_scratch() {
    equivalence(Kind::Scratch);
}

#[test]
fn resume_under_mpi_is_bit_exact_and_other_rank_counts_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = (tiny_gguf(dir.path()), text_file(dir.path()));
    let (straight, split) = (dir.path().join("straight"), dir.path().join("split"));
    let run = |out: &Path, steps: u64, resume: bool| {
        let mut cmd = mpirun(2, "resume");
        cmd.args(finetune_args(&model, &data, out, 2, steps))
            .args(LORA);
        if resume {
            cmd.arg("--resume");
        }
        ok(cmd.output().unwrap(), "two ranks")
    };
    run(&straight, 8, false);
    run(&split, 4, false);
    let err = run(&split, 8, true);
    assert!(err.contains("resumed from"), "{err}");
    let bits = |p: &Path| -> Vec<(u64, u32)> {
        losses(p)
            .into_iter()
            .map(|(s, l)| (s, l.to_bits()))
            .collect()
    };
    assert_eq!(bits(&straight), bits(&split));
    let read = |p: &Path| std::fs::read(p.join("adapter.gguf")).unwrap();
    assert_eq!(read(&straight), read(&split), "the adapters differ");
    // One process cannot continue what two ranks wrote.
    let out = tnn()
        .args(finetune_args(&model, &data, &split, 2, 10))
        .args(LORA)
        .arg("--resume")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("ranks is 2 in the checkpoint, unset in this run"),
        "{err}"
    );
}

/// The pid of the rank `rank` process of the job tagged `tag`.
fn rank_pid(tag: &str, rank: usize) -> Option<i32> {
    let want = [
        format!("TNN_MPI_TEST={tag}"),
        format!("OMPI_COMM_WORLD_RANK={rank}"),
    ];
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let exe = std::fs::read_link(entry.path().join("exe")).unwrap_or_default();
        if exe.file_name().is_some_and(|n| n == "tnn")
            && want.iter().all(|w| vars.contains(&w.as_bytes()))
        {
            return Some(pid);
        }
    }
    None
}

/// The steps of the checkpoints in `dir`, ascending.
fn checkpoints(dir: &Path) -> Vec<u64> {
    let mut steps: Vec<u64> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.strip_prefix("checkpoint-")?
                .strip_suffix(".gguf")?
                .parse()
                .ok()
        })
        .collect();
    steps.sort_unstable();
    steps
}

#[test]
fn a_killed_rank_ends_the_job_and_the_last_checkpoint_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let (model, data) = (tiny_gguf(dir.path()), text_file(dir.path()));
    let out = dir.path().join("out");
    let mut job = mpirun(2, "killed")
        .args(finetune_args(&model, &data, &out, 2, 10_000_000))
        .args(LORA)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    // Checkpoints come every 2 steps and older ones are removed: wait for any.
    while checkpoints(&out).is_empty() {
        if started.elapsed() > Duration::from_secs(120) {
            let _ = job.kill();
            panic!("no checkpoint within 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (Some(pid), Some(rank0)) = (rank_pid("killed", 1), rank_pid("killed", 0)) else {
        let _ = job.kill();
        panic!("the ranks' processes were not found");
    };
    // SAFETY-free: kill(1) from the system, as a user or the kernel's OOM killer would.
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.unwrap().success());
    let t = Instant::now();
    let status = loop {
        if let Some(s) = job.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = job.kill();
            let _ = Command::new("kill")
                .args(["-9", &rank0.to_string()])
                .status();
            panic!("the job did not end within 60 s of a rank's death");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    use std::io::Read;
    job.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    eprintln!(
        "the job ended {:.2} s after rank 1 was killed",
        t.elapsed().as_secs_f64()
    );
    assert!(!status.success(), "{err}");
    assert!(err.contains("signal 9") || err.contains("Killed"), "{err}");
    // No rank is left behind (mpirun may return while rank 0 is still being ended).
    while std::fs::read_to_string(format!("/proc/{rank0}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "rank 0 outlived the job"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The newest checkpoint is whole: a resume continues from it.
    let mut cmd = mpirun(2, "resumed");
    let newest = std::fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().to_string();
            n.strip_prefix("checkpoint-")?
                .strip_suffix(".gguf")?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    cmd.args(finetune_args(&model, &data, &out, 2, newest + 2))
        .args(LORA)
        .arg("--resume");
    let resumed = ok(cmd.output().unwrap(), "resume after the kill");
    assert!(resumed.contains("resumed from"), "{resumed}");
    assert!(out.join("adapter.gguf").is_file());
}
