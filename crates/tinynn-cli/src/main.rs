//! `tnn`: the tinynn command line.

mod inspect;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "tnn",
    version,
    about = "tinynn: run, train and serve transformer models on the CPU"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a model file (GGUF, safetensors) or Hugging Face model directory holds.
    Inspect(inspect::InspectArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Inspect(args) => inspect::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, whatever the causes said.
            let msg = format!("{e:#}").replace(['\n', '\r'], " ");
            eprintln!("error: {msg}");
            ExitCode::FAILURE
        }
    }
}
