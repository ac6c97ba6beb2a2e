//! Multi-process training's engine: process groups and collectives on `tch` tensors, on torch's
//! own c10d (the engine under `torch.distributed` and `torchrun`) through a small C++ shim
//! (`csrc/`). Gloo runs on CPU and is what the tests use; NCCL runs on CUDA behind the `nccl`
//! feature.
//!
//! - [`Rendezvous`]: torchrun's variables (`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`,
//!   `LOCAL_RANK`, `LOCAL_WORLD_SIZE`), so `torchrun --no-python <binary>` and SLURM scripts that
//!   export them just work.
//! - [`ProcessGroup`]: the world or a subgroup (data-parallel, context-parallel); blocking
//!   collectives with a per-group timeout, each placing its tensors on the group's device itself
//!   (and results back on the caller's), so no caller can hand NCCL a CPU tensor ([`ProcessGroup::with_timeout`] for one call), their
//!   traffic counted ([`CommStats`]); `all_gather_autograd`/`reduce_scatter_autograd` are
//!   differentiable (each one's backward is the other).
//! - [`Mesh`]: the run's processes as one object: rank, world size, the data-parallel ×
//!   context-parallel layout ([`layout`]), its groups, the device and the backend that follows
//!   from it (CUDA: NCCL; CPU: Gloo).
//! - [`launch`]: `--nproc N`, N local ranks as torchrun would start them.
//! - [`slurm`]: torchrun's variables computed from SLURM's, for tasks `srun` started without
//!   torchrun (the compressed node and tasks-per-node lists parsed).
//! - [`placement`]: every rank's host ([`exchange_hosts`], [`Mesh::hosts`]) and the
//!   [`Placement`] of the mesh on them: nodes × ranks, and the context-parallel groups that span
//!   hosts.
//! - [`Store`]: the rendezvous key-value store (c10d's TCPStore, hosted by rank 0).
//! - [`FailureWatch`]: one rank's error told to the others through the store within about a
//!   second, instead of through their collectives' timeout.
//! - [`DistError`]: every failure, naming the collective, group and rank; c10d's C++ exceptions
//!   are caught in the shim and never cross into Rust.
#![deny(missing_docs)]

mod env;
mod error;
mod failure;
mod ffi;
mod group;
pub mod launch;
mod mesh;
pub mod placement;
pub mod slurm;
mod store;
pub mod testing;

pub use env::Rendezvous;
pub use error::{DistError, Result};
pub use failure::{exit_now, Announcer, Failure, FailureWatch, WatchTimes};
pub use group::{Backend, CommStats, PendingReduceScatter, ProcessGroup, ReduceOp};
pub use mesh::{layout, Mesh, MeshShape};
pub use placement::{exchange_hosts, this_host, Node, Placement};
pub use store::Store;
