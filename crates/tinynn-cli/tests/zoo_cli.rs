//! Every model-zoo architecture through the `tnn` commands a user runs, on the tiny random
//! fixtures of `tinynn-models` (made by transformers, scripts/make-zoo-fixtures.py) with the
//! tiny Llama's byte-level BPE vocabulary beside them (the fixtures share its 320 ids):
//! `inspect` names the architecture and what is special about it; `convert` writes a GGUF file
//! whose greedy text equals the directory's; `quantize` to Q8_0 keeps perplexity within 5% of
//! F32; `perplexity`, `run` and `finetune` (full and LoRA, whose adapter `run` then applies)
//! work on each.

#[allow(dead_code, unused_imports)]
mod common;

use std::path::{Path, PathBuf};

use common::{run_measured, tnn};

const LICENSE: &str = "/usr/share/common-licenses/GPL-3";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tinynn-models/tests/fixtures")
}

/// The fixture `name` as a complete HF directory in `dir`: its config and weights, and the
/// tiny Llama's tokenizer.
fn hf_dir(name: &str, dir: &Path) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for f in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join(name).join(f), out.join(f)).unwrap();
    }
    std::fs::copy(
        fixtures().join("tiny-llama/tokenizer.json"),
        out.join("tokenizer.json"),
    )
    .unwrap();
    out
}

/// Runs `tnn args`, which must succeed: its stdout.
fn ok(what: &str, args: &[&str]) -> String {
    let out = run_measured(tnn().args(args));
    assert_eq!(out.code, Some(0), "{what}: tnn {args:?}\n{}", out.stderr);
    out.stdout
}

/// The final perplexity `tnn perplexity` prints.
fn perplexity(what: &str, model: &str) -> f64 {
    let out = ok(
        what,
        &[
            "perplexity",
            "-m",
            model,
            "-f",
            LICENSE,
            "-c",
            "32",
            "--chunks",
            "6",
            "-t",
            "2",
        ],
    );
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("{what}: no final estimate in {out}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

/// Greedy text from `model` (strict mode, so a directory and its GGUF file agree exactly).
fn greedy(what: &str, model: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "run",
        "-m",
        model,
        "-p",
        "This License",
        "-n",
        "12",
        "--temp",
        "0",
        "--ignore-eos",
        "--strict",
        "--no-display-prompt",
    ];
    args.extend_from_slice(extra);
    ok(what, &args)
}

/// (fixture, architecture `tnn inspect` names for the directory, a line of its special
/// hyperparameters).
const ZOO: [(&str, &str, &str); 9] = [
    (
        "tiny-mistral-swa",
        "mistral",
        "sliding window  4 tokens on 2 of 2 blocks",
    ),
    ("tiny-gemma", "gemma", "embd scale"),
    ("tiny-gemma2", "gemma2", "logit softcap   3"),
    ("tiny-gemma3", "gemma3_text", "swa rope base   10000"),
    ("tiny-gpt2", "gpt2", "context length  64"),
    ("tiny-gptneox", "gpt_neox", "rope dims       2"),
    (
        "tiny-phi3",
        "phi3",
        "sliding window  4 tokens on 2 of 2 blocks",
    ),
    (
        "tiny-mixtral",
        "mixtral",
        "experts         4 per block, 2 per token",
    ),
    ("tiny-mamba", "mamba", "ssm state       8"),
];

#[test]
fn every_zoo_architecture_inspects_converts_quantizes_runs_and_fine_tunes() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data.txt");
    let text = std::fs::read_to_string(LICENSE).unwrap();
    std::fs::write(&data, &text[..6000]).unwrap();
    let data = data.to_str().unwrap();
    for (name, arch, special) in ZOO {
        let hf = hf_dir(name, tmp.path());
        let hf_s = hf.to_str().unwrap();
        let shown = ok(name, &["inspect", hf_s]);
        assert!(
            shown.contains(&format!("architecture:  {arch}\n")) && shown.contains(special),
            "{name}: inspect shows\n{shown}"
        );

        let f32 = tmp.path().join(format!("{name}-f32.gguf"));
        let q8 = tmp.path().join(format!("{name}-q8_0.gguf"));
        let (f32_s, q8_s) = (f32.to_str().unwrap(), q8.to_str().unwrap());
        ok(name, &["convert", hf_s, f32_s, "F32"]);
        ok(name, &["quantize", f32_s, q8_s, "Q8_0", "-t", "2"]);
        assert!(
            ok(name, &["inspect", f32_s]).contains(special),
            "{name}: the GGUF file keeps {special:?}"
        );

        let from_dir = greedy(name, hf_s, &[]);
        assert!(!from_dir.trim().is_empty(), "{name}: no text");
        assert_eq!(
            greedy(name, f32_s, &[]),
            from_dir,
            "{name}: GGUF vs directory"
        );
        ok(name, &["run", "-m", q8_s, "-p", "This License", "-n", "8"]);

        let (p32, p8) = (perplexity(name, f32_s), perplexity(name, q8_s));
        assert!(p32.is_finite() && p32 > 1.0, "{name}: perplexity {p32}");
        assert!(
            (p8 / p32 - 1.0).abs() < 0.05,
            "{name}: Q8_0 perplexity {p8} vs F32 {p32}"
        );

        let finetune = |out: &Path, extra: &[&str]| {
            let mut args = vec![
                "finetune", "-m", f32_s, "--data", data, "--seq", "16", "--batch", "2", "--steps",
                "3", "--lr", "1e-3", "-t", "2", "--out",
            ];
            args.push(out.to_str().unwrap());
            args.extend_from_slice(extra);
            ok(name, &args);
        };
        let lora = tmp.path().join(format!("{name}-lora"));
        finetune(&lora, &["--lora", "--targets", "all", "--dropout", "0"]);
        let adapter = lora.join("adapter.gguf");
        assert!(adapter.is_file(), "{name}: no adapter");
        greedy(name, f32_s, &["--lora", adapter.to_str().unwrap()]);
        let full = tmp.path().join(format!("{name}-full"));
        finetune(&full, &["--export-type", "f32"]);
        let tuned = full.join("model.gguf");
        assert!(tuned.is_file(), "{name}: no model");
        let tuned_text = greedy(name, tuned.to_str().unwrap(), &[]);
        assert!(
            !tuned_text.trim().is_empty(),
            "{name}: fine-tuned model gives no text"
        );
        eprintln!("{name}: ppl F32 {p32:.3} Q8_0 {p8:.3}; greedy {from_dir:?}");
    }
}
