//! Dropout (`Graph::dropout`): the SIMD run equals its scalar reference bit for bit; the op
//! drops about `p` of the elements, scales the rest by 1/(1−p), gives the same mask on any
//! thread count and a new one for another seed or site; its gradient (the same mask on dy)
//! passes the finite-difference check.

mod common;

use common::gradcheck::{assert_grads, Built, P};
use common::{run, Input, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::simd::dropout::{dropout_run, dropout_run_ref};
use tinynn_format::GgmlType;

#[test]
fn simd_dropout_matches_the_reference() {
    let mut rng = Rng::new(3);
    for p in [0.0f32, 0.05, 0.5, 0.9] {
        for (n, first) in [
            (1, 0u64),
            (7, 3),
            (8, 0),
            (37, 1 << 40),
            (1000, u64::MAX - 500),
        ] {
            let x = rng.vec(n);
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            let seed = rng.next_u64();
            dropout_run(&x, &mut a, seed, 9, first, p);
            dropout_run_ref(&x, &mut b, seed, 9, first, p);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "p {p} n {n} first {first}"
            );
        }
    }
}

fn dropped(seed: [i32; 2], salt: u32, threads: usize) -> Vec<f32> {
    let mut g = Graph::new();
    let x = g.input("x", GgmlType::F32, &[64, 50]).unwrap();
    let s = g.input("seed", GgmlType::I32, &[2]).unwrap();
    let y = g.dropout(x, s, 0.3, salt).unwrap();
    let ones = vec![1.0f32; 64 * 50];
    run(
        &g,
        y,
        &[Input::F32(x, ones), Input::I32(s, seed.to_vec())],
        &[],
        threads,
    )
}

#[test]
fn dropout_drops_p_of_the_elements_the_same_way_on_any_thread_count() {
    let a = dropped([5, -7], 1, 1);
    let keep = 1.0 / 0.7f32;
    assert!(a.iter().all(|&v| v == 0.0 || v == keep));
    let frac = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
    assert!((0.27..0.33).contains(&frac), "dropped {frac}");
    assert_eq!(a, dropped([5, -7], 1, 3));
    assert_ne!(a, dropped([6, -7], 1, 1), "another seed, another mask");
    assert_ne!(a, dropped([5, -7], 2, 1), "another site, another mask");
}

#[test]
fn dropout_gradient_passes_the_finite_difference_check() {
    let mut rng = Rng::new(21);
    let ps = [P::rand(&[16, 6], &mut rng)];
    let build = |g: &mut Graph, p: &[TensorId]| {
        let s = g.input("seed", GgmlType::I32, &[2]).unwrap();
        let y = g.dropout(p[0], s, 0.4, 3).unwrap();
        let y = g.mul(y, p[0]).unwrap(); // a non-linear loss around the op
        Built::with(g.sum(y).unwrap(), vec![Input::I32(s, vec![11, 12])])
    };
    assert_grads("dropout", &ps, &build);
}
