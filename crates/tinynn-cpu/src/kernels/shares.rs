//! How a step's items (a product's 16-row groups, a GEMM's tiles) go to its threads
//! ([`StepArgs::for_shares`](super::StepArgs::for_shares)): thread `t` owns the contiguous
//! share `kernels::split` gives it and takes it from the front, in chunks of a quarter of what
//! is left; a thread whose share is empty takes from the back of the others', so a thread a
//! busy sibling core slows hands its last items to the one that is free.
//!
//! Each thread thus reads its weights as one forward stream that never jumps, and only a thread
//! that ran out of work starts new streams. Before, a static three quarters and then the last
//! quarter in small chunks from one shared counter: the first thread jumped from its share to
//! the shared part, both threads then took alternate chunks (every chunk a new stream), and
//! every chunk was a locked add on a cache line the two cores passed back and forth. A C
//! model of a SmolLM2 Q8_0 token's products (the same group sizes, 2 threads, interleaved)
//! streamed 43 GB/s that way against 48 GB/s by shares and 55 GB/s by a static split, on a
//! host whose 2-thread probe read 47 GB/s; at 33–35 GB/s the three were within 5%.

use std::ops::Range;

use super::split;
use std::sync::atomic::{AtomicU64, Ordering};

/// One thread's share of a step's items: how many were taken from its front (by its owner,
/// high 32 bits) and from its back (by other threads, low 32 bits). Zero when the step
/// starts. Aligned to 128 bytes so no two shares sit in one pair of cache lines (the L2
/// prefetcher fetches lines in pairs): the owner's takes stay in its own core's cache.
#[derive(Default)]
#[repr(align(128))]
pub(crate) struct Share(AtomicU64);

/// Largest item count a share handles (the counts are 32-bit halves of one word).
pub(crate) const MAX_ITEMS: usize = u32::MAX as usize;

impl Share {
    /// Back to "nothing taken" (between steps, by its owner, when no other thread reads it).
    #[inline]
    pub fn reset(&self) {
        self.0.store(0, Ordering::Relaxed);
    }

    /// Takes the next items from the front of a share of `len` items (offsets within it):
    /// a quarter of what is left, at least one; `None` when nothing is left.
    #[inline]
    pub fn take_front(&self, len: usize) -> Option<Range<usize>> {
        self.take(len, true)
    }

    /// Takes items from the back of a share of `len` items (offsets within it): an eighth of
    /// what is left, at least one; `None` when nothing is left.
    #[inline]
    pub fn take_back(&self, len: usize) -> Option<Range<usize>> {
        self.take(len, false)
    }

    fn take(&self, len: usize, front: bool) -> Option<Range<usize>> {
        // Only the item counts are shared through the word: Relaxed (the step's barrier
        // orders what the items' work reads and writes).
        let mut word = self.0.load(Ordering::Relaxed);
        loop {
            let (f, b) = ((word >> 32) as usize, (word & u64::from(u32::MAX)) as usize);
            let left = len.saturating_sub(f + b);
            if left == 0 {
                return None;
            }
            let (k, next, taken) = if front {
                let k = (left / 4).max(1);
                (k, word + ((k as u64) << 32), f..f + k)
            } else {
                let k = (left / 8).max(1);
                (k, word + k as u64, len - b - k..len - b)
            };
            debug_assert!(k <= left);
            match self
                .0
                .compare_exchange_weak(word, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(taken),
                Err(now) => word = now,
            }
        }
    }
}

/// Calls `f` on every range of `0..n` thread `ith` of `nth` takes (see the module doc):
/// its own share from the front, then the others' from their backs, starting with the next
/// thread's. `shares` holds one zeroed [`Share`] per thread.
pub(crate) fn for_each_taken(
    shares: &[Share],
    n: usize,
    ith: usize,
    nth: usize,
    mut f: impl FnMut(Range<usize>),
) {
    debug_assert!(shares.len() >= nth && n <= MAX_ITEMS);
    let own = split(n, ith, nth);
    while let Some(r) = shares[ith].take_front(own.len()) {
        f(own.start + r.start..own.start + r.end);
    }
    for v in (1..nth).map(|d| (ith + d) % nth) {
        let other = split(n, v, nth);
        while let Some(r) = shares[v].take_back(other.len()) {
            f(other.start + r.start..other.start + r.end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Every item is handed out exactly once, to a thread, whatever the counts and however
    /// the threads interleave; each thread's own share comes first, in order.
    #[test]
    fn every_item_goes_to_exactly_one_thread() {
        for nth in 1..=5usize {
            for n in [0usize, 1, 2, 3, 7, 16, 36, 60, 97, 192, 1000] {
                for round in 0..4 {
                    let shares: Vec<Share> = (0..nth).map(|_| Share::default()).collect();
                    let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    let firsts: Vec<Vec<Range<usize>>> = std::thread::scope(|s| {
                        let handles: Vec<_> = (0..nth)
                            .map(|ith| {
                                let (shares, seen) = (&shares, &seen);
                                s.spawn(move || {
                                    let mut got = Vec::new();
                                    for_each_taken(shares, n, ith, nth, |r| {
                                        for i in r.clone() {
                                            seen[i].fetch_add(1, Ordering::Relaxed);
                                        }
                                        got.push(r);
                                        // Uneven speeds: thread 0 slow in odd rounds.
                                        if round % 2 == 1 && ith == 0 {
                                            std::thread::yield_now();
                                        }
                                    });
                                    got
                                })
                            })
                            .collect();
                        handles.into_iter().map(|h| h.join().unwrap()).collect()
                    });
                    for (i, c) in seen.iter().enumerate() {
                        assert_eq!(c.load(Ordering::Relaxed), 1, "n={n} nth={nth}: item {i}");
                    }
                    for (ith, got) in firsts.iter().enumerate() {
                        // The owner's ranges in its share run contiguously from its start;
                        // what others took from it lies past them.
                        let own = split(n, ith, nth);
                        let mut end = own.start;
                        for r in got.iter().filter(|r| own.contains(&r.start)) {
                            assert_eq!(r.start, end, "n={n} nth={nth}: thread {ith} jumped");
                            end = r.end;
                        }
                        for (t, theirs) in firsts.iter().enumerate().filter(|&(t, _)| t != ith) {
                            for r in theirs.iter().filter(|r| own.contains(&r.start)) {
                                assert!(r.start >= end, "n={n}: {t} took {r:?} before {end}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// Threads that never come (descheduled for the whole step) leave nothing undone: the
    /// ones that run take every absent thread's share.
    #[test]
    fn the_threads_that_run_take_the_shares_of_those_that_never_come() {
        for nth in 2..=5usize {
            for absent in 1..(1u32 << nth) - 1 {
                for n in [1usize, 5, 36, 97] {
                    let shares: Vec<Share> = (0..nth).map(|_| Share::default()).collect();
                    let seen: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                    for ith in (0..nth).filter(|t| absent & (1 << t) == 0) {
                        for_each_taken(&shares, n, ith, nth, |r| {
                            r.for_each(|i| _ = seen[i].fetch_add(1, Ordering::Relaxed))
                        });
                    }
                    for (i, c) in seen.iter().enumerate() {
                        let c = c.load(Ordering::Relaxed);
                        assert_eq!(c, 1, "n={n} nth={nth} absent {absent:b}: item {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn chunks_shrink_toward_the_end_and_stop_when_empty() {
        let s = Share::default();
        let got: Vec<_> = std::iter::from_fn(|| s.take_front(96)).collect();
        assert_eq!(got.first(), Some(&(0..24)));
        assert_eq!(got.last().map(|r| r.len()), Some(1));
        assert_eq!(got.last().map(|r| r.end), Some(96));
        assert!(got.windows(2).all(|w| w[0].end == w[1].start));
        let s = Share::default();
        assert_eq!(s.take_back(16), Some(14..16));
        assert_eq!(s.take_front(16), Some(0..3));
        assert_eq!(s.take_back(16), Some(13..14));
        s.reset();
        assert_eq!(s.take_front(0), None);
        assert_eq!(s.take_back(1), Some(0..1));
        assert_eq!(s.take_front(1), None);
    }
}
