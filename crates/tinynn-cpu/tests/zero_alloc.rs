//! Running a plan allocates nothing: a small attention block (embedding lookup, RMS norm,
//! quantized projections, RoPE, scores, masked softmax) run 20 times on 2 threads under a
//! counting global allocator. This file holds one test so no other test allocates meanwhile.

mod common;
#[path = "../../tinynn-format/tests/support/counting_alloc_ffi.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering;

use common::{f32_bytes, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;

#[test]
fn running_a_plan_allocates_nothing() {
    let mut rng = Rng::new(11);
    let (d, n_head, hd, t) = (64, 4, 16, 6);
    let mut g = Graph::new();
    let ids = g.input("ids", GgmlType::I32, &[t]).unwrap();
    let pos = g.input("pos", GgmlType::I32, &[t]).unwrap();
    let mask = g.input("mask", F32, &[t, t]).unwrap();
    let emb = g.weight("emb", GgmlType::Q8_0, &[d, 10]).unwrap();
    let wq = g.weight("wq", GgmlType::Q4_0, &[d, d]).unwrap();
    let wk = g.weight("wk", GgmlType::Q4_1, &[d, d]).unwrap();
    let norm = g.weight("norm", F32, &[d]).unwrap();
    let x = g.get_rows(emb, ids).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, norm).unwrap();
    let rope = Rope::new(RopeMode::Neox, hd, 10000.0);
    let q = g.mul_mat(wq, h).unwrap();
    let q = g.reshape(q, &[hd, n_head, t]).unwrap();
    let q = g.rope(q, pos, rope).unwrap();
    let k = g.mul_mat(wk, h).unwrap();
    let k = g.reshape(k, &[hd, n_head, t]).unwrap();
    let k = g.rope(k, pos, rope).unwrap();
    let q = g.permute(q, [0, 2, 1, 3]).unwrap();
    let k = g.permute(k, [0, 2, 1, 3]).unwrap();
    let k = g.cont(k).unwrap();
    let scores = g.mul_mat(k, q).unwrap();
    let probs = g.soft_max(scores, Some(mask), 0.25).unwrap();
    g.set_output(probs).unwrap();
    let plan = tinynn_cpu::compile(g);
    plan.verify().unwrap();

    let (e, a, b) = (rng.vec(d * 10), rng.vec(d * d), rng.vec(d * d));
    let q8 = |ty, v: &[f32]| {
        let mut out = vec![0u8; tinynn_core::quant::row_bytes(ty, v.len()).unwrap()];
        tinynn_core::quant::quantize_row(ty, v, &mut out).unwrap();
        out
    };
    let (eb, ab, bb, nb) = (
        q8(GgmlType::Q8_0, &e),
        q8(GgmlType::Q4_0, &a),
        q8(GgmlType::Q4_1, &b),
        f32_bytes(&vec![1.0; d]),
    );
    let mut mem = Memory::new(&plan);
    for (w, bytes) in [(emb, &eb), (wq, &ab), (wk, &bb), (norm, &nb)] {
        mem.bind_weight(&plan, w, bytes).unwrap();
    }
    mem.write_i32(&plan, ids, &[1, 5, 9, 0, 2, 2]).unwrap();
    mem.write_i32(&plan, pos, &[0, 1, 2, 3, 4, 5]).unwrap();
    let causal: Vec<f32> = (0..t * t)
        .map(|i| {
            if i % t > i / t {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    mem.write_f32(&plan, mask, &causal).unwrap();
    let mut exec = Executor::new(&plan, 2);
    exec.run(&plan, &mut mem).unwrap();

    let before = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst);
    for _ in 0..20 {
        exec.run(&plan, &mut mem).unwrap();
    }
    let allocations = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(allocations, 0, "running the plan allocated");

    // And the result is a softmax: rows sum to 1, causal entries are 0.
    let p = exec.read_f32(&plan, &mem, probs).unwrap();
    for row in p.chunks_exact(t) {
        let s: f32 = row.iter().sum();
        assert!((s - 1.0).abs() < 1e-5, "row sums to {s}");
    }
    assert_eq!(p[1], 0.0, "future position got weight");
}
