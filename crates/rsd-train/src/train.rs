//! The training loop. One [`Trainer`] owns every stateful piece (model, optimizer, schedule,
//! loader, counters) and writes them together into each checkpoint.
//!
//! Per optimizer step: take `accum` loader batches (the token budget), sample each row's
//! perturbation from a generator keyed by (seed, step, row), run [`step_micro`] on every
//! micro-batch with the step's global normalisers, then check the loss and gradient norm for
//! NaN/inf (stop, or skip the update), clip, apply AdamW at the scheduled rate, log a JSONL record,
//! and checkpoint when due or when interrupted.
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;

use rsd_loader::Loader;
use rsd_model::{Model, ModelConfig, ModelOptions};

use crate::checkpoint::{self, TrainState, STATE_VERSION};
use crate::config::TrainConfig;
use crate::data;
use crate::optim::{clip_grads, AdamW, AdamWConfig, Schedule};
use crate::perturb::{perturb_row, RowView, Sampler, Scope};
use crate::rng::SplitMix64;
use crate::step::{
    grad_norm, step_micro, zero_grads, MicroBatch, Norm, Objective, StepOptions, Sums,
};
use crate::{io_err, Error, Result};

/// Peak and current resident memory of this process in bytes (`VmHWM`, `VmRSS`), 0 if unknown.
pub fn memory() -> (u64, u64) {
    let text = fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Serialize)]
pub struct StepRecord {
    /// Optimizer step (1-based: the number of updates after this one).
    pub step: u64,
    /// Total loss.
    pub loss: f64,
    /// CLM term (token mean).
    pub clm: f64,
    /// KL term (sample mean), rsd only.
    pub kl: f64,
    /// Perturbed-view CLM, two-view-clm only.
    pub clm_pert: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens in this step.
    pub tokens: u64,
    /// Tokens per second of this step.
    pub tokens_per_s: f64,
    /// Step wall time, seconds.
    pub step_s: f64,
    /// Peak resident memory so far, bytes.
    pub peak_rss: u64,
    /// Update skipped (non-finite values).
    pub skipped: bool,
}

/// What a finished (or interrupted) run reports.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Steps completed.
    pub steps: u64,
    /// Tokens consumed.
    pub tokens: u64,
    /// Loss of the first and last step of this invocation.
    pub first_loss: Option<f64>,
    /// Loss of the last step.
    pub last_loss: Option<f64>,
    /// Stopped by Ctrl-C or `stop_at`.
    pub interrupted: bool,
    /// Newest checkpoint.
    pub checkpoint: Option<PathBuf>,
    /// Final HF model directory (complete runs).
    pub final_model: Option<PathBuf>,
    /// Metrics file.
    pub metrics: PathBuf,
    /// Seconds in this invocation.
    pub wall_s: f64,
    /// Steps skipped for non-finite values.
    pub skipped: u64,
}

/// Owns the run.
pub struct Trainer {
    cfg: TrainConfig,
    model: Model,
    opt: AdamW,
    loader: Loader,
    mixed: bool,
    seq_len: u64,
    accum: usize,
    state: TrainState,
    sampler: Sampler,
    step_opts: StepOptions,
    out: PathBuf,
}

fn model_options(cfg: &TrainConfig) -> Result<ModelOptions> {
    let device = rsd_model::parse_device(&cfg.device)?;
    rsd_model::check_device(device)?;
    Ok(ModelOptions {
        device,
        kind: rsd_model::parse_kind(&cfg.dtype)?,
    })
}

/// Step options and sampler a config implies.
pub fn objective_of(cfg: &TrainConfig) -> Result<(StepOptions, Sampler)> {
    Ok((
        StepOptions {
            objective: cfg.objective,
            kl: cfg.kl,
            lambda: cfg.lambda,
            prefix_reuse: cfg.prefix_reuse,
            loss_chunk: cfg.loss_chunk,
            checkpoint_layers: cfg.checkpoint_layers,
            long_ce: cfg.long_ce()?,
        },
        Sampler {
            kind: cfg.perturb,
            scope: cfg.perturb_scope,
            skip_range: (cfg.skip_range > 0).then_some(cfg.skip_range),
            fixed_split: cfg.fixed_split()?,
            chunks: cfg.chunks,
        },
    ))
}

/// The perturbed views of a micro-batch whose first row is row `row0` of optimizer step `step`.
pub fn sample_views(
    sampler: &Sampler,
    seed: u64,
    step: u64,
    row0: usize,
    mb: &MicroBatch,
) -> Vec<RowView> {
    (0..mb.rows())
        .map(|r| {
            let mut g = SplitMix64::keyed(&[seed, step, (row0 + r) as u64]);
            let pos = &mb.positions[r];
            let docs = mb.docs.as_ref().map(|d| d[r].as_slice());
            let perts: Vec<_> = match (sampler.scope, docs) {
                (Scope::Document, Some(d)) => d
                    .windows(2)
                    .map(|w| sampler.sample(&mut g, w[1] - w[0]))
                    .collect(),
                _ => vec![sampler.sample(&mut g, pos.len() as i64)],
            };
            let scope = if docs.is_some() {
                sampler.scope
            } else {
                Scope::Sequence
            };
            perturb_row(pos, docs, scope, &perts)
        })
        .collect()
}

impl Trainer {
    /// Builds a fresh run, or resumes from `resume` (a checkpoint directory).
    pub fn new(cfg: TrainConfig, resume: Option<&Path>) -> Result<Self> {
        if cfg.threads > 0 {
            tch::set_num_threads(cfg.threads as i32);
        }
        let options = model_options(&cfg)?;
        let out = PathBuf::from(&cfg.out);
        if cfg.out.is_empty() {
            return Err(Error::Input(
                "config key out: a run directory is required".into(),
            ));
        }
        fs::create_dir_all(&out).map_err(io_err(&out))?;
        let lcfg = data::loader_config(&cfg)?;
        let (model, state, loader) = match resume {
            Some(dir) => {
                let st = checkpoint::read_state(dir)?;
                if st.rng_seed != cfg.seed {
                    return Err(Error::Checkpoint {
                        path: dir.to_path_buf(),
                        reason: format!(
                            "seed {} in the checkpoint, {} in the config",
                            st.rng_seed, cfg.seed
                        ),
                    });
                }
                let model = Model::load(&dir.join("model"), options)?;
                let loader = Loader::resume(lcfg, &st.loader)?;
                (model, Some(st), loader)
            }
            None => {
                let mut model = if !cfg.model.is_empty() {
                    Model::load(Path::new(&cfg.model), options)?
                } else {
                    let p = Path::new(&cfg.init);
                    let text = fs::read_to_string(p).map_err(io_err(p))?;
                    let v: serde_json::Value = serde_json::from_str(&text)
                        .map_err(|e| Error::Input(format!("{}: {e}", p.display())))?;
                    Model::random(ModelConfig::from_hf_json(v)?, options, cfg.init_seed)?
                };
                if cfg.rope_theta > 0.0 {
                    model.set_rope_theta(cfg.rope_theta)?;
                }
                if cfg.max_position_embeddings > 0 {
                    model
                        .config_mut_for_save()
                        .set_max_position_embeddings(cfg.max_position_embeddings);
                }
                (model, None, Loader::new(lcfg)?)
            }
        };
        let mixed = loader
            .manifest(0)
            .is_some_and(|m| m.mode == rsd_shard::PackMode::Mixed);
        let seq_len = loader.seq_len();
        let per_micro = (cfg.micro_batch as u64 * seq_len).max(1);
        let accum = if cfg.tokens_per_step == 0 {
            1
        } else {
            cfg.tokens_per_step.div_ceil(per_micro) as usize
        };
        let schedule = Schedule {
            lr: cfg.lr,
            warmup: (cfg.warmup_ratio * cfg.steps as f64).round() as u64,
            total: cfg.steps,
            min_ratio: cfg.min_lr_ratio,
        };
        let mut opt = AdamW::new(
            &model,
            AdamWConfig {
                beta1: cfg.beta1,
                beta2: cfg.beta2,
                eps: cfg.eps,
                weight_decay: cfg.weight_decay,
            },
        )?;
        let state = match state {
            Some(st) => {
                opt.load(
                    &resume.unwrap_or(&out).join("optimizer.safetensors"),
                    st.step - st.skipped,
                )?;
                TrainState { schedule, ..st }
            }
            None => TrainState {
                version: STATE_VERSION,
                step: 0,
                tokens: 0,
                loader: loader.state(),
                rng_seed: cfg.seed,
                schedule,
                skipped: 0,
                elapsed_s: 0.0,
            },
        };
        let (step_opts, sampler) = objective_of(&cfg)?;
        Ok(Trainer {
            cfg,
            model,
            opt,
            loader,
            mixed,
            seq_len,
            accum,
            state,
            sampler,
            step_opts,
            out,
        })
    }

    /// Micro-batches per optimizer step.
    pub fn accum(&self) -> usize {
        self.accum
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    fn save(&self) -> Result<PathBuf> {
        checkpoint::save(
            &self.out,
            &self.model,
            &self.opt,
            &self.state,
            &self.cfg,
            self.cfg.keep,
        )
    }

    /// Runs until `steps` (or `stop_at`, or `stop` is raised), checkpointing as configured.
    pub fn run(&mut self, stop: Arc<AtomicBool>) -> Result<Summary> {
        let t0 = Instant::now();
        let elapsed0 = self.state.elapsed_s;
        let end = if self.cfg.stop_at > 0 {
            self.cfg.stop_at.min(self.cfg.steps)
        } else {
            self.cfg.steps
        };
        let metrics_path = self.out.join("metrics.jsonl");
        let mut metrics: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&metrics_path)
            .map_err(io_err(&metrics_path))?;
        let pb = if self.cfg.progress {
            ProgressBar::with_draw_target(Some(end), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        pb.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise} < {eta}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        pb.set_position(self.state.step);
        let device = self.model.options().device;
        let (mut first, mut last) = (None, None);
        let mut consecutive_skips = 0;
        let mut interrupted = false;
        let mut last_ckpt = None;
        while self.state.step < end {
            if stop.load(Ordering::SeqCst) {
                interrupted = true;
                break;
            }
            let ts = Instant::now();
            let step = self.state.step;
            // 1. The step's data: `accum` loader batches.
            let mut mbs = Vec::new();
            for _ in 0..self.accum {
                let batch = self
                    .loader
                    .next()
                    .ok_or_else(|| Error::Input("the loader ran out of data".into()))??;
                mbs.extend(data::micro_batches(&batch, self.mixed, device)?);
            }
            let norm = Norm {
                label_tokens: mbs.iter().map(|m| m.label_tokens as f64).sum(),
                samples: mbs.iter().map(|m| m.rows() as f64).sum(),
            };
            let tokens: u64 = mbs.iter().map(|m| (m.rows() as i64 * m.len()) as u64).sum();
            // 2. Forward/backward of every micro-batch.
            let mut sums = Sums::new(device);
            let mut row0 = 0;
            for mb in &mbs {
                let views = self
                    .step_opts
                    .objective
                    .needs_perturbed()
                    .then(|| sample_views(&self.sampler, self.cfg.seed, step, row0, mb));
                step_micro(
                    &self.model,
                    mb,
                    views.as_deref(),
                    &self.step_opts,
                    norm,
                    &mut sums,
                )?;
                row0 += mb.rows();
            }
            // 3. Check, clip, update.
            let (clm, kl, clm_pert) = sums.values(norm);
            let loss = match self.step_opts.objective {
                Objective::Rsd => clm + self.cfg.lambda * kl,
                Objective::TwoViewClm => clm + self.cfg.lambda * clm_pert,
                _ => clm,
            };
            let mut gn = grad_norm(&self.model)?;
            // Test hook (tests/test_train_loop.py): pretend step N's gradient is NaN.
            if std::env::var("RSD_TRAIN_FAULT_NAN_AT_STEP")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                == Some(step + 1)
            {
                gn = f64::NAN;
            }
            let lr = self.state.schedule.lr(step);
            let finite = loss.is_finite() && gn.is_finite();
            if !finite {
                let (what, value) = if loss.is_finite() {
                    ("gradient norm", gn)
                } else {
                    ("loss", loss)
                };
                if self.cfg.on_nonfinite == "stop" || consecutive_skips + 1 > self.cfg.max_skips {
                    pb.abandon();
                    return Err(Error::NonFinite {
                        what,
                        step: step + 1,
                        value,
                    });
                }
                consecutive_skips += 1;
                self.state.skipped += 1;
                pb.println(format!(
                    "step {}: non-finite {what} ({value}); update skipped",
                    step + 1
                ));
            } else {
                consecutive_skips = 0;
                clip_grads(&self.model, gn, self.cfg.clip)?;
                self.opt.step(lr)?;
            }
            zero_grads(&self.model);
            self.state.step += 1;
            self.state.tokens += tokens;
            self.state.loader = self.loader.state();
            let step_s = ts.elapsed().as_secs_f64();
            let rec = StepRecord {
                step: self.state.step,
                loss,
                clm,
                kl,
                clm_pert,
                lr,
                grad_norm: gn,
                tokens,
                tokens_per_s: tokens as f64 / step_s.max(1e-9),
                step_s,
                peak_rss: memory().0,
                skipped: !finite,
            };
            let line = serde_json::to_string(&rec).map_err(|e| Error::Input(e.to_string()))?;
            writeln!(metrics, "{line}").map_err(io_err(&metrics_path))?;
            first.get_or_insert(loss);
            last = Some(loss);
            pb.set_position(self.state.step);
            pb.set_message(format!(
                "loss {loss:.4} clm {clm:.4} kl {kl:.4} {:.0} tok/s",
                rec.tokens_per_s
            ));
            if pb.is_hidden() && self.cfg.progress {
                let every = (end / 20).max(1);
                if self.state.step.is_multiple_of(every) || self.state.step == end {
                    eprintln!(
                        "step {}/{end} loss {loss:.4} clm {clm:.4} kl {kl:.4} lr {lr:.3e} |g| {gn:.3} {:.0} tok/s",
                        self.state.step, rec.tokens_per_s
                    );
                }
            }
            self.state.elapsed_s = elapsed0 + t0.elapsed().as_secs_f64();
            if self.cfg.save_every > 0 && self.state.step.is_multiple_of(self.cfg.save_every) {
                last_ckpt = Some(self.save()?);
            }
        }
        pb.finish_and_clear();
        interrupted |= self.state.step < self.cfg.steps;
        self.state.elapsed_s = elapsed0 + t0.elapsed().as_secs_f64();
        // Always leave a checkpoint of where we are (unless the last one is exactly this step).
        let have = checkpoint::list(&self.out).last().map(|c| c.0) == Some(self.state.step);
        if !have {
            last_ckpt = Some(self.save()?);
        } else if last_ckpt.is_none() {
            last_ckpt = checkpoint::list(&self.out).last().map(|c| c.1.clone());
        }
        let final_model = if !interrupted {
            let dir = self.out.join("model");
            self.model.save(
                &dir,
                &rsd_model::SaveOptions {
                    overwrite: true,
                    ..Default::default()
                },
            )?;
            Some(dir)
        } else {
            None
        };
        let summary = Summary {
            steps: self.state.step,
            tokens: self.state.tokens,
            first_loss: first,
            last_loss: last,
            interrupted,
            checkpoint: last_ckpt,
            final_model,
            metrics: metrics_path,
            wall_s: t0.elapsed().as_secs_f64(),
            skipped: self.state.skipped,
        };
        let sp = self.out.join("summary.json");
        let text =
            serde_json::to_string_pretty(&summary).map_err(|e| Error::Input(e.to_string()))?;
        fs::write(&sp, text).map_err(io_err(&sp))?;
        Ok(summary)
    }

    /// Sequence length of the shards.
    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }
}
