//! The trainer reaches the hardware only through `tinynn_core::backend::Backend`: a wrapper
//! backend that delegates every call to the CPU `Executor` while counting the calls drives
//! `Trainer::with_backend`, and its losses, gradient norms, weights, optimizer state, frozen
//! bytes and memory accounting equal the plain CPU trainer's bit for bit — for full
//! fine-tuning (random init, and a GGUF file loaded in place), and QLoRA on a Q8_0 base (packed
//! copies, released file bytes where the CPU packs).

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use common::tiny_llama::{self, V};
use tinynn_core::backend::{Backend, WeightRef};
use tinynn_core::graph::Graph;
use tinynn_core::plan::Plan;
use tinynn_core::tensor::TensorId;
use tinynn_cpu::{ExecOptions, Executor};
use tinynn_format::gguf::GgufFile;
use tinynn_format::GgmlType;
use tinynn_train::{LoraConfig, Optimizer, Targets, TrainConfig, TrainSource, Trainer};

const SEQ: usize = 16;

type Calls = Arc<Mutex<BTreeMap<&'static str, usize>>>;

/// The CPU executor behind `Backend`, counting each call by method name.
struct Counting {
    cpu: Executor,
    calls: Calls,
}

impl Counting {
    fn new(cfg: &TrainConfig) -> (Counting, Calls) {
        let calls = Calls::default();
        let cpu = Executor::cpu(ExecOptions {
            threads: cfg.threads,
            strict: cfg.strict,
            adaptive_threads: false,
            ..ExecOptions::default()
        });
        let me = Counting {
            cpu,
            calls: calls.clone(),
        };
        (me, calls)
    }

    fn count(&self, method: &'static str) {
        *self.calls.lock().unwrap().entry(method).or_default() += 1;
    }
}

type Mem = <Executor as Backend>::Memory;
type Packed = <Executor as Backend>::Packed;
type Error = <Executor as Backend>::Error;

impl Backend for Counting {
    type Memory = Mem;
    type Packed = Packed;
    type Error = Error;

    fn name(&self) -> &'static str {
        "counting cpu"
    }

    fn compile(&self, graph: Graph) -> Plan {
        self.count("compile");
        Backend::compile(&self.cpu, graph)
    }

    fn new_memory(&self, plan: &Plan, shared: &[TensorId]) -> Result<Mem, Error> {
        self.count("new_memory");
        Backend::new_memory(&self.cpu, plan, shared)
    }

    fn bind_weight(&self, m: &mut Mem, p: &Plan, t: TensorId, w: WeightRef) -> Result<(), Error> {
        self.count("bind_weight");
        Backend::bind_weight(&self.cpu, m, p, t, w)
    }

    fn pack(&self, dtype: GgmlType, ne: [usize; 4], bytes: &[u8]) -> Option<Packed> {
        self.count("pack");
        Backend::pack(&self.cpu, dtype, ne, bytes)
    }

    fn pack_backward(&self, packed: &mut Packed) -> bool {
        self.count("pack_backward");
        Backend::pack_backward(&self.cpu, packed)
    }

    fn packed_bytes(packed: &Packed) -> usize {
        <Executor as Backend>::packed_bytes(packed)
    }

    fn bind_packed(&self, m: &mut Mem, p: &Plan, t: TensorId, w: Arc<Packed>) -> Result<(), Error> {
        self.count("bind_packed");
        Backend::bind_packed(&self.cpu, m, p, t, w)
    }

    fn write(&self, m: &mut Mem, p: &Plan, t: TensorId, at: usize, b: &[u8]) -> Result<(), Error> {
        self.count("write");
        Backend::write(&self.cpu, m, p, t, at, b)
    }

    fn swap(
        &self,
        m: &mut Mem,
        p: &Plan,
        t: TensorId,
        other: &mut Mem,
        other_plan: &Plan,
        other_t: TensorId,
    ) -> Result<(), Error> {
        self.count("swap");
        Backend::swap(&self.cpu, m, p, t, other, other_plan, other_t)
    }

    fn persistent_len(&self, m: &Mem, p: &Plan, t: TensorId) -> usize {
        self.count("persistent_len");
        Backend::persistent_len(&self.cpu, m, p, t)
    }

    fn persistent<'a>(&'a self, m: &'a Mem, p: &Plan, t: TensorId) -> Result<&'a [u8], Error> {
        self.count("persistent");
        Backend::persistent(&self.cpu, m, p, t)
    }

    fn fill_persistent(
        &self,
        m: &mut Mem,
        p: &Plan,
        t: TensorId,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), Error> {
        self.count("fill_persistent");
        Backend::fill_persistent(&self.cpu, m, p, t, fill)
    }

    fn zero(&self, m: &mut Mem, p: &Plan, t: TensorId) -> Result<(), Error> {
        self.count("zero");
        Backend::zero(&self.cpu, m, p, t)
    }

    fn can_release_source(&self, m: &Mem, p: &Plan, t: TensorId) -> bool {
        self.count("can_release_source");
        Backend::can_release_source(&self.cpu, m, p, t)
    }

    fn release_source(&self, m: &mut Mem, p: &Plan, t: TensorId) -> Result<bool, Error> {
        self.count("release_source");
        Backend::release_source(&self.cpu, m, p, t)
    }

    fn unpacked_persistent(
        &self,
        m: &Mem,
        p: &Plan,
        t: TensorId,
        out: &mut Vec<u8>,
    ) -> Result<(), Error> {
        self.count("unpacked_persistent");
        Backend::unpacked_persistent(&self.cpu, m, p, t, out)
    }

    fn packed_persistent_bytes(&self, m: &Mem) -> usize {
        self.count("packed_persistent_bytes");
        Backend::packed_persistent_bytes(&self.cpu, m)
    }

    fn run(&mut self, plan: &Plan, m: &mut Mem) -> Result<(), Error> {
        self.count("run");
        Backend::run(&mut self.cpu, plan, m)
    }

    fn read_f32(&self, p: &Plan, m: &Mem, t: TensorId, out: &mut Vec<f32>) -> Result<(), Error> {
        self.count("read_f32");
        Backend::read_f32(&self.cpu, p, m, t, out)
    }

    fn trace(&self, plan: &Plan) -> Option<String> {
        self.count("trace");
        Backend::trace(&self.cpu, plan)
    }
}

fn cfg(accum: usize, lora: Option<LoraConfig>) -> TrainConfig {
    TrainConfig {
        seq: SEQ,
        batch: 2,
        accum,
        clip: Some(0.5),
        optimizer: Optimizer::default(),
        threads: 2,
        lora,
        ..TrainConfig::default()
    }
}

fn batch(n_micro: usize) -> (Vec<i32>, Vec<i32>) {
    let n = n_micro * 2 * SEQ;
    let ids: Vec<i32> = (0..n as i32).map(|i| (i * 7 + 3) % V as i32).collect();
    let labels: Vec<i32> = ids[1..].iter().copied().chain([-1]).collect();
    (ids, labels)
}

/// Steps both trainers `steps` times and compares everything the trainer reads back.
fn same_training<B: Backend>(plain: &mut Trainer, wrapped: &mut Trainer<B>, steps: usize) {
    let accum = plain.train_config().accum;
    let (ids, labels) = batch(accum);
    let (eids, elabels) = batch(1);
    for i in 0..steps {
        let a = plain.step(&ids, &labels, 1e-2).unwrap();
        let b = wrapped.step(&ids, &labels, 1e-2).unwrap();
        assert_eq!(
            a.loss.to_bits(),
            b.loss.to_bits(),
            "step {i}: {a:?} vs {b:?}"
        );
        assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits(), "step {i}");
        assert_eq!((a.skipped, a.step), (b.skipped, b.step));
    }
    let (a, b) = (
        plain.eval_loss(&eids, &elabels).unwrap(),
        wrapped.eval_loss(&eids, &elabels).unwrap(),
    );
    assert_eq!(a.to_bits(), b.to_bits());
    assert_eq!(plain.params().unwrap(), wrapped.params().unwrap());
    assert_eq!(plain.param_views().unwrap(), wrapped.param_views().unwrap());
    assert_eq!(
        plain.optimizer_views().unwrap(),
        wrapped.optimizer_views().unwrap()
    );
    assert_eq!(
        plain.optimizer_state().unwrap(),
        wrapped.optimizer_state().unwrap()
    );
    let (ga, gb) = (
        plain.gradients(&eids, &elabels).unwrap(),
        wrapped.gradients(&eids, &elabels).unwrap(),
    );
    assert_eq!(ga.0.to_bits(), gb.0.to_bits());
    assert_eq!(ga.1, gb.1);
    assert_eq!(plain.memory(), wrapped.memory());
    for f in plain.frozen_specs() {
        let (a, b) = (plain.frozen_bytes(&f.name), wrapped.frozen_bytes(&f.name));
        assert_eq!(a.unwrap(), b.unwrap(), "{}", f.name);
    }
}

fn calls(c: &Calls, method: &str) -> usize {
    c.lock().unwrap().get(method).copied().unwrap_or(0)
}

#[test]
fn full_fine_tuning_through_the_trait_is_the_cpu_trainer_bit_for_bit() {
    let source = || tiny_llama::random(64, 7);
    let c = cfg(2, None);
    let mut plain = Trainer::new(source(), c).unwrap();
    let (backend, counts) = Counting::new(&c);
    let mut wrapped = Trainer::with_backend(source(), c, backend).unwrap();
    assert_eq!(calls(&counts, "compile"), 3, "grad, update and eval plans");
    assert_eq!(calls(&counts, "new_memory"), 3);
    let steps = 4;
    let runs_before = calls(&counts, "run");
    same_training(&mut plain, &mut wrapped, steps);
    // Per step: 2 grad runs (accumulation) and 1 update; then one eval and one gradients run.
    assert_eq!(calls(&counts, "run") - runs_before, steps * 3 + 2);
    // Accumulated gradient buffers are zeroed through the backend; parameters and buffers
    // move between the passes' memories by swaps.
    assert!(calls(&counts, "zero") > 0);
    assert!(calls(&counts, "swap") > 0);
    assert!(calls(&counts, "read_f32") > 0);
    assert!(calls(&counts, "persistent") > 0);
}

#[test]
fn parameters_load_in_place_through_the_trait() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.gguf");
    let seed = Trainer::new(tiny_llama::random(64, 3), cfg(1, None)).unwrap();
    tiny_llama::write_gguf(&seed, &path, GgmlType::F16, &[]);
    let file = GgufFile::open(&path).unwrap();
    let c = cfg(1, None);
    let mut plain = Trainer::new(TrainSource::from(&file), c).unwrap();
    let (backend, counts) = Counting::new(&c);
    let mut wrapped = Trainer::with_backend(TrainSource::from(&file), c, backend).unwrap();
    // Every parameter is dequantized straight into the backend's buffer.
    assert_eq!(calls(&counts, "fill_persistent"), plain.param_specs().len());
    same_training(&mut plain, &mut wrapped, 3);
}

#[test]
fn qlora_through_the_trait_is_the_cpu_trainer_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("base-q8.gguf");
    let seed = Trainer::new(tiny_llama::random(64, 5), cfg(1, None)).unwrap();
    tiny_llama::write_gguf(&seed, &path, GgmlType::Q8_0, &[]);
    let file = GgufFile::open(&path).unwrap();
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: Targets::parse("q,k,v,o,gate,up,down").unwrap(),
        seed: 11,
    };
    let c = cfg(1, Some(lora));
    let mut plain = Trainer::new(TrainSource::from(&file), c).unwrap();
    let (backend, counts) = Counting::new(&c);
    let mut wrapped = Trainer::with_backend(TrainSource::from(&file), c, backend).unwrap();
    let n_frozen = wrapped.frozen_specs().len();
    assert!(n_frozen > 0);
    // Every frozen tensor but the F32 ones (which stay on the f32 GEMM) is offered for
    // packing (the backend declines what it does not pack); where the CPU packs Q8_0, the
    // copies are bound to both passes and the file bytes go wherever the copy serves every
    // reader.
    let offered = wrapped.frozen_specs().iter();
    let offered = offered.filter(|f| f.dtype != GgmlType::F32).count();
    assert!(offered > 0 && offered < n_frozen);
    assert_eq!(calls(&counts, "pack"), offered);
    if tinynn_cpu::packed::packs(GgmlType::Q8_0) {
        assert!(calls(&counts, "bind_packed") > 0);
        assert!(calls(&counts, "release_source") > 0);
        assert!(wrapped.memory().packed > 0);
        // Every packed matrix with a gradient product is offered the int8 one, but the tied
        // head (its product reads the loss's gradient); layer 0's q, k and v have none
        // (nothing before them trains).
        assert_eq!(calls(&counts, "pack_backward"), offered - 4);
    }
    same_training(&mut plain, &mut wrapped, 3);
    if calls(&counts, "release_source") > 0 {
        // Released tensors' bytes come back from their packed copies.
        assert!(calls(&counts, "unpacked_persistent") > 0);
    }
}

/// Data-parallel steps through the trait's default `run_observed` (the gradients handed out
/// after the run) give the CPU's (handed out mid-run) bit for bit, on two ranks.
#[test]
fn overlapped_data_parallel_steps_through_the_trait_default_match_the_cpu() {
    use tinynn_train::collective::{Collective, ThreadGroup};

    fn ranks<B: Backend + 'static>(
        make: impl Fn() -> Trainer<B> + Send + Sync + 'static,
    ) -> Vec<(Vec<u32>, Vec<tinynn_train::NamedTensor>)> {
        let make = Arc::new(make);
        let handles: Vec<_> = ThreadGroup::new(2)
            .into_iter()
            .map(|mut comm| {
                let make = make.clone();
                std::thread::spawn(move || {
                    let mut t = make();
                    let (ids, labels) = batch(2 * 2);
                    let n = ids.len() / 2;
                    let r = comm.rank();
                    let (ids, labels) = (&ids[r * n..][..n], &labels[r * n..][..n]);
                    let losses = (0..3)
                        .map(|_| {
                            let c: &mut dyn Collective = &mut comm;
                            let s = t
                                .step_data_parallel(ids, labels, None, 1e-2, &mut [], c)
                                .unwrap();
                            s.loss.to_bits()
                        })
                        .collect();
                    (losses, t.params().unwrap())
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }
    let lora_config = || LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: Targets::parse("q,v,down").unwrap(),
        seed: 11,
    };
    for lora in [None, Some(lora_config())] {
        let c = cfg(2, lora);
        let plain = ranks(move || Trainer::new(tiny_llama::random(64, 7), c).unwrap());
        let wrapped = ranks(move || {
            let (backend, _) = Counting::new(&c);
            Trainer::with_backend(tiny_llama::random(64, 7), c, backend).unwrap()
        });
        assert_eq!(plain, wrapped, "lora {}", lora.is_some());
        assert_eq!(plain[0], plain[1], "the ranks differ");
    }
}
