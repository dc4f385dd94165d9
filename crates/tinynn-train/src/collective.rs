//! Data-parallel training across processes: the few collective operations the training loop
//! needs ([`Collective`]), one process alone ([`Solo`]), and a group of threads in one process
//! ([`ThreadGroup`], for tests and for tools that train several replicas side by side).
//!
//! An MPI implementation lives in the `tnn` command line (its `mpi` feature), so that this
//! crate does not depend on a system MPI. Every rank of a group calls the same operations in
//! the same order; a sum is reduced in rank order by [`ThreadGroup`], and by MPI in an order
//! fixed for a given number of ranks, so a run repeated with the same ranks gives the same bits.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{Result, TrainError};

/// The collective operations of a group of `size` ranks (processes or threads), one of which
/// is this one. Every rank must make the same calls in the same order with buffers of the same
/// length; a rank that fails instead must end the group (MPI: abort) rather than leave the
/// others waiting.
pub trait Collective {
    /// This rank, `0..size`.
    fn rank(&self) -> usize;
    /// The number of ranks.
    fn size(&self) -> usize;
    /// `recv[i] = Σ over ranks of send[i]` on every rank (`send.len() == recv.len()`).
    fn all_reduce_sum_f32(&mut self, send: &[f32], recv: &mut [f32]) -> Result<()>;
    /// `values[i] = Σ over ranks of values[i]`, in place, on every rank.
    fn all_reduce_sum_f64(&mut self, values: &mut [f64]) -> Result<()>;
    /// `values[i] = max over ranks of values[i]`, in place, on every rank.
    fn all_reduce_max_u64(&mut self, values: &mut [u64]) -> Result<()>;
}

/// One process alone: every reduction is the identity.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Collective for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn all_reduce_sum_f32(&mut self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_lengths(send.len(), recv.len())?;
        recv.copy_from_slice(send);
        Ok(())
    }
    fn all_reduce_sum_f64(&mut self, _values: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_max_u64(&mut self, _values: &mut [u64]) -> Result<()> {
        Ok(())
    }
}

fn check_lengths(send: usize, recv: usize) -> Result<()> {
    if send != recv {
        return Err(TrainError::Collective(format!(
            "all-reduce buffers differ in length: {send} sent, {recv} to receive"
        )));
    }
    Ok(())
}

/// Checks that every rank holds the same `value` (a hash of the run's settings, a step): an
/// error names `what` and the ranks' spread otherwise. Every rank must call it.
pub fn agree(comm: &mut dyn Collective, what: &str, value: u64) -> Result<()> {
    // max(v) and max(!v) = !min(v): one reduction gives both ends.
    let mut v = [value, !value];
    comm.all_reduce_max_u64(&mut v)?;
    let (max, min) = (v[0], !v[1]);
    if max != min {
        return Err(TrainError::Collective(format!(
            "the ranks disagree on {what} (rank {} has {value:#x}; the ranks range over {min:#x}..={max:#x})",
            comm.rank()
        )));
    }
    Ok(())
}

/// FNV-1a over `bytes`, continuing from `h` (start from [`FNV_START`]): the fingerprints
/// [`agree`] compares.
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// FNV-1a's offset basis.
pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// What the threads of a [`ThreadGroup`] share: each rank's contribution (as bits), and a
/// barrier that a rank leaving the group (dropped, after an error or a panic) breaks.
struct Shared {
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    slots: Vec<Vec<u64>>,
    /// Ranks waiting at the barrier, and how many times it has opened.
    arrived: usize,
    generation: u64,
    /// A rank that left the group.
    left: Option<usize>,
}

/// One rank of a group of threads in one process; [`ThreadGroup::new`] makes all of them. Sums
/// are taken in rank order (in f64, rounded once), so every rank gets the same bits. A rank
/// dropped while others wait in (or later enter) an operation makes theirs an error rather
/// than a hang.
pub struct ThreadGroup {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

impl Drop for ThreadGroup {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.left.get_or_insert(self.rank);
        self.shared.turn.notify_all();
    }
}

impl ThreadGroup {
    /// `size` ranks (`size ≥ 1`), to be moved to one thread each.
    pub fn new(size: usize) -> Vec<ThreadGroup> {
        let size = size.max(1);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots: vec![Vec::new(); size],
                arrived: 0,
                generation: 0,
                left: None,
            }),
            turn: Condvar::new(),
        });
        (0..size)
            .map(|rank| ThreadGroup {
                rank,
                size,
                shared: shared.clone(),
            })
            .collect()
    }

    /// Waits until every rank has arrived (with `st` locked); an error once a rank has left.
    fn barrier<'a>(&'a self, mut st: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        let left = |r: usize| TrainError::Collective(format!("rank {r} left the group"));
        if let Some(r) = st.left {
            return Err(left(r));
        }
        st.arrived += 1;
        if st.arrived == self.size {
            st.arrived = 0;
            st.generation += 1;
            self.shared.turn.notify_all();
            return Ok(st);
        }
        let generation = st.generation;
        while st.generation == generation {
            if let Some(r) = st.left {
                return Err(left(r));
            }
            st = self.shared.turn.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        Ok(st)
    }

    /// Every rank posts `mine`; returns the element-wise `fold` over ranks in rank order.
    fn exchange(&self, mine: Vec<u64>, fold: impl Fn(u64, u64) -> u64) -> Result<Vec<u64>> {
        let n = mine.len();
        let mut st = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        st.slots[self.rank] = mine;
        let st = self.barrier(st)?;
        let out = match st.slots.iter().position(|s| s.len() != n) {
            Some(bad) => Err(TrainError::Collective(format!(
                "rank {bad} reduced {} values, rank {} reduced {n}",
                st.slots[bad].len(),
                self.rank
            ))),
            None => {
                let mut out = st.slots[0].clone();
                for s in &st.slots[1..] {
                    for (o, &v) in out.iter_mut().zip(s) {
                        *o = fold(*o, v);
                    }
                }
                Ok(out)
            }
        };
        // Nobody posts the next round before everyone has read this one.
        drop(self.barrier(st)?);
        out
    }
}

fn add_f64_bits(a: u64, b: u64) -> u64 {
    (f64::from_bits(a) + f64::from_bits(b)).to_bits()
}

impl Collective for ThreadGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn size(&self) -> usize {
        self.size
    }
    fn all_reduce_sum_f32(&mut self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        check_lengths(send.len(), recv.len())?;
        // A sum of f32 values in f64 is exact for two ranks, and one rounding for more.
        let mine = send.iter().map(|&v| f64::from(v).to_bits()).collect();
        let out = self.exchange(mine, add_f64_bits)?;
        for (r, v) in recv.iter_mut().zip(out) {
            *r = f64::from_bits(v) as f32;
        }
        Ok(())
    }
    fn all_reduce_sum_f64(&mut self, values: &mut [f64]) -> Result<()> {
        let out = self.exchange(values.iter().map(|v| v.to_bits()).collect(), add_f64_bits)?;
        for (v, o) in values.iter_mut().zip(out) {
            *v = f64::from_bits(o);
        }
        Ok(())
    }
    fn all_reduce_max_u64(&mut self, values: &mut [u64]) -> Result<()> {
        let out = self.exchange(values.to_vec(), u64::max)?;
        values.copy_from_slice(&out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_threads<T: Send + 'static>(
        n: usize,
        f: impl Fn(ThreadGroup) -> T + Send + Sync + Clone + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = ThreadGroup::new(n)
            .into_iter()
            .map(|g| {
                let f = f.clone();
                std::thread::spawn(move || f(g))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn sums_and_maxima_agree_on_every_rank() {
        for n in 1..=4 {
            let out = on_threads(n, |mut g| {
                let r = g.rank() as f32;
                let send = [r, 1.0, -r * 0.5];
                let mut recv = [0.0; 3];
                g.all_reduce_sum_f32(&send, &mut recv).unwrap();
                let mut m = [g.rank() as u64 * 3 + (1 << 40), u64::MAX - g.rank() as u64];
                g.all_reduce_max_u64(&mut m).unwrap();
                let mut d = [0.25 * g.rank() as f64];
                g.all_reduce_sum_f64(&mut d).unwrap();
                (recv, m, d)
            });
            let tri = (n * (n - 1) / 2) as f32;
            for (recv, m, d) in &out {
                assert_eq!(*recv, [tri, n as f32, -0.5 * tri]);
                assert_eq!(*m, [(n as u64 - 1) * 3 + (1 << 40), u64::MAX]);
                assert_eq!(*d, [0.25 * tri as f64]);
            }
        }
    }

    #[test]
    fn agree_names_what_differs() {
        let out = on_threads(3, |mut g| {
            let same = agree(&mut g, "the step", 7);
            let mine = g.rank() as u64 / 2;
            let differs = agree(&mut g, "the settings", mine);
            (same.is_ok(), differs.map_err(|e| e.to_string()))
        });
        for (same, differs) in out {
            assert!(same);
            let msg = differs.unwrap_err();
            assert!(
                msg.contains("the settings") && msg.contains("0x0..=0x1"),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_rank_that_leaves_makes_the_others_fail_instead_of_hang() {
        let out = on_threads(3, |mut g| {
            if g.rank() == 2 {
                return None;
            }
            let mut v = [1u64];
            Some(g.all_reduce_max_u64(&mut v).map_err(|e| e.to_string()))
        });
        for r in out.into_iter().flatten() {
            assert_eq!(
                r.unwrap_err(),
                "data-parallel training: rank 2 left the group"
            );
        }
    }

    #[test]
    fn mismatched_lengths_are_an_error_on_every_rank() {
        let out = on_threads(2, |mut g| {
            let n = 2 + g.rank();
            let mut recv = vec![0.0; n];
            g.all_reduce_sum_f32(&vec![1.0; n], &mut recv).is_err()
        });
        assert_eq!(out, [true, true]);
        let mut recv = [0.0; 2];
        assert!(Solo.all_reduce_sum_f32(&[1.0], &mut recv).is_err());
    }
}
