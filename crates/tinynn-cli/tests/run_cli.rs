//! `tnn run` end to end on the default model: llama.cpp's greedy text, reproducible sampling,
//! and a one-line error for a prompt that does not fit (`LLAMA_CPP_TEXT`: see
//! `scripts/make-real-model-constants.py`).

mod common;

use common::{real_model, run_measured, tnn};

const LLAMA_CPP_TEXT: &str = " Paris.\n\nThe United States has a population of approximately 311 million people.\n\nThe United States has a population of approximately 311 million people.\n\nThe United States has a population of approximately 3";

#[test]
fn greedy_run_prints_llama_cpp_text() {
    let out = run_measured(
        tnn()
            .args([
                "run",
                "-p",
                "The capital of France is",
                "-n",
                "48",
                "--temp",
                "0",
                "-t",
                "2",
                "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("The capital of France is{LLAMA_CPP_TEXT}\n")
    );
    assert!(
        out.stderr.contains("prompt: 5 tokens") && out.stderr.contains("generation: 48 tokens"),
        "{}",
        out.stderr
    );
    // The 94 MiB model is mapped, not copied: the whole process stays well under 512 MiB.
    assert!(
        out.max_rss < 512 << 20,
        "peak RSS {} MiB",
        out.max_rss >> 20
    );
}

#[test]
fn same_seed_same_text() {
    let run = |seed: &str| {
        let out = run_measured(
            tnn()
                .args([
                    "run",
                    "-p",
                    "Once upon a time",
                    "-n",
                    "24",
                    "-s",
                    seed,
                    "-t",
                    "2",
                    "-m",
                ])
                .arg(real_model()),
        );
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        out.stdout
    };
    let (a, b, c) = (run("42"), run("42"), run("43"));
    assert_eq!(a, b);
    assert_ne!(a, c, "different seeds gave the same 24 sampled tokens");
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let out = run_measured(
        tnn()
            .args([
                "run",
                "-c",
                "8",
                "-p",
                "one two three four five six seven eight nine ten",
                "-m",
            ])
            .arg(real_model()),
    );
    // The error is one line, the last on stderr; before it only `tinynn:` notes (loading).
    let lines: Vec<&str> = out.stderr.trim_end().lines().collect();
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    let (err, notes) = lines.split_last().unwrap();
    assert!(
        notes.iter().all(|l| l.starts_with("tinynn: ")),
        "{}",
        out.stderr
    );
    assert!(
        err.starts_with("error: ") && err.contains("does not fit the context of 8"),
        "{err}"
    );
}

/// llama.cpp's `llama-perplexity -c 512 -t 2` reports about 18.39 on Debian's GPL-3 text
/// (14 windows); the issue asks for 1%.
#[test]
fn perplexity_on_gpl3_matches_llama_cpp() {
    let out = run_measured(
        tnn()
            .args([
                "perplexity",
                "-f",
                "/usr/share/common-licenses/GPL-3",
                "-c",
                "512",
                "-t",
                "2",
                "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .expect("a final estimate");
    let ppl: f64 = line["Final estimate: PPL = ".len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((ppl - 18.39).abs() / 18.39 < 0.01, "{line}");
    assert!(out.stdout.contains("[14]"), "14 windows: {}", out.stdout);
}

/// Strict mode (f32 weights dequantized, f64 sums, unquantized activations) gives Hugging Face's
/// greedy answer to the issue's chat question.
#[test]
fn strict_chat_answer_matches_hugging_face() {
    let out = run_measured(
        tnn()
            .args([
                "run",
                "--chat",
                "--strict",
                "--temp",
                "0",
                "-n",
                "16",
                "-p",
                "What is the capital of France?",
                "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout, "The capital of France is Paris.\n",
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("generation: 7 tokens"),
        "stops at <|im_end|>: {}",
        out.stderr
    );
}

/// `tnn chat` over two turns: replies stream, stop at the end token, and the second turn reuses
/// the cached conversation.
#[test]
fn chat_two_turns() {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = tnn()
        .args(["chat", "--temp", "0", "-n", "24", "-t", "2", "-m"])
        .arg(real_model())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Hi!\nSay that again.\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.lines().filter(|l| !l.is_empty()).count() >= 2,
        "{text:?}"
    );
    assert!(
        !text.contains("<|im_end|>") && !text.contains("<|im_start|>"),
        "{text:?}"
    );
}

#[test]
fn stop_strings_end_output_before_they_appear() {
    let out = run_measured(
        tnn()
            .args([
                "run",
                "-n",
                "48",
                "--temp",
                "0",
                "-t",
                "2",
                "--stop",
                "population of",
                "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert_eq!(
        out.stdout,
        "The capital of France is Paris.\n\nThe United States has a \n"
    );
}

/// A Hugging Face directory (config.json + model.safetensors + tokenizer.json) runs end to end.
#[test]
fn runs_a_hugging_face_directory() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tinynn-models/tests/fixtures/tiny-llama");
    let out = run_measured(
        tnn()
            .args([
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
            .arg(&dir),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(out.stdout.starts_with("the license"), "{}", out.stdout);
    assert!(
        out.stderr.contains("prompt: 4 tokens") && out.stderr.contains("generation: 12 tokens"),
        "{}",
        out.stderr
    );
}

/// `-sys` (llama.cpp's spelling) sets the system prompt of the chat template.
#[test]
fn system_prompt_flag_with_one_dash() {
    let out = run_measured(
        tnn()
            .args([
                "run",
                "--chat",
                "-sys",
                "Reply in French.",
                "-p",
                "Hi",
                "-n",
                "1",
                "--temp",
                "0",
                "-t",
                "2",
                "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // The template's default system prompt (31 prompt tokens in all) is replaced by ours (20).
    assert!(out.stderr.contains("prompt: 20 tokens"), "{}", out.stderr);
}

/// `tnn bench` prints llama-bench's table, or JSON with `-o json`.
#[test]
fn bench_reports_pp_and_tg() {
    let out = run_measured(
        tnn()
            .args([
                "bench", "-p", "16", "-n", "8", "-r", "2", "-t", "2", "--mem", "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        out.stdout
            .starts_with("| model | size | params | backend | threads | test | t/s |"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("| llama 135M Q4_1 | 92.10 MiB | 134.52 M | CPU | 2 | pp16 |"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("| tg8 |")
            && out.stdout.contains("peak RSS:")
            && out.stdout.contains(&format!(
                "instruction set: {}\n",
                tinynn_cpu::simd::Isa::detected().name()
            )),
        "{}",
        out.stdout
    );
    // The memory the tests ran with, and generation's share of what it allows.
    assert!(
        out.stdout.contains("read bandwidth, 2 threads: ")
            && out.stdout.contains("tg8: ")
            && out.stdout.contains("% of it"),
        "{}",
        out.stdout
    );
    let out = run_measured(
        tnn()
            .args([
                "bench", "-p", "16", "-n", "0", "-r", "1", "-o", "json", "-t", "2", "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["test"], "pp16");
    // Prompt processing is not bandwidth-bound: no roofline.
    assert!(rows[0]["read_bandwidth"].as_f64().unwrap() > 0.0);
    assert!(rows[0].get("roofline_ts").is_none());
    assert!(rows[0]["avg_ts"].as_f64().unwrap() > 0.0);
    // Sequences decoding together: one row per count, tokens counted over all sequences.
    let out = run_measured(
        tnn()
            .args([
                "bench",
                "-p",
                "0",
                "-n",
                "4",
                "-r",
                "1",
                "-o",
                "json",
                "-t",
                "2",
                "--parallel",
                "1,3",
                "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let tests: Vec<(&str, u64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["test"].as_str().unwrap(), r["n_tokens"].as_u64().unwrap()))
        .collect();
    assert_eq!(tests, [("tg4", 4), ("tg4 par1", 4), ("tg4 par3", 12)]);
    // Bytes read per generated token: SmolLM2's head is its embedding table, so every weight
    // once (per step: shared by the step's sequences), plus each sequence's f16 keys and
    // values at the test's mean depth, (4 + 1) / 2: 30 layers × 2 × 3 KV heads × 64 × 2 bytes
    // = 23,040 bytes a cached token.
    for (r, seqs) in rows.as_array().unwrap().iter().zip([1.0, 1.0, 3.0]) {
        let weights = r["model_size"].as_f64().unwrap();
        let want = (weights / seqs + 23_040.0 * 2.5).round();
        assert_eq!(r["bytes_per_token"].as_f64().unwrap(), want, "{r}");
        let bw = r["read_bandwidth"].as_f64().unwrap();
        assert!(bw > 1e8, "{r}");
        let roof = r["roofline_ts"].as_f64().unwrap();
        assert!((roof * want / bw - 1.0).abs() < 1e-9, "{r}");
        let frac = r["roofline_fraction"].as_f64().unwrap();
        assert!(
            (frac * roof / r["avg_ts"].as_f64().unwrap() - 1.0).abs() < 1e-9,
            "{r}"
        );
    }
    // A bad output format or sequence count is refused before anything runs.
    for bad in [["-o", "xml"], ["--parallel", "65"]] {
        let out = run_measured(tnn().args(["bench", "-m"]).arg(real_model()).args(bad));
        assert_eq!(out.code, Some(1), "{}", out.stderr);
        assert!(out.stderr.starts_with("error:"), "{}", out.stderr);
    }
}

/// llama.cpp's spellings: `-n -1` generates until end of text or a full context, `-s -1` draws
/// a random seed; a bad `-n` or an unknown flag is a usage error with exit code 1 (clap's own
/// is 2), `--help` succeeds.
#[test]
fn minus_one_counts_and_usage_exit_codes() {
    let out = run_measured(
        tnn()
            .args(["run", "-p", "Once upon a time", "-n", "-1", "-c", "64"])
            .args(["--temp", "0", "-t", "2", "-m"])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    // The 4-token prompt leaves 60 of the 64 rows (unless the text ends first).
    let generated: usize = out
        .stderr
        .split("generation: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", out.stderr));
    assert!(generated > 0 && generated <= 60, "{}", out.stderr);
    let out = run_measured(
        tnn()
            .args([
                "run", "-p", "Hi", "-n", "4", "-s", "-1", "--temp", "1", "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    for bad in [
        &["run", "-n", "-2"][..],
        &["run", "-s", "-5"],
        &["run", "--no-such-flag"],
    ] {
        let out = run_measured(tnn().args(bad));
        assert_eq!(out.code, Some(1), "{bad:?}: {}", out.stderr);
        assert!(out.stderr.contains("error"), "{bad:?}: {}", out.stderr);
    }
    let out = run_measured(tnn().arg("--help"));
    assert_eq!(out.code, Some(0));
    assert!(out.stdout.contains("serve"), "{}", out.stdout);
}

/// The prompt from a file (`-f FILE`) or standard input (`-f -`), without echo
/// (`--no-display-prompt`), and -p's escapes processed as llama.cpp does (or not, with
/// `--no-escape`): each gives the text of the same prompt given plainly.
#[test]
fn prompt_from_a_file_or_stdin_without_echo_and_with_escapes() {
    use std::io::Write;
    use std::process::Stdio;
    let prompt = "Q: What is 2 + 2?\nA:";
    let greedy = ["-n", "12", "--temp", "0", "-t", "2"];
    let run = |extra: &[&str], stdin: Option<&str>| {
        let mut cmd = tnn();
        cmd.arg("run")
            .args(greedy)
            .args(extra)
            .arg("-m")
            .arg(real_model());
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let plain = run(&["-p", prompt], None);
    assert!(
        plain.starts_with(prompt) && plain.len() > prompt.len() + 2,
        "{plain:?}"
    );
    let generated = &plain[prompt.len()..];

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, prompt).unwrap();
    assert_eq!(run(&["-f", file.to_str().unwrap()], None), plain);
    assert_eq!(run(&["-f", "-"], Some(prompt)), plain);
    assert_eq!(run(&["-p", prompt, "--no-display-prompt"], None), generated);
    // `\n` typed in a shell is a backslash and an n: processed by default, kept with
    // --no-escape.
    let typed = r"Q: What is 2 + 2?\nA:";
    assert_eq!(run(&["-p", typed], None), plain);
    assert_eq!(run(&["-p", typed, "-e"], None), plain);
    let literal = run(&["-p", typed, "--no-escape"], None);
    assert!(literal.starts_with(typed), "{literal:?}");

    // -p and -f together, or a file that is not there: one-line errors.
    let out = tnn()
        .args(["run", "-p", "x", "-f"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = tnn()
        .args(["run", "-f", "/nonexistent/prompt.txt", "-m"])
        .arg(real_model())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1)
            && err.contains("/nonexistent/prompt.txt")
            && err.lines().count() == 1,
        "{err}"
    );
}

/// `--chat-template NAME|JINJA` and `--chat-template-file FILE` (llama.cpp's spellings): with a
/// system prompt SmolLM2's own template renders ChatML, so the built-in `chatml`, the same
/// Jinja inline and from a file all give the model's own greedy answer; an unknown name is a
/// one-line error listing the built-in ones.
#[test]
fn chat_templates_by_name_inline_or_file() {
    let run = |extra: &[&str]| {
        let out = tnn()
            .args([
                "run",
                "--chat",
                "--sys",
                "You answer in one word.",
                "-p",
                "Capital of France?",
            ])
            .args(["-n", "8", "--temp", "0", "-t", "2"])
            .args(extra)
            .arg("-m")
            .arg(real_model())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, own, err) = run(&[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!own.trim().is_empty());
    let chatml = "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("chatml.jinja");
    std::fs::write(&file, chatml).unwrap();
    for extra in [
        vec!["--chat-template", "chatml"],
        vec!["--chat-template", chatml],
        vec!["--chat-template-file", file.to_str().unwrap()],
    ] {
        let (code, text, err) = run(&extra);
        assert_eq!((code, &text), (Some(0), &own), "{extra:?}: {err}");
    }
    let (code, _, err) = run(&["--chat-template", "no-such-template"]);
    assert_eq!(code, Some(1));
    let lines: Vec<&str> = err.trim().lines().collect();
    assert!(
        lines
            .last()
            .is_some_and(|l| l.contains("chatml, llama3, gemma, phi3"))
            && lines.iter().filter(|l| !l.starts_with("tinynn: ")).count() == 1,
        "{err}"
    );
}

/// `tnn bench` as llama-bench takes and writes it: `-t` a list (one row per count and test),
/// `-b` the prompt batch, and llama-bench's JSON keys beside tinynn's; `-c` (which llama-bench
/// has not either) is refused instead of ignored.
#[test]
fn bench_thread_lists_batches_and_llama_bench_keys() {
    let out = run_measured(
        tnn()
            .args([
                "bench", "-p", "32", "-n", "4", "-r", "2", "-t", "1,2", "-b", "8",
            ])
            .args(["-o", "json", "-m"])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let got: Vec<(u64, u64, u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["n_threads"].as_u64().unwrap(),
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
                r["test"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, 32, 0, "pp32"),
            (1, 0, 4, "tg4"),
            (2, 32, 0, "pp32"),
            (2, 0, 4, "tg4")
        ]
    );
    for r in rows {
        assert_eq!(r["model_type"], "llama 135M Q4_1");
        assert_eq!(r["model_n_params"], 134515008u64);
        assert_eq!(r["backends"], "CPU");
        assert_eq!(r["isa"], tinynn_cpu::simd::Isa::detected().name());
        let tokens = r["n_prompt"].as_f64().unwrap() + r["n_gen"].as_f64().unwrap();
        // Each sample's time and rate describe the same run; the averages are the samples'
        // means (as llama-bench's: the mean rate is not the rate of the mean time).
        let floats = |key: &str| -> Vec<f64> {
            let v = r[key].as_array().unwrap();
            v.iter().map(|x| x.as_f64().unwrap()).collect()
        };
        let (samples_ts, samples_ns) = (floats("samples_ts"), floats("samples_ns"));
        assert_eq!(samples_ns.len(), 2);
        assert_eq!(samples_ts.len(), 2);
        for (ts, ns) in samples_ts.iter().zip(&samples_ns) {
            assert!((tokens / (ns * 1e-9) / ts - 1.0).abs() < 1e-6, "{r}");
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        assert!((r["avg_ts"].as_f64().unwrap() / mean(&samples_ts) - 1.0).abs() < 1e-9);
        assert!((r["avg_ns"].as_f64().unwrap() / mean(&samples_ns) - 1.0).abs() < 1e-6);
        assert!(r["test_time"].as_str().unwrap().ends_with('Z'));
    }
    assert_eq!(rows[0]["n_batch"], 8);
    let out = run_measured(tnn().args(["bench", "-c", "512", "-m"]).arg(real_model()));
    assert_eq!(out.code, Some(1), "{}", out.stderr);
}

/// Long work says what it did: loading (file, size, time), repacking the weights (when it
/// happens), tokenizing a perplexity file.
#[test]
fn loading_repacking_and_tokenizing_are_reported() {
    let model = real_model();
    let has = |err: &str, start: &str, end: &str| {
        err.lines()
            .any(|l| l.starts_with(start) && l.ends_with(end))
    };
    for (extra, repacked) in [(&[][..], true), (&["--no-repack"][..], false)] {
        let out = run_measured(
            tnn()
                .args(["run", "-p", "Hi", "-n", "2", "--temp", "0", "-t", "1", "-m"])
                .arg(&model)
                .args(extra),
        );
        assert_eq!(out.code, Some(0), "{}", out.stderr);
        let loaded = format!("tinynn: loaded {} (93.8 MiB) in ", model.display());
        assert!(has(&out.stderr, &loaded, " s"), "{}", out.stderr);
        assert_eq!(
            has(
                &out.stderr,
                "tinynn: weights repacked for the matrix kernels (",
                " s"
            ),
            repacked,
            "{extra:?}: {}",
            out.stderr
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("t.txt");
    std::fs::write(
        &text,
        "The quick brown fox jumps over the lazy dog. ".repeat(40),
    )
    .unwrap();
    let out = run_measured(
        tnn()
            .args(["perplexity", "-c", "128", "-t", "1", "-f"])
            .arg(&text)
            .arg("-m")
            .arg(&model),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    assert!(
        has(&out.stderr, "tinynn: loaded ", "(1.8 KiB)"),
        "{}",
        out.stderr
    );
    assert!(
        has(&out.stderr, "tinynn: 401 tokens in ", " s"),
        "{}",
        out.stderr
    );
}

/// `tnn bench -d` (llama-bench's depth): each test again with D tokens already cached, named
/// `… @ dD`, its roofline counting those D keys and values; a depth past the model's context
/// is refused.
#[test]
fn bench_at_depth() {
    let out = run_measured(
        tnn()
            .args(["bench", "-p", "16", "-n", "4", "-d", "0,64", "-r", "1"])
            .args(["-o", "json", "-t", "2", "-m"])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let rows: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let got: Vec<(&str, u64)> = rows
        .iter()
        .map(|r| (r["test"].as_str().unwrap(), r["n_depth"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        got,
        [
            ("pp16", 0),
            ("tg4", 0),
            ("pp16 @ d64", 64),
            ("tg4 @ d64", 64)
        ]
    );
    let deep = &rows[3];
    let want = (deep["model_size"].as_f64().unwrap() + 23_040.0 * (64.0 + 2.5)).round();
    assert_eq!(deep["bytes_per_token"].as_f64().unwrap(), want, "{deep}");
    assert!(deep["avg_ts"].as_f64().unwrap() > 0.0);
    let out = run_measured(
        tnn()
            .args([
                "bench", "-p", "0", "-n", "4", "-d", "100000", "-r", "1", "-m",
            ])
            .arg(real_model()),
    );
    assert_eq!(out.code, Some(1), "{}", out.stderr);
    assert!(
        out.stderr.contains("past the model's context"),
        "{}",
        out.stderr
    );
}
