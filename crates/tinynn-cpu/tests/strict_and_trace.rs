//! Strict mode (f64 accumulation, unquantized activations, exact RoPE angles) lands within
//! f32 rounding of an f64 reference; tracing writes a Chrome trace with one event per step and
//! thread.

mod common;

use common::{nmse, weight_bytes, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_core::quant;
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;

fn strict() -> ExecOptions {
    ExecOptions {
        threads: 2,
        strict: true,
        ..ExecOptions::default()
    }
}

#[test]
fn strict_mul_mat_uses_unquantized_activations_and_f64_sums() {
    let mut rng = Rng::new(31);
    let (k, n, m) = (512, 7, 3);
    for ty in [GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q6K, GgmlType::F16] {
        let w = weight_bytes(ty, k, n, &mut rng);
        let mut wf = vec![0f32; k * n];
        quant::dequantize_row(ty, &w, &mut wf).unwrap();
        let x = rng.vec(k * m);
        let mut g = Graph::new();
        let wt = g.weight("w", ty, &[k, n]).unwrap();
        let xt = g.input("x", F32, &[k, m]).unwrap();
        let y = g.mul_mat(wt, xt).unwrap();
        g.set_output(y).unwrap();
        let plan = tinynn_cpu::compile(g);
        let mut mem = Memory::new(&plan);
        mem.bind_weight(&plan, wt, &w).unwrap();
        mem.write_f32(&plan, xt, &x).unwrap();
        let want: Vec<f64> = (0..n * m)
            .map(|i| {
                let (ni, mi) = (i % n, i / n);
                (0..k)
                    .map(|j| f64::from(wf[ni * k + j]) * f64::from(x[mi * k + j]))
                    .sum()
            })
            .collect();
        let mut exec = Executor::with_options(&plan, strict());
        assert_eq!(exec.n_threads(), 1, "strict mode runs on one thread");
        exec.run(&plan, &mut mem).unwrap();
        let e = nmse(&exec.read_f32(&plan, &mem, y).unwrap(), &want);
        assert!(e < 1e-13, "{ty} strict: NMSE {e:e}");
        // The fast path quantizes x to the dot type, so it is measurably further off.
        let mut fast = Executor::new(&plan, 2);
        fast.run(&plan, &mut mem).unwrap();
        let fast_e = nmse(&fast.read_f32(&plan, &mem, y).unwrap(), &want);
        if ty != GgmlType::F16 {
            assert!(fast_e > e, "{ty}: fast {fast_e:e} vs strict {e:e}");
        }
    }
}

#[test]
fn strict_rope_matches_f64_at_large_positions() {
    let mut rng = Rng::new(32);
    let (hd, nh, nt) = (64, 2, 3);
    let x = rng.vec(hd * nh * nt);
    let pos = [1, 5000, 30000];
    let mut g = Graph::new();
    let a = g.input("x", F32, &[hd, nh, nt]).unwrap();
    let p = g.input("pos", GgmlType::I32, &[nt]).unwrap();
    let y = g
        .rope(a, p, Rope::new(RopeMode::Normal, hd, 10000.0))
        .unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.write_f32(&plan, a, &x).unwrap();
    mem.write_i32(&plan, p, &pos).unwrap();
    let mut want: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (t, &pt) in pos.iter().enumerate() {
        for h in 0..nh {
            let b = (t * nh + h) * hd;
            for i in 0..hd / 2 {
                let theta = f64::from(pt) * 10000f64.powf(-2.0 * i as f64 / hd as f64);
                let (x0, x1) = (f64::from(x[b + 2 * i]), f64::from(x[b + 2 * i + 1]));
                want[b + 2 * i] = x0 * theta.cos() - x1 * theta.sin();
                want[b + 2 * i + 1] = x0 * theta.sin() + x1 * theta.cos();
            }
        }
    }
    let mut exec = Executor::with_options(&plan, strict());
    exec.run(&plan, &mut mem).unwrap();
    let e = nmse(&exec.read_f32(&plan, &mem, y).unwrap(), &want);
    assert!(e < 1e-13, "strict rope at position 30000: NMSE {e:e}");
}

#[test]
fn trace_has_one_event_per_step_and_thread() {
    let mut g = Graph::new();
    let x = g.input("x", F32, &[64, 4]).unwrap();
    let a = g.silu(x).unwrap();
    let b = g.rms_norm(a, 1e-6).unwrap();
    let c = g.soft_max(b, None, 1.0).unwrap();
    g.set_output(c).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    let mut plain = Executor::new(&plan, 2);
    plain.run(&plan, &mut mem).unwrap();
    assert!(plain.chrome_trace(&plan).is_none());

    let opts = ExecOptions {
        threads: 2,
        strict: false,
        trace: true,
        ..ExecOptions::default()
    };
    let mut exec = Executor::with_options(&plan, opts);
    exec.run(&plan, &mut mem).unwrap();
    let json: serde_json::Value = serde_json::from_str(&exec.chrome_trace(&plan).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    assert_eq!(events.len(), 3 * 2);
    let names: Vec<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["silu", "silu", "rms_norm", "rms_norm", "soft_max", "soft_max"]
    );
    for e in events {
        assert_eq!(e["ph"], "X");
        assert!(e["dur"].as_f64().unwrap() >= 0.0);
        assert_eq!(e["args"]["dtype"], "F32");
    }
    // Steps follow each other: each starts after the previous step began.
    let ts: Vec<f64> = events
        .iter()
        .step_by(2)
        .map(|e| e["ts"].as_f64().unwrap())
        .collect();
    assert!(ts.windows(2).all(|w| w[0] <= w[1]), "{ts:?}");
}
