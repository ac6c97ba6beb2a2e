//! The run's processes as one object: who this process is, how the world splits into
//! data-parallel × context-parallel ranks, the groups of that split, the device and the backend.
//!
//! Layout: world rank `w = d·cp + c` is context-parallel rank `c` of data-parallel rank `d`.
//! Consecutive ranks share sequences (on one node, where context parallelism's per-layer K/V
//! gathers want the fastest links); the data-parallel group of `w` is every rank with the same
//! `c`. The degrees are computed here and nowhere else ([`layout`]).
//!
//! The backend follows the device: a CUDA device gets NCCL (an error, never a silent fallback,
//! when this build lacks the `nccl` feature), the CPU gets Gloo.
use std::rc::Rc;
use std::time::Duration;

use tch::Device;

use crate::env::Rendezvous;
use crate::error::{DistError, Result};
use crate::group::{Backend, CommStats, ProcessGroup};

/// What the run asks for: data-parallel and context-parallel degrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshShape {
    /// Data-parallel ranks; 0: whatever the world size leaves (`world / cp`).
    pub dp: usize,
    /// Context-parallel ranks sharing every sequence (at least 1).
    pub cp: usize,
}

impl MeshShape {
    /// One process.
    pub const SINGLE: MeshShape = MeshShape { dp: 1, cp: 1 };

    /// The processes this shape needs, when it says (`dp > 0`).
    pub fn processes(&self) -> Option<usize> {
        (self.dp > 0).then(|| self.dp * self.cp.max(1))
    }
}

/// `(dp, cp)` of a world of `world` processes asked to be `shape`; the one place the degrees are
/// worked out. Errors name the flags (`--dp`, `--cp`, `--nproc`, WORLD_SIZE).
pub fn layout(world: usize, shape: MeshShape) -> Result<(usize, usize)> {
    let MeshShape { dp, cp } = shape;
    if cp == 0 {
        return Err(DistError::Layout {
            message: "--cp 0: the context-parallel degree is at least 1".into(),
        });
    }
    if world == 0 || !world.is_multiple_of(cp) {
        return Err(DistError::Layout {
            message: format!(
                "--cp {cp}: {world} processes (WORLD_SIZE, or --nproc) cannot be split into \
                 context-parallel groups of {cp}; launch a multiple of {cp} processes"
            ),
        });
    }
    if dp != 0 && dp * cp != world {
        return Err(DistError::Layout {
            message: format!(
                "--dp {dp} × --cp {cp} = {} processes asked for, but the run has {world} \
                 (WORLD_SIZE, or --nproc); leave --dp unset to use them all, or launch {} \
                 processes",
                dp * cp,
                dp * cp
            ),
        });
    }
    Ok((world / cp, cp))
}

impl Backend {
    /// The backend for tensors on `device`: NCCL for CUDA (this build must have the `nccl`
    /// feature), Gloo for the CPU.
    pub fn for_device(device: Device) -> Result<Backend> {
        match device {
            Device::Cpu => Ok(Backend::Gloo),
            Device::Cuda(_) if cfg!(feature = "nccl") => Ok(Backend::Nccl),
            Device::Cuda(_) => Err(DistError::Unavailable {
                backend: "nccl",
                reason: "a multi-process run on CUDA needs NCCL, and this build lacks it: \
                         rebuild with `--features nccl` (cargo build --release --features \
                         rsd-train/nccl), or run on the CPU (device = \"cpu\", Gloo)",
            }),
            other => Err(DistError::Input {
                op: "mesh",
                message: format!(
                    "device {other:?}: multi-process runs use the CPU (Gloo) or CUDA (NCCL)"
                ),
            }),
        }
    }
}

/// This process's place in the run and the groups it communicates in.
pub struct Mesh {
    rank: usize,
    world_size: usize,
    local_rank: usize,
    dp: usize,
    cp: usize,
    device: Device,
    /// How this process joined the world; `None` for one process.
    rdzv: Option<Rendezvous>,
    /// `None` for one process.
    world: Option<Rc<ProcessGroup>>,
    /// The data-parallel group (the world itself when `cp == 1`); `None` when `dp == 1`.
    dp_group: Option<Rc<ProcessGroup>>,
    /// The context-parallel group (the world itself when `dp == 1`); `None` when `cp == 1`.
    cp_group: Option<Rc<ProcessGroup>>,
}

impl Mesh {
    /// One process on `device`: no groups; every collective of its users is a no-op.
    pub fn single(device: Device) -> Mesh {
        Mesh {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            dp: 1,
            cp: 1,
            device,
            rdzv: None,
            world: None,
            dp_group: None,
            cp_group: None,
        }
    }

    /// The world torchrun (or `--nproc`, or a SLURM script) describes in the environment, or
    /// one process when `WORLD_SIZE` is not set and `shape` needs only one.
    pub fn from_env(shape: MeshShape, device: Device, timeout: Duration) -> Result<Mesh> {
        if std::env::var_os("WORLD_SIZE").is_none() {
            let wanted = shape.dp.max(1) * shape.cp.max(1);
            if wanted > 1 {
                return Err(DistError::Layout {
                    message: format!(
                        "--dp {} × --cp {} = {wanted} processes, but WORLD_SIZE is not set: run \
                         with `--nproc {wanted}` or under torchrun",
                        shape.dp.max(1),
                        shape.cp.max(1)
                    ),
                });
            }
            return Ok(Mesh::single(device));
        }
        Mesh::new(&Rendezvous::from_env()?, shape, device, timeout)
    }

    /// Joins the world `rdzv` describes and splits it as `shape` asks: the layout is checked
    /// before anything connects, then the world group and the subgroups are created (every rank
    /// creates the same ones, in the same order).
    pub fn new(
        rdzv: &Rendezvous,
        shape: MeshShape,
        device: Device,
        timeout: Duration,
    ) -> Result<Mesh> {
        rdzv.validate()?;
        let (dp, cp) = layout(rdzv.world_size, shape)?;
        let backend = Backend::for_device(device)?;
        let world = Rc::new(ProcessGroup::new_on(rdzv, backend, device, timeout)?);
        let (cp_group, dp_group) = match (dp, cp) {
            (_, 1) => (None, (dp > 1).then(|| world.clone())),
            (1, _) => (Some(world.clone()), None),
            _ => {
                let cp_groups: Vec<Vec<usize>> =
                    (0..dp).map(|d| (d * cp..(d + 1) * cp).collect()).collect();
                let dp_groups: Vec<Vec<usize>> = (0..cp)
                    .map(|c| (0..dp).map(|d| d * cp + c).collect())
                    .collect();
                let cpg = Rc::new(world.split(&cp_groups)?);
                let dpg = Rc::new(world.split(&dp_groups)?);
                (Some(cpg), Some(dpg))
            }
        };
        Ok(Mesh {
            rank: rdzv.rank,
            world_size: rdzv.world_size,
            local_rank: rdzv.local_rank,
            dp,
            cp,
            device,
            rdzv: Some(rdzv.clone()),
            world: Some(world),
            dp_group,
            cp_group,
        })
    }

    /// Sets the timeout of every group's collectives from now on ([`ProcessGroup::set_timeout`]).
    pub fn set_timeout(&self, timeout: Duration) {
        for g in [&self.world, &self.dp_group, &self.cp_group]
            .into_iter()
            .flatten()
        {
            g.set_timeout(timeout);
        }
    }

    /// Runs `f` with every group's collectives allowed `timeout`, then restores each group's.
    pub fn with_timeout<R>(&self, timeout: Duration, f: impl FnOnce() -> R) -> R {
        let groups: Vec<&ProcessGroup> = [&self.world, &self.dp_group, &self.cp_group]
            .into_iter()
            .flatten()
            .map(|g| g.as_ref())
            .collect();
        let before: Vec<Duration> = groups.iter().map(|g| g.timeout()).collect();
        for g in &groups {
            g.set_timeout(timeout);
        }
        let r = f();
        for (g, t) in groups.iter().zip(before) {
            g.set_timeout(t);
        }
        r
    }

    /// How this process joined the world (`None` for one process): what a [`FailureWatch`]
    /// connects with.
    ///
    /// [`FailureWatch`]: crate::FailureWatch
    pub fn rendezvous(&self) -> Option<&Rendezvous> {
        self.rdzv.as_ref()
    }

    /// This process's rank in the world, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of processes: `dp_size() · cp_size()`.
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// This process's rank on its node (its GPU index under torchrun).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// Data-parallel ranks.
    pub fn dp_size(&self) -> usize {
        self.dp
    }

    /// Context-parallel ranks sharing each sequence.
    pub fn cp_size(&self) -> usize {
        self.cp
    }

    /// This process's data-parallel rank, `0..dp_size()`.
    pub fn dp_rank(&self) -> usize {
        self.rank / self.cp
    }

    /// This process's place in its context-parallel group, `0..cp_size()`.
    pub fn cp_rank(&self) -> usize {
        self.rank % self.cp
    }

    /// Rank 0: the one that logs, prints and writes.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// Where this process computes (and where its groups' collectives want their tensors).
    pub fn device(&self) -> Device {
        self.device
    }

    /// The groups' backend; `None` for one process (no groups).
    pub fn backend(&self) -> Option<Backend> {
        self.world.as_ref().map(|g| g.backend())
    }

    /// Every process; `None` for one process.
    pub fn world(&self) -> Option<&ProcessGroup> {
        self.world.as_deref()
    }

    /// The ranks holding the other data shares of this rank's sequence chunks; `None` when
    /// `dp_size() == 1`.
    pub fn dp_group(&self) -> Option<&ProcessGroup> {
        self.dp_group.as_deref()
    }

    /// The ranks sharing this rank's sequences; `None` when `cp_size() == 1`.
    pub fn cp_group(&self) -> Option<&ProcessGroup> {
        self.cp_group.as_deref()
    }

    /// The context-parallel group, shared (for a user that keeps it, such as the trainer's
    /// context-parallel state).
    pub fn cp_group_shared(&self) -> Option<Rc<ProcessGroup>> {
        self.cp_group.clone()
    }

    /// The traffic of every group of the mesh so far (each group counted once, also where one
    /// group serves as two).
    pub fn comm_stats(&self) -> CommStats {
        let mut groups: Vec<&Rc<ProcessGroup>> = Vec::new();
        for g in [&self.world, &self.dp_group, &self.cp_group]
            .into_iter()
            .flatten()
        {
            if !groups.iter().any(|h| Rc::ptr_eq(h, g)) {
                groups.push(g);
            }
        }
        groups.iter().fold(CommStats::default(), |mut acc, g| {
            let s = g.stats();
            acc.calls += s.calls;
            acc.bytes += s.bytes;
            acc.seconds += s.seconds;
            acc
        })
    }
}

impl std::fmt::Debug for Mesh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mesh")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .field("dp", &self.dp)
            .field("cp", &self.cp)
            .field("device", &self.device)
            .field("backend", &self.backend())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_fills_in_dp_and_names_the_flags_when_it_cannot() {
        let shape = |dp, cp| MeshShape { dp, cp };
        assert_eq!(layout(4, shape(0, 2)).unwrap(), (2, 2));
        assert_eq!(layout(4, shape(2, 2)).unwrap(), (2, 2));
        assert_eq!(layout(4, shape(0, 1)).unwrap(), (4, 1));
        assert_eq!(layout(1, MeshShape::SINGLE).unwrap(), (1, 1));
        let err = layout(6, shape(0, 4)).unwrap_err().to_string();
        assert!(
            err.contains("--cp 4") && err.contains("6 processes") && err.contains("WORLD_SIZE"),
            "{err}"
        );
        let err = layout(4, shape(3, 2)).unwrap_err().to_string();
        assert!(
            err.contains("--dp 3 × --cp 2 = 6") && err.contains("4") && err.contains("--nproc"),
            "{err}"
        );
        assert!(layout(4, shape(0, 0))
            .unwrap_err()
            .to_string()
            .contains("--cp 0"));
    }

    #[test]
    fn the_backend_follows_the_device() {
        assert_eq!(Backend::for_device(Device::Cpu).unwrap(), Backend::Gloo);
        let cuda = Backend::for_device(Device::Cuda(0));
        if cfg!(feature = "nccl") {
            assert_eq!(cuda.unwrap(), Backend::Nccl);
        } else {
            let err = cuda.unwrap_err();
            assert!(
                matches!(
                    err,
                    DistError::Unavailable {
                        backend: "nccl",
                        ..
                    }
                ),
                "{err}"
            );
            assert!(err.to_string().contains("--features nccl"), "{err}");
        }
    }

    #[test]
    fn a_single_process_has_no_groups() {
        let m = Mesh::single(Device::Cpu);
        assert_eq!(
            (m.rank(), m.world_size(), m.dp_size(), m.cp_size()),
            (0, 1, 1, 1)
        );
        assert!(m.world().is_none() && m.cp_group().is_none() && m.dp_group().is_none());
        assert_eq!(m.comm_stats(), CommStats::default());
        assert!(m.is_main() && m.backend().is_none());
    }
}
