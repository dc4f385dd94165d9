//! How many threads the next run uses when some do not get a core.

use crate::pool::RunStats;

/// The thread count of the next run (see `ExecOptions::adaptive_threads`).
#[derive(Clone, Copy)]
pub(super) struct ThreadChoice {
    pub(super) adaptive: bool,
    /// Threads of the next run.
    pub(super) active: usize,
    /// Runs left on one thread before trying all again.
    pub(super) cooldown: u32,
    /// The next cooldown if the machine is still busy.
    pub(super) backoff: u32,
    /// Threads of the last run (for traces).
    pub(super) last: usize,
}

impl ThreadChoice {
    pub(super) const FIRST_BACKOFF: u32 = 8;
    const MAX_BACKOFF: u32 = 512;

    pub(super) fn after(&mut self, stats: RunStats, all: usize) {
        self.last = stats.threads;
        if !self.adaptive || all == 1 {
            return;
        }
        if stats.threads > 1 {
            let budget = stats.wall * stats.threads as u32 / 4;
            if stats.slept > budget {
                self.active = 1;
                self.cooldown = self.backoff;
                self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
            } else {
                self.backoff = Self::FIRST_BACKOFF;
            }
        } else if self.cooldown > 0 {
            self.cooldown -= 1;
            if self.cooldown == 0 {
                self.active = all;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stats(threads: usize, wall_ms: u64, slept_ms: u64) -> RunStats {
        RunStats {
            wall: Duration::from_millis(wall_ms),
            slept: Duration::from_millis(slept_ms),
            threads,
        }
    }

    #[test]
    fn busy_runs_fall_back_to_one_thread_and_retry_with_backoff() {
        let mut c = ThreadChoice {
            adaptive: true,
            active: 2,
            cooldown: 0,
            backoff: ThreadChoice::FIRST_BACKOFF,
            last: 2,
        };
        // Quiet runs keep both threads.
        c.after(stats(2, 10, 1), 2);
        assert_eq!(c.active, 2);
        // A run whose threads slept through most of it: one thread for 8 runs.
        c.after(stats(2, 10, 15), 2);
        assert_eq!(c.active, 1);
        for _ in 0..7 {
            c.after(stats(1, 5, 0), 2);
            assert_eq!(c.active, 1);
        }
        c.after(stats(1, 5, 0), 2);
        assert_eq!(c.active, 2);
        // Still busy: twice as long on one thread.
        c.after(stats(2, 10, 15), 2);
        assert_eq!((c.active, c.cooldown), (1, 16));
        for _ in 0..16 {
            c.after(stats(1, 5, 0), 2);
        }
        assert_eq!(c.active, 2);
        // Quiet again: the backoff resets.
        c.after(stats(2, 10, 0), 2);
        assert_eq!((c.active, c.backoff), (2, ThreadChoice::FIRST_BACKOFF));
        // Never more than 512 runs.
        for _ in 0..20 {
            c.after(stats(2, 10, 15), 2);
            c.active = 2;
        }
        assert_eq!(c.backoff, ThreadChoice::MAX_BACKOFF);
        // Off: nothing changes.
        let mut off = ThreadChoice {
            adaptive: false,
            ..c
        };
        off.active = 2;
        off.after(stats(2, 10, 15), 2);
        assert_eq!(off.active, 2);
    }
}
