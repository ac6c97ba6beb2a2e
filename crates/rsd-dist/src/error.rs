//! The crate's one error type.
use std::time::Duration;

/// Everything that can go wrong in rendezvous, group creation and collectives. Messages say what
/// to change (a variable, a port) where that is known; `message` fields carry c10d's own text.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// A rendezvous variable is not set.
    #[error(
        "environment variable {name} is not set; expected {expected} (torchrun sets it; \
         launch with `torchrun --no-python --nproc-per-node N <program>` or export it)"
    )]
    MissingEnv {
        /// The variable.
        name: &'static str,
        /// What it should hold.
        expected: &'static str,
    },
    /// A rendezvous variable is set to something unusable.
    #[error("environment variable {name}={value} is invalid; expected {expected}")]
    InvalidEnv {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// What it should hold.
        expected: String,
    },
    /// Rank 0 cannot host the rendezvous store because its port is taken.
    #[error(
        "rank 0 cannot host the rendezvous store on port {port}: the port is already in use \
         (another job or a stale process holds it; set MASTER_PORT to a free port): {message}"
    )]
    PortInUse {
        /// MASTER_PORT.
        port: u16,
        /// c10d's message.
        message: String,
    },
    /// A rank could not connect to the rendezvous store within the timeout.
    #[error(
        "rank {rank} could not reach the rendezvous store at {addr}:{port} within {} ms \
         (is rank 0 running, and are MASTER_ADDR and MASTER_PORT the same on every rank?): \
         {message}", timeout.as_millis()
    )]
    MasterUnreachable {
        /// MASTER_ADDR.
        addr: String,
        /// MASTER_PORT.
        port: u16,
        /// This process's rank.
        rank: usize,
        /// How long it tried.
        timeout: Duration,
        /// c10d's message.
        message: String,
    },
    /// Ranks disagree on WORLD_SIZE.
    #[error(
        "world size mismatch: rank {rank} has WORLD_SIZE={ours} but rank 0 has WORLD_SIZE={master}"
    )]
    WorldSizeMismatch {
        /// The rank that noticed.
        rank: usize,
        /// Its WORLD_SIZE.
        ours: usize,
        /// Rank 0's WORLD_SIZE.
        master: usize,
    },
    /// Two processes claimed the same RANK.
    #[error("two processes joined the rendezvous with RANK={rank}; every rank must be unique")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
    },
    /// Another rank failed the rendezvous, so this one stops too.
    #[error("rank {rank}: rendezvous aborted by another rank: {reason}")]
    RendezvousAborted {
        /// This process's rank.
        rank: usize,
        /// The other rank's error.
        reason: String,
    },
    /// Not every rank arrived in time.
    #[error(
        "rank {rank}: rendezvous timed out after {} ms with {joined} of {world_size} ranks joined \
         (did every rank start, with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE?)",
        timeout.as_millis()
    )]
    RendezvousTimeout {
        /// This process's rank.
        rank: usize,
        /// Ranks that had arrived.
        joined: i64,
        /// WORLD_SIZE.
        world_size: usize,
        /// How long it waited.
        timeout: Duration,
    },
    /// A store operation failed.
    #[error("rank {rank}: store {op} of key {key} failed: {message}")]
    Store {
        /// set, get, add, check, prefix.
        op: &'static str,
        /// The key (or prefix).
        key: String,
        /// This process's rank in the world.
        rank: usize,
        /// c10d's message.
        message: String,
    },
    /// Creating a process group's backend failed (connecting its ranks, or the backend itself).
    #[error("creating {backend} group {group} failed on rank {rank} of {size}: {message}")]
    GroupCreate {
        /// Gloo or NCCL.
        backend: &'static str,
        /// The group's name.
        group: String,
        /// This process's rank in the group.
        rank: usize,
        /// The group's size.
        size: usize,
        /// c10d's message.
        message: String,
    },
    /// A collective failed: a peer died or timed out, or c10d refused the input.
    #[error("{op} failed on rank {rank} of {size} (group {group}): {message}")]
    Collective {
        /// The collective.
        op: &'static str,
        /// The group's name.
        group: String,
        /// This process's rank in the group.
        rank: usize,
        /// The group's size.
        size: usize,
        /// c10d's message.
        message: String,
    },
    /// An argument is invalid before anything is sent.
    #[error("{op}: {message}")]
    Input {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The world cannot be split into the data-parallel × context-parallel layout asked for.
    #[error("{message}")]
    Layout {
        /// What does not fit, naming the flags.
        message: String,
    },
    /// A local launch (`--nproc N`) could not start or watch its ranks.
    #[error("{message}")]
    Launch {
        /// What failed.
        message: String,
    },
    /// The backend was not compiled in.
    #[error("the {backend} backend is not available: {reason}")]
    Unavailable {
        /// The backend.
        backend: &'static str,
        /// Why.
        reason: &'static str,
    },
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, DistError>;
