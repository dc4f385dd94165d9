//! A persistent thread pool that runs one job on every thread, with a barrier the job uses
//! between dependent steps. Waiting spins briefly, then sleeps on a futex, so a busy core
//! elsewhere does not turn our waits into stolen time slices.
//!
//! - **Panics.** A panic inside a job (on a worker or on the caller's own share) is caught on
//!   that thread: the run is poisoned, every thread waiting at the barrier wakes, and
//!   [`Ctx::barrier`] answers [`Poisoned`] from then on, so the job stops instead of hanging.
//!   The run returns [`RunError::Panicked`]; the next run starts clean.
//! - **Sharing.** Runs of one pool take turns (a mutex held for the whole run), so a pool can be
//!   shared between threads; [`ThreadPool::global`] gives every executor of the process the same
//!   one. A run on one thread uses no worker and nothing shared, so it does not wait for turns.
//! - **Nesting.** A job may not start a run (of any pool): it would wait for threads that are
//!   busy running the job itself. Such a run returns [`RunError::Nested`] at once.

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Spins before sleeping: roughly a few microseconds, enough for a sibling finishing a step.
const SPIN: u32 = 4096;

/// Most threads a pool has (the run's thread count travels in 8 bits of `Shared::start`).
pub const MAX_THREADS: usize = 255;

/// What a job sees: its thread index, the thread count, and the shared barrier.
pub struct Ctx<'a> {
    pub ith: usize,
    pub nth: usize,
    barrier: &'a Barrier,
}

/// The run was poisoned: a thread of the job panicked. The job must stop (return) without
/// reading anything other threads were to write before the barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("another thread of the job panicked")]
pub struct Poisoned;

impl Ctx<'_> {
    /// Waits until every thread of the job has reached this point. `Err(Poisoned)` when a
    /// thread of the job panicked: the others will never arrive, so the job must return.
    #[must_use = "a poisoned barrier means other threads' data is missing: the job must stop"]
    #[inline]
    pub fn barrier(&self) -> Result<(), Poisoned> {
        self.barrier.wait(self.nth)
    }
}

type Job<'a> = &'a (dyn Fn(&Ctx<'_>) + Sync);

/// Bit 0 of `Barrier::generation`: the run is poisoned. Generations count in steps of 2, so
/// they never touch it.
const POISON: u32 = 1;

struct Barrier {
    arrived: AtomicU32,
    /// Bumped by 2 each time every thread has arrived; bit 0 is [`POISON`].
    generation: AtomicU32,
    /// Threads asleep (or about to sleep) on `generation`: the last to arrive makes the
    /// wake-up system call only when there is one (most barriers end while all spin).
    sleepers: AtomicU32,
    /// Nanoseconds threads spent asleep waiting (in barriers and for the run's end) during
    /// the current run: the sign that a sibling is not getting a core.
    slept_ns: AtomicU64,
}

impl Barrier {
    #[inline]
    fn wait(&self, n: usize) -> Result<(), Poisoned> {
        if n == 1 {
            // Nobody else can panic; a panic of this thread unwinds past us.
            return Ok(());
        }
        let gen = self.generation.load(Ordering::Acquire);
        if gen & POISON != 0 {
            return Err(Poisoned);
        }
        let now = if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n as u32 {
            self.arrived.store(0, Ordering::Relaxed);
            // SeqCst here and on `sleepers` (in `wait_while_equal`): either this load sees a
            // sleeper, or that sleeper's re-check after counting itself sees the new
            // generation and does not sleep.
            let prev = self.generation.fetch_add(2, Ordering::SeqCst);
            if self.sleepers.load(Ordering::SeqCst) != 0 {
                atomic_wait::wake_all(&self.generation);
            }
            prev
        } else {
            wait_while_equal(
                &self.generation,
                gen,
                Some(&self.slept_ns),
                Some(&self.sleepers),
            )
        };
        if now & POISON != 0 {
            Err(Poisoned)
        } else {
            Ok(())
        }
    }

    /// Wakes every waiter for good: they (and every later `wait`) answer `Poisoned`.
    fn poison(&self) {
        self.generation.fetch_or(POISON, Ordering::AcqRel);
        atomic_wait::wake_all(&self.generation);
    }

    /// A clean barrier for the next run (only while no thread is using it).
    fn reset(&self) {
        self.arrived.store(0, Ordering::Relaxed);
        self.generation.store(0, Ordering::Relaxed);
        self.slept_ns.store(0, Ordering::Relaxed);
        self.sleepers.store(0, Ordering::Relaxed);
    }
}

/// Returns once `a` no longer holds `value`, with what it holds now; time spent asleep is
/// added to `slept_ns`. With `sleepers`, the thread counts itself there while it may sleep
/// (the waker then changes `a` with `SeqCst` and wakes only when it reads a sleeper).
fn wait_while_equal(
    a: &AtomicU32,
    value: u32,
    slept_ns: Option<&AtomicU64>,
    sleepers: Option<&AtomicU32>,
) -> u32 {
    for _ in 0..SPIN {
        let now = a.load(Ordering::Acquire);
        if now != value {
            return now;
        }
        std::hint::spin_loop();
    }
    let t0 = slept_ns.map(|_| Instant::now());
    if let Some(s) = sleepers {
        s.fetch_add(1, Ordering::SeqCst);
    }
    let now = loop {
        let now = a.load(Ordering::SeqCst);
        if now != value {
            break now;
        }
        atomic_wait::wait(a, value);
    };
    if let Some(s) = sleepers {
        s.fetch_sub(1, Ordering::Relaxed);
    }
    if let (Some(s), Some(t0)) = (slept_ns, t0) {
        s.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
    now
}

/// How a run went: its wall time and the time its threads slept waiting for each other.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub wall: Duration,
    pub slept: Duration,
    pub threads: usize,
}

/// A thread of the job panicked (the first one that did, when several did).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("thread {thread} of the job panicked: {}", message.as_deref().unwrap_or("(no message)"))]
pub struct JobPanicked {
    /// The thread's index in the job (`Ctx::ith`; 0 is the caller's).
    pub thread: usize,
    /// The panic's message when it was a `&str` or a `String` (what `panic!` makes).
    pub message: Option<String>,
}

/// Why a run did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Panicked(#[from] JobPanicked),
    /// A job tried to start a run: it would wait for threads busy running the job itself.
    #[error("a run was started from inside a job (it would deadlock)")]
    Nested,
}

/// The message of a panic payload, when it has one.
fn panic_message(payload: &(dyn Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}

/// Drops a panic payload without letting a panicking `Drop` of it escape (it would kill a
/// worker, and the caller would wait for it forever).
fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

thread_local! {
    /// This thread is running a job (workers always are): a run started here would deadlock.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as running a job for as long as it lives.
struct InJob;

impl InJob {
    fn enter() -> Result<InJob, RunError> {
        if IN_JOB.with(|f| f.replace(true)) {
            return Err(RunError::Nested);
        }
        Ok(InJob)
    }
}

impl Drop for InJob {
    fn drop(&mut self) {
        IN_JOB.with(|f| f.set(false));
    }
}

struct Shared {
    /// The job of the current run; written by the caller only while every worker is idle.
    job: UnsafeCell<Option<Job<'static>>>,
    /// Bumped by the caller to start a run: run count << 8 | threads taking part.
    start: AtomicU32,
    /// Workers done with the current run.
    done: AtomicU32,
    stop: AtomicBool,
    barrier: Barrier,
    /// The first panic of the current run (touched only when a thread panics, and by the
    /// caller after every worker is done).
    panic: Mutex<Option<JobPanicked>>,
    n_threads: usize,
}

// SAFETY: `job` is written only by `ThreadPool::run_on`, holding `run_lock` (so by one caller at
// a time), before it bumps `start` (Release) and after every worker has reported `done`
// (Acquire); workers read it only in between. All other fields are atomics or a mutex.
unsafe impl Sync for Shared {}

impl Shared {
    /// Records thread `ith`'s panic (the first of the run wins) and poisons the barrier.
    fn panicked(&self, ith: usize, payload: Box<dyn Any + Send>) {
        let message = panic_message(&*payload);
        self.panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_or_insert(JobPanicked {
                thread: ith,
                message,
            });
        self.barrier.poison();
        drop_payload(payload);
    }
}

/// A pool of threads that run one job at a time on all (or the first n) of them. `Sync`: runs
/// from several threads take turns; see the module documentation.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Held for the whole of a run on more than one thread.
    run_lock: Mutex<()>,
}

/// The process-wide pool (see [`ThreadPool::global`]).
static GLOBAL: Mutex<Option<Arc<ThreadPool>>> = Mutex::new(None);

impl ThreadPool {
    /// A pool running jobs on `n_threads` threads (1 to [`MAX_THREADS`]): the caller's plus
    /// `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.clamp(1, MAX_THREADS);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            start: AtomicU32::new(0),
            done: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            barrier: Barrier {
                arrived: AtomicU32::new(0),
                generation: AtomicU32::new(0),
                slept_ns: AtomicU64::new(0),
                sleepers: AtomicU32::new(0),
            },
            panic: Mutex::new(None),
            n_threads,
        });
        let workers = (1..n_threads)
            .map(|ith| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("tinynn-{ith}"))
                    .spawn(move || worker(&shared, ith))
                    .expect("spawning a worker thread")
            })
            .collect();
        ThreadPool {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    /// The process-wide pool, with at least `n_threads` threads (clamped to 1..=MAX_THREADS).
    /// Every caller asking for as many threads as it has, or fewer, gets the same pool; a
    /// request for more makes a larger pool, which later callers get. Pools handed out before
    /// stay valid (and keep their threads) while someone holds them. Runs on the shared pool
    /// from several threads take turns.
    pub fn global(n_threads: usize) -> Arc<ThreadPool> {
        let n = n_threads.clamp(1, MAX_THREADS);
        let mut global = GLOBAL.lock().unwrap_or_else(PoisonError::into_inner);
        match &*global {
            Some(pool) if pool.n_threads() >= n => Arc::clone(pool),
            _ => {
                let pool = Arc::new(ThreadPool::new(n));
                *global = Some(Arc::clone(&pool));
                pool
            }
        }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `job` on every thread and returns when all have finished.
    pub fn run(&self, job: &(dyn Fn(&Ctx<'_>) + Sync)) -> Result<RunStats, RunError> {
        self.run_on(self.shared.n_threads, job)
    }

    /// Runs `job` on the first `n` threads (at least 1, at most the pool's); the others stay
    /// asleep and are not waited for. Returns when every thread of the run has finished, also
    /// when one panicked (`RunError::Panicked`; the pool is fine for the next run). A run on
    /// more than one thread waits for other threads' runs of this pool to end; a run on one
    /// thread runs on the caller only and does not wait. Called from inside a job, it refuses
    /// (`RunError::Nested`).
    pub fn run_on(&self, n: usize, job: &(dyn Fn(&Ctx<'_>) + Sync)) -> Result<RunStats, RunError> {
        let s = &*self.shared;
        let n = n.clamp(1, s.n_threads);
        let _in_job = InJob::enter()?;
        if n == 1 {
            let t0 = Instant::now();
            // The caller alone: no worker, no shared state (`Barrier::wait` on one thread
            // touches nothing), so no turn to wait for.
            let ctx = Ctx {
                ith: 0,
                nth: 1,
                barrier: &s.barrier,
            };
            return match catch_unwind(AssertUnwindSafe(|| job(&ctx))) {
                Ok(()) => Ok(RunStats {
                    wall: t0.elapsed(),
                    slept: Duration::ZERO,
                    threads: 1,
                }),
                Err(payload) => {
                    let message = panic_message(&*payload);
                    drop_payload(payload);
                    Err(JobPanicked { thread: 0, message }.into())
                }
            };
        }
        // A run's job panics are caught, so nothing panics while the lock is held; should it
        // be poisoned anyway, the state it guards is reset below.
        let _turn = self.run_lock.lock().unwrap_or_else(PoisonError::into_inner);
        // The run's time starts with our turn: waiting for another run is not this one's.
        let t0 = Instant::now();
        // No worker is running (the previous run waited for all of them): a clean barrier.
        s.barrier.reset();
        // SAFETY: no worker is running (the previous run waited for all of them) and we hold
        // `run_lock`, so nobody else reads or writes `job` now; the 'static lifetime is a lie
        // we keep honest by clearing the slot below before `job`'s real lifetime ends.
        unsafe {
            *s.job.get() = Some(std::mem::transmute::<Job<'_>, Job<'static>>(job));
        }
        s.done.store(0, Ordering::Relaxed);
        let next = ((s.start.load(Ordering::Relaxed) >> 8).wrapping_add(1) << 8) | n as u32;
        s.start.store(next, Ordering::Release);
        atomic_wait::wake_all(&s.start);
        let ctx = Ctx {
            ith: 0,
            nth: n,
            barrier: &s.barrier,
        };
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job(&ctx))) {
            s.panicked(0, payload);
        }
        let workers = n as u32 - 1;
        loop {
            let done = s.done.load(Ordering::Acquire);
            if done == workers {
                break;
            }
            wait_while_equal(&s.done, done, Some(&s.barrier.slept_ns), None);
        }
        // SAFETY: every worker has finished with the job (done == workers, Acquire).
        unsafe {
            *s.job.get() = None;
        }
        let stats = RunStats {
            wall: t0.elapsed(),
            slept: Duration::from_nanos(s.barrier.slept_ns.load(Ordering::Relaxed)),
            threads: n,
        };
        match s
            .panic
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            Some(p) => Err(p.into()),
            None => Ok(stats),
        }
    }
}

fn worker(s: &Shared, ith: usize) {
    // A worker only ever runs jobs: a run started here is nested.
    IN_JOB.with(|f| f.set(true));
    let mut seen = 0u32;
    loop {
        wait_while_equal(&s.start, seen, None, None);
        seen = s.start.load(Ordering::Acquire);
        if s.stop.load(Ordering::Acquire) {
            return;
        }
        let active = (seen & 0xFF) as usize;
        if ith >= active {
            // Not part of this run: the caller neither waits for us nor lets us see the job.
            continue;
        }
        // SAFETY: the caller stored the job before bumping `start` and clears it only after we
        // report `done` below.
        if let Some(job) = unsafe { *s.job.get() } {
            let ctx = Ctx {
                ith,
                nth: active,
                barrier: &s.barrier,
            };
            if let Err(payload) = catch_unwind(AssertUnwindSafe(|| job(&ctx))) {
                s.panicked(ith, payload);
            }
        }
        s.done.fetch_add(1, Ordering::AcqRel);
        atomic_wait::wake_all(&s.done);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.start.fetch_add(1 << 8, Ordering::Release);
        atomic_wait::wake_all(&self.shared.start);
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_thread_runs_and_barriers_order_phases() {
        for n in [1, 2, 3, 4] {
            let pool = ThreadPool::new(n);
            for _ in 0..50 {
                let phase1 = AtomicUsize::new(0);
                let seen_after_barrier = AtomicUsize::new(0);
                pool.run(&|ctx| {
                    phase1.fetch_add(1, Ordering::SeqCst);
                    ctx.barrier().unwrap();
                    seen_after_barrier.fetch_add(phase1.load(Ordering::SeqCst), Ordering::SeqCst);
                    ctx.barrier().unwrap();
                })
                .unwrap();
                assert_eq!(phase1.load(Ordering::SeqCst), n);
                assert_eq!(seen_after_barrier.load(Ordering::SeqCst), n * n);
            }
        }
    }

    #[test]
    fn runs_on_fewer_threads_and_back() {
        let pool = ThreadPool::new(3);
        for round in 0..200 {
            let n = 1 + round % 3;
            let ran = AtomicUsize::new(0);
            let max_ith = AtomicUsize::new(0);
            let stats = pool
                .run_on(n, &|ctx| {
                    assert_eq!(ctx.nth, n);
                    ran.fetch_add(1, Ordering::SeqCst);
                    max_ith.fetch_max(ctx.ith, Ordering::SeqCst);
                    ctx.barrier().unwrap();
                })
                .unwrap();
            assert_eq!(ran.load(Ordering::SeqCst), n, "round {round}");
            assert_eq!(max_ith.load(Ordering::SeqCst), n - 1);
            assert_eq!(stats.threads, n);
            assert!(stats.slept <= stats.wall * n as u32 + Duration::from_millis(50));
        }
    }

    /// Where the panicking thread panics in [`barrier_job`].
    #[derive(Clone, Copy, Debug)]
    enum When {
        /// Before its first barrier.
        First,
        /// After `k` barriers.
        After(usize),
        /// After its last barrier.
        Last,
    }

    const BARRIERS: usize = 40;

    /// A job of `BARRIERS` phases: each thread adds to its slot, meets the others, then checks
    /// that every thread finished the phase (a thread past a poisoned barrier would fail it).
    /// Thread `culprit` panics at `when`.
    fn barrier_job(
        pool: &ThreadPool,
        n: usize,
        culprit: usize,
        when: When,
    ) -> Result<RunStats, RunError> {
        let counts: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
        let stale = AtomicUsize::new(0);
        let r = pool.run_on(n, &|ctx| {
            for k in 0..BARRIERS {
                if ctx.ith == culprit && matches!(when, When::First if k == 0) {
                    panic!("boom first");
                }
                if ctx.ith == culprit && matches!(when, When::After(j) if j == k) {
                    panic!("boom after {k}");
                }
                counts[ctx.ith].fetch_add(1, Ordering::SeqCst);
                if ctx.barrier().is_err() {
                    return;
                }
                if counts.iter().any(|c| c.load(Ordering::SeqCst) < k + 1) {
                    stale.fetch_add(1, Ordering::SeqCst);
                }
            }
            if ctx.ith == culprit && matches!(when, When::Last) {
                std::panic::panic_any(format!("boom last on {}", ctx.ith));
            }
        });
        assert_eq!(
            stale.load(Ordering::SeqCst),
            0,
            "a thread passed a barrier early"
        );
        r
    }

    #[test]
    fn a_panic_on_any_thread_is_an_error_and_the_pool_runs_on() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n);
            for culprit in 0..n {
                for when in [When::First, When::After(1), When::After(17), When::Last] {
                    let err = barrier_job(&pool, n, culprit, when).unwrap_err();
                    let RunError::Panicked(p) = err else {
                        panic!("{err:?}");
                    };
                    assert_eq!(p.thread, culprit, "n {n} {when:?}");
                    let want = match when {
                        When::First => "boom first".to_owned(),
                        When::After(k) => format!("boom after {k}"),
                        When::Last => format!("boom last on {culprit}"),
                    };
                    assert_eq!(p.message.as_deref(), Some(want.as_str()));
                    // The same pool runs the next job in full.
                    let stats = barrier_job(&pool, n, usize::MAX, When::First).unwrap();
                    assert_eq!(stats.threads, n);
                }
            }
        }
    }

    #[test]
    fn a_panic_without_a_message_and_on_every_thread() {
        let pool = ThreadPool::new(3);
        let err = pool
            .run(&|ctx| {
                if ctx.ith == 2 {
                    std::panic::panic_any(42u32);
                }
                let _ = ctx.barrier();
            })
            .unwrap_err();
        assert_eq!(
            err,
            RunError::Panicked(JobPanicked {
                thread: 2,
                message: None
            })
        );
        let err = pool.run(&|_| panic!("all")).unwrap_err();
        assert!(
            matches!(err, RunError::Panicked(JobPanicked { ref message, .. })
            if message.as_deref() == Some("all"))
        );
        // A job that ignores the poison still gets through its barriers at once.
        let passed = AtomicUsize::new(0);
        let err = pool.run(&|ctx| {
            if ctx.ith == 0 {
                panic!("caller");
            }
            for _ in 0..1000 {
                let _ = ctx.barrier();
            }
            passed.fetch_add(1, Ordering::SeqCst);
        });
        assert!(err.is_err());
        assert_eq!(passed.load(Ordering::SeqCst), 2);
        pool.run(&|ctx| ctx.barrier().unwrap()).unwrap();
    }

    #[test]
    fn a_nested_run_is_refused() {
        let pool = ThreadPool::new(2);
        let other = ThreadPool::new(2);
        let answers = Mutex::new(Vec::new());
        pool.run(&|ctx| {
            let a = pool.run(&|_| {});
            let b = other.run_on(1, &|_| {});
            answers.lock().unwrap().push((ctx.ith, a, b));
        })
        .unwrap();
        let answers = answers.into_inner().unwrap();
        assert_eq!(answers.len(), 2);
        for (_, a, b) in answers {
            assert_eq!(a.unwrap_err(), RunError::Nested);
            assert_eq!(b.unwrap_err(), RunError::Nested);
        }
        // Both pools still work, and the caller is no longer marked as inside a job.
        pool.run(&|ctx| ctx.barrier().unwrap()).unwrap();
        other.run(&|ctx| ctx.barrier().unwrap()).unwrap();
    }

    #[test]
    fn threads_sharing_a_pool_take_turns() {
        let pool = Arc::new(ThreadPool::new(3));
        std::thread::scope(|scope| {
            for t in 0..4usize {
                let pool = Arc::clone(&pool);
                scope.spawn(move || {
                    for round in 0..200 {
                        let n = 1 + (t + round) % 3;
                        let slots: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                        let sums = AtomicUsize::new(0);
                        pool.run_on(n, &|ctx| {
                            assert_eq!(ctx.nth, n);
                            for k in 1..=5 {
                                slots[ctx.ith].store(k * (t + 1), Ordering::SeqCst);
                                ctx.barrier().unwrap();
                                let all: usize =
                                    slots.iter().map(|s| s.load(Ordering::SeqCst)).sum();
                                assert_eq!(all, n * k * (t + 1), "thread {t} round {round}");
                                ctx.barrier().unwrap();
                            }
                            sums.fetch_add(1, Ordering::SeqCst);
                        })
                        .unwrap();
                        assert_eq!(sums.load(Ordering::SeqCst), n);
                    }
                });
            }
        });
    }

    #[test]
    fn pools_and_executors_can_be_shared_and_sent() {
        fn shareable<T: Send + Sync>() {}
        fn sendable<T: Send>() {}
        shareable::<ThreadPool>();
        shareable::<Arc<ThreadPool>>();
        sendable::<crate::Executor>();
    }

    #[test]
    fn the_global_pool_is_shared_and_grows() {
        let a = ThreadPool::global(2);
        assert!(a.n_threads() >= 2);
        let b = ThreadPool::global(1);
        let c = ThreadPool::global(a.n_threads());
        let same = |x: &Arc<ThreadPool>, y: &Arc<ThreadPool>| Arc::ptr_eq(x, y);
        // Other tests may grow it meanwhile; a later pool is never smaller.
        assert!(same(&a, &b) || b.n_threads() >= a.n_threads());
        assert!(same(&a, &c) || c.n_threads() >= a.n_threads());
        let more = a.n_threads() + 1;
        let big = ThreadPool::global(more);
        assert!(big.n_threads() >= more);
        assert!(!same(&a, &big));
        let again = ThreadPool::global(more);
        assert!(again.n_threads() >= more);
        // The old pool keeps working.
        a.run(&|ctx| ctx.barrier().unwrap()).unwrap();
        big.run(&|ctx| ctx.barrier().unwrap()).unwrap();
    }
}
