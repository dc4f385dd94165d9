//! The planner and executor as a whole: buffer sharing and in-place reuse, and clear errors.

mod common;

use common::f32_bytes;
use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_cpu::{ExecError, Executor, Memory};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;

#[test]
fn chains_share_the_arena_and_run_in_place() {
    let n = 1000;
    let mut g = Graph::new();
    let x = g.input("x", F32, &[n]).unwrap();
    let y = g.input("y", F32, &[n]).unwrap();
    let mut h = g.scale(x, 1.0).unwrap();
    for _ in 0..20 {
        let s = g.scale(h, 0.5).unwrap();
        h = g.add(s, y).unwrap();
    }
    g.set_output(h).unwrap();
    let plan = tinynn_cpu::compile(g);
    plan.verify().unwrap();
    // 41 buffers of 4000 bytes would need 41 x 4032; in place they all fit in one.
    assert_eq!(plan.sum_of_buffers(), 4032, "{}", plan.layout_report());
    assert_eq!(plan.arena_bytes(), 4032);
    let report = plan.layout_report();
    assert!(report.contains("arena: 4032 bytes"), "{report}");

    let mut mem = Memory::new(&plan);
    let xv: Vec<f32> = (0..n).map(|i| i as f32).collect();
    mem.write_f32(&plan, x, &xv).unwrap();
    mem.write_f32(&plan, y, &vec![1.0; n]).unwrap();
    let mut exec = Executor::new(&plan, 2);
    exec.run(&plan, &mut mem).unwrap();
    let out = exec.read_f32(&plan, &mem, h).unwrap();
    // h ← h/2 + 1, twenty times: h = x / 2^20 + 2 (1 − 2^-20).
    for (i, v) in out.iter().enumerate() {
        let want = i as f64 / 1048576.0 + 2.0 * (1.0 - 1.0 / 1048576.0);
        assert!((f64::from(*v) - want).abs() < 1e-5, "{i}: {v} vs {want}");
    }
}

/// The peak report names the step where the most arena bytes are live and what they are.
#[test]
fn peak_report_shows_what_is_live_at_the_peak() {
    let mut g = Graph::new();
    let x = g.input("x", F32, &[1000]).unwrap();
    let a = g.scale(x, 2.0).unwrap(); // 4000 bytes, live until the mul
    let b = g.silu(x).unwrap(); // 4000 more, live until the mul
    let c = g.mul(a, b).unwrap(); // in place of a: no new bytes
    let d = g.sum(c).unwrap();
    g.set_output(d).unwrap();
    let plan = tinynn_cpu::compile(g);
    let report = plan.peak_report();
    assert!(
        report.starts_with("peak: 8000 live bytes at step 2 (mul#"),
        "{report}"
    );
    assert!(report.contains("4000      1 x silu"), "{report}");
    assert!(report.contains("4000      1 x scale"), "{report}");
}

#[test]
fn buffers_with_overlapping_lives_never_share_bytes() {
    // A diamond: both branches live at once, so they must not overlap.
    let mut g = Graph::new();
    let x = g.input("x", F32, &[256, 4]).unwrap();
    let a = g.silu(x).unwrap();
    let b = g.scale(x, 2.0).unwrap();
    let c = g.mul(a, b).unwrap();
    let d = g.rms_norm(c, 1e-6).unwrap();
    g.set_output(d).unwrap();
    let plan = tinynn_cpu::compile(g);
    plan.verify().unwrap();
    assert!(plan.arena_bytes() <= plan.sum_of_buffers());
    let (pa, pb) = (
        plan.location(a).unwrap().offset,
        plan.location(b).unwrap().offset,
    );
    assert_ne!(pa, pb, "{}", plan.layout_report());
}

#[test]
fn run_time_errors_are_reported() {
    let mut g = Graph::new();
    let table = g.weight("table", F32, &[4, 3]).unwrap();
    let ids = g.input("ids", GgmlType::I32, &[2]).unwrap();
    let rows = g.get_rows(table, ids).unwrap();
    g.set_output(rows).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    let mut exec = Executor::new(&plan, 2);
    assert_eq!(
        exec.run(&plan, &mut mem).unwrap_err().to_string(),
        "weight 'table' is not bound"
    );
    let bytes = f32_bytes(&[0.0; 12]);
    assert!(
        mem.bind_weight(&plan, table, &bytes[..44]).is_err(),
        "short weight accepted"
    );
    mem.bind_weight(&plan, table, &bytes).unwrap();
    mem.write_i32(&plan, ids, &[1, 3]).unwrap();
    assert_eq!(
        exec.run(&plan, &mut mem),
        Err(ExecError::IndexOutOfRange(3))
    );
    mem.write_i32(&plan, ids, &[1, 2]).unwrap();
    exec.run(&plan, &mut mem).unwrap();
    assert!(
        mem.write_f32(&plan, ids, &[1.0]).is_err(),
        "f32 written into an I32 input"
    );
}

#[test]
fn builder_rejects_bad_shapes_with_errors() {
    let mut g = Graph::new();
    let w = g.weight("w", GgmlType::Q4_0, &[64, 8]).unwrap();
    let x = g.input("x", F32, &[32, 2]).unwrap();
    let pos = g.input("pos", F32, &[2]).unwrap();
    let checks: Vec<(String, &str)> = vec![
        (
            g.mul_mat(w, x).unwrap_err().to_string(),
            "inner dimensions differ",
        ),
        (
            g.weight("odd", GgmlType::Q4_0, &[33])
                .unwrap_err()
                .to_string(),
            "not supported",
        ),
        (
            g.view(x, &[32, 3], &[128], 0).unwrap_err().to_string(),
            "overruns",
        ),
        (
            g.reshape(x, &[63]).unwrap_err().to_string(),
            "cannot become",
        ),
        (
            g.permute(w, [1, 0, 2, 3]).unwrap_err().to_string(),
            "row dimension",
        ),
        (g.add(x, w).unwrap_err().to_string(), "expected F32"),
        (
            g.cpy(x, w).unwrap_err().to_string(),
            "element counts differ",
        ),
        (
            g.input("z", F32, &[0]).unwrap_err().to_string(),
            "zero dimension",
        ),
    ];
    let rope = Rope::new(RopeMode::Normal, 32, 1e4);
    let x3 = g.input("x3", F32, &[32, 1, 2]).unwrap();
    let rope_err = g.rope(x3, pos, rope).unwrap_err().to_string();
    for (msg, needle) in checks
        .iter()
        .map(|(m, n)| (m.as_str(), *n))
        .chain([(rope_err.as_str(), "I32")])
    {
        assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
    }
    let w2 = g.weight("w2", F32, &[32, 2]).unwrap();
    assert!(g.cpy(x, w2).unwrap_err().to_string().contains("weight"));
}

/// A model-side function that knows only the `Backend` trait.
fn scaled_sum<B: tinynn_core::backend::Backend>(backend: &mut B, values: &[f32]) -> f32 {
    let mut g = Graph::new();
    let x = g.input("x", F32, &[values.len()]).unwrap();
    let y = g.scale(x, 2.0).unwrap();
    let s = g.sum(y).unwrap();
    g.set_output(s).unwrap();
    let plan = backend.compile(g);
    let mut mem = backend.new_memory(&plan, &[]).unwrap();
    backend
        .write(&mut mem, &plan, x, 0, &f32_bytes(values))
        .unwrap();
    // A write past the tensor's end is an error, not a partial write.
    assert!(backend
        .write(&mut mem, &plan, x, 4, &f32_bytes(values))
        .is_err());
    backend.run(&plan, &mut mem).unwrap();
    let mut out = Vec::new();
    backend.read_f32(&plan, &mem, s, &mut out).unwrap();
    out[0]
}

#[test]
fn models_can_drive_the_cpu_through_the_backend_trait() {
    let mut g = Graph::new();
    let x = g.input("x", F32, &[4]).unwrap();
    g.set_output(x).unwrap();
    let mut exec = Executor::cpu(tinynn_cpu::ExecOptions {
        threads: 2,
        ..Default::default()
    });
    assert_eq!(tinynn_core::backend::Backend::name(&exec), "cpu");
    assert_eq!(scaled_sum(&mut exec, &[1.0, 2.0, 3.0, 4.5]), 21.0);
}

/// Memory the system refuses (here 2^52 bytes, past the user address space) is an error from
/// the memory, the backend and the run — never a heap fallback that aborts the process.
#[test]
fn refused_memory_is_an_error_not_an_abort() {
    use tinynn_cpu::{Backend, MemoryError};
    let huge = [1usize << 25, 1 << 25];
    let mut g = Graph::new();
    let p = g.persistent("huge", GgmlType::F32, &huge).unwrap();
    let y = g.scale(p, 2.0).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let err = Memory::try_new_sharing(&plan, &[]).map(|_| ()).unwrap_err();
    assert_eq!(err, MemoryError::OutOfMemory { bytes: 1 << 52 });
    assert!(err
        .to_string()
        .contains("cannot allocate 4503599627370496 bytes"));
    let backend = Executor::cpu(tinynn_cpu::ExecOptions::default());
    let e = backend.new_memory(&plan, &[]).map(|_| ()).unwrap_err();
    assert!(
        matches!(e, ExecError::Memory(MemoryError::OutOfMemory { .. })),
        "{e}"
    );
    // An arena too large (a [2^25, 2^25] product of two small inputs, summed): the executor
    // is made, the run says why it cannot go.
    let mut g = Graph::new();
    let a = g.input("a", GgmlType::F32, &[32, 1 << 25]).unwrap();
    let b = g.input("b", GgmlType::F32, &[32, 1 << 25]).unwrap();
    let z = g.mul_mat(a, b).unwrap();
    let y = g.sum(z).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut exec = Executor::with_options(&plan, tinynn_cpu::ExecOptions::default());
    let mut mem = Memory::new(&plan);
    let e = exec.run(&plan, &mut mem).unwrap_err();
    assert!(
        matches!(e, ExecError::Memory(MemoryError::OutOfMemory { .. })),
        "{e}"
    );
}

/// A small dead buffer's bytes wait `REUSE_DELAY_STEPS` steps (so neighbouring steps write
/// disjoint bytes and may share a barrier); a large one's are taken at once.
#[test]
fn small_buffers_wait_before_their_bytes_are_reused_and_large_ones_do_not() {
    use tinynn_core::plan::{REUSE_DELAY_MAX_BYTES, REUSE_DELAY_STEPS};
    for (n, reused_at_once) in [(100, false), (REUSE_DELAY_MAX_BYTES / 4 + 16, true)] {
        let mut g = Graph::new();
        let x = g.input("x", F32, &[n]).unwrap();
        let y = g.input("y", F32, &[n]).unwrap();
        let a = g.scale(x, 2.0).unwrap();
        // `a` dies here, and the concat cannot take its bytes (twice the size).
        let b = g.concat(a, a, 0).unwrap();
        let mut c = g.scale(y, 3.0).unwrap();
        g.set_output(b).unwrap();
        let mut outs = vec![c];
        for _ in 0..REUSE_DELAY_STEPS + 2 {
            c = g.scale(y, 0.5).unwrap();
            outs.push(c);
        }
        for &o in &outs {
            g.set_output(o).unwrap();
        }
        let plan = tinynn_cpu::compile(g);
        plan.verify().unwrap();
        let at = |t| plan.location(t).unwrap().offset;
        // The step right after `a` died takes its bytes only when `a` is large.
        assert_eq!(at(outs[0]) == at(a), reused_at_once, "n {n}");
        // Small or large, no buffer overlaps a live one, and a small one's bytes are taken
        // again no sooner than the delay allows.
        for p in plan.buffers() {
            for q in plan.buffers() {
                let overlap = p.offset < q.offset + q.bytes && q.offset < p.offset + p.bytes;
                if overlap && q.first > p.last && p.bytes <= REUSE_DELAY_MAX_BYTES {
                    assert!(
                        q.first > p.last + REUSE_DELAY_STEPS,
                        "{}",
                        plan.layout_report()
                    );
                }
            }
        }
    }
}
