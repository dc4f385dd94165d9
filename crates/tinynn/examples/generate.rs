//! Generates text from a prompt with the default model (SmolLM2-135M-Instruct Q4_1), streaming
//! each piece as it comes: `cargo run --release -p tinynn --example generate -- [PROMPT] [N]`.

use std::io::Write;

use tinynn::{ExecOptions, GenerateOptions, Model, Session, Strategy};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let prompt = args
        .next()
        .unwrap_or_else(|| "The capital of France is".into());
    let max_tokens = args.next().map_or(Ok(24), |n| n.parse())?;

    let model = Model::open(tinynn::default_model()?)?;
    let exec = ExecOptions {
        threads: 2,
        ..ExecOptions::default()
    };
    let mut session = Session::new(model, 1024, exec)?;
    let opts = GenerateOptions {
        max_tokens,
        strategy: Strategy::Sample {
            temperature: 0.7,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            seed: 42,
        },
        stop: vec!["\n\n".into()],
        ..GenerateOptions::default()
    };
    print!("{prompt}");
    let mut generation = session.generate_text(&prompt, &opts)?;
    for piece in generation.by_ref() {
        print!("{}", piece?.text);
        std::io::stdout().flush()?;
    }
    println!();
    eprintln!(
        "{} tokens, finished by {:?}",
        generation.tokens().len(),
        generation.finish_reason()
    );
    Ok(())
}
