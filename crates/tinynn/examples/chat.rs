//! A two-turn conversation with the default model through its chat template; the second turn
//! re-evaluates only the new tokens (the session keeps the conversation's prefix):
//! `cargo run --release -p tinynn --example chat`.

use tinynn::{ExecOptions, GenerateOptions, Message, Model, Session};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let model = Model::open(tinynn::default_model()?)?;
    let template = model.chat_template(None)?;
    let exec = ExecOptions {
        threads: 2,
        ..ExecOptions::default()
    };
    let mut session = Session::new(model, 2048, exec)?;
    let opts = GenerateOptions {
        max_tokens: 40,
        ..GenerateOptions::default()
    };
    let mut messages = vec![Message::new("system", "You are a concise assistant.")];
    for question in ["What is the capital of France?", "And of Spain?"] {
        messages.push(Message::new("user", question));
        println!("> {question}");
        let reply = session.chat(&template, &messages, &opts)?.text()?;
        println!("{}\n", reply.trim());
        messages.push(Message::new("assistant", reply.trim()));
        eprintln!("(the cache holds {} tokens)", session.n_past());
    }
    Ok(())
}
