//! AdamW with its state and the summed gradient sharded over the data-parallel ranks
//! (`shard_optimizer`, ZeRO-2).
//!
//! Replicated AdamW keeps, on every rank, fp32 master weights and two fp32 moments of every
//! parameter: 12 bytes per parameter (96 GB for an 8B model), the largest item of the memory
//! budget, plus the whole gradient. Here each of N ranks keeps 1/N of the state and of the
//! summed gradient, and no rank holds the whole gradient across micro-batches:
//!
//! * the parameters are laid out in buckets along the model's structure: the top (final norm and
//!   an untied LM head), each layer from the last down, the embedding. A bucket never spans two of
//!   these parts; a part larger than `grad_bucket_mb` is several buckets (a single tensor larger
//!   than that is a bucket of its own). Each bucket is padded to a multiple of N; rank r owns
//!   block r of every bucket;
//! * after each micro-batch's backward of a part (with `checkpoint_layers`, right after that
//!   layer's backward: [`ShardedAdamW::grads_done`]; otherwise after the whole backward:
//!   [`ShardedAdamW::micro_batch_done`]) each of its buckets' gradients is reduce-scattered in
//!   fp32 (fp64 for fp64 models): each rank adds the ranks' summed gradient of its block to an
//!   fp32 accumulator, and the parameters' `.grad` tensors are freed (undefined, not zeroed);
//! * the global gradient norm is the sum of the ranks' block norms (one all-reduce of a scalar),
//!   so clipping is the replicated optimizer's;
//! * each rank applies AdamW to its block (the arithmetic of [`AdamW`](crate::optim::AdamW),
//!   [`Update`]), then every bucket's new parameters are all-gathered in the model's dtype and
//!   copied into the model.
//!
//! The buckets are reduced in one fixed order (bucket order: the order the checkpointed backward
//! completes them), whichever path completes them, so the ranks' collectives always pair up.
//!
//! Checkpoints are sharded too ([`ShardedAdamW::save_shard`]): each rank writes its own blocks;
//! nothing is gathered. [`SavedShards`] reads any rank's byte ranges of such a checkpoint from
//! memory maps, so a run resumes at another number of ranks (re-sharded on load), or replicated.
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors};
use tch::{Device, Kind, Tensor};

use rsd_dist::{PendingReduceScatter, ProcessGroup, ReduceOp};
use rsd_model::Model;

use crate::checkpoint::{shard_file_name, SavedBucket, SavedParam, ShardLayout};
use crate::config::GradReduce;
use crate::optim::{shape as shape_str, AdamWConfig, Update};
use crate::step::GradsDone;
use crate::{io_err, Error, Result};

/// One parameter's place in its bucket.
struct Member {
    name: String,
    param: Tensor,
    /// First element in the bucket's flat layout.
    offset: i64,
    numel: i64,
}

/// A run of parameters of one part of the model laid out flat, and this rank's block of it.
struct Bucket {
    /// The part of the model the members belong to.
    part: GradsDone,
    members: Vec<Member>,
    /// Elements of the members together.
    used: i64,
    /// Elements per rank: `used` padded to a multiple of the ranks, divided by them.
    block: i64,
    /// Ranks sharing the bucket.
    ranks: i64,
    /// First element of this rank's block in the flat layout.
    start: i64,
    /// Master weights, moments and summed gradient of the block (fp32; fp64 for fp64 models).
    master: Tensor,
    m: Tensor,
    v: Tensor,
    grad: Tensor,
    /// `(start, len)` ranges of the block that belong to decayed parameters (matrices).
    decayed: Vec<(i64, i64)>,
    /// Whether this micro-batch's gradients of the bucket have been reduced already.
    reduced: Cell<bool>,
    /// With [`GradReduce::Step`], the rank's own gradient sum of the whole bucket over the
    /// step's micro-batches (flat, padded, the state's dtype), reduce-scattered once per step.
    local: Option<Tensor>,
}

/// AdamW over this rank's block of every bucket.
pub struct ShardedAdamW {
    cfg: AdamWConfig,
    buckets: Vec<Bucket>,
    /// Whether the model's dtype is below fp32 (then checkpoints hold `master.*` tensors, as a
    /// replicated optimizer's do).
    low_precision: bool,
    /// The largest bucket asked for (`grad_bucket_mb` in elements).
    bucket_elems: usize,
    /// Updates applied so far (for the bias corrections).
    pub steps: u64,
    /// Whether a bucket's reduce-scatter may stay in flight while the backward goes on.
    overlap: bool,
    /// The bucket whose reduce-scatter is in flight, if any (at most one: its flat gradient is
    /// the only one waiting).
    in_flight: RefCell<Option<(usize, PendingReduceScatter)>>,
    /// When the gradient is summed over the ranks.
    grad_reduce: GradReduce,
}

/// The buckets' members: the parameters grouped by part in backward order, each part cut into
/// runs of at most `bucket_elems` elements (a larger tensor alone).
fn bucket_runs(
    params: Vec<(String, Tensor)>,
    bucket_elems: usize,
) -> Vec<(GradsDone, Vec<(String, Tensor)>)> {
    let mut params: Vec<(GradsDone, String, Tensor)> = params
        .into_iter()
        .map(|(n, p)| (GradsDone::of(&n), n, p))
        .collect();
    // Stable: within a part the names stay in `named_parameters` order.
    params.sort_by_key(|(part, _, _)| *part);
    let mut runs: Vec<(GradsDone, Vec<(String, Tensor)>)> = Vec::new();
    let mut elems = 0usize;
    for (part, name, param) in params {
        let n = param.numel();
        match runs.last_mut() {
            Some((p, run)) if *p == part && elems + n <= bucket_elems => run.push((name, param)),
            _ => {
                runs.push((part, vec![(name, param)]));
                elems = 0;
            }
        }
        elems += n;
    }
    runs
}

impl ShardedAdamW {
    /// Zero moments and this rank's block of master weights for every parameter of `model`,
    /// sharded over `group` in buckets of at most `bucket_elems` elements.
    pub fn new(
        model: &Model,
        cfg: AdamWConfig,
        group: &ProcessGroup,
        bucket_elems: usize,
    ) -> Result<Self> {
        Self::with_ranks(
            model,
            cfg,
            group.rank() as i64,
            group.size() as i64,
            bucket_elems,
        )
    }

    /// [`ShardedAdamW::new`] for rank `rank` of `ranks` (no group needed to build the layout).
    pub(crate) fn with_ranks(
        model: &Model,
        cfg: AdamWConfig,
        rank: i64,
        ranks: i64,
        bucket_elems: usize,
    ) -> Result<Self> {
        let params = model.named_parameters();
        let low_precision = params
            .iter()
            .any(|(_, p)| !matches!(p.kind(), Kind::Float | Kind::Double));
        let state_kind = match params.first() {
            Some((_, p)) if p.kind() == Kind::Double => Kind::Double,
            _ => Kind::Float,
        };
        let runs = bucket_runs(params, bucket_elems);
        let buckets = tch::no_grad(|| {
            runs.into_iter()
                .map(|(part, run)| Bucket::new(part, run, rank, ranks, state_kind))
                .collect::<Result<Vec<_>>>()
        })?;
        Ok(ShardedAdamW {
            cfg,
            buckets,
            low_precision,
            bucket_elems,
            steps: 0,
            overlap: true,
            in_flight: RefCell::new(None),
            grad_reduce: GradReduce::MicroBatch,
        })
    }

    /// Sums the gradient over the ranks after every micro-batch (the default) or once per step
    /// from a local whole-bucket sum ([`GradReduce`]).
    pub fn reducing(mut self, mode: GradReduce) -> Result<Self> {
        for b in &mut self.buckets {
            b.local = match mode {
                GradReduce::MicroBatch => None,
                GradReduce::Step => Some(Tensor::f_zeros(
                    [b.block * b.ranks],
                    (b.m.kind(), b.m.device()),
                )?),
            };
        }
        self.grad_reduce = mode;
        Ok(self)
    }

    /// Whether a bucket's reduce-scatter runs while the backward computes the next part's
    /// gradients (`true`, the default) or blocks until done (`false`). The same sums either
    /// way; overlapped, one more bucket's flat gradient is live during the next part's backward.
    pub fn overlapped(mut self, on: bool) -> Self {
        self.overlap = on;
        self
    }

    /// `part`'s gradients of this micro-batch are complete: reduce-scatters its buckets into the
    /// accumulators and frees the gradients. A collective: every rank calls it for the same
    /// parts in the same order.
    pub fn grads_done(&self, group: &ProcessGroup, part: GradsDone) -> Result<()> {
        for (i, b) in self.buckets.iter().enumerate() {
            if b.part == part {
                self.reduce(group, i)?;
            }
        }
        Ok(())
    }

    /// Starts bucket `i`'s reduce-scatter and finishes the one in flight before it; without
    /// overlap, finishes it at once. Overlapped, the last bucket of a part is on the wire while
    /// the backward computes the next part's gradients.
    fn reduce(&self, group: &ProcessGroup, i: usize) -> Result<()> {
        if self.grad_reduce == GradReduce::Step {
            return self.buckets[i].accumulate_local();
        }
        let pending = self.buckets[i].start_reduce(group)?;
        let previous = self.in_flight.replace(Some((i, pending)));
        if let Some((j, p)) = previous {
            self.buckets[j].finish_reduce(group, p)?;
        }
        if !self.overlap {
            self.finish_in_flight(group)?;
        }
        Ok(())
    }

    /// Waits for the reduce-scatter in flight, if any, and adds its block to the accumulator.
    fn finish_in_flight(&self, group: &ProcessGroup) -> Result<()> {
        match self.in_flight.take() {
            Some((j, p)) => self.buckets[j].finish_reduce(group, p),
            None => Ok(()),
        }
    }

    /// The micro-batch's backward is over: reduce-scatters every bucket not reduced yet (all of
    /// them without per-layer hooks; a rank with fewer micro-batches than the others reduces
    /// zeros), and starts the next micro-batch.
    pub fn micro_batch_done(&self, group: &ProcessGroup) -> Result<()> {
        for i in 0..self.buckets.len() {
            if !self.buckets[i].reduced.get() {
                self.reduce(group, i)?;
            }
        }
        self.finish_in_flight(group)?;
        for b in &self.buckets {
            b.reduced.set(false);
        }
        Ok(())
    }

    /// After the step's last micro-batch: with [`GradReduce::Step`], reduce-scatters every
    /// bucket's local sum (one in flight while the next starts) into the accumulators; with
    /// [`GradReduce::MicroBatch`] that happened micro-batch by micro-batch and there is nothing
    /// to do. A collective in step mode: every rank calls it once per step.
    pub fn step_done(&self, group: &ProcessGroup) -> Result<()> {
        if self.grad_reduce != GradReduce::Step {
            return Ok(());
        }
        for (i, b) in self.buckets.iter().enumerate() {
            let Some(local) = &b.local else { continue };
            let pending = group.reduce_scatter_start(local, ReduceOp::Sum)?;
            if let Some((j, p)) = self.in_flight.replace(Some((i, pending))) {
                self.buckets[j].finish_reduce(group, p)?;
            }
        }
        self.finish_in_flight(group)
    }

    /// Zeroes the summed gradient (after an update, or a skipped one).
    pub fn zero_grad(&self) -> Result<()> {
        for b in &self.buckets {
            let _ = b.grad.shallow_clone().f_zero_()?;
            b.reduced.set(false);
        }
        Ok(())
    }

    /// The norm of the summed gradient over all ranks' blocks (every rank gets the same value):
    /// each block's norm on the device (accumulated in its dtype, fp32 or fp64), their squares
    /// summed in fp64 and over the ranks, and one host read.
    pub fn grad_norm(&self, group: &ProcessGroup) -> Result<f64> {
        let mut norms = Vec::with_capacity(self.buckets.len());
        for b in &self.buckets {
            let acc = rsd_model::accum_kind(b.grad.kind());
            norms.push(
                b.grad
                    .f_norm_scalaropt_dtype(2.0, acc)?
                    .f_to_kind(Kind::Double)?,
            );
        }
        let mut t = match norms.is_empty() {
            true => Tensor::f_zeros([1], (Kind::Double, group_device(&self.buckets)))?,
            false => Tensor::f_stack(&norms, 0)?
                .f_square()?
                .f_sum(Kind::Double)?
                .f_reshape([1])?,
        };
        group.all_reduce(&mut t, ReduceOp::Sum)?;
        Ok(t.f_double_value(&[0])?.sqrt())
    }

    /// One update at rate `lr` with the gradient scaled by `clip` (if any), then the model's
    /// parameters made the new ones everywhere.
    pub fn step(&mut self, group: &ProcessGroup, lr: f64, clip: Option<f64>) -> Result<()> {
        self.steps += 1;
        let update = Update::new(&self.cfg, lr, self.steps);
        tch::no_grad(|| {
            for b in &mut self.buckets {
                if let Some(coef) = clip {
                    let _ = b.grad.f_mul_scalar_(coef)?;
                }
                for &(start, len) in &b.decayed {
                    update.decay(&mut b.master.f_narrow(0, start, len)?)?;
                }
                update.apply(&b.master, &b.grad, &b.m, &b.v)?;
                b.gather_parameters(group)?;
            }
            Ok(())
        })
    }

    /// The bucket layout a checkpoint records (the same on every rank).
    pub fn layout(&self) -> ShardLayout {
        let state_kind = self.buckets.first().map_or(Kind::Float, |b| b.m.kind());
        ShardLayout {
            bucket_elems: self.bucket_elems,
            ranks: self.buckets.first().map_or(1, |b| b.ranks as usize),
            state_dtype: if state_kind == Kind::Double {
                "F64".into()
            } else {
                "F32".into()
            },
            master: self.low_precision,
            buckets: self
                .buckets
                .iter()
                .map(|b| SavedBucket {
                    block: b.block,
                    params: b
                        .members
                        .iter()
                        .map(|m| SavedParam {
                            name: m.name.clone(),
                            shape: m.param.size(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }

    /// Writes this rank's blocks (`m.<bucket>`, `v.<bucket>`, and `master.<bucket>` for bf16/fp16
    /// models; flat, `block` elements each) as a safetensors file at `path`, and fsyncs it.
    pub fn save_shard(&self, path: &Path) -> Result<()> {
        let mut named: Vec<(String, Tensor)> = Vec::new();
        for (j, b) in self.buckets.iter().enumerate() {
            named.push((format!("m.{j}"), b.m.f_to_device(Device::Cpu)?));
            named.push((format!("v.{j}"), b.v.f_to_device(Device::Cpu)?));
            if self.low_precision {
                named.push((format!("master.{j}"), b.master.f_to_device(Device::Cpu)?));
            }
        }
        Tensor::write_safetensors(&named, path)?;
        std::fs::File::open(path)
            .and_then(|f| f.sync_all())
            .map_err(io_err(path))
    }

    /// Reads this rank's block of every tensor from `path` (an `optimizer.safetensors` of a
    /// replicated run, at any number of ranks). The model must already hold the checkpoint's
    /// parameters (they are the master weights of an fp32 model).
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<()> {
        let bad = |reason: String| Error::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        let file = rsd_common::safe_fs::open_regular(path)?;
        // SAFETY: the checkpoint is read-only while the run resumes from it (checkpoints are
        // written to a temporary directory and renamed into place, never modified in place).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(path))?;
        let st = SafeTensors::deserialize(&map).map_err(|e| bad(e.to_string()))?;
        self.fill_blocks(steps, |_, b, what| {
            b.read_block(&st, what, b.m.kind(), &bad)
        })
    }

    /// Reads this rank's block of every bucket from a sharded checkpoint (any number of ranks).
    /// The bucket layout must be this run's: the same parameters and `grad_bucket_mb`.
    pub fn load_shards(&mut self, saved: &SavedShards, steps: u64) -> Result<()> {
        saved.check_params(
            self.buckets
                .iter()
                .flat_map(|b| b.members.iter().map(|m| (m.name.as_str(), m.param.size()))),
        )?;
        let here = self.layout();
        let same = here.buckets.len() == saved.layout.buckets.len()
            && here
                .buckets
                .iter()
                .zip(&saved.layout.buckets)
                .all(|(a, b)| a.params == b.params);
        if !same || here.bucket_elems != saved.layout.bucket_elems {
            return Err(saved.bad(format!(
                "its optimizer state is laid out in buckets of {} elements (grad_bucket_mb = \
                 {}), this run's in {} (grad_bucket_mb = {}): resume with grad_bucket_mb = {}",
                saved.layout.bucket_elems,
                mib_of(saved.layout.bucket_elems),
                self.bucket_elems,
                mib_of(self.bucket_elems),
                mib_of(saved.layout.bucket_elems)
            )));
        }
        let low_precision = self.low_precision;
        if saved.layout.master != low_precision {
            return Err(saved.bad(format!(
                "master weights {}, this run's dtype {} them (config key dtype)",
                if saved.layout.master {
                    "saved"
                } else {
                    "not saved"
                },
                if low_precision {
                    "needs"
                } else {
                    "has no use for"
                }
            )));
        }
        self.fill_blocks(steps, |j, b, what| {
            let (kind, device, block) = (b.m.kind(), b.m.device(), b.block);
            let (lo, hi) = (b.start.min(b.used), (b.start + block).min(b.used));
            let t = saved.range(j, what, lo, hi, kind, device)?;
            if hi - lo == block {
                return Ok(t);
            }
            let zeros = Tensor::f_zeros([block - (hi - lo)], (kind, device))?;
            Ok(Tensor::f_cat(&[t, zeros], 0)?)
        })
    }

    /// Sets every bucket's moments (and, below fp32, master weights) to this rank's block as
    /// `read(bucket index, bucket, "m" | "v" | "master")` gives it; fp32 models take the master
    /// from their own parameters. Then `steps` updates count as done.
    fn fill_blocks(
        &mut self,
        steps: u64,
        read: impl Fn(usize, &Bucket, &str) -> Result<Tensor>,
    ) -> Result<()> {
        let low_precision = self.low_precision;
        tch::no_grad(|| {
            for (j, b) in self.buckets.iter_mut().enumerate() {
                let (m, v) = (read(j, b, "m")?, read(j, b, "v")?);
                let master = if low_precision {
                    read(j, b, "master")?
                } else {
                    b.flat(|p| Ok(p.shallow_clone()))?
                        .f_narrow(0, b.start, b.block)?
                };
                b.m.f_copy_(&m)?;
                b.v.f_copy_(&v)?;
                b.master.f_copy_(&master)?;
            }
            Ok::<(), Error>(())
        })?;
        self.steps = steps;
        Ok(())
    }
}

/// `elems` fp32 elements in whole MiB (what `grad_bucket_mb` was).
/// The device the buckets live on (the CPU when there are none).
fn group_device(buckets: &[Bucket]) -> Device {
    buckets.first().map_or(Device::Cpu, |b| b.grad.device())
}

fn mib_of(elems: usize) -> usize {
    (elems * std::mem::size_of::<f32>()) >> 20
}

impl Bucket {
    fn new(
        part: GradsDone,
        run: Vec<(String, Tensor)>,
        rank: i64,
        ranks: i64,
        kind: Kind,
    ) -> Result<Self> {
        let mut members = Vec::with_capacity(run.len());
        let mut offset = 0i64;
        for (name, param) in run {
            let numel = param.numel() as i64;
            members.push(Member {
                name,
                param,
                offset,
                numel,
            });
            offset += numel;
        }
        let used = offset;
        let block = (used + ranks - 1) / ranks;
        let start = rank * block;
        let mut decayed = Vec::new();
        for m in &members {
            // Weight decay applies to matrices, as in the replicated optimizer.
            if m.param.dim() < 2 {
                continue;
            }
            let (lo, hi) = (m.offset.max(start), (m.offset + m.numel).min(start + block));
            if lo < hi {
                decayed.push((lo - start, hi - lo));
            }
        }
        let device = members.first().map_or(Device::Cpu, |m| m.param.device());
        let zeros = || Tensor::f_zeros([block], (kind, device));
        let mut bucket = Bucket {
            part,
            members,
            used,
            block,
            ranks,
            start,
            master: zeros()?,
            m: zeros()?,
            v: zeros()?,
            grad: zeros()?,
            decayed,
            reduced: Cell::new(false),
            local: None,
        };
        let master = bucket
            .flat(|p| Ok(p.shallow_clone()))?
            .f_narrow(0, start, block)?;
        bucket.master.f_copy_(&master)?;
        Ok(bucket)
    }

    /// Starts the reduce-scatter of the members' gradients (zeros where a member has none) in
    /// the state's dtype and frees the gradients (the collective holds their flat copy).
    fn start_reduce(&self, group: &ProcessGroup) -> Result<PendingReduceScatter> {
        let pending = tch::no_grad(|| -> Result<PendingReduceScatter> {
            let flat = self.flat(|p| {
                let g = p.grad();
                if g.defined() {
                    Ok(g)
                } else {
                    Ok(p.f_zeros_like()?)
                }
            })?;
            Ok(group.reduce_scatter_start(&flat, ReduceOp::Sum)?)
        })?;
        for m in &self.members {
            free_grad(&m.param);
        }
        self.reduced.set(true);
        Ok(pending)
    }

    /// Waits for this bucket's reduce-scatter and adds this rank's block to the accumulator
    /// (and, in step mode, clears the local sum it was computed from for the next step).
    fn finish_reduce(&self, group: &ProcessGroup, pending: PendingReduceScatter) -> Result<()> {
        let block = pending.wait(group)?;
        tch::no_grad(|| {
            let _ = self
                .grad
                .shallow_clone()
                .f_add_(&block.f_to_device(self.grad.device())?)?;
            if let Some(local) = &self.local {
                let _ = local.shallow_clone().f_zero_()?;
            }
            Ok(())
        })
    }

    /// Step mode: adds the members' gradients of this micro-batch into the local sum, in place
    /// (no flat copy), and frees them. A member without a gradient adds nothing.
    fn accumulate_local(&self) -> Result<()> {
        let Some(local) = &self.local else {
            return Ok(());
        };
        tch::no_grad(|| -> Result<()> {
            for m in &self.members {
                let g = m.param.grad();
                if g.defined() {
                    let mut dst = local.f_narrow(0, m.offset, m.numel)?;
                    let _ = dst.f_add_(&g.f_reshape([-1])?)?;
                }
            }
            Ok(())
        })?;
        for m in &self.members {
            free_grad(&m.param);
        }
        self.reduced.set(true);
        Ok(())
    }

    /// `of(param)` of every member, in the state's dtype, laid out flat and zero-padded to
    /// `block · ranks` elements.
    fn flat(&self, of: impl Fn(&Tensor) -> Result<Tensor>) -> Result<Tensor> {
        let kind = self.m.kind();
        let mut parts = Vec::with_capacity(self.members.len() + 1);
        for m in &self.members {
            parts.push(of(&m.param)?.f_reshape([-1])?.f_to_kind(kind)?);
        }
        let total = self.block * self.ranks;
        if total > self.used {
            parts.push(Tensor::f_zeros(
                [total - self.used],
                (kind, self.m.device()),
            )?);
        }
        Ok(Tensor::f_cat(&parts, 0)?)
    }

    /// All-gathers the ranks' blocks of master weights in the model's dtype and copies them into
    /// the model's parameters.
    fn gather_parameters(&self, group: &ProcessGroup) -> Result<()> {
        let Some(first) = self.members.first() else {
            return Ok(());
        };
        let block = self.master.f_to_kind(first.param.kind())?;
        let full = group
            .all_gather(&block)?
            .f_to_device(first.param.device())?;
        for m in &self.members {
            let new = full.f_narrow(0, m.offset, m.numel)?.f_view_as(&m.param)?;
            m.param.shallow_clone().f_copy_(&new)?;
        }
        Ok(())
    }

    /// This rank's block of the flat layout of `<what>.<name>` over the members, read from `st`.
    fn read_block(
        &self,
        st: &SafeTensors,
        what: &str,
        kind: Kind,
        bad: &dyn Fn(String) -> Error,
    ) -> Result<Tensor> {
        let (lo, hi) = (self.start, self.start + self.block);
        let mut parts = Vec::new();
        for m in &self.members {
            let key = format!("{what}.{}", m.name);
            let view = st
                .tensor(&key)
                .map_err(|_| bad(format!("missing optimizer tensor {key}")))?;
            let shape: Vec<i64> = view.shape().iter().map(|&d| d as i64).collect();
            if shape != m.param.size() {
                return Err(bad(format!(
                    "{key}: shape {}, expected {}",
                    shape_str(&shape),
                    shape_str(&m.param.size())
                )));
            }
            let (a, b) = (m.offset.max(lo), (m.offset + m.numel).min(hi));
            if a >= b {
                continue;
            }
            parts.push(
                slice_of(&view, a - m.offset, b - m.offset, &key, bad)?
                    .f_to_kind(kind)?
                    .f_to_device(self.m.device())?,
            );
        }
        let have: i64 = parts.iter().map(|t| t.size()[0]).sum();
        if have < self.block {
            parts.push(Tensor::f_zeros(
                [self.block - have],
                (kind, self.m.device()),
            )?);
        }
        Ok(Tensor::f_cat(&parts, 0)?)
    }
}

/// Elements `[a, b)` of a flat view of a saved fp32/fp64 tensor, as a new CPU tensor.
fn slice_of(
    view: &safetensors::tensor::TensorView<'_>,
    a: i64,
    b: i64,
    key: &str,
    bad: &dyn Fn(String) -> Error,
) -> Result<Tensor> {
    let (file_kind, width) = match view.dtype() {
        Dtype::F32 => (Kind::Float, 4),
        Dtype::F64 => (Kind::Double, 8),
        other => {
            return Err(bad(format!(
                "{key}: dtype {other}, expected F32 or F64 (optimizer state is fp32)"
            )))
        }
    };
    let numel: i64 = view.shape().iter().map(|&d| d as i64).product();
    if a < 0 || b > numel || a > b {
        return Err(bad(format!(
            "{key}: elements {a}..{b} asked of a tensor of {numel}"
        )));
    }
    let bytes = &view.data()[(a * width) as usize..(b * width) as usize];
    Ok(Tensor::f_from_data_size(bytes, &[b - a], file_kind)?)
}

/// Drops a parameter's `.grad` (undefined, its memory freed), as `p.grad = None` in PyTorch.
pub fn free_grad(p: &Tensor) {
    extern "C" {
        fn rsd_free_grad(t: *mut torch_sys::C_tensor);
    }
    // SAFETY: `p` is a live tensor for the call; the shim only resets its gradient field.
    unsafe { rsd_free_grad(p.as_ptr() as *mut torch_sys::C_tensor) }
}

/// A sharded checkpoint's optimizer files, memory-mapped: any rank's byte ranges of any bucket,
/// for re-sharding on load.
pub struct SavedShards {
    dir: PathBuf,
    layout: ShardLayout,
    /// The ranks' files, rank order.
    files: Vec<(PathBuf, memmap2::Mmap)>,
    /// Parameter name → (bucket, first element in its flat layout, elements).
    index: HashMap<String, (usize, i64, i64)>,
}

impl SavedShards {
    /// Maps the optimizer files of the checkpoint in `dir` whose layout is `layout`.
    pub fn open(dir: &Path, layout: &ShardLayout) -> Result<Self> {
        let mut files = Vec::with_capacity(layout.ranks);
        for r in 0..layout.ranks {
            let path = dir.join(shard_file_name(r, layout.ranks));
            let file = rsd_common::safe_fs::open_regular(&path)?;
            // SAFETY: a checkpoint is read-only once published (written to a temporary
            // directory and renamed into place, never modified in place).
            let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_err(&path))?;
            files.push((path, map));
        }
        let mut index = HashMap::new();
        for (j, b) in layout.buckets.iter().enumerate() {
            let mut offset = 0i64;
            for p in &b.params {
                let numel: i64 = p.shape.iter().product();
                index.insert(p.name.clone(), (j, offset, numel));
                offset += numel;
            }
        }
        Ok(SavedShards {
            dir: dir.to_path_buf(),
            layout: layout.clone(),
            files,
            index,
        })
    }

    fn bad(&self, reason: String) -> Error {
        Error::Checkpoint {
            path: self.dir.clone(),
            reason,
        }
    }

    /// Refuses a checkpoint whose parameters (names and shapes, in order) are not `params`.
    pub fn check_params<'a>(
        &self,
        params: impl Iterator<Item = (&'a str, Vec<i64>)>,
    ) -> Result<()> {
        let mut want: Vec<(String, Vec<i64>)> = params.map(|(n, s)| (n.to_string(), s)).collect();
        want.sort();
        let mut have: Vec<(String, Vec<i64>)> = self
            .layout
            .buckets
            .iter()
            .flat_map(|b| b.params.iter().map(|p| (p.name.clone(), p.shape.clone())))
            .collect();
        have.sort();
        if want == have {
            return Ok(());
        }
        let missing = want.iter().find(|w| !have.contains(w));
        let extra = have.iter().find(|h| !want.contains(h));
        let what = match (missing, extra) {
            (Some((n, s)), _) if self.index.contains_key(n) => format!(
                "parameter {n} has shape {} in the checkpoint, {} in this model",
                shape_str(
                    &have
                        .iter()
                        .find(|h| &h.0 == n)
                        .map_or(vec![], |h| h.1.clone())
                ),
                shape_str(s)
            ),
            (Some((n, _)), _) => format!("this model's parameter {n} is not in the checkpoint"),
            (None, Some((n, _))) => format!("the checkpoint's parameter {n} is not in this model"),
            (None, None) => "the parameter lists differ".into(),
        };
        Err(self.bad(format!(
            "the optimizer state is of another model: {what} (config keys model / init)"
        )))
    }

    /// Elements `[lo, hi)` of bucket `j`'s flat `what` state (`m`, `v`, `master`), gathered from
    /// the ranks' files that hold them, in `kind` on `device`.
    pub fn range(
        &self,
        j: usize,
        what: &str,
        lo: i64,
        hi: i64,
        kind: Kind,
        device: Device,
    ) -> Result<Tensor> {
        let block = self
            .layout
            .buckets
            .get(j)
            .ok_or_else(|| self.bad(format!("no bucket {j} in the layout")))?
            .block;
        if block < 1 {
            return Err(self.bad(format!("bucket {j}: block of {block} elements")));
        }
        let mut parts = Vec::new();
        let key = format!("{what}.{j}");
        let mut at = lo;
        while at < hi {
            let r = (at / block) as usize;
            let (path, map) = self
                .files
                .get(r)
                .ok_or_else(|| self.bad(format!("no rank {r} file for bucket {j}")))?;
            let bad = |reason: String| Error::Checkpoint {
                path: path.clone(),
                reason,
            };
            let st = SafeTensors::deserialize(map).map_err(|e| bad(e.to_string()))?;
            let view = st
                .tensor(&key)
                .map_err(|_| bad(format!("missing optimizer tensor {key}")))?;
            let end = hi.min((r as i64 + 1) * block);
            let base = r as i64 * block;
            parts.push(slice_of(&view, at - base, end - base, &key, &bad)?.f_to_kind(kind)?);
            at = end;
        }
        if parts.is_empty() {
            return Ok(Tensor::f_zeros([0], (kind, device))?);
        }
        Ok(Tensor::f_cat(&parts, 0)?.f_to_device(device)?)
    }

    /// The whole saved `what` state of parameter `name` (shape as saved), for a replicated
    /// optimizer resuming from a sharded checkpoint.
    pub fn param(&self, what: &str, name: &str, kind: Kind) -> Result<Tensor> {
        let &(j, offset, numel) = self
            .index
            .get(name)
            .ok_or_else(|| self.bad(format!("missing optimizer state of {name}")))?;
        let shape = &self.layout.buckets[j]
            .params
            .iter()
            .find(|p| p.name == name)
            .map(|p| p.shape.clone())
            .unwrap_or_default();
        Ok(self
            .range(j, what, offset, offset + numel, kind, Device::Cpu)?
            .f_view(shape.as_slice())?)
    }

    /// Whether the saved state has master weights (bf16/fp16 runs).
    pub fn has_master(&self) -> bool {
        self.layout.master
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A norm (5), a matrix (3×4) and a norm (7): 24 elements; over 5 ranks blocks of 5, the
    /// last padded by one.
    fn run() -> Vec<(String, Tensor)> {
        vec![
            ("a".into(), Tensor::arange(5, (Kind::Float, Device::Cpu))),
            (
                "w".into(),
                Tensor::arange_start(100, 112, (Kind::Float, Device::Cpu)).reshape([3, 4]),
            ),
            (
                "b".into(),
                Tensor::arange_start(200, 207, (Kind::Float, Device::Cpu)),
            ),
        ]
    }

    fn flat_of(run: &[(String, Tensor)]) -> Vec<f32> {
        run.iter()
            .flat_map(|(_, t)| Vec::<f32>::try_from(t.reshape([-1])).unwrap())
            .collect()
    }

    #[test]
    fn the_ranks_blocks_tile_the_bucket_and_decay_only_matrices() {
        let flat = flat_of(&run());
        for ranks in [1, 2, 3, 5] {
            let mut joined = Vec::new();
            let mut decayed = Vec::new();
            for rank in 0..ranks {
                let b = Bucket::new(GradsDone::Top, run(), rank, ranks, Kind::Float).unwrap();
                assert_eq!(b.block * ranks, (24 + ranks - 1) / ranks * ranks);
                joined.extend(Vec::<f32>::try_from(&b.master).unwrap());
                decayed.extend(b.decayed.iter().map(|&(s, n)| (b.start + s, n)));
            }
            // The blocks in rank order are the parameters, then zero padding.
            assert_eq!(&joined[..24], &flat[..], "{ranks} ranks");
            assert!(joined[24..].iter().all(|&x| x == 0.0));
            // The decayed ranges cover exactly the matrix's elements 5..17.
            let covered: Vec<i64> = decayed.iter().flat_map(|&(s, n)| s..s + n).collect();
            assert_eq!(covered, (5..17).collect::<Vec<_>>(), "{ranks} ranks");
        }
    }

    #[test]
    fn each_rank_reads_its_block_of_a_saved_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");
        let named: Vec<(String, Tensor)> = run()
            .into_iter()
            .map(|(n, t)| (format!("m.{n}"), t.f_mul_scalar(2.0).unwrap()))
            .collect();
        Tensor::write_safetensors(&named, &path).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let st = SafeTensors::deserialize(&map).unwrap();
        let bad = |r: String| Error::Input(r);
        let want: Vec<f32> = flat_of(&run()).iter().map(|x| 2.0 * x).collect();
        for ranks in [2, 5] {
            let mut joined = Vec::new();
            for rank in 0..ranks {
                let b = Bucket::new(GradsDone::Top, run(), rank, ranks, Kind::Float).unwrap();
                let block = b.read_block(&st, "m", Kind::Float, &bad).unwrap();
                assert_eq!(block.size(), [b.block]);
                joined.extend(Vec::<f32>::try_from(&block).unwrap());
            }
            assert_eq!(&joined[..24], &want[..]);
            assert!(joined[24..].iter().all(|&x| x == 0.0));
        }
        let b = Bucket::new(GradsDone::Top, run(), 0, 2, Kind::Float).unwrap();
        let e = b.read_block(&st, "v", Kind::Float, &bad).unwrap_err();
        assert!(
            e.to_string().contains("missing optimizer tensor v.a"),
            "{e}"
        );
    }

    fn tiny(layers: usize, tied: bool) -> Model {
        let config = serde_json::json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 32,
            "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": layers,
            "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": tied});
        Model::random(
            rsd_model::ModelConfig::from_hf_json(config).unwrap(),
            rsd_model::ModelOptions::default(),
            0,
        )
        .unwrap()
    }

    #[test]
    fn buckets_follow_the_backward_and_never_span_two_parts() {
        // 12 layers: names sort 0, 1, 10, 11, 2, …; the buckets go top, 11, 10, …, 0, embedding.
        let model = tiny(12, false);
        for bucket_elems in [64usize, 300, 1 << 20] {
            let runs = bucket_runs(model.named_parameters(), bucket_elems);
            let parts: Vec<GradsDone> = runs.iter().map(|(p, _)| *p).collect();
            let mut sorted = parts.clone();
            sorted.sort();
            assert_eq!(parts, sorted, "backward order");
            assert_eq!(parts.first(), Some(&GradsDone::Top));
            assert_eq!(parts.last(), Some(&GradsDone::Embedding));
            let mut names = Vec::new();
            for (part, run) in &runs {
                let elems: usize = run.iter().map(|(_, t)| t.numel()).sum();
                assert!(
                    run.len() == 1 || elems <= bucket_elems,
                    "{elems} > {bucket_elems}"
                );
                for (name, _) in run {
                    assert_eq!(GradsDone::of(name), *part, "{name}");
                    names.push(name.clone());
                }
            }
            names.sort();
            let all: Vec<String> = model
                .named_parameters()
                .into_iter()
                .map(|(n, _)| n)
                .collect();
            assert_eq!(names, all, "every parameter once");
            if bucket_elems == 1 << 20 {
                // Whole parts: top (norm + head), 12 layers, embedding.
                assert_eq!(runs.len(), 14);
                assert!(runs[0].1.iter().any(|(n, _)| n == "lm_head.weight"));
                assert_eq!(runs[1].0, GradsDone::Layer(std::cmp::Reverse(11)));
            } else {
                assert!(runs.len() > 14, "large parts are cut");
            }
        }
        // Tied: the LM head is the embedding, completed last.
        let runs = bucket_runs(tiny(2, true).named_parameters(), 1 << 20);
        assert_eq!(runs[0].1.len(), 1, "only the final norm on top");
    }

    #[test]
    fn free_grad_leaves_the_gradient_undefined() {
        let p = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        (&p * 2.0).sum(Kind::Float).backward();
        assert!(p.grad().defined());
        free_grad(&p);
        assert!(!p.grad().defined());
        // The next backward allocates it afresh (not added to a stale one).
        (&p * 3.0).sum(Kind::Float).backward();
        assert_eq!(Vec::<f32>::try_from(p.grad()).unwrap(), vec![3.0; 3]);
    }

    /// Writes the blocks `ranks` ranks hold of `model`'s buckets as they would be saved, with `m`
    /// = the parameters and `v` = 2 · the parameters, and the manifest's layout.
    fn save_as(model: &Model, dir: &Path, ranks: i64, bucket_elems: usize) -> ShardLayout {
        let cfg = AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut layout = None;
        for rank in 0..ranks {
            let o = ShardedAdamW::with_ranks(model, cfg, rank, ranks, bucket_elems).unwrap();
            for b in &o.buckets {
                b.m.shallow_clone().copy_(&b.master);
                b.v.shallow_clone().copy_(&(&b.master * 2.0));
            }
            o.save_shard(&dir.join(shard_file_name(rank as usize, ranks as usize)))
                .unwrap();
            layout = Some(o.layout());
        }
        layout.unwrap()
    }

    #[test]
    fn a_sharded_state_reshards_to_any_number_of_ranks_and_to_whole_tensors() {
        let model = tiny(2, false);
        let dir = tempfile::tempdir().unwrap();
        let layout = save_as(&model, dir.path(), 3, 100);
        let saved = SavedShards::open(dir.path(), &layout).unwrap();
        for ranks in [1i64, 2, 4] {
            for rank in 0..ranks {
                let mut o = ShardedAdamW::with_ranks(&model, cfg0(), rank, ranks, 100).unwrap();
                o.load_shards(&saved, 7).unwrap();
                assert_eq!(o.steps, 7);
                for b in &o.buckets {
                    // m is the master weights (this block of the parameters), v twice that; the
                    // padding zero.
                    let diff = (&b.m - &b.master).abs().max().double_value(&[]);
                    assert_eq!(diff, 0.0, "{ranks} ranks");
                    let diff = (&b.v - &b.master * 2.0).abs().max().double_value(&[]);
                    assert_eq!(diff, 0.0, "{ranks} ranks");
                }
            }
        }
        for (name, p) in model.named_parameters() {
            let v = saved.param("v", &name, Kind::Float).unwrap();
            assert_eq!((&v - &p * 2.0).abs().max().double_value(&[]), 0.0, "{name}");
        }
        // Another bucket size: refused, naming the key.
        let mut o = ShardedAdamW::with_ranks(&model, cfg0(), 0, 2, 1 << 18).unwrap();
        let e = o.load_shards(&saved, 1).unwrap_err().to_string();
        assert!(e.contains("grad_bucket_mb"), "{e}");
        // Another model: refused, naming the parameter.
        let other = tiny(3, false);
        let mut o = ShardedAdamW::with_ranks(&other, cfg0(), 0, 2, 100).unwrap();
        let e = o.load_shards(&saved, 1).unwrap_err().to_string();
        assert!(
            e.contains("model.layers.2.") && e.contains("not in the checkpoint"),
            "{e}"
        );
    }

    fn cfg0() -> AdamWConfig {
        AdamWConfig {
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}
