//! Throughput of the f32 products training runs (ignored: a timing, not a check): mul_mat
//! (F32 weights), mul_mat_t and out_prod at SmolLM2-135M's FFN shape (576 × 1536, 1024
//! tokens), one thread (`GEMM_THREADS`), best of 5; `GEMM_BF16=1` with
//! `ExecOptions::bf16_matmul`.
//!
//!     cargo test --release -p tinynn-cpu --test gemm_speed -- --ignored --nocapture

use std::time::Instant;

use tinynn_core::graph::Graph;
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::GgmlType::F32;

fn time(name: &str, build: impl Fn(&mut Graph) -> Vec<(tinynn_core::tensor::TensorId, usize)>) {
    let mut g = Graph::new();
    let ins = build(&mut g);
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    for (t, n) in &ins {
        let v: Vec<f32> = (0..*n)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        mem.write_f32(&plan, *t, &v).unwrap();
    }
    let threads: usize = std::env::var("GEMM_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let opts = ExecOptions {
        threads,
        bf16_matmul: std::env::var("GEMM_BF16").is_ok_and(|v| v == "1"),
        ..ExecOptions::default()
    };
    let mut e = Executor::with_options(&plan, opts);
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t0 = Instant::now();
        e.run(&plan, &mut mem).unwrap();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    let flops = 2.0 * 576.0 * 1536.0 * 1024.0;
    println!(
        "{name:10} {:7.1} ms  {:6.1} GFLOP/s",
        best * 1e3,
        flops / best / 1e9
    );
}

#[test]
#[ignore = "a timing; run with --ignored --nocapture"]
fn f32_products_throughput() {
    let (k, n, t) = (576, 1536, 1024);
    println!("AVX-512 BF16: {}", tinynn_cpu::simd::bf16_available());
    time("mul_mat", |g| {
        let w = g.input("w", F32, &[k, n]).unwrap();
        let x = g.input("x", F32, &[k, t]).unwrap();
        let y = g.mul_mat(w, x).unwrap();
        g.set_output(y).unwrap();
        vec![(w, k * n), (x, k * t)]
    });
    time("mul_mat_t", |g| {
        let w = g.input("w", F32, &[k, n]).unwrap();
        let dy = g.input("dy", F32, &[n, t]).unwrap();
        let y = g.mul_mat_t(w, dy).unwrap();
        g.set_output(y).unwrap();
        vec![(w, k * n), (dy, n * t)]
    });
    time("out_prod", |g| {
        let x = g.input("x", F32, &[k, t]).unwrap();
        let dy = g.input("dy", F32, &[n, t]).unwrap();
        let y = g.out_prod(x, dy).unwrap();
        g.set_output(y).unwrap();
        vec![(x, k * t), (dy, n * t)]
    });
}
