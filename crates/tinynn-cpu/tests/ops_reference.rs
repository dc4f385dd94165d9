//! Every op against a scalar f64 reference, on 1, 2 and 3 threads, with odd sizes,
//! broadcasting and non-contiguous views. NMSE ≤ 1e-7 for f32 paths (bounds for others stated).

mod common;

use common::{check, idx, weight_bytes, Input, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::ops::{Binary, Rope, RopeMode, Unary};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;
const TOL: f64 = 1e-7;

fn to64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

#[test]
fn unary_ops() {
    let mut rng = Rng::new(1);
    let ne = [37, 5, 3, 1];
    let x: Vec<f32> = rng.vec(37 * 15).iter().map(|v| v * 4.0).collect();
    type Reference = fn(f64) -> f64;
    let cases: [(Unary, Reference); 8] = [
        (Unary::Silu, |v| v / (1.0 + (-v).exp())),
        (Unary::GeluTanh, |v| {
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
        }),
        (Unary::GeluErf, |v| {
            0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2))
        }),
        (Unary::Tanh, f64::tanh),
        (Unary::Exp, f64::exp),
        (Unary::Sqr, |v| v * v),
        (Unary::Sqrt, |v| v.abs().sqrt()),
        (Unary::Neg, |v| -v),
    ];
    for (u, f) in cases {
        let mut g = Graph::new();
        let a = g.input("x", F32, &ne).unwrap();
        let input: Vec<f32> = if u == Unary::Sqrt {
            x.iter().map(|v| v.abs()).collect()
        } else {
            x.clone()
        };
        let y = g.unary(u, a).unwrap();
        let want: Vec<f64> = input.iter().map(|&v| f(f64::from(v))).collect();
        check(
            &format!("{u:?}"),
            &g,
            y,
            &[Input::F32(a, input)],
            &[],
            &want,
            TOL,
        );
    }
}

#[test]
fn binary_ops_broadcast() {
    let mut rng = Rng::new(2);
    let (na, nb) = ([19, 4, 3, 2], [19, 1, 3, 1]);
    let (x, y) = (
        rng.vec(19 * 24),
        rng.vec(19 * 3).iter().map(|v| v + 2.0).collect::<Vec<_>>(),
    );
    for op in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
        let mut g = Graph::new();
        let a = g.input("a", F32, &na).unwrap();
        let b = g.input("b", F32, &nb).unwrap();
        let out = g.binary(op, a, b).unwrap();
        let mut want = vec![0f64; x.len()];
        for i3 in 0..2 {
            for i2 in 0..3 {
                for i1 in 0..4 {
                    for i0 in 0..19 {
                        let p = f64::from(x[idx(na, [i0, i1, i2, i3])]);
                        let q = f64::from(y[idx(nb, [i0, 0, i2, 0])]);
                        want[idx(na, [i0, i1, i2, i3])] = match op {
                            Binary::Add => p + q,
                            Binary::Sub => p - q,
                            Binary::Mul => p * q,
                            Binary::Div => p / q,
                        };
                    }
                }
            }
        }
        check(
            &format!("{op:?}"),
            &g,
            out,
            &[Input::F32(a, x.clone()), Input::F32(b, y.clone())],
            &[],
            &want,
            TOL,
        );
    }
}

#[test]
fn elementwise_on_transposed_views() {
    // a is [5, 7]; its transpose is a [7, 5] view with strided rows.
    let mut rng = Rng::new(3);
    let (x, y) = (rng.vec(35), rng.vec(35));
    let mut g = Graph::new();
    let a = g.input("a", F32, &[5, 7]).unwrap();
    let b = g.input("b", F32, &[7, 5]).unwrap();
    let at = g.transpose(a).unwrap();
    let s = g.add(at, b).unwrap();
    let out = g.scale(s, 0.5).unwrap();
    let want: Vec<f64> = (0..35)
        .map(|i| {
            let (i0, i1) = (i % 7, i / 7);
            0.5 * (f64::from(x[i1 + 5 * i0]) + f64::from(y[i]))
        })
        .collect();
    check(
        "add(transpose)",
        &g,
        out,
        &[Input::F32(a, x.clone()), Input::F32(b, y.clone())],
        &[],
        &want,
        TOL,
    );

    // cont of a permuted view is a real transpose.
    let mut g = Graph::new();
    let a = g.input("a", F32, &[5, 7]).unwrap();
    let at = g.transpose(a).unwrap();
    let c = g.cont(at).unwrap();
    let want: Vec<f64> = (0..35)
        .map(|i| f64::from(x[(i / 7) + 5 * (i % 7)]))
        .collect();
    check(
        "cont(transpose)",
        &g,
        c,
        &[Input::F32(a, x)],
        &[],
        &want,
        0.0,
    );
}

#[test]
fn swiglu_scale_rms_norm() {
    let mut rng = Rng::new(4);
    let ne = [129, 3, 2, 1];
    let n = 129 * 6;
    let (gate, up) = (rng.vec(n), rng.vec(n));
    let mut g = Graph::new();
    let a = g.input("gate", F32, &ne).unwrap();
    let b = g.input("up", F32, &ne).unwrap();
    let s = g.swiglu(a, b).unwrap();
    let want: Vec<f64> = gate
        .iter()
        .zip(&up)
        .map(|(&x, &y)| f64::from(x) / (1.0 + (-f64::from(x)).exp()) * f64::from(y))
        .collect();
    check(
        "swiglu",
        &g,
        s,
        &[Input::F32(a, gate.clone()), Input::F32(b, up.clone())],
        &[],
        &want,
        TOL,
    );

    let eps = 1e-5;
    let mut g = Graph::new();
    let a = g.input("x", F32, &ne).unwrap();
    let y = g.rms_norm(a, eps).unwrap();
    let mut want = vec![0f64; n];
    for r in 0..6 {
        let row = &gate[r * 129..(r + 1) * 129];
        let ms: f64 = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / 129.0;
        for (j, &v) in row.iter().enumerate() {
            want[r * 129 + j] = f64::from(v) / (ms + f64::from(eps)).sqrt();
        }
    }
    check("rms_norm", &g, y, &[Input::F32(a, gate)], &[], &want, TOL);
}

#[test]
fn soft_max_with_and_without_mask() {
    let mut rng = Rng::new(5);
    let ne = [33, 4, 3, 1];
    let n = 33 * 12;
    let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 5.0).collect();
    // A causal-style mask [33, 4]: -inf past position 29 - row.
    let mask: Vec<f32> = (0..33 * 4)
        .map(|i| {
            if i % 33 > 29 - i / 33 {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    for with_mask in [false, true] {
        let scale = 0.125;
        let mut g = Graph::new();
        let a = g.input("x", F32, &ne).unwrap();
        let m = g.input("mask", F32, &[33, 4]).unwrap();
        let y = g.soft_max(a, with_mask.then_some(m), scale).unwrap();
        let mut want = vec![0f64; n];
        for r in 0..12 {
            let row: Vec<f64> = (0..33)
                .map(|j| {
                    f64::from(x[r * 33 + j]) * f64::from(scale)
                        + if with_mask {
                            f64::from(mask[(r % 4) * 33 + j])
                        } else {
                            0.0
                        }
                })
                .collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
            for j in 0..33 {
                want[r * 33 + j] = (row[j] - max).exp() / sum;
            }
        }
        let mut inputs = vec![Input::F32(a, x.clone())];
        if with_mask {
            inputs.push(Input::F32(m, mask.clone()));
        }
        check(
            &format!("soft_max mask={with_mask}"),
            &g,
            y,
            &inputs,
            &[],
            &want,
            TOL,
        );
    }
}

#[test]
fn rope_normal_and_neox_with_partial_dims() {
    let mut rng = Rng::new(6);
    let (hd, nh, nt) = (64, 3, 5);
    let x = rng.vec(hd * nh * nt);
    let pos: Vec<i32> = vec![0, 1, 7, 100, 4095];
    for (mode, n_dims) in [
        (RopeMode::Normal, 64),
        (RopeMode::Neox, 64),
        (RopeMode::Neox, 32),
        (RopeMode::Normal, 16),
    ] {
        let rope = Rope {
            freq_scale: 0.5,
            ..Rope::new(mode, n_dims, 10000.0)
        };
        let mut g = Graph::new();
        let a = g.input("x", F32, &[hd, nh, nt]).unwrap();
        let p = g.input("pos", GgmlType::I32, &[nt]).unwrap();
        let y = g.rope(a, p, rope).unwrap();
        let mut want = to64(&x);
        for (t, &p_t) in pos.iter().enumerate() {
            for h in 0..nh {
                let base = (t * nh + h) * hd;
                for i in 0..n_dims / 2 {
                    let theta =
                        f64::from(p_t) * 0.5 * 10000f64.powf(-2.0 * i as f64 / n_dims as f64);
                    let (i0, i1) = if mode == RopeMode::Normal {
                        (2 * i, 2 * i + 1)
                    } else {
                        (i, i + n_dims / 2)
                    };
                    let (x0, x1) = (f64::from(x[base + i0]), f64::from(x[base + i1]));
                    want[base + i0] = x0 * theta.cos() - x1 * theta.sin();
                    want[base + i1] = x0 * theta.sin() + x1 * theta.cos();
                }
            }
        }
        // Angles up to ~2000 rad in f32 (as ggml computes them) limit accuracy to ~1e-4 rad.
        check(
            &format!("rope {mode:?} n_dims={n_dims}"),
            &g,
            y,
            &[Input::F32(a, x.clone()), Input::I32(p, pos.clone())],
            &[],
            &want,
            1e-6,
        );
    }
}

fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    tinynn_core::quant::dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// x as the kernel sees it: quantized to the weight's dot type and back.
fn through_dot_type(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    use tinynn_core::quant;
    let dt = quant::vec_dot_type(ty).unwrap();
    let mut q = vec![0u8; quant::row_bytes(dt, x.len()).unwrap()];
    quant::quantize_row(dt, x, &mut q).unwrap();
    dequant(dt, &q, x.len())
}

#[test]
fn mul_mat_every_weight_type_with_batch_broadcast() {
    use tinynn_core::quant::SUPPORTED;
    let mut rng = Rng::new(7);
    let (k, n, m) = (256, 13, 3);
    let (b2, c2, c3) = (2, 4, 3);
    for ty in SUPPORTED.into_iter().filter(|t| *t != GgmlType::Q8K) {
        let w = weight_bytes(ty, k, n * b2, &mut rng);
        let wf = dequant(ty, &w, k * n * b2);
        let x = rng.vec(k * m * c2 * c3);
        let mut g = Graph::new();
        let wt = g.weight("w", ty, &[k, n, b2]).unwrap();
        let xt = g.input("x", F32, &[k, m, c2, c3]).unwrap();
        let y = g.mul_mat(wt, xt).unwrap();
        let mut want = vec![0f64; n * m * c2 * c3];
        for i3 in 0..c3 {
            for i2 in 0..c2 {
                for mi in 0..m {
                    let xrow_start = k * (mi + m * (i2 + c2 * i3));
                    let xq = through_dot_type(ty, &x[xrow_start..xrow_start + k]);
                    for ni in 0..n {
                        let wrow = &wf[k * (ni + n * (i2 / (c2 / b2)))..][..k];
                        let dot: f64 = wrow
                            .iter()
                            .zip(&xq)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum();
                        want[idx([n, m, c2, c3], [ni, mi, i2, i3])] = dot;
                    }
                }
            }
        }
        // f32 accumulation with f16-stored block sums (Q8_1's s) allows a little more than 1e-7.
        let tol = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1) {
            1e-6
        } else {
            TOL
        };
        check(
            &format!("mul_mat {ty}"),
            &g,
            y,
            &[Input::F32(xt, x)],
            &[(wt, &w)],
            &want,
            tol,
        );
    }
}

#[test]
fn mul_mat_with_strided_activations() {
    let mut rng = Rng::new(8);
    let (k, n, m) = (64, 9, 5);
    let (w, x) = (rng.vec(k * n), rng.vec(k * m));
    let mut g = Graph::new();
    let wt = g.weight("w", F32, &[k, n]).unwrap();
    let xt = g.input("xT", F32, &[m, k]).unwrap();
    let xv = g.transpose(xt).unwrap();
    let y = g.mul_mat(wt, xv).unwrap();
    let want: Vec<f64> = (0..n * m)
        .map(|i| {
            let (ni, mi) = (i % n, i / n);
            (0..k)
                .map(|j| f64::from(w[ni * k + j]) * f64::from(x[j * m + mi]))
                .sum()
        })
        .collect();
    let wb = common::f32_bytes(&w);
    check(
        "mul_mat(transposed x)",
        &g,
        y,
        &[Input::F32(xt, x)],
        &[(wt, &wb)],
        &want,
        TOL,
    );
}

/// F32 products at sizes that span several blocks of the AVX-512 GEMM (reduction past one
/// 256-block, output rows past 32-lane tiles with a tail, columns past one 128-job with a
/// tail), with transposed operands and broadcast batches, against f64 references.
#[test]
fn f32_products_blocked_sizes() {
    let mut rng = Rng::new(21);
    let (k, n, m) = (300, 70, 263);
    // mul_mat: y(ni, mi) = Σ_j w(j, ni) x(j, mi), with a broadcast weight batch.
    let (b2, c2) = (2, 4);
    let (w, x) = (rng.vec(k * n * b2), rng.vec(k * m * c2));
    let mut g = Graph::new();
    let wt = g.input("w", F32, &[k, n, b2]).unwrap();
    let xt = g.input("x", F32, &[k, m, c2]).unwrap();
    let y = g.mul_mat(wt, xt).unwrap();
    let mut want = vec![0f64; n * m * c2];
    for i2 in 0..c2 {
        for mi in 0..m {
            for ni in 0..n {
                want[idx([n, m, c2, 1], [ni, mi, i2, 0])] = (0..k)
                    .map(|j| {
                        f64::from(w[j + k * (ni + n * (i2 / (c2 / b2)))])
                            * f64::from(x[j + k * (mi + m * i2)])
                    })
                    .sum();
            }
        }
    }
    let inputs = [Input::F32(wt, w.clone()), Input::F32(xt, x.clone())];
    check("mul_mat f32 blocked", &g, y, &inputs, &[], &want, TOL);

    // mul_mat_t: y(j, mi) = Σ_ni w(j, ni) dy(ni, mi).
    let (w, dy) = (rng.vec(k * n), rng.vec(n * m));
    let mut g = Graph::new();
    let wt = g.input("w", F32, &[k, n]).unwrap();
    let dyt = g.input("dy", F32, &[n, m]).unwrap();
    let y = g.mul_mat_t(wt, dyt).unwrap();
    let want: Vec<f64> = (0..k * m)
        .map(|e| {
            let (j, mi) = (e % k, e / k);
            (0..n)
                .map(|ni| f64::from(w[j + k * ni]) * f64::from(dy[ni + n * mi]))
                .sum()
        })
        .collect();
    let inputs = [Input::F32(wt, w), Input::F32(dyt, dy)];
    check("mul_mat_t f32 blocked", &g, y, &inputs, &[], &want, TOL);

    // out_prod: y(i, j) = Σ_r a(i, r) b(j, r), a plain and transposed, b transposed.
    for a_transposed in [false, true] {
        let (av, bv) = (rng.vec(n * k), rng.vec(k * m));
        let mut g = Graph::new();
        let (at, a) = if a_transposed {
            let at = g.input("aT", F32, &[k, n]).unwrap();
            (at, g.transpose(at).unwrap())
        } else {
            let at = g.input("a", F32, &[n, k]).unwrap();
            (at, at)
        };
        let bt = g.input("bT", F32, &[k, m]).unwrap();
        let b = g.transpose(bt).unwrap(); // [m, k]
        let y = g.out_prod(a, b).unwrap(); // [n, m]
        let a_at = |i: usize, r: usize| {
            f64::from(if a_transposed {
                av[r + k * i]
            } else {
                av[i + n * r]
            })
        };
        let want: Vec<f64> = (0..n * m)
            .map(|e| {
                let (i, j) = (e % n, e / n);
                (0..k).map(|r| a_at(i, r) * f64::from(bv[r + k * j])).sum()
            })
            .collect();
        let inputs = [Input::F32(at, av), Input::F32(bt, bv)];
        check(
            &format!("out_prod f32 blocked (a transposed: {a_transposed})"),
            &g,
            y,
            &inputs,
            &[],
            &want,
            TOL,
        );
    }
    // out_prod with b's rows ≥ 8192 values apart (a head's gradient): blocks of b are copied.
    let (ni, p) = (37, 8200);
    let (av, bv) = (rng.vec(ni * k), rng.vec(p * k));
    let mut g = Graph::new();
    let at = g.input("a", F32, &[ni, k]).unwrap();
    let bt = g.input("b", F32, &[p, k]).unwrap();
    let y = g.out_prod(at, bt).unwrap(); // [ni, p]
    let want: Vec<f64> = (0..ni * p)
        .map(|e| {
            let (i, j) = (e % ni, e / ni);
            (0..k)
                .map(|r| f64::from(av[i + ni * r]) * f64::from(bv[j + p * r]))
                .sum()
        })
        .collect();
    let inputs = [Input::F32(at, av), Input::F32(bt, bv)];
    check("out_prod f32, far rows", &g, y, &inputs, &[], &want, TOL);
}

/// `ExecOptions::bf16_matmul`: the three F32 products equal f64 sums of the operands rounded
/// to bf16 (nearest, ties to even), on 1-3 threads; an odd reduction length pads the last
/// pair. Without AVX-512 BF16 the option leaves them f32.
#[test]
fn f32_products_in_bf16() {
    use tinynn_cpu::simd::{bf16_available, bf16_bits, required_by_test};
    use tinynn_cpu::{ExecOptions, Executor, Memory};
    let bf = |x: f32| f32::from_bits(u32::from(bf16_bits(x)) << 16);
    assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80); // a tie: to even
    assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
    assert_eq!(bf16_bits(-3.0e38), 0xff62);
    let run = |g: &Graph, y, inputs: &[(tinynn_core::tensor::TensorId, Vec<f32>)], threads| {
        let mut g = g.clone();
        g.set_output(y).unwrap();
        let plan = tinynn_cpu::compile(g);
        let mut mem = Memory::new(&plan);
        for (t, v) in inputs {
            mem.write_f32(&plan, *t, v).unwrap();
        }
        let opts = ExecOptions {
            threads,
            bf16_matmul: true,
            ..ExecOptions::default()
        };
        let mut e = Executor::with_options(&plan, opts);
        e.run(&plan, &mut mem).unwrap();
        e.read_f32(&plan, &mem, y).unwrap()
    };
    let mut rng = Rng::new(22);
    let (k, n, m) = (301, 70, 263);
    // (name, graph, output, inputs, a(i, r), b(j, r)) with y(i, j) = Σ_r a(i, r) b(j, r).
    type Case = (
        String,
        Graph,
        tinynn_core::tensor::TensorId,
        Vec<(tinynn_core::tensor::TensorId, Vec<f32>)>,
        Vec<f64>,
        Vec<f64>,
    );
    let mut cases: Vec<Case> = Vec::new();
    let want = |a: &dyn Fn(usize, usize) -> f32, b: &dyn Fn(usize, usize) -> f32, round: bool| {
        let f = |x: f32| f64::from(if round { bf(x) } else { x });
        (0..n * m)
            .map(|e| (0..k).map(|r| f(a(e % n, r)) * f(b(e / n, r))).sum())
            .collect::<Vec<f64>>()
    };
    {
        let (w, x) = (rng.vec(k * n), rng.vec(k * m));
        let mut g = Graph::new();
        let (wt, xt) = (
            g.input("w", F32, &[k, n]).unwrap(),
            g.input("x", F32, &[k, m]).unwrap(),
        );
        let y = g.mul_mat(wt, xt).unwrap();
        let (a, b) = (
            |i: usize, r: usize| w[r + k * i],
            |j: usize, r: usize| x[r + k * j],
        );
        let (wr, wf) = (want(&a, &b, true), want(&a, &b, false));
        cases.push((
            "mul_mat".into(),
            g,
            y,
            vec![(wt, w.clone()), (xt, x.clone())],
            wr,
            wf,
        ));
    }
    {
        // mul_mat_t: y(i, j) = Σ_r w(i, r) dy(r, j), w [n, k] (rows of length n), dy [k, m].
        let (w, dy) = (rng.vec(n * k), rng.vec(k * m));
        let mut g = Graph::new();
        let (wt, dyt) = (
            g.input("w", F32, &[n, k]).unwrap(),
            g.input("dy", F32, &[k, m]).unwrap(),
        );
        let y = g.mul_mat_t(wt, dyt).unwrap();
        let (a, b) = (
            |i: usize, r: usize| w[i + n * r],
            |j: usize, r: usize| dy[r + k * j],
        );
        let (wr, wf) = (want(&a, &b, true), want(&a, &b, false));
        cases.push((
            "mul_mat_t".into(),
            g,
            y,
            vec![(wt, w.clone()), (dyt, dy.clone())],
            wr,
            wf,
        ));
    }
    for b_transposed in [false, true] {
        let (av, bv) = (rng.vec(n * k), rng.vec(m * k));
        let mut g = Graph::new();
        let at = g.input("a", F32, &[n, k]).unwrap();
        let (bt, b) = if b_transposed {
            let bt = g.input("bT", F32, &[k, m]).unwrap();
            (bt, g.transpose(bt).unwrap())
        } else {
            let bt = g.input("b", F32, &[m, k]).unwrap();
            (bt, bt)
        };
        let y = g.out_prod(at, b).unwrap();
        let a = |i: usize, r: usize| av[i + n * r];
        let b = |j: usize, r: usize| {
            if b_transposed {
                bv[r + k * j]
            } else {
                bv[j + m * r]
            }
        };
        let (wr, wf) = (want(&a, &b, true), want(&a, &b, false));
        let name = format!("out_prod (b transposed: {b_transposed})");
        cases.push((name, g, y, vec![(at, av.clone()), (bt, bv.clone())], wr, wf));
    }
    for (name, g, y, inputs, rounded, exact) in &cases {
        for threads in [1, 2, 3] {
            let got = run(g, *y, inputs, threads);
            let (er, ef) = (common::nmse(&got, rounded), common::nmse(&got, exact));
            if required_by_test("AVX-512 BF16 products", bf16_available()) {
                assert!(er <= TOL, "{name} bf16 ({threads} threads): NMSE {er:e}");
                assert!(
                    ef > 10.0 * er,
                    "{name}: not rounded to bf16 ({ef:e} vs {er:e})"
                );
            } else {
                assert!(
                    ef <= TOL,
                    "{name} f32 fallback ({threads} threads): NMSE {ef:e}"
                );
            }
        }
    }
}

#[test]
fn get_rows_from_quantized_table_and_cpy_conversions() {
    let mut rng = Rng::new(9);
    let (k, rows) = (64, 10);
    let table = weight_bytes(GgmlType::Q4_1, k, rows, &mut rng);
    let tf = dequant(GgmlType::Q4_1, &table, k * rows);
    let ids = vec![3, 0, 9, 3];
    let mut g = Graph::new();
    let t = g.weight("table", GgmlType::Q4_1, &[k, rows]).unwrap();
    let i = g.input("ids", GgmlType::I32, &[4]).unwrap();
    let y = g.get_rows(t, i).unwrap();
    let want: Vec<f64> = ids
        .iter()
        .flat_map(|&r| to64(&tf[r as usize * k..][..k]))
        .collect();
    check(
        "get_rows Q4_1",
        &g,
        y,
        &[Input::I32(i, ids)],
        &[(t, &table)],
        &want,
        0.0,
    );

    // f32 rows written into a slice of a persistent cache of another type (as a KV cache is),
    // then read back with get_rows: equal to the reference quantize→dequantize round trip.
    for ty in [
        GgmlType::F16,
        GgmlType::Bf16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
    ] {
        let x = rng.vec(k * 3);
        let mut g = Graph::new();
        let src = g.input("x", F32, &[k, 3]).unwrap();
        let ids = g.input("ids", GgmlType::I32, &[3]).unwrap();
        let cache = g.persistent("cache", ty, &[k, 8]).unwrap();
        let row_bytes = tinynn_core::quant::row_bytes(ty, k).unwrap();
        let slot = g.view(cache, &[k, 3], &[row_bytes], 2 * row_bytes).unwrap();
        g.cpy(src, slot).unwrap();
        let rows = g.get_rows(cache, ids).unwrap();
        let want = to64(&through(ty, &x));
        let inputs = [Input::F32(src, x), Input::I32(ids, vec![2, 3, 4])];
        check(&format!("cpy f32→{ty}"), &g, rows, &inputs, &[], &want, 0.0);
    }
}

fn through(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    use tinynn_core::quant;
    let mut q = vec![0u8; quant::row_bytes(ty, x.len()).unwrap()];
    quant::quantize_row(ty, x, &mut q).unwrap();
    dequant(ty, &q, x.len())
}

/// `Wᵀ · dy` with frozen non-F32 weights in normal mode (dequantized panels of 4096 rows
/// through the f32 GEMM): more rows than one panel, a partial last panel, against f64 sums
/// of the dequantized weights, 1–3 threads.
#[test]
fn mul_mat_t_quantized_weights_in_panels() {
    let mut rng = Rng::new(77);
    for (ty, k, n, m) in [
        (GgmlType::Q8_0, 64, 4096 + 700, 5),
        (GgmlType::Q4_1, 96, 300, 17),
        (GgmlType::F16, 40, 4100, 3),
    ] {
        let w_bytes = weight_bytes(ty, k, n, &mut rng);
        let mut w_f32 = vec![0f32; k * n];
        tinynn_core::quant::dequantize_row(ty, &w_bytes, &mut w_f32).unwrap();
        let dy = rng.vec(n * m);
        let mut g = Graph::new();
        let w = g.weight("w", ty, &[k, n]).unwrap();
        let d = g.input("dy", GgmlType::F32, &[n, m]).unwrap();
        let out = g.mul_mat_t(w, d).unwrap();
        let want: Vec<f64> = (0..k * m)
            .map(|e| {
                let (i, mi) = (e % k, e / k);
                (0..n)
                    .map(|r| f64::from(w_f32[i + k * r]) * f64::from(dy[r + n * mi]))
                    .sum()
            })
            .collect();
        check(
            &format!("mul_mat_t {ty} k={k} n={n} m={m}"),
            &g,
            out,
            &[Input::F32(d, dy)],
            &[(w, &w_bytes)],
            &want,
            1e-10,
        );
    }
}

/// Fewer rows than threads: the gated activations split each row's values between threads,
/// and every thread count gives the bits of one thread (a length with a tail past the last
/// 16, and rows of lengths under the split's 16-value unit).
#[test]
fn gated_activations_of_few_rows_are_the_same_on_any_thread_count() {
    let mut rng = Rng::new(31);
    for (n, rows) in [(1541, 1), (1541, 2), (20, 1), (5, 2)] {
        let (gate, up) = (rng.vec(n * rows), rng.vec(n * rows));
        for geglu in [false, true] {
            let mut g = Graph::new();
            let a = g.input("g", F32, &[n, rows]).unwrap();
            let b = g.input("u", F32, &[n, rows]).unwrap();
            let y = if geglu {
                g.geglu(a, b).unwrap()
            } else {
                g.swiglu(a, b).unwrap()
            };
            let inputs = [Input::F32(a, gate.clone()), Input::F32(b, up.clone())];
            let one = common::run(&g, y, &inputs, &[], 1);
            for threads in [2, 3] {
                let got = common::run(&g, y, &inputs, &[], threads);
                let same = one
                    .iter()
                    .zip(&got)
                    .all(|(p, q)| p.to_bits() == q.to_bits());
                assert!(same, "n {n} rows {rows} geglu {geglu}, {threads} threads");
            }
        }
    }
}
