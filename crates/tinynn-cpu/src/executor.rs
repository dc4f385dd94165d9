//! Runs a plan: one arena allocated up front, every step on every thread of a persistent pool
//! with a barrier between steps, nothing allocated while running.
//!
//! Executors share the process-wide pool ([`ThreadPool::global`]): two sessions in one process
//! do not each spawn threads. Runs of executors on different threads take turns on it (a run
//! on one thread, strict mode's, runs on its caller and waits for nobody).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tinynn_core::backend::Ready;
use tinynn_core::plan::{Location, Plan, Region};
use tinynn_core::tensor::TensorId;
use tinynn_format::GgmlType;

use crate::kernels::shares::Share;
use crate::kernels::{self, RawTensor, RunErrors, StepArgs, ERR_INDEX, MAX_SRC};
use crate::memory::{AlignedBuf, Memory, MemoryError};
use crate::pool::{JobPanicked, RunError, ThreadPool};

mod fused;
mod groups;
#[cfg(test)]
mod shares_tests;
mod thread_choice;
mod watch;

/// Most products run as one (`fused`): a group's steps.
pub(crate) const MAX_FUSED: usize = groups::MAX_GROUP;

use thread_choice::ThreadChoice;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("the memory was made for another plan")]
    WrongMemory,
    #[error("row index {0} is out of range (e.g. a token id past the vocabulary)")]
    IndexOutOfRange(i32),
    #[error("a kernel met data it cannot handle")]
    Kernel,
    #[error("'{0}' has no value to read: it is not an output of this plan")]
    NotReadable(String),
    /// A kernel panicked (a bug): the run stopped at the step it was in, and the arena and the
    /// persistent tensors it was writing hold partial results. The executor runs the next plan
    /// normally.
    #[error("thread {thread} panicked: {message}")]
    Panic { thread: usize, message: String },
    /// The run was started from inside a job of a thread pool (it would deadlock).
    #[error("a plan was run from inside a thread-pool job")]
    NestedRun,
    #[error("cannot watch '{name}' after step {step}: {why}")]
    BadWatch {
        name: String,
        step: usize,
        why: &'static str,
    },
}

/// Barriers a run of `plan` meets (one after each group of steps, see `Executor::
/// set_step_groups`): what `tnn plan` reports beside the step count.
pub fn barriers(plan: &Plan) -> usize {
    groups::Schedule::of(plan)
        .sync
        .iter()
        .filter(|&&b| b)
        .count()
}

/// How an executor runs plans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecOptions {
    pub threads: usize,
    /// Reference mode (the original engine's `--strict`): one thread, dot products and
    /// reductions accumulated in f64, activations not quantized, RoPE angles in f64.
    pub strict: bool,
    /// Time every step on every thread, for [`Executor::chrome_trace`]. Off, it costs one
    /// branch per step.
    pub trace: bool,
    /// Watch for threads that do not get a core (another process busy on it): when a run's
    /// threads spend more than a quarter of it asleep waiting for each other, the next runs use
    /// one thread, and all of them are tried again later (after 8 runs, doubling while the
    /// machine stays busy, up to 512). Results do not depend on how many threads run
    /// (long-context decode attention splits by the configured count, `threads`, whatever
    /// runs); training keeps this off for bit-exact resumes.
    pub adaptive_threads: bool,
    /// Let model loaders repack weights into the matrix kernels' interleaved layout (see
    /// `tinynn_cpu::packed`); off, products read the file's bytes. Strict mode never uses it.
    pub repack: bool,
    /// Products of F32 operands (mul_mat with F32 weights, mul_mat_t, out_prod) round both
    /// operands to bf16 (nearest, ties to even) and accumulate in f32 with AVX-512 BF16
    /// (`vdpbf16ps`): mixed precision, faster, not f32 results. Without AVX-512 BF16, and in
    /// strict mode, products stay f32. Off by default.
    pub bf16_matmul: bool,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            threads: 1,
            strict: false,
            trace: false,
            repack: true,
            adaptive_threads: false,
            bf16_matmul: false,
        }
    }
}

pub struct Executor {
    /// The process-wide pool (at least `n_threads` threads); runs use the first `n_threads`.
    pool: Arc<ThreadPool>,
    /// Threads this executor runs on (what it was asked for; 1 in strict mode).
    n_threads: usize,
    /// Per thread: the step it was in when it panicked (written only then).
    panic_steps: Vec<AtomicUsize>,
    arena: AlignedBuf,
    /// Base address of each region, refreshed at each run: arena, weights, persistents.
    bases: Vec<usize>,
    /// Bytes of each persistent slot's buffer in the current run (reused: runs allocate nothing).
    persistent_lens: Vec<usize>,
    errors: RunErrors,
    strict: bool,
    bf16_matmul: bool,
    /// Per step and thread: start and end in ns since the run began (when tracing).
    spans: Option<Vec<AtomicU64>>,
    threads: ThreadChoice,
    /// The schedules (`groups::Schedule`) of the last plans run, by plan id and
    /// `step_groups`.
    schedules: Vec<((u64, bool), Arc<groups::Schedule>)>,
    /// Steps may run in groups without barriers between them (`groups`); off, a barrier
    /// follows every step.
    step_groups: bool,
    /// Every work counter's shares, `n_threads` each (see `Job::shares`).
    shares: Vec<Share>,
}

struct Job<'a> {
    plan: &'a Plan,
    /// Stride of the trace slots (the executor's thread count).
    span_threads: usize,
    bases: &'a [usize],
    n_weights: usize,
    packed: &'a [Option<std::sync::Arc<crate::packed::PackedWeight>>],
    packed_persistent: &'a [Option<std::sync::Arc<crate::packed::PackedWeight>>],
    /// Per persistent slot: only the packed copy is there (`Memory::drop_packed_source`).
    packed_only: &'a [bool],
    errors: &'a RunErrors,
    strict: bool,
    bf16_matmul: bool,
    trace: Option<(&'a [AtomicU64], Instant)>,
    /// Where barriers are and what is fetched early (see `groups`).
    schedule: &'a groups::Schedule,
    /// Work counters of the steps that hand out work dynamically: the `p`-th step of the
    /// `g`-th group (steps between two barriers) uses `claims[(g % 2) * MAX_GROUP + p]`, which
    /// thread 0 zeroes after the barrier that ends the group (no thread touches it again
    /// before the barrier ending group `g + 1`).
    claims: &'a [AtomicUsize; 2 * groups::MAX_GROUP],
    /// The steps' shares of work (`kernels::shares`), `span_threads` a work counter, each
    /// reset by its own thread after the barrier that ends the group.
    shares: &'a [Share],
    /// `(step, t)`: persistent `t` is final after `step` (checked against the plan);
    /// thread 0 hands it to `ready` then, ascending.
    watch: &'a [(usize, TensorId)],
    ready: Option<&'a Ready<'a>>,
    /// Bytes of each persistent slot's buffer.
    persistent_lens: &'a [usize],
}

impl Job<'_> {
    fn raw(&self, t: TensorId) -> RawTensor {
        let loc = self.plan.location(t).unwrap_or(Location {
            region: Region::Arena,
            offset: 0,
        });
        let base = match loc.region {
            Region::Arena => self.bases[0],
            Region::Weight(i) => self.bases[1 + i as usize],
            Region::Persistent(i) => self.bases[1 + self.n_weights + i as usize],
        };
        RawTensor {
            ptr: (base + loc.offset) as *mut u8,
            layout: *self.plan.graph().layout(t),
        }
    }

    /// The bytes of persistent tensor `t`, once no step writes them any more.
    fn final_persistent(&self, t: TensorId) -> &[u8] {
        let Some(Location {
            region: Region::Persistent(i),
            ..
        }) = self.plan.location(t)
        else {
            return &[];
        };
        let i = i as usize;
        let (base, len) = (self.bases[1 + self.n_weights + i], self.persistent_lens[i]);
        if len == 0 {
            return &[];
        }
        // SAFETY: `base` is the start of persistent slot `i`'s buffer of `len` bytes, which
        // the run borrows mutably from its `Memory` until every thread is done. The watch
        // list was checked against `Plan::last_writes`: the last step writing `t` has passed
        // its barrier and no later step writes these bytes, so while this shared slice lives
        // they are only read (by later steps and by the caller).
        unsafe { std::slice::from_raw_parts(base as *const u8, len) }
    }

    /// What step `i`'s kernel gets; `claims` is the index of its work counter.
    fn step_args(&self, i: usize, claims: usize) -> StepArgs<'_> {
        let step = &self.plan.steps()[i];
        let node = self.plan.graph().node(step.node);
        let mut src = [None; MAX_SRC];
        debug_assert!(
            node.src.len() <= MAX_SRC,
            "{} has too many sources",
            node.name
        );
        for (slot, &s) in src.iter_mut().zip(&node.src) {
            *slot = Some(self.raw(s));
        }
        let (work, work_len) = match step.work {
            Some((off, len)) => ((self.bases[0] + off) as *mut u8, len),
            None => (std::ptr::null_mut(), 0),
        };
        let packed = match (node.op, node.src.first()) {
            (
                tinynn_core::ops::Op::MulMat
                | tinynn_core::ops::Op::MulMatT
                | tinynn_core::ops::Op::GetRows,
                Some(&w),
            ) if !self.strict => match self.plan.location(w).map(|l| l.region) {
                Some(Region::Weight(i)) => self.packed[i as usize].as_deref(),
                Some(Region::Persistent(i)) => self.packed_persistent[i as usize].as_deref(),
                _ => None,
            },
            _ => None,
        };
        let source_dropped = match node.src.first() {
            Some(&s) => match self.plan.location(s).map(|l| l.region) {
                Some(Region::Persistent(i)) => self.packed_only[i as usize],
                _ => false,
            },
            None => false,
        };
        StepArgs {
            op: node.op,
            packed,
            source_dropped,
            dst: self.raw(step.node),
            src,
            work,
            work_len,
            errors: self.errors,
            strict: self.strict,
            bf16_matmul: self.bf16_matmul,
            claims: &self.claims[claims],
            shares: &self.shares[claims * self.span_threads..][..self.span_threads],
            claimable: true,
            kv_splits: self.span_threads,
            step: i,
        }
    }

    /// Runs every step; `at` follows the step this thread is in (read when it panics).
    fn run(&self, ctx: &crate::pool::Ctx<'_>, at: &mut usize) {
        let mut watched = 0;
        let (mut group, mut in_group) = (0, 0);
        let mut fused_left = 0;
        for i in 0..self.plan.steps().len() {
            *at = i;
            if ctx.ith == 0 {
                for f in &self.schedule.ahead[i] {
                    let addr = self.bases[1 + f.slot] + f.offset;
                    crate::simd::prefetch(addr as *const u8, f.bytes);
                }
            }
            let started = self.trace.map(|(_, t0)| t0.elapsed().as_nanos() as u64);
            #[cfg(test)]
            tests::fault(&self.plan.graph().node(self.plan.steps()[i].node).name, ctx);
            if fused_left > 0 {
                fused_left -= 1; // Computed with the first product of its run.
            } else {
                let claims = (group % 2) * groups::MAX_GROUP + in_group;
                let args = self.step_args(i, claims);
                fused_left = self.run_fused(i, claims, &args, ctx);
                if fused_left == 0 {
                    kernels::compute(&args, ctx);
                }
            }
            if let (Some((spans, t0)), Some(start)) = (self.trace, started) {
                let slot = 2 * (i * self.span_threads + ctx.ith);
                spans[slot].store(start, Ordering::Relaxed);
                spans[slot + 1].store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            if !self.schedule.sync[i] {
                in_group += 1;
                continue;
            }
            if ctx.barrier().is_err() {
                // Another thread panicked: what later steps read may never have been written.
                return;
            }
            let first = (group % 2) * groups::MAX_GROUP;
            for p in first..=first + in_group {
                self.shares[p * self.span_threads + ctx.ith].reset();
            }
            if ctx.ith == 0 {
                for c in &self.claims[first..=first + in_group] {
                    c.store(0, Ordering::Relaxed);
                }
                if let Some(ready) = self.ready {
                    while let Some(&(step, t)) = self.watch.get(watched) {
                        if step > i {
                            break;
                        }
                        ready(t, self.final_persistent(t));
                        watched += 1;
                    }
                }
            }
            (group, in_group) = (group + 1, 0);
        }
    }
}

impl Executor {
    /// An executor for `plan` on `n_threads` threads.
    pub fn new(plan: &Plan, n_threads: usize) -> Executor {
        Executor::with_options(
            plan,
            ExecOptions {
                threads: n_threads,
                ..ExecOptions::default()
            },
        )
    }

    /// An executor for `plan` (its arena allocated up front, or at the first run when the
    /// system refuses it now) and any other plan.
    pub fn with_options(plan: &Plan, opts: ExecOptions) -> Executor {
        let mut e = Executor::cpu(opts);
        if let Ok(arena) = AlignedBuf::try_zeroed(plan.arena_bytes()) {
            e.arena = arena;
        }
        e.bases = Vec::with_capacity(1 + plan.weights().len() + plan.persistents().len());
        e.persistent_lens = Vec::with_capacity(plan.persistents().len());
        if let Some(spans) = &mut e.spans {
            let slots = 2 * plan.steps().len() * e.n_threads;
            spans.extend((0..slots).map(|_| AtomicU64::new(0)));
        }
        e
    }

    /// An executor for any plan: its arena grows to the largest plan it runs, trace slots are
    /// sized on each run.
    pub fn cpu(opts: ExecOptions) -> Executor {
        let threads = if opts.strict {
            1
        } else {
            opts.threads.clamp(1, crate::pool::MAX_THREADS)
        };
        let spans = opts.trace.then(Vec::new);
        Executor {
            pool: ThreadPool::global(threads),
            n_threads: threads,
            panic_steps: (0..threads).map(|_| AtomicUsize::new(usize::MAX)).collect(),
            arena: AlignedBuf::zeroed(0),
            bases: Vec::new(),
            persistent_lens: Vec::new(),
            errors: RunErrors::default(),
            strict: opts.strict,
            bf16_matmul: opts.bf16_matmul && !opts.strict,
            spans,
            schedules: Vec::new(),
            step_groups: true,
            shares: (0..2 * groups::MAX_GROUP * threads)
                .map(|_| Share::default())
                .collect(),
            threads: ThreadChoice {
                adaptive: opts.adaptive_threads,
                active: threads,
                cooldown: 0,
                backoff: ThreadChoice::FIRST_BACKOFF,
                last: threads,
            },
        }
    }

    /// Where `plan`'s runs meet at a barrier and what they fetch early, derived once per
    /// plan (the last few are kept: a session alternates prefill and decode plans).
    fn schedule_of(&mut self, plan: &Plan) -> Arc<groups::Schedule> {
        let key = (plan.id(), self.step_groups);
        if let Some((_, s)) = self.schedules.iter().find(|(k, _)| *k == key) {
            return s.clone();
        }
        let s = Arc::new(if self.step_groups {
            groups::Schedule::of(plan)
        } else {
            groups::Schedule::plain(plan.steps().len())
        });
        if self.schedules.len() == 4 {
            self.schedules.remove(0);
        }
        self.schedules.push((key, s.clone()));
        s
    }

    /// Lets neighbouring steps that touch disjoint bytes (or the same rows of a row-wise
    /// chain) run without a barrier between them: on by default. Results are the same either
    /// way; off is for comparing and for finding a kernel that breaks the contract.
    pub fn set_step_groups(&mut self, on: bool) {
        self.step_groups = on;
    }

    /// The threads runs use (the pool may have more: it is shared).
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs every step of `plan` against `mem` (made by `Memory::new(plan)`).
    pub fn run(&mut self, plan: &Plan, mem: &mut Memory<'_>) -> Result<(), ExecError> {
        self.run_inner(plan, mem, &[], None)
    }

    /// [`Executor::run`], calling `ready(t, bytes)` for each `(step, t)` of `watch` as soon as
    /// `step` has ended (on thread 0, while the other threads go on): `watch` is ascending, and
    /// `step` must be the last step that writes persistent tensor `t`
    /// ([`Plan::last_writes`]). See [`Backend::run_observed`](tinynn_core::backend::Backend).
    pub fn run_observed(
        &mut self,
        plan: &Plan,
        mem: &mut Memory<'_>,
        watch: &[(usize, TensorId)],
        ready: &Ready<'_>,
    ) -> Result<(), ExecError> {
        watch::check(plan, watch)?;
        self.run_inner(plan, mem, watch, Some(ready))
    }

    fn run_inner(
        &mut self,
        plan: &Plan,
        mem: &mut Memory<'_>,
        watch: &[(usize, TensorId)],
        ready: Option<&Ready<'_>>,
    ) -> Result<(), ExecError> {
        if mem.weights.len() != plan.weights().len()
            || mem.persistent.len() != plan.persistents().len()
        {
            return Err(ExecError::WrongMemory);
        }
        // One executor serves several plans (prefill and decode): the arena grows to the
        // largest, so only the first run of a bigger plan allocates.
        if self.arena.len() < plan.arena_bytes() {
            self.arena = AlignedBuf::try_zeroed(plan.arena_bytes())?;
        }
        mem.check_bound(plan)?;
        if self.strict {
            // Strict products read the bytes, never a packed copy.
            if let Some(i) = mem.packed_only.iter().position(|&p| p) {
                return Err(MemoryError::PackedOnly(
                    plan.graph().node(plan.persistents()[i]).name.clone(),
                )
                .into());
            }
        }
        let span_slots = 2 * plan.steps().len() * self.n_threads;
        if let Some(spans) = self.spans.as_mut().filter(|s| s.len() != span_slots) {
            *spans = (0..span_slots).map(|_| AtomicU64::new(0)).collect();
        }
        self.bases.clear();
        self.bases
            .push(self.arena.as_bytes_mut().as_mut_ptr() as usize);
        self.bases.extend(
            mem.weights
                .iter()
                .map(|w| w.as_ref().map_or(0, |w| w.bytes().as_ptr() as usize)),
        );
        self.bases.extend(
            mem.persistent
                .iter_mut()
                .map(|p| p.as_bytes_mut().as_mut_ptr() as usize),
        );
        if let Some(spans) = &self.spans {
            spans.iter().for_each(|s| s.store(0, Ordering::Relaxed));
        }
        let claims = std::array::from_fn(|_| AtomicUsize::new(0));
        // A run that ended in a panic may have left shares taken.
        self.shares.iter().for_each(Share::reset);
        let schedule = self.schedule_of(plan);
        self.persistent_lens.clear();
        self.persistent_lens
            .extend(mem.persistent.iter().map(|p| p.len()));
        let job = Job {
            plan,
            span_threads: self.n_threads,
            bases: &self.bases,
            n_weights: mem.weights.len(),
            packed: &mem.packed,
            packed_persistent: &mem.packed_persistent,
            packed_only: &mem.packed_only,
            errors: &self.errors,
            strict: self.strict,
            bf16_matmul: self.bf16_matmul,
            trace: self.spans.as_deref().map(|s| (s, Instant::now())),
            claims: &claims,
            shares: &self.shares,
            schedule: &schedule,
            watch,
            ready,
            persistent_lens: &self.persistent_lens,
        };
        let panic_steps = &self.panic_steps;
        let ran = self.pool.run_on(self.threads.active, &|ctx| {
            let mut at = usize::MAX;
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job.run(ctx, &mut at))) {
                panic_steps[ctx.ith].store(at, Ordering::Relaxed);
                resume_unwind(payload);
            }
        });
        let stats = match ran {
            Ok(stats) => stats,
            Err(e) => {
                // Kernel errors of a run that did not finish mean nothing.
                self.errors.take();
                return Err(self.run_error(plan, e));
            }
        };
        self.threads.after(stats, self.n_threads);
        match self.errors.take() {
            None => Ok(()),
            Some((ERR_INDEX, v)) => Err(ExecError::IndexOutOfRange(v as i32)),
            Some(_) => Err(ExecError::Kernel),
        }
    }

    /// `ExecError` for a run that did not complete, naming the step a panic happened in.
    fn run_error(&self, plan: &Plan, e: RunError) -> ExecError {
        let JobPanicked { thread, message } = match e {
            RunError::Panicked(p) => p,
            RunError::Nested => return ExecError::NestedRun,
        };
        let message = message.unwrap_or_else(|| "(no message)".to_owned());
        let step = self
            .panic_steps
            .get(thread)
            .map_or(usize::MAX, |s| s.load(Ordering::Relaxed));
        self.panic_steps
            .iter()
            .for_each(|s| s.store(usize::MAX, Ordering::Relaxed));
        let message = match plan.steps().get(step) {
            Some(st) => {
                let node = plan.graph().node(st.node);
                format!(
                    "in step {step} ({} '{}'): {message}",
                    node.op.name(),
                    node.name
                )
            }
            None => message,
        };
        ExecError::Panic { thread, message }
    }

    /// The last run's step timings as Chrome trace JSON (load it in `chrome://tracing` or
    /// Perfetto): one event per step and thread with the op, tensor, shape and type. `None`
    /// unless the executor was made with `trace: true`.
    pub fn chrome_trace(&self, plan: &Plan) -> Option<String> {
        let spans = self.spans.as_ref()?;
        let threads = self.n_threads;
        let mut events = Vec::new();
        for (i, step) in plan.steps().iter().enumerate() {
            let node = plan.graph().node(step.node);
            for t in 0..self.threads.last {
                let slot = 2 * (i * threads + t);
                let (start, end) = (
                    spans[slot].load(Ordering::Relaxed),
                    spans[slot + 1].load(Ordering::Relaxed),
                );
                events.push(format!(
                    r#"{{"name":"{}","ph":"X","pid":0,"tid":{t},"ts":{:.3},"dur":{:.3},"args":{{"tensor":"{}","shape":{:?},"dtype":"{}"}}}}"#,
                    node.op.name(),
                    start as f64 / 1e3,
                    end.saturating_sub(start) as f64 / 1e3,
                    json_escape(&node.name),
                    node.layout.ne,
                    node.layout.dtype
                ));
            }
        }
        Some(format!(
            "{{\"traceEvents\":[\n{}\n]}}\n",
            events.join(",\n")
        ))
    }

    /// The bytes of contiguous tensor `t` after a run: an output, or a persistent tensor.
    pub fn bytes<'a>(
        &'a self,
        plan: &Plan,
        mem: &'a Memory<'_>,
        t: TensorId,
    ) -> Result<&'a [u8], ExecError> {
        let layout = plan.graph().layout(t);
        let readable = plan.graph().outputs().contains(&t)
            || matches!(
                plan.location(t).map(|l| l.region),
                Some(Region::Persistent(_))
            );
        let loc = plan
            .location(t)
            .filter(|_| readable && layout.is_contiguous());
        let Some(loc) = loc else {
            return Err(ExecError::NotReadable(plan.graph().node(t).name.clone()));
        };
        let base: &[u8] = match loc.region {
            Region::Arena => self.arena.as_bytes(),
            Region::Persistent(i) => mem.persistent[i as usize].as_bytes(),
            Region::Weight(i) => mem.weights[i as usize]
                .as_ref()
                .map_or(&[][..], |w| w.bytes()),
        };
        base.get(loc.offset..loc.offset + layout.contiguous_bytes())
            .ok_or_else(|| ExecError::NotReadable(plan.graph().node(t).name.clone()))
    }

    /// An I32 output as a vector (a convenience for tests and tools; it allocates).
    pub fn read_i32(
        &self,
        plan: &Plan,
        mem: &Memory<'_>,
        t: TensorId,
    ) -> Result<Vec<i32>, ExecError> {
        if plan.graph().layout(t).dtype != GgmlType::I32 {
            return Err(ExecError::NotReadable(plan.graph().node(t).name.clone()));
        }
        Ok(self
            .bytes(plan, mem, t)?
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// An F32 output as a vector (a convenience for tests and tools; it allocates).
    pub fn read_f32(
        &self,
        plan: &Plan,
        mem: &Memory<'_>,
        t: TensorId,
    ) -> Result<Vec<f32>, ExecError> {
        if plan.graph().layout(t).dtype != GgmlType::F32 {
            return Err(ExecError::NotReadable(plan.graph().node(t).name.clone()));
        }
        Ok(self
            .bytes(plan, mem, t)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// A string as the inside of a JSON string literal.
fn json_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use tinynn_core::graph::Graph;

    /// Test-only fault injection (compiled only into this crate's unit tests): a node named
    /// `panic@K` makes thread K (the last one when there are fewer) panic in its step.
    pub(super) fn fault(name: &str, ctx: &crate::pool::Ctx<'_>) {
        if let Some(k) = name.strip_prefix("panic@") {
            let k: usize = k.parse().unwrap_or(0);
            if ctx.ith == k.min(ctx.nth - 1) {
                panic!("injected fault in '{name}'");
            }
        }
    }

    /// `y = ((x + x) * x + x) · w` over a few steps (a matrix product with its barriers among
    /// them), the second step named `fault` when given.
    fn plan(fault: Option<&str>) -> (Plan, TensorId, TensorId, TensorId) {
        let mut g = Graph::new();
        let x = g.input("x", GgmlType::F32, &[64, 8]).unwrap();
        let w = g.weight("w", GgmlType::Q8_0, &[64, 32]).unwrap();
        let a = g.add(x, x).unwrap();
        let b = g.mul(a, x).unwrap();
        if let Some(name) = fault {
            g.set_name(b, name).unwrap();
        }
        let c = g.add(b, x).unwrap();
        let y = g.mul_mat(w, c).unwrap();
        g.set_output(y).unwrap();
        (crate::compile(g), x, w, y)
    }

    fn run_plan(exec: &mut Executor, fault: Option<&str>) -> Result<Vec<f32>, ExecError> {
        let (plan, x, w, y) = plan(fault);
        let wv: Vec<f32> = (0..64 * 32).map(|i| ((i % 7) as f32 - 3.0) / 8.0).collect();
        let mut wb = vec![0u8; tinynn_core::quant::row_bytes(GgmlType::Q8_0, wv.len()).unwrap()];
        tinynn_core::quant::quantize_row(GgmlType::Q8_0, &wv, &mut wb).unwrap();
        let mut mem = Memory::new(&plan);
        mem.bind_weight(&plan, w, &wb).unwrap();
        let xv: Vec<f32> = (0..64 * 8).map(|i| ((i % 5) as f32 - 2.0) / 4.0).collect();
        mem.write_f32(&plan, x, &xv).unwrap();
        exec.run(&plan, &mut mem)?;
        exec.read_f32(&plan, &mem, y)
    }

    #[test]
    fn a_panicking_kernel_is_an_error_and_the_next_plan_runs() {
        for threads in [1, 2, 3] {
            let (plan0, ..) = plan(None);
            let mut exec = Executor::with_options(
                &plan0,
                ExecOptions {
                    threads,
                    trace: true,
                    ..ExecOptions::default()
                },
            );
            let want = run_plan(&mut exec, None).unwrap();
            for culprit in 0..threads {
                let name = format!("panic@{culprit}");
                let err = run_plan(&mut exec, Some(&name)).unwrap_err();
                let ExecError::Panic { thread, message } = &err else {
                    panic!("{err:?}");
                };
                assert_eq!(*thread, culprit, "{threads} threads");
                assert!(
                    message.contains("step 1 (mul '")
                        && message.contains(&format!("injected fault in '{name}'")),
                    "{message}"
                );
                assert!(err
                    .to_string()
                    .starts_with(&format!("thread {culprit} panicked")));
                // The same executor (and pool) runs the next plan in full.
                assert_eq!(run_plan(&mut exec, None).unwrap(), want);
                assert!(exec.chrome_trace(&plan0).is_some());
            }
        }
    }

    #[test]
    fn executors_on_several_threads_share_the_pool_and_take_turns() {
        let (plan0, ..) = plan(None);
        let want = run_plan(&mut Executor::new(&plan0, 1), None).unwrap();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let want = &want;
                let plan0 = &plan0;
                scope.spawn(move || {
                    let mut exec = Executor::new(plan0, 1 + t % 3);
                    for _ in 0..50 {
                        assert_eq!(&run_plan(&mut exec, None).unwrap(), want);
                    }
                });
            }
        });
    }

    #[test]
    fn a_plan_run_from_inside_a_job_is_refused() {
        let (plan0, ..) = plan(None);
        let exec = Mutex::new(Executor::new(&plan0, 2));
        let pool = ThreadPool::new(2);
        let answers = Mutex::new(Vec::new());
        pool.run_on(1, &|_| {
            let r = run_plan(&mut exec.lock().unwrap(), None);
            answers.lock().unwrap().push(r);
        })
        .unwrap();
        assert_eq!(
            answers.into_inner().unwrap(),
            vec![Err(ExecError::NestedRun)]
        );
        assert!(run_plan(&mut exec.lock().unwrap(), None).is_ok());
    }
}
