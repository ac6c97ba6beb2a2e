//! AdamW, the learning-rate schedule and gradient clipping, with savable state.
//!
//! Written by hand rather than with tch's `nn::AdamW` because that optimizer's moments live inside
//! libtorch and cannot be saved or restored from Rust, and an exact `--resume` needs them. The update
//! is PyTorch's `torch.optim.AdamW` (decoupled decay, bias corrections, `eps` added after the
//! square root), so a step matches the PyTorch eager baseline.
//!
//! For bf16/fp16 models the optimizer keeps fp32 master weights and fp32 moments; gradients are
//! upcast, the master updated, and the model parameter overwritten with the rounded master.
//! Weight decay applies to matrices (embeddings, projections, LM head), not to norms and biases,
//! as in HF Trainer and ProLong.
use std::path::Path;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use rsd_model::Model;

use crate::{Error, Result};

/// AdamW hyperparameters (ProLong: β 0.9/0.95, weight decay 0.1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// β1.
    pub beta1: f64,
    /// β2.
    pub beta2: f64,
    /// ε.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
}

/// The arithmetic of one AdamW update at a given rate and step, shared by the replicated
/// optimizer ([`AdamW`]) and the sharded one (`crate::sharded`), so both compute the same bits
/// from the same gradient.
pub(crate) struct Update {
    lr: f64,
    beta1: f64,
    beta2: f64,
    /// The update's number t (1-based): the bias corrections are 1 − β1ᵗ and √(1 − β2ᵗ).
    step: u64,
    eps: f64,
    weight_decay: f64,
}

impl Update {
    /// The update number `step` (1-based) at rate `lr`.
    pub(crate) fn new(cfg: &AdamWConfig, lr: f64, step: u64) -> Self {
        Update {
            lr,
            beta1: cfg.beta1,
            beta2: cfg.beta2,
            step,
            eps: cfg.eps,
            weight_decay: cfg.weight_decay,
        }
    }

    /// Decoupled weight decay of `p`, in place (before [`Update::apply`]).
    pub(crate) fn decay(&self, p: &mut Tensor) -> Result<()> {
        if self.weight_decay != 0.0 {
            let _ = p.f_mul_scalar_(1.0 - self.lr * self.weight_decay)?;
        }
        Ok(())
    }

    /// Moments and parameter step of `p` from its gradient `g`, in place (PyTorch's
    /// `torch.optim.AdamW` after [`Update::decay`]), in libtorch's fused AdamW kernel: one pass
    /// over each tensor instead of ~15 elementwise ones. All four of one shape, dtype and device.
    pub(crate) fn apply(&self, p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> Result<()> {
        // The kernel reads the update's number from a device tensor; a fill needs no copy from
        // the host (and so no synchronisation).
        let step = Tensor::f_full([], self.step as f64, (Kind::Float, p.device()))?;
        let ptr = |t: &Tensor| [t.as_ptr() as *mut torch_sys::C_tensor];
        let (p, g, m, v) = (ptr(p), ptr(g), ptr(m), ptr(v));
        let mut err = vec![0u8; 1024];
        // SAFETY: four arrays of one live tensor each and a live step tensor for the duration of
        // the call; the kernel updates p, m and v in place and keeps no reference.
        let rc = unsafe {
            shim::rsd_fused_adamw(
                p.as_ptr(),
                g.as_ptr(),
                m.as_ptr(),
                v.as_ptr(),
                1,
                step.as_ptr(),
                self.lr,
                self.beta1,
                self.beta2,
                0.0,
                self.eps,
                err.as_mut_ptr().cast(),
                err.len(),
            )
        };
        if rc != 0 {
            let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
            return Err(Error::Input(format!(
                "AdamW: the fused kernel failed: {}",
                String::from_utf8_lossy(&err[..end])
            )));
        }
        Ok(())
    }
}

/// `csrc/fused_adamw.cpp`.
mod shim {
    use std::ffi::{c_char, c_int};
    use torch_sys::C_tensor;

    extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn rsd_fused_adamw(
            params: *const *mut C_tensor,
            grads: *const *mut C_tensor,
            exp_avgs: *const *mut C_tensor,
            exp_avg_sqs: *const *mut C_tensor,
            n: usize,
            step: *const C_tensor,
            lr: f64,
            beta1: f64,
            beta2: f64,
            weight_decay: f64,
            eps: f64,
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
}

/// One parameter's optimizer state.
#[derive(Debug)]
struct Slot {
    name: String,
    param: Tensor,
    m: Tensor,
    v: Tensor,
    master: Option<Tensor>,
    decay: bool,
}

/// AdamW over all model parameters.
#[derive(Debug)]
pub struct AdamW {
    cfg: AdamWConfig,
    slots: Vec<Slot>,
    /// Updates applied so far (for the bias corrections).
    pub steps: u64,
}

impl AdamW {
    /// Zero moments for every parameter of `model` (fp32 master copies when the model is not fp32/fp64).
    pub fn new(model: &Model, cfg: AdamWConfig) -> Result<Self> {
        let mut slots = Vec::new();
        for (name, param) in model.named_parameters() {
            let low = !matches!(param.kind(), Kind::Float | Kind::Double);
            let sk = if low { Kind::Float } else { param.kind() };
            let master = if low {
                Some(param.detach().f_to_kind(Kind::Float)?)
            } else {
                None
            };
            slots.push(Slot {
                m: Tensor::f_zeros_like(&param)?.f_to_kind(sk)?,
                v: Tensor::f_zeros_like(&param)?.f_to_kind(sk)?,
                decay: param.dim() >= 2,
                name,
                param,
                master,
            });
        }
        Ok(AdamW {
            cfg,
            slots,
            steps: 0,
        })
    }

    /// One update at learning rate `lr` from the parameters' current gradients. One fused call
    /// per parameter, so that one parameter's gradient exists in fp32 at a time (as the memory
    /// plan counts), not every parameter's at once.
    pub fn step(&mut self, lr: f64) -> Result<()> {
        self.steps += 1;
        let update = Update::new(&self.cfg, lr, self.steps);
        tch::no_grad(|| -> Result<()> {
            for s in &mut self.slots {
                let g = s.param.grad();
                if !g.defined() {
                    continue;
                }
                let mut p = match &s.master {
                    Some(m) => m.shallow_clone(),
                    None => s.param.shallow_clone(),
                };
                if s.decay {
                    update.decay(&mut p)?;
                }
                update.apply(&p, &g.f_to_kind(s.m.kind())?, &s.m, &s.v)?;
                if s.master.is_some() {
                    s.param.f_copy_(&p)?;
                }
            }
            Ok(())
        })
    }

    /// The state as named tensors, the way [`AdamW::save`] writes them.
    pub fn state_tensors(&self) -> Vec<(String, Tensor)> {
        let mut named: Vec<(String, Tensor)> = Vec::new();
        for s in &self.slots {
            named.push((format!("m.{}", s.name), s.m.shallow_clone()));
            named.push((format!("v.{}", s.name), s.v.shallow_clone()));
            if let Some(m) = &s.master {
                named.push((format!("master.{}", s.name), m.shallow_clone()));
            }
        }
        named
    }

    /// Writes moments and master weights as safetensors (`m.<name>`, `v.<name>`, `master.<name>`).
    pub fn save(&self, path: &Path) -> Result<()> {
        rsd_common::safe_fs::write_atomic_by_path(path, |tmp| {
            Ok::<_, Error>(Tensor::write_safetensors(&self.state_tensors(), tmp)?)
        })
    }

    /// Restores what [`AdamW::save`] wrote; every tensor must be there with the right shape.
    pub fn load(&mut self, path: &Path, steps: u64) -> Result<()> {
        let mut map: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(path)?.into_iter().collect();
        self.load_from(path, steps, |key| Ok(map.remove(key)))
    }

    /// Restores the state from `read(key)` (`m.<name>`, `v.<name>`, `master.<name>`; `None`:
    /// not in the checkpoint at `path`, an error naming it); every tensor must have the right
    /// shape.
    pub fn load_from(
        &mut self,
        path: &Path,
        steps: u64,
        mut read: impl FnMut(&str) -> Result<Option<Tensor>>,
    ) -> Result<()> {
        let bad = |reason: String| Error::Checkpoint {
            path: path.to_path_buf(),
            reason,
        };
        tch::no_grad(|| -> Result<()> {
            for s in &mut self.slots {
                let mut targets = vec![("m", &mut s.m), ("v", &mut s.v)];
                if let Some(m) = s.master.as_mut() {
                    targets.push(("master", m));
                }
                for (what, t) in targets {
                    let key = format!("{what}.{}", s.name);
                    let src = read(&key)?
                        .ok_or_else(|| bad(format!("missing optimizer tensor {key}")))?;
                    if src.size() != t.size() {
                        return Err(bad(format!(
                            "{key}: shape {}, expected {}",
                            shape(&src.size()),
                            shape(&t.size())
                        )));
                    }
                    t.f_copy_(&src)?;
                }
            }
            Ok(())
        })?;
        self.steps = steps;
        Ok(())
    }

    /// The parameters' names and shapes, in order.
    pub fn params(&self) -> impl Iterator<Item = (&str, Vec<i64>)> {
        self.slots.iter().map(|s| (s.name.as_str(), s.param.size()))
    }
}

/// A tensor shape as `[2, 3]`, for messages.
pub(crate) fn shape(dims: &[i64]) -> String {
    let dims: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// Linear warmup to `lr`, then cosine decay to `min_ratio · lr` at `total` steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Total steps.
    pub total: u64,
    /// Final learning rate as a fraction of the peak (ProLong: 0.1).
    pub min_ratio: f64,
}

impl Schedule {
    /// Learning rate of the update with 0-based index `step`.
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.lr * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let progress = ((step - self.warmup) as f64 / span).min(1.0);
        let min = self.lr * self.min_ratio;
        min + (self.lr - min) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// The factor PyTorch's `clip_grad_norm_` scales gradients of global norm `norm` by so it is at
/// most `max_norm` (`max_norm / (norm + 1e-6)`), or `None` when no scaling applies (clipping off,
/// or the factor would be ≥ 1).
pub fn clip_coef(norm: f64, max_norm: f64) -> Option<f64> {
    if max_norm <= 0.0 {
        return None;
    }
    let coef = max_norm / (norm + 1e-6);
    (coef < 1.0).then_some(coef)
}

/// Scales the model's gradients so their global norm is at most `max_norm` ([`clip_coef`]). The
/// norm is computed by the caller (it is also the metric).
pub fn clip_grads(model: &Model, norm: f64, max_norm: f64) -> Result<()> {
    let Some(coef) = clip_coef(norm, max_norm) else {
        return Ok(());
    };
    tch::no_grad(|| -> Result<()> {
        for (_, p) in model.named_parameters() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.f_mul_scalar_(coef)?;
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_and_decays_to_the_floor() {
        let s = Schedule {
            lr: 1.0,
            warmup: 10,
            total: 110,
            min_ratio: 0.1,
        };
        assert!((s.lr(0) - 0.1).abs() < 1e-12);
        assert!((s.lr(9) - 1.0).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-12);
        assert!((s.lr(60) - 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 0.1).abs() < 1e-12);
        assert!((s.lr(500) - 0.1).abs() < 1e-12);
    }
}
