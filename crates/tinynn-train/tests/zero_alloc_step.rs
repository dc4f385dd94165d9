//! A trainer's step allocates nothing once the first step has run: forward, backward, gradient
//! norm, clipping and the optimizer update all run in memory planned up front. Checked under a
//! counting global allocator for full fine-tuning (AdamW, clipping, two micro-batches per
//! step, so the gradient buffers are zeroed between steps) and for LoRA with dropout (a fresh
//! dropout seed every micro-batch), on 2 threads. This file holds one test so no other test
//! allocates meanwhile.

mod common;
#[path = "../../tinynn-format/tests/support/counting_alloc_ffi.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering;

use common::tiny_llama::{self, V};
use tinynn_train::{LoraConfig, Targets, TrainConfig, TrainSource, Trainer};

const SEQ: usize = 16;

fn random() -> TrainSource<'static> {
    tiny_llama::random(64, 3)
}

/// Allocations made by `steps` steps after a first one, and the losses of all of them.
fn steady_allocations(mut t: Trainer, accum: usize, steps: usize) -> (usize, Vec<f32>) {
    let n = 2 * SEQ * accum;
    let ids: Vec<i32> = (0..n as i32).map(|i| (i * 7 + 1) % V as i32).collect();
    let labels: Vec<i32> = (0..n as i32).map(|i| (i * 7 + 8) % V as i32).collect();
    let mut losses = Vec::with_capacity(steps + 1);
    losses.push(t.step(&ids, &labels, 1e-2).unwrap().loss);
    let before = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..steps {
        let r = t.step(&ids, &labels, 1e-2).unwrap();
        assert!(!r.skipped);
        losses.push(r.loss);
    }
    let made = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst) - before;
    (made, losses)
}

#[test]
fn trainer_steps_allocate_nothing() {
    let base = TrainConfig {
        seq: SEQ,
        batch: 2,
        threads: 2,
        ..TrainConfig::default()
    };
    let full = TrainConfig {
        accum: 2,
        clip: Some(0.5),
        ..base
    };
    let (made, losses) = steady_allocations(Trainer::new(random(), full).unwrap(), 2, 10);
    assert_eq!(made, 0, "full fine-tuning steps allocated {made} times");
    assert!(losses[10] < losses[0], "{losses:?}");

    let lora = TrainConfig {
        lora: Some(LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.1,
            targets: Targets::parse("q,v,down").unwrap(),
            seed: 9,
        }),
        ..base
    };
    let (made, losses) = steady_allocations(Trainer::new(random(), lora).unwrap(), 1, 10);
    assert_eq!(made, 0, "LoRA steps allocated {made} times");
    assert!(losses[10] < losses[0], "{losses:?}");
}
