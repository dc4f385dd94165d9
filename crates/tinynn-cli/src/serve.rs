//! `tnn serve`: the OpenAI-compatible HTTP server (flags only; the server is `tinynn-server`).

use anyhow::Result;
use clap::Args;

use crate::generate::ModelArgs;

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub lora: crate::lora_args::LoraArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Requests generating at once (slots); each gets ctx-size / parallel tokens.
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 4)]
    pub parallel: usize,
    /// Requests that may wait for a free slot (more are answered 429).
    #[arg(long, default_value_t = 64)]
    pub queue: usize,
    /// Clients must send `Authorization: Bearer KEY`.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Let browser pages from this origin call the API (CORS).
    #[arg(long)]
    pub cors: Option<String>,
    #[command(flatten)]
    pub template: crate::chat_template_args::ChatTemplateArgs,
    /// How /v1/embeddings pools a text's hidden states: mean or last.
    #[arg(long, default_value = "mean", value_parser = ["mean", "last"])]
    pub pooling: String,
}

pub fn run(args: &ServeArgs) -> Result<()> {
    let chat_template = args.template.source()?;
    let config = tinynn_server::ServerConfig {
        model: args.model.path()?,
        host: args.host.clone(),
        port: args.port,
        n_ctx: args.model.ctx,
        slots: args.parallel,
        queue: args.queue,
        n_batch: args.model.batch,
        exec: args.model.exec_options(),
        api_key: args.api_key.clone(),
        cors: args.cors.clone(),
        lora: args.lora.applied()?,
        chat_template,
        pooling: if args.pooling == "last" {
            tinynn_models::embed::Pooling::Last
        } else {
            tinynn_models::embed::Pooling::Mean
        },
    };
    anyhow::ensure!(
        (1..=64).contains(&args.parallel),
        "--parallel must be between 1 and 64 (got {})",
        args.parallel
    );
    tinynn_server::run_until_signal(config)?;
    Ok(())
}
