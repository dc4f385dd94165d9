//! One query row's attention over a long F16 cache, split by kv rows as llama.cpp's CPU flash
//! attention splits decode (from a 512-row view, one chunk per thread; the view here is the
//! row's visible rows rounded up to 256): bit for bit what an independent implementation of
//! that algorithm gives on the public kernels (the F16 dot, the f16-rounded accumulation,
//! glibc's `expf`), for 1–4 threads, many cache lengths, masks with holes and masked runs,
//! softcapping and grouped heads; close to f64 attention; and a row decoded beside other
//! sequences gives what it gives alone.

mod common;

use common::{nmse, run, Input, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::simd::{dot_fn, f16_accumulate};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;
const F16: GgmlType = GgmlType::F16;

struct Case {
    d: usize,
    h: usize,
    h_kv: usize,
    /// Cache rows (the K tensor's length).
    cap: usize,
    /// Rows in use (the run-time kv length).
    n_kv: usize,
    /// 0: no mask; 1: values and −∞ holes; 2: only the first rows visible.
    mask: u8,
    softcap: f32,
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
        .collect()
}

fn mask_row(c: &Case) -> Vec<f32> {
    (0..c.cap)
        .map(|j| match c.mask {
            1 if j % 5 == 2 || (300..420).contains(&j) => f32::NEG_INFINITY,
            1 => 0.05 * (j % 3) as f32,
            2 if j >= 9 => f32::NEG_INFINITY,
            _ => 0.0,
        })
        .collect()
}

/// The rows a case's query row sees, with their mask values.
fn visible_of(c: &Case) -> Vec<(usize, f32)> {
    let mask = mask_row(c);
    (0..c.n_kv)
        .map(|j| (j, if c.mask > 0 { mask[j] } else { 0.0 }))
        .filter(|&(_, m)| m != f32::NEG_INFINITY)
        .collect()
}

/// llama.cpp's algorithm for one query row `q` (`h` heads of `d`, over a cache of `cap` rows
/// and `h_kv` heads, F16 bytes): the visible rows in chunks of ⌈view / splits⌉ (view: their
/// count rounded up to 256), each head's online softmax per chunk with f16 value sums, then
/// the chunks merged in order.
#[allow(clippy::too_many_arguments)]
fn reference(
    (d, h_n, h_kv, cap): (usize, usize, usize, usize),
    visible: &[(usize, f32)],
    softcap: f32,
    q: &[f32],
    k: &[u8],
    v: &[u8],
    scale: f32,
    splits: usize,
) -> Vec<f32> {
    let dv = d;
    let dot = dot_fn(F16).unwrap();
    let view = visible.len().next_multiple_of(256).max(256);
    let splits = if view >= 512 { splits } else { 1 };
    let chunk = view.div_ceil(splits);
    let mut out = vec![0f32; dv * h_n];
    for h in 0..h_n {
        let hk = h / (h_n / h_kv);
        let q16 = f16_bytes(&q[h * d..][..d]);
        let (mut m, mut s, mut acc) = (f32::NEG_INFINITY, 0f32, vec![0f32; dv]);
        for ch in 0..splits {
            let first = (ch * chunk).min(visible.len());
            let (mut mc, mut sc, mut ac) = (f32::NEG_INFINITY, 0f32, vec![0f32; dv]);
            for &(j, mv) in &visible[first..((ch + 1) * chunk).min(visible.len())] {
                let row = (hk * cap + j) * 2 * d;
                let mut x = dot(&k[row..row + 2 * d], &q16) * scale;
                if softcap > 0.0 {
                    x = softcap * (x / softcap).tanh();
                }
                x += mv;
                let (ms, vs) = if x > mc {
                    let ms = (mc - x).exp();
                    mc = x;
                    (ms, 1.0)
                } else {
                    (1.0, (x - mc).exp())
                };
                if ms != 1.0 {
                    f16_accumulate::scale_f16_rounded(&mut ac, ms);
                }
                f16_accumulate::mad_f16_rounded(&mut ac, &v[row..row + 2 * dv], vs);
                sc = sc * ms + vs;
            }
            if sc == 0.0 {
                continue;
            }
            let mn = m.max(mc);
            let (old, new) = ((m - mn).exp(), (mc - mn).exp());
            for (a, &b) in acc.iter_mut().zip(&ac) {
                *a = *a * old + b * new;
            }
            s = s * old + sc * new;
            m = mn;
        }
        let inv = if s != 0.0 { 1.0 / s } else { 1.0 };
        for (o, &a) in out[h * dv..][..dv].iter_mut().zip(&acc) {
            *o = a * inv;
        }
    }
    out
}

/// f64 attention of the same (f16-rounded) values.
fn exact(c: &Case, q: &[f32], k: &[f32], v: &[f32], scale: f32) -> Vec<f64> {
    let d = c.d;
    let r = |x: f32| f64::from(half::f16::from_f32(x).to_f32());
    let visible = visible_of(c);
    let mut out = vec![0f64; d * c.h];
    for h in 0..c.h {
        let hk = h / (c.h / c.h_kv);
        let scores: Vec<f64> = visible
            .iter()
            .map(|&(j, mv)| {
                let mut x: f64 = (0..d)
                    .map(|i| r(q[h * d + i]) * r(k[(hk * c.cap + j) * d + i]))
                    .sum::<f64>()
                    * f64::from(scale);
                if c.softcap > 0.0 {
                    let cap = f64::from(c.softcap);
                    x = cap * (x / cap).tanh();
                }
                x + f64::from(mv)
            })
            .collect();
        let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = w.iter().sum();
        for i in 0..d {
            let o: f64 = visible
                .iter()
                .zip(&w)
                .map(|(&(j, _), wj)| wj * r(v[(hk * c.cap + j) * d + i]))
                .sum();
            out[h * d + i] = o / sum;
        }
    }
    out
}

/// The first value where `got` and `want` differ in bits.
fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
        .map(|i| (i, got[i], want[i]))
}

/// The graph of one flash attention over an F16 cache: inputs q `[d, h, n_q]`, K and V
/// `[d, cap, h_kv]` (F32, copied into the cache), the mask `[cap, n_q]` (used when `masked`)
/// and the kv length; returns the graph, those five inputs and the output.
fn attention_graph(
    (d, h, h_kv, cap): (usize, usize, usize, usize),
    n_q: usize,
    masked: bool,
    scale: f32,
    softcap: f32,
) -> (Graph, [TensorId; 5], TensorId) {
    let mut g = Graph::new();
    let qt = g.input("q", F32, &[d, h, n_q]).unwrap();
    let kt = g.input("k", F32, &[d, cap, h_kv]).unwrap();
    let vt = g.input("v", F32, &[d, cap, h_kv]).unwrap();
    let mt = g.input("mask", F32, &[cap, n_q]).unwrap();
    let nt = g.input("n_kv", GgmlType::I32, &[1]).unwrap();
    let kc = g.persistent("k_cache", F16, &[d, cap, h_kv]).unwrap();
    let vc = g.persistent("v_cache", F16, &[d, cap, h_kv]).unwrap();
    g.cpy(kt, kc).unwrap();
    g.cpy(vt, vc).unwrap();
    let qv = g.permute(qt, [0, 2, 1, 3]).unwrap();
    let out = g
        .flash_attn(qv, kc, vc, masked.then_some(mt), Some(nt), scale, softcap)
        .unwrap();
    (g, [qt, kt, vt, mt, nt], out)
}

#[test]
fn one_row_attention_split_by_kv_rows_is_llama_cpps_algorithm() {
    let mut rng = Rng::new(4242);
    // (d, heads, kv heads, cache rows, rows in use, mask, softcap)
    let cases = [
        // SmolLM2's heads at several depths: views of 512 to 1280 rows.
        (64, 9, 3, 1100, 1030, 0, 0.0),
        (64, 9, 3, 2048, 513, 0, 0.0),
        (64, 9, 3, 600, 600, 0, 0.0),
        // A view under 512 rows: not split.
        (64, 9, 3, 2048, 256, 0, 0.0),
        // Holes and a masked run; a mask that leaves later chunks empty.
        (48, 4, 2, 900, 777, 1, 0.0),
        (32, 2, 1, 1024, 1024, 2, 0.0),
        // Softcapping, one head per kv head, more heads than MAX_GROUP in a group.
        (64, 4, 4, 700, 650, 1, 20.0),
        (16, 12, 1, 520, 519, 0, 0.0),
    ]
    .map(|(d, h, h_kv, cap, n_kv, mask, softcap)| Case {
        d,
        h,
        h_kv,
        cap,
        n_kv,
        mask,
        softcap,
    });
    for c in &cases {
        let scale = 1.0 / (c.d as f32).sqrt();
        let q = rng.vec(c.d * c.h);
        // Scores spread enough that the running maximum moves inside chunks.
        let k: Vec<f32> = rng
            .vec(c.d * c.cap * c.h_kv)
            .iter()
            .map(|x| 2.0 * x)
            .collect();
        let v = rng.vec(c.d * c.cap * c.h_kv);
        let (g, [qt, kt, vt, mt, nt], out) =
            attention_graph((c.d, c.h, c.h_kv, c.cap), 1, c.mask > 0, scale, c.softcap);
        let mut inputs = vec![
            Input::F32(qt, q.clone()),
            Input::F32(kt, k.clone()),
            Input::F32(vt, v.clone()),
            Input::I32(nt, vec![c.n_kv as i32]),
        ];
        if c.mask > 0 {
            inputs.push(Input::F32(mt, mask_row(c)));
        }
        let (k16, v16) = (f16_bytes(&k), f16_bytes(&v));
        let want = exact(c, &q, &k, &v, scale);
        for threads in 1..=4 {
            let got = run(&g, out, &inputs, &[], threads);
            let shape = (c.d, c.h, c.h_kv, c.cap);
            let visible = visible_of(c);
            let expect = reference(shape, &visible, c.softcap, &q, &k16, &v16, scale, threads);
            let what = format!(
                "d={} heads {}/{} cache {} rows {} mask {} softcap {}, {threads} threads",
                c.d, c.h, c.h_kv, c.cap, c.n_kv, c.mask, c.softcap
            );
            if let Some((i, g, w)) = first_difference(&got, &expect) {
                panic!("{what}: value {i} is {g} where the split algorithm gives {w}");
            }
            // Values summed in f16 over up to a thousand rows, each step rounded to 11 bits:
            // NMSE ~2e-5 here (the unsplit sum too).
            let e = nmse(&got, &want);
            assert!(e < 1e-4, "{what}: NMSE {e:e} against f64 attention");
        }
    }
}

/// Several query rows in one call (sequences decoded together in a shared cache): each row's
/// chunks follow the rows it sees, so it gives, bit for bit, what it gives alone.
#[test]
fn rows_decoded_together_split_as_alone() {
    let mut rng = Rng::new(77);
    let (d, h, h_kv, cap) = (64, 9, 3, 1500);
    let n_kv = 1400;
    // Row 0 sees the even rows below 1200 (600: split), row 1 the odd rows below 800 (400: a
    // 512-row view, split), row 2 the first 200 (not split), row 3 every row (1400).
    let sees = |i: usize, j: usize| match i {
        0 => j < 1200 && j.is_multiple_of(2),
        1 => j < 800 && j % 2 == 1,
        2 => j < 200,
        _ => true,
    };
    let n_q = 4;
    let scale = 0.125;
    let q = rng.vec(d * h * n_q);
    let k: Vec<f32> = rng.vec(d * cap * h_kv).iter().map(|x| 2.0 * x).collect();
    let v = rng.vec(d * cap * h_kv);
    let mask: Vec<f32> = (0..cap * n_q)
        .map(|x| {
            let (j, i) = (x % cap, x / cap);
            if sees(i, j) {
                0.03 * (j % 4) as f32
            } else {
                f32::NEG_INFINITY
            }
        })
        .collect();
    let (g, [qt, kt, vt, mt, nt], out) = attention_graph((d, h, h_kv, cap), n_q, true, scale, 0.0);
    let inputs = [
        Input::F32(qt, q.clone()),
        Input::F32(kt, k.clone()),
        Input::F32(vt, v.clone()),
        Input::F32(mt, mask.clone()),
        Input::I32(nt, vec![n_kv as i32]),
    ];
    let (k16, v16) = (f16_bytes(&k), f16_bytes(&v));
    for threads in 1..=3 {
        let got = run(&g, out, &inputs, &[], threads);
        for i in 0..n_q {
            let visible: Vec<(usize, f32)> = (0..n_kv)
                .filter(|&j| sees(i, j))
                .map(|j| (j, mask[j + cap * i]))
                .collect();
            let alone = reference(
                (d, h, h_kv, cap),
                &visible,
                0.0,
                &q[i * d * h..][..d * h],
                &k16,
                &v16,
                scale,
                threads,
            );
            if let Some((x, g, w)) = first_difference(&got[i * d * h..][..d * h], &alone) {
                panic!("row {i}, {threads} threads: value {x} is {g}, alone {w}");
            }
        }
    }
}
