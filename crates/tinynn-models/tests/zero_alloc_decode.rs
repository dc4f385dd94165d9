//! Decoding allocates nothing per step: after warm-up runs of each batch shape, 20 one-token
//! steps of a one-sequence session and 20 steps of a 3-sequence batch run under a counting
//! global allocator with no heap allocation. One test in this file, so no other test
//! allocates meanwhile.

#[path = "../../tinynn-format/tests/support/counting_alloc_ffi.rs"]
mod counting_alloc;

use std::sync::atomic::Ordering;

use tinynn_cpu::ExecOptions;
use tinynn_format::model_cache::require_default_model;
use tinynn_models::model::Model;
use tinynn_models::session::{BatchToken, Session, SessionOptions};

#[test]
fn decode_steps_allocate_nothing() {
    let model = Model::open(require_default_model().unwrap()).unwrap();
    let exec = ExecOptions {
        threads: 2,
        adaptive_threads: false,
        ..ExecOptions::default()
    };
    let mut one = Session::new(model.clone(), 256, exec).unwrap();
    let mut many = Session::with_options(
        model,
        SessionOptions {
            n_ctx: 256,
            n_seq: 3,
            exec,
            ..SessionOptions::default()
        },
    )
    .unwrap();
    let step = |seqs: usize, token: u32| -> Vec<BatchToken> {
        (0..seqs)
            .map(|seq| BatchToken {
                token: token + seq as u32,
                seq,
                logits: true,
            })
            .collect()
    };
    // Warm up: passes compiled, arenas grown, sequences' token lists with room to spare.
    one.eval_batch(&[1, 2, 3]).unwrap();
    many.decode(&step(3, 10)).unwrap();
    for t in 0..30 {
        one.eval(100 + t).unwrap();
        many.decode(&step(3, 200 + t)).unwrap();
    }
    one.truncate(3);
    (0..3).for_each(|s| many.truncate_seq(s, 1));
    let batches: Vec<Vec<BatchToken>> = (0..20).map(|t| step(3, 300 + t)).collect();

    let before = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst);
    for (t, batch) in batches.iter().enumerate() {
        one.eval(400 + t as u32).unwrap();
        many.decode(batch).unwrap();
    }
    let allocations = counting_alloc::ALLOCATIONS.load(Ordering::SeqCst) - before;
    assert_eq!(allocations, 0, "decode steps allocated {allocations} times");
    assert_eq!(one.n_past(), 23);
    assert_eq!(many.seq_len(2), 21);
}
