//! The training config: one flat TOML table, every key also a command-line flag.
//!
//! The key list is written once (the `config!` macro below) and generates the resolved
//! [`TrainConfig`] (all keys, with defaults) and [`ConfigOverrides`] (all keys optional), which is
//! both what a TOML file deserializes into and a `clap::Args` block (`loss_chunk` ↔
//! `--loss-chunk`). Resolution: defaults ← `--config FILE` ← command-line flags. Unknown keys in a
//! file are refused (a typo must not silently train something else). The resolved config is
//! written into every checkpoint (`config.toml`).
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::perturb::{PerturbKind, Scope};
use crate::step::{KlDirection, Objective};
use crate::{io_err, Error, Result};

macro_rules! config {
    ($( $(#[$meta:meta])* $name:ident : $ty:ty = $default:expr; )*) => {
        /// The resolved training config (see the module docs; `docs/TRAIN.md` lists every key).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct TrainConfig {
            $( $(#[$meta])* pub $name: $ty, )*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                TrainConfig { $( $name: $default, )* }
            }
        }

        /// Every key optional: a TOML file, or the command line.
        #[derive(Debug, Clone, Default, Deserialize, clap::Args)]
        #[serde(deny_unknown_fields)]
        pub struct ConfigOverrides {
            $( $(#[$meta])* #[arg(long)] pub $name: Option<$ty>, )*
        }

        impl ConfigOverrides {
            /// Sets the keys present here.
            pub fn apply(self, c: &mut TrainConfig) {
                $( if let Some(v) = self.$name { c.$name = v; } )*
            }
        }
    };
}

config! {
    // --- data and model
    /// Shard directories, comma-separated (rsd-data pack output).
    shards: String = String::new();
    /// Mixture weights for the shard directories, comma-separated (empty = equal).
    weights: String = String::new();
    /// Hugging Face model directory to start from.
    model: String = String::new();
    /// Or: a model config.json to initialise randomly (tiny models, tests).
    init: String = String::new();
    /// Seed of the random init.
    init_seed: i64 = 0;
    /// Run directory (checkpoints, metrics.jsonl, final model).
    out: String = String::new();
    /// cpu, cuda, cuda:N.
    device: String = "cpu".into();
    /// Parameter dtype: fp32 or bf16 (bf16 keeps fp32 master weights and optimizer state).
    dtype: String = "fp32".into();
    /// New RoPE base (ABF) applied before training, 0 = keep the model's.
    rope_theta: f64 = 0.0;
    /// max_position_embeddings written into the saved config, 0 = keep.
    max_position_embeddings: i64 = 0;
    /// libtorch intra-op threads, 0 = libtorch's default.
    threads: i64 = 0;
    // --- objective
    /// standard | rsd | pose | two-view-clm.
    objective: Objective = Objective::Rsd;
    /// skip | cyclic | dilation | chunk-permute.
    perturb: PerturbKind = PerturbKind::Skip;
    /// sequence (the paper) | document (a split inside each document of mixed batches).
    perturb_scope: Scope = Scope::Sequence;
    /// reverse = KL(p_pert ‖ sg(p_std)) (the paper) | forward.
    kl: KlDirection = KlDirection::Reverse;
    /// λ, the weight of the KL (or of the perturbed CLM for two-view-clm).
    lambda: f64 = 1.0;
    /// Y: skips are drawn from 1..=Y; 0 = the sequence length.
    skip_range: i64 = 0;
    /// Fixed "s,y" for the ablation; empty = sampled per sample.
    fixed_split: String = String::new();
    /// Chunks for chunk-permute.
    chunks: usize = 8;
    /// Reuse the standard pass's prefix K/V for the perturbed view (exact; off = naive two passes).
    prefix_reuse: bool = true;
    /// Rows per loss chunk (logits of at most this many rows exist at once).
    loss_chunk: i64 = 1024;
    /// Per-layer activation checkpointing.
    checkpoint_layers: bool = false;
    /// LongCE: weight each standard-view CLM token by min(exp(log p_long − log p_short), γ), the
    /// short context being its `long_ce_window`-token window; 0 = off (plain CE).
    long_ce_window: i64 = 0;
    /// LongCE cap γ on a token's weight.
    long_ce_gamma: f64 = 5.0;
    // --- optimisation
    /// Optimizer steps.
    steps: u64 = 100;
    /// Peak learning rate.
    lr: f64 = 1e-5;
    /// Final learning rate / peak (cosine floor).
    min_lr_ratio: f64 = 0.1;
    /// Warmup as a fraction of the steps.
    warmup_ratio: f64 = 0.1;
    /// AdamW β1.
    beta1: f64 = 0.9;
    /// AdamW β2.
    beta2: f64 = 0.95;
    /// AdamW ε.
    eps: f64 = 1e-8;
    /// Decoupled weight decay (matrices only).
    weight_decay: f64 = 0.1;
    /// Gradient clipping by global norm, 0 = off.
    clip: f64 = 1.0;
    /// Rows per micro-batch.
    micro_batch: usize = 1;
    /// Global batch in tokens per optimizer step (gradient accumulation); 0 = one micro-batch.
    tokens_per_step: u64 = 0;
    /// Seed for data order and perturbations.
    seed: u64 = 0;
    /// stop | skip: what a NaN/inf loss or gradient does.
    on_nonfinite: String = "stop".into();
    /// Stop after this many consecutive skipped steps.
    max_skips: u64 = 10;
    // --- checkpoints and logging
    /// Checkpoint every N steps (and at the end), 0 = only at the end.
    save_every: u64 = 0;
    /// Checkpoints kept (the newest).
    keep: usize = 2;
    /// Stop (with a checkpoint) after this step, as if interrupted; 0 = run to `steps`.
    stop_at: u64 = 0;
    /// Show a progress bar (off when stderr is not a terminal).
    progress: bool = true;
    /// Loader assembling threads.
    loader_workers: usize = 1;
}

impl TrainConfig {
    /// Defaults ← `file` (TOML, optional) ← `cli`.
    pub fn resolve(file: Option<&Path>, cli: ConfigOverrides) -> Result<Self> {
        let mut c = TrainConfig::default();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(io_err(path))?;
            let o: ConfigOverrides = toml::from_str(&text)
                .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
            o.apply(&mut c);
        }
        cli.apply(&mut c);
        c.check()?;
        Ok(c)
    }

    /// Refuses inconsistent values with a message naming the key.
    pub fn check(&self) -> Result<()> {
        let bad = |k: &str, why: &str| Err(Error::Input(format!("config key {k}: {why}")));
        if self.model.is_empty() == self.init.is_empty() {
            return bad(
                "model/init",
                "give exactly one of --model DIR or --init CONFIG",
            );
        }
        if self.steps == 0 {
            return bad("steps", "must be ≥ 1");
        }
        if self.lr.is_nan() || self.lr <= 0.0 {
            return bad("lr", "must be > 0");
        }
        if self.micro_batch == 0 {
            return bad("micro_batch", "must be ≥ 1");
        }
        if self.loss_chunk <= 0 {
            return bad("loss_chunk", "must be ≥ 1");
        }
        if !matches!(self.on_nonfinite.as_str(), "stop" | "skip") {
            return bad("on_nonfinite", "stop or skip");
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) || !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad("warmup_ratio/min_lr_ratio", "must lie in [0, 1]");
        }
        self.fixed_split()?;
        Ok(())
    }

    /// `long_ce_window` / `long_ce_gamma` checked: `None` when LongCE is off.
    pub fn long_ce(&self) -> Result<Option<crate::step::LongCe>> {
        match self.long_ce_window {
            0 => Ok(None),
            w if w < 0 => Err(Error::Input(format!(
                "long_ce_window {w}: expected 0 (off) or a window of ≥ 1 tokens"
            ))),
            w => {
                if !(self.long_ce_gamma.is_finite() && self.long_ce_gamma > 0.0) {
                    return Err(Error::Input(format!(
                        "long_ce_gamma {}: expected a positive cap (the paper uses 5)",
                        self.long_ce_gamma
                    )));
                }
                if !matches!(self.objective, Objective::Standard | Objective::Rsd) {
                    return Err(Error::Input(format!(
                        "long_ce_window: LongCE reweights the standard-view CLM term, which \
                         objective {:?} does not have (use standard or rsd)",
                        self.objective
                    )));
                }
                Ok(Some(crate::step::LongCe {
                    window: w,
                    gamma: self.long_ce_gamma,
                }))
            }
        }
    }

    /// `fixed_split` parsed.
    pub fn fixed_split(&self) -> Result<Option<(i64, i64)>> {
        if self.fixed_split.trim().is_empty() {
            return Ok(None);
        }
        let v: Vec<i64> = self
            .fixed_split
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                Error::Input(format!(
                    "fixed_split {:?}: expected \"s,y\"",
                    self.fixed_split
                ))
            })?;
        match v[..] {
            [s, y] if s >= 0 && y >= 1 => Ok(Some((s, y))),
            _ => Err(Error::Input(format!(
                "fixed_split {:?}: expected \"s,y\" with s ≥ 0, y ≥ 1",
                self.fixed_split
            ))),
        }
    }

    /// As TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_cli_and_unknown_keys_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "init = \"x.json\"\nlr = 0.001\nobjective = \"pose\"\nsteps = 7\n",
        )
        .unwrap();
        let cli = ConfigOverrides {
            steps: Some(9),
            ..Default::default()
        };
        let c = TrainConfig::resolve(Some(&p), cli).unwrap();
        assert_eq!((c.lr, c.steps, c.objective), (0.001, 9, Objective::Pose));
        // Round trip through the checkpoint's TOML.
        let back: TrainConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back, c);
        std::fs::write(&p, "init = \"x\"\nlearning_rate = 1\n").unwrap();
        let e = TrainConfig::resolve(Some(&p), ConfigOverrides::default()).unwrap_err();
        assert!(e.to_string().contains("learning_rate"), "{e}");
    }
}
