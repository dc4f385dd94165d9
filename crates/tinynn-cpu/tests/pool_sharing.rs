//! One process-wide pool serves every executor: equal or smaller requests get the same pool, a
//! larger one makes a new pool that later requests get, and two executors spawn no threads of
//! their own. This file holds one test, so no other test grows the pool meanwhile.

use std::sync::Arc;

use tinynn_core::graph::Graph;
use tinynn_core::plan::Plan;
use tinynn_cpu::pool::ThreadPool;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

/// Threads of this process whose name starts with `tinynn-` (the pools' workers), once there
/// are `want` of them or 5 s have passed: a new thread names itself, a joined one may linger in
/// /proc for a moment.
#[cfg(target_os = "linux")]
fn pool_workers(want: usize) -> usize {
    let count = || {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|name| name.starts_with("tinynn-"))
            .count()
    };
    let t0 = std::time::Instant::now();
    while count() != want && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    count()
}

fn run(exec: &mut Executor, plan: &Plan, x: tinynn_core::tensor::TensorId) -> Vec<f32> {
    let mut mem = Memory::new(plan);
    let xv: Vec<f32> = (0..64).map(|i| i as f32).collect();
    mem.write_f32(plan, x, &xv).unwrap();
    exec.run(plan, &mut mem).unwrap();
    exec.read_f32(plan, &mem, plan.graph().outputs()[0])
        .unwrap()
}

#[test]
fn one_pool_serves_every_executor() {
    let a = ThreadPool::global(3);
    assert_eq!(a.n_threads(), 3);
    for n in [0, 1, 2, 3] {
        assert!(Arc::ptr_eq(&a, &ThreadPool::global(n)), "{n} threads");
    }
    #[cfg(target_os = "linux")]
    assert_eq!(pool_workers(2), 2);

    // Two executors (two sessions) on the same pool: no new threads.
    let mut g = Graph::new();
    let x = g.input("x", GgmlType::F32, &[16, 4]).unwrap();
    let y = g.add(x, x).unwrap();
    let y = g.mul(y, y).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut e1 = Executor::new(&plan, 2);
    let mut e2 = Executor::new(&plan, 3);
    assert_eq!((e1.n_threads(), e2.n_threads()), (2, 3));
    let want: Vec<f32> = (0..64).map(|i| (2.0 * i as f32).powi(2)).collect();
    assert_eq!(run(&mut e1, &plan, x), want);
    assert_eq!(run(&mut e2, &plan, x), want);
    #[cfg(target_os = "linux")]
    assert_eq!(pool_workers(2), 2);

    // Asking for more makes a larger pool that later requests get; the old one stays usable.
    let big = ThreadPool::global(4);
    assert_eq!(big.n_threads(), 4);
    assert!(!Arc::ptr_eq(&a, &big));
    assert!(Arc::ptr_eq(&big, &ThreadPool::global(2)));
    let mut e3 = Executor::new(&plan, 4);
    assert_eq!(run(&mut e3, &plan, x), want);
    assert_eq!(run(&mut e1, &plan, x), want);
    #[cfg(target_os = "linux")]
    assert_eq!(pool_workers(2 + 3), 2 + 3);

    // The old pool goes away with its last holders.
    drop((a, e1, e2));
    #[cfg(target_os = "linux")]
    assert_eq!(pool_workers(3), 3);
}
