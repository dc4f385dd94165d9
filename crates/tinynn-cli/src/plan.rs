//! `tnn plan`: how a model's forward passes are laid out in memory — the decode plan (one token)
//! and the prefill plan (a batch) — buffer by buffer, with the arena total against the sum.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use tinynn_cpu::ExecOptions;
use tinynn_models::session::Session;

#[derive(Args)]
pub struct PlanArgs {
    /// Model file, or a model name: smollm2, gemma3 (default: smollm2, fetched into the cache if missing).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context length (KV cache rows).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx: usize,
    /// Prompt batch size of the prefill plan.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch: usize,
    /// Print only the summary line of each plan.
    #[arg(long)]
    pub summary: bool,
}

pub fn run(args: &PlanArgs) -> Result<()> {
    let path = crate::models::resolve(args.model.as_deref())?;
    let model = tinynn_models::model::Model::open(&path)?;
    let mut session = Session::new(model, args.ctx, ExecOptions::default())
        .with_context(|| format!("loading {}", path.display()))?;
    let mut out = String::new();
    let batch = args.batch.clamp(1, session.n_ctx());
    for (title, n) in [("decode plan (1 token)", 1), ("prefill plan", batch)] {
        let plan = session.plan_for(n)?;
        let report = plan.layout_report();
        let (barriers, steps) = (tinynn_cpu::barriers(plan), plan.steps().len());
        let title = if n == 1 {
            title.to_string()
        } else {
            format!("{title} ({n} tokens)")
        };
        out.push_str(&format!(
            "== {title}, context {}\n",
            args.ctx.min(session.n_ctx())
        ));
        if args.summary {
            out.push_str(report.lines().last().unwrap_or_default());
            out.push('\n');
        } else {
            out.push_str(&report);
        }
        out.push_str(&format!(
            "barriers: {barriers} for {steps} steps (neighbours on disjoint bytes or the same rows share one)\n"
        ));
        out.push('\n');
    }
    crate::generate::emit(&out)
}
