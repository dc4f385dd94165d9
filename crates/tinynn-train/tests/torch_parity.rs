//! tinynn-train against PyTorch on tiny random models (committed fixtures from
//! scripts/make-train-fixtures.py and scripts/make-zoo-train-fixtures.py): the loss and EVERY
//! parameter gradient of one step within 1e-4 (per tensor, max|a − b| / max|b|), and 10 AdamW
//! steps' losses within 1e-4 relative.
//! Normal (multi-threaded, non-strict) mode.

mod common;

use common::{expected, fixture_dir, rel_err, torch_grads, train_config};
use tinynn_format::model_dir::HfModelDir;
use tinynn_train::Trainer;

const TOL: f64 = 1e-4;

fn gradients_match(name: &str, threads: usize, strict: bool) {
    let e = expected(name);
    let dir = HfModelDir::open(fixture_dir(name)).unwrap();
    let mut t = Trainer::new(&dir, train_config(&e, threads, strict)).unwrap();
    let (loss, grads) = t.gradients(&e.ids, &e.labels).unwrap();
    let want = torch_grads(name);
    assert_eq!(grads.len(), want.len(), "parameter count");
    let loss_err = f64::from((loss - e.loss).abs()) / f64::from(e.loss.abs());
    let mut worst = (0.0f64, String::new());
    for g in &grads {
        let w = want
            .get(&g.name)
            .unwrap_or_else(|| panic!("PyTorch has no gradient for {}", g.name));
        let err = rel_err(&g.data, w);
        assert!(
            err <= TOL,
            "{name}: gradient of {} off by {err:.3e}",
            g.name
        );
        if err > worst.0 {
            worst = (err, g.name.clone());
        }
    }
    println!(
        "{name} (threads {threads}, strict {strict}): loss {loss} vs {} (rel {loss_err:.2e}); worst gradient {} rel {:.2e}",
        e.loss, worst.1, worst.0
    );
    assert!(loss_err <= TOL, "{name}: loss {loss} vs {}", e.loss);
}

fn adamw_losses_match(name: &str) {
    let e = expected(name);
    let dir = HfModelDir::open(fixture_dir(name)).unwrap();
    let mut t = Trainer::new(&dir, train_config(&e, 2, false)).unwrap();
    let mut worst = 0f64;
    for (s, &want) in e.adamw_losses.iter().enumerate() {
        let r = t.step(&e.ids, &e.labels, 1e-3).unwrap();
        assert!(!r.skipped);
        let err = f64::from((r.loss - want).abs()) / f64::from(want.abs());
        println!(
            "{name} step {}: loss {} vs {want} (rel {err:.2e})",
            s + 1,
            r.loss
        );
        assert!(
            err <= TOL,
            "{name}: step {} loss {} vs {want}",
            s + 1,
            r.loss
        );
        worst = worst.max(err);
    }
    println!("{name}: 10 AdamW steps, worst loss rel {worst:.2e}");
}

#[test]
fn llama_loss_and_every_gradient_match_pytorch() {
    gradients_match("train-llama", 2, false);
}

#[test]
fn tied_qwen2_loss_and_every_gradient_match_pytorch() {
    gradients_match("train-qwen2-tied", 2, false);
}

#[test]
fn strict_mode_gradients_match_pytorch_too() {
    gradients_match("train-llama", 1, true);
}

#[test]
fn llama_ten_adamw_steps_match_pytorch() {
    adamw_losses_match("train-llama");
}

#[test]
fn tied_qwen2_ten_adamw_steps_match_pytorch() {
    adamw_losses_match("train-qwen2-tied");
}

/// Gemma (scripts/make-zoo-train-fixtures.py): embeddings × √d, GeGLU, norms on 1 + w.
#[test]
fn gemma_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gemma", 2, false);
    adamw_losses_match("train-gemma");
}

/// Gemma 2: soft-capped attention and logits, a 5-token window on the first layer.
#[test]
fn gemma2_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gemma2", 2, false);
    adamw_losses_match("train-gemma2");
}

/// Gemma 3: per-head q/k norms, a window layer with its own RoPE base, then a global one.
#[test]
fn gemma3_loss_gradients_and_adamw_steps_match_pytorch() {
    gradients_match("train-gemma3", 2, false);
    gradients_match("train-gemma3", 1, true);
    adamw_losses_match("train-gemma3");
}
