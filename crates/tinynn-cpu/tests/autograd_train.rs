//! End to end: a 2-layer MLP trained with the AdamW op for 50 steps on a fixed toy
//! classification problem (one plan: forward, backward, update), identical on 1 and 2 threads;
//! and gradient accumulation across micro-batches with a reset that keeps optimizer state.

mod common;

use common::Rng;
use tinynn_core::graph::{GradMode, Gradients, Graph};
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;
const I32: GgmlType = GgmlType::I32;
/// Inputs, hidden units, classes, samples.
const D: usize = 6;
const H: usize = 16;
const C: usize = 3;
const S: usize = 32;

struct Mlp {
    plan: Plan,
    params: Vec<TensorId>,
    x: TensorId,
    labels: TensorId,
    loss: TensorId,
    hp: Option<TensorId>,
    grads: Gradients,
}

/// `logits = W2·silu(W1·x + b1) + b2`, mean cross-entropy; with AdamW when `train`.
fn mlp(mode: GradMode, train: bool) -> Mlp {
    let mut g = Graph::new();
    let shapes: [&[usize]; 4] = [&[D, H], &[H], &[H, C], &[C]];
    let params: Vec<TensorId> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| g.persistent(&format!("w{i}"), F32, s).unwrap())
        .collect();
    let x = g.input("x", F32, &[D, S]).unwrap();
    let labels = g.input("labels", I32, &[S]).unwrap();
    let h = g.mul_mat(params[0], x).unwrap(); // [H, S]
    let h = g.add(h, params[1]).unwrap();
    let h = g.silu(h).unwrap();
    let logits = g.mul_mat(params[2], h).unwrap(); // [C, S]
    let logits = g.add(logits, params[3]).unwrap();
    let loss = g.cross_entropy_loss(logits, labels).unwrap();
    g.set_output(loss).unwrap();
    let grads = g.backward_mode(loss, &params, mode).unwrap();
    let hp = train.then(|| {
        let hp = g.input("hp", F32, &[7]).unwrap();
        g.adamw_all(&grads, hp).unwrap();
        hp
    });
    if !train {
        for &gr in &grads.grads {
            g.set_output(gr).unwrap();
        }
    }
    Mlp {
        plan: tinynn_cpu::compile(g),
        params,
        x,
        labels,
        loss,
        hp,
        grads,
    }
}

/// The toy problem: random inputs labelled by a random linear teacher.
fn data(seed: u64) -> (Vec<f32>, Vec<i32>) {
    let mut rng = Rng::new(seed);
    let teacher = Rng::new(7).vec(D * C);
    let x = rng.vec(D * S);
    let labels = (0..S)
        .map(|s| {
            let score = |c: usize| {
                (0..D)
                    .map(|d| teacher[c * D + d] * x[s * D + d])
                    .sum::<f32>()
            };
            (0..C)
                .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                .unwrap() as i32
        })
        .collect();
    (x, labels)
}

fn init(m: &Mlp, mem: &mut Memory<'_>) {
    let mut rng = Rng::new(3);
    let fan_in = [D, 1, H, 1];
    for (i, &p) in m.params.iter().enumerate() {
        let n = m.plan.graph().layout(p).n_elements();
        let scale = 1.0 / (fan_in[i] as f32).sqrt();
        let v: Vec<f32> = rng.vec(n).iter().map(|v| v * scale).collect();
        mem.write_f32(&m.plan, p, &v).unwrap();
    }
}

fn loss_of(exec: &Executor, m: &Mlp, mem: &Memory<'_>) -> f32 {
    exec.read_f32(&m.plan, mem, m.loss).unwrap()[0]
}

/// Trains for `steps` AdamW steps on `threads` threads: the losses and the final parameters.
fn train(threads: usize, steps: usize) -> (Vec<f32>, Vec<Vec<f32>>) {
    let m = mlp(GradMode::Fresh, true);
    let mut mem = Memory::new(&m.plan);
    init(&m, &mut mem);
    let (x, labels) = data(1);
    mem.write_f32(&m.plan, m.x, &x).unwrap();
    mem.write_i32(&m.plan, m.labels, &labels).unwrap();
    let mut exec = Executor::new(&m.plan, threads);
    let (lr, b1, b2) = (0.05f32, 0.9f32, 0.999f32);
    let mut losses = Vec::with_capacity(steps);
    for t in 1..=steps as i32 {
        let hp = [
            lr,
            b1,
            b2,
            1e-8,
            0.01,
            1.0 / (1.0 - b1.powi(t)),
            1.0 / (1.0 - b2.powi(t)),
        ];
        mem.write_f32(&m.plan, m.hp.unwrap(), &hp).unwrap();
        exec.run(&m.plan, &mut mem).unwrap();
        losses.push(loss_of(&exec, &m, &mem));
    }
    let params = m
        .params
        .iter()
        .map(|&p| exec.read_f32(&m.plan, &mem, p).unwrap())
        .collect();
    (losses, params)
}

#[test]
fn mlp_learns_with_adamw_deterministically() {
    let (losses, params) = train(1, 50);
    let (first, last) = (losses[0], losses[49]);
    eprintln!("loss {first:.4} → {last:.4}");
    assert!(
        last < first / 100.0,
        "the loss should fall at least 100x in 50 steps (measured 1.21 → 0.0015): {losses:?}"
    );
    // Two threads: the same parameters bit for bit (every gradient sum has a fixed order);
    // the loss value itself is a sum of per-thread partials, equal to rounding.
    let (losses2, params2) = train(2, 50);
    assert_eq!(params, params2, "parameters differ between 1 and 2 threads");
    for (a, b) in losses.iter().zip(&losses2) {
        assert!((a - b).abs() <= 1e-6 * a.abs().max(1.0), "{a} vs {b}");
    }
}

#[test]
fn gradients_accumulate_across_micro_batches_and_reset() {
    let fresh = mlp(GradMode::Fresh, false);
    let acc = mlp(GradMode::Accumulate, false);
    assert_eq!(acc.grads.buffers.len(), 4);
    let mut fresh_mem = Memory::new(&fresh.plan);
    let mut acc_mem = Memory::new(&acc.plan);
    init(&fresh, &mut fresh_mem);
    init(&acc, &mut acc_mem);
    let mut fe = Executor::new(&fresh.plan, 2);
    let mut ae = Executor::new(&acc.plan, 2);
    let mut sum: Vec<Vec<f32>> = Vec::new();
    for batch in [1, 2] {
        let (x, labels) = data(batch);
        for (m, mem) in [(&fresh, &mut fresh_mem), (&acc, &mut acc_mem)] {
            mem.write_f32(&m.plan, m.x, &x).unwrap();
            mem.write_i32(&m.plan, m.labels, &labels).unwrap();
        }
        fe.run(&fresh.plan, &mut fresh_mem).unwrap();
        ae.run(&acc.plan, &mut acc_mem).unwrap();
        for (i, &gr) in fresh.grads.grads.iter().enumerate() {
            let g = fe.read_f32(&fresh.plan, &fresh_mem, gr).unwrap();
            match sum.get_mut(i) {
                Some(s) => s.iter_mut().zip(&g).for_each(|(s, g)| *s += g),
                None => sum.push(g),
            }
        }
    }
    // The buffers hold the sum of both micro-batches' gradients, exactly.
    for (i, &buf) in acc.grads.buffers.iter().enumerate() {
        assert_eq!(ae.read_f32(&acc.plan, &acc_mem, buf).unwrap(), sum[i]);
    }
    // Reset: zeros again, and the next run holds one batch's gradient.
    for &buf in &acc.grads.buffers {
        acc_mem.zero_persistent(&acc.plan, buf).unwrap();
        assert!(ae
            .read_f32(&acc.plan, &acc_mem, buf)
            .unwrap()
            .iter()
            .all(|&v| v == 0.0));
    }
    ae.run(&acc.plan, &mut acc_mem).unwrap();
    let last = fe
        .read_f32(&fresh.plan, &fresh_mem, fresh.grads.grads[0])
        .unwrap();
    assert_eq!(
        ae.read_f32(&acc.plan, &acc_mem, acc.grads.buffers[0])
            .unwrap(),
        last
    );
}

#[test]
fn resetting_gradients_keeps_adamw_state() {
    let m = mlp(GradMode::Accumulate, true);
    let mut mem = Memory::new(&m.plan);
    init(&m, &mut mem);
    let (x, labels) = data(1);
    mem.write_f32(&m.plan, m.x, &x).unwrap();
    mem.write_i32(&m.plan, m.labels, &labels).unwrap();
    mem.write_f32(
        &m.plan,
        m.hp.unwrap(),
        &[0.01, 0.9, 0.999, 1e-8, 0.0, 10.0, 1000.0],
    )
    .unwrap();
    let mut exec = Executor::new(&m.plan, 1);
    exec.run(&m.plan, &mut mem).unwrap();
    let moments: Vec<TensorId> = m
        .plan
        .persistents()
        .iter()
        .copied()
        .filter(|&t| m.plan.graph().node(t).name.starts_with("adam_"))
        .collect();
    assert_eq!(moments.len(), 8);
    let before: Vec<Vec<f32>> = moments
        .iter()
        .map(|&t| exec.read_f32(&m.plan, &mem, t).unwrap())
        .collect();
    assert!(before.iter().all(|v| v.iter().any(|&x| x != 0.0)));
    for &buf in &m.grads.buffers {
        mem.zero_persistent(&m.plan, buf).unwrap();
    }
    for (&t, b) in moments.iter().zip(&before) {
        assert_eq!(&exec.read_f32(&m.plan, &mem, t).unwrap(), b);
    }
}

/// `run_observed` hands each gradient buffer out once its last writer has run — before the
/// backward pass ends for all but the last one — with the bytes the run ends with, in step
/// order, on 1, 2 and 3 threads; a watch at another step, or of a tensor that is not
/// persistent, is refused before anything runs.
#[test]
fn gradient_buffers_are_handed_out_as_soon_as_they_are_final() {
    let m = mlp(GradMode::Accumulate, false);
    let buffers = &m.grads.buffers;
    let last = m.plan.last_writes(buffers);
    let mut watch: Vec<(usize, TensorId)> = last
        .iter()
        .zip(buffers)
        .map(|(s, &t)| (s.expect("every buffer is written"), t))
        .collect();
    watch.sort_unstable();
    let n_steps = m.plan.steps().len();
    // The backward pass reaches the output layer's parameters first.
    assert!(watch[0].0 + 1 < n_steps, "{watch:?} of {n_steps} steps");
    assert!(watch.windows(2).all(|w| w[0].0 < w[1].0), "{watch:?}");
    for threads in 1..=3 {
        let mut mem = Memory::new(&m.plan);
        init(&m, &mut mem);
        let (x, labels) = data(threads as u64);
        mem.write_f32(&m.plan, m.x, &x).unwrap();
        mem.write_i32(&m.plan, m.labels, &labels).unwrap();
        let mut exec = Executor::new(&m.plan, threads);
        let seen = std::sync::Mutex::new(Vec::new());
        let ready = |t: TensorId, bytes: &[u8]| {
            let v: Vec<f32> = bytemuck::cast_slice(bytes).to_vec();
            seen.lock().unwrap().push((t, v));
        };
        exec.run_observed(&m.plan, &mut mem, &watch, &ready)
            .unwrap();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), watch.len());
        for ((t, v), &(_, w)) in seen.iter().zip(&watch) {
            assert_eq!(*t, w);
            assert_eq!(
                *v,
                exec.read_f32(&m.plan, &mem, w).unwrap(),
                "{threads} threads"
            );
            assert!(v.iter().any(|&g| g != 0.0));
        }
    }
    let mut mem = Memory::new(&m.plan);
    let mut exec = Executor::new(&m.plan, 1);
    let none = |_: TensorId, _: &[u8]| panic!("nothing may be handed out");
    let early = [(watch[1].0 - 1, watch[1].1)];
    let err = exec.run_observed(&m.plan, &mut mem, &early, &none);
    assert!(err
        .unwrap_err()
        .to_string()
        .contains("is not the last step writing it"),);
    let arena = [(watch[0].0, m.loss)];
    let err = exec.run_observed(&m.plan, &mut mem, &arena, &none);
    assert!(err.unwrap_err().to_string().contains("not a persistent"));
    let mut backwards = watch.clone();
    backwards.reverse();
    let err = exec.run_observed(&m.plan, &mut mem, &backwards, &none);
    assert!(err.unwrap_err().to_string().contains("not ascending"));
}
