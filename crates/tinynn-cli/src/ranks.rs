//! The ranks of a data-parallel `tnn finetune` / `tnn train`: this process alone, or every
//! process of an `mpirun` job when `tnn` is built with the `mpi` feature.
//!
//! Under `mpirun -np N`, each of the N processes trains on its shard of every global batch and
//! the gradients are summed with MPI (`tinynn_train::collective::Collective`). An error on one
//! rank aborts the whole job (`MPI_Abort`), and so does a panic (the process aborts and
//! `mpirun` ends the others): no rank is left waiting in a reduction. A build without the
//! feature refuses to run as one of several MPI processes rather than train N copies of the
//! same model into one directory.

use anyhow::{bail, Result};
use tinynn_train::collective::{Collective, Solo};

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

    let Some(universe) = mpi::initialize() else {
        bail!("MPI was already initialized in this process");
    };
    let world = universe.world();
    let (rank, size) = (world.rank() as usize, world.size() as usize);
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
