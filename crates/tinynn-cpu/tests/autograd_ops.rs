//! Every differentiable op's backward rule against central differences (strict mode, f64
//! sums), with odd sizes, broadcasting and views; each also identical on 1, 2 and 3 threads.
//! The gradient kernels (unary_back, reduce_to, repeat, rms_norm_back, layer_norm_back,
//! soft_max_back, diag_mask_zero, rope_back, flash_attn_back, get_rows_back,
//! cross_entropy_loss_back, mul_mat_t, view_back, take_rows_back, mul_mat_id_t, out_prod_id)
//! are checked through the rules that use them.

mod common;

use common::gradcheck::{assert_grads, assert_grads_with, Built, Opts, P};
use common::{Input, Rng};
use tinynn_core::ops::{Binary, Rope, RopeMode, Unary};
use tinynn_format::GgmlType;

const F32: GgmlType = GgmlType::F32;

#[test]
fn unary() {
    let mut rng = Rng::new(1);
    for u in [
        Unary::Silu,
        Unary::GeluTanh,
        Unary::GeluErf,
        Unary::Tanh,
        Unary::Exp,
        Unary::Sqr,
        Unary::Sqrt,
        Unary::Neg,
    ] {
        let p = if u == Unary::Sqrt {
            P::uniform(&[7, 3, 2], 0.5, 2.0, &mut rng)
        } else {
            P::uniform(&[7, 3, 2], -2.0, 2.0, &mut rng)
        };
        assert_grads(&format!("{u:?}"), &[p], &|g, p| {
            Built::y(g.unary(u, p[0]).unwrap())
        });
    }
    // SiLU over rows of 21 (the vectorized gradient's 8-value chunks and a tail), with a chunk
    // holding values below −100 (the scalar fallback).
    let mut p = P::uniform(&[21, 3], -6.0, 6.0, &mut rng);
    p.values[9] = -120.0;
    p.values[30] = -101.5;
    assert_grads("Silu, long rows", &[p], &|g, p| {
        Built::y(g.unary(Unary::Silu, p[0]).unwrap())
    });
}

#[test]
fn binary_with_broadcasting() {
    let mut rng = Rng::new(2);
    for op in [Binary::Add, Binary::Sub, Binary::Mul, Binary::Div] {
        for nb in [[7usize, 4, 3, 2], [7, 1, 3, 1], [1, 4, 1, 2], [1, 1, 1, 1]] {
            let a = P::rand(&[7, 4, 3, 2], &mut rng);
            let b = if op == Binary::Div {
                P::uniform(&nb, 1.0, 2.0, &mut rng)
            } else {
                P::rand(&nb, &mut rng)
            };
            assert_grads(&format!("{op:?} {nb:?}"), &[a, b], &|g, p| {
                Built::y(g.binary(op, p[0], p[1]).unwrap())
            });
        }
    }
    // The same tensor on both sides: contributions add up.
    assert_grads("x*x", &[P::rand(&[5, 3], &mut rng)], &|g, p| {
        Built::y(g.mul(p[0], p[0]).unwrap())
    });
}

#[test]
fn scale_swiglu_geglu() {
    let mut rng = Rng::new(3);
    assert_grads("scale", &[P::rand(&[9, 2], &mut rng)], &|g, p| {
        Built::y(g.scale(p[0], -0.7).unwrap())
    });
    for (name, geglu) in [("swiglu", false), ("geglu", true)] {
        let ps = [P::rand(&[11, 3], &mut rng), P::rand(&[11, 3], &mut rng)];
        assert_grads(name, &ps, &|g, p| {
            Built::y(if geglu {
                g.geglu(p[0], p[1]).unwrap()
            } else {
                g.swiglu(p[0], p[1]).unwrap()
            })
        });
    }
}

#[test]
fn norms() {
    let mut rng = Rng::new(4);
    let ps = [P::rand(&[33, 4, 2], &mut rng), P::rand(&[33], &mut rng)];
    assert_grads("rms_norm * weight", &ps, &|g, p| {
        let h = g.rms_norm(p[0], 1e-5).unwrap();
        Built::y(g.mul(h, p[1]).unwrap())
    });
    let ps = [
        P::rand(&[17, 5], &mut rng),
        P::rand(&[17], &mut rng),
        P::rand(&[17], &mut rng),
    ];
    assert_grads("layer_norm(w, b)", &ps, &|g, p| {
        Built::y(g.layer_norm(p[0], 1e-5, Some(p[1]), Some(p[2])).unwrap())
    });
    assert_grads("layer_norm", &[P::rand(&[17, 5], &mut rng)], &|g, p| {
        Built::y(g.layer_norm(p[0], 1e-5, None, None).unwrap())
    });
}

fn causal(n_kv: usize, n_q: usize, past: usize) -> Vec<f32> {
    (0..n_kv * n_q)
        .map(|i| {
            if i % n_kv > past + i / n_kv {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect()
}

#[test]
fn soft_max_and_masks() {
    let mut rng = Rng::new(5);
    // A learned additive mask (broadcast over heads) gets a gradient too.
    let ps = [
        P::uniform(&[13, 4, 3], -3.0, 3.0, &mut rng),
        P::rand(&[13, 4], &mut rng),
    ];
    assert_grads("soft_max_ext(mask param)", &ps, &|g, p| {
        Built::y(g.soft_max_ext(p[0], Some(p[1]), 0.7, 0.0).unwrap())
    });
    // A causal -inf mask as a plain input.
    let ps = [P::uniform(&[6, 6, 2], -3.0, 3.0, &mut rng)];
    assert_grads("soft_max(causal)", &ps, &|g, p| {
        let m = g.input("mask", F32, &[6, 6]).unwrap();
        Built::with(
            g.soft_max(p[0], Some(m), 0.5).unwrap(),
            vec![Input::F32(m, causal(6, 6, 0))],
        )
    });
    let ps = [P::uniform(&[7, 5, 2], -3.0, 3.0, &mut rng)];
    assert_grads("diag_mask_inf + soft_max", &ps, &|g, p| {
        let m = g.diag_mask_inf(p[0], 1).unwrap();
        Built::y(g.soft_max(m, None, 1.0).unwrap())
    });
}

#[test]
fn rope_modes_and_scalings() {
    let mut rng = Rng::new(6);
    let (hd, nh, nt) = (12, 3, 5);
    let pos = vec![0, 3, 7, 100, 4095];
    let yarn = Rope {
        freq_scale: 0.25,
        ext_factor: 1.0,
        attn_factor: 1.3,
        n_ctx_orig: 4096,
        ..Rope::new(RopeMode::Neox, hd, 10000.0)
    };
    let cases = [
        ("normal", Rope::new(RopeMode::Normal, hd, 10000.0), false),
        ("neox", Rope::new(RopeMode::Neox, hd, 10000.0), false),
        ("neox partial", Rope::new(RopeMode::Neox, 8, 500.0), false),
        (
            "normal + freq factors",
            Rope::new(RopeMode::Normal, hd, 10000.0),
            true,
        ),
        ("yarn", yarn, false),
    ];
    for (name, rope, ff) in cases {
        let ps = [P::rand(&[hd, nh, nt], &mut rng)];
        let pos = pos.clone();
        assert_grads(name, &ps, &|g, p| {
            let pt = g.input("pos", GgmlType::I32, &[nt]).unwrap();
            let mut inputs = vec![Input::I32(pt, pos.clone())];
            let f = ff.then(|| {
                let f = g.input("ff", F32, &[rope.n_dims / 2]).unwrap();
                let vals = (0..rope.n_dims / 2).map(|i| 1.0 + i as f32).collect();
                inputs.push(Input::F32(f, vals));
                f
            });
            Built::with(g.rope_ext(p[0], pt, f, rope).unwrap(), inputs)
        });
    }
}

#[test]
fn flash_attn_causal_gqa() {
    let mut rng = Rng::new(7);
    let (d, n, h, hkv) = (8, 5, 4, 2);
    for softcap in [0.0, 2.0] {
        // q as the model makes it: [d, h, n] permuted to [d, n, h].
        let ps = [
            P::rand(&[d, h, n], &mut rng),
            P::rand(&[d, n, hkv], &mut rng),
            P::rand(&[d + 2, n, hkv], &mut rng),
        ];
        assert_grads(&format!("flash_attn softcap={softcap}"), &ps, &|g, p| {
            let m = g.input("mask", F32, &[n, n]).unwrap();
            let q = g.permute(p[0], [0, 2, 1, 3]).unwrap();
            let y = g.flash_attn(q, p[1], p[2], Some(m), None, 0.4, softcap);
            Built::with(y.unwrap(), vec![Input::F32(m, causal(n, n, 0))])
        });
    }
    // Batches (dimension 3): the training graph's sequences, each attending to its own keys.
    let b = 3;
    let ps = [
        P::rand(&[d, h, n, b], &mut rng),
        P::rand(&[d, hkv, n, b], &mut rng),
        P::rand(&[d + 2, hkv, n, b], &mut rng),
    ];
    assert_grads("flash_attn batched", &ps, &|g, p| {
        let m = g.input("mask", F32, &[n, n]).unwrap();
        let [q, k, v] = [0, 1, 2].map(|i| g.permute(p[i], [0, 2, 1, 3]).unwrap());
        let y = g.flash_attn(q, k, v, Some(m), None, 0.4, 0.0);
        Built::with(y.unwrap(), vec![Input::F32(m, causal(n, n, 0))])
    });
    // No mask, one query row fully masked would be zeros: use a kv longer than q.
    let ps = [
        P::rand(&[d, 3, 2], &mut rng),
        P::rand(&[d, 6, 1], &mut rng),
        P::rand(&[d, 6, 1], &mut rng),
    ];
    assert_grads("flash_attn no mask", &ps, &|g, p| {
        Built::y(
            g.flash_attn(p[0], p[1], p[2], None, None, 0.3, 0.0)
                .unwrap(),
        )
    });
}

/// Sizes that take the AVX-512 tiles in normal mode (several query and KV tiles, partial
/// ones, a head size with a tail past 8 columns, a query row the mask hides entirely),
/// checked against strict mode and central differences, identical on 1-3 threads.
#[test]
fn flash_attn_tiles() {
    let mut rng = Rng::new(11);
    let (d, dv, n, h, hkv) = (12, 10, 34, 4, 2);
    let ps = [
        P::rand(&[d, h, n], &mut rng),
        P::rand(&[d, n, hkv], &mut rng),
        P::rand(&[dv, n, hkv], &mut rng),
    ];
    let mut mask = causal(n, n, 2);
    // Query row 5 sees nothing; query row 9 sees only KV rows 3 and 30.
    mask[5 * n..6 * n].fill(f32::NEG_INFINITY);
    for (j, m) in mask[9 * n..10 * n].iter_mut().enumerate() {
        *m = if j == 3 || j == 30 {
            0.5
        } else {
            f32::NEG_INFINITY
        };
    }
    assert_grads("flash_attn tiles", &ps, &|g, p| {
        let m = g.input("mask", F32, &[n, n]).unwrap();
        let q = g.permute(p[0], [0, 2, 1, 3]).unwrap();
        let y = g.flash_attn(q, p[1], p[2], Some(m), None, 0.35, 0.0);
        Built::with(y.unwrap(), vec![Input::F32(m, mask.clone())])
    });
    // Two batches through the tiles (the training graph's sequences).
    let ps = [
        P::rand(&[d, 2, n, 2], &mut rng),
        P::rand(&[d, n, 1, 2], &mut rng),
        P::rand(&[dv, n, 1, 2], &mut rng),
    ];
    assert_grads("flash_attn tiles, batched", &ps, &|g, p| {
        let m = g.input("mask", F32, &[n, n]).unwrap();
        let q = g.permute(p[0], [0, 2, 1, 3]).unwrap();
        let y = g.flash_attn(q, p[1], p[2], Some(m), None, 0.35, 0.0);
        Built::with(y.unwrap(), vec![Input::F32(m, mask.clone())])
    });
    let ps = [
        P::rand(&[9, 19, 3], &mut rng),
        P::rand(&[9, 41, 1], &mut rng),
        P::rand(&[9, 41, 1], &mut rng),
    ];
    assert_grads("flash_attn tiles, no mask", &ps, &|g, p| {
        Built::y(
            g.flash_attn(p[0], p[1], p[2], None, None, 0.25, 0.0)
                .unwrap(),
        )
    });
}

#[test]
fn get_rows_scatter_adds() {
    let mut rng = Rng::new(8);
    let ps = [P::rand(&[5, 7], &mut rng)];
    assert_grads("get_rows", &ps, &|g, p| {
        let ids = g.input("ids", GgmlType::I32, &[6]).unwrap();
        Built::with(
            g.get_rows(p[0], ids).unwrap(),
            vec![Input::I32(ids, vec![3, 0, 3, 6, 3, 1])],
        )
    });
}

#[test]
fn mul_mat_f32_and_broadcast_batches() {
    let mut rng = Rng::new(9);
    let ps = [P::rand(&[13, 5], &mut rng), P::rand(&[13, 3], &mut rng)];
    assert_grads("mul_mat", &ps, &|g, p| {
        Built::y(g.mul_mat(p[0], p[1]).unwrap())
    });
    let ps = [
        P::rand(&[7, 4, 2, 1], &mut rng),
        P::rand(&[7, 3, 4, 2], &mut rng),
    ];
    assert_grads("mul_mat batched", &ps, &|g, p| {
        Built::y(g.mul_mat(p[0], p[1]).unwrap())
    });
}

#[test]
fn mul_mat_frozen_quantized_weights() {
    let mut rng = Rng::new(10);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::F16] {
        let k = 256;
        let w = common::weight_bytes(ty, k, 5, &mut rng);
        let ps = [P::rand(&[k, 3], &mut rng)];
        let opts = Opts {
            // Strict mode dequantizes exactly; normal mode quantizes activations to Q8.
            deterministic: ty == GgmlType::F16,
            ..Opts::default()
        };
        assert_grads_with(
            &format!("mul_mat {ty}"),
            &ps,
            &|g, p| {
                let wt = g.weight("w", ty, &[k, 5]).unwrap();
                Built {
                    y: g.mul_mat(wt, p[0]).unwrap(),
                    inputs: vec![],
                    weights: vec![(wt, w.clone())],
                }
            },
            &opts,
        );
    }
}

/// Mixture of experts: every expert and activation gradient of `mul_mat_id`, with activations
/// shared by the slots (b1 = 1) or one per slot, experts used twice, once or never; and the
/// routing-weight pick (`take_rows`) with an id repeated in a column.
#[test]
fn mul_mat_id_and_take_rows() {
    let mut rng = Rng::new(15);
    // 3 tokens × 2 slots over 4 experts; expert 3 is never chosen, expert 1 four times.
    let ids = vec![1, 0, 2, 1, 1, 1];
    for b1 in [1, 2] {
        let ps = [
            P::rand(&[7, 5, 4], &mut rng),
            P::rand(&[7, b1, 3], &mut rng),
        ];
        let ids = ids.clone();
        assert_grads(&format!("mul_mat_id b1={b1}"), &ps, &move |g, p| {
            let it = g.input("ids", GgmlType::I32, &[2, 3]).unwrap();
            Built::with(
                g.mul_mat_id(p[0], p[1], it).unwrap(),
                vec![Input::I32(it, ids.clone())],
            )
        });
    }
    let ps = [P::rand(&[6, 4], &mut rng)];
    assert_grads("take_rows", &ps, &|g, p| {
        let it = g.input("ids", GgmlType::I32, &[3, 4]).unwrap();
        Built::with(
            g.take_rows(p[0], it).unwrap(),
            vec![Input::I32(it, vec![5, 0, 2, 1, 1, 3, 0, 4, 0, 2, 2, 2])],
        )
    });
}

/// `mul_mat_id` through frozen quantized experts (QLoRA on a mixture of experts): the
/// activations' gradient dequantizes each chosen expert's rows.
#[test]
fn mul_mat_id_frozen_quantized_experts() {
    let mut rng = Rng::new(16);
    for ty in [GgmlType::Q8_0, GgmlType::Q4K, GgmlType::F16] {
        let k = 256;
        let w = common::weight_bytes(ty, k, 5 * 3, &mut rng);
        let ps = [P::rand(&[k, 1, 2], &mut rng)];
        let opts = Opts {
            // Normal mode quantizes the activations to Q8 for the forward product.
            deterministic: ty == GgmlType::F16,
            ..Opts::default()
        };
        assert_grads_with(
            &format!("mul_mat_id {ty}"),
            &ps,
            &|g, p| {
                let wt = g.weight("w", ty, &[k, 5, 3]).unwrap();
                let it = g.input("ids", GgmlType::I32, &[2, 2]).unwrap();
                Built {
                    y: g.mul_mat_id(wt, p[0], it).unwrap(),
                    inputs: vec![Input::I32(it, vec![2, 0, 0, 0])],
                    weights: vec![(wt, w.clone())],
                }
            },
            &opts,
        );
    }
}

#[test]
fn views_copies_and_concat() {
    let mut rng = Rng::new(11);
    let ps = [P::rand(&[6, 5], &mut rng), P::rand(&[5, 6], &mut rng)];
    assert_grads("transpose + add", &ps, &|g, p| {
        let t = g.transpose(p[0]).unwrap();
        Built::y(g.add(t, p[1]).unwrap())
    });
    let ps = [P::rand(&[6, 5, 2], &mut rng)];
    assert_grads("reshape, permute, cont", &ps, &|g, p| {
        let r = g.reshape(p[0], &[3, 10, 2]).unwrap();
        let q = g.permute(r, [2, 0, 1, 3]).unwrap();
        let c = g.cont(q).unwrap();
        Built::y(g.unary(Unary::Sqr, c).unwrap())
    });
    // A strided window (rows 1..4, columns 2..5) of a [6, 5] tensor: view_back.
    let ps = [P::rand(&[6, 5], &mut rng)];
    assert_grads("view window", &ps, &|g, p| {
        let v = g.view(p[0], &[3, 3], &[6 * 4], (6 + 2) * 4).unwrap();
        Built::y(g.unary(Unary::Sqr, v).unwrap())
    });
    // A view of a permuted view (non-contiguous, nested strides): view_back decomposes.
    let ps = [P::rand(&[4, 3, 2], &mut rng)];
    assert_grads("view of permute", &ps, &|g, p| {
        let s = g.permute(p[0], [0, 2, 1, 3]).unwrap(); // [4, 2, 3], strides (4, 48, 16)
        let v = g.view(s, &[4, 3], &[16], 48).unwrap(); // s[:, 1, :]
        Built::y(g.unary(Unary::Sqr, v).unwrap())
    });
    // View rows that run across rows of the source (elements 1..7 and 5..11 of a [4, 5]
    // tensor) and overlap: view_back's row path falls back to elements where it must.
    let ps = [P::rand(&[4, 5], &mut rng)];
    assert_grads("view across rows", &ps, &|g, p| {
        let v = g.view(p[0], &[6, 2], &[4 * 4], 4).unwrap();
        Built::y(g.unary(Unary::Sqr, v).unwrap())
    });
    let ps = [P::rand(&[4, 3], &mut rng), P::rand(&[4, 3], &mut rng)];
    assert_grads("cpy", &ps, &|g, p| {
        let s = g.unary(Unary::Sqr, p[0]).unwrap();
        let dst = g.scale(p[1], 1.0).unwrap();
        let c = g.cpy(s, dst).unwrap();
        Built::y(g.scale(c, 2.0).unwrap())
    });
    for dim in [0, 1, 2] {
        let mut nb = [3, 4, 2];
        nb[dim] = 5;
        let ps = [P::rand(&[3, 4, 2], &mut rng), P::rand(&nb, &mut rng)];
        assert_grads(&format!("concat dim {dim}"), &ps, &|g, p| {
            Built::y(g.concat(p[0], p[1], dim).unwrap())
        });
    }
}

#[test]
fn reductions_and_out_prod() {
    let mut rng = Rng::new(12);
    assert_grads("sum", &[P::rand(&[5, 3, 2], &mut rng)], &|g, p| {
        Built::y(g.sum(p[0]).unwrap())
    });
    assert_grads("sum_sq", &[P::rand(&[37, 3], &mut rng)], &|g, p| {
        Built::y(g.sum_sq(p[0]).unwrap())
    });
    assert_grads("sum_rows", &[P::rand(&[5, 3, 2], &mut rng)], &|g, p| {
        Built::y(g.sum_rows(p[0]).unwrap())
    });
    assert_grads("mean", &[P::rand(&[5, 3, 2], &mut rng)], &|g, p| {
        Built::y(g.mean(p[0]).unwrap())
    });
    assert_grads(
        "repeat, reduce_to",
        &[P::rand(&[3, 2], &mut rng)],
        &|g, p| {
            let r = g.repeat(p[0], &[6, 4, 2]).unwrap();
            let s = g.unary(Unary::Sqr, r).unwrap();
            Built::y(g.reduce_to(s, &[3, 4]).unwrap())
        },
    );
    // Whole rows into one (bias gradients): rows of 70 (two 64-sum chunks), batches.
    for shape in [[70usize, 3, 2], [5, 7, 1]] {
        let ps = [P::rand(&shape, &mut rng)];
        assert_grads(&format!("reduce_to one row {shape:?}"), &ps, &|g, p| {
            let s = g.unary(Unary::Sqr, p[0]).unwrap();
            Built::y(g.reduce_to(s, &[shape[0]]).unwrap())
        });
    }
    let ps = [P::rand(&[5, 4, 2], &mut rng), P::rand(&[3, 4, 2], &mut rng)];
    assert_grads("out_prod", &ps, &|g, p| {
        Built::y(g.out_prod(p[0], p[1]).unwrap())
    });
    // The first operand broadcast over batches (its gradient only).
    let ps = [P::rand(&[5, 4, 1, 2], &mut rng)];
    assert_grads("out_prod broadcast", &ps, &|g, p| {
        let b = g.input("b", F32, &[3, 4, 3, 2]).unwrap();
        let vals = Rng::new(5).vec(3 * 4 * 6);
        Built::with(g.out_prod(p[0], b).unwrap(), vec![Input::F32(b, vals)])
    });
}

#[test]
fn cross_entropy_with_masked_labels() {
    let mut rng = Rng::new(13);
    let ps = [P::uniform(&[11, 5], -3.0, 3.0, &mut rng)];
    // The loss is one f32: a larger step keeps its rounding small next to the difference.
    let opts = Opts {
        h: 1e-2,
        ..Opts::default()
    };
    let build = |g: &mut tinynn_core::graph::Graph, p: &[tinynn_core::tensor::TensorId]| {
        let labels = g.input("labels", GgmlType::I32, &[5]).unwrap();
        Built::with(
            g.cross_entropy_loss(p[0], labels).unwrap(),
            vec![Input::I32(labels, vec![3, -1, 10, 0, 3])],
        )
    };
    assert_grads_with("cross_entropy_loss", &ps, &build, &opts);
    // Rows past 16 values (the vectorized softmax sums), labels inside and after the chunks.
    let ps = [P::uniform(&[37, 4], -3.0, 3.0, &mut rng)];
    let build = |g: &mut tinynn_core::graph::Graph, p: &[tinynn_core::tensor::TensorId]| {
        let labels = g.input("labels", GgmlType::I32, &[4]).unwrap();
        Built::with(
            g.cross_entropy_loss(p[0], labels).unwrap(),
            vec![Input::I32(labels, vec![20, 36, -1, 0])],
        )
    };
    assert_grads_with("cross_entropy_loss, 37 classes", &ps, &build, &opts);
}

/// Mamba: the depthwise convolution (input with its state columns, and weights) and the
/// selective scan (initial state, x, dt, A, B and C, through both the outputs and the final
/// states), over two sequences.
#[test]
fn ssm_conv_and_scan() {
    let mut rng = Rng::new(17);
    let ps = [
        P::rand(&[3 + 5, 6, 2], &mut rng),
        P::rand(&[4, 6], &mut rng),
    ];
    assert_grads("ssm_conv", &ps, &|g, p| {
        Built::y(g.ssm_conv(p[0], p[1]).unwrap())
    });
    let ps = [
        P::rand(&[4, 6, 2], &mut rng),
        P::rand(&[6, 5, 2], &mut rng),
        P::rand(&[6, 5, 2], &mut rng),
        P::rand(&[4, 6], &mut rng),
        P::rand(&[4, 5, 2], &mut rng),
        P::rand(&[4, 5, 2], &mut rng),
    ];
    assert_grads("ssm_scan", &ps, &|g, p| {
        Built::y(g.ssm_scan(p[0], p[1], p[2], p[3], p[4], p[5]).unwrap())
    });
}
