//! A training step allocates nothing: forward, backward and AdamW of a tiny Llama-style block
//! (embedding, RMSNorm, q/k/v, RoPE, causal GQA flash attention, SwiGLU, cross-entropy) in ONE
//! plan, run 20 times on 2 threads under a counting global allocator. The loss goes down.
//! This file holds one test so no other test allocates meanwhile.

mod common;
#[path = "../../tinynn-format/tests/support/counting_alloc_ffi.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering;

use common::{tiny_block, Input, Rng};
use tinynn_core::graph::{GradMode, Graph};
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

#[test]
fn a_training_step_allocates_nothing() {
    let mut g = Graph::new();
    let init = tiny_block::params(&mut Rng::new(41));
    let params: Vec<TensorId> = init
        .iter()
        .enumerate()
        .map(|(i, (shape, _))| {
            g.persistent(&format!("w{i}"), GgmlType::F32, shape)
                .unwrap()
        })
        .collect();
    let (loss, inputs) = tiny_block::block(&mut g, &params, true);
    g.set_output(loss).unwrap();
    let grads = g.backward_mode(loss, &params, GradMode::Fresh).unwrap();
    let hp = g.input("adamw_hp", GgmlType::F32, &[7]).unwrap();
    g.adamw_all(&grads, hp).unwrap();
    let plan = tinynn_cpu::compile(g);
    plan.verify().unwrap();

    let mut mem = Memory::new(&plan);
    for (&t, (_, values)) in params.iter().zip(&init) {
        let scaled: Vec<f32> = values.iter().map(|v| v * 0.5).collect();
        mem.write_f32(&plan, t, &scaled).unwrap();
    }
    for input in &inputs {
        match input {
            Input::F32(t, v) => mem.write_f32(&plan, *t, v).unwrap(),
            Input::I32(t, v) => mem.write_i32(&plan, *t, v).unwrap(),
        }
    }
    let (lr, b1, b2) = (0.02f32, 0.9f32, 0.999f32);
    let mut hp_vals = [lr, b1, b2, 1e-8, 0.0, 0.0, 0.0];
    let mut exec = Executor::new(&plan, 2);
    let mut losses = [0f32; 21];
    // The first run sizes the arena; every later step must allocate nothing.
    let mut step = |exec: &mut Executor, mem: &mut Memory<'_>, t: i32| {
        hp_vals[5] = 1.0 / (1.0 - b1.powi(t));
        hp_vals[6] = 1.0 / (1.0 - b2.powi(t));
        mem.write_f32(&plan, hp, &hp_vals).unwrap();
        exec.run(&plan, mem).unwrap();
        let bytes = exec.bytes(&plan, mem, loss).unwrap();
        f32::from_le_bytes(bytes[..4].try_into().unwrap())
    };
    losses[0] = step(&mut exec, &mut mem, 1);
    let before = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst);
    for (t, l) in losses.iter_mut().enumerate().skip(1) {
        *l = step(&mut exec, &mut mem, t as i32 + 1);
    }
    let allocations = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(allocations, 0, "a training step allocated");
    assert!(
        losses[20] < 0.5 * losses[0],
        "the loss did not go down: {losses:?}"
    );
}
