//! Packed weights (16 interleaved rows for the VNNI kernels; Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! Q4_K, Q6_K, F16, BF16, F32): the packed layout's scalar
//! reference equals the file format's reference dot product, the SIMD kernel equals the packed
//! reference, and a graph's matrix product gives the same numbers with and without a packed
//! copy bound, on 1, 2 and 3 threads.

use std::sync::Arc;

use tinynn_core::graph::Graph;
use tinynn_core::quant;
use tinynn_cpu::packed::{self, PackedWeight, ACT_BLOCK_BYTES};
use tinynn_cpu::simd::required_by_test;
use tinynn_cpu::{Executor, Memory};
use tinynn_format::GgmlType;

const FORMATS: [GgmlType; 10] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::F32,
];

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn quantized(ty: GgmlType, k: usize, n: usize, seed: u64) -> Vec<u8> {
    quantize_rows(ty, &noise(k * n, seed), k)
}

/// Rows of `k` values of `x` in format `ty`.
fn quantize_rows(ty: GgmlType, x: &[f32], k: usize) -> Vec<u8> {
    let rb = quant::row_bytes(ty, k).unwrap();
    let mut out = vec![0u8; rb * (x.len() / k)];
    for (src, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(rb)) {
        quant::quantize_row(ty, src, dst).unwrap();
    }
    out
}

/// Rows of `k` values of `x` as `p`'s kernels take them.
fn prepared(p: &PackedWeight, x: &[f32], k: usize) -> Vec<u8> {
    let arb = p.activation_row_bytes();
    let mut acts = vec![0u8; arb * (x.len() / k)];
    for (xr, ar) in x.chunks_exact(k).zip(acts.chunks_exact_mut(arb)) {
        p.prepare_activations(xr, ar);
    }
    acts
}

/// `[m][n]`: the format's reference dot of every weight row of `w` (`n` rows of `k`) with
/// every prepared activation row of `acts` (`arb` bytes each).
fn reference_product(
    ty: GgmlType,
    k: usize,
    n: usize,
    w: &[u8],
    acts: &[u8],
    arb: usize,
) -> Vec<f32> {
    let rb = quant::row_bytes(ty, k).unwrap();
    let m = acts.len() / arb;
    let mut want = vec![0f32; m * n];
    for t in 0..m {
        for r in 0..n {
            want[t * n + r] = reference_dot(ty, k, &w[r * rb..][..rb], &acts[t * arb..][..arb]);
        }
    }
    want
}

/// The file format's own reference dot of weight row `row` with packed activation row `act`.
fn reference_dot(ty: GgmlType, k: usize, row: &[u8], act: &[u8]) -> f32 {
    match ty {
        // Q4_1's and Q5_1's dot type is Q8_1, BF16's is BF16: the packed activations are
        // exactly that.
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Bf16 => {
            quant::vec_dot(ty, k, row, act).unwrap()
        }
        // Q8_0's (Q4_0's, Q5_0's) dot type is Q8_0: the same scale and quants without the
        // 16-bit slot.
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 => {
            let q8_0: Vec<u8> = act
                .chunks_exact(ACT_BLOCK_BYTES)
                .flat_map(|b| b[..2].iter().chain(&b[4..]).copied())
                .collect();
            quant::vec_dot(ty, k, row, &q8_0).unwrap()
        }
        // F16's dot type is F16: the packed activations are f32s that are exact f16s.
        GgmlType::F16 => {
            let f16: Vec<u8> = act
                .chunks_exact(4)
                .flat_map(|b| {
                    let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                    let h = half::f16::from_f32(v);
                    assert_eq!(h.to_f32(), v, "activation not rounded to f16");
                    h.to_le_bytes()
                })
                .collect();
            quant::vec_dot(ty, k, row, &f16).unwrap()
        }
        // F32's dot type is F32: the packed activations are the values themselves; the K
        // kinds' is Q8_K, which their packed activations are.
        GgmlType::F32 | GgmlType::Q4K | GgmlType::Q6K => quant::vec_dot(ty, k, row, act).unwrap(),
        _ => unreachable!(),
    }
}

/// F16's and BF16's prepared activations are the values rounded to nearest even.
fn check_float_activations(ty: GgmlType, x: &[f32], acts: &[u8]) {
    let want: Vec<u8> = match ty {
        GgmlType::F16 => x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_f32().to_le_bytes())
            .collect(),
        GgmlType::Bf16 => x
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect(),
        GgmlType::F32 => x.iter().flat_map(|&v| v.to_le_bytes()).collect(),
        _ => return,
    };
    assert!(
        want == acts,
        "{ty}: activations not rounded to nearest even"
    );
}

fn close(a: f32, b: f32, scale: f32) -> bool {
    (a - b).abs() <= 1e-5 * scale.max(1.0) && a.is_finite() && b.is_finite()
}

#[test]
fn packed_reference_and_simd_match_the_format_reference() {
    for ty in FORMATS {
        let shapes: &[(usize, usize)] = match ty {
            GgmlType::Q4K | GgmlType::Q6K => {
                &[(256, 1), (512, 16), (768, 37), (256, 48), (1024, 33)]
            }
            _ => &[(32, 1), (96, 16), (576, 37), (160, 48), (64, 7), (320, 33)],
        };
        for &(k, n) in shapes {
            let w = quantized(ty, k, n, 7 + k as u64 + n as u64);
            let p = packed::pack_always(ty, [k, n, 1, 1], &w).unwrap();
            assert_eq!(p.shape(), [k, n]);
            for m in [1usize, 2, 3, 5, 8, 11, 13, 17, 30] {
                let x = noise(k * m, 99 + m as u64);
                let acts = prepared(&p, &x, k);
                check_float_activations(ty, &x, &acts);
                let want = reference_product(ty, k, n, &w, &acts, p.activation_row_bytes());
                let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                let mut got = vec![f32::NAN; m * n];
                p.matmul_ref(&acts, m, &mut got);
                for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        close(g, e, scale),
                        "{ty} ref k={k} n={n} m={m} [{i}]: {g} vs {e}"
                    );
                }
                if packed::packs(ty) {
                    let mut simd = vec![f32::NAN; m * n];
                    p.matmul(&acts, m, &mut simd);
                    for (i, (&g, &e)) in simd.iter().zip(&want).enumerate() {
                        assert!(
                            close(g, e, scale),
                            "{ty} simd k={k} n={n} m={m} [{i}]: {g} vs {e}"
                        );
                    }
                }
            }
        }
    }
}

/// A packed copy's rows read back as f32 (what the dequantizing gradient products take from it
/// once the file's bytes are dropped) equal the format's dequantizer on the file's rows, bit
/// for bit, for every format, in rows under and over 4 KiB; a row past the end or an output
/// of the wrong length is refused.
#[test]
fn dequantized_rows_of_the_packed_copy_equal_the_format_dequantizer() {
    for ty in FORMATS {
        let ks: &[usize] = match ty {
            GgmlType::Q4K | GgmlType::Q6K => &[256, 8192],
            _ => &[96, 4160],
        };
        for &k in ks {
            let n = 37;
            let w = quantized(ty, k, n, 3 + k as u64);
            let p = packed::pack_always(ty, [k, n, 1, 1], &w).unwrap();
            let rb = quant::row_bytes(ty, k).unwrap();
            let (mut want, mut got) = (vec![0f32; k], vec![f32::NAN; k]);
            for r in 0..n {
                quant::dequantize_row(ty, &w[r * rb..][..rb], &mut want).unwrap();
                assert!(p.dequantize_row(r, &mut got), "{ty} k={k} row {r}");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{ty} k={k} row {r}");
            }
            assert!(!p.dequantize_row(n, &mut got), "{ty}: row past the end");
            assert!(!p.dequantize_row(0, &mut got[1..]), "{ty}: short output");
        }
    }
}

#[test]
fn pack_refuses_what_it_cannot_pack() {
    let w = quantized(GgmlType::Q4_1, 64, 2, 1);
    assert!(packed::pack_always(GgmlType::Q4_1, [64, 2, 1, 1], &w[1..]).is_none());
    assert!(packed::pack_always(GgmlType::Q4_1, [64, 1, 2, 1], &w).is_none());
    assert!(packed::pack_always(GgmlType::Q4_0, [64, 2, 1, 1], &w[..71]).is_none());
    assert!(packed::pack_always(GgmlType::Q4K, [256, 2, 1, 1], &[0u8; 144]).is_none());
    assert!(packed::pack_always(GgmlType::Q6K, [256, 2, 1, 1], &[0u8; 419]).is_none());
    assert!(packed::pack_always(GgmlType::Q4K, [288, 1, 1, 1], &[0u8; 162]).is_none());
    assert!(packed::pack_always(GgmlType::Q2K, [256, 1, 1, 1], &[0u8; 84]).is_none());
}

/// One `w · x` through the executor, optionally with a packed copy of `w` bound.
fn run_graph(
    ty: GgmlType,
    w_bytes: &[u8],
    k: usize,
    n: usize,
    x: &[f32],
    packed: bool,
    threads: usize,
) -> Vec<f32> {
    run_graph_packing(ty, w_bytes, packed.then_some(w_bytes), k, n, x, threads)
}

/// One `w · x` through the executor, with a packed copy of `packed_bytes` bound if given.
fn run_graph_packing(
    ty: GgmlType,
    w_bytes: &[u8],
    packed_bytes: Option<&[u8]>,
    k: usize,
    n: usize,
    x: &[f32],
    threads: usize,
) -> Vec<f32> {
    let m = x.len() / k;
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n]).unwrap();
    let xi = g.input("x", GgmlType::F32, &[k, m]).unwrap();
    let y = g.mul_mat(w, xi).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.bind_weight(&plan, w, w_bytes).unwrap();
    if let Some(pb) = packed_bytes {
        let p: PackedWeight = packed::pack(ty, [k, n, 1, 1], pb).unwrap();
        mem.bind_packed(&plan, w, Arc::new(p)).unwrap();
    }
    mem.write_f32(&plan, xi, x).unwrap();
    let mut exec = Executor::new(&plan, threads);
    exec.run(&plan, &mut mem).unwrap();
    exec.read_f32(&plan, &mem, y).unwrap()
}

#[test]
fn executor_gives_the_same_product_with_a_packed_copy() {
    if !required_by_test("the packed AVX-512 VNNI kernels", packed::available()) {
        return;
    }
    for ty in FORMATS.into_iter().filter(|&t| packed::packs(t)) {
        let k = if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
            512
        } else {
            192
        };
        let n = 53;
        let w = quantized(ty, k, n, 3);
        for m in [1usize, 9, 24] {
            let x = noise(k * m, 5 + m as u64);
            let plain = run_graph(ty, &w, k, n, &x, false, 1);
            let scale = plain.iter().fold(0f32, |a, v| a.max(v.abs()));
            for threads in 1..=3 {
                let got = run_graph(ty, &w, k, n, &x, true, threads);
                for (i, (&g, &e)) in got.iter().zip(&plain).enumerate() {
                    assert!(
                        close(g, e, scale),
                        "{ty} m={m} t={threads} [{i}]: {g} vs {e}"
                    );
                }
            }
        }
    }
}

/// A packed copy of other weights changes the result: the packed path really runs (the
/// planner's work buffer is large enough for its activations).
#[test]
fn the_executor_uses_the_packed_copy() {
    if !required_by_test("the packed AVX-512 VNNI kernels", packed::available()) {
        return;
    }
    for ty in FORMATS.into_iter().filter(|&t| packed::packs(t)) {
        let (k, n, m) = (256, 40, 13);
        let (w1, w2) = (quantized(ty, k, n, 11), quantized(ty, k, n, 12));
        let x = noise(k * m, 13);
        let want = run_graph(ty, &w2, k, n, &x, false, 1);
        let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
        let got = run_graph_packing(ty, &w1, Some(&w2), k, n, &x, 2);
        for (i, (&g, &e)) in got.iter().zip(&want).enumerate() {
            assert!(close(g, e, scale), "{ty} [{i}]: {g} vs {e}");
        }
    }
}

#[test]
fn a_packed_copy_of_another_shape_is_refused() {
    let w = quantized(GgmlType::Q8_0, 64, 4, 2);
    let mut g = Graph::new();
    let wt = g.weight("w", GgmlType::Q8_0, &[64, 2]).unwrap();
    let x = g.input("x", GgmlType::F32, &[64, 1]).unwrap();
    let y = g.mul_mat(wt, x).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    let p = packed::pack_always(GgmlType::Q8_0, [64, 4, 1, 1], &w).unwrap();
    let e = mem.bind_packed(&plan, wt, Arc::new(p)).unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
}

/// `unpack_row` gives back the exact bytes every row was packed from (a packed copy stands in
/// for the file's bytes: QLoRA's frozen base keeps only it), for row counts that leave a
/// partial group.
#[test]
fn unpacking_gives_back_the_file_bytes() {
    for ty in FORMATS {
        let shapes: &[(usize, usize)] = match ty {
            GgmlType::Q4K | GgmlType::Q6K => &[(256, 1), (512, 17), (256, 40)],
            _ => &[(32, 1), (64, 17), (96, 40)],
        };
        for &(k, n) in shapes {
            let bytes = quantized(ty, k, n, 7 + n as u64);
            let p = packed::pack_always(ty, [k, n, 1, 1], &bytes).unwrap();
            let rb = p.row_bytes();
            assert_eq!(rb * n, bytes.len(), "{ty}");
            let mut row = vec![0u8; rb];
            for r in 0..n {
                p.unpack_row(r, &mut row);
                assert_eq!(row, bytes[r * rb..][..rb], "{ty} {k}x{n} row {r}");
            }
        }
    }
}

/// A frozen persistent weight read only by products (`mul_mat`, `mul_mat_t`) and row lookups
/// can drop its bytes for its packed copy, and all three give the same numbers as before; a
/// weight read another way (a copy) keeps its bytes; a strict executor refuses a memory
/// without them.
#[test]
fn a_packed_copy_can_stand_in_for_dropped_bytes() {
    if !required_by_test("the packed AVX-512 VNNI kernels", packed::available()) {
        return;
    }
    let (k, n, m) = (64, 40, 5);
    let w = quantized(GgmlType::Q4_1, k, n, 21);
    let build = |copied: bool| {
        let mut g = Graph::new();
        let wt = g.persistent("w", GgmlType::Q4_1, &[k, n]).unwrap();
        let x = g.input("x", GgmlType::F32, &[k, m]).unwrap();
        let dy = g.input("dy", GgmlType::F32, &[n, m]).unwrap();
        let y = g.mul_mat(wt, x).unwrap(); // [n, m]
        let dx = g.mul_mat_t(wt, dy).unwrap(); // [k, m]
        let ids = g.input("ids", GgmlType::I32, &[3]).unwrap();
        let rows = g.get_rows(wt, ids).unwrap(); // [k, 3]
        let out = g.concat(y, dx, 0).unwrap();
        let out = g.reshape(out, &[(n + k) * m]).unwrap();
        let rows = g.reshape(rows, &[k * 3]).unwrap();
        let out = g.concat(out, rows, 0).unwrap();
        if copied {
            let f = g.input("f", GgmlType::F32, &[k, n]).unwrap();
            let c = g.cpy(wt, f).unwrap();
            g.set_output(c).unwrap();
        }
        g.set_output(out).unwrap();
        (tinynn_cpu::compile(g), wt, x, dy, ids, out)
    };
    let (plan, wt, x, dy, ids, out) = build(false);
    let run = |mem: &mut Memory<'_>, strict: bool| {
        mem.write_i32(&plan, ids, &[39, 0, 17]).unwrap();
        mem.write_f32(&plan, x, &noise(k * m, 3)).unwrap();
        mem.write_f32(&plan, dy, &noise(n * m, 4)).unwrap();
        let opts = tinynn_cpu::ExecOptions {
            threads: 2,
            strict,
            ..Default::default()
        };
        let mut exec = Executor::with_options(&plan, opts);
        exec.run(&plan, mem)
            .map(|()| exec.read_f32(&plan, mem, out).unwrap())
    };
    let p = Arc::new(packed::pack(GgmlType::Q4_1, [k, n, 1, 1], &w).unwrap());
    let mut kept = Memory::new(&plan);
    kept.persistent_mut(&plan, wt).unwrap().copy_from_slice(&w);
    kept.bind_packed(&plan, wt, p.clone()).unwrap();
    let want = run(&mut kept, false).unwrap();
    let mut dropped = Memory::new(&plan);
    dropped.bind_packed(&plan, wt, p.clone()).unwrap();
    assert!(dropped.drop_packed_source(&plan, wt).unwrap());
    assert!(dropped.persistent(&plan, wt).unwrap().is_empty());
    assert_eq!(run(&mut dropped, false).unwrap(), want);
    let e = run(&mut dropped, true).unwrap_err();
    assert!(e.to_string().contains("packed copy"), "{e}");
    // Lending between a memory without the bytes and one that reads them is refused.
    let mut other = Memory::new(&plan);
    let e = dropped
        .swap_persistent(&plan, wt, &mut other, &plan, wt)
        .unwrap_err();
    assert!(e.to_string().contains("packed copy"), "{e}");

    let (plan, wt, ..) = build(true);
    let mut mem = Memory::new(&plan);
    mem.bind_packed(&plan, wt, p).unwrap();
    assert!(!mem.drop_packed_source(&plan, wt).unwrap());
    assert_eq!(mem.persistent(&plan, wt).unwrap().len(), w.len());
}

/// Weights whose quants are all at the top of their range (one low value per block sets the
/// minimum) against activations all at ±127 (Q8_K: −128 and 127): the largest integer sums a
/// block's kernel adds up (the AVX2 tiles sum byte products in 16 bits before widening them),
/// for every tile size.
#[test]
fn extreme_quants_and_activations_give_the_reference_sums() {
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4K,
        GgmlType::Q6K,
    ] {
        let (k, n) = match ty {
            GgmlType::Q4K | GgmlType::Q6K => (512, 37),
            _ => (576, 37),
        };
        // The one low value per block that puts every other quant at the top: the formats
        // with a minimum take it as that; the symmetric ones map their largest magnitude to
        // the bottom (−8 or −16 steps), so it is −8/7 or −16/15 of the rest.
        let low = match ty {
            GgmlType::Q4_0 => -8.0 / 7.0,
            GgmlType::Q5_0 => -16.0 / 15.0,
            GgmlType::Q6K => -32.0 / 31.0,
            _ => -0.9,
        };
        let x: Vec<f32> = (0..k * n)
            .map(|i| if i % 32 == 5 { low } else { 1.0 })
            .collect();
        let w = quantize_rows(ty, &x, k);
        let p = packed::pack_always(ty, [k, n, 1, 1], &w).unwrap();
        if !packed::packs(ty) {
            continue;
        }
        for sign in [1.0f32, -1.0] {
            for m in [1usize, 2, 3, 8, 13] {
                let acts = prepared(&p, &vec![sign; k * m], k);
                let want = reference_product(ty, k, n, &w, &acts, p.activation_row_bytes());
                let scale = want.iter().fold(0f32, |a, v| a.max(v.abs()));
                let mut simd = vec![f32::NAN; m * n];
                p.matmul(&acts, m, &mut simd);
                for (i, (&g, &e)) in simd.iter().zip(&want).enumerate() {
                    assert!(
                        close(g, e, scale),
                        "{ty} sign {sign} m={m} [{i}]: {g} vs {e}"
                    );
                }
            }
        }
    }
}

/// Threads share the 16-row groups out dynamically (`StepArgs::for_shares`), so a group may be
/// computed alone or beside its neighbour, at the start or the end of a share: every way of
/// cutting the groups gives the whole product's bits, for every format and token count (the
/// float kinds pair groups from 8 tokens on; a lone group once summed its last tokens in
/// another order, so prefill on F16 and F32 weights changed with the thread count).
#[test]
fn any_split_of_the_groups_gives_the_same_bits() {
    for ty in FORMATS {
        if !packed::packs(ty) {
            continue;
        }
        let k = if matches!(ty, GgmlType::Q4K | GgmlType::Q6K) {
            256
        } else {
            96
        };
        let n = 16 * 5 - 3;
        let w = quantized(ty, k, n, 31);
        let p = packed::pack_always(ty, [k, n, 1, 1], &w).unwrap();
        for m in [1usize, 3, 4, 7, 8, 9, 12, 13, 17, 20, 21, 25, 31, 36, 70] {
            let acts = prepared(&p, &noise(k * m, 5 + m as u64), k);
            let mut whole = vec![f32::NAN; m * n];
            p.matmul(&acts, m, &mut whole);
            for cuts in [
                vec![1],
                vec![2],
                vec![1, 2],
                vec![1, 4],
                vec![3],
                vec![1, 2, 3, 4],
            ] {
                let mut got = vec![f32::NAN; m * n];
                let mut start = 0;
                for end in cuts.into_iter().chain([p.n_groups()]) {
                    p.matmul_groups(&acts, m, &mut got, start..end);
                    start = end;
                }
                let differ = got
                    .iter()
                    .zip(&whole)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(differ, None, "{ty} m={m}: element {differ:?}");
            }
        }
    }
}
