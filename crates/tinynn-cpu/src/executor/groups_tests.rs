//! Step groups: where the barriers go, and that a run with groups gives the bits of a run
//! with a barrier after every step.

use tinynn_core::graph::Graph;
use tinynn_core::ops::{Rope, RopeMode};
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use super::{sync_after, Fetch, Schedule};
use crate::{Executor, Memory};

const F32: GgmlType = GgmlType::F32;

/// The plan's steps as groups of op names (`|` where a barrier is).
fn groups(plan: &Plan) -> String {
    named_groups(plan, &sync_after(plan))
}

/// The groups a run meets: [`groups`] with the gated units taken into their products.
fn scheduled(plan: &Plan) -> String {
    named_groups(plan, &Schedule::of(plan).sync)
}

fn named_groups(plan: &Plan, sync: &[bool]) -> String {
    let g = plan.graph();
    let mut out = String::new();
    for (step, &barrier) in plan.steps().iter().zip(sync) {
        out.push_str(g.node(step.node).op.name());
        out.push_str(if barrier { " | " } else { " " });
    }
    out.trim_end().to_string()
}

struct Layer {
    plan: Plan,
    ids: TensorId,
    pos: TensorId,
    weights: Vec<(TensorId, Vec<u8>)>,
    out: TensorId,
    caches: [TensorId; 2],
}

/// One Llama-shaped block over `t` tokens (no attention: the cache writes stand in for it),
/// with Q8_0 products and an F32 KV cache of 16 rows; SwiGLU, or GeGLU with `geglu`.
fn layer(t: usize) -> Layer {
    layer_with(t, false)
}

fn layer_with(t: usize, geglu: bool) -> Layer {
    let (d, hd, ff) = (64, 16, 96);
    let mut state = 7u64;
    let mut rng = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let mut g = Graph::new();
    let ids = g.input("ids", GgmlType::I32, &[t]).unwrap();
    let pos = g.input("pos", GgmlType::I32, &[t]).unwrap();
    let mut weights = Vec::new();
    let mut weight = |g: &mut Graph, name: &str, ty: GgmlType, ne: &[usize]| {
        let w = g.weight(name, ty, ne).unwrap();
        let n: usize = ne.iter().product();
        let values: Vec<f32> = (0..n).map(|_| rng() * 0.5).collect();
        let mut bytes = vec![0u8; tinynn_core::quant::row_bytes(ty, n).unwrap()];
        tinynn_core::quant::quantize_row(ty, &values, &mut bytes).unwrap();
        weights.push((w, bytes));
        w
    };
    let emb = weight(&mut g, "emb", F32, &[d, 10]);
    let [n1, n2] = ["n1", "n2"].map(|n| weight(&mut g, n, F32, &[d]));
    let [wq, wk, wv, wo] =
        ["wq", "wk", "wv", "wo"].map(|n| weight(&mut g, n, GgmlType::Q8_0, &[d, d]));
    let [wg, wu] = ["wg", "wu"].map(|n| weight(&mut g, n, GgmlType::Q8_0, &[d, ff]));
    let wd = weight(&mut g, "wd", GgmlType::Q8_0, &[ff, d]);
    let caches = ["kc", "vc"].map(|n| g.persistent(n, F32, &[d, 16]).unwrap());
    let rope = Rope::new(RopeMode::Neox, hd, 10000.0);
    let x = g.get_rows(emb, ids).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let h = g.mul(h, n1).unwrap();
    let [q, k, v] = [wq, wk, wv].map(|w| g.mul_mat(w, h).unwrap());
    let [q, k] = [q, k].map(|p| {
        let p = g.reshape(p, &[hd, d / hd, t]).unwrap();
        let p = g.rope(p, pos, rope).unwrap();
        g.reshape(p, &[d, t]).unwrap()
    });
    let kc = g.set_rows(caches[0], k, pos).unwrap();
    let vc = g.set_rows(caches[1], v, pos).unwrap();
    let att = g.add(q, v).unwrap();
    let o = g.mul_mat(wo, att).unwrap();
    let r = g.add(x, o).unwrap();
    let h = g.rms_norm(r, 1e-5).unwrap();
    let h = g.mul(h, n2).unwrap();
    let [gate, up] = [wg, wu].map(|w| g.mul_mat(w, h).unwrap());
    let s = if geglu {
        g.geglu(gate, up).unwrap()
    } else {
        g.swiglu(gate, up).unwrap()
    };
    let down = g.mul_mat(wd, s).unwrap();
    let out = g.add(r, down).unwrap();
    let out = g.rms_norm(out, 1e-5).unwrap();
    let out = g.scale(out, 0.5).unwrap();
    g.set_output(out).unwrap();
    g.set_output(kc).unwrap();
    g.set_output(vc).unwrap();
    Layer {
        plan: crate::compile(g),
        ids,
        pos,
        weights,
        out,
        caches,
    }
}

#[test]
fn a_decode_block_meets_at_a_barrier_only_where_data_crosses_threads() {
    let l = layer(1);
    assert_eq!(
        groups(&l.plan),
        "get_rows | rms_norm mul | mul_mat mul_mat mul_mat | rope rope | set_rows set_rows add | \
         mul_mat | add rms_norm mul | mul_mat mul_mat | swiglu | mul_mat | add rms_norm | scale |"
    );
}

/// The gated unit after the gate and up products is their epilogue: no barrier between, and
/// the schedule marks the run (at any token count: rows past the fused path's run alone,
/// with the barrier back).
#[test]
fn the_gated_unit_joins_its_gate_and_up_products() {
    for (t, geglu) in [(1, false), (9, false), (1, true)] {
        let l = layer_with(t, geglu);
        let unit = if geglu { "geglu" } else { "swiglu" };
        assert_eq!(
            scheduled(&l.plan),
            format!(
                "get_rows | rms_norm mul | mul_mat mul_mat mul_mat | rope rope | set_rows set_rows \
                 add | mul_mat | add rms_norm mul | mul_mat mul_mat {unit} | mul_mat | add rms_norm \
                 | scale |"
            )
        );
        let schedule = Schedule::of(&l.plan);
        let g = l.plan.graph();
        let marked: Vec<&str> = l
            .plan
            .steps()
            .iter()
            .zip(&schedule.glu)
            .filter(|(_, &m)| m)
            .map(|(s, _)| g.node(g.node(s.node).src[0]).name.as_str())
            .collect();
        assert_eq!(marked, vec!["wg"]);
    }
}

/// Where the unit's output would take bytes the products still read (the activation, freed
/// at once when large), it keeps its barrier; in place over the gate's output it joins.
#[test]
fn a_gated_unit_writing_bytes_its_products_read_keeps_its_barrier() {
    for keep_products in [true, false] {
        let mut g = Graph::new();
        let x = g.input("x", F32, &[4096, 8]).unwrap();
        let [wg, wu] = ["wg", "wu"].map(|n| g.weight(n, GgmlType::Q8_0, &[4096, 4096]).unwrap());
        let h = g.rms_norm(x, 1e-5).unwrap();
        let [gate, up] = [wg, wu].map(|w| g.mul_mat(w, h).unwrap());
        let s = g.swiglu(gate, up).unwrap();
        g.set_output(s).unwrap();
        if keep_products {
            // Outputs are never reused: the unit's output needs new bytes, and h's are free.
            g.set_output(gate).unwrap();
            g.set_output(up).unwrap();
        }
        let plan = crate::compile(g);
        let schedule = Schedule::of(&plan);
        if keep_products {
            assert_eq!(
                plan.location(s),
                plan.location(h),
                "the test needs the reuse"
            );
            assert_eq!(scheduled(&plan), "rms_norm | mul_mat mul_mat | swiglu |");
            assert!(schedule.glu.iter().all(|&m| !m));
        } else {
            assert_eq!(
                plan.location(s),
                plan.location(gate),
                "the test needs it in place"
            );
            assert_eq!(scheduled(&plan), "rms_norm | mul_mat mul_mat swiglu |");
            assert_eq!(schedule.glu, vec![false, true, false, false]);
        }
    }
}

/// q, k and v of one normalized row run as one product, and so do gate and up; the o and down
/// products (alone in their groups) and products of different activations do not.
#[test]
fn products_of_one_activation_in_a_group_run_as_one() {
    let l = layer(1);
    let runs = super::super::fused::fused_runs(&l.plan, &sync_after(&l.plan));
    let g = l.plan.graph();
    let named: Vec<(&str, usize)> = l
        .plan
        .steps()
        .iter()
        .zip(&runs)
        .filter(|(_, &n)| n > 0)
        .map(|(s, &n)| (g.node(g.node(s.node).src[0]).name.as_str(), n))
        .collect();
    assert_eq!(named, vec![("wq", 3), ("wg", 2)]);
    // With a barrier after every step nothing is fused.
    let every = vec![true; l.plan.steps().len()];
    assert!(super::super::fused::fused_runs(&l.plan, &every)
        .iter()
        .all(|&n| n == 0));
    // Two products of different activations in one group are not a run.
    let mut g = Graph::new();
    let [a, b] = ["a", "b"].map(|n| g.input(n, F32, &[64, 1]).unwrap());
    let [wa, wb] = ["wa", "wb"].map(|n| g.weight(n, GgmlType::Q8_0, &[64, 32]).unwrap());
    let pa = g.mul_mat(wa, a).unwrap();
    let pb = g.mul_mat(wb, b).unwrap();
    let s = g.add(pa, pb).unwrap();
    g.set_output(s).unwrap();
    let plan = crate::compile(g);
    let sync = sync_after(&plan);
    assert!(!sync[0], "the two products share a group");
    assert!(super::super::fused::fused_runs(&plan, &sync)
        .iter()
        .all(|&n| n == 0));
}

/// The norm scales are asked for one group before the row-wise steps that read them.
#[test]
fn small_weights_are_fetched_one_group_ahead() {
    let l = layer(1);
    let schedule = Schedule::of(&l.plan);
    let g = l.plan.graph();
    let slot = |name: &str| {
        let w = l
            .plan
            .weights()
            .iter()
            .position(|&w| g.node(w).name == name)
            .unwrap();
        Fetch {
            slot: w,
            offset: l.plan.location(l.plan.weights()[w]).unwrap().offset,
            bytes: 64 * 4,
        }
    };
    let fetched_at: Vec<(String, Vec<Fetch>)> = l
        .plan
        .steps()
        .iter()
        .zip(&schedule.ahead)
        .filter(|(_, a)| !a.is_empty())
        .map(|(s, a)| (g.node(s.node).op.name().to_string(), a.clone()))
        .collect();
    // get_rows starts the group before [rms_norm mul] (n1); the o product's group comes
    // before [add rms_norm mul] (n2). The products' Q8_0 weights are not fetched.
    assert_eq!(
        fetched_at,
        vec![
            ("get_rows".to_string(), vec![slot("n1")]),
            ("mul_mat".to_string(), vec![slot("n2")]),
        ]
    );
}

/// Every thread count, groups on and off, several runs each: the same output and caches;
/// with the file's bytes and with packed copies (whose grouped products run fused).
#[test]
fn runs_in_groups_give_the_bits_of_runs_with_every_barrier() {
    // 1 and 5 tokens: the gate and up products run fused with the gated unit as their
    // epilogue (packed); 9: each alone, then the barrier the schedule took out.
    let cases = [(1, false), (5, false), (1, true), (5, true), (9, true)];
    for ((t, packed), geglu) in cases.into_iter().flat_map(|c| [(c, false), (c, true)]) {
        if packed && !crate::simd::required_by_test("packed products", crate::packed::available()) {
            continue;
        }
        let l = layer_with(t, geglu);
        let mut want: Option<Vec<Vec<f32>>> = None;
        for threads in [1, 2, 3] {
            for grouped in [false, true] {
                let mut mem = Memory::new(&l.plan);
                for (w, bytes) in &l.weights {
                    mem.bind_weight(&l.plan, *w, bytes).unwrap();
                    let layout = l.plan.graph().layout(*w);
                    if !packed || layout.dtype != GgmlType::Q8_0 {
                        continue;
                    }
                    let copy = crate::packed::pack(layout.dtype, layout.ne, bytes).unwrap();
                    mem.bind_packed(&l.plan, *w, std::sync::Arc::new(copy))
                        .unwrap();
                }
                let ids: Vec<i32> = (0..t as i32).map(|i| (i * 3) % 10).collect();
                let pos: Vec<i32> = (0..t as i32).map(|i| 2 + i).collect();
                mem.write_i32(&l.plan, l.ids, &ids).unwrap();
                mem.write_i32(&l.plan, l.pos, &pos).unwrap();
                let mut exec = Executor::new(&l.plan, threads);
                exec.set_step_groups(grouped);
                for _ in 0..20 {
                    exec.run(&l.plan, &mut mem).unwrap();
                }
                let got: Vec<Vec<f32>> = [l.out, l.caches[0], l.caches[1]]
                    .iter()
                    .map(|&x| exec.read_f32(&l.plan, &mem, x).unwrap())
                    .collect();
                assert!(got[0].iter().all(|v| v.is_finite() && *v != 0.0));
                match &want {
                    None => want = Some(got),
                    Some(w) => {
                        for (a, b) in w.iter().zip(&got) {
                            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(
                                same,
                                "{t} tokens, {threads} threads, groups {grouped}, packed {packed}, \
                                 geglu {geglu}"
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn a_row_wise_step_reading_other_rows_waits() {
    let mut g = Graph::new();
    let x = g.input("x", F32, &[8, 4]).unwrap();
    let x1 = g.input("x1", F32, &[8, 1]).unwrap();
    let w = g.weight("w", F32, &[16]).unwrap();
    // A broadcast row: every output row reads the one row another thread may have written.
    let n = g.rms_norm(x1, 1e-5).unwrap();
    let b = g.add(x, n).unwrap();
    // Rows regrouped by a reshape: row r of the view is not row r of what was written.
    let m = g.rms_norm(b, 1e-5).unwrap();
    let v = g.reshape(m, &[16, 2]).unwrap();
    let y = g.mul(v, w).unwrap();
    // The same rows: no barrier.
    let z = g.scale(y, 2.0).unwrap();
    let z = g.rms_norm(z, 1e-5).unwrap();
    g.set_output(z).unwrap();
    let plan = crate::compile(g);
    assert_eq!(
        groups(&plan),
        "rms_norm | add rms_norm | mul | scale | rms_norm |"
    );
}

#[test]
fn a_step_writing_bytes_another_step_of_its_group_reads_waits() {
    // Large buffers are reused at once: the scale's output takes the bytes the product reads.
    let mut g = Graph::new();
    let x = g.input("x", F32, &[4096, 8]).unwrap();
    let x2 = g.input("x2", F32, &[4096, 8]).unwrap();
    let w = g.weight("w", F32, &[4096, 4]).unwrap();
    let h = g.rms_norm(x, 1e-5).unwrap();
    let p = g.mul_mat(w, h).unwrap();
    let s = g.scale(x2, 3.0).unwrap();
    g.set_output(p).unwrap();
    g.set_output(s).unwrap();
    let plan = crate::compile(g);
    assert_eq!(
        plan.location(s),
        plan.location(h),
        "the test needs the reuse"
    );
    assert_eq!(groups(&plan), "rms_norm | mul_mat | scale |");
}

#[test]
fn other_ops_stand_alone_and_groups_stay_short() {
    let mut g = Graph::new();
    let mut outs = Vec::new();
    for i in 0..11 {
        let x = g.input(&format!("x{i}"), F32, &[8, 2]).unwrap();
        outs.push(if i == 9 {
            g.soft_max(x, None, 1.0).unwrap()
        } else {
            g.scale(x, 2.0).unwrap()
        });
    }
    for o in outs {
        g.set_output(o).unwrap();
    }
    let plan = crate::compile(g);
    let expected = "scale scale scale scale scale scale scale scale | scale | soft_max | scale |";
    assert_eq!(groups(&plan), expected);
}
