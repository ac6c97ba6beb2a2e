//! The optimizer update across data-parallel ranks: the gradient sum over ranks, its global norm,
//! clipping and AdamW, with the optimizer state either replicated on every rank ([`AdamW`]) or
//! sharded over them ([`ShardedAdamW`], config key `shard_optimizer`). The training loop calls
//! the same four methods either way.
use std::path::Path;

use tch::Tensor;

use rsd_model::Model;

use crate::config::TrainConfig;
use crate::optim::{clip_coef, clip_grads, AdamW, AdamWConfig};
use crate::parallel::DataParallel;
use crate::sharded::ShardedAdamW;
use crate::step::grad_norm;
use crate::Result;

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
            Some(g) if cfg.shard_optimizer => {
                Optimizer::Sharded(ShardedAdamW::new(model, adamw, g, dp.bucket_elems())?)
            }
            _ => Optimizer::Replicated(AdamW::new(model, adamw)?),
        })
    }

    /// Sums the model's gradients over the ranks (all of it, or each rank's block).
    pub fn reduce_gradients(&mut self, dp: &DataParallel, model: &Model) -> Result<()> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.reduce_gradients(g),
            _ => dp.reduce_gradients(model),
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
            (Optimizer::Sharded(_), None) => unreachable_single(),
        }
    }

    /// The whole state as named tensors (what `optimizer.safetensors` holds) on rank 0; the
    /// other ranks get an empty list. Sharded, a collective: every rank must call it.
    pub fn state_tensors(&self, dp: &DataParallel) -> Result<Vec<(String, Tensor)>> {
        match (self, dp.group()) {
            (Optimizer::Sharded(o), Some(g)) => o.state_tensors(g),
            (Optimizer::Replicated(o), _) if dp.is_main() => Ok(o.state_tensors()),
            _ => Ok(Vec::new()),
        }
    }

    /// Restores the state from an `optimizer.safetensors` written by any run (any rank count,
    /// sharded or not) after `steps` updates.
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<()> {
        match self {
            Optimizer::Replicated(o) => o.load(path, steps),
            Optimizer::Sharded(o) => o.load(path, steps),
        }
    }
}

/// A sharded optimizer is only built with a process group ([`Optimizer::new`]).
fn unreachable_single() -> Result<()> {
    Err(crate::Error::Input(
        "internal: a sharded optimizer without a process group".into(),
    ))
}
