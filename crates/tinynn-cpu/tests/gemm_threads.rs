//! The f32 GEMM behind `mul_mat` (F32 operands), `mul_mat_t` and `out_prod` hands its jobs to
//! whichever thread is free (a static share, then claims), so which thread computes which
//! output block changes from run to run: every run, on 1, 2 and 3 threads, gives the same
//! bits, for shapes with a few jobs and with many.

mod common;

use common::{Input, Rng};
use tinynn_core::graph::Graph;
use tinynn_format::GgmlType::F32;

#[test]
fn gemm_products_give_the_same_bits_on_every_run_and_thread_count() {
    let mut rng = Rng::new(17);
    // (k, n, m): a handful of jobs up to SmolLM2's FFN shapes (without AVX2 the row products,
    // split by rows, must agree too).
    for (k, n, m) in [
        (64, 40, 9),
        (96, 576, 70),
        (576, 1536, 160),
        (1536, 576, 70),
    ] {
        let (wv, xv, dyv) = (rng.vec(k * n), rng.vec(k * m), rng.vec(n * m));
        let mut g = Graph::new();
        let w = g.input("w", F32, &[k, n]).unwrap();
        let x = g.input("x", F32, &[k, m]).unwrap();
        let dy = g.input("dy", F32, &[n, m]).unwrap();
        let y = g.mul_mat(w, x).unwrap(); // [n, m]
        let dx = g.mul_mat_t(w, dy).unwrap(); // [k, m]
        let dw = g.out_prod(x, dy).unwrap(); // [k, n]
        let (wi, xi, dyi) = (
            || Input::F32(w, wv.clone()),
            || Input::F32(x, xv.clone()),
            || Input::F32(dy, dyv.clone()),
        );
        for (name, out, inputs) in [
            ("mul_mat", y, [wi(), xi()]),
            ("mul_mat_t", dx, [wi(), dyi()]),
            ("out_prod", dw, [xi(), dyi()]),
        ] {
            let one = common::run(&g, out, &inputs, &[], 1);
            assert!(one.iter().all(|v| v.is_finite()), "{name} {k}×{n}×{m}");
            for threads in [2, 3] {
                for run in 0..4 {
                    let got = common::run(&g, out, &inputs, &[], threads);
                    let differ = got
                        .iter()
                        .zip(&one)
                        .position(|(a, b)| a.to_bits() != b.to_bits());
                    assert_eq!(
                        differ, None,
                        "{name} {k}×{n}×{m}, {threads} threads, run {run}"
                    );
                }
            }
        }
    }
}
