//! The optimizer update across data-parallel ranks: the gradient sum over ranks, its global norm,
//! clipping and AdamW, with the optimizer state either replicated on every rank ([`AdamW`]) or
//! sharded over them ([`ShardedAdamW`], config key `shard_optimizer`), and how each is
//! checkpointed. The training loop calls the same methods either way.
use std::path::Path;

use tch::{Kind, Tensor};

use rsd_dist::ReduceOp;
use rsd_model::Model;

use crate::checkpoint::{self, shard_file_name, FileEntry, Manifest, OptimizerLayout};
use crate::config::TrainConfig;
use crate::optim::{clip_coef, clip_grads, AdamW, AdamWConfig};
use crate::parallel::DataParallel;
use crate::sharded::{SavedShards, ShardedAdamW};
use crate::step::{grad_norm, zero_grads, GradsDone};
use crate::{Error, Result};

/// AdamW, replicated or sharded.
pub enum Optimizer {
    /// Every rank holds the whole state and the whole summed gradient.
    Replicated(AdamW),
    /// Each rank holds its block of the state and of the summed gradient.
    Sharded(ShardedAdamW),
}

impl Optimizer {
    /// Fresh state for `model`: sharded over `dp`'s ranks when the config asks for it and there is
    /// more than one rank.
    pub fn new(model: &Model, cfg: &TrainConfig, dp: &DataParallel) -> Result<Self> {
        let adamw = AdamWConfig {
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        };
        Ok(match dp.group() {
            Some(g) if cfg.shard_optimizer => Optimizer::Sharded(
                ShardedAdamW::new(model, adamw, g, dp.bucket_elems())?
                    .overlapped(cfg.overlap_grad_reduce)
                    .reducing(cfg.grad_reduce)?,
            ),
            _ => Optimizer::Replicated(AdamW::new(model, adamw)?),
        })
    }

    /// The micro-batches every rank runs this step when this one has `local`: sharded, the most
    /// any rank has (each micro-batch is a round of reduce-scatters every rank takes part in; a
    /// rank with fewer reduces zeros for the rest, [`Optimizer::micro_batch_done`]).
    pub fn rounds(&self, dp: &DataParallel, local: usize) -> Result<usize> {
        match (self, dp.group()) {
            (Optimizer::Sharded(_), Some(g)) => {
                let mut t = Tensor::from_slice(&[local as i64]);
                g.all_reduce(&mut t, ReduceOp::Max)?;
                Ok(t.f_int64_value(&[0])? as usize)
            }
            _ => Ok(local),
        }
    }

    /// A part of the model has its micro-batch gradients complete (per-layer checkpointing):
    /// sharded, they are reduce-scattered and freed now.
    pub fn grads_done(&self, dp: &DataParallel, part: GradsDone) -> Result<()> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.grads_done(g, part),
            _ => Ok(()),
        }
    }

    /// A micro-batch's backward is over (or, on a rank with fewer micro-batches, would be):
    /// sharded, every gradient not reduced yet is reduce-scattered and freed.
    pub fn micro_batch_done(&self, dp: &DataParallel) -> Result<()> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.micro_batch_done(g),
            _ => Ok(()),
        }
    }

    /// After the step's last micro-batch: sums the model's gradients over the ranks (replicated;
    /// sharded, micro-batch by micro-batch already, or now from each rank's local sum with
    /// `grad_reduce = "step"`).
    pub fn reduce_gradients(&mut self, dp: &DataParallel, model: &Model) -> Result<()> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.step_done(g),
            (Optimizer::Sharded(_), None) => Ok(()),
            (Optimizer::Replicated(_), _) => dp.reduce_gradients(model),
        }
    }

    /// The global norm of the summed gradient (the same on every rank).
    pub fn grad_norm(&self, dp: &DataParallel, model: &Model) -> Result<f64> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.grad_norm(g),
            _ => grad_norm(model),
        }
    }

    /// Clips the summed gradient of norm `norm` to `max_norm` and applies AdamW at rate `lr`.
    pub fn step(
        &mut self,
        dp: &DataParallel,
        model: &Model,
        lr: f64,
        norm: f64,
        max_norm: f64,
    ) -> Result<()> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.step(g, lr, clip_coef(norm, max_norm)),
            (Optimizer::Replicated(o), _) => {
                clip_grads(model, norm, max_norm)?;
                o.step(lr)
            }
            (Optimizer::Sharded(_), None) => Err(unreachable_single()),
        }
    }

    /// Starts the next step's sum from zero (after an update or a skipped one).
    pub fn zero_grad(&self, model: &Model) -> Result<()> {
        if let Optimizer::Sharded(o) = self {
            o.zero_grad()?;
        }
        zero_grads(model);
        Ok(())
    }

    /// The whole state as named tensors, what a replicated run's `optimizer.safetensors` holds;
    /// `None` for a sharded optimizer (its ranks write their own files:
    /// [`Optimizer::save_shards`]).
    pub fn replicated_state(&self) -> Option<Vec<(String, Tensor)>> {
        match self {
            Optimizer::Replicated(o) => Some(o.state_tensors()),
            Optimizer::Sharded(_) => None,
        }
    }

    /// How a checkpoint of this optimizer stores it.
    pub fn layout(&self) -> OptimizerLayout {
        match self {
            Optimizer::Replicated(_) => OptimizerLayout::Replicated,
            Optimizer::Sharded(o) => OptimizerLayout::Sharded(o.layout()),
        }
    }

    /// Sharded: every rank writes its blocks into the checkpoint's temporary directory `tmp`
    /// and fsyncs them; rank 0 gets every rank's file with its size and sha256 (one all-gather
    /// of 40 bytes a rank), the others an empty list. Replicated: nothing to do (rank 0 writes
    /// `optimizer.safetensors`). A collective when sharded.
    pub fn save_shards(&self, dp: &DataParallel, tmp: &Path, step: u64) -> Result<Vec<FileEntry>> {
        let (Optimizer::Sharded(o), Some(g)) = (self, dp.group()) else {
            return Ok(Vec::new());
        };
        let (rank, ranks) = (g.rank(), g.size());
        let path = tmp.join(shard_file_name(rank, ranks));
        let written = o.save_shard(&path).and_then(|()| {
            checkpoint::die_at("shard", step, rank);
            checkpoint::file_digest(&path)
        });
        // A rank that fails to write its shard stops every rank here, before the all-gather.
        let (bytes, digest) = dp.all_ok("writing the optimizer shards", written)?;
        let mut words = vec![bytes as i64];
        words.extend(
            digest
                .chunks(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default())),
        );
        let all = Vec::<i64>::try_from(&g.all_gather(&Tensor::from_slice(&words))?)?;
        if rank != 0 {
            return Ok(Vec::new());
        }
        Ok(all
            .chunks(5)
            .enumerate()
            .map(|(r, w)| {
                let digest: Vec<u8> = w[1..].iter().flat_map(|x| x.to_le_bytes()).collect();
                FileEntry {
                    path: shard_file_name(r, ranks),
                    bytes: w[0] as u64,
                    sha256: rsd_common::hex(&digest),
                }
            })
            .collect())
    }

    /// Restores the state of the checkpoint in `dir` (written by any run: any number of ranks,
    /// sharded or not; a sharded one is re-sharded on load) after `steps` updates.
    pub fn load(&mut self, dir: &Path, manifest: &Manifest, steps: u64) -> Result<()> {
        match (self, &manifest.optimizer) {
            (Optimizer::Replicated(o), OptimizerLayout::Replicated) => {
                o.load(&dir.join("optimizer.safetensors"), steps)
            }
            (Optimizer::Sharded(o), OptimizerLayout::Replicated) => {
                o.load(&dir.join("optimizer.safetensors"), steps)
            }
            (Optimizer::Sharded(o), OptimizerLayout::Sharded(layout)) => {
                o.load_shards(&SavedShards::open(dir, layout)?, steps)
            }
            (Optimizer::Replicated(o), OptimizerLayout::Sharded(layout)) => {
                let saved = SavedShards::open(dir, layout)?;
                saved.check_params(o.params())?;
                let kind = if layout.state_dtype == "F64" {
                    Kind::Double
                } else {
                    Kind::Float
                };
                o.load_from(dir, steps, |key| {
                    let (what, name) = key.split_once('.').unwrap_or((key, ""));
                    if what == "master" && !saved.has_master() {
                        return Ok(None);
                    }
                    saved.param(what, name, kind).map(Some)
                })
            }
        }
    }
}

/// A sharded optimizer is only built with a process group ([`Optimizer::new`]).
fn unreachable_single() -> Error {
    Error::Input("internal: a sharded optimizer without a process group".into())
}
