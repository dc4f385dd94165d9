//! The ranks of a data-parallel `tnn finetune` / `tnn train`: this process alone, or every
//! process of an `mpirun` job when `tnn` is built with the `mpi` feature.
//!
//! Under `mpirun -np N`, each of the N processes trains on its shard of every global batch and
//! the gradients are summed with MPI (`tinynn_train::collective::Collective`). An error on one
//! rank aborts the whole job (`MPI_Abort`), and so does a panic (the process aborts and
//! `mpirun` ends the others): no rank is left waiting in a reduction. A build without the
//! feature refuses to run as one of several MPI processes rather than train N copies of the
//! same model into one directory.

use std::sync::OnceLock;

use anyhow::{bail, Result};
use tinynn_train::collective::{Collective, Solo};

/// Set once MPI has told how many ranks share this machine.
static CORES_PER_RANK: OnceLock<usize> = OnceLock::new();

/// The cores this process should use for its threads: those the system lets it run on, or,
/// under an `mpirun` that bound nothing (every rank may run on every core), its share of them
/// among the ranks on this machine.
pub fn cores_per_rank() -> usize {
    CORES_PER_RANK
        .get()
        .copied()
        .unwrap_or_else(crate::generate::all_cores)
}

/// `available` cores for this process (its affinity), `online` on the machine, `local` ranks
/// on it: the cores that are this rank's.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // (and the tests)
fn share(available: usize, online: usize, local: usize) -> usize {
    if local > 1 && available >= online {
        (available / local).max(1)
    } else {
        available.max(1)
    }
}

/// The machine's online CPUs (`/sys/devices/system/cpu/online`, e.g. `0-3,6,8-9`).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))] // (and the tests)
fn online_cpus() -> Option<usize> {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let mut n = 0;
    for part in list.trim().split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    Some(n)
}

/// Whether a data-parallel step should sum gradients during its backward pass: only when a
/// core of this rank's is left for it. MPI waits by spinning; beside threads that fill every
/// core it takes their time (measured on 2 cores, 2 ranks × 1 thread, 6 steps of full
/// fine-tuning: 30.4 s with overlap against 22.0 s without).
pub fn overlap_by_default(threads: usize) -> bool {
    cores_per_rank() > threads
}

/// Rank 0's hint when the ranks have fewer cores than threads.
pub fn warn_if_crowded(threads: usize, comm: &dyn Collective) {
    let cores = cores_per_rank();
    if comm.size() > 1 && comm.rank() == 0 && threads > cores {
        eprintln!(
            "warning: each rank runs {threads} threads on {cores} core(s) of its own; mpirun \
             binds each rank to one core unless told otherwise (Open MPI: `--bind-to none`, or \
             `--map-by slot:PE={threads}`)"
        );
    }
}

/// The job size an MPI launcher gave this process, from its environment (Open MPI, MPICH and
/// Intel MPI's Hydra, MVAPICH, PMIx); `None` when not started by one.
pub fn launched_size() -> Option<usize> {
    [
        "OMPI_COMM_WORLD_SIZE",
        "PMI_SIZE",
        "PMIX_SIZE",
        "MV2_COMM_WORLD_SIZE",
        "MPI_LOCALNRANKS",
    ]
    .iter()
    .find_map(|k| std::env::var(k).ok()?.trim().parse().ok())
}

/// Runs `f` with this process's ranks: MPI's world when started by an MPI launcher (and built
/// with the `mpi` feature), this process alone otherwise.
pub fn with_ranks(f: impl FnOnce(&mut dyn Collective) -> Result<()>) -> Result<()> {
    match launched_size() {
        Some(n) if n > 1 => run_mpi(n, f),
        _ => f(&mut Solo),
    }
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(n: usize, _f: impl FnOnce(&mut dyn Collective) -> Result<()>) -> Result<()> {
    bail!(
        "this process is one of {n} started by mpirun, but this tnn was built without MPI; \
         build it with `cargo install --path crates/tinynn-cli --features mpi` (Open MPI or \
         MPICH and libclang must be installed), or run it without mpirun"
    )
}

#[cfg(feature = "mpi")]
fn run_mpi(n: usize, f: impl FnOnce(&mut dyn Collective) -> Result<()>) -> Result<()> {
    use mpi::traits::Communicator;

    // The compute threads (the pool, and the backward pass a step runs beside its
    // reductions) never call MPI; only this thread does.
    let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
        bail!("MPI was already initialized in this process");
    };
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
    let local = world.split_shared(rank as i32).size() as usize;
    let available = crate::generate::all_cores();
    let online = online_cpus().unwrap_or(available);
    let _ = CORES_PER_RANK.set(share(available, online, local));
    if size != n {
        bail!("the launcher says {n} processes, MPI's world has {size}");
    }
    // A panic on one rank would leave the others waiting in a reduction: abort the process
    // after the message (mpirun then ends the job).
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        eprintln!("error: rank {rank} of {size} panicked; aborting the job");
        std::process::abort();
    }));
    let mut comm = mpi_collective::Mpi { world };
    match f(&mut comm) {
        Ok(()) => Ok(()),
        Err(e) => {
            let msg = format!("{e:#}").replace(['\n', '\r'], " ");
            eprintln!("error: rank {rank} of {size}: {msg}; aborting the job");
            comm.world.abort(1)
        }
    }
    // `universe` is dropped here: MPI_Finalize, after every rank returned.
}

#[cfg(feature = "mpi")]
mod mpi_collective {
    use mpi::collective::SystemOperation;
    use mpi::topology::SimpleCommunicator;
    use mpi::traits::{Communicator, CommunicatorCollectives};
    use tinynn_train::collective::Collective;
    use tinynn_train::{Result, TrainError};

    /// MPI's world communicator as a [`Collective`].
    pub struct Mpi {
        pub world: SimpleCommunicator,
    }

    impl Collective for Mpi {
        fn rank(&self) -> usize {
            self.world.rank() as usize
        }
        fn size(&self) -> usize {
            self.world.size() as usize
        }
        fn all_reduce_sum_f32(&mut self, send: &[f32], recv: &mut [f32]) -> Result<()> {
            if send.len() != recv.len() {
                return Err(TrainError::Collective(format!(
                    "all-reduce buffers differ in length: {} sent, {} to receive",
                    send.len(),
                    recv.len()
                )));
            }
            // MPI's default error handler aborts the job on a failed collective.
            self.world
                .all_reduce_into(send, recv, SystemOperation::sum());
            Ok(())
        }
        fn all_reduce_sum_f64(&mut self, values: &mut [f64]) -> Result<()> {
            let send = values.to_vec();
            self.world
                .all_reduce_into(&send[..], values, SystemOperation::sum());
            Ok(())
        }
        fn all_reduce_max_u64(&mut self, values: &mut [u64]) -> Result<()> {
            let send = values.to_vec();
            self.world
                .all_reduce_into(&send[..], values, SystemOperation::max());
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_on_one_machine_share_its_cores_unless_bound() {
        // Unbound: every rank sees all 8 cores.
        assert_eq!(share(8, 8, 2), 4);
        assert_eq!(share(8, 8, 3), 2);
        assert_eq!(share(2, 2, 4), 1);
        // Bound by mpirun to their own cores, or alone.
        assert_eq!(share(1, 8, 2), 1);
        assert_eq!(share(4, 8, 2), 4);
        assert_eq!(share(8, 8, 1), 8);
        assert!(online_cpus().is_some_and(|n| n >= 1));
    }
}
