//! `tnn inspect` end to end: the real model's facts, JSON, HF inputs, and hostile files.

mod common;

use common::{real_model, run_measured, tnn};
use serde_json::Value;
use tinynn_format::malformed_corpus::cases;

#[test]
fn inspect_smollm2_text() {
    let out = run_measured(tnn().arg("inspect").arg(real_model()));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let s = &out.stdout;
    for needle in [
        "format:        GGUF v3",
        "architecture:  llama",
        "file type:     Q4_1",
        "parameters:    134.5 M (134515008)",
        "tensors:       272 (",
        "  embedding       576\n",
        "  blocks          30\n",
        "  heads           9\n",
        "  KV heads        3\n",
        "  norm eps        0.00001\n",
        "tokenizer.ggml.tokens                   array<string>  49152 strings",
        "blk.0.attn_q.weight",
        "  Q4_1       210 tensors",
    ] {
        assert!(s.contains(needle), "missing {needle:?} in:\n{s}");
    }
}

#[test]
fn inspect_smollm2_json() {
    let out = run_measured(tnn().args(["inspect", "--json"]).arg(real_model()));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let j: Value = serde_json::from_str(&out.stdout).expect("valid JSON");
    assert_eq!(j["format"], "gguf");
    assert_eq!(j["architecture"], "llama");
    assert_eq!(j["n_tensors"], 272);
    assert_eq!(j["n_params"], 134_515_008u64);
    assert_eq!(j["config"]["n_layer"], 30);
    assert_eq!(j["config"]["n_embd"], 576);
    assert_eq!(j["config"]["n_head"], 9);
    assert_eq!(j["config"]["n_head_kv"], 3);
    assert_eq!(j["tensors"].as_array().unwrap().len(), 272);
    let tokens = j["metadata"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["key"] == "tokenizer.ggml.tokens")
        .unwrap();
    assert_eq!(tokens["value"]["len"], 49152);
    assert_eq!(tokens["summary"], "49152 strings");
}

#[test]
fn inspect_without_a_path_uses_the_default_model() {
    let model = real_model();
    let root = model.parent().and_then(|p| p.parent()).unwrap();
    let out = run_measured(
        tnn()
            .args(["inspect", "--no-tensors"])
            .env("TINYNN_CACHE", root),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("blk.0.attn_q.weight"));
}

#[test]
fn inspect_hf_directory_and_safetensors_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = r#"{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "torch_dtype": "float32"}"#;
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    let header =
        br#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[4,8],"data_offsets":[0,128]}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    st.extend_from_slice(&[0u8; 128]);
    std::fs::write(dir.path().join("model.safetensors"), &st).unwrap();

    let out = run_measured(tnn().args(["inspect", "--json"]).arg(dir.path()));
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let j: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(
        (j["format"].as_str(), j["architecture"].as_str()),
        (Some("hf-dir"), Some("qwen2"))
    );
    assert_eq!(
        (j["n_params"].as_u64(), j["config"]["head_dim"].as_u64()),
        (Some(32), Some(4))
    );

    let out = run_measured(
        tnn()
            .arg("inspect")
            .arg(dir.path().join("model.safetensors")),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout.contains("model.embed_tokens.weight  F32"),
        "{}",
        out.stdout
    );
}

/// Every file of the malformed corpus: exit code 1, one line on stderr naming the byte offset,
/// nothing on stdout, no panic, peak RSS under 64 MiB.
#[test]
fn malformed_corpus_exits_1_with_one_line() {
    const RSS_LIMIT: u64 = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let all = cases();
    assert!(all.len() >= 100);
    let mut failures = Vec::new();
    let mut peak = 0;
    for case in &all {
        let path = dir.path().join(format!("{}.gguf", case.name));
        std::fs::write(&path, &case.bytes).unwrap();
        let out = run_measured(tnn().arg("inspect").arg(&path));
        peak = peak.max(out.max_rss);
        let err = out.stderr.trim_end_matches('\n');
        let ok = out.code == Some(1)
            && out.stdout.is_empty()
            && !err.contains('\n')
            && err.starts_with("error: ")
            && err.matches("invalid GGUF at byte ").count() == 1
            && !err.contains("panicked")
            && out.max_rss < RSS_LIMIT;
        if !ok {
            failures.push(format!(
                "{}: code {:?}, rss {} B, stderr {err:?}",
                case.name, out.code, out.max_rss
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "{} malformed files, peak RSS {:.1} MiB",
        all.len(),
        peak as f64 / (1 << 20) as f64
    );
}

#[test]
fn other_bad_inputs_are_one_line_errors() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": 5}").unwrap();
    for (path, needle) in [
        (dir.path().join("missing.gguf"), "missing.gguf"),
        (dir.path().to_path_buf(), "config.json"),
    ] {
        let out = run_measured(tnn().arg("inspect").arg(&path));
        let err = out.stderr.trim_end();
        assert_eq!(out.code, Some(1), "{err}");
        assert!(
            err.starts_with("error: ") && !err.contains('\n') && err.matches(needle).count() == 1,
            "{err}"
        );
    }
}

#[test]
fn plan_prints_decode_and_prefill_layouts() {
    let out = run_measured(
        tnn()
            .args(["plan", "-c", "256", "-b", "32", "-m"])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let s = &out.stdout;
    assert!(s.contains("== decode plan (1 token), context 256"), "{s}");
    assert!(
        s.contains("== prefill plan (32 tokens), context 256"),
        "{s}"
    );
    assert_eq!(s.matches("arena: ").count(), 2, "{s}");
    assert!(s.contains("logits") && s.contains("flash_attn"), "{s}");
    // SmolLM2's 30 layers meet at ~9 barriers each on a decode token (574 steps): the
    // step groups and the gated units' epilogues hold (a change to the planner or the graph
    // that breaks them shows here).
    let decode = s.lines().find(|l| l.starts_with("barriers: ")).unwrap();
    let n: Vec<usize> = decode.split(' ').filter_map(|w| w.parse().ok()).collect();
    assert!(n.len() == 2 && n[0] <= 273 && n[1] == 574, "{decode}");
    let out = run_measured(tnn().args(["plan", "-m", "/nonexistent.gguf"]));
    assert_eq!(out.code, Some(1));
}

/// A file cut short (an interrupted download) says so; a file with a byte no writer produces
/// says it looks damaged; a file that is not GGUF at all gets no such guess. (The files are
/// made by streaming pieces of the model, so this test's own memory stays small: the RSS
/// other tests measure of their children includes the test process's at fork.)
#[test]
fn cut_short_or_damaged_files_say_what_they_look_like() {
    use std::io::{Read, Seek, Write};
    let dir = tempfile::tempdir().unwrap();
    let model = real_model();
    let len = std::fs::metadata(&model).unwrap().len();
    // The first `n` bytes of the model, with `patch` (offset, byte) applied.
    let write_prefix = |name: &str, n: u64, patch: Option<(u64, u8)>| {
        let path = dir.path().join(format!("{name}.gguf"));
        let mut out = std::fs::File::create(&path).unwrap();
        std::io::copy(&mut std::fs::File::open(&model).unwrap().take(n), &mut out).unwrap();
        if let Some((at, byte)) = patch {
            out.seek(std::io::SeekFrom::Start(at)).unwrap();
            out.write_all(&[byte]).unwrap();
        }
        path
    };
    // tokenizer.ggml.add_bos_token's value byte (0 or 1), found in the first 4 MiB.
    let bool_at = {
        let mut head = Vec::new();
        std::fs::File::open(&model)
            .unwrap()
            .take(4 << 20)
            .read_to_end(&mut head)
            .unwrap();
        let key = b"tokenizer.ggml.add_bos_token";
        let at = head.windows(key.len()).position(|w| w == key).unwrap();
        (at + key.len() + 4) as u64
    };
    let text = dir.path().join("text.gguf");
    std::fs::write(&text, "hello, not a model").unwrap();
    let cases = [
        (write_prefix("half", len / 2, None), "looks truncated"),
        (write_prefix("header", 3000, None), "looks truncated"),
        (
            write_prefix("bool", len, Some((bool_at, 7))),
            "looks damaged",
        ),
        (text, "not a GGUF file"),
    ];
    for (path, needle) in cases {
        let out = run_measured(tnn().arg("inspect").arg(&path));
        let err = out.stderr.trim_end();
        assert!(
            out.code == Some(1) && err.contains(needle) && !err.contains('\n'),
            "{}: {err}",
            path.display()
        );
        if needle == "not a GGUF file" {
            assert!(!err.contains("looks"), "{err}");
        }
    }
}
