//! `tnn`: the tinynn command line.

mod bench;
mod chat;
mod chat_input;
mod chat_template_args;
mod convert;
mod finetune;
mod generate;
mod inspect;
mod lora_args;
mod models;
mod perplexity;
mod plan;
mod quantize;
mod ranks;
mod run;
mod serve;
mod tokenize;
mod train;
mod train_loop;

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
    /// Generate text from a prompt (default model: SmolLM2-135M-Instruct Q4_1).
    Run(run::RunArgs),
    /// Talk with a model, turn by turn, on stdin/stdout.
    Chat(chat::ChatArgs),
    /// Show what a model file (GGUF, safetensors) or Hugging Face model directory holds.
    Inspect(inspect::InspectArgs),
    /// Perplexity of a model on a text file (as llama.cpp's llama-perplexity computes it).
    Perplexity(perplexity::PerplexityArgs),
    /// Prompt-processing and generation speed, as llama-bench measures them.
    Bench(bench::BenchArgs),
    /// Convert a GGUF model to another type (F16, Q8_0, Q4_K_M, ...).
    Quantize(quantize::QuantizeArgs),
    /// Convert a Hugging Face model directory to GGUF (F16, F32, BF16, or quantized), or a GGUF
    /// model to a Hugging Face directory.
    Convert(convert::ConvertArgs),
    /// Fine-tune a model on a data file: every weight, or a LoRA adapter (--lora).
    Finetune(Box<finetune::FinetuneArgs>),
    /// Train a model from scratch from a JSON config.
    Train(Box<train::TrainArgs>),
    /// Show the memory plans (arena layout) of a model's decode and prefill passes.
    Plan(plan::PlanArgs),
    /// Print the token ids of a text (as llama.cpp's llama-tokenize does).
    Tokenize(tokenize::TokenizeArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat, completions, streaming).
    Serve(Box<serve::ServeArgs>),
    /// List the models in the cache and those `tnn pull` knows.
    List(models::ListArgs),
    /// Fetch known models into the cache (smollm2, the default; gemma3), checking SHA-256.
    Pull(models::PullArgs),
    /// Remove models from the cache.
    Rm(models::RmArgs),
    /// Print a shell completion script: `tnn completions bash > ~/.local/share/bash-completion/completions/tnn`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// llama.cpp spells some flags with one dash and several letters (`-sys`); clap takes those as
/// long flags only, so they are rewritten before parsing.
fn llama_cpp_spellings(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-sys") => "--sys".into(),
        Some("-np") => "--np".into(),
        _ => a,
    })
    .collect()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(llama_cpp_spellings(std::env::args_os())) {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; usage errors exit 1, like
            // every other error of `tnn` (clap's own code is 2).
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let result = match cli.command {
        Command::Run(args) => run::run(&args),
        Command::Chat(args) => chat::run(&args),
        Command::Inspect(args) => inspect::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Perplexity(args) => perplexity::run(&args),
        Command::Quantize(args) => quantize::run(&args),
        Command::Convert(args) => convert::run(&args),
        Command::Tokenize(args) => tokenize::run(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Finetune(args) => ranks::with_ranks(|comm| finetune::run(&args, comm)),
        Command::Train(args) => ranks::with_ranks(|comm| train::run(&args, comm)),
        Command::List(args) => models::list(&args),
        Command::Pull(args) => models::pull(&args),
        Command::Rm(args) => models::rm(&args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "tnn", &mut std::io::stdout());
            Ok(())
        }
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
