//! Process groups and their collectives.
use std::cell::Cell;
use std::ffi::{c_char, c_int};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tch::{Device, Tensor};

use crate::env::Rendezvous;
use crate::error::{DistError, Result};
use crate::ffi;
use crate::store::Store;

/// The c10d backend of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Gloo: CPU tensors, TCP between processes.
    Gloo,
    /// NCCL: CUDA tensors (the `nccl` feature); device `cuda:LOCAL_RANK`.
    Nccl,
}

impl Backend {
    /// The name torch uses.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
    }
}

/// How `all_reduce` and `reduce_scatter` combine the ranks' values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Elementwise sum.
    Sum,
    /// Elementwise mean (floating-point tensors; Gloo has none, so it is a sum then a division).
    Avg,
    /// Elementwise maximum.
    Max,
    /// Elementwise minimum.
    Min,
}

impl ReduceOp {
    fn code(self) -> c_int {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Avg => 1,
            ReduceOp::Max => 2,
            ReduceOp::Min => 3,
        }
    }
}

/// How many times faster than `timeout` the rendezvous polls for the other ranks.
const JOIN_POLL: Duration = Duration::from_millis(10);

/// A set of ranks that run collectives together: the world ([`ProcessGroup::new`],
/// [`ProcessGroup::from_env`]) or a subgroup of it ([`ProcessGroup::new_subgroup`]).
///
/// Every collective blocks until it is complete on this rank, or fails after the group's timeout
/// (a peer that died makes it fail sooner: Gloo sees the connection close). After a failure the
/// group is unusable, as in torch: report the error and end the process.
pub struct ProcessGroup {
    raw: NonNull<ffi::RawGroup>,
    store: Arc<Store>,
    name: String,
    backend: Backend,
    rank: usize,
    size: usize,
    /// World rank of each member, by group rank.
    world_ranks: Vec<usize>,
    /// Where the backend wants its tensors: `cuda:N` for NCCL, the CPU for Gloo. Every
    /// collective moves its tensors here itself (and results back to the caller's device).
    device: Device,
    /// The collectives' timeout (changeable for a phase: [`ProcessGroup::with_timeout`]).
    timeout: Cell<Duration>,
    /// Subgroups created so far: names the next one, identically on every member.
    children: Cell<u32>,
    /// Traffic of this group's collectives so far.
    stats: Cell<CommStats>,
}

/// What a group's collectives have done on this rank: calls, payload bytes and time blocked in
/// them. The payload is the tensor this rank hands to each call (all-gather: its block;
/// reduce-scatter: the whole input; send/recv: the message), so it compares with a collective's
/// analytic volume; the bytes on the wire depend on the backend's algorithm (a ring all-reduce
/// sends 2·(N−1)/N of its payload). The backward collectives of the autograd operations run
/// inside libtorch's autograd; the shim counts them the same way (their payload: the gradient
/// handed to them) and [`ProcessGroup::stats`] includes them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CommStats {
    /// Collective calls.
    pub calls: u64,
    /// Payload bytes.
    pub bytes: u64,
    /// Seconds spent in the calls (waiting for slower ranks included).
    pub seconds: f64,
}

// SAFETY: c10d backends may be used from any thread (torch's own DDP calls them from autograd
// threads); the handle is freed only in Drop. Not Sync: collectives must be issued in the same
// order on every rank, which concurrent callers could not guarantee.
unsafe impl Send for ProcessGroup {}

impl ProcessGroup {
    /// Joins the world described by torchrun's variables (see [`Rendezvous::from_env`]).
    pub fn from_env(backend: Backend, timeout: Duration) -> Result<Self> {
        Self::new(&Rendezvous::from_env()?, backend, timeout)
    }

    /// Joins the world described by `rdzv`: rank 0 hosts the TCP store (unless torchrun's agent
    /// does), every rank checks that all agree on the world size, then the backend connects the
    /// ranks. `timeout` bounds each of these steps and is the default for every collective.
    /// NCCL groups use device `cuda:LOCAL_RANK` ([`ProcessGroup::new_on`] names another).
    pub fn new(rdzv: &Rendezvous, backend: Backend, timeout: Duration) -> Result<Self> {
        let device = match backend {
            Backend::Gloo => Device::Cpu,
            Backend::Nccl => Device::Cuda(rdzv.local_rank),
        };
        Self::new_on(rdzv, backend, device, timeout)
    }

    /// [`ProcessGroup::new`] with the device the collectives use: the CPU for Gloo, a CUDA
    /// device for NCCL (anything else is refused).
    pub fn new_on(
        rdzv: &Rendezvous,
        backend: Backend,
        device: Device,
        timeout: Duration,
    ) -> Result<Self> {
        rdzv.validate()?;
        check_backend_device(backend, device)?;
        if backend == Backend::Nccl && !cfg!(feature = "nccl") {
            return Err(DistError::Unavailable {
                backend: "nccl",
                reason: "rsd-dist was built without its `nccl` feature",
            });
        }
        let store = connect(rdzv, timeout)?;
        let store = match rdzv.agent_store {
            // The agent's store outlives restarts; keep each attempt's keys apart, as torch does.
            Some(attempt) => store.prefixed(&format!("/worker/attempt_{attempt}/"))?,
            None => store,
        };
        join(&store, rdzv, timeout)?;
        let store = Arc::new(store);
        let world_ranks = (0..rdzv.world_size).collect();
        Self::create(
            store,
            "world".into(),
            backend,
            rdzv.rank,
            world_ranks,
            device,
            timeout,
        )
    }

    fn create(
        store: Arc<Store>,
        name: String,
        backend: Backend,
        rank: usize,
        world_ranks: Vec<usize>,
        device: Device,
        timeout: Duration,
    ) -> Result<Self> {
        let size = world_ranks.len();
        let fail = |message: String| DistError::GroupCreate {
            backend: backend.name(),
            group: name.clone(),
            rank,
            size,
            message,
        };
        let prefix = ffi::cstring(&format!("{name}/")).map_err(fail)?;
        let (c_rank, c_size) = (to_c_int(rank).map_err(fail)?, to_c_int(size).map_err(fail)?);
        let mut raw = std::ptr::null_mut();
        let result = match backend {
            // SAFETY: the store and prefix are live for the call; on success we own the handle.
            Backend::Gloo => ffi::call(|err, len| unsafe {
                ffi::rsd_group_gloo(
                    store.raw(),
                    prefix.as_ptr(),
                    c_rank,
                    c_size,
                    ffi::millis(timeout),
                    &mut raw,
                    err,
                    len,
                )
            }),
            Backend::Nccl => nccl_group(&store, &prefix, c_rank, c_size, timeout, device, &mut raw),
        };
        result.map_err(fail)?;
        let raw = NonNull::new(raw).ok_or_else(|| fail("the shim returned no group".into()))?;
        Ok(ProcessGroup {
            raw,
            store,
            name,
            backend,
            rank,
            size,
            world_ranks,
            device,
            timeout: Cell::new(timeout),
            children: Cell::new(0),
            stats: Cell::new(CommStats::default()),
        })
    }

    /// This process's rank in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The group's name: `world`, or its parent's name and a number (`world.0`, `world.0.1`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The group's backend.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The world rank of each member, by group rank.
    pub fn world_ranks(&self) -> &[usize] {
        &self.world_ranks
    }

    /// Where the collectives want their tensors (they move them there themselves).
    pub fn device(&self) -> Device {
        self.device
    }

    /// The traffic of this group's collectives since it was created, the backward collectives
    /// of the autograd operations included.
    pub fn stats(&self) -> CommStats {
        let (mut calls, mut bytes, mut nanos) = (0i64, 0i64, 0i64);
        // SAFETY: the group is live; the shim writes three integers.
        unsafe { ffi::rsd_group_backward_stats(self.raw(), &mut calls, &mut bytes, &mut nanos) };
        let mut st = self.stats.get();
        st.calls += calls.max(0) as u64;
        st.bytes += bytes.max(0) as u64;
        st.seconds += nanos.max(0) as f64 * 1e-9;
        st
    }

    /// Runs `f` with the collectives' timeout set to `timeout`, then restores the group's.
    pub fn with_timeout<R>(&self, timeout: Duration, f: impl FnOnce(&Self) -> R) -> R {
        let before = self.timeout.replace(timeout);
        let r = f(self);
        self.timeout.set(before);
        r
    }

    /// How long a collective may take before it fails.
    pub fn timeout(&self) -> Duration {
        self.timeout.get()
    }

    /// Changes the timeout of the collectives that follow (for example a long one for the first
    /// step, which includes NCCL's lazy setup, then a short one). NCCL's watchdog keeps the
    /// timeout the group was created with: create it with the longest wait any phase needs.
    pub fn set_timeout(&self, timeout: Duration) {
        self.timeout.set(timeout);
    }

    /// The rendezvous store, shared with the whole world, for small values all ranks need.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// A subgroup of `ranks` (ranks of this group, any order, no repeats), as torch's
    /// `new_group`: every rank of this group must call it, in the same order relative to other
    /// subgroup creations, and the members get `Some(group)`, the others `None`. Members are
    /// numbered in ascending order of their rank here.
    pub fn new_subgroup(&self, ranks: &[usize]) -> Result<Option<ProcessGroup>> {
        let op = "new_subgroup";
        let mut sorted = ranks.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != ranks.len() || sorted.is_empty() {
            return Err(DistError::Input {
                op,
                message: format!("ranks must be distinct and not empty (got {})", list(ranks)),
            });
        }
        if let Some(&bad) = sorted.iter().find(|&&r| r >= self.size) {
            return Err(DistError::Input {
                op,
                message: format!(
                    "rank {bad} is not in group {} of size {}",
                    self.name, self.size
                ),
            });
        }
        let n = self.children.get();
        self.children.set(n + 1);
        let Some(rank) = sorted.iter().position(|&r| r == self.rank) else {
            return Ok(None);
        };
        let world_ranks = sorted.iter().map(|&r| self.world_ranks[r]).collect();
        let name = format!("{}.{n}", self.name);
        Self::create(
            self.store.clone(),
            name,
            self.backend,
            rank,
            world_ranks,
            self.device,
            self.timeout.get(),
        )
        .map(Some)
    }

    /// Splits this group into the disjoint `groups` (for example every data-parallel group, or
    /// every context-parallel group) and returns the one this rank is in: torch's
    /// `new_subgroups_by_enumeration`. Every rank of this group must call it with the same list.
    pub fn split(&self, groups: &[Vec<usize>]) -> Result<ProcessGroup> {
        let mut mine = None;
        for ranks in groups {
            if let Some(g) = self.new_subgroup(ranks)? {
                if mine.is_some() {
                    return Err(DistError::Input {
                        op: "split",
                        message: format!("rank {} is in more than one of the groups", self.rank),
                    });
                }
                mine = Some(g);
            }
        }
        mine.ok_or_else(|| DistError::Input {
            op: "split",
            message: format!("rank {} is in none of the groups", self.rank),
        })
    }

    fn raw(&self) -> *const ffi::RawGroup {
        self.raw.as_ptr()
    }

    fn ms(&self) -> i64 {
        ffi::millis(self.timeout.get())
    }

    /// Runs one collective of the shim, naming it, the group and the rank in the error.
    fn run(
        &self,
        op: &'static str,
        bytes: usize,
        f: impl FnOnce(*mut c_char, usize) -> c_int,
    ) -> Result<()> {
        let started = Instant::now();
        let r = ffi::call(f);
        let mut st = self.stats.get();
        st.calls += 1;
        st.bytes += bytes as u64;
        st.seconds += started.elapsed().as_secs_f64();
        self.stats.set(st);
        r.map_err(|message| self.collective_error(op, &message))
    }

    /// Runs one collective that returns a new tensor.
    fn run_out(
        &self,
        op: &'static str,
        bytes: usize,
        f: impl FnOnce(*mut *mut torch_sys::C_tensor, *mut c_char, usize) -> c_int,
    ) -> Result<Tensor> {
        let mut out = std::ptr::null_mut();
        self.run(op, bytes, |err, len| f(&mut out, err, len))?;
        if out.is_null() {
            return Err(self.collective_error(op, "the shim returned no tensor"));
        }
        // SAFETY: the shim created this `at::Tensor*` for us; `Tensor` owns it from here on.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    fn peer(&self, op: &'static str, what: &str, rank: usize) -> Result<c_int> {
        if rank >= self.size || (what != "root" && rank == self.rank) {
            return Err(DistError::Input {
                op,
                message: format!(
                    "{what} rank {rank} is not another rank of group {} (rank {} of {})",
                    self.name, self.rank, self.size
                ),
            });
        }
        to_c_int(rank).map_err(|message| DistError::Input { op, message })
    }

    /// `t` where the backend wants it: `t` itself when it is there already, else a copy (the
    /// caller's tensor is never handed to a backend on the wrong device).
    fn placed(&self, op: &'static str, t: &Tensor) -> Result<Tensor> {
        match Placement::of(t, self.device) {
            Placement::Direct => Ok(t.shallow_clone()),
            Placement::Staged => t.f_to_device(self.device).map_err(|e| input(op, e)),
        }
    }

    /// A result of the backend moved to `device` (the caller's input's).
    fn returned(op: &'static str, t: Tensor, device: Device) -> Result<Tensor> {
        if t.device() == device {
            return Ok(t);
        }
        t.f_to_device(device).map_err(|e| input(op, e))
    }

    /// Runs an in-place collective on `t`: directly when `t` is dense on the group's device,
    /// else on a contiguous copy there whose result is then copied back into `t`.
    fn in_place(
        &self,
        op: &'static str,
        t: &mut Tensor,
        f: impl FnOnce(&mut Tensor) -> Result<()>,
    ) -> Result<()> {
        if Placement::of(t, self.device) == Placement::Direct && t.is_contiguous() {
            return f(t);
        }
        // Either a copy to another device or a dense copy of a strided view: never `t` itself.
        let mut work = tch::no_grad(|| t.f_to_device(self.device).and_then(|x| x.f_contiguous()))
            .map_err(|e| input(op, e))?;
        f(&mut work)?;
        tch::no_grad(|| t.f_copy_(&work))
            .map(|_| ())
            .map_err(|e| input(op, e))
    }

    /// Reduces `t` over the group, in place: afterwards every rank holds the same result.
    pub fn all_reduce(&self, t: &mut Tensor, op: ReduceOp) -> Result<()> {
        let ms = self.ms();
        let bytes = nbytes(t);
        self.in_place("all_reduce", t, |w| {
            // SAFETY: the group and tensor are live for the call.
            self.run("all_reduce", bytes, |err, len| unsafe {
                ffi::rsd_all_reduce(self.raw(), w.as_mut_ptr(), op.code(), ms, err, len)
            })
        })
    }

    /// Concatenates every rank's `t` along dim 0, in rank order (all ranks' shapes must be equal).
    /// The result is on `t`'s device.
    pub fn all_gather(&self, t: &Tensor) -> Result<Tensor> {
        let op = "all_gather";
        let x = self.placed(op, t)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        let y = self.run_out(op, nbytes(&x), |out, err, len| unsafe {
            ffi::rsd_all_gather(self.raw(), x.as_ptr(), ms, out, err, len)
        })?;
        Self::returned(op, y, t.device())
    }

    /// Reduces `t` (dim 0 a multiple of the group size) over the group and returns block `rank`
    /// of dim 0 of the result, on `t`'s device.
    pub fn reduce_scatter(&self, t: &Tensor, op: ReduceOp) -> Result<Tensor> {
        let name = "reduce_scatter";
        let x = self.placed(name, t)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        let y = self.run_out(name, nbytes(&x), |out, err, len| unsafe {
            ffi::rsd_reduce_scatter(self.raw(), x.as_ptr(), op.code(), ms, out, err, len)
        })?;
        Self::returned(name, y, t.device())
    }

    /// [`reduce_scatter`](Self::reduce_scatter), started and not waited for: the backend runs
    /// it (Gloo on its worker thread, NCCL on its stream) while this rank goes on computing, and
    /// [`PendingReduceScatter::wait`] returns the result. Collectives still start in the same
    /// order on every rank; each one in flight holds its input and its output.
    pub fn reduce_scatter_start(&self, t: &Tensor, op: ReduceOp) -> Result<PendingReduceScatter> {
        let name = "reduce_scatter";
        let x = self.placed(name, t)?;
        let ms = self.ms();
        let mut raw = std::ptr::null_mut();
        // SAFETY: the group and tensor are live for the call; the shim keeps its own reference
        // to the tensor until the collective has been waited for.
        self.run(name, nbytes(&x), |err, len| unsafe {
            ffi::rsd_reduce_scatter_start(self.raw(), x.as_ptr(), op.code(), ms, &mut raw, err, len)
        })?;
        let raw = NonNull::new(raw).ok_or_else(|| self.collective_error(name, "no handle"))?;
        Ok(PendingReduceScatter {
            raw,
            group: self.raw,
            device: t.device(),
        })
    }

    fn collective_error(&self, op: &'static str, message: &str) -> DistError {
        DistError::Collective {
            op,
            group: self.name.clone(),
            rank: self.rank,
            size: self.size,
            message: message.into(),
        }
    }

    /// Copies `root`'s `t` into every other rank's `t` (same shape and dtype everywhere).
    pub fn broadcast(&self, t: &mut Tensor, root: usize) -> Result<()> {
        let root = self.peer("broadcast", "root", root)?;
        let ms = self.ms();
        let bytes = nbytes(t);
        self.in_place("broadcast", t, |w| {
            // SAFETY: the group and tensor are live for the call.
            self.run("broadcast", bytes, |err, len| unsafe {
                ffi::rsd_broadcast(self.raw(), w.as_mut_ptr(), root, ms, err, len)
            })
        })
    }

    /// Splits `t` into `size` equal blocks along dim 0 and sends block `j` to rank `j`; returns
    /// the received blocks, block `i` from rank `i`, on `t`'s device.
    pub fn all_to_all(&self, t: &Tensor) -> Result<Tensor> {
        let op = "all_to_all";
        let x = self.placed(op, t)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        let y = self.run_out(op, nbytes(&x), |out, err, len| unsafe {
            ffi::rsd_all_to_all(self.raw(), x.as_ptr(), ms, out, err, len)
        })?;
        Self::returned(op, y, t.device())
    }

    /// Sends `t` to rank `dst`, which must `recv` a tensor of the same shape and dtype.
    pub fn send(&self, t: &Tensor, dst: usize) -> Result<()> {
        let dst = self.peer("send", "destination", dst)?;
        let x = self.placed("send", t)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        self.run("send", nbytes(&x), |err, len| unsafe {
            ffi::rsd_send(self.raw(), x.as_ptr(), dst, 0, ms, err, len)
        })
    }

    /// Receives into `t` what rank `src` sends.
    pub fn recv(&self, t: &mut Tensor, src: usize) -> Result<()> {
        let src = self.peer("recv", "source", src)?;
        let ms = self.ms();
        let bytes = nbytes(t);
        self.in_place("recv", t, |w| {
            // SAFETY: the group and tensor are live for the call.
            self.run("recv", bytes, |err, len| unsafe {
                ffi::rsd_recv(self.raw(), w.as_mut_ptr(), src, 0, ms, err, len)
            })
        })
    }

    /// Returns once every rank of the group has called it.
    pub fn barrier(&self) -> Result<()> {
        let ms = self.ms();
        // SAFETY: the group is live for the call.
        self.run("barrier", 0, |err, len| unsafe {
            ffi::rsd_barrier(self.raw(), ms, err, len)
        })
    }

    /// [`all_gather`](Self::all_gather) along `dim` as an autograd node: its backward
    /// reduce-scatters (sums) the output's gradient back to each rank's block. For context
    /// parallelism's K/V gathers. Every rank must run the backward too (it is a collective);
    /// a failure there surfaces as the error of tch's `f_backward`.
    pub fn all_gather_autograd(&self, t: &Tensor, dim: i64) -> Result<Tensor> {
        let op = "all_gather_autograd";
        let d = normalize_dim(op, t, dim)?;
        // Moving to the group's device is itself differentiable: the backward brings the
        // gradient back to `t`'s device.
        let x = self.placed(op, &t.f_movedim_int(d, 0).map_err(|e| input(op, e))?)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        let y = self.run_out(op, nbytes(&x), |out, err, len| unsafe {
            ffi::rsd_all_gather_autograd(self.raw(), x.as_ptr(), ms, out, err, len)
        })?;
        Self::returned(
            op,
            y.f_movedim_int(0, d).map_err(|e| input(op, e))?,
            t.device(),
        )
    }

    /// [`all_to_all`](Self::all_to_all) (equal blocks along dim 0) as an autograd node: its
    /// backward is the same all-to-all of the output's gradient, which returns each block's
    /// gradient to the rank that sent it. Same rules as
    /// [`all_gather_autograd`](Self::all_gather_autograd).
    pub fn all_to_all_autograd(&self, t: &Tensor) -> Result<Tensor> {
        let op = "all_to_all_autograd";
        let x = self.placed(op, t)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        let y = self.run_out(op, nbytes(&x), |out, err, len| unsafe {
            ffi::rsd_all_to_all_autograd(self.raw(), x.as_ptr(), ms, out, err, len)
        })?;
        Self::returned(op, y, t.device())
    }

    /// [`reduce_scatter`](Self::reduce_scatter) (sum) along `dim` as an autograd node: its
    /// backward all-gathers the output's gradient. Same rules as
    /// [`all_gather_autograd`](Self::all_gather_autograd).
    pub fn reduce_scatter_autograd(&self, t: &Tensor, dim: i64) -> Result<Tensor> {
        let op = "reduce_scatter_autograd";
        let d = normalize_dim(op, t, dim)?;
        let x = self.placed(op, &t.f_movedim_int(d, 0).map_err(|e| input(op, e))?)?;
        let ms = self.ms();
        // SAFETY: the group and tensor are live for the call.
        let y = self.run_out(op, nbytes(&x), |out, err, len| unsafe {
            ffi::rsd_reduce_scatter_autograd(self.raw(), x.as_ptr(), ms, out, err, len)
        })?;
        Self::returned(
            op,
            y.f_movedim_int(0, d).map_err(|e| input(op, e))?,
            t.device(),
        )
    }
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("name", &self.name)
            .field("backend", &self.backend)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("world_ranks", &self.world_ranks)
            .field("device", &self.device)
            .field("timeout", &self.timeout.get())
            .finish()
    }
}

/// A reduce-scatter in flight ([`ProcessGroup::reduce_scatter_start`]).
pub struct PendingReduceScatter {
    raw: NonNull<ffi::RawPending>,
    /// The group that started it: only that group may wait for it.
    group: NonNull<ffi::RawGroup>,
    /// The caller's input's device, where the result goes.
    device: Device,
}

impl PendingReduceScatter {
    /// Blocks until the reduce-scatter is complete on this rank (or the group's timeout) and
    /// returns block `rank` of the sum, on the input's device. `group` is the group that started
    /// it; the time blocked here counts in its [`CommStats::seconds`].
    pub fn wait(self, group: &ProcessGroup) -> Result<Tensor> {
        let op = "reduce_scatter";
        if group.raw != self.group {
            return Err(DistError::Input {
                op,
                message: format!("waited for on group {}, which did not start it", group.name),
            });
        }
        let started = Instant::now();
        let mut out = std::ptr::null_mut();
        let ms = group.ms();
        // SAFETY: the pending handle is live until Drop; the shim hands its output over once.
        let r = ffi::call(|err, len| unsafe {
            ffi::rsd_pending_wait(self.raw.as_ptr(), ms, &mut out, err, len)
        });
        let mut st = group.stats.get();
        st.seconds += started.elapsed().as_secs_f64();
        group.stats.set(st);
        r.map_err(|message| group.collective_error(op, &message))?;
        if out.is_null() {
            return Err(group.collective_error(op, "the shim returned no tensor"));
        }
        // SAFETY: the shim created this `at::Tensor*` for us; `Tensor` owns it from here on.
        let y = unsafe { Tensor::from_ptr(out) };
        ProcessGroup::returned(op, y, self.device)
    }
}

impl Drop for PendingReduceScatter {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once. A collective never waited for goes on in the
        // backend, which holds its tensors until it ends.
        unsafe { ffi::rsd_pending_free(self.raw.as_ptr()) }
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: the handle came from the shim and is freed once. Autograd nodes that still
        // need the backend hold their own reference to it.
        unsafe { ffi::rsd_group_free(self.raw.as_ptr()) }
    }
}

/// Connects to the rendezvous store, telling a taken port (rank 0) from an unreachable master
/// (the others).
fn connect(rdzv: &Rendezvous, timeout: Duration) -> Result<Store> {
    let server = rdzv.rank == 0 && rdzv.agent_store.is_none();
    let (addr, port) = (rdzv.master_addr.as_str(), rdzv.master_port);
    Store::tcp(addr, port, server, rdzv.world_size, rdzv.rank, timeout).map_err(|message| {
        if server {
            if port_in_use(&message, port) {
                DistError::PortInUse { port, message }
            } else {
                DistError::Store {
                    op: "listen",
                    key: format!("{addr}:{port}"),
                    rank: 0,
                    message,
                }
            }
        } else {
            DistError::MasterUnreachable {
                addr: addr.to_owned(),
                port,
                rank: rdzv.rank,
                timeout,
                message,
            }
        }
    })
}

/// Whether the store server failed because its port is taken: c10d says so (EADDRINUSE), or,
/// should its wording change, binding the port ourselves fails the same way.
fn port_in_use(message: &str, port: u16) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("eaddrinuse")
        || m.contains("address already in use")
        || matches!(std::net::TcpListener::bind(("0.0.0.0", port)),
                    Err(e) if e.kind() == std::io::ErrorKind::AddrInUse)
}

/// How long the rank hosting the store keeps it up after an aborted rendezvous, at most, so the
/// other ranks can read why before the server goes away.
const ABORT_LINGER: Duration = Duration::from_secs(5);

/// Every rank announces its WORLD_SIZE and RANK; each compares with rank 0's and waits until all
/// have arrived. The first rank to see a problem records it under `rsd/abort`, so every rank
/// fails with the same explanation instead of some waiting out the timeout. The rank hosting the
/// store waits (up to [`ABORT_LINGER`]) until every rank that arrived has read the abort: were it
/// to return at once, its store would close under ranks still reading, and they would fail with
/// "connection reset" instead of the reason.
fn join(store: &Store, rdzv: &Rendezvous, timeout: Duration) -> Result<()> {
    const ARRIVED: &str = "rsd/arrived";
    const ABORT_SEEN: &str = "rsd/abort_seen";
    store.add(ARRIVED, 1)?;
    let result = join_checks(store, rdzv, timeout);
    let aborted = matches!(
        result,
        Err(DistError::WorldSizeMismatch { .. }
            | DistError::DuplicateRank { .. }
            | DistError::RendezvousAborted { .. })
    );
    if aborted {
        let _ = store.add(ABORT_SEEN, 1);
        let hosts_store = rdzv.rank == 0 && rdzv.agent_store.is_none();
        let start = Instant::now();
        while hosts_store && start.elapsed() < ABORT_LINGER.min(timeout) {
            match (store.add(ABORT_SEEN, 0), store.add(ARRIVED, 0)) {
                (Ok(seen), Ok(arrived)) if seen < arrived => std::thread::sleep(JOIN_POLL),
                _ => break,
            }
        }
    }
    result
}

fn join_checks(store: &Store, rdzv: &Rendezvous, timeout: Duration) -> Result<()> {
    const ABORT: &str = "rsd/abort";
    let (rank, world) = (rdzv.rank, rdzv.world_size);
    let abort = |e: DistError| -> DistError {
        // Best effort: this rank's error is what matters, the others will time out otherwise.
        let _ = store.set(ABORT, e.to_string().as_bytes());
        e
    };
    store.set(
        &format!("rsd/world_size/{rank}"),
        world.to_string().as_bytes(),
    )?;
    if rank != 0 {
        let master = store.get("rsd/world_size/0", timeout)?;
        let master: usize = String::from_utf8_lossy(&master).parse().unwrap_or(0);
        if master != world {
            return Err(abort(DistError::WorldSizeMismatch {
                rank,
                ours: world,
                master,
            }));
        }
    }
    if store.add(&format!("rsd/rank/{rank}"), 1)? > 1 {
        return Err(abort(DistError::DuplicateRank { rank }));
    }
    store.add("rsd/joined", 1)?;
    let start = Instant::now();
    loop {
        if store.check(ABORT)? {
            let reason = store.get(ABORT, timeout)?;
            return Err(DistError::RendezvousAborted {
                rank,
                reason: String::from_utf8_lossy(&reason).into_owned(),
            });
        }
        let joined = store.add("rsd/joined", 0)?;
        if joined >= world as i64 {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(DistError::RendezvousTimeout {
                rank,
                joined,
                world_size: world,
                timeout,
            });
        }
        std::thread::sleep(JOIN_POLL);
    }
}

/// Whether a collective's tensor can be handed to the backend as it is, or must be copied to
/// the group's device first (and its result copied back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// Already on the group's device.
    Direct,
    /// Elsewhere: staged through a copy.
    Staged,
}

impl Placement {
    fn of(t: &Tensor, device: Device) -> Self {
        if t.device() == device {
            Placement::Direct
        } else {
            Placement::Staged
        }
    }
}

/// The device rule: Gloo takes CPU tensors, NCCL CUDA ones.
fn check_backend_device(backend: Backend, device: Device) -> Result<()> {
    match (backend, device) {
        (Backend::Gloo, Device::Cpu) | (Backend::Nccl, Device::Cuda(_)) => Ok(()),
        (Backend::Gloo, d) => Err(DistError::Input {
            op: "new_group",
            message: format!("a Gloo group runs on the CPU, not on {d:?} (CUDA devices use NCCL)"),
        }),
        (Backend::Nccl, d) => Err(DistError::Input {
            op: "new_group",
            message: format!("an NCCL group runs on a CUDA device, not on {d:?} (use Gloo)"),
        }),
    }
}

#[cfg(feature = "nccl")]
fn nccl_group(
    store: &Store,
    prefix: &std::ffi::CStr,
    rank: c_int,
    size: c_int,
    timeout: Duration,
    device: Device,
    raw: &mut *mut ffi::RawGroup,
) -> std::result::Result<(), String> {
    let Device::Cuda(index) = device else {
        return Err(format!("an NCCL group needs a CUDA device, not {device:?}"));
    };
    let device = to_c_int(index)?;
    // SAFETY: the store and prefix are live for the call; on success the caller owns `raw`.
    ffi::call(|err, len| unsafe {
        ffi::rsd_group_nccl(
            store.raw(),
            prefix.as_ptr(),
            rank,
            size,
            ffi::millis(timeout),
            device,
            raw,
            err,
            len,
        )
    })
}

#[cfg(not(feature = "nccl"))]
fn nccl_group(
    _: &Store,
    _: &std::ffi::CStr,
    _: c_int,
    _: c_int,
    _: Duration,
    _: Device,
    _: &mut *mut ffi::RawGroup,
) -> std::result::Result<(), String> {
    Err("rsd-dist was built without its `nccl` feature".into())
}

fn to_c_int(n: usize) -> std::result::Result<c_int, String> {
    c_int::try_from(n).map_err(|_| format!("{n} does not fit a C int"))
}

fn normalize_dim(op: &'static str, t: &Tensor, dim: i64) -> Result<i64> {
    let n = t.dim() as i64;
    let d = if dim < 0 { dim + n } else { dim };
    if d < 0 || d >= n {
        return Err(DistError::Input {
            op,
            message: format!("dim {dim} is out of range for a {n}-dimensional tensor"),
        });
    }
    Ok(d)
}

fn input(op: &'static str, e: tch::TchError) -> DistError {
    DistError::Input {
        op,
        message: e.to_string(),
    }
}

fn list(ranks: &[usize]) -> String {
    let items: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    format!("[{}]", items.join(", "))
}

/// Bytes of `t`'s elements.
fn nbytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}
