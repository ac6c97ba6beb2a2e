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
//! * decisions (interrupt, non-finite values) are taken together: any rank's "yes" is everyone's.
//!
//! Without `WORLD_SIZE` in the environment there is one rank and every call is free.
use std::time::Duration;

use tch::{Device, Kind, Tensor};

use rsd_dist::{Backend, ProcessGroup, ReduceOp};
use rsd_model::Model;

use crate::config::TrainConfig;
use crate::context::ContextParallel;
use crate::step::{LossNormalizers, Sums};
use crate::{Error, Result};

/// This process's place among the data-parallel ranks, and the collectives the loop needs.
pub struct DataParallel {
    /// The world group; `None` for a single process.
    group: Option<ProcessGroup>,
    /// The ranks sharing this rank's sequences (context parallelism); `None` without.
    context: Option<ContextParallel>,
    /// Largest gradient bucket, in fp32 elements.
    bucket_elems: usize,
}

impl DataParallel {
    /// One process: no group, every collective a no-op.
    pub fn single() -> Self {
        DataParallel {
            group: None,
            context: None,
            bucket_elems: usize::MAX,
        }
    }

    /// Joins the world when the environment describes one (`WORLD_SIZE` set: `rsd-train --nproc`,
    /// torchrun, SLURM scripts), otherwise one process.
    pub fn from_env(cfg: &TrainConfig, device: Device) -> Result<Self> {
        if std::env::var_os("WORLD_SIZE").is_none() {
            if cfg.dp > 1 || cfg.cp > 1 {
                let n = cfg.dp.max(1) * cfg.cp;
                return Err(Error::Input(format!(
                    "config keys dp/cp: {} data-parallel × {} context-parallel ranks need {n} \
                     processes; run with `--nproc {n}` or under torchrun",
                    cfg.dp.max(1),
                    cfg.cp
                )));
            }
            return Ok(Self::single());
        }
        let backend = if cfg!(feature = "nccl") && device.is_cuda() {
            Backend::Nccl
        } else {
            Backend::Gloo
        };
        let group = ProcessGroup::from_env(backend, Duration::from_secs(cfg.dist_timeout))?;
        let (world, cp) = (group.size(), cfg.cp.max(1));
        if !world.is_multiple_of(cp) {
            return Err(Error::Input(format!(
                "config key cp: {world} processes (WORLD_SIZE) cannot be split into \
                 context-parallel groups of {cp}"
            )));
        }
        if cfg.dp != 0 && cfg.dp * cp != world {
            return Err(Error::Input(format!(
                "config key dp: {} data-parallel × {cp} context-parallel ranks asked for, but the \
                 run has {world} processes (WORLD_SIZE); leave dp unset (0) to use them all, or \
                 launch {} processes",
                cfg.dp,
                cfg.dp * cp
            )));
        }
        // Consecutive ranks share sequences (on one node, where context parallelism's per-layer
        // gathers want the fastest links).
        let context = if cp > 1 {
            let groups: Vec<Vec<usize>> = (0..world / cp)
                .map(|d| (d * cp..(d + 1) * cp).collect())
                .collect();
            Some(ContextParallel::new(group.split(&groups)?))
        } else {
            None
        };
        let bucket_elems = (cfg.grad_bucket_mb.max(1) << 20) / std::mem::size_of::<f32>();
        Ok(DataParallel {
            group: Some(group),
            context,
            bucket_elems,
        })
    }

    /// The group of the data-parallel ranks; `None` for a single process.
    pub fn group(&self) -> Option<&ProcessGroup> {
        self.group.as_ref()
    }

    /// Largest gradient bucket, in elements (`grad_bucket_mb` of fp32).
    pub fn bucket_elems(&self) -> usize {
        self.bucket_elems
    }

    /// The collectives' traffic on this rank so far (zero for one process).
    pub fn comm_stats(&self) -> rsd_dist::CommStats {
        self.group
            .as_ref()
            .map_or_else(rsd_dist::CommStats::default, ProcessGroup::stats)
    }

    /// This process among all of the run's, `0..world()`.
    pub fn rank(&self) -> usize {
        self.group.as_ref().map_or(0, ProcessGroup::rank)
    }

    /// The run's processes: data-parallel × context-parallel ranks.
    pub fn world(&self) -> usize {
        self.group.as_ref().map_or(1, ProcessGroup::size)
    }

    /// Context-parallel ranks sharing each sequence (1 without context parallelism).
    pub fn cp_size(&self) -> usize {
        self.context.as_ref().map_or(1, ContextParallel::size)
    }

    /// Data-parallel ranks (each a group of `cp_size()` processes).
    pub fn size(&self) -> usize {
        self.world() / self.cp_size()
    }

    /// The context-parallel group this rank belongs to, if any.
    pub fn context(&self) -> Option<&ContextParallel> {
        self.context.as_ref()
    }

    /// Rank 0: the one that logs, prints and writes checkpoints.
    pub fn is_main(&self) -> bool {
        self.rank() == 0
    }

    /// This rank as the loader's DP coordinate.
    pub fn loader_rank(&self) -> rsd_loader::Rank {
        rsd_loader::Rank::new(self.rank() / self.cp_size(), self.size())
    }

    /// This rank's coordinates for the loader: its data-parallel rank and its place in its
    /// context-parallel group (which zigzag chunks of each row it gets).
    pub fn loader_parallel(&self) -> rsd_loader::Parallel {
        rsd_loader::Parallel {
            dp: self.loader_rank(),
            cp: self.context.as_ref().map_or(rsd_loader::Rank::SINGLE, |c| {
                rsd_loader::Rank::new(c.rank(), c.size())
            }),
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
        let Some(g) = &self.group else { return Ok(()) };
        tch::no_grad(|| -> Result<()> {
            for (_, p) in model.named_parameters() {
                let mut t = on_backend(g, &p)?;
                g.broadcast(&mut t, 0)?;
                if t.device() != p.device() {
                    p.shallow_clone().f_copy_(&t)?;
                }
            }
            Ok(())
        })
    }

    /// Sums the step's normalisers and its token count over ranks.
    pub fn global_normalizers(
        &self,
        norm: LossNormalizers,
        tokens: u64,
    ) -> Result<(LossNormalizers, u64)> {
        let Some(g) = &self.group else {
            return Ok((norm, tokens));
        };
        let mut t = Tensor::from_slice(&[norm.label_tokens, norm.samples, tokens as f64]);
        g.all_reduce(&mut t, ReduceOp::Sum)?;
        let v = Vec::<f64>::try_from(&t)?;
        Ok((
            LossNormalizers {
                label_tokens: v[0],
                samples: v[1],
            },
            v[2] as u64,
        ))
    }

    /// Sums the loss terms over ranks.
    pub fn reduce_sums(&self, sums: &mut Sums) -> Result<()> {
        let Some(g) = &self.group else { return Ok(()) };
        let device = sums.clm.device();
        let mut t = Tensor::f_stack(&[&sums.clm, &sums.kl, &sums.clm_pert], 0)?
            .f_to_device(backend_device(g, device))?;
        g.all_reduce(&mut t, ReduceOp::Sum)?;
        let t = t.f_to_device(device)?;
        sums.clm = t.f_get(0)?;
        sums.kl = t.f_get(1)?;
        sums.clm_pert = t.f_get(2)?;
        Ok(())
    }

    /// Sums the parameters' gradients over ranks: flattened into fp32 buckets of at most
    /// `grad_bucket_mb`, one all-reduce each, copied back.
    pub fn reduce_gradients(&self, model: &Model) -> Result<()> {
        let Some(g) = &self.group else { return Ok(()) };
        let grads: Vec<Tensor> = model
            .named_parameters()
            .into_iter()
            .map(|(_, p)| p.grad())
            .filter(Tensor::defined)
            .collect();
        let mut bucket: Vec<&Tensor> = Vec::new();
        let mut elems = 0usize;
        for grad in &grads {
            let n = grad.numel();
            if !bucket.is_empty() && elems + n > self.bucket_elems {
                reduce_bucket(g, &bucket)?;
                bucket.clear();
                elems = 0;
            }
            bucket.push(grad);
            elems += n;
        }
        if !bucket.is_empty() {
            reduce_bucket(g, &bucket)?;
        }
        Ok(())
    }

    /// Whether `flag` holds on any rank (one decision for all).
    pub fn any(&self, flag: bool) -> Result<bool> {
        let Some(g) = &self.group else {
            return Ok(flag);
        };
        let mut t = Tensor::from_slice(&[i32::from(flag)]);
        g.all_reduce(&mut t, ReduceOp::Max)?;
        Ok(t.int64_value(&[0]) != 0)
    }

    /// Waits until every rank gets here.
    pub fn barrier(&self) -> Result<()> {
        match &self.group {
            Some(g) => Ok(g.barrier()?),
            None => Ok(()),
        }
    }
}

/// [`DataParallel::global_row`] for data-parallel rank `dp`.
fn global_row(dp: rsd_loader::Rank, local_step: usize, row: usize, rows_per_rank: usize) -> usize {
    local_step * rows_per_rank * dp.size + row * dp.size + dp.rank
}

/// Where a collective of `g` wants its tensors: CUDA for NCCL, the CPU for Gloo.
pub(crate) fn backend_device(g: &ProcessGroup, device: Device) -> Device {
    match g.backend() {
        Backend::Gloo => Device::Cpu,
        _ => device,
    }
}

/// `t` itself when it already lives where `g`'s collectives want it, else a copy there.
fn on_backend(g: &ProcessGroup, t: &Tensor) -> Result<Tensor> {
    let device = backend_device(g, t.device());
    Ok(if t.device() == device {
        t.shallow_clone()
    } else {
        t.f_to_device(device)?
    })
}

/// One all-reduce (sum) of these gradients, flattened into a single fp32 buffer.
fn reduce_bucket(g: &ProcessGroup, grads: &[&Tensor]) -> Result<()> {
    let flat = grads
        .iter()
        .map(|t| t.f_reshape([-1])?.f_to_kind(Kind::Float))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let device = backend_device(g, grads[0].device());
    let mut buf = Tensor::f_cat(&flat, 0)?.f_to_device(device)?;
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
