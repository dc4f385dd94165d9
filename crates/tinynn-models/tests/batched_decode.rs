//! Several sequences in one KV cache, decoded together: each sequence's greedy text equals the
//! text it gets decoded alone, whatever the other sequences hold, and sequences never see each
//! other's tokens. On the default model (SmolLM2-135M-Instruct Q4_1).

use std::sync::Arc;

use tinynn_cpu::ExecOptions;
use tinynn_format::model_cache::require_default_model;
use tinynn_models::model::Model;
use tinynn_models::session::{argmax, BatchToken, Session, SessionOptions};

const STEPS: usize = 24;

/// Prompts of different lengths and kinds (a long one takes the blocked prompt attention).
const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Dear Sir or Madam,\n\nI am writing to complain about the noise from the building site next to my flat, which starts every morning at six.",
    "En un lugar de la Mancha, de cuyo nombre no quiero acordarme,",
    "Q: What are the three primary colours?\nA:",
];

fn model() -> Arc<Model> {
    Model::open(require_default_model().unwrap()).unwrap()
}

fn exec(threads: usize) -> ExecOptions {
    ExecOptions {
        threads,
        adaptive_threads: false,
        ..ExecOptions::default()
    }
}

fn tokens(model: &Model, text: &str) -> Vec<u32> {
    model.tokenizer().unwrap().encode(text, true).unwrap()
}

/// Greedy continuation of `prompt` in a one-sequence session.
fn alone(model: &Arc<Model>, prompt: &[u32], threads: usize) -> Vec<u32> {
    let mut s = Session::new(model.clone(), 512, exec(threads)).unwrap();
    let mut next = argmax(s.eval_batch(prompt).unwrap());
    let mut out = vec![next];
    for _ in 1..STEPS {
        next = argmax(s.eval(next).unwrap());
        out.push(next);
    }
    out
}

fn session(model: &Arc<Model>, n_seq: usize, threads: usize) -> Session {
    Session::with_options(
        model.clone(),
        SessionOptions {
            n_ctx: 1024,
            n_seq,
            exec: exec(threads),
            ..SessionOptions::default()
        },
    )
    .unwrap()
}

/// Decodes every sequence of `s` (whose prompts are in, with `first` its first tokens) one
/// token per sequence per run.
fn decode_together(s: &mut Session, mut next: Vec<u32>) -> Vec<Vec<u32>> {
    let mut out: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    for _ in 1..STEPS {
        let batch: Vec<BatchToken> = BatchToken::one_each(&next).collect();
        s.decode(&batch).unwrap();
        assert_eq!(s.n_outputs(), next.len());
        for (seq, n) in next.iter_mut().enumerate() {
            *n = argmax(s.output(seq));
            out[seq].push(*n);
        }
    }
    out
}

#[test]
fn sequences_decoded_together_give_their_text_alone() {
    let model = model();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|p| tokens(&model, p)).collect();
    assert!(prompts.iter().any(|p| p.len() >= 64) || prompts.iter().all(|p| p.len() < 64));
    for threads in [1, 2, 3] {
        let want: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&model, p, threads)).collect();
        let mut s = session(&model, prompts.len(), threads);
        // Prompts go in one sequence at a time (in reverse, so cells interleave differently
        // from the sequence order).
        let mut first = vec![0; prompts.len()];
        for seq in (0..prompts.len()).rev() {
            let batch: Vec<BatchToken> = BatchToken::sequence(&prompts[seq], seq, false).collect();
            s.decode(&batch).unwrap();
            first[seq] = argmax(s.logits());
        }
        let got = decode_together(&mut s, first);
        for (seq, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g, w, "sequence {seq} on {threads} threads");
        }
    }
}

#[test]
fn all_prompts_in_one_run_then_decode_together() {
    let model = model();
    let short: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| tokens(&model, p))
        .filter(|p| p.len() < 30)
        .collect();
    assert!(short.len() >= 3);
    // From 64 query rows attention switches to the blocked f32 arithmetic (llama.cpp's switch),
    // which a prompt run alone in fewer rows does not use: keep the run below it.
    assert!(short.iter().map(Vec::len).sum::<usize>() < 64);
    let want: Vec<Vec<u32>> = short.iter().map(|p| alone(&model, p, 2)).collect();
    let mut s = session(&model, short.len(), 2);
    // Every prompt in one ragged batch, interleaved token by token.
    let longest = short.iter().map(Vec::len).max().unwrap();
    let mut batch = Vec::new();
    for i in 0..longest {
        for (seq, p) in short.iter().enumerate() {
            if let Some(&token) = p.get(i) {
                batch.push(BatchToken {
                    token,
                    seq,
                    logits: i + 1 == p.len(),
                });
            }
        }
    }
    s.decode(&batch).unwrap();
    assert_eq!(s.n_outputs(), short.len());
    // Outputs come in batch order: the sequences whose prompt ends first come first.
    let mut order: Vec<usize> = (0..short.len()).collect();
    order.sort_by_key(|&q| (short[q].len(), q));
    let mut first = vec![0; short.len()];
    for (row, &seq) in order.iter().enumerate() {
        first[seq] = argmax(s.output(row));
    }
    let got = decode_together(&mut s, first);
    assert_eq!(got, want);
}

#[test]
fn a_prompt_joins_while_others_decode() {
    let model = model();
    let a = tokens(&model, PROMPTS[0]);
    let b = tokens(&model, PROMPTS[4]);
    let (want_a, want_b) = (alone(&model, &a, 2), alone(&model, &b, 2));
    let mut s = session(&model, 2, 2);
    let mut next_a = argmax(s.eval_batch(&a).unwrap());
    let mut got_a = vec![next_a];
    // Sequence 0 decodes a few tokens alone.
    for _ in 0..3 {
        next_a = argmax(s.eval(next_a).unwrap());
        got_a.push(next_a);
    }
    // Then sequence 1's whole prompt rides along with one decode token of sequence 0.
    let mut batch = vec![BatchToken {
        token: next_a,
        seq: 0,
        logits: true,
    }];
    batch.extend(BatchToken::sequence(&b, 1, false));
    s.decode(&batch).unwrap();
    next_a = argmax(s.output(0));
    got_a.push(next_a);
    let mut next_b = argmax(s.output(1));
    let mut got_b = vec![next_b];
    while got_b.len() < STEPS {
        let mut batch = vec![BatchToken {
            token: next_b,
            seq: 1,
            logits: true,
        }];
        if got_a.len() < STEPS {
            batch.insert(
                0,
                BatchToken {
                    token: next_a,
                    seq: 0,
                    logits: true,
                },
            );
        }
        s.decode(&batch).unwrap();
        if got_a.len() < STEPS {
            next_a = argmax(s.output(0));
            got_a.push(next_a);
        }
        next_b = argmax(s.logits());
        got_b.push(next_b);
    }
    assert_eq!(got_a, want_a);
    assert_eq!(got_b, want_b);
}

#[test]
fn clear_truncate_and_shared_prefixes() {
    let model = model();
    let p = tokens(&model, PROMPTS[3]);
    let want = alone(&model, &p, 2);
    let mut s = session(&model, 3, 2);
    // Sequence 0 holds the prompt; 1 and 2 share it without evaluating it again.
    s.eval_batch(&p).unwrap();
    let used = s.n_ctx() - s.n_free();
    s.copy_seq(0, 1, p.len()).unwrap();
    s.copy_seq(0, 2, p.len() - 1).unwrap();
    assert_eq!(s.n_ctx() - s.n_free(), used, "shared cells are not copies");
    assert_eq!(s.seq_tokens(1), &p[..]);
    // Sequence 2 re-evaluates the prompt's last token and must continue as the prompt would.
    s.decode(&[BatchToken {
        token: p[p.len() - 1],
        seq: 2,
        logits: true,
    }])
    .unwrap();
    assert_eq!(argmax(s.logits()), want[0]);
    // Sequence 0 is cleared: the others keep the shared rows.
    s.clear_seq(0);
    assert_eq!(s.seq_len(0), 0);
    assert_eq!(s.seq_len(1), p.len());
    let mut next = want[0];
    let mut got = vec![next];
    for _ in 1..STEPS {
        s.decode(&[BatchToken {
            token: next,
            seq: 1,
            logits: true,
        }])
        .unwrap();
        next = argmax(s.logits());
        got.push(next);
    }
    assert_eq!(got, want);
    // Truncating sequence 1 back to the prompt and decoding again gives the same text.
    s.truncate_seq(1, p.len());
    s.decode(&[BatchToken {
        token: want[0],
        seq: 1,
        logits: true,
    }])
    .unwrap();
    assert_eq!(argmax(s.logits()), want[1]);
}

#[test]
fn bad_batches_change_nothing() {
    let model = model();
    let mut s = Session::with_options(
        model.clone(),
        SessionOptions {
            n_ctx: 16,
            n_seq: 2,
            exec: exec(2),
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let p = tokens(&model, PROMPTS[0]);
    s.eval_batch(&p).unwrap();
    let logits = s.logits().to_vec();
    let tok = |token, seq| BatchToken {
        token,
        seq,
        logits: true,
    };
    // A missing sequence, a bad token id, more tokens than free cells: errors, nothing moves.
    let err = s.decode(&[tok(5, 0), tok(6, 2)]).unwrap_err().to_string();
    assert!(err.contains("sequence 2"), "{err}");
    let err = s
        .decode(&[tok(5, 1), tok(49152, 1)])
        .unwrap_err()
        .to_string();
    assert!(err.contains("49152"), "{err}");
    let err = s.decode(&vec![tok(5, 1); 16]).unwrap_err().to_string();
    assert!(err.contains("context is full"), "{err}");
    assert_eq!((s.seq_len(0), s.seq_len(1)), (p.len(), 0));
    assert_eq!(s.seq_tokens(0), &p[..]);
    // The session still works and gives what it gave before.
    s.truncate(p.len() - 1);
    s.eval(p[p.len() - 1]).unwrap();
    assert_eq!(s.logits(), &logits[..]);
    assert!(Session::with_options(
        model,
        SessionOptions {
            n_seq: 65,
            ..SessionOptions::default()
        }
    )
    .is_err());
}
