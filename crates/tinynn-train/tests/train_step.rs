//! The trainer's step semantics on the tiny Llama fixture: gradient accumulation equals one big
//! batch, non-finite steps are skipped with weights and moments untouched, clipping bounds the
//! update, bad input is a typed error.

mod common;

use common::{expected, fixture_dir, rel_err, train_config, Expected};
use tinynn_format::model_dir::HfModelDir;
use tinynn_train::{NamedTensor, Optimizer, TrainConfig, TrainError, Trainer};

const NAME: &str = "train-llama";

fn trainer(cfg: TrainConfig) -> Trainer {
    let dir = HfModelDir::open(fixture_dir(NAME)).unwrap();
    Trainer::new(&dir, cfg).unwrap()
}

/// Plain SGD (no momentum, no decay): the update is exactly `-lr · grad`.
fn sgd(e: &Expected, batch: usize, accum: usize, clip: Option<f32>) -> TrainConfig {
    TrainConfig {
        batch,
        accum,
        clip,
        optimizer: Optimizer::Sgd {
            momentum: 0.0,
            weight_decay: 0.0,
        },
        ..train_config(e, 2, false)
    }
}

/// The fixture's ids with every position scored (so every micro-batch's mean has equal weight).
fn all_scored(e: &Expected) -> Vec<i32> {
    let mut labels = e.ids[1..].to_vec();
    labels.push(e.ids[0]);
    labels
}

fn max_rel(a: &[NamedTensor], b: &[NamedTensor]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| rel_err(&x.data, &y.data))
        .fold(0.0, tinynn_core::measure::nan_max)
}

#[test]
fn two_micro_batches_of_one_equal_one_batch_of_two() {
    let e = expected(NAME);
    let labels = all_scored(&e);
    let mut one = trainer(sgd(&e, 2, 1, None));
    let mut two = trainer(sgd(&e, 1, 2, None));
    let start = one.params().unwrap();
    let r1 = one.step(&e.ids, &labels, 0.5).unwrap();
    let r2 = two.step(&e.ids, &labels, 0.5).unwrap();
    let rel = f64::from((r1.loss - r2.loss).abs() / r1.loss);
    let norm = f64::from((r1.grad_norm - r2.grad_norm).abs() / r1.grad_norm);
    println!("accumulation: loss rel {rel:.2e}, grad norm rel {norm:.2e}");
    assert!(rel < 1e-6 && norm < 1e-5, "{r1:?} vs {r2:?}");
    // Compare the updates themselves (weights after minus before).
    let delta = |t: &Trainer| -> Vec<NamedTensor> {
        t.params()
            .unwrap()
            .into_iter()
            .zip(&start)
            .map(|(mut p, s)| {
                p.data.iter_mut().zip(&s.data).for_each(|(a, b)| *a -= b);
                p
            })
            .collect()
    };
    let err = max_rel(&delta(&one), &delta(&two));
    println!("accumulation: max per-tensor update rel {err:.2e}");
    assert!(err < 1e-4, "updates differ by {err:.3e}");
    // A second step works the same (the buffers were reset).
    let (a, b) = (
        one.step(&e.ids, &labels, 0.5).unwrap(),
        two.step(&e.ids, &labels, 0.5).unwrap(),
    );
    assert!((a.loss - b.loss).abs() / a.loss < 1e-5, "{a:?} vs {b:?}");
    assert!(a.loss < r1.loss);
}

#[test]
fn a_non_finite_loss_skips_the_update_and_keeps_the_moments() {
    let e = expected(NAME);
    let mut t = trainer(train_config(&e, 2, false));
    let first = t.step(&e.ids, &e.labels, 1e-3).unwrap();
    assert!(!first.skipped && first.step == 1);
    let good = t.params().unwrap();
    let moments = t.optimizer_state().unwrap();
    // Poison one weight: the loss and the gradient turn NaN.
    let mut bad = good[1].clone();
    bad.data[0] = f32::NAN;
    t.load_params(std::slice::from_ref(&bad)).unwrap();
    let r = t.step(&e.ids, &e.labels, 1e-3).unwrap();
    assert!(r.skipped && !r.loss.is_finite(), "{r:?}");
    assert_eq!(r.step, 1);
    let after = t.params().unwrap();
    for (a, b) in after.iter().zip(&good) {
        let same = a
            .data
            .iter()
            .zip(&b.data)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same || a.name == bad.name, "{} changed", a.name);
    }
    assert_eq!(t.optimizer_state().unwrap(), moments, "moments changed");
    // Restored, training continues from the same state.
    t.load_params(std::slice::from_ref(&good[1])).unwrap();
    let r = t.step(&e.ids, &e.labels, 1e-3).unwrap();
    assert!(!r.skipped && r.step == 2 && r.loss < first.loss, "{r:?}");
}

#[test]
fn clipping_bounds_the_global_gradient_norm() {
    let e = expected(NAME);
    let max = 1e-2f32;
    let mut t = trainer(sgd(&e, 2, 1, Some(max)));
    let before = t.params().unwrap();
    let r = t.step(&e.ids, &e.labels, 1.0).unwrap();
    assert!(
        r.grad_norm > 10.0 * max,
        "the test needs a larger gradient: {r:?}"
    );
    // With lr 1 the update is the clipped gradient: its norm is `max`.
    let sq: f64 = t
        .params()
        .unwrap()
        .iter()
        .zip(&before)
        .flat_map(|(a, b)| {
            a.data
                .iter()
                .zip(&b.data)
                .map(|(x, y)| f64::from(x - y).powi(2))
        })
        .sum();
    let norm = sq.sqrt();
    println!(
        "clipped update norm {norm} (max {max}, gradient norm {})",
        r.grad_norm
    );
    assert!((norm / f64::from(max) - 1.0).abs() < 1e-3, "{norm}");
}

#[test]
fn sgd_with_momentum_lowers_the_loss() {
    let e = expected(NAME);
    let mut t = trainer(TrainConfig {
        optimizer: Optimizer::Sgd {
            momentum: 0.9,
            weight_decay: 0.0,
        },
        ..train_config(&e, 2, false)
    });
    let first = t.step(&e.ids, &e.labels, 0.05).unwrap().loss;
    let mut last = first;
    for _ in 0..5 {
        last = t.step(&e.ids, &e.labels, 0.05).unwrap().loss;
    }
    assert!(last < 0.9 * first, "{first} → {last}");
    let state = t.optimizer_state().unwrap();
    assert_eq!(state.step, 6);
    assert!(state.tensors[0].name.starts_with("sgd_vel."));
}

#[test]
fn eval_loss_equals_the_step_loss_and_changes_nothing() {
    let e = expected(NAME);
    let mut t = trainer(train_config(&e, 2, false));
    let before = t.params().unwrap();
    let eval = t.eval_loss(&e.ids, &e.labels).unwrap();
    assert_eq!(t.params().unwrap(), before);
    let r = t.step(&e.ids, &e.labels, 1e-3).unwrap();
    assert_eq!(eval, r.loss);
    assert!(t.eval_loss(&e.ids, &e.labels).unwrap() < eval);
}

#[test]
fn bad_input_is_a_typed_error() {
    let e = expected(NAME);
    let mut t = trainer(train_config(&e, 2, false));
    let short = &e.ids[..5];
    assert!(matches!(
        t.step(short, short, 1e-3),
        Err(TrainError::Batch(_))
    ));
    let mut ids = e.ids.clone();
    ids[3] = 100_000;
    assert!(matches!(
        t.step(&ids, &e.labels, 1e-3),
        Err(TrainError::Batch(_))
    ));
    assert!(matches!(
        t.step(&e.ids, &e.labels, f32::NAN),
        Err(TrainError::Invalid(_))
    ));
    let wrong = NamedTensor {
        name: "token_embd.weight".into(),
        dims: vec![3],
        data: vec![0.0; 3],
    };
    assert!(matches!(
        t.load_params(&[wrong]),
        Err(TrainError::Param { .. })
    ));
    let dir = HfModelDir::open(fixture_dir(NAME)).unwrap();
    let zero = TrainConfig {
        seq: 0,
        ..train_config(&e, 1, false)
    };
    assert!(matches!(
        Trainer::new(&dir, zero),
        Err(TrainError::Invalid(_))
    ));
    // Nothing was half-done: a good step still works.
    assert!(!t.step(&e.ids, &e.labels, 1e-3).unwrap().skipped);
}
