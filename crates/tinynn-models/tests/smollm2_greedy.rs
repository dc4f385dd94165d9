//! The real SmolLM2-135M-Instruct Q4_1: greedy decoding of `The capital of France is` gives
//! llama.cpp's 48-token continuation (the reference, llama.cpp 0c1e570).
//!
//! llama.cpp's own top-2 gap at generated step 14 is 0.0048 (" 1" vs " 2" in "311"); the
//! issue accepts a divergence exactly there if our gap is also below 0.01. The test checks
//! every other step exactly, feeding llama.cpp's token at step 14 so the rest stays comparable.
//! `scripts/make-real-model-constants.py` recomputes `PROMPT`, the ids and the text with
//! llama.cpp.

use tinynn_cpu::ExecOptions;
use tinynn_format::model_cache::require_default_model;
use tinynn_models::model::Model;
use tinynn_models::session::{argmax, Session};

const PROMPT: [u32; 5] = [504, 3575, 282, 4649, 314];
const LLAMA_CPP_IDS: [u32; 22] = [
    7042, 30, 198, 198, 504, 1797, 1918, 553, 253, 2155, 282, 4723, 216, 35, 33, 33, 2215, 701, 30,
    198, 198, 504,
];
const LLAMA_CPP_TEXT: &str = " Paris.\n\nThe United States has a population of approximately 311 million people.\n\nThe United States has a population of approximately 311 million people.\n\nThe United States has a population of approximately 3";
/// The step where llama.cpp itself is within 0.0048 of choosing the other digit.
const CLOSE_STEP: usize = 14;

#[test]
fn greedy_continuation_matches_llama_cpp() {
    let model = Model::open(require_default_model().unwrap()).unwrap();
    let vocab = model.vocab().unwrap();
    let opts = ExecOptions {
        threads: 2,
        ..ExecOptions::default()
    };
    let mut s = Session::new(model.clone(), 256, opts).unwrap();
    // The prompt goes in one batch (as llama.cpp runs it), then one token at a time.
    let mut logits = s.eval_batch(&PROMPT).unwrap().to_vec();
    let mut out = Vec::new();
    for step in 0..48 {
        let mut next = argmax(&logits);
        if step == CLOSE_STEP {
            let (l1, l2) = (logits[33], logits[34]);
            eprintln!("step {step}: logit(\"1\" = 33) {l1:.4}, logit(\"2\" = 34) {l2:.4}, gap {:.4}, ours {next}", (l1 - l2).abs());
            if next != 33 {
                assert!(
                    next == 34 && (l1 - l2).abs() < 0.01,
                    "step {step}: token {next}, gap {}",
                    (l1 - l2).abs()
                );
                next = 33;
            }
        }
        if let Some(&want) = LLAMA_CPP_IDS.get(step) {
            assert_eq!(
                next,
                want,
                "step {step}: text so far {:?}",
                String::from_utf8_lossy(&vocab.decode(&out))
            );
        }
        out.push(next);
        logits = s.eval(next).unwrap().to_vec();
    }
    assert_eq!(String::from_utf8_lossy(&vocab.decode(&out)), LLAMA_CPP_TEXT);
}

#[test]
fn session_errors_are_clear() {
    let model = Model::open(require_default_model().unwrap()).unwrap();
    let mut s = Session::new(model.clone(), 2, ExecOptions::default()).unwrap();
    assert_eq!(s.n_ctx(), 2);
    let err = s.eval(49152).err().unwrap().to_string();
    assert!(
        err.contains("49152") && err.contains("out of range"),
        "{err}"
    );
    s.reset();
    s.eval(1).unwrap();
    s.eval(2).unwrap();
    let err = s.eval(3).err().unwrap().to_string();
    assert_eq!(err, "the context is full: 2 tokens");
}

#[test]
fn batched_prefill_equals_token_by_token() {
    let model = Model::open(require_default_model().unwrap()).unwrap();
    let opts = ExecOptions {
        threads: 2,
        ..ExecOptions::default()
    };
    let mut one = Session::new(model.clone(), 64, opts).unwrap();
    let mut want = Vec::new();
    for &t in &PROMPT {
        want = one.eval(t).unwrap().to_vec();
    }
    let mut batched = Session::new(model.clone(), 64, opts).unwrap();
    batched.set_n_batch(3); // batches of 3 then 2: two prefill plans and a cache hand-over
    let got = batched.eval_batch(&PROMPT).unwrap().to_vec();
    let max_diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(
            0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        );
    assert!(
        max_diff < 1e-3,
        "batched prefill logits differ by {max_diff}"
    );
    assert_eq!(argmax(&got), 7042);
    // Decoding continues from the batched cache exactly as from the sequential one.
    let (a, b) = (
        one.eval(7042).unwrap().to_vec(),
        batched.eval(7042).unwrap().to_vec(),
    );
    let max_diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(
            0f32,
            |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) },
        );
    assert!(
        max_diff < 1e-3,
        "decode after batched prefill differs by {max_diff}"
    );
    assert_eq!(batched.n_past(), 6);
}

/// Strict mode against Hugging Face transformers in f32 on the dequantized weights (the issue's
/// reference): the last position's top-10 logits for `The capital of France is`.
#[test]
fn strict_top10_logits_match_transformers() {
    let hf: [(u32, f32); 10] = [
        (7042, 17.3713),
        (260, 14.8886),
        (4528, 13.2450),
        (2250, 13.0095),
        (1315, 12.9515),
        (5145, 12.9049),
        (216, 12.7133),
        (441, 12.6979),
        (3692, 12.5837),
        (3575, 12.1223),
    ];
    let model = Model::open(require_default_model().unwrap()).unwrap();
    let opts = ExecOptions {
        strict: true,
        ..ExecOptions::default()
    };
    let mut s = Session::new(model.clone(), 64, opts).unwrap();
    let logits = s.eval_batch(&PROMPT).unwrap().to_vec();
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let mut worst = 0f32;
    for (rank, &(id, value)) in hf.iter().enumerate() {
        assert_eq!(order[rank] as u32, id, "rank {rank}");
        let got = logits[id as usize];
        assert!(
            (got - value).abs() < 1e-3,
            "token {id}: {got} vs transformers {value}"
        );
        worst = worst.max((got - value).abs());
    }
    eprintln!("strict top-10: largest difference from transformers {worst:.6}");

    // And transformers' greedy text, up to and including the end token.
    let vocab = model.vocab().unwrap();
    let mut logits = logits;
    let mut out = Vec::new();
    while out.len() < 40 {
        let next = argmax(&logits);
        out.push(next);
        if next == 2 {
            break;
        }
        logits = s.eval(next).unwrap().to_vec();
    }
    let text = String::from_utf8_lossy(&vocab.decode(&out)).into_owned();
    assert_eq!(
        text,
        " Paris.\n\nThe answer is: 2018-01-22 12:12:53.<|im_end|>"
    );
}
