//! A backward taken in parts (`Graph::backward_to` per chunk of a loss, then
//! `Graph::backward_from` for the rest) gives the gradients of the whole backward: here a tied
//! embedding/head whose cross-entropy is split into chunks of tokens with
//! `cross_entropy_loss_normalized`, as the trainer's head does, with masked labels.

mod common;

use common::{run, Input, Rng};
use tinynn_core::graph::Graph;
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

const E: usize = 8;
const V: usize = 20;
const N: usize = 10;

struct Model {
    g: Graph,
    emb: TensorId,
    w: TensorId,
    h: TensorId,
    tokens: TensorId,
    labels: TensorId,
}

fn model() -> Model {
    let mut g = Graph::new();
    let emb = g.input("emb", GgmlType::F32, &[E, V]).unwrap();
    let w = g.input("w", GgmlType::F32, &[E, E]).unwrap();
    let tokens = g.input("tokens", GgmlType::I32, &[N]).unwrap();
    let labels = g.input("labels", GgmlType::I32, &[N]).unwrap();
    let x = g.get_rows(emb, tokens).unwrap(); // [E, N]
    let h = g.mul_mat(w, x).unwrap();
    let h = g.silu(h).unwrap(); // [E, N]
    Model {
        g,
        emb,
        w,
        h,
        tokens,
        labels,
    }
}

#[test]
fn a_chunked_head_backward_equals_the_whole_one() {
    let mut rng = Rng::new(5);
    let emb_v: Vec<f32> = rng.vec(E * V);
    let w_v: Vec<f32> = rng.vec(E * E);
    let tok: Vec<i32> = (0..N as i32).map(|i| (i * 7 + 3) % V as i32).collect();
    let lab: Vec<i32> = vec![1, -1, 4, 19, 0, 7, -1, 3, 3, 12];
    let scored = lab.iter().filter(|&&l| l >= 0).count() as f32;

    // The whole loss and its backward.
    let mut m = model();
    let logits = m.g.mul_mat(m.emb, m.h).unwrap();
    let loss = m.g.cross_entropy_loss(logits, m.labels).unwrap();
    let whole = m.g.backward(loss, &[m.emb, m.w]).unwrap();
    let inputs = |m: &Model| {
        vec![
            Input::F32(m.emb, emb_v.clone()),
            Input::F32(m.w, w_v.clone()),
            Input::I32(m.tokens, tok.clone()),
            Input::I32(m.labels, lab.clone()),
        ]
    };
    let want_loss = run(&m.g, loss, &inputs(&m), &[], 1);
    let want: Vec<Vec<f32>> = whole
        .iter()
        .map(|&t| run(&m.g, t, &inputs(&m), &[], 1))
        .collect();

    // Chunks of 4, 4 and 2 tokens, each differentiated as soon as it is scored.
    let mut c = model();
    let norm = c.g.input("norm", GgmlType::F32, &[1]).unwrap();
    let (mut total, mut dh, mut demb) = (None, None, None);
    for (c0, len) in [(0, 4), (4, 4), (8, 2)] {
        let g = &mut c.g;
        let hc = g.view(c.h, &[E, len], &[E * 4], c0 * E * 4).unwrap();
        let lc = g.view(c.labels, &[len], &[], c0 * 4).unwrap();
        let lg = g.mul_mat(c.emb, hc).unwrap();
        let l = g.cross_entropy_loss_normalized(lg, lc, norm).unwrap();
        total = Some(match total {
            Some(t) => g.add(t, l).unwrap(),
            None => l,
        });
        let d = g.backward_to(l, &[hc, c.emb], 1.0).unwrap();
        let (dhc, de) = (d[0].unwrap(), d[1].unwrap());
        dh = Some(match dh {
            Some(a) => g.concat(a, dhc, 1).unwrap(),
            None => dhc,
        });
        demb = Some(match demb {
            Some(a) => g.add(a, de).unwrap(),
            None => de,
        });
    }
    let seeds = [(c.h, dh.unwrap()), (c.emb, demb.unwrap())];
    let parts = c.g.backward_from(&seeds, &[c.emb, c.w]).unwrap();
    let mut ins = inputs(&c);
    ins.push(Input::F32(norm, vec![scored]));
    let got_loss = run(&c.g, total.unwrap(), &ins, &[], 2);
    assert!((got_loss[0] - want_loss[0]).abs() <= 1e-6 * want_loss[0].abs());
    for ((&t, w), name) in parts.iter().zip(&want).zip(["emb", "w"]) {
        let got = run(&c.g, t, &ins, &[], 2);
        let scale = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        let err = got
            .iter()
            .zip(w)
            .fold(0f32, |a, (g, w)| a.max((g - w).abs()));
        assert!(err <= 1e-6 * scale, "{name}: max error {err} of {scale}");
    }
    // The parts cannot start from nothing.
    assert!(c.g.backward_from(&[], &[c.w]).is_err());
}
