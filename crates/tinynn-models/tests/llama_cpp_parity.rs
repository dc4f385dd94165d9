//! Logit-level parity with llama.cpp on the real SmolLM2 Q4_1 file, over the 32 prompts of
//! `scripts/make-llama-cpp-parity.py` (prose, licenses, code, chat-templated, multilingual,
//! lists, letters, long texts): llama.cpp's prompt ids are fed, then llama.cpp's own greedy
//! tokens (so every step compares the same context), and at every step
//!
//! - tinynn's log-probability of each of llama.cpp's top-10 tokens is within the tolerance of
//!   llama.cpp's, and
//! - tinynn's greedy token is llama.cpp's, except at a step where llama.cpp's own top-2 gap is
//!   below 0.01 (a near-tie, which any rounding may break either way).
//!
//! The reference data (`fixtures/llama-cpp-parity/`) is committed; no llama.cpp is needed.

use std::path::Path;

use tinynn_cpu::ExecOptions;
use tinynn_format::model_cache::require_default_model;
use tinynn_models::model::Model;
use tinynn_models::session::{Session, SessionOptions};

/// One prompt's reference: its ids and per step llama.cpp's token and top-10 (id, log p).
struct Reference {
    prompt: Vec<u32>,
    steps: Vec<(u32, Vec<(u32, f64)>)>,
}

fn references(file: &str) -> Vec<Reference> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llama-cpp-parity")
        .join(file);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = |a: &serde_json::Value| -> Vec<u32> {
        a.as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| Reference {
            prompt: ids(&p["prompt_ids"]),
            steps: p["steps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| {
                    let top = s["top"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap()))
                        .collect();
                    (s["token"].as_u64().unwrap() as u32, top)
                })
                .collect(),
        })
        .collect()
}

/// Log-softmax of `logits` in f64.
fn log_probs(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let lse = max
        + logits
            .iter()
            .map(|&x| (f64::from(x) - max).exp())
            .sum::<f64>()
            .ln();
    logits.iter().map(|&x| f64::from(x) - lse).collect()
}

/// How tinynn compared over every prompt.
#[derive(Debug, Default)]
struct Stats {
    /// The largest |log p| difference at llama.cpp's top-10 tokens, and where (prompt, step).
    worst: f64,
    worst_at: (usize, usize),
    /// Steps whose greedy token differs from llama.cpp's at no near-tie.
    wrong_tokens: Vec<(usize, usize)>,
    steps: usize,
    /// Every |log p| difference, for quantiles.
    diffs: Vec<f64>,
}

impl Stats {
    /// The q-quantile (0..=1) of the differences.
    fn quantile(&self, q: f64) -> f64 {
        let mut d = self.diffs.clone();
        d.sort_by(f64::total_cmp);
        d[((d.len() - 1) as f64 * q).round() as usize]
    }
}

/// Compares `exec` (threads as given) on every prompt; `one_by_one`: the prompt too is fed a
/// token at a time.
fn compare(
    model: &std::sync::Arc<Model>,
    refs: &[Reference],
    exec: ExecOptions,
    one_by_one: bool,
) -> Stats {
    let mut st = Stats::default();
    for (pi, r) in refs.iter().enumerate() {
        let so = SessionOptions {
            n_ctx: 1024,
            exec,
            ..SessionOptions::default()
        };
        let mut s = Session::with_options(model.clone(), so).unwrap();
        let mut logits = if one_by_one {
            let mut l = Vec::new();
            for &t in &r.prompt {
                l = s.eval(t).unwrap().to_vec();
            }
            l
        } else {
            s.eval_batch(&r.prompt).unwrap().to_vec()
        };
        for (si, (token, top)) in r.steps.iter().enumerate() {
            let lp = log_probs(&logits);
            for &(id, want) in top {
                let d = (lp[id as usize] - want).abs();
                st.diffs.push(d);
                if d > st.worst || d.is_nan() {
                    st.worst = d;
                    st.worst_at = (pi, si);
                }
            }
            let near_tie = top[0].1 - top[1].1 < 0.01;
            let ours = tinynn_models::session::argmax(&logits);
            if ours != *token && !near_tie {
                st.wrong_tokens.push((pi, si));
            }
            st.steps += 1;
            logits = s.eval(*token).unwrap().to_vec();
        }
    }
    st
}

/// llama.cpp against itself: its flash-attention path (the default) and its plain one, over
/// the steps before their greedy texts part: every |log p| difference at shared top-10 tokens.
fn llama_cpp_spread(fa: &[Reference], plain: &[Reference]) -> Stats {
    let mut st = Stats::default();
    for (a, b) in fa.iter().zip(plain) {
        assert_eq!(a.prompt, b.prompt);
        for ((ta, top_a), (tb, top_b)) in a.steps.iter().zip(&b.steps) {
            for &(id, lp) in top_a {
                if let Some(&(_, other)) = top_b.iter().find(|(i, _)| *i == id) {
                    let d = (lp - other).abs();
                    st.diffs.push(d);
                    st.worst = st.worst.max(d);
                }
            }
            st.steps += 1;
            if ta != tb {
                break;
            }
        }
    }
    st
}

/// tinynn's differences from llama.cpp are within `slack` × llama.cpp's own spread between its
/// two attention paths at the median, p90 and p99, and its greedy token differs from
/// llama.cpp's away from near-ties on at most 3% of the steps.
fn assert_within_spread(label: &str, st: &Stats, spread: &Stats, slack: f64) {
    let (p, s) = st.worst_at;
    eprintln!(
        "{label}: {} steps; |log p| differences median {:.4} p90 {:.4} p99 {:.4} max {:.4} (prompt {p}, step {s}); {} tokens differ away from near-ties",
        st.steps,
        st.quantile(0.5),
        st.quantile(0.9),
        st.quantile(0.99),
        st.worst,
        st.wrong_tokens.len()
    );
    for q in [0.5, 0.9, 0.99] {
        let (ours, theirs) = (st.quantile(q), spread.quantile(q));
        assert!(
            ours <= slack * theirs,
            "{label}: quantile {q} of the differences {ours:.4} > {slack} × llama.cpp's own {theirs:.4}"
        );
    }
    assert!(
        st.wrong_tokens.len() * 100 <= 3 * st.steps,
        "{label}: {} of {} greedy tokens differ: {:?}",
        st.wrong_tokens.len(),
        st.steps,
        st.wrong_tokens
    );
}

/// Over 32 prompts × 64 steps, tinynn's log-probabilities (default mode, `--no-repack`, 1–3
/// threads, batched or token-by-token prefill) are as close to llama.cpp's as llama.cpp's two
/// attention paths are to each other.
///
/// Measured when the data was made (llama.cpp 0c1e570, this host): llama.cpp with flash
/// attention (its CPU default) against llama.cpp without differs at the top-10 tokens by a
/// median 0.074, p90 0.223, p99 0.453, max 1.02 in log p, and their greedy texts part on 23 of
/// the 32 prompts; tinynn against llama.cpp: median 0.076, p90 0.227, p99 0.473. This small
/// Q4_1 model turns the rounding of attention (f16 queries, probabilities or accumulators)
/// into differences of that size, so agreement within 0.01 (issue 11) needs llama.cpp's exact
/// rounding points, not just equal arithmetic.
#[test]
fn smollm2_q4_1_log_probs_are_as_close_to_llama_cpp_as_llama_cpp_is_to_itself() {
    let fa = references("smollm2-q4_1.json");
    let plain = references("smollm2-q4_1-no-fa.json");
    assert_eq!((fa.len(), plain.len()), (32, 32));
    let spread = llama_cpp_spread(&fa, &plain);
    eprintln!(
        "llama.cpp flash attention vs plain: median {:.4} p90 {:.4} p99 {:.4} max {:.4}",
        spread.quantile(0.5),
        spread.quantile(0.9),
        spread.quantile(0.99),
        spread.worst
    );
    let model = Model::open(require_default_model().unwrap()).unwrap();
    let threads = |n: usize, repack: bool| ExecOptions {
        threads: n,
        repack,
        ..ExecOptions::default()
    };
    for (label, refs, exec) in [
        ("default vs llama.cpp", &fa, threads(2, true)),
        ("--no-repack vs llama.cpp", &fa, threads(2, false)),
        (
            "default vs llama.cpp without flash attention",
            &plain,
            threads(2, true),
        ),
    ] {
        let st = compare(&model, refs, exec, false);
        assert_within_spread(label, &st, &spread, 1.25);
    }
    // Thread counts change no bit; token-by-token prefill stays within the same bounds.
    let some = &fa[..8];
    let two = compare(&model, some, threads(2, true), false).diffs;
    for n in [1, 3] {
        assert_eq!(
            compare(&model, some, threads(n, true), false).diffs,
            two,
            "{n} threads"
        );
    }
    let st = compare(&model, some, threads(2, true), true);
    assert_within_spread("token-by-token prefill", &st, &spread, 1.25);
}
