//! The gradient product of a frozen quantized weight (`mul_mat_t`, dx = Wᵀ·dy) through its
//! transposed Q8_0 copy (`PackedWeight::add_backward_q8_0`): it is exactly the forward
//! product of that copy with dy's rows as activations, the same bits on 1–3 threads, within
//! 8-bit (7-bit at AVX2) rounding of the f64 product of the dequantized weight — and without the copy the
//! product stays the f32 one.

use std::sync::Arc;

use tinynn_core::graph::Graph;
use tinynn_core::measure::rel_err;
use tinynn_core::quant;
use tinynn_cpu::packed::{self, PackedWeight};
use tinynn_cpu::simd::required_by_test;
use tinynn_cpu::{ExecOptions, Executor, Memory};
use tinynn_format::GgmlType;

mod common;

fn noise(n: usize, seed: u64) -> Vec<f32> {
    common::Rng::new(seed).vec(n)
}

fn quantized(ty: GgmlType, k: usize, n: usize, seed: u64) -> Vec<u8> {
    let rb = quant::row_bytes(ty, k).unwrap();
    let x = noise(k * n, seed);
    let mut out = vec![0u8; rb * n];
    for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        quant::quantize_row(ty, src, dst).unwrap();
    }
    out
}

/// `dx = Wᵀ · dy` through a graph (`w` `[k, n]` bound with `p`; `dy` `[n, m]`), on `threads`.
fn run(
    p: &Arc<PackedWeight>,
    w: &[u8],
    dy: &[f32],
    [k, n, m]: [usize; 3],
    threads: usize,
) -> Vec<f32> {
    let mut g = Graph::new();
    let wt = g.persistent("w", p.source_type(), &[k, n]).unwrap();
    let dyt = g.input("dy", GgmlType::F32, &[n, m]).unwrap();
    let dx = g.mul_mat_t(wt, dyt).unwrap(); // [k, m]
    g.set_output(dx).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.persistent_mut(&plan, wt).unwrap().copy_from_slice(w);
    mem.bind_packed(&plan, wt, p.clone()).unwrap();
    mem.write_f32(&plan, dyt, dy).unwrap();
    let opts = ExecOptions {
        threads,
        ..Default::default()
    };
    let mut exec = Executor::with_options(&plan, opts);
    exec.run(&plan, &mut mem).unwrap();
    exec.read_f32(&plan, &mem, dx).unwrap()
}

/// The f64 product of the dequantized weight: `out[mi·k + i] = Σ_r W[r][i] · dy[mi·n + r]`.
fn reference(p: &PackedWeight, dy: &[f32], [k, n, m]: [usize; 3]) -> Vec<f32> {
    let mut w = vec![0f32; k * n];
    for (r, row) in w.chunks_exact_mut(k).enumerate() {
        assert!(p.dequantize_row(r, row));
    }
    let mut out = vec![0f32; k * m];
    for mi in 0..m {
        for i in 0..k {
            let s: f64 = (0..n)
                .map(|r| f64::from(w[r * k + i]) * f64::from(dy[mi * n + r]))
                .sum();
            out[mi * k + i] = s as f32;
        }
    }
    out
}

#[test]
fn the_int8_gradient_product_is_the_forward_product_of_the_transposed_copy() {
    if !required_by_test("packed Q8_0 kernels", packed::packs(GgmlType::Q8_0)) {
        return;
    }
    // Token counts on the few-rows path (≤ 8) and past it; output sizes that leave partial
    // 16-row groups; the K kinds' 256-element rows.
    let cases = [
        (GgmlType::Q4_1, [64, 96, 1]),
        (GgmlType::Q4_1, [96, 64, 37]),
        (GgmlType::Q8_0, [32, 160, 9]),
        (GgmlType::Q4_0, [160, 32, 5]),
        (GgmlType::Q5_1, [64, 64, 20]),
        (GgmlType::Q4K, [256, 64, 12]),
    ];
    for (ty, shape @ [k, n, m]) in cases {
        if !packed::packs(ty) {
            continue;
        }
        let w = quantized(ty, k, n, (k * 7 + n) as u64);
        let dy = noise(n * m, (m + 3) as u64);
        let mut p = packed::pack(ty, [k, n, 1, 1], &w).unwrap();
        let plain = Arc::new(packed::pack(ty, [k, n, 1, 1], &w).unwrap());
        assert!(p.add_backward_q8_0(), "{ty}");
        let t = p.backward().unwrap();
        assert_eq!(t.shape(), [n, k]);
        assert!(p.bytes() >= plain.bytes() + t.bytes());

        // What the forward kernels give for the transposed copy with dy's rows.
        let arb = t.activation_row_bytes();
        let mut acts = vec![0u8; arb * m];
        for (row, a) in dy.chunks_exact(n).zip(acts.chunks_exact_mut(arb)) {
            t.prepare_activations(row, a);
        }
        let mut want = vec![0f32; k * m];
        t.matmul(&acts, m, &mut want);

        let p = Arc::new(p);
        let got = run(&p, &w, &dy, shape, 1);
        assert_eq!(
            got, want,
            "{ty} {shape:?}: not the transposed copy's forward product"
        );
        for threads in [2, 3] {
            assert_eq!(
                run(&p, &w, &dy, shape, threads),
                got,
                "{ty} {shape:?} {threads}t"
            );
        }
        // Within 8-bit rounding of both operands of the f64 product; without the copy, the
        // f32 product (much closer: the two paths are told apart).
        let exact = reference(&plain, &dy, shape);
        let e8 = rel_err(&got, &exact);
        let f32_path = run(&plain, &w, &dy, shape, 2);
        let e32 = rel_err(&f32_path, &exact);
        assert!(e8 < 2e-2, "{ty} {shape:?}: int8 product off by {e8}");
        assert!(e32 < 1e-5, "{ty} {shape:?}: f32 product off by {e32}");
        assert!(e8 > 10.0 * e32, "{ty} {shape:?}: {e8} vs {e32}");
    }
}

/// A weight whose rows are not whole Q8_0 blocks gets no transposed copy, and its gradient
/// product stays the f32 one.
#[test]
fn rows_that_are_not_whole_blocks_keep_the_f32_product() {
    if !required_by_test("packed Q4_1 kernels", packed::packs(GgmlType::Q4_1)) {
        return;
    }
    let (k, n, m) = (64, 48, 6);
    let w = quantized(GgmlType::Q4_1, k, n, 5);
    let mut p = packed::pack(GgmlType::Q4_1, [k, n, 1, 1], &w).unwrap();
    assert!(!p.add_backward_q8_0());
    assert!(p.backward().is_none());
    let p = Arc::new(p);
    let dy = noise(n * m, 9);
    let got = run(&p, &w, &dy, [k, n, m], 2);
    let e = rel_err(&got, &reference(&p, &dy, [k, n, m]));
    assert!(e < 1e-5, "{e}");
}
