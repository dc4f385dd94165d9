//! The products' work shares (`kernels::shares`) across runs: a run that ends in a panic leaves
//! its group's shares taken, and the next run must start from none taken.

use tinynn_core::graph::Graph;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use super::{ExecOptions, Executor};
use crate::Memory;

/// `y1 = w·(x + x)` and `y2 = w·(x + x)`: two products of one activation in one group (they
/// run as one list of 16-row groups), the second step named `fault` when given.
fn plan(fault: Option<&str>) -> (Plan, [TensorId; 4]) {
    let mut g = Graph::new();
    let x = g.input("x", GgmlType::F32, &[64, 3]).unwrap();
    let w = g.weight("w", GgmlType::Q8_0, &[64, 80]).unwrap();
    let c = g.add(x, x).unwrap();
    let y1 = g.mul_mat(w, c).unwrap();
    let y2 = g.mul_mat(w, c).unwrap();
    if let Some(name) = fault {
        g.set_name(y2, name).unwrap();
    }
    g.set_output(y1).unwrap();
    g.set_output(y2).unwrap();
    (crate::compile(g), [x, w, y1, y2])
}

fn run(exec: &mut Executor, fault: Option<&str>, seed: usize) -> Option<Vec<f32>> {
    let (plan, [x, w, y1, y2]) = plan(fault);
    let wv: Vec<f32> = (0..64 * 80).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect();
    let mut wb = vec![0u8; tinynn_core::quant::row_bytes(GgmlType::Q8_0, wv.len()).unwrap()];
    tinynn_core::quant::quantize_row(GgmlType::Q8_0, &wv, &mut wb).unwrap();
    let mut mem = Memory::new(&plan);
    mem.bind_weight(&plan, w, &wb).unwrap();
    // The packed copy: its products hand out their 16-row groups as shares.
    let copy = crate::packed::pack(GgmlType::Q8_0, [64, 80, 1, 1], &wb).unwrap();
    mem.bind_packed(&plan, w, std::sync::Arc::new(copy))
        .unwrap();
    let xv: Vec<f32> = (0..64 * 3)
        .map(|i| (((i + seed) % 5) as f32 - 2.0) / 4.0)
        .collect();
    mem.write_f32(&plan, x, &xv).unwrap();
    exec.run(&plan, &mut mem).ok()?;
    let mut out = exec.read_f32(&plan, &mem, y1).unwrap();
    out.extend(exec.read_f32(&plan, &mem, y2).unwrap());
    Some(out)
}

#[test]
fn a_run_after_a_panic_mid_group_computes_every_product_in_full() {
    if !crate::simd::required_by_test("packed products", crate::packed::available()) {
        return;
    }
    for threads in [2, 3] {
        let want = run(&mut Executor::new(&plan(None).0, 1), None, 1).unwrap();
        for culprit in 0..threads {
            let mut exec = Executor::with_options(
                &plan(None).0,
                ExecOptions {
                    threads,
                    ..ExecOptions::default()
                },
            );
            // The products take every share, then a thread panics in the same group.
            assert!(run(&mut exec, Some(&format!("panic@{culprit}")), 0).is_none());
            // New inputs: a product that skipped its shares would leave the last run's values.
            let got = run(&mut exec, None, 1).unwrap();
            assert_eq!(got, want, "{threads} threads, thread {culprit} panicked");
        }
    }
}
