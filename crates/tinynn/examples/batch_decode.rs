//! Four prompts decoded together: every step is one plan run holding one token of each
//! sequence, so the weights are read once for all four. Prints each continuation and the
//! aggregate speed against decoding the same prompts one after another:
//! `cargo run --release -p tinynn --example batch_decode`.

use std::time::Instant;

use tinynn::{argmax, BatchToken, ExecOptions, Model, Session, SessionOptions};

const STEPS: usize = 24;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = Model::open(tinynn::default_model()?)?;
    let prompts = [
        "The capital of France is",
        "Once upon a time, in a small village,",
        "def add(a, b):",
        "The three primary colours are",
    ];
    let tokenizer = model.tokenizer()?;
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| tokenizer.encode(p, true))
        .collect::<Result<_, _>>()?;
    let mut session = Session::with_options(
        model.clone(),
        SessionOptions {
            n_ctx: 1024,
            n_seq: prompts.len(),
            exec: ExecOptions {
                threads: 2,
                ..ExecOptions::default()
            },
            ..SessionOptions::default()
        },
    )?;

    // Each prompt into its own sequence; the first token of each continuation from its logits.
    let mut next = Vec::new();
    for (seq, p) in ids.iter().enumerate() {
        let batch: Vec<BatchToken> = BatchToken::sequence(p, seq, false).collect();
        session.decode(&batch)?;
        next.push(argmax(session.logits()));
    }
    let mut out: Vec<Vec<u32>> = next.iter().map(|&t| vec![t]).collect();
    let t0 = Instant::now();
    for _ in 1..STEPS {
        let batch: Vec<BatchToken> = BatchToken::one_each(&next).collect();
        session.decode(&batch)?;
        for (seq, n) in next.iter_mut().enumerate() {
            *n = argmax(session.output(seq));
            out[seq].push(*n);
        }
    }
    let together = t0.elapsed().as_secs_f64();

    // The same continuations one sequence at a time, for comparison (decode steps only).
    let mut alone = 0.0;
    for (seq, continuation) in out.iter().enumerate() {
        session.clear_seq(seq);
        let prompt: Vec<BatchToken> = ids[seq]
            .iter()
            .map(|&token| BatchToken {
                token,
                seq,
                logits: false,
            })
            .collect();
        session.decode(&prompt)?;
        let t = Instant::now();
        for &token in &continuation[..STEPS - 1] {
            session.decode(&[BatchToken {
                token,
                seq,
                logits: true,
            }])?;
        }
        alone += t.elapsed().as_secs_f64();
    }

    for (p, o) in prompts.iter().zip(&out) {
        println!("{p}{}", tokenizer.decode(o)?.replace('\n', " "));
    }
    let n = (prompts.len() * (STEPS - 1)) as f64;
    eprintln!(
        "{} sequences: {:.1} tokens/s decoded together, {:.1} tokens/s one after another ({:.2}x)",
        prompts.len(),
        n / together,
        n / alone,
        alone / together
    );
    Ok(())
}
