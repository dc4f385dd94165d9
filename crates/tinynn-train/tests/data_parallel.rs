//! Data-parallel training (`train_loop::fit_data_parallel`) with ranks that are threads of this
//! process (`collective::ThreadGroup`): the same checks the MPI test makes with processes,
//! without MPI.
//!
//! - 2 ranks × batch 2 take the steps 1 process × batch 4 takes, for full fine-tuning and LoRA,
//!   with gradient accumulation and labels masked unevenly across the ranks (so each rank's
//!   loss must be normalized by the group's count): per-step losses and final weights within
//!   1e-5 (relative); 3 ranks × batch 1 against batch 3 too.
//! - A resume with the same ranks repeats the uninterrupted run bit for bit.
//! - A stop request on one rank stops every rank after the same step.
//! - Ranks with different settings, or a batcher of the wrong size, are errors on every rank.

mod common;

use std::path::Path;
use std::sync::atomic::AtomicBool;

use common::tiny_llama::{self, V};
use tinynn_train::collective::{Collective, Solo, ThreadGroup};
use tinynn_train::data::{
    BatchConfig, Batcher, DataError, EvalSplit, FnEncoder, PackedText, Sequences, SourceStats,
    IGNORE,
};
use tinynn_train::metrics::{self, StepMetrics};
use tinynn_train::train_loop::{fit_data_parallel, LoopConfig, LoopOutcome, Output};
use tinynn_train::{
    LoraConfig, NamedTensor, Targets, TrainConfig, TrainError, Trainer, OVERLAP_BYTES,
};

const SEQ: usize = 16;

/// Packed text whose labels are masked at positions that depend on the sequence number (some
/// sequences keep 3 of 16, others all): the ranks' shards score different counts.
struct Masked(PackedText);

impl Sequences for Masked {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn seq_len(&self) -> usize {
        self.0.seq_len()
    }
    fn read(&self, i: usize, inputs: &mut [i32], labels: &mut [i32]) -> Result<(), DataError> {
        self.0.read(i, inputs, labels)?;
        let keep_from = [0, 13, 7, 2, 10][i % 5];
        for l in &mut labels[..keep_from] {
            *l = IGNORE;
        }
        Ok(())
    }
    fn stats(&self) -> SourceStats {
        self.0.stats()
    }
}

fn batcher(batch: usize) -> Batcher {
    let text = "the program is distributed in the hope that it will be useful, \
                but without any warranty. "
        .repeat(16);
    let enc = FnEncoder(|s: &str| s.bytes().map(|b| u32::from(b) % V as u32).collect());
    let docs = [(Path::new("mem.txt"), text)];
    let source = PackedText::from_documents(docs, &enc, 1, SEQ).unwrap();
    let cfg = BatchConfig {
        batch,
        shuffle: true,
        seed: 5,
        eval: EvalSplit::Last { fraction: 0.25 },
    };
    Batcher::new(Box::new(Masked(source)), cfg).unwrap()
}

fn trainer(batch: usize, lora: bool, overlap_bytes: usize) -> Trainer {
    let cfg = TrainConfig {
        overlap_bytes,
        seq: SEQ,
        batch,
        accum: 2,
        threads: 1,
        clip: Some(1.0),
        lora: lora.then(|| LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.0,
            targets: Targets::parse("q,v,down").unwrap(),
            seed: 3,
        }),
        ..TrainConfig::default()
    };
    let mut t = Trainer::new(tiny_llama::random(64, 7), cfg).unwrap();
    // A random model has no file's metadata to carry into its export.
    t.set_export_metadata(Vec::new());
    t
}

fn config(out: &Path, steps: u64, lora: bool) -> LoopConfig {
    let mut cfg = LoopConfig::new(out, steps);
    cfg.lr = 5e-3;
    cfg.eval_every = 5;
    cfg.save_every = 3;
    cfg.output = match lora {
        true => Output::Adapter { merge: false },
        false => Output::Model,
    };
    cfg.run_identity = serde_json::json!({ "test": "data_parallel", "lora": lora });
    cfg
}

struct Run {
    outcome: LoopOutcome,
    /// Rank 0's metrics log.
    metrics: Vec<StepMetrics>,
    params: Vec<NamedTensor>,
}

/// Trains `steps` steps as `ranks` threads of batch `global / ranks`; rank 0's outcome and
/// every rank's final parameters (which must be identical).
fn run(ranks: usize, global: usize, lora: bool, out: &Path, steps: u64, resume: bool) -> Run {
    run_overlapping(ranks, global, lora, out, steps, resume, OVERLAP_BYTES)
}

/// [`run`], with at most `overlap` bytes of gradients reduced during the backward pass.
fn run_overlapping(
    ranks: usize,
    global: usize,
    lora: bool,
    out: &Path,
    steps: u64,
    resume: bool,
    overlap: usize,
) -> Run {
    let handles: Vec<_> = ThreadGroup::new(ranks)
        .into_iter()
        .map(|mut comm| {
            let out = out.to_path_buf();
            std::thread::spawn(move || {
                let mut t = trainer(global / ranks, lora, overlap);
                let mut b = batcher(global);
                let mut cfg = config(&out, steps, lora);
                cfg.resume = resume;
                let stop = AtomicBool::new(false);
                let comm: &mut dyn Collective = if ranks == 1 { &mut Solo } else { &mut comm };
                let outcome = fit_data_parallel(&mut t, &mut b, &cfg, &stop, &mut (), comm)
                    .unwrap_or_else(|e| panic!("rank of {ranks}: {e}"));
                Run {
                    outcome,
                    metrics: metrics::read(&out.join("metrics.jsonl")).unwrap_or_default(),
                    params: t.params().unwrap(),
                }
            })
        })
        .collect();
    let mut runs: Vec<Run> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for r in &runs[1..] {
        assert_eq!(r.params, runs[0].params, "the ranks' weights differ");
        assert_eq!(r.outcome.steps, runs[0].outcome.steps);
    }
    runs.swap_remove(0)
}

fn losses(out: &Path) -> Vec<StepMetrics> {
    metrics::read(&out.join("metrics.jsonl")).unwrap()
}

fn rel(a: f64, b: f64) -> f64 {
    let d = (a - b).abs() / a.abs().max(b.abs()).max(1e-30);
    if d.is_nan() {
        f64::INFINITY
    } else {
        d
    }
}

/// The largest relative difference of two sets of weights, tensor by tensor: ‖a − b‖₂ / ‖a‖₂.
fn weights_rel(a: &[NamedTensor], b: &[NamedTensor]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mut worst = 0f64;
    for (x, y) in a.iter().zip(b) {
        assert_eq!((&x.name, &x.dims), (&y.name, &y.dims));
        let (mut d2, mut n2) = (0f64, 0f64);
        for (&p, &q) in x.data.iter().zip(&y.data) {
            d2 += (f64::from(p) - f64::from(q)).powi(2);
            n2 += f64::from(p).powi(2);
        }
        let d = (d2 / n2.max(1e-300)).sqrt();
        worst = if d.is_nan() {
            f64::INFINITY
        } else {
            worst.max(d)
        };
    }
    worst
}

fn equivalence(ranks: usize, global: usize, lora: bool) {
    let (one, many) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = run(1, global, lora, one.path(), 10, false);
    let b = run(ranks, global, lora, many.path(), 10, false);
    let (la, lb) = (losses(one.path()), losses(many.path()));
    assert_eq!(la.len(), lb.len());
    assert!(la.len() >= 10);
    for (x, y) in la.iter().zip(&lb) {
        assert_eq!(x.step, y.step);
        let d = rel(f64::from(x.loss), f64::from(y.loss));
        assert!(
            d < 1e-5,
            "step {}: loss {} vs {} (rel {d:e})",
            x.step,
            x.loss,
            y.loss
        );
        if let (Some(e), Some(f)) = (x.eval_loss, y.eval_loss) {
            assert!(rel(f64::from(e), f64::from(f)) < 1e-5, "eval {e} vs {f}");
        }
        assert_eq!(x.eval_loss.is_some(), y.eval_loss.is_some());
        if let (Some(g), Some(h)) = (x.grad_norm, y.grad_norm) {
            assert!(
                rel(f64::from(g), f64::from(h)) < 1e-4,
                "grad norm {g} vs {h}"
            );
        }
    }
    let w = weights_rel(&a.params, &b.params);
    eprintln!("{ranks} ranks, lora {lora}: weights differ by {w:e} (relative L2, worst tensor)");
    assert!(
        w < 1e-5,
        "{ranks} ranks, lora {lora}: weights differ by {w:e}"
    );
    assert_eq!(a.outcome.summary.tokens, b.outcome.summary.tokens);
    assert_eq!(b.outcome.summary.ranks, ranks);
    assert!(b.outcome.checkpoint.is_some() && !b.outcome.files.is_empty());
}

#[test]
fn two_ranks_of_batch_2_take_the_steps_of_one_process_of_batch_4() {
    equivalence(2, 4, false);
}

#[test]
fn two_ranks_train_the_same_lora_adapter_as_one_process() {
    equivalence(2, 4, true);
}

#[test]
fn three_ranks_of_batch_1_take_the_steps_of_one_process_of_batch_3() {
    equivalence(3, 3, false);
}

#[test]
fn a_resume_with_the_same_ranks_repeats_the_run_bit_for_bit() {
    for lora in [false, true] {
        let (straight, split) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let whole = run(2, 4, lora, straight.path(), 8, false);
        run(2, 4, lora, split.path(), 4, false);
        let resumed = run(2, 4, lora, split.path(), 8, true);
        assert_eq!(resumed.params, whole.params, "lora {lora}");
        let (a, b) = (losses(straight.path()), losses(split.path()));
        // Step entries only: a run's final eval is an entry of its own.
        let bits = |m: &[StepMetrics]| -> Vec<(u64, u32)> {
            m.iter()
                .filter(|m| m.grad_norm.is_some())
                .map(|m| (m.step, m.loss.to_bits()))
                .collect()
        };
        assert_eq!(bits(&a), bits(&b));
        assert!(resumed.outcome.resumed_from.is_some());
    }
}

#[test]
fn a_stop_on_one_rank_stops_every_rank_after_the_same_step() {
    let out = tempfile::tempdir().unwrap();
    let handles: Vec<_> = ThreadGroup::new(2)
        .into_iter()
        .map(|mut comm| {
            let out = out.path().to_path_buf();
            std::thread::spawn(move || {
                let mut t = trainer(2, false, OVERLAP_BYTES);
                let mut b = batcher(4);
                let cfg = config(&out, 10, false);
                // Only rank 1 is asked to stop (as if only its process got the signal).
                let stop = AtomicBool::new(comm.rank() == 1);
                fit_data_parallel(&mut t, &mut b, &cfg, &stop, &mut (), &mut comm).unwrap()
            })
        })
        .collect();
    let outcomes: Vec<LoopOutcome> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for o in &outcomes {
        assert!(o.interrupted);
        assert_eq!(o.steps, 1, "the vote rides on the first step's reduction");
    }
    let ck = outcomes[0].checkpoint.as_ref().expect("rank 0 saves");
    assert!(ck.is_file());
    assert!(outcomes[1].checkpoint.is_none(), "only rank 0 writes");
}

#[test]
fn ranks_that_disagree_or_a_wrong_batch_are_errors_on_every_rank() {
    let out = tempfile::tempdir().unwrap();
    let spawn = |global: usize, differ: bool| {
        let handles: Vec<_> = ThreadGroup::new(2)
            .into_iter()
            .map(|mut comm| {
                let out = out.path().to_path_buf();
                std::thread::spawn(move || {
                    let mut t = trainer(2, false, OVERLAP_BYTES);
                    let mut b = batcher(global);
                    let mut cfg = config(&out, 2, false);
                    if differ && comm.rank() == 1 {
                        cfg.run_identity = serde_json::json!({ "test": "other" });
                    }
                    let stop = AtomicBool::new(false);
                    fit_data_parallel(&mut t, &mut b, &cfg, &stop, &mut (), &mut comm)
                        .map(|_| ())
                        .unwrap_err()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<TrainError>>()
    };
    for e in spawn(4, true) {
        assert!(
            matches!(&e, TrainError::Collective(m) if m.contains("the run's settings")),
            "{e}"
        );
    }
    for e in spawn(2, false) {
        let msg = e.to_string();
        assert!(msg.contains("2 ranks of batch 2 need 4"), "{msg}");
    }
    assert!(
        !out.path().join("metrics.jsonl").exists(),
        "nothing is written"
    );
}

/// Summing each gradient during the backward pass as soon as it is final, some of them
/// (a staging budget smaller than the gradients), or all after the pass: the same sums, so
/// the same run bit for bit; the time in the sums is counted either way.
#[test]
fn reducing_during_the_backward_pass_changes_no_bit() {
    for lora in [false, true] {
        let mut runs = Vec::new();
        for overlap in [OVERLAP_BYTES, 6 << 10, 0] {
            let dir = tempfile::tempdir().unwrap();
            let r = run_overlapping(2, 4, lora, dir.path(), 4, false, overlap);
            let s = &r.outcome.summary;
            assert!(s.reduce_comm_secs > 0.0 && s.reduce_secs > 0.0, "{s:?}");
            runs.push(r);
        }
        let bits = |r: &Run| -> Vec<(u64, u32)> {
            r.metrics
                .iter()
                .map(|m| (m.step, m.loss.to_bits()))
                .collect()
        };
        for r in &runs[1..] {
            assert_eq!(bits(r), bits(&runs[0]), "lora {lora}");
            assert!(
                r.params == runs[0].params,
                "lora {lora}: the weights differ"
            );
        }
    }
}
