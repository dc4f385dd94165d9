//! What the executor costs between steps: a decode-shaped plan (30 blocks of norm, scale,
//! three products of one input, element-wise mixing, two products of another, a residual)
//! over vectors so small (64 values, 64×64 Q8_0 weights) that the steps' own arithmetic is
//! a fraction of a microsecond, so the time per run is the barriers and the hand-offs
//! between threads. Compare 1 and 2 threads, and before and after a change to the
//! executor or the pool.
//!
//! `cargo bench -p tinynn-cpu --bench step_overhead`

use divan::counter::ItemsCount;
use divan::Bencher;
use tinynn_core::graph::Graph;
use tinynn_core::quant;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

fn main() {
    divan::main();
}

const E: usize = 64;
const BLOCKS: usize = 30;

/// One block: `x + down(silu(gate(h)) ⊙ up(h))` with `h = (q(n)+k(n)) ⊙ v(n)`, `n` the
/// scaled norm of `x`; returns the new `x`, adds the block's weights to `ws` and its
/// norm scale (an input) to `scales`.
fn block(
    g: &mut Graph,
    l: usize,
    x: TensorId,
    ws: &mut Vec<TensorId>,
    scales: &mut Vec<TensorId>,
) -> TensorId {
    let mut w = |g: &mut Graph, name: &str| {
        let t = g
            .weight(&format!("{name}{l}"), GgmlType::Q8_0, &[E, E])
            .unwrap();
        ws.push(t);
        t
    };
    let [wq, wk, wv, wg, wu, wd] = ["q", "k", "v", "g", "u", "d"].map(|n| w(g, n));
    let scale = g.input(&format!("s{l}"), GgmlType::F32, &[E]).unwrap();
    scales.push(scale);
    let n = g.rms_norm(x, 1e-5).unwrap();
    let n = g.mul(n, scale).unwrap();
    let q = g.mul_mat(wq, n).unwrap();
    let k = g.mul_mat(wk, n).unwrap();
    let v = g.mul_mat(wv, n).unwrap();
    let qk = g.add(q, k).unwrap();
    let h = g.mul(qk, v).unwrap();
    let gate = g.mul_mat(wg, h).unwrap();
    let up = g.mul_mat(wu, h).unwrap();
    let a = g.swiglu(gate, up).unwrap();
    let d = g.mul_mat(wd, a).unwrap();
    g.add(x, d).unwrap()
}

fn run(bencher: Bencher, threads: usize) {
    let mut g = Graph::new();
    let x0 = g.input("x", GgmlType::F32, &[E]).unwrap();
    let (mut ws, mut scales) = (Vec::new(), Vec::new());
    let mut x = x0;
    for l in 0..BLOCKS {
        x = block(&mut g, l, x, &mut ws, &mut scales);
    }
    g.set_output(x).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    let wv: Vec<f32> = (0..E * E).map(|i| ((i % 13) as f32 - 6.0) / 64.0).collect();
    let mut wb = vec![0u8; quant::row_bytes(GgmlType::Q8_0, wv.len()).unwrap()];
    quant::quantize_row(GgmlType::Q8_0, &wv, &mut wb).unwrap();
    for &w in &ws {
        mem.bind_weight(&plan, w, &wb).unwrap();
        if let Some(p) = tinynn_cpu::packed::pack(GgmlType::Q8_0, [E, E, 1, 1], &wb) {
            mem.bind_packed(&plan, w, std::sync::Arc::new(p)).unwrap();
        }
    }
    let xs: Vec<f32> = (0..E).map(|i| (i as f32 - 30.0) / 40.0).collect();
    mem.write_f32(&plan, x0, &xs).unwrap();
    for &s in &scales {
        mem.write_f32(&plan, s, &[1.0; E]).unwrap();
    }
    let mut exec = Executor::new(&plan, threads);
    bencher
        .counter(ItemsCount::new(plan.steps().len()))
        .bench_local(|| exec.run(&plan, &mut mem).unwrap());
}

#[divan::bench(consts = [1, 2])]
fn decode_shaped_30_blocks<const T: usize>(bencher: Bencher) {
    run(bencher, T);
}
