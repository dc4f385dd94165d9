//! Fine-tunes a LoRA adapter on the default model (SmolLM2-135M-Instruct Q4_1, fetched into
//! the model cache on first use) with the library's training loop, `tinynn::fit`: three
//! steps of one 64-token sequence on a short text (the GPL-3 when the system has it, otherwise a
//! paragraph kept here), on 2 threads, printing the losses and writing the adapter to a
//! temporary directory.
//!
//! ```text
//! cargo run --release -p tinynn --example finetune_lora
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use tinynn::train::data::{BatchConfig, Batcher, EvalSplit, PackedText};
use tinynn::train::metrics::StepMetrics;
use tinynn::train::train_loop::{EvalEvent, EvalKind, Output};
use tinynn::{fit, LoopConfig, LoopObserver, LoraConfig, Model, Targets, TrainConfig, Trainer};

const SEQ: usize = 64;

/// Used when /usr/share/common-licenses/GPL-3 is missing.
const PARAGRAPH: &str = "The licenses for most software and other practical works are designed \
to take away your freedom to share and change the works. By contrast, the GNU General Public \
License is intended to guarantee your freedom to share and change all versions of a program, to \
make sure it remains free software for all its users. When we speak of free software, we are \
referring to freedom, not price. Our General Public Licenses are designed to make sure that you \
have the freedom to distribute copies of free software (and charge for them if you wish), that \
you receive source code or can get it if you want it, that you can change the software or use \
pieces of it in new free programs, and that you know you can do these things.";

/// Prints the loop's events.
struct Print;

impl LoopObserver for Print {
    fn on_step(&mut self, m: &StepMetrics) {
        println!(
            "step {}: loss {:.4} (lr {:.1e}, {:.0} tokens/s)",
            m.step, m.loss, m.lr, m.tokens_per_s
        );
    }

    fn on_eval(&mut self, e: &EvalEvent) {
        let when = match e.kind {
            EvalKind::Before => "before training".to_string(),
            EvalKind::Periodic => format!("at step {}", e.step),
            EvalKind::Final => format!("after step {}", e.step),
        };
        println!("held-out loss {when}: {:.4}", e.loss);
    }

    fn on_message(&mut self, msg: &str) {
        println!("{msg}");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = tinynn::default_model()?;
    let model = Model::open(&path)?;
    let tokenizer = model.tokenizer()?;
    let eos = tokenizer
        .eos()
        .ok_or("the tokenizer has no end-of-text token")?;

    let gpl = Path::new("/usr/share/common-licenses/GPL-3");
    let text = if gpl.is_file() {
        PackedText::from_files(&[gpl.to_path_buf()], tokenizer, eos, SEQ)?
    } else {
        let docs = std::iter::once((Path::new("paragraph.txt"), PARAGRAPH.repeat(4)));
        PackedText::from_documents(docs, tokenizer, eos, SEQ)?
    };
    let mut batcher = Batcher::new(
        Box::new(text),
        BatchConfig {
            batch: 1,
            shuffle: true,
            seed: 42,
            eval: EvalSplit::Last { fraction: 0.1 },
        },
    )?;

    // QLoRA: the Q4_1 base stays frozen in its file type; only the q/v adapters train.
    let lora = LoraConfig {
        rank: 8,
        alpha: 16.0,
        dropout: 0.05,
        targets: Targets::parse("q,v")?,
        seed: 42,
    };
    let mut trainer = Trainer::new(
        model.source(),
        TrainConfig {
            seq: SEQ,
            batch: 1,
            threads: 2,
            lora: Some(lora),
            ..TrainConfig::default()
        },
    )?;

    let out: PathBuf =
        std::env::temp_dir().join(format!("tinynn-finetune-lora-{}", std::process::id()));
    let mut cfg = LoopConfig::new(&out, 3);
    cfg.lr = 1e-3;
    cfg.eval_batches = 4;
    cfg.output = Output::Adapter { merge: false };
    cfg.run_identity = serde_json::json!({ "model": path.display().to_string(), "seq": SEQ });

    // A front end sets this from its Ctrl-C handler; the loop then saves and returns.
    let stop = AtomicBool::new(false);
    let outcome = fit(&mut trainer, &mut batcher, &cfg, &stop, &mut Print)?;
    let s = &outcome.summary;
    println!(
        "{} steps in {:.1} s, last loss {:.4}; adapter, checkpoint, metrics.jsonl and loss.png in {}",
        s.steps_run,
        s.secs,
        s.last_loss.unwrap_or(f32::NAN),
        out.display()
    );
    Ok(())
}
