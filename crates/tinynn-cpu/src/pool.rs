//! A persistent thread pool that runs one job on every thread, with a barrier the job uses
//! between dependent steps. Waiting spins briefly, then sleeps on a futex, so a busy core
//! elsewhere does not turn our waits into stolen time slices.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Spins before sleeping: roughly a few microseconds, enough for a sibling finishing a step.
const SPIN: u32 = 4096;

/// What a job sees: its thread index, the thread count, and the shared barrier.
pub struct Ctx<'a> {
    pub ith: usize,
    pub nth: usize,
    barrier: &'a Barrier,
}

impl Ctx<'_> {
    /// Waits until every thread of the job has reached this point.
    pub fn barrier(&self) {
        self.barrier.wait(self.nth);
    }
}

type Job<'a> = &'a (dyn Fn(&Ctx<'_>) + Sync);

struct Barrier {
    arrived: AtomicU32,
    generation: AtomicU32,
    /// Nanoseconds threads spent asleep waiting (in barriers and for the run's end) during
    /// the current run: the sign that a sibling is not getting a core.
    slept_ns: AtomicU64,
}

impl Barrier {
    fn wait(&self, n: usize) {
        if n == 1 {
            return;
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == n as u32 {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            atomic_wait::wake_all(&self.generation);
            return;
        }
        wait_while_equal(&self.generation, gen, Some(&self.slept_ns));
    }
}

/// Returns once `a` no longer holds `value`; time spent asleep is added to `slept_ns`.
fn wait_while_equal(a: &AtomicU32, value: u32, slept_ns: Option<&AtomicU64>) {
    for _ in 0..SPIN {
        if a.load(Ordering::Acquire) != value {
            return;
        }
        std::hint::spin_loop();
    }
    let t0 = slept_ns.map(|_| Instant::now());
    while a.load(Ordering::Acquire) == value {
        atomic_wait::wait(a, value);
    }
    if let (Some(s), Some(t0)) = (slept_ns, t0) {
        s.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// How a run went: its wall time and the time its threads slept waiting for each other.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    pub wall: Duration,
    pub slept: Duration,
    pub threads: usize,
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
    n_threads: usize,
}

// SAFETY: `job` is written only by `ThreadPool::run` before it bumps `start` (Release) and after
// every worker has reported `done` (Acquire); workers read it only in between. All other fields
// are atomics.
unsafe impl Sync for Shared {}

pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl ThreadPool {
    /// A pool running jobs on `n_threads` threads: the caller's plus `n_threads - 1` workers.
    pub fn new(n_threads: usize) -> ThreadPool {
        let n_threads = n_threads.clamp(1, 255);
        let shared = Arc::new(Shared {
            job: UnsafeCell::new(None),
            start: AtomicU32::new(0),
            done: AtomicU32::new(0),
            stop: AtomicBool::new(false),
            barrier: Barrier {
                arrived: AtomicU32::new(0),
                generation: AtomicU32::new(0),
                slept_ns: AtomicU64::new(0),
            },
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
        ThreadPool { shared, workers }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Runs `job` on every thread and returns when all have finished.
    pub fn run(&self, job: &(dyn Fn(&Ctx<'_>) + Sync)) {
        self.run_on(self.shared.n_threads, job);
    }

    /// Runs `job` on the first `n` threads (at least 1, at most the pool's); the others stay
    /// asleep and are not waited for.
    pub fn run_on(&self, n: usize, job: &(dyn Fn(&Ctx<'_>) + Sync)) -> RunStats {
        let s = &*self.shared;
        let n = n.clamp(1, s.n_threads);
        let t0 = Instant::now();
        s.barrier.slept_ns.store(0, Ordering::Relaxed);
        if n > 1 {
            // SAFETY: no worker is running (the previous run waited for all of them), so nobody
            // reads `job` now; the 'static lifetime is a lie we keep honest by clearing the slot
            // below before `job`'s real lifetime ends.
            unsafe {
                *s.job.get() = Some(std::mem::transmute::<Job<'_>, Job<'static>>(job));
            }
            s.done.store(0, Ordering::Relaxed);
            let next = ((s.start.load(Ordering::Relaxed) >> 8).wrapping_add(1) << 8) | n as u32;
            s.start.store(next, Ordering::Release);
            atomic_wait::wake_all(&s.start);
        }
        job(&Ctx {
            ith: 0,
            nth: n,
            barrier: &s.barrier,
        });
        if n > 1 {
            let workers = n as u32 - 1;
            loop {
                let done = s.done.load(Ordering::Acquire);
                if done == workers {
                    break;
                }
                wait_while_equal(&s.done, done, Some(&s.barrier.slept_ns));
            }
            // SAFETY: every worker has finished with the job (done == workers, Acquire).
            unsafe {
                *s.job.get() = None;
            }
        }
        RunStats {
            wall: t0.elapsed(),
            slept: Duration::from_nanos(s.barrier.slept_ns.load(Ordering::Relaxed)),
            threads: n,
        }
    }
}

fn worker(s: &Shared, ith: usize) {
    let mut seen = 0u32;
    loop {
        wait_while_equal(&s.start, seen, None);
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
            job(&Ctx {
                ith,
                nth: active,
                barrier: &s.barrier,
            });
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
                    ctx.barrier();
                    seen_after_barrier.fetch_add(phase1.load(Ordering::SeqCst), Ordering::SeqCst);
                    ctx.barrier();
                });
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
            let stats = pool.run_on(n, &|ctx| {
                assert_eq!(ctx.nth, n);
                ran.fetch_add(1, Ordering::SeqCst);
                max_ith.fetch_max(ctx.ith, Ordering::SeqCst);
                ctx.barrier();
            });
            assert_eq!(ran.load(Ordering::SeqCst), n, "round {round}");
            assert_eq!(max_ith.load(Ordering::SeqCst), n - 1);
            assert_eq!(stats.threads, n);
            assert!(stats.slept <= stats.wall * n as u32 + Duration::from_millis(50));
        }
    }
}
