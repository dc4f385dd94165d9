//! The training loop as a library (`train_loop::fit`) end to end on a tiny random Llama with a
//! LoRA adapter (dropout on, two micro-batches per step): the observer sees every event in
//! order; a stop flag set mid-run writes a checkpoint and returns an interrupted outcome; a
//! resume from it repeats the uninterrupted run bit for bit (losses, metrics log, weights,
//! adapter file); non-finite steps, a foreign checkpoint and an adapter export without LoRA are
//! typed errors.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use common::tiny_llama::{self, V};
use tinynn_train::data::{BatchConfig, Batcher, EvalSplit, FnEncoder, PackedText};
use tinynn_train::metrics::{self, StepMetrics};
use tinynn_train::train_loop::{
    fit, CheckpointEvent, EvalEvent, EvalKind, LoopConfig, LoopObserver, LoopOutcome, LoopStart,
    Output, SaveReason, TrainSummary,
};
use tinynn_train::{LoraConfig, Targets, TrainConfig, TrainError, Trainer};

const SEQ: usize = 16;

fn trainer(lora: bool) -> Trainer {
    let cfg = TrainConfig {
        seq: SEQ,
        batch: 2,
        accum: 2,
        threads: 2,
        lora: lora.then(|| LoraConfig {
            rank: 4,
            alpha: 8.0,
            dropout: 0.1,
            targets: Targets::parse("q,v,down").unwrap(),
            seed: 3,
        }),
        ..TrainConfig::default()
    };
    Trainer::new(tiny_llama::random(64, 7), cfg).unwrap()
}

fn batcher() -> Batcher {
    let text = "the program is distributed in the hope that it will be useful. ".repeat(12);
    // One token per byte, folded into the tiny vocabulary.
    let enc = FnEncoder(|s: &str| s.bytes().map(|b| u32::from(b) % V as u32).collect());
    let docs = [(Path::new("mem.txt"), text)];
    let source = PackedText::from_documents(docs, &enc, 1, SEQ).unwrap();
    let cfg = BatchConfig {
        batch: 2,
        shuffle: true,
        seed: 3,
        eval: EvalSplit::Last { fraction: 0.2 },
    };
    Batcher::new(Box::new(source), cfg).unwrap()
}

fn config(out: &Path, steps: u64) -> LoopConfig {
    let mut cfg = LoopConfig::new(out, steps);
    cfg.lr = 5e-3;
    cfg.eval_every = 2;
    cfg.save_every = 2;
    cfg.output = Output::Adapter { merge: false };
    cfg.run_identity = serde_json::json!({ "test": "train_loop", "seed": 3 });
    cfg
}

#[derive(Clone, Debug, PartialEq)]
enum Event {
    Start(u64),
    Step { step: u64, loss: u32, skipped: bool },
    Eval(EvalKind, u64),
    Checkpoint(SaveReason, u64),
    Message(String),
    TrainEnd,
    End { interrupted: bool },
}

/// Records every event; sets `stop` after the step `stop_after`.
#[derive(Default)]
struct Recorder {
    events: Vec<Event>,
    stop_after: Option<(u64, Arc<AtomicBool>)>,
}

impl LoopObserver for Recorder {
    fn on_start(&mut self, s: &LoopStart) {
        assert!(s.n_train > 0 && s.n_eval > 0 && s.trainable > 0 && s.memory.total() > 0);
        self.events.push(Event::Start(s.step));
    }
    fn on_step(&mut self, m: &StepMetrics) {
        self.events.push(Event::Step {
            step: m.step,
            loss: m.loss.to_bits(),
            skipped: m.skipped,
        });
        if let Some((at, stop)) = &self.stop_after {
            if m.step == *at {
                stop.store(true, Ordering::SeqCst);
            }
        }
    }
    fn on_eval(&mut self, e: &EvalEvent) {
        assert!(e.loss.is_finite());
        self.events.push(Event::Eval(e.kind, e.step));
    }
    fn on_message(&mut self, msg: &str) {
        self.events.push(Event::Message(msg.to_string()));
    }
    fn on_checkpoint(&mut self, c: &CheckpointEvent) {
        assert!(c.path.is_file(), "{}", c.path.display());
        self.events.push(Event::Checkpoint(c.reason, c.step));
    }
    fn on_train_end(&mut self, _: &TrainSummary) {
        self.events.push(Event::TrainEnd);
    }
    fn on_end(&mut self, o: &LoopOutcome) {
        self.events.push(Event::End {
            interrupted: o.interrupted,
        });
    }
}

impl Recorder {
    /// (step, loss bits) of the steps that were not skipped.
    fn losses(&self) -> Vec<(u64, u32)> {
        self.events
            .iter()
            .filter_map(|e| match *e {
                Event::Step {
                    step,
                    loss,
                    skipped: false,
                } => Some((step, loss)),
                _ => None,
            })
            .collect()
    }

    fn of<T>(&self, f: impl Fn(&Event) -> Option<T>) -> Vec<T> {
        self.events.iter().filter_map(f).collect()
    }
}

/// (step, loss bits, eval loss bits) of every metrics-log entry.
fn log(out: &Path) -> Vec<(u64, u32, Option<u32>)> {
    metrics::read(&out.join("metrics.jsonl"))
        .unwrap()
        .iter()
        .map(|m| (m.step, m.loss.to_bits(), m.eval_loss.map(f32::to_bits)))
        .collect()
}

fn param_bits(t: &Trainer) -> Vec<(String, Vec<u32>)> {
    t.params()
        .unwrap()
        .into_iter()
        .map(|p| (p.name, p.data.iter().map(|x| x.to_bits()).collect()))
        .collect()
}

#[test]
fn fit_reports_events_stops_on_the_flag_and_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let no_stop = AtomicBool::new(false);

    // Uninterrupted: 6 steps.
    let full = dir.path().join("full");
    let (mut t_full, mut b) = (trainer(true), batcher());
    let mut rec = Recorder::default();
    let out = fit(&mut t_full, &mut b, &config(&full, 6), &no_stop, &mut rec).unwrap();
    let full_losses = rec.losses();
    assert_eq!(
        full_losses.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(rec.events[0], Event::Start(0));
    assert_eq!(rec.events[1], Event::Eval(EvalKind::Before, 0));
    let evals = rec.of(|e| match e {
        Event::Eval(k, s) => Some((*k, *s)),
        _ => None,
    });
    assert_eq!(
        evals,
        [
            (EvalKind::Before, 0),
            (EvalKind::Periodic, 2),
            (EvalKind::Periodic, 4),
            (EvalKind::Final, 6)
        ]
    );
    let saves = rec.of(|e| match e {
        Event::Checkpoint(r, s) => Some((*r, *s)),
        _ => None,
    });
    // Step 6 was saved by `save_every`: no second save at the end.
    let periodic = SaveReason::Periodic;
    assert_eq!(saves, [(periodic, 2), (periodic, 4), (periodic, 6)]);
    let n = rec.events.len();
    let adapter = full.join("adapter.gguf");
    assert_eq!(
        rec.events[n - 3..],
        [
            Event::TrainEnd,
            Event::Message(format!("wrote {}", adapter.display())),
            Event::End { interrupted: false },
        ]
    );
    assert!(!out.interrupted && out.resumed_from.is_none());
    assert_eq!((out.steps, out.summary.steps_run), (6, 6));
    assert_eq!(out.summary.tokens, 6 * 2 * 2 * SEQ as u64);
    assert_eq!(
        out.summary.last_loss.map(f32::to_bits),
        Some(full_losses[5].1)
    );
    let (before, after) = (
        out.summary.eval_before.unwrap(),
        out.summary.eval_after.unwrap(),
    );
    assert!(after < before, "held-out loss {before} -> {after}");
    assert_eq!(out.checkpoint, Some(full.join("checkpoint-6.gguf")));
    assert_eq!(out.files, [adapter.clone(), full.join("loss.png")]);
    assert!(out.files.iter().all(|f| f.is_file()));
    // Six steps (evals at 2 and 4 in their entries) and the final eval as an entry of its own.
    let full_log = log(&full);
    assert_eq!(
        full_log.iter().map(|e| e.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6, 6]
    );
    assert!(full_log[1].2.is_some() && full_log[2].2.is_none() && full_log[6].2.is_some());

    // The stop flag, set after step 3, ends the run there with a checkpoint.
    let part = dir.path().join("part");
    let stop = Arc::new(AtomicBool::new(false));
    let mut rec = Recorder {
        stop_after: Some((3, stop.clone())),
        ..Recorder::default()
    };
    let (mut t, mut b) = (trainer(true), batcher());
    let out = fit(&mut t, &mut b, &config(&part, 6), &stop, &mut rec).unwrap();
    assert!(out.interrupted);
    assert_eq!((out.steps, out.summary.steps_run), (3, 3));
    let ckpt = part.join("checkpoint-3.gguf");
    assert_eq!(out.checkpoint.as_deref(), Some(ckpt.as_path()));
    assert!(ckpt.is_file());
    assert_eq!(
        std::fs::read_to_string(part.join("latest")).unwrap().trim(),
        "checkpoint-3.gguf"
    );
    assert_eq!(out.summary.eval_after, None);
    assert!(!part.join("adapter.gguf").exists(), "nothing exported");
    assert_eq!(rec.losses(), full_losses[..3]);
    let n = rec.events.len();
    assert_eq!(
        rec.events[n - 2..],
        [
            Event::Checkpoint(SaveReason::Interrupted, 3),
            Event::End { interrupted: true }
        ]
    );
    assert!(!rec.events.contains(&Event::TrainEnd));

    // Resumed to 6: the same losses, log, weights and adapter file as the uninterrupted run.
    let mut cfg = config(&part, 6);
    cfg.resume = true;
    let (mut t2, mut b) = (trainer(true), batcher());
    let mut rec = Recorder::default();
    let out = fit(&mut t2, &mut b, &cfg, &no_stop, &mut rec).unwrap();
    assert_eq!(out.resumed_from, Some(ckpt));
    assert_eq!((out.steps, out.summary.steps_run), (6, 3));
    assert_eq!(out.summary.eval_before, None);
    assert_eq!(rec.events[1], Event::Start(3));
    assert!(matches!(&rec.events[0], Event::Message(m) if m.starts_with("resumed from")));
    assert_eq!(rec.losses(), full_losses[3..], "resume is bit-exact");
    assert_eq!(log(&part), full_log);
    assert_eq!(param_bits(&t2), param_bits(&t_full));
    assert_ne!(param_bits(&t), param_bits(&t_full), "step 3 is not step 6");
    assert_eq!(
        std::fs::read(part.join("adapter.gguf")).unwrap(),
        std::fs::read(&adapter).unwrap()
    );
}

fn expect_err(cfg: &LoopConfig, lora: bool) -> TrainError {
    let (mut t, mut b) = (trainer(lora), batcher());
    let stop = AtomicBool::new(false);
    fit(&mut t, &mut b, cfg, &stop, &mut ()).unwrap_err()
}

#[test]
fn non_finite_steps_foreign_checkpoints_and_bad_settings_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out: PathBuf = dir.path().join("nan");
    // Three non-finite steps in a row stop the run; checkpoint 2 stays the latest.
    let mut cfg = config(&out, 10);
    cfg.save_every = 1;
    cfg.inject_nan = vec![3, 4, 5];
    let err = expect_err(&cfg, true);
    assert!(
        matches!(
            err,
            TrainError::NonFinite {
                steps: 3,
                last_checkpoint: Some(2)
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("3 non-finite steps in a row; the last checkpoint (step 2) is intact"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("latest")).unwrap().trim(),
        "checkpoint-2.gguf"
    );

    // A directory another live run holds is refused before anything is written; once that
    // run is gone (its lock released), the same call trains, and leaves no lock behind.
    let busy = dir.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    let held = tinynn_train::dir_lock::DirLock::acquire(&busy).unwrap();
    let err = expect_err(&config(&busy, 2), true);
    assert!(
        matches!(err, TrainError::Locked { pid: Some(p), .. } if p == std::process::id()),
        "{err}"
    );
    assert!(
        err.to_string().contains("in use by another training run"),
        "{err}"
    );
    assert!(!busy.join("metrics.jsonl").exists());
    drop(held);
    let (mut t, mut b) = (trainer(true), batcher());
    fit(
        &mut t,
        &mut b,
        &config(&busy, 2),
        &AtomicBool::new(false),
        &mut (),
    )
    .unwrap();
    assert!(!busy.join(tinynn_train::dir_lock::LOCK_FILE).exists());

    // Two are skipped and training goes on.
    let mut cfg = config(&dir.path().join("two"), 3);
    cfg.inject_nan = vec![2, 3];
    let (mut t, mut b) = (trainer(true), batcher());
    let mut rec = Recorder::default();
    let o = fit(&mut t, &mut b, &cfg, &AtomicBool::new(false), &mut rec).unwrap();
    assert_eq!(o.steps, 3);
    let skipped = rec.of(|e| match e {
        Event::Step {
            step,
            skipped: true,
            ..
        } => Some(*step),
        _ => None,
    });
    assert_eq!(skipped, [2, 2]);
    assert_eq!(
        rec.of(|e| match e {
            Event::Message(m) if m.ends_with("update skipped") => Some(()),
            _ => None,
        })
        .len(),
        2
    );

    // A checkpoint holding only some of the run's parameters is refused, not half-loaded.
    let full = tinynn_train::checkpoint::load(&out.join("checkpoint-2.gguf")).unwrap();
    let kept = &full.params[1..];
    let tensors: Vec<_> = kept.iter().map(|n| full.tensor(n).unwrap()).collect();
    let params = tensors
        .iter()
        .map(|t| tinynn_train::checkpoint::TensorRef {
            name: t.name,
            dims: t.dims,
            data: t.data,
        })
        .collect();
    let groups = full
        .groups
        .iter()
        .map(|g| {
            let per: Vec<&[f32]> = kept.iter().map(|n| full.group(g, n).unwrap()).collect();
            (g.clone(), per)
        })
        .collect();
    let partial_dir = dir.path().join("partial");
    std::fs::create_dir_all(&partial_dir).unwrap();
    let partial = tinynn_train::checkpoint::Checkpoint {
        meta: full.meta.clone(),
        params,
        groups,
    };
    tinynn_train::checkpoint::save(&partial_dir, &partial, &Default::default()).unwrap();
    let mut cfg = config(&partial_dir, 10);
    cfg.resume = true;
    let err = expect_err(&cfg, true);
    assert!(
        err.to_string().contains(&format!(
            "the checkpoint lacks parameter '{}' (it holds {} of the run's {})",
            full.params[0],
            kept.len(),
            full.params.len()
        )),
        "{err}"
    );

    // A checkpoint of another run is refused.
    let mut cfg = config(&out, 10);
    cfg.resume = true;
    cfg.run_identity = serde_json::json!({ "test": "another run" });
    let err = expect_err(&cfg, true);
    assert!(matches!(err, TrainError::ResumeMismatch { .. }), "{err}");
    assert!(err.to_string().contains("other settings"), "{err}");

    // Settings refused before anything runs.
    let fresh = dir.path().join("fresh");
    let err = expect_err(&config(&fresh, 2), false);
    assert!(matches!(err, TrainError::Invalid(_)), "{err}");
    let mut cfg = config(&fresh, 2);
    cfg.export_type = tinynn_format::GgmlType::Q8_0;
    assert!(matches!(expect_err(&cfg, true), TrainError::Unsupported(_)));
    let mut cfg = config(&fresh, 2);
    cfg.schedule = tinynn_train::train_loop::ScheduleKind::Cosine;
    cfg.warmup = 5;
    assert!(matches!(expect_err(&cfg, true), TrainError::Schedule(_)));
    assert!(!fresh.exists());
}
