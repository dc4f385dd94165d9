//! The remaining ops against f64 references: out_prod, mixture of experts, Mamba's conv and
//! scan, im2col and conv_2d, cross-entropy with a label mask, and the AdamW / SGD steps.

mod common;

use common::{check, idx, weight_bytes, Input, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::quant;
use tinynn_cpu::{ExecError, Executor, Memory};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;
const TOL: f64 = 1e-7;

#[test]
fn out_prod_with_broadcast() {
    let mut rng = Rng::new(41);
    let (m, n, p, b2) = (5, 7, 3, 2);
    let (x, y) = (rng.vec(m * n), rng.vec(p * n * b2));
    let mut g = Graph::new();
    let a = g.input("a", F32, &[m, n]).unwrap();
    let b = g.input("b", F32, &[p, n, b2]).unwrap();
    let o = g.out_prod(a, b).unwrap();
    let mut want = vec![0f64; m * p * b2];
    for i2 in 0..b2 {
        for j in 0..p {
            for i in 0..m {
                want[idx([m, p, b2, 1], [i, j, i2, 0])] = (0..n)
                    .map(|k| f64::from(x[i + m * k]) * f64::from(y[j + p * (k + n * i2)]))
                    .sum();
            }
        }
    }
    check(
        "out_prod",
        &g,
        o,
        &[Input::F32(a, x), Input::F32(b, y)],
        &[],
        &want,
        TOL,
    );
}

fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    quant::dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

#[test]
fn mixture_of_experts() {
    let mut rng = Rng::new(42);
    let (k, n, n_expert, n_used, n_tok) = (64, 6, 4, 2, 3);
    let ty = GgmlType::Q8_0;
    let w = weight_bytes(ty, k, n * n_expert, &mut rng);
    let wf = dequant(ty, &w, k * n * n_expert);
    let ids = vec![3, 0, 1, 1, 2, 3];
    for b1 in [1, n_used] {
        let x = rng.vec(k * b1 * n_tok);
        let mut g = Graph::new();
        let wt = g.weight("experts", ty, &[k, n, n_expert]).unwrap();
        let xt = g.input("x", F32, &[k, b1, n_tok]).unwrap();
        let it = g.input("ids", GgmlType::I32, &[n_used, n_tok]).unwrap();
        let y = g.mul_mat_id(wt, xt, it).unwrap();
        let mut want = vec![0f64; n * n_used * n_tok];
        for t in 0..n_tok {
            for e in 0..n_used {
                let ex = ids[e + n_used * t] as usize;
                let xrow = &x[k * (e % b1 + b1 * t)..][..k];
                // The kernel sees x quantized to Q8_0 (the dot type).
                let mut q = vec![0u8; quant::row_bytes(ty, k).unwrap()];
                quant::quantize_row(ty, xrow, &mut q).unwrap();
                let xq = dequant(ty, &q, k);
                for o in 0..n {
                    let wrow = &wf[k * (o + n * ex)..][..k];
                    want[o + n * (e + n_used * t)] = wrow
                        .iter()
                        .zip(&xq)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                }
            }
        }
        let inputs = [Input::F32(xt, x), Input::I32(it, ids.clone())];
        check(
            &format!("mul_mat_id b1={b1}"),
            &g,
            y,
            &inputs,
            &[(wt, &w)],
            &want,
            TOL,
        );
    }

    let (a, b) = (rng.vec(n * n_used * n_tok), rng.vec(n * n_expert));
    let mut g = Graph::new();
    let at = g.input("a", F32, &[n, n_used, n_tok]).unwrap();
    let bt = g.input("bias", F32, &[n, n_expert]).unwrap();
    let it = g.input("ids", GgmlType::I32, &[n_used, n_tok]).unwrap();
    let y = g.add_id(at, bt, it).unwrap();
    let want: Vec<f64> = (0..a.len())
        .map(|i| f64::from(a[i]) + f64::from(b[i % n + n * ids[i / n] as usize]))
        .collect();
    let inputs = [
        Input::F32(at, a),
        Input::F32(bt, b),
        Input::I32(it, ids.clone()),
    ];
    check("add_id", &g, y, &inputs, &[], &want, TOL);

    // An id past the experts is a run-time error, not a read out of bounds.
    let mut g = Graph::new();
    let at = g.input("a", F32, &[n, n_used, n_tok]).unwrap();
    let bt = g.input("bias", F32, &[n, n_expert]).unwrap();
    let it = g.input("ids", GgmlType::I32, &[n_used, n_tok]).unwrap();
    let y = g.add_id(at, bt, it).unwrap();
    g.set_output(y).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.write_i32(&plan, it, &[0, 1, 2, 9, 0, 0]).unwrap();
    assert_eq!(
        Executor::new(&plan, 2).run(&plan, &mut mem),
        Err(ExecError::IndexOutOfRange(9))
    );
}

#[test]
fn mamba_conv_and_scan() {
    let mut rng = Rng::new(43);
    let (d_conv, d_inner, n_t, n_s, d_state) = (4, 5, 3, 2, 6);
    let (sx, c) = (
        rng.vec((d_conv - 1 + n_t) * d_inner * n_s),
        rng.vec(d_conv * d_inner),
    );
    let mut g = Graph::new();
    let st = g
        .input("sx", F32, &[d_conv - 1 + n_t, d_inner, n_s])
        .unwrap();
    let ct = g.input("c", F32, &[d_conv, d_inner]).unwrap();
    let y = g.ssm_conv(st, ct).unwrap();
    let sne = [d_conv - 1 + n_t, d_inner, n_s, 1];
    let mut want = vec![0f64; d_inner * n_t * n_s];
    for s in 0..n_s {
        for t in 0..n_t {
            for i in 0..d_inner {
                want[i + d_inner * (t + n_t * s)] = (0..d_conv)
                    .map(|j| {
                        f64::from(sx[idx(sne, [t + j, i, s, 0])]) * f64::from(c[j + d_conv * i])
                    })
                    .sum();
            }
        }
    }
    check(
        "ssm_conv",
        &g,
        y,
        &[Input::F32(st, sx), Input::F32(ct, c)],
        &[],
        &want,
        TOL,
    );

    let s0 = rng.vec(d_state * d_inner * n_s);
    let x = rng.vec(d_inner * n_t * n_s);
    let dt: Vec<f32> = rng
        .vec(d_inner * n_t * n_s)
        .iter()
        .map(|v| v * 3.0)
        .collect();
    let am: Vec<f32> = rng
        .vec(d_state * d_inner)
        .iter()
        .map(|v| -v.abs() - 0.1)
        .collect();
    let (bm, cm) = (rng.vec(d_state * n_t * n_s), rng.vec(d_state * n_t * n_s));
    let mut g = Graph::new();
    let t_s = g.input("s", F32, &[d_state, d_inner, n_s]).unwrap();
    let t_x = g.input("x", F32, &[d_inner, n_t, n_s]).unwrap();
    let t_dt = g.input("dt", F32, &[d_inner, n_t, n_s]).unwrap();
    let t_a = g.input("A", F32, &[d_state, d_inner]).unwrap();
    let t_b = g.input("B", F32, &[d_state, n_t, n_s]).unwrap();
    let t_c = g.input("C", F32, &[d_state, n_t, n_s]).unwrap();
    let y = g.ssm_scan(t_s, t_x, t_dt, t_a, t_b, t_c).unwrap();
    let ys = d_inner * n_t * n_s;
    let mut want = vec![0f64; ys + d_state * d_inner * n_s];
    for s in 0..n_s {
        for i in 0..d_inner {
            let mut state: Vec<f64> = (0..d_state)
                .map(|n| f64::from(s0[n + d_state * (i + d_inner * s)]))
                .collect();
            for t in 0..n_t {
                let d = f64::from(dt[i + d_inner * (t + n_t * s)]);
                let dsoft = if d <= 20.0 { d.exp().ln_1p() } else { d };
                let xdt = f64::from(x[i + d_inner * (t + n_t * s)]) * dsoft;
                let mut yv = 0.0;
                for (n, stn) in state.iter_mut().enumerate() {
                    *stn = *stn * (dsoft * f64::from(am[n + d_state * i])).exp()
                        + f64::from(bm[n + d_state * (t + n_t * s)]) * xdt;
                    yv += *stn * f64::from(cm[n + d_state * (t + n_t * s)]);
                }
                want[i + d_inner * (t + n_t * s)] = yv;
            }
            for (n, &v) in state.iter().enumerate() {
                want[ys + n + d_state * (i + d_inner * s)] = v;
            }
        }
    }
    let inputs = [
        Input::F32(t_s, s0),
        Input::F32(t_x, x),
        Input::F32(t_dt, dt),
        Input::F32(t_a, am),
        Input::F32(t_b, bm),
        Input::F32(t_c, cm),
    ];
    check("ssm_scan", &g, y, &inputs, &[], &want, 1e-6);
}

#[test]
fn conv_2d_matches_direct_convolution() {
    let mut rng = Rng::new(44);
    let (iw, ih, ic, n, kw, kh, oc) = (7, 6, 3, 2, 3, 2, 4);
    let (stride, pad, dil) = ([2, 1], [1, 0], [1, 2]);
    let (inp, ker) = (rng.vec(iw * ih * ic * n), rng.vec(kw * kh * ic * oc));
    let mut g = Graph::new();
    let it = g.input("input", F32, &[iw, ih, ic, n]).unwrap();
    let kt = g.weight("kernel", F32, &[kw, kh, ic, oc]).unwrap();
    let y = g.conv_2d(kt, it, stride, pad, dil).unwrap();
    let ow = (iw + 2 * pad[0] - dil[0] * (kw - 1) - 1) / stride[0] + 1;
    let oh = (ih + 2 * pad[1] - dil[1] * (kh - 1) - 1) / stride[1] + 1;
    assert_eq!(g.layout(y).ne, [ow, oh, oc, n]);
    let mut want = vec![0f64; ow * oh * oc * n];
    for b in 0..n {
        for o in 0..oc {
            for oy in 0..oh {
                for ox in 0..ow {
                    let mut acc = 0f64;
                    for c in 0..ic {
                        for y_ in 0..kh {
                            for x_ in 0..kw {
                                let (px, py) = (
                                    (ox * stride[0] + x_ * dil[0]) as isize - pad[0] as isize,
                                    (oy * stride[1] + y_ * dil[1]) as isize - pad[1] as isize,
                                );
                                if px < 0 || py < 0 || px >= iw as isize || py >= ih as isize {
                                    continue;
                                }
                                acc += f64::from(
                                    inp[idx([iw, ih, ic, n], [px as usize, py as usize, c, b])],
                                ) * f64::from(ker[idx([kw, kh, ic, oc], [x_, y_, c, o])]);
                            }
                        }
                    }
                    want[idx([ow, oh, oc, n], [ox, oy, o, b])] = acc;
                }
            }
        }
    }
    let kb = common::f32_bytes(&ker);
    check(
        "conv_2d",
        &g,
        y,
        &[Input::F32(it, inp)],
        &[(kt, &kb)],
        &want,
        TOL,
    );
}

#[test]
fn cross_entropy_with_masked_labels() {
    let mut rng = Rng::new(45);
    // 45 classes: two 16-value chunks of the vectorized sums and a tail.
    let (v, n) = (45, 5);
    let logits: Vec<f32> = rng.vec(v * n).iter().map(|x| x * 4.0).collect();
    let labels = vec![3, -100, 40, 0, -1];
    let mut g = Graph::new();
    let lt = g.input("logits", F32, &[v, n]).unwrap();
    let bt = g.input("labels", GgmlType::I32, &[n]).unwrap();
    let loss = g.cross_entropy_loss(lt, bt).unwrap();
    let mut total = 0f64;
    let mut count = 0.0;
    for (r, &l) in labels.iter().enumerate() {
        if l < 0 {
            continue;
        }
        let row: Vec<f64> = logits[r * v..(r + 1) * v]
            .iter()
            .map(|&x| f64::from(x))
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let lse = max + row.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        total += lse - row[l as usize];
        count += 1.0;
    }
    check(
        "cross_entropy",
        &g,
        loss,
        &[Input::F32(lt, logits), Input::I32(bt, labels)],
        &[],
        &[total / count],
        1e-12,
    );
}

#[test]
fn adamw_and_sgd_steps_update_persistent_state() {
    let mut rng = Rng::new(46);
    let n = 37;
    let (w0, grads) = (rng.vec(n), [rng.vec(n), rng.vec(n), rng.vec(n)]);
    let (lr, b1, b2, eps, wd) = (1e-2f32, 0.9f32, 0.999f32, 1e-8f32, 0.01f32);

    let mut g = Graph::new();
    let w = g.persistent("w", F32, &[n]).unwrap();
    let gr = g.input("g", F32, &[n]).unwrap();
    let m = g.persistent("m", F32, &[n]).unwrap();
    let v = g.persistent("v", F32, &[n]).unwrap();
    let hp = g.input("hp", F32, &[7]).unwrap();
    g.adamw_step(w, gr, m, v, hp).unwrap();
    let plan = tinynn_cpu::compile(g);
    assert_eq!(
        plan.steps().len(),
        1,
        "the step is kept for its side effect"
    );
    let mut mem = Memory::new(&plan);
    mem.write_f32(&plan, w, &w0).unwrap();
    let mut exec = Executor::new(&plan, 2);
    let (mut rw, mut rm, mut rv): (Vec<f64>, Vec<f64>, Vec<f64>) = (
        w0.iter().map(|&x| f64::from(x)).collect(),
        vec![0.0; n],
        vec![0.0; n],
    );
    for (t, gv) in grads.iter().enumerate() {
        let step = t as i32 + 1;
        let (b1h, b2h) = (1.0 / (1.0 - b1.powi(step)), 1.0 / (1.0 - b2.powi(step)));
        mem.write_f32(&plan, gr, gv).unwrap();
        mem.write_f32(&plan, hp, &[lr, b1, b2, eps, wd, b1h, b2h])
            .unwrap();
        exec.run(&plan, &mut mem).unwrap();
        for i in 0..n {
            let gi = f64::from(gv[i]);
            rm[i] = rm[i] * f64::from(b1) + gi * (1.0 - f64::from(b1));
            rv[i] = rv[i] * f64::from(b2) + gi * gi * (1.0 - f64::from(b2));
            let upd = rm[i] * f64::from(b1h) / ((rv[i] * f64::from(b2h)).sqrt() + f64::from(eps));
            rw[i] = rw[i] * (1.0 - f64::from(lr * wd)) - f64::from(lr) * upd;
        }
    }
    let got: Vec<f32> = mem
        .persistent(&plan, w)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let e = common::nmse(&got, &rw);
    assert!(e < 1e-10, "adamw after 3 steps: NMSE {e:e}");

    let mut g = Graph::new();
    let w = g.persistent("w", F32, &[n]).unwrap();
    let gr = g.input("g", F32, &[n]).unwrap();
    let vel = g.persistent("vel", F32, &[n]).unwrap();
    let hp = g.input("hp", F32, &[3]).unwrap();
    g.sgd_step(w, gr, vel, hp).unwrap();
    let plan = tinynn_cpu::compile(g);
    let mut mem = Memory::new(&plan);
    mem.write_f32(&plan, w, &w0).unwrap();
    mem.write_f32(&plan, hp, &[0.1, 0.9, 0.0]).unwrap();
    let mut exec = Executor::new(&plan, 3);
    let (mut rw, mut rvel): (Vec<f64>, Vec<f64>) =
        (w0.iter().map(|&x| f64::from(x)).collect(), vec![0.0; n]);
    for gv in &grads {
        mem.write_f32(&plan, gr, gv).unwrap();
        exec.run(&plan, &mut mem).unwrap();
        for i in 0..n {
            rvel[i] = 0.9 * rvel[i] + f64::from(gv[i]);
            rw[i] -= 0.1 * rvel[i];
        }
    }
    let got: Vec<f32> = mem
        .persistent(&plan, w)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let e = common::nmse(&got, &rw);
    assert!(e < 1e-12, "sgd after 3 steps: NMSE {e:e}");
}
