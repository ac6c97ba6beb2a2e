//! Data parallelism across processes, applied around the step (the step itself knows nothing of
//! processes).
//!
//! With N data-parallel ranks the optimizer step is still the global batch of `tokens_per_step`:
//! each rank runs `accum / N` micro-batches of the rows the loader deals it (round-robin over the
//! global stream, so the ranks' rows together are exactly the one-process batch). Around the step:
//!
//! * the loss normalisers (label tokens, samples) are summed over ranks before it, so each rank's
//!   gradient is its share of the global mean;
//! * after the backward the gradients are summed over ranks, in buckets of at most
//!   `grad_bucket_mb` (fp32, one all-reduce each), so every rank holds the global gradient and its
//!   norm, the clipping and the update are the same everywhere;
//! * the loss sums are summed so every rank (and rank 0's log) sees the global losses;
//! * decisions (interrupt, non-finite values) are taken together: any rank's "yes" is everyone's;
//! * an error that ends one rank's run is announced to the others through the rendezvous store
//!   ([`DataParallel::watch_failures`]), so they stop within seconds wherever they wait.
//!
//! Without `WORLD_SIZE` in the environment there is one rank and every call is free.
//!
//! Who is who (rank, dp × cp layout, groups, device, backend) is the [`Mesh`]'s; this is the
//! trainer's side of it: the collectives the loop needs. Every collective here hands the groups
//! tensors on the mesh's device (the groups would move them there anyway: see
//! [`rsd_dist::ProcessGroup`]); host values come back only for decisions and the log.
use std::time::Duration;

use tch::{Kind, Tensor};

use rsd_dist::{Failure, FailureWatch, Mesh, MeshShape, ProcessGroup, ReduceOp, WatchTimes};
use rsd_model::Model;

use crate::config::TrainConfig;
use crate::cp::ContextParallel;
use crate::step::{LossNormalizers, Sums};
use crate::{Error, Result};

/// This process's place among the data-parallel ranks, and the collectives the loop needs.
pub struct DataParallel {
    mesh: Mesh,
    /// The ranks sharing this rank's sequences (context parallelism); `None` without.
    cp: Option<ContextParallel>,
    /// Largest gradient bucket, in fp32 elements.
    bucket_elems: usize,
    /// How long the collectives of a checkpoint's phases may wait
    /// ([`DataParallel::checkpoint_phase`]).
    save_timeout: Duration,
    /// Another rank's failure, heard through the store ([`DataParallel::watch_failures`]).
    failures: Option<FailureWatch>,
}

/// How often a rank looks for another rank's announced failure.
const FAILURE_POLL: Duration = Duration::from_secs(1);
/// How long a rank that heard of another rank's failure gives its own error (reaching it through
/// a collective error check, with its own message) to stop it first.
const FAILURE_GRACE: Duration = Duration::from_secs(3);

impl DataParallel {
    /// One process on the CPU: no group, every collective a no-op.
    pub fn single() -> Self {
        DataParallel {
            mesh: Mesh::single(tch::Device::Cpu),
            cp: None,
            bucket_elems: usize::MAX,
            save_timeout: Duration::ZERO,
            failures: None,
        }
    }

    /// The trainer's side of `mesh`, with gradient buckets of at most `bucket_elems` fp32
    /// elements.
    pub fn of(mesh: Mesh, bucket_elems: usize) -> Result<Self> {
        let cp = if mesh.cp_size() > 1 {
            Some(ContextParallel::of(&mesh)?)
        } else {
            None
        };
        Ok(DataParallel {
            mesh,
            cp,
            bucket_elems,
            save_timeout: Duration::ZERO,
            failures: None,
        })
    }

    /// Joins the world when the environment describes one (`WORLD_SIZE` set: `rsd-train --nproc`,
    /// torchrun, SLURM scripts), otherwise one process; laid out as config keys `dp` × `cp` ask,
    /// on `device` (CUDA: NCCL, CPU: Gloo; see [`Mesh`]).
    pub fn from_env(cfg: &TrainConfig, device: tch::Device) -> Result<Self> {
        let shape = MeshShape {
            dp: cfg.dp,
            cp: cfg.cp.max(1),
        };
        // Groups are created with the longest wait any phase needs (NCCL's watchdog keeps it;
        // the rendezvous may take it too), then the step's collectives get `dist_timeout`. The
        // longest checkpoint wait is that of a replicated optimizer (dp = 1).
        let step = Duration::from_secs(cfg.dist_timeout);
        let longest = crate::checkpoint::save_timeout(cfg, 1).max(step);
        let mesh = Mesh::from_env(shape, device, longest)?;
        mesh.set_timeout(step);
        let bucket_elems = (cfg.grad_bucket_mb.max(1) << 20) / std::mem::size_of::<f32>();
        let mut dp = Self::of(mesh, bucket_elems)?;
        dp.save_timeout = crate::checkpoint::save_timeout(cfg, dp.size());
        Ok(dp)
    }

    /// From now on, another rank's announced failure ([`DataParallel::announce_failure`]), or
    /// its silence for `liveness` (killed, frozen, its node lost), runs `on_failure` on a thread
    /// of its own, within about [`FAILURE_POLL`] + [`FAILURE_GRACE`] of either, unless this rank
    /// stops on its own first; `on_failure` is expected to end the process (the main thread may
    /// be blocked in a collective that would otherwise wait out its timeout: NCCL tells no peer
    /// that a rank stopped issuing collectives). A run that ends normally calls
    /// [`DataParallel::leave`]. Nothing happens in a run of one process.
    pub fn watch_failures(
        &mut self,
        liveness: Duration,
        on_failure: impl FnOnce(Failure) + Send + 'static,
    ) -> Result<()> {
        if let Some(rdzv) = self.mesh.rendezvous() {
            let times = WatchTimes {
                poll: FAILURE_POLL,
                grace: FAILURE_GRACE,
                liveness,
            };
            self.failures = Some(FailureWatch::start(rdzv, times, on_failure)?);
        }
        Ok(())
    }

    /// This rank's run ended without an error and it makes no more collectives: it stops
    /// watching and tells the others so, and rank 0 keeps the rendezvous store up until they have
    /// all left ([`FailureWatch::leave`]).
    pub fn leave(&mut self) {
        if let Some(w) = self.failures.take() {
            w.leave();
        }
    }

    /// The handle this rank announces its own failure with, once [`DataParallel::watch_failures`]
    /// has started (for a panic hook).
    pub fn failure_announcer(&self) -> Option<rsd_dist::Announcer> {
        self.failures.as_ref().map(FailureWatch::announcer)
    }

    /// Tells the other ranks that this one's run ends with `error` (when they watch for it).
    /// Best effort: a store that cannot be reached leaves them to their collectives' timeout, as
    /// without the watch.
    pub fn announce_failure(&self, error: &Error) {
        if let Some(w) = &self.failures {
            let mut causes = vec![error.to_string()];
            let mut source = std::error::Error::source(error);
            while let Some(c) = source {
                causes.push(c.to_string());
                source = c.source();
            }
            let message = rsd_common::report::one_line(causes);
            if let Err(e) = w.announcer().announce(&message) {
                eprintln!(
                    "rank {}: could not tell the other ranks of its error: {e}",
                    self.rank()
                );
            }
        }
    }

    /// Runs `f`, a phase of a checkpoint, with every collective allowed the checkpoint's timeout
    /// (config key `checkpoint_timeout`): the other ranks wait in them while rank 0 writes and
    /// hashes the model, which at paper scale takes longer than a step's collectives may.
    pub fn checkpoint_phase<R>(&self, f: impl FnOnce() -> R) -> R {
        match self.group() {
            Some(_) => self.mesh.with_timeout(self.save_timeout, f),
            None => f(),
        }
    }

    /// The mesh: rank, layout, groups, device.
    pub fn mesh(&self) -> &Mesh {
        &self.mesh
    }

    /// The group of all ranks (gradients and normalisers are summed over it); `None` for a
    /// single process.
    pub fn group(&self) -> Option<&ProcessGroup> {
        self.mesh.world()
    }

    /// Largest gradient bucket, in elements (`grad_bucket_mb` of fp32).
    pub fn bucket_elems(&self) -> usize {
        self.bucket_elems
    }

    /// The collectives' traffic on this rank so far, over every group of the mesh and the
    /// backward collectives inside autograd included (zero for one process).
    pub fn comm_stats(&self) -> rsd_dist::CommStats {
        self.mesh.comm_stats()
    }

    /// This process among all of the run's, `0..world()`.
    pub fn rank(&self) -> usize {
        self.mesh.rank()
    }

    /// The run's processes: data-parallel × context-parallel ranks.
    pub fn world(&self) -> usize {
        self.mesh.world_size()
    }

    /// Context-parallel ranks sharing each sequence (1 without context parallelism).
    pub fn cp_size(&self) -> usize {
        self.mesh.cp_size()
    }

    /// Data-parallel ranks (each a group of `cp_size()` processes).
    pub fn size(&self) -> usize {
        self.mesh.dp_size()
    }

    /// The context-parallel group this rank belongs to, if any.
    pub fn cp(&self) -> Option<&ContextParallel> {
        self.cp.as_ref()
    }

    /// Rank 0: the one that logs, prints and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.mesh.is_main()
    }

    /// This rank as the loader's DP coordinate.
    pub fn loader_rank(&self) -> rsd_loader::Rank {
        rsd_loader::Rank::new(self.mesh.dp_rank(), self.mesh.dp_size())
    }

    /// This rank's coordinates for the loader: its data-parallel rank and its place in its
    /// context-parallel group (which zigzag chunks of each row it gets).
    pub fn loader_parallel(&self) -> rsd_loader::Parallel {
        rsd_loader::Parallel {
            dp: self.loader_rank(),
            cp: if self.mesh.cp_size() > 1 {
                rsd_loader::Rank::new(self.mesh.cp_rank(), self.mesh.cp_size())
            } else {
                rsd_loader::Rank::SINGLE
            },
        }
    }

    /// The micro-batches this rank runs per step when the step has `global` of them.
    pub fn local_accum(&self, global: usize, cfg: &TrainConfig, seq_len: u64) -> Result<usize> {
        let n = self.size();
        if global.is_multiple_of(n) {
            return Ok(global / n);
        }
        let unit = n as u64 * cfg.micro_batch as u64 * seq_len;
        Err(Error::Input(format!(
            "config key tokens_per_step: {} tokens make {global} micro-batch(es) of {} row(s) × \
             {seq_len} tokens per step, which {n} data-parallel ranks cannot share equally; set \
             tokens_per_step to a multiple of {unit} (ranks × micro_batch × seq_len), e.g. {}",
            cfg.tokens_per_step,
            cfg.micro_batch,
            unit * (global as u64).div_ceil(n as u64)
        )))
    }

    /// The row of the global (one-process) batch that row `row` of this rank's `local_step`-th
    /// loader batch of the step is. The loader deals the global stream round-robin: position `i`
    /// of a loader step of `rows_per_rank · N` positions goes to rank `i mod N`.
    pub fn global_row(&self, local_step: usize, row: usize, rows_per_rank: usize) -> usize {
        global_row(self.loader_rank(), local_step, row, rows_per_rank)
    }

    /// Makes every rank's parameters rank 0's (a fresh init or a resumed checkpoint is already
    /// identical everywhere; this makes it certain, as torch's DDP does).
    pub fn broadcast_parameters(&self, model: &Model) -> Result<()> {
        let Some(g) = self.group() else { return Ok(()) };
        tch::no_grad(|| -> Result<()> {
            for (_, p) in model.named_parameters() {
                g.broadcast(&mut p.shallow_clone(), 0)?;
            }
            Ok(())
        })
    }

    /// Sums the step's normalisers and its token count over ranks (one all-reduce of three
    /// fp64 values on the mesh's device; the host reads the result, which the loss needs).
    pub fn global_normalizers(
        &self,
        norm: LossNormalizers,
        tokens: u64,
    ) -> Result<(LossNormalizers, u64)> {
        let Some(g) = self.group() else {
            return Ok((norm, tokens));
        };
        let mut t = Tensor::f_from_slice(&[norm.label_tokens, norm.samples, tokens as f64])?
            .f_to_device(self.mesh.device())?;
        g.all_reduce(&mut t, ReduceOp::Sum)?;
        let v = Vec::<f64>::try_from(&t.f_to_device(tch::Device::Cpu)?)?;
        Ok((
            LossNormalizers {
                label_tokens: v[0],
                samples: v[1],
            },
            v[2] as u64,
        ))
    }

    /// Sums the loss terms over ranks (on their device: no host round trip).
    pub fn reduce_sums(&self, sums: &mut Sums) -> Result<()> {
        let Some(g) = self.group() else { return Ok(()) };
        let mut t = Tensor::f_stack(&[&sums.clm, &sums.kl, &sums.clm_pert], 0)?;
        g.all_reduce(&mut t, ReduceOp::Sum)?;
        sums.clm = t.f_get(0)?;
        sums.kl = t.f_get(1)?;
        sums.clm_pert = t.f_get(2)?;
        Ok(())
    }

    /// Sums the parameters' gradients over ranks: flattened into buckets of at most
    /// `grad_bucket_mb` of fp32 elements (fp32, or fp64 for fp64 models), one all-reduce each,
    /// copied back.
    pub fn reduce_gradients(&self, model: &Model) -> Result<()> {
        let Some(g) = self.group() else { return Ok(()) };
        let grads: Vec<Tensor> = model
            .named_parameters()
            .into_iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .collect();
        for bucket in buckets(grads.iter().map(Tensor::numel), self.bucket_elems) {
            let members: Vec<&Tensor> = bucket.map(|i| &grads[i]).collect();
            reduce_bucket(g, &members)?;
        }
        Ok(())
    }

    /// Sums `values` (host numbers: losses, counts) over every rank; all ranks get the same.
    pub fn sum_values(&self, values: &[f64]) -> Result<Vec<f64>> {
        let Some(g) = self.group() else {
            return Ok(values.to_vec());
        };
        let mut t = Tensor::f_from_slice(values)?.f_to_device(self.mesh.device())?;
        g.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(Vec::<f64>::try_from(&t.f_to_device(tch::Device::Cpu)?)?)
    }

    /// Whether `flag` holds on any rank (one decision for all).
    pub fn any(&self, flag: bool) -> Result<bool> {
        Ok(self.most(i64::from(flag))? != 0)
    }

    /// The largest of every rank's `value` (a small integer: one int32 all-reduce), the same on
    /// all: a decision where the strongest wish wins.
    pub fn most(&self, value: i64) -> Result<i64> {
        let Some(g) = self.group() else {
            return Ok(value);
        };
        let mut t = Tensor::f_full([1], value, (Kind::Int, self.mesh.device()))?;
        g.all_reduce(&mut t, ReduceOp::Max)?;
        t.f_int64_value(&[0]).map_err(Into::into)
    }

    /// The world ranks on which `flag` holds, the same list on every rank (one all-gather).
    pub fn ranks_where(&self, flag: bool) -> Result<Vec<usize>> {
        let Some(g) = self.group() else {
            return Ok(if flag { vec![0] } else { Vec::new() });
        };
        let t = Tensor::f_from_slice(&[i64::from(flag)])?.f_to_device(self.mesh.device())?;
        let all = Vec::<i64>::try_from(&g.all_gather(&t)?.f_to_device(tch::Device::Cpu)?)?;
        Ok((0..all.len()).filter(|&r| all[r] != 0).collect())
    }

    /// `result` on every rank when it holds on every rank. When `what` failed on any rank,
    /// every rank stops now with an error (the failed ranks with their own, the others naming
    /// them), instead of the others waiting in their next collective until its timeout. One
    /// all-gather of a flag.
    pub fn all_ok<T>(&self, what: &str, result: Result<T>) -> Result<T> {
        let Some(g) = self.group() else {
            return result;
        };
        let flag =
            Tensor::f_from_slice(&[i64::from(result.is_err())])?.f_to_device(self.mesh.device())?;
        let all = Vec::<i64>::try_from(&g.all_gather(&flag)?.f_to_device(tch::Device::Cpu)?)?;
        let failed: Vec<String> = (0..all.len())
            .filter(|&r| all[r] != 0)
            .map(|r| r.to_string())
            .collect();
        match result {
            Ok(_) if !failed.is_empty() => Err(Error::Input(format!(
                "{what} failed on rank {} (its own message says why); every rank stops",
                failed.join(", ")
            ))),
            other => other,
        }
    }

    /// Stops every rank unless every rank starts from the same point as rank 0: the same
    /// checkpoint (step and the sha256 of its manifest, which holds every file's checksum), or a
    /// fresh start on all. Ranks resolve `--resume` on their own, before the mesh exists; a
    /// shared filesystem whose view lags on one host, or a checkpoint one host failed to
    /// validate, would otherwise make that rank resume another step, with other optimizer
    /// blocks, data position and schedule.
    pub fn agree_on_resume(&self, mine: &ResumePoint) -> Result<()> {
        let Some(g) = self.group() else {
            return Ok(());
        };
        let words = mine.words();
        let t = Tensor::f_from_slice(&words)?.f_to_device(self.mesh.device())?;
        let all = Vec::<i64>::try_from(&g.all_gather(&t)?.f_to_device(tch::Device::Cpu)?)?;
        let points: Vec<ResumePoint> = all
            .chunks(words.len())
            .map(ResumePoint::from_words)
            .collect();
        let Some(other) = points.iter().position(|p| p != &points[0]) else {
            return Ok(());
        };
        Err(Error::Input(format!(
            "ranks disagree on where to start: rank 0 {}, rank {other} {}; this rank ({}) \
             read {}. Every rank stops. A run directory on a shared filesystem whose view lags on \
             some hosts, or a checkpoint that failed validation on one of them: wait and run \
             again, or name the checkpoint for every rank (--resume DIR)",
            points[0],
            points[other],
            self.rank(),
            mine.path
                .as_ref()
                .map_or("no checkpoint (a fresh start)".into(), |p| p
                    .display()
                    .to_string()),
        )))
    }

    /// Waits until every rank gets here.
    pub fn barrier(&self) -> Result<()> {
        match self.group() {
            Some(g) => Ok(g.barrier()?),
            None => Ok(()),
        }
    }
}

/// The gradient buckets of parameters of these sizes (in order): runs of consecutive
/// parameters of at most `max_elems` elements together (a larger parameter alone), as index
/// ranges. The one place the bucket layout is decided, so the traffic formula
/// ([`crate::comm`]) counts the same calls.
pub fn buckets(
    sizes: impl IntoIterator<Item = usize>,
    max_elems: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut elems) = (0usize, 0usize);
    let mut i = 0usize;
    for n in sizes {
        if i > start && elems + n > max_elems {
            out.push(start..i);
            start = i;
            elems = 0;
        }
        elems += n;
        i += 1;
    }
    if i > start {
        out.push(start..i);
    }
    out
}

/// [`DataParallel::global_row`] for data-parallel rank `dp`.
fn global_row(dp: rsd_loader::Rank, local_step: usize, row: usize, rows_per_rank: usize) -> usize {
    local_step * rows_per_rank * dp.size + row * dp.size + dp.rank
}

/// The dtype gradients are summed in: fp32 (bf16/fp16/fp32 models), fp64 for fp64 models (whose
/// runs are the exact references of the tests).
pub fn reduce_kind(param: Kind) -> Kind {
    if param == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    }
}

/// One all-reduce (sum) of these gradients, flattened into a single buffer
/// ([`reduce_kind`]).
fn reduce_bucket(g: &ProcessGroup, grads: &[&Tensor]) -> Result<()> {
    let flat = grads
        .iter()
        .map(|t| t.f_reshape([-1])?.f_to_kind(reduce_kind(t.kind())))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut buf = Tensor::f_cat(&flat, 0)?;
    g.all_reduce(&mut buf, ReduceOp::Sum)?;
    let mut off = 0i64;
    for t in grads {
        let n = t.numel() as i64;
        let part = buf.f_narrow(0, off, n)?.f_view_as(t)?;
        t.shallow_clone().f_copy_(&part)?;
        off += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsd_loader::synth::{self, SynthSpec};
    use rsd_loader::{Loader, Rank, SampleId};

    /// The samples of `steps` optimizer steps of `accum` loader batches, as rank `dp` sees them,
    /// placed at their global row index.
    fn rows_of(
        cfg: &TrainConfig,
        dp: Rank,
        accum: usize,
        steps: usize,
    ) -> Vec<Vec<Option<SampleId>>> {
        let parallel = rsd_loader::Parallel {
            dp,
            cp: Rank::SINGLE,
        };
        let mut loader = Loader::new(crate::data::loader_config(cfg, parallel).unwrap()).unwrap();
        let local = accum / dp.size;
        (0..steps)
            .map(|_| {
                let mut rows = vec![None; accum * cfg.micro_batch];
                for k in 0..local {
                    let batch = loader.next().unwrap().unwrap();
                    assert_eq!(batch.rows(), cfg.micro_batch);
                    for (j, s) in batch.samples.iter().enumerate() {
                        rows[global_row(dp, k, j, cfg.micro_batch)] = Some(*s);
                    }
                }
                rows
            })
            .collect()
    }

    #[test]
    fn buckets_are_runs_of_parameters_up_to_the_limit() {
        assert_eq!(buckets([3, 3, 3], 6), vec![0..2, 2..3]);
        assert_eq!(buckets([10, 1, 1], 6), vec![0..1, 1..3]);
        assert_eq!(buckets([1, 1], usize::MAX), vec![0..2]);
        assert!(buckets([], 6).is_empty());
    }

    #[test]
    fn the_ranks_rows_are_the_one_process_batch_in_its_order() {
        let dir = tempfile::tempdir().unwrap();
        let spec = SynthSpec {
            samples: 97,
            seq_len: 16,
            ..SynthSpec::default()
        };
        synth::write(dir.path(), &spec).unwrap();
        for micro_batch in [1, 3] {
            let cfg = TrainConfig {
                shards: dir.path().display().to_string(),
                micro_batch,
                ..TrainConfig::default()
            };
            let (accum, steps) = (4, 3);
            let one = rows_of(&cfg, Rank::SINGLE, accum, steps);
            assert!(one.iter().flatten().all(Option::is_some));
            for n in [2, 4] {
                let mut union = vec![vec![None; accum * micro_batch]; steps];
                for r in 0..n {
                    let mine = rows_of(&cfg, Rank::new(r, n), accum, steps);
                    for (u, m) in union.iter_mut().zip(mine) {
                        for (slot, s) in u.iter_mut().zip(m) {
                            if let Some(s) = s {
                                assert!(slot.is_none(), "two ranks claim one global row");
                                *slot = Some(s);
                            }
                        }
                    }
                }
                assert_eq!(union, one, "micro_batch {micro_batch}, {n} ranks");
            }
        }
    }
}

/// Where a rank starts: a checkpoint's step and the sha256 of its `manifest.json`, or a fresh
/// start (step 0, no digest). Compared across ranks by [`DataParallel::agree_on_resume`]: equal
/// when step and digest are (the path is where this rank read it, which may differ by host).
#[derive(Debug, Clone)]
pub struct ResumePoint {
    /// The checkpoint's step; 0 for a fresh start.
    pub step: u64,
    /// sha256 of the checkpoint's manifest; zeros for a fresh start.
    pub digest: [u8; 32],
    /// Where this rank read it (not compared: paths differ between hosts).
    pub path: Option<std::path::PathBuf>,
}

impl ResumePoint {
    /// A fresh start.
    pub fn fresh() -> Self {
        ResumePoint {
            step: 0,
            digest: [0; 32],
            path: None,
        }
    }

    /// The step and manifest digest of the checkpoint in `dir`.
    pub fn of_checkpoint(dir: &std::path::Path) -> Result<Self> {
        let step = crate::checkpoint::read_state(dir)?.step;
        let (_, digest) = crate::checkpoint::file_digest(&dir.join(crate::checkpoint::MANIFEST))?;
        Ok(ResumePoint {
            step,
            digest,
            path: Some(dir.to_path_buf()),
        })
    }

    fn words(&self) -> Vec<i64> {
        let mut w = vec![self.step as i64];
        w.extend(
            self.digest
                .chunks(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default())),
        );
        w
    }

    fn from_words(w: &[i64]) -> Self {
        let mut digest = [0u8; 32];
        for (i, x) in w.iter().skip(1).take(4).enumerate() {
            digest[8 * i..8 * i + 8].copy_from_slice(&x.to_le_bytes());
        }
        ResumePoint {
            step: w.first().copied().unwrap_or(0) as u64,
            digest,
            path: None,
        }
    }
}

impl PartialEq for ResumePoint {
    fn eq(&self, other: &ResumePoint) -> bool {
        self.step == other.step && self.digest == other.digest
    }
}

impl std::fmt::Display for ResumePoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.digest == [0; 32] {
            return write!(f, "starts fresh");
        }
        write!(
            f,
            "resumes step {} (manifest sha256 {}…)",
            self.step,
            &rsd_common::hex(&self.digest)[..12]
        )
    }
}
