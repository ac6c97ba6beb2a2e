//! The training loop. One [`Trainer`] owns every stateful piece (model, optimizer, schedule,
//! loader, counters) and writes them together into each checkpoint.
//!
//! Per optimizer step ([`Trainer::run`] reads in this order): take this rank's share of `accum`
//! loader batches (the token budget), sum the loss normalisers over data-parallel ranks, sample
//! each row's perturbation from a generator keyed by (seed, step, global row), run [`step_micro`]
//! on every micro-batch with the step's global normalisers, sum the gradients over ranks, then
//! check the loss and gradient norm for NaN/inf (stop, or skip the update), clip, apply AdamW at
//! the scheduled rate, log a JSONL record, and checkpoint when due or when interrupted. With one
//! process the data-parallel parts ([`DataParallel`]) do nothing; with several, rank 0 alone logs
//! and writes checkpoints.
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rsd_common::progress::ProgressLines;
use serde::Serialize;

use rsd_loader::Loader;
use rsd_model::phases::{self, timed};
use rsd_model::{Model, ModelConfig, ModelOptions};

use crate::checkpoint::{self, Manifest, TrainState, STATE_VERSION};
use crate::config::{OnNonFinite, TrainConfig};
use crate::cp::CpBatch;
use crate::data;
use crate::job_end::JobEnd;
use crate::memory_measure::{self as measure, Phase};
use crate::optim::Schedule;
use crate::parallel::{DataParallel, ResumePoint};
use crate::perturb::{clip_doc_bounds, RowView, Sampler, Scope};
use crate::step::{
    step_micro, GradsDone, LossNormalizers, MicroBatch, Objective, SecondView, StepExtras,
    StepOptions, Sums,
};
use crate::tokenizer;
use crate::update::Optimizer;
use crate::{io_err, Error, Result};
use rsd_common::mem::Memory;
use rsd_common::rng::SplitMix64;
use tch::Tensor;

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
    /// On CUDA: the most the caching allocator has held from the device so far (peak reserved),
    /// bytes; what `torch.cuda.max_memory_reserved()` reports for a PyTorch process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_peak_reserved: Option<u64>,
    /// Payload bytes this rank handed to collectives in this step (0 for one process).
    pub comm_bytes: u64,
    /// Seconds this rank spent in collectives in this step (waiting for the others included).
    pub comm_s: f64,
    /// Update skipped (non-finite values).
    pub skipped: bool,
    /// Seconds per phase of the step, timed on its device (config key `profile` only; paths in
    /// `crate::profile`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<std::collections::BTreeMap<String, f64>>,
    /// The held-out slice's standard-view CLM after this step (`heldout_every` steps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heldout_clm: Option<f64>,
    /// The held-out slice's view gap after this step: the KL between its standard and perturbed
    /// views (`heldout_every` steps only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub view_gap: Option<f64>,
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
    /// Mean loss over the first `loss_window` steps of this invocation: one step's loss is one
    /// batch's, and moves by more than training changes it over a short run.
    pub first_loss_mean: Option<f64>,
    /// Mean loss over the last `loss_window` steps.
    pub last_loss_mean: Option<f64>,
    /// Steps in each of those means: a tenth of the steps run, at least 1 and at most 50.
    pub loss_window: usize,
    /// Stopped before `steps`: by a signal or `stop_at`.
    pub interrupted: bool,
    /// Stopped by a signal, on this rank or another (every rank stops at the same step), or by
    /// the job's end time drawing near.
    pub signalled: bool,
    /// Stopped because the job's end time was near (`end_margin_s`; said on rank 0 only).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub out_of_time: bool,
    /// The run's state at its last step is in a checkpoint (or no step ran since its start):
    /// stopping here loses nothing. The same on every rank.
    #[serde(skip)]
    pub checkpointed: bool,
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

/// Called on a thread of its own when another rank fails or falls silent; expected to end the
/// process ([`Start::on_failure`]).
pub type FailureHandler = Box<dyn FnOnce(rsd_dist::Failure) + Send + 'static>;

/// Where a run starts and how it watches the other ranks.
#[derive(Default)]
pub struct Start<'a> {
    /// The checkpoint to resume; `None`: a fresh run.
    pub resume: Option<&'a Path>,
    /// `--resume auto`: every rank verifies the checkpoint's files (its share, by sha256) before
    /// anything is loaded, and when any rank finds one damaged, every rank falls back to the
    /// checkpoint before it. Without it a damaged file stops the run.
    pub fall_back: bool,
    /// From the moment the ranks have met (before the model and checkpoint load), another rank's
    /// failure or its silence for `dist_liveness` runs this; `None`: nobody watches (one process
    /// never does).
    pub on_failure: Option<FailureHandler>,
}

/// Owns the run.
pub struct Trainer {
    cfg: TrainConfig,
    model: Model,
    opt: Optimizer,
    loader: Loader,
    seq_len: u64,
    /// Micro-batches per optimizer step, over all ranks.
    accum: usize,
    /// This rank's share of them.
    local_accum: usize,
    dp: DataParallel,
    state: TrainState,
    sampler: Sampler,
    step_opts: StepOptions,
    out: PathBuf,
    /// Where saved model directories get their tokenizer files from (`tokenizer::tokenizer_files`).
    tokenizer_dir: Option<PathBuf>,
    /// This rank's share of the held-out slice and its perturbed views (`heldout_every > 0`):
    /// micro-batches `rank, rank + world, …` of it, so all ranks evaluate it together.
    heldout: Vec<(MicroBatch, Vec<RowView>)>,
    /// The job's end time (rank 0, under a scheduler), and a checkpoint's writing time estimated
    /// before one is measured: the run stops with a checkpoint before the end.
    job_end: Option<(JobEnd, f64)>,
}

/// The device this rank trains on: the config's, where `device = "cuda"` in a multi-process run
/// means each rank's own GPU ([`local_gpu`]; an explicit `cuda:N` is taken as written). An
/// error when that device is not there.
pub fn rank_device(cfg: &TrainConfig) -> Result<tch::Device> {
    let local = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let device = match local {
        Some(local) if cfg.device == "cuda" => {
            local_gpu(local, tch::Cuda::device_count().max(0) as usize)?
        }
        _ => rsd_model::parse_device(&cfg.device)?,
    };
    rsd_model::check_device(device)?;
    Ok(device)
}

/// The GPU of the rank with node-local rank `local` in a process that sees `visible` GPUs:
/// - several visible (torchrun, or SLURM with every GPU of the node given to each task): the
///   node's GPU number `local`, `cuda:LOCAL_RANK`;
/// - one visible (SLURM with `--gpus-per-task=1`, where each task's `CUDA_VISIBLE_DEVICES` names
///   its own GPU): that one, `cuda:0`, whatever the local rank.
///
/// More local ranks than visible GPUs is an error that says what to change.
pub fn local_gpu(local: usize, visible: usize) -> Result<tch::Device> {
    match visible {
        0 => Err(Error::Input(format!(
            "device = \"cuda\" on local rank {local}, but this process sees no CUDA device \
             (CUDA_VISIBLE_DEVICES={})",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        ))),
        1 => Ok(tch::Device::Cuda(0)),
        n if local < n => Ok(tch::Device::Cuda(local)),
        n => Err(Error::Input(format!(
            "device = \"cuda\" on local rank {local}, but this process sees {n} GPUs \
             (CUDA_VISIBLE_DEVICES={}): start at most {n} ranks per node (torchrun \
             --nproc-per-node), give each task its own GPU (srun --gpus-per-task=1), or name \
             the device (device = \"cuda:N\")",
            std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
        ))),
    }
}

/// The steps `epochs` passes over datasets of `rows` packed samples take at `rows_per_step` rows
/// per step (at least 1).
fn steps_for_epochs(epochs: f64, rows: &[u64], rows_per_step: usize) -> u64 {
    let rows: u64 = rows.iter().sum();
    ((epochs * rows as f64) / rows_per_step.max(1) as f64)
        .ceil()
        .max(1.0) as u64
}

fn model_options(cfg: &TrainConfig) -> Result<ModelOptions> {
    Ok(ModelOptions {
        device: rank_device(cfg)?,
        kind: rsd_model::parse_kind(&cfg.dtype)?,
    })
}

/// Step options and sampler a config implies.
pub fn objective_of(cfg: &TrainConfig) -> Result<(StepOptions, Sampler)> {
    Ok((
        StepOptions {
            objective: cfg.objective.loss(),
            kl: cfg.kl,
            lambda: cfg.lambda,
            prefix_reuse: cfg.prefix_reuse,
            loss_chunk: cfg.loss_chunk,
            checkpoint_layers: cfg.checkpoint_layers,
            long_ce: cfg.long_ce()?,
            view: SecondView::of(cfg.perturb, cfg.attn_noise_sigma, cfg.attn_dropout),
        },
        Sampler {
            kind: cfg.perturb,
            scope: cfg.perturb_scope,
            skip_range: (cfg.skip_range > 0).then_some(cfg.skip_range),
            fixed_split: cfg.fixed_split()?,
            chunks: cfg.chunks,
            kl_norm: cfg.kl_norm,
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
    let rows: Vec<usize> = (row0..row0 + mb.rows()).collect();
    sample_views_of_rows(sampler, seed, step, &rows, mb)
}

/// The held-out slice: the first `heldout_batches` loader batches of `heldout_shards`, read in
/// order (its first samples; whole rows, the run's batching and document masking) with perturbed views drawn once from the run's
/// sampler under a seed of their own, so every evaluation sees the same tokens and views.
fn heldout_slice(
    cfg: &TrainConfig,
    sampler: &Sampler,
    vocab: i64,
    device: tch::Device,
) -> Result<Vec<(MicroBatch, Vec<RowView>)>> {
    if cfg.heldout_shards.trim().is_empty() {
        return Err(Error::Input(format!(
            "config key heldout_every = {}: needs heldout_shards, a shard directory not trained \
             on (rsd-data pack output)",
            cfg.heldout_every
        )));
    }
    if cfg.heldout_batches == 0 {
        return Err(Error::Input(
            "config key heldout_batches: expected ≥ 1 loader batches".into(),
        ));
    }
    let held = TrainConfig {
        shards: cfg.heldout_shards.clone(),
        weights: String::new(),
        loader_workers: 1,
        ..cfg.clone()
    };
    let mut config = data::loader_config(&held, Default::default())?;
    config.shuffle = false;
    let mut loader = Loader::new(config)?;
    data::guard_vocabulary(&mut loader, vocab)?;
    data::check_loss_mask(&loader, cfg.objective)?;
    let seed = cfg.seed ^ HELDOUT_SEED;
    let mut out = Vec::new();
    let mut first = 0;
    for _ in 0..cfg.heldout_batches {
        let batch = loader.next().ok_or_else(|| {
            Error::Input(format!(
                "heldout_shards {}: fewer than heldout_batches = {} batches of {} rows",
                cfg.heldout_shards, cfg.heldout_batches, cfg.micro_batch
            ))
        })??;
        for (_, mb) in data::micro_batches(&batch, cfg.doc_mask, false, device)? {
            let rows: Vec<usize> = (first..first + mb.rows()).collect();
            first += mb.rows();
            let views = sample_views_of_rows(sampler, seed, 0, &rows, &mb);
            out.push((mb, views));
        }
    }
    Ok(out)
}

/// Keeps the held-out slice's perturbation draws apart from any training step's.
const HELDOUT_SEED: u64 = 0x0068_656c_646f_7574;

/// The perturbed views of a micro-batch whose row `r` is row `rows[r]` of optimizer step `step`'s
/// global batch (a data-parallel rank's rows are not consecutive there).
pub fn sample_views_of_rows(
    sampler: &Sampler,
    seed: u64,
    step: u64,
    rows: &[usize],
    mb: &MicroBatch,
) -> Vec<RowView> {
    views_at(
        sampler,
        seed,
        step,
        rows,
        &mb.positions,
        &mb.real_len,
        mb.doc_bounds.as_deref(),
    )
}

/// The perturbed views of rows with these standard positions (and document boundaries), row `r`
/// being row `rows[r]` of optimizer step `step`'s global batch. Each row is perturbed over its
/// `real` tokens only (the rest is padding: [`perturb_real`]).
fn views_at(
    sampler: &Sampler,
    seed: u64,
    step: u64,
    rows: &[usize],
    positions: &[Vec<i64>],
    real: &[i64],
    doc_bounds: Option<&[Vec<i64>]>,
) -> Vec<RowView> {
    (0..positions.len())
        .map(|r| {
            let mut g = SplitMix64::keyed(&[seed, step, rows[r] as u64]);
            let pos = &positions[r];
            let n = real
                .get(r)
                .copied()
                .unwrap_or(pos.len() as i64)
                .clamp(0, pos.len() as i64);
            let doc_bounds = doc_bounds.map(|d| clip_doc_bounds(&d[r], n));
            let perts: Vec<_> = match (sampler.scope, &doc_bounds) {
                (Scope::Document, Some(d)) => d
                    .windows(2)
                    .map(|w| sampler.sample(&mut g, w[1] - w[0]))
                    .collect(),
                _ => vec![sampler.sample(&mut g, n)],
            };
            sampler.view(pos, n, doc_bounds.as_deref(), &perts, &mut g)
        })
        .collect()
}

/// A fresh model: loaded from `model`, or randomly initialised from `init`; then the RoPE base
/// and `max_position_embeddings` the config asks for.
fn initial_model(cfg: &TrainConfig, options: ModelOptions) -> Result<Model> {
    let mut model = match (&cfg.model, &cfg.init) {
        (Some(dir), _) => Model::load(Path::new(dir), options)?,
        (None, init) => {
            let p = Path::new(init.as_deref().unwrap_or_default());
            let config = ModelConfig::from_file(p)?;
            // On the CPU a config that declares more than the machine holds is refused before
            // allocating aborts the run (a GPU's memory is the memory plan's to check).
            if options.device == tch::Device::Cpu {
                let kind = options.kind;
                config.check_fits_in_memory(
                    p,
                    rsd_model::kind_name(kind),
                    kind.elt_size_in_bytes() as u64,
                    rsd_model::alloc::available_bytes(),
                )?;
            }
            Model::random(config, options, cfg.init_seed)?
        }
    };
    if let Some(theta) = cfg.rope_theta {
        model.set_rope_theta(theta)?;
    }
    if let Some(n) = cfg.max_position_embeddings {
        model.config_mut_for_save().set_max_position_embeddings(n);
    }
    Ok(model)
}

/// What a run starts from: the model, the loader, and for a resumed run the checkpoint's state
/// and directory.
struct StartingPoint {
    model: Model,
    loader: Loader,
    resumed: Option<(TrainState, PathBuf)>,
}

/// The model, state and loader a run starts from: the checkpoint `start.resume` names (or, with
/// `start.fall_back`, the newest one at or before it that every rank verified), or a fresh model
/// and loader. Every rank starts from rank 0's point or none starts
/// ([`DataParallel::agree_on_resume`]), and a rank that fails to read the checkpoint stops
/// every rank at once ([`DataParallel::all_ok`]).
fn starting_point(
    cfg: &TrainConfig,
    options: ModelOptions,
    start: &Start,
    dp: &DataParallel,
) -> Result<StartingPoint> {
    let older = start
        .resume
        .filter(|_| fault::older_checkpoint(dp.rank()))
        .and_then(previous_checkpoint);
    let mut resume = older.or(start.resume.map(Path::to_path_buf));
    if let (Some(dir), true) = (&resume, start.fall_back) {
        let verified = verified_or_earlier(dir, dp)?;
        if &verified != dir && dp.is_main() {
            // The log was cut to the damaged checkpoint's step; the run goes on from this one's.
            let step = checkpoint::read_state(&verified)?.step;
            crate::run_dir::keep_metrics_through(Path::new(&cfg.out), step)?;
        }
        resume = Some(verified);
    }
    let resume = resume.as_deref();
    fault::freeze_while_loading(dp.rank());
    let point = match resume {
        Some(dir) => ResumePoint::of_checkpoint(dir),
        None => Ok(ResumePoint::fresh()),
    };
    dp.agree_on_resume(&dp.all_ok("reading the checkpoint to resume", point)?)?;
    Ok(match resume {
        Some(dir) => {
            let loaded = match fault::load_fails(dp.rank()) {
                true => Err(Error::Input(format!(
                    "fault injection: rank {} fails to load the checkpoint",
                    dp.rank()
                ))),
                false => resumed(cfg, options, dir, dp),
            };
            let (model, st, loader) = dp.all_ok("loading the checkpoint", loaded)?;
            StartingPoint {
                model,
                loader,
                resumed: Some((st, dir.to_path_buf())),
            }
        }
        None => {
            let opened = initial_model(cfg, options).and_then(|model| {
                let loader = Loader::new(data::loader_config(cfg, dp.loader_parallel())?)?;
                Ok((model, loader))
            });
            let (model, loader) = dp.all_ok("opening the model and the data", opened)?;
            StartingPoint {
                model,
                loader,
                resumed: None,
            }
        }
    })
}

/// `dir`, once every rank has verified its files (each rank its share, by sha256, as a resume
/// does), or the newest complete checkpoint before it that every rank verified: a damaged
/// newest checkpoint (a flipped byte on disk) must not stop a requeued job on every restart.
/// The rank that finds the damage names the file and why; rank 0 names the checkpoint left
/// behind and the one taken. No checkpoint left is an error (the run's progress is not discarded
/// by starting over).
fn verified_or_earlier(dir: &Path, dp: &DataParallel) -> Result<PathBuf> {
    let mut candidate = Some(dir.to_path_buf());
    while let Some(dir) = candidate {
        let checked = checkpoint::validate(&dir)
            .and_then(|_| checkpoint::verify_for_rank(&dir, dp.rank(), dp.world()));
        let failed = dp.ranks_where(checked.is_err())?;
        if failed.is_empty() {
            return Ok(dir);
        }
        if let Err(e) = &checked {
            eprintln!(
                "rsd-train: warning: rank {}: checkpoint {} is damaged: {}",
                dp.rank(),
                dir.display(),
                rsd_common::report::for_user_from_env(&e.to_string())
            );
        }
        candidate = previous_checkpoint(&dir);
        if dp.is_main() {
            let ranks: Vec<String> = failed.iter().map(ToString::to_string).collect();
            eprintln!(
                "rsd-train: --resume auto: checkpoint {} failed verification on rank {} (its \
                 warning says which file and why); every rank falls back to {}",
                dir.display(),
                ranks.join(", "),
                candidate
                    .as_ref()
                    .map_or("nothing (no earlier checkpoint)".into(), |p| p
                        .display()
                        .to_string())
            );
        }
    }
    Err(Error::Input(format!(
        "--resume auto: no checkpoint at or before {} passed verification on every rank (see the \
         warnings); keep more of them (config key keep), remove the damaged ones to start over, \
         or resume one with --resume DIR",
        dir.display()
    )))
}

/// The checkpoint of the same run before `dir` (`<run>/checkpoints/step-N`), if any.
fn previous_checkpoint(dir: &Path) -> Option<PathBuf> {
    let run = dir.parent()?.parent()?;
    let all = checkpoint::list(run);
    let i = all.iter().position(|(_, p)| p == dir)?;
    i.checked_sub(1).map(|j| all[j].1.clone())
}

fn resumed(
    cfg: &TrainConfig,
    options: ModelOptions,
    dir: &Path,
    dp: &DataParallel,
) -> Result<(Model, TrainState, Loader)> {
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
    let loader = Loader::resume(data::loader_config(cfg, dp.loader_parallel())?, &st.loader)?;
    Ok((model, st, loader))
}

/// The most micro-batches one optimizer step may take: far above a real run (the paper's
/// 64 × 64K-token step with one row per micro-batch on 16 ranks is 4 each), far below a step
/// that would never end.
const MAX_MICRO_BATCHES_PER_STEP: u64 = 1 << 20;

/// Micro-batches per optimizer step over all ranks: enough for `tokens_per_step` (1 without it).
fn micro_batches_per_step(cfg: &TrainConfig, seq_len: u64) -> Result<usize> {
    let per_micro = (cfg.micro_batch as u64).saturating_mul(seq_len).max(1);
    if cfg.tokens_per_step == 0 {
        return Ok(1);
    }
    let n = cfg.tokens_per_step.div_ceil(per_micro);
    if n > MAX_MICRO_BATCHES_PER_STEP {
        return Err(Error::Input(format!(
            "config key tokens_per_step: {} tokens make {n} micro-batches of {} row(s) × \
             {seq_len} tokens per step, more than {MAX_MICRO_BATCHES_PER_STEP}; raise micro_batch \
             or lower tokens_per_step",
            cfg.tokens_per_step, cfg.micro_batch
        )));
    }
    Ok(n as usize)
}

/// The steps `epochs` passes over the loader's datasets take, said on the main rank.
fn steps_of_epochs(cfg: &TrainConfig, loader: &Loader, accum: usize, main: bool) -> u64 {
    let rows_per_step = cfg.micro_batch * accum;
    let steps = steps_for_epochs(cfg.epochs, &loader.dataset_sizes(), rows_per_step);
    if main {
        eprintln!(
            "rsd-train: {} epoch(s) of {} rows at {rows_per_step} rows per step: {steps} steps",
            cfg.epochs,
            loader.dataset_sizes().iter().sum::<u64>(),
        );
    }
    steps
}

impl Trainer {
    /// Builds a fresh run, or resumes from `start.resume` (a checkpoint directory). From the
    /// moment the ranks have met, `start.on_failure` watches the others, and an error of this
    /// rank is announced to them.
    pub fn new(cfg: TrainConfig, start: Start) -> Result<Self> {
        let Start {
            resume,
            fall_back,
            on_failure,
        } = start;
        let mut dp = Self::meet(&cfg)?;
        if let Some(on_failure) = on_failure {
            let liveness = std::time::Duration::from_secs(cfg.dist_liveness);
            dp.watch_failures(liveness, on_failure)?;
        }
        let start = Start {
            resume,
            fall_back,
            on_failure: None,
        };
        match Self::build(cfg, &start, dp) {
            Ok(t) => Ok(t),
            Err(failed) => {
                let (e, dp) = *failed;
                dp.announce_failure(&e);
                fault::hold_after_failure();
                Err(e)
            }
        }
    }

    /// Joins the other ranks (one process: nobody to meet). On CUDA the NVIDIA driver is checked
    /// against the torch build's CUDA first: a mismatch would otherwise surface as a CUDA error
    /// deep in the first step.
    fn meet(cfg: &TrainConfig) -> Result<DataParallel> {
        if cfg.device.trim().starts_with("cuda") {
            let first = std::env::var("RANK").map_or(true, |r| r.trim() == "0");
            if let Some(warning) = crate::driver::check(tch::Device::Cuda(0))? {
                if first {
                    eprintln!("rsd-train: warning: {warning}");
                }
            }
        }
        let options = model_options(cfg)?;
        DataParallel::from_env(cfg, options.device)
    }

    /// Where the ranks run: rank 0 says how many hosts hold how many ranks, and a
    /// context-parallel group spread over hosts (its K/V gathers, every layer, would cross the
    /// network) is refused unless the config allows it. Every rank reads the same host list, so
    /// all refuse together.
    fn check_placement(cfg: &TrainConfig, dp: &DataParallel) -> Result<()> {
        if dp.group().is_none() {
            return Ok(());
        }
        let placement = dp.mesh().placement()?;
        if dp.is_main() {
            eprintln!("rsd-train: placement: {}", placement.layout_line());
        }
        match placement.cp_across_hosts_message(cfg.cp_across_nodes) {
            None => Ok(()),
            Some(warning) if cfg.cp_across_nodes => {
                if dp.is_main() {
                    eprintln!("rsd-train: warning: {warning}");
                }
                Ok(())
            }
            Some(refusal) => Err(Error::Input(refusal)),
        }
    }

    /// [`Trainer::new`] once the ranks have met; an error comes back with the ranks' handle, to
    /// be announced.
    fn build(
        cfg: TrainConfig,
        start: &Start,
        dp: DataParallel,
    ) -> std::result::Result<Self, Box<(Error, DataParallel)>> {
        // Rank 0's process hosts the store the announcement goes through: the handle (and the
        // store with it) must outlive an error until it is announced.
        match Self::build_with(cfg, start, &dp) {
            Ok(assemble) => Ok(assemble(dp)),
            Err(e) => Err(Box::new((e, dp))),
        }
    }

    /// Everything but the ranks' handle, which the returned function moves into the trainer.
    fn build_with(
        mut cfg: TrainConfig,
        start: &Start,
        dp: &DataParallel,
    ) -> Result<impl FnOnce(DataParallel) -> Trainer> {
        Self::check_placement(&cfg, dp)?;
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
        let tokenizer_warnings = tokenizer::check(&cfg)?;
        fs::create_dir_all(&out).map_err(io_err(&out))?;
        let (tokenizer_dir, no_tokenizer) = tokenizer::tokenizer_files(&cfg, &out)?;
        if dp.is_main() {
            for w in tokenizer_warnings.iter().chain(&no_tokenizer) {
                eprintln!("warning: {w}");
            }
        }
        let StartingPoint {
            model,
            mut loader,
            resumed,
        } = starting_point(&cfg, options, start, dp)?;
        dp.broadcast_parameters(&model)?;
        measure::mark(Phase::Model);
        data::guard_vocabulary(&mut loader, model.config().vocab_size)?;
        data::check_loss_mask(&loader, cfg.objective)?;
        let seq_len = loader.seq_len();
        let accum = micro_batches_per_step(&cfg, seq_len)?;
        let local_accum = dp.local_accum(accum, &cfg, seq_len)?;
        if cfg.epochs > 0.0 {
            cfg.steps = steps_of_epochs(&cfg, &loader, accum, dp.is_main());
        }
        let schedule = Schedule {
            lr: cfg.lr,
            warmup: (cfg.warmup_ratio * cfg.steps as f64).round() as u64,
            total: cfg.steps,
            min_ratio: cfg.min_lr_ratio,
        };
        let mut opt = Optimizer::new(&model, &cfg, dp)?;
        measure::mark(Phase::Optimizer);
        let state = match resumed {
            Some((st, dir)) => {
                // Each rank verifies a share of the files against their checksums (already done
                // before loading when falling back was allowed).
                let loaded = checkpoint::read_manifest(&dir).and_then(|manifest| {
                    if !start.fall_back {
                        checkpoint::verify_checksums(&dir, &manifest, dp.rank(), dp.world())?;
                    }
                    opt.load(&dir, &manifest, st.step - st.skipped)
                });
                dp.all_ok("verifying the checkpoint and loading the optimizer", loaded)?;
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
        let heldout = if cfg.heldout_every > 0 {
            let vocab = model.config().vocab_size;
            let slice = heldout_slice(&cfg, &sampler, vocab, options.device)?;
            // Each rank evaluates every `world`-th micro-batch of the slice.
            let (rank, world) = (dp.rank(), dp.world());
            slice.into_iter().skip(rank).step_by(world).collect()
        } else {
            Vec::new()
        };
        Ok(move |dp| Trainer {
            cfg,
            model,
            opt,
            loader,
            seq_len,
            accum,
            local_accum,
            dp,
            state,
            sampler,
            step_opts,
            out,
            tokenizer_dir,
            heldout,
            job_end: None,
        })
    }

    /// Micro-batches per optimizer step (over all data-parallel ranks).
    pub fn accum(&self) -> usize {
        self.accum
    }

    /// Data-parallel ranks.
    pub fn ranks(&self) -> usize {
        self.dp.size()
    }

    /// Context-parallel ranks sharing each sequence.
    pub fn cp_size(&self) -> usize {
        self.dp.cp_size()
    }

    /// Whether this process is rank 0 (the one that logs and writes checkpoints).
    pub fn is_main(&self) -> bool {
        self.dp.is_main()
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Sequence length of the shards.
    pub fn seq_len(&self) -> u64 {
        self.seq_len
    }

    /// The handle this rank announces its own failure with, when [`Start::on_failure`] was
    /// given; `None` in a run of one process.
    pub fn failure_announcer(&self) -> Option<rsd_dist::Announcer> {
        self.dp.failure_announcer()
    }

    /// From now on the run stops with a checkpoint when the time left before `end` no longer
    /// holds its longest recent step, its last checkpoint's writing time and `end_margin_s`
    /// ([`crate::job_end`]). Only the main rank's clock counts (the ranks' decision at a step
    /// boundary takes any rank's stop as everyone's); `end_margin_s = 0` turns it off.
    pub fn stop_before(&mut self, end: JobEnd) {
        if !self.dp.is_main() || self.cfg.end_margin_s == 0 {
            return;
        }
        match end.seconds_left() {
            Some(left) => eprintln!(
                "rsd-train: the job ends in {:.0} s ({}): the run stops with a checkpoint when \
                 less than its longest step + a checkpoint + {} s (end_margin_s) remain",
                left.max(0.0),
                end.source,
                self.cfg.end_margin_s
            ),
            None => eprintln!(
                "rsd-train: the job's end time is read from {}: the run stops with a checkpoint \
                 when less than its longest step + a checkpoint + {} s (end_margin_s) remain",
                end.source, self.cfg.end_margin_s
            ),
        }
        // Read once: the bytes rank 0 writes at 100 MB/s (a slow shared filesystem).
        let save_estimate =
            checkpoint::rank0_bytes(&self.cfg, self.dp.size()).unwrap_or(0.0) / 100e6;
        self.job_end = Some((end, save_estimate));
    }

    /// Whether the job's end is too near for another step and the checkpoint after it (before
    /// this start has written a checkpoint, its writing time is the estimate).
    fn out_of_time(&self, run: &RunProgress) -> Option<String> {
        let (end, save_estimate) = self.job_end.as_ref()?;
        let left = end.seconds_left()?;
        let step = run.recent_steps.iter().copied().fold(0.0, f64::max);
        let save = run.save_s.unwrap_or(*save_estimate);
        let margin = self.cfg.end_margin_s as f64;
        crate::job_end::must_stop(left, step, save, margin).then(|| {
            format!(
                "{:.0} s left before the job's end time, less than the longest recent step \
                 ({step:.1} s) + a checkpoint ({save:.1} s{}) + end_margin_s ({margin:.0} s)",
                left.max(0.0),
                if run.save_s.is_some() {
                    ""
                } else {
                    ", estimated"
                }
            )
        })
    }

    /// Runs until `steps` (or `stop_at`, or `stop` is raised), checkpointing as configured. An
    /// error is announced to the other ranks before it is returned, so that ranks waiting for
    /// this one in a collective stop too ([`Start::on_failure`]); a run that ends without
    /// one leaves the watch, so that its silence from now on is not taken for a failure.
    pub fn run(&mut self, stop: Arc<AtomicBool>) -> Result<Summary> {
        let result = self.run_steps(stop);
        match &result {
            Ok(_) => self.dp.leave(),
            Err(e) => {
                self.dp.announce_failure(e);
                fault::hold_after_failure();
            }
        }
        result
    }

    /// The ranks' one decision at a step boundary, whichever rank saw a signal, is out of time
    /// before the job's end, or whose clock says a checkpoint is due ([`Boundary`]): all stop
    /// (true), or all write a checkpoint of this step first (`save_every_minutes` since
    /// `saved_at`, the last save's time and step) and decide again (a signal that came while it
    /// was written stops the run here, not a step later), or all go on.
    fn at_boundary(
        &self,
        stop: &AtomicBool,
        saved_at: &mut (Instant, u64),
        run: &mut RunProgress,
    ) -> Result<bool> {
        loop {
            let due = self.cfg.save_every_minutes > 0.0
                && saved_at.1 != self.state.step
                && saved_at.0.elapsed().as_secs_f64() >= self.cfg.save_every_minutes * 60.0;
            let late = match stop.load(Ordering::SeqCst) {
                true => None,
                false => self.out_of_time(run),
            };
            let wish = match (stop.load(Ordering::SeqCst) || late.is_some(), due) {
                (true, _) => Boundary::Stop,
                (false, true) => Boundary::Save,
                (false, false) => Boundary::Go,
            };
            match self.dp.most(wish as i64)? {
                n if n == Boundary::Stop as i64 => {
                    if let Some(why) = late {
                        eprintln!("rsd-train: {why}: stopping at step {}", self.state.step);
                        run.out_of_time = true;
                    }
                    run.interrupted = true;
                    run.signalled = true;
                    return Ok(true);
                }
                n if n == Boundary::Save as i64 => {
                    run.checkpoint = self.save_timed(run)?;
                    *saved_at = (Instant::now(), self.state.step);
                }
                _ => return Ok(false),
            }
        }
    }

    /// After a step: its time kept for the job-end check, and the checkpoint `save_every` asks
    /// for.
    fn after_step(
        &self,
        step_s: f64,
        run: &mut RunProgress,
        saved_at: &mut (Instant, u64),
    ) -> Result<()> {
        if run.recent_steps.len() == RECENT_STEPS {
            run.recent_steps.pop_front();
        }
        run.recent_steps.push_back(step_s);
        if self.cfg.save_every > 0 && self.state.step.is_multiple_of(self.cfg.save_every) {
            run.checkpoint = self.save_timed(run)?;
            *saved_at = (Instant::now(), self.state.step);
        }
        Ok(())
    }

    /// [`Trainer::save`], its wall time kept for the job-end check.
    fn save_timed(&self, run: &mut RunProgress) -> Result<Option<PathBuf>> {
        let t = Instant::now();
        let saved = self.save()?;
        run.save_s = Some(t.elapsed().as_secs_f64());
        Ok(saved)
    }

    fn run_steps(&mut self, stop: Arc<AtomicBool>) -> Result<Summary> {
        let t0 = Instant::now();
        let elapsed0 = self.state.elapsed_s;
        let end = match self.cfg.stop_at {
            0 => self.cfg.steps,
            n => n.min(self.cfg.steps),
        };
        let mut log = StepLog::open(
            &self.out,
            end,
            self.state.step,
            self.cfg.progress,
            self.dp.is_main(),
        )?;
        let mut run = RunProgress::default();
        // Time-based checkpoints count from the start of this invocation or the last save.
        let mut saved_at = (Instant::now(), self.state.step);
        let mut profiled = Vec::new();
        if self.cfg.profile {
            crate::profile::start(self.model.options().device)?;
        }
        while self.state.step < end {
            // The step's traffic: from this decision to the update's (held-out evaluation apart).
            let comm0 = self.dp.comm_stats();
            fault::hold_at(self.state.step + 1, &stop);
            fault::signal_at(self.state.step + 1, self.dp.rank(), &stop);
            if self.at_boundary(&stop, &mut saved_at, &mut run)? {
                break;
            }
            if fault::fail_rank(self.dp.rank()) {
                return Err(Error::Input(format!(
                    "fault injection: rank {} fails at step {}",
                    self.dp.rank(),
                    self.state.step + 1
                )));
            }
            let started = Instant::now();
            let (mbs, norm, tokens) = self.step_data()?;
            let losses = self.forward_backward(&mbs, norm)?;
            if fault::step_fails(self.dp.rank()) {
                return Err(Error::Input(format!(
                    "fault injection: rank {} fails inside step {}",
                    self.dp.rank(),
                    self.state.step + 1
                )));
            }
            measure::mark(Phase::Backward);
            timed("reduce", || {
                self.opt.reduce_gradients(&self.dp, &self.model)
            })?;
            measure::mark(Phase::Reduced);
            let lr = self.state.schedule.lr(self.state.step);
            let (grad_norm, skipped) = self.optimize(&losses, lr, &mut run, &log)?;
            measure::mark(Phase::Updated);
            self.advance(tokens);
            fault::slow_step();
            // Profiled, the step ends when its device work does (reading the clock waits for it).
            let times = self.cfg.profile.then(crate::profile::take).transpose()?;
            let step_s = started.elapsed().as_secs_f64();
            let phases = times.map(|t| crate::profile::step_phases(&t, step_s));
            if let Some(p) = &phases {
                profiled.push((step_s, p.clone()));
            }
            let comm = self.dp.comm_stats();
            let (heldout_clm, view_gap) = self.evaluate_heldout()?;
            log.record(&StepRecord {
                step: self.state.step,
                loss: losses.total,
                clm: losses.clm,
                kl: losses.kl,
                clm_pert: losses.clm_pert,
                lr,
                grad_norm,
                tokens,
                tokens_per_s: tokens as f64 / step_s.max(1e-9),
                step_s,
                peak_rss: Memory::now().peak_rss,
                device_peak_reserved: device_peak_reserved(self.model.options().device),
                comm_bytes: comm.bytes - comm0.bytes,
                comm_s: comm.seconds - comm0.seconds,
                skipped,
                heldout_clm,
                view_gap,
                phases,
            })?;
            run.losses.push(losses.total);
            self.state.elapsed_s = elapsed0 + t0.elapsed().as_secs_f64();
            self.after_step(step_s, &mut run, &mut saved_at)?;
        }
        log.finish();
        if !profiled.is_empty() && self.dp.is_main() {
            eprint!("{}", crate::profile::table(&profiled));
        }
        run.interrupted |= self.state.step < self.cfg.steps;
        self.state.elapsed_s = elapsed0 + t0.elapsed().as_secs_f64();
        self.finish(run, log.path, t0)
    }

    /// `(heldout_clm, view_gap)` on the held-out slice when this step is one of every
    /// `heldout_every`. Every rank evaluates its share of the slice (the model is whole on every
    /// rank) and one all-reduce of four numbers combines them, so all ranks get the same values
    /// and none waits for rank 0 alone.
    fn evaluate_heldout(&self) -> Result<(Option<f64>, Option<f64>)> {
        let every = self.cfg.heldout_every;
        if every == 0 || !self.state.step.is_multiple_of(every) {
            return Ok((None, None));
        }
        // The share's sums: its means times their normalisers (as `Sums::values` divides).
        let mine = if self.heldout.is_empty() {
            [0.0; 4]
        } else {
            let (clm, gap) = crate::step::evaluate(&self.model, &self.heldout, &self.step_opts)?;
            let norm = LossNormalizers::of_iter(self.heldout.iter().map(|(mb, _)| mb));
            let (tokens, samples) = (norm.label_tokens.max(1.0), norm.samples.max(1.0));
            [clm * tokens, gap * samples, norm.label_tokens, norm.samples]
        };
        let all = self.dp.sum_values(&mine)?;
        Ok((
            Some(all[0] / all[2].max(1.0)),
            Some(all[1] / all[3].max(1.0)),
        ))
    }

    /// The step's micro-batches and the normalisers summed over the ranks. A rank whose data
    /// fails to read still takes part in the step's first collective, with a NaN normaliser:
    /// every rank learns of it there and stops at once, instead of waiting in that collective
    /// until its timeout; the payload is the step's own.
    #[allow(clippy::type_complexity)]
    fn step_data(&mut self) -> Result<(Vec<(Vec<usize>, MicroBatch)>, LossNormalizers, u64)> {
        let data = timed("data", || match fault::data_fails(self.dp.rank()) {
            true => Err(Error::Input(format!(
                "fault injection: rank {} fails to read its data",
                self.dp.rank()
            ))),
            false => self.next_micro_batches(),
        });
        let (mbs, local_tokens, failed) = match data {
            Ok((mbs, tokens)) => (mbs, tokens, None),
            Err(e) => (Vec::new(), 0, Some(e)),
        };
        let mut local = LossNormalizers::of_iter(mbs.iter().map(|(_, m)| m));
        if self.dp.cp().is_some_and(|cp| cp.rank() != 0) {
            // The ranks of a context-parallel group hold the same samples: count them once.
            local.samples = 0.0;
        }
        if failed.is_some() {
            local.label_tokens = f64::NAN;
        }
        let (norm, tokens) = self.dp.global_normalizers(local, local_tokens)?;
        if let Some(e) = failed {
            return Err(e);
        }
        if norm.label_tokens.is_nan() {
            return Err(Error::Input(format!(
                "reading step {}'s data failed on another rank (its own message says why); \
                 every rank stops",
                self.state.step + 1
            )));
        }
        Ok((mbs, norm, tokens))
    }

    /// This rank's data of the step: its `accum / ranks` loader batches, as micro-batches on the
    /// device, each with the indices of its rows in the step's global batch; and the tokens it
    /// counts for the log ([`counted_tokens`]).
    #[allow(clippy::type_complexity)]
    fn next_micro_batches(&mut self) -> Result<(Vec<(Vec<usize>, MicroBatch)>, u64)> {
        let device = self.model.options().device;
        let mut mbs = Vec::new();
        let mut tokens = 0u64;
        for k in 0..self.local_accum {
            let batch = self
                .loader
                .next()
                .ok_or_else(|| Error::Input("the loader ran out of data".into()))??;
            let rows = batch.row_offsets.len().saturating_sub(1);
            let cp = self.dp.cp().is_some();
            tokens += counted_tokens(&batch, self.dp.cp().map(|c| c.rank()));
            for (first, mb) in data::micro_batches(&batch, self.cfg.doc_mask, cp, device)? {
                let global = (first..first + mb.rows())
                    .map(|j| self.dp.global_row(k, j, rows))
                    .collect();
                mbs.push((global, mb));
            }
        }
        Ok((mbs, tokens))
    }

    /// Forward and backward of every micro-batch with the step's (global) normalisers; the
    /// parameters' gradients hold this rank's share of the step's gradient afterwards, and the
    /// losses are the global batch's.
    fn forward_backward(
        &self,
        mbs: &[(Vec<usize>, MicroBatch)],
        norm: LossNormalizers,
    ) -> Result<StepLosses> {
        let mut sums = Sums::new(self.model.options().device);
        let cp = self.dp.cp();
        // Sharded, each micro-batch's gradients are reduce-scattered and freed part by part as
        // the checkpointed backward completes them, the rest when its backward is over.
        let on_grads = |part: GradsDone| self.opt.grads_done(&self.dp, part);
        // Agreed before the first reduction, so every rank's collectives pair up.
        let rounds = self.opt.rounds(&self.dp, mbs.len())?;
        for (rows, mb) in mbs {
            let views = if self.step_opts.objective.needs_perturbed() {
                Some(self.views(rows, mb)?)
            } else {
                None
            };
            // Under context parallelism `views` are the whole rows'; the step reads this rank's
            // parts of them, and the whole rows for the re-sharded perturbed suffix.
            let (views, cp_batch) = match cp {
                Some(cp) => {
                    // The perturbed suffix and LongCE's short contexts read the whole rows.
                    let batch = if views.is_some() || self.step_opts.long_ce.is_some() {
                        CpBatch::gather(cp, &mb.tokens, views)?
                    } else {
                        CpBatch::from_whole(cp, Vec::new(), None)
                    };
                    (batch.local_views()?, Some(batch))
                }
                None => (views, None),
            };
            let extras = StepExtras {
                cp_batch: cp_batch.as_ref(),
                draws: None,
                on_grads: Some(&on_grads),
            };
            step_micro(
                &self.model,
                mb,
                views.as_deref(),
                &self.step_opts,
                norm,
                &mut sums,
                extras,
            )?;
            self.opt.micro_batch_done(&self.dp)?;
        }
        // A rank with fewer micro-batches (rows of other lengths split differently) reduces
        // zeros while the others reduce their last ones.
        for _ in mbs.len()..rounds {
            self.opt.micro_batch_done(&self.dp)?;
        }
        self.dp.reduce_sums(&mut sums)?;
        let (clm, kl, clm_pert) = sums.values(norm);
        let total = match self.step_opts.objective {
            Objective::Rsd => clm + self.cfg.lambda * kl,
            Objective::TwoViewClm => clm + self.cfg.lambda * clm_pert,
            _ => clm,
        };
        Ok(StepLosses {
            total,
            clm,
            kl,
            clm_pert,
        })
    }

    /// The perturbed views of a micro-batch's rows (`rows`: their indices in the global batch).
    /// Under context parallelism the perturbation is drawn for the whole sequence (gathered from
    /// the group's chunks): the views are the whole rows'.
    fn views(&self, rows: &[usize], mb: &MicroBatch) -> Result<Vec<RowView>> {
        let (seed, step) = (self.cfg.seed, self.state.step);
        let Some(cp) = self.dp.cp() else {
            return Ok(sample_views_of_rows(&self.sampler, seed, step, rows, mb));
        };
        let full = cp.full_rows(&mb.positions)?;
        // Under context parallelism the micro-batch's document boundaries are the whole rows'.
        Ok(views_at(
            &self.sampler,
            seed,
            step,
            rows,
            &full,
            &mb.real_len,
            mb.doc_bounds.as_deref(),
        ))
    }

    /// The global gradient norm of this step (the gradients are already summed over ranks, so
    /// every rank computes the same value).
    fn grad_norm(&self) -> Result<f64> {
        let gn = self.opt.grad_norm(&self.dp, &self.model)?;
        Ok(if fault::nan_gradient_at(self.state.step + 1) {
            f64::NAN
        } else {
            gn
        })
    }

    /// The update of one step, timed as the `optimizer` phase: the gradient norm, then clipping
    /// and AdamW when the loss and the norm are finite ([`Trainer::update_if_finite`]), and the
    /// gradients zeroed. Returns the norm and whether the update was skipped.
    fn optimize(
        &mut self,
        losses: &StepLosses,
        lr: f64,
        run: &mut RunProgress,
        log: &StepLog,
    ) -> Result<(f64, bool)> {
        let _optimizer = phases::Phase::begin("optimizer");
        let grad_norm = timed("gradient norm", || self.grad_norm())?;
        let skipped = !self.update_if_finite(losses, grad_norm, lr, run, log)?;
        self.opt.zero_grad(&self.model)?;
        Ok((grad_norm, skipped))
    }

    /// Clips and applies the update when the loss and gradient norm are finite, and returns
    /// `true`. Otherwise skips it (returning `false`) or stops with an error, as configured.
    fn update_if_finite(
        &mut self,
        losses: &StepLosses,
        grad_norm: f64,
        lr: f64,
        run: &mut RunProgress,
        log: &StepLog,
    ) -> Result<bool> {
        let loss = losses.total;
        // Loss and norm come from values summed over ranks, so the ranks agree already; asking
        // them keeps one decision for all even if a reduction ever differed in its last bit.
        if !self.dp.any(!(loss.is_finite() && grad_norm.is_finite()))? {
            run.consecutive_skips = 0;
            self.opt
                .step(&self.dp, &self.model, lr, grad_norm, self.cfg.clip)?;
            return Ok(true);
        }
        let step = self.state.step + 1;
        let (what, value) = if loss.is_finite() {
            ("gradient norm", grad_norm)
        } else {
            ("loss", loss)
        };
        if self.cfg.on_nonfinite == OnNonFinite::Stop
            || run.consecutive_skips + 1 > self.cfg.max_skips
        {
            log.abandon();
            return Err(Error::NonFinite { what, step, value });
        }
        run.consecutive_skips += 1;
        self.state.skipped += 1;
        log.note(format!(
            "step {step}: non-finite {what} ({value}); update skipped"
        ));
        Ok(false)
    }

    /// Counts the step done: step, tokens and the loader's position.
    fn advance(&mut self, tokens: u64) {
        self.state.step += 1;
        self.state.tokens += tokens;
        self.state.loader = self.loader.state();
    }

    /// Writes a checkpoint: every rank of a sharded run its optimizer blocks, rank 0 the model,
    /// the state and, after a barrier, the manifest, then renames it into place; the others wait
    /// until it is complete, so none runs ahead and a kill after this point finds it whole. Its
    /// path on rank 0.
    fn save(&self) -> Result<Option<PathBuf>> {
        self.dp.checkpoint_phase(|| self.save_now())
    }

    /// [`Trainer::save`]'s phases.
    fn save_now(&self) -> Result<Option<PathBuf>> {
        let step = self.state.step;
        let rank = self.dp.rank();
        // Every rank writes into rank 0's temporary directory (a filesystem all ranks share).
        let pid = match self.dp.group() {
            Some(g) => {
                let mut t = Tensor::from_slice(&[if self.dp.is_main() {
                    i64::from(std::process::id())
                } else {
                    0
                }]);
                g.all_reduce(&mut t, rsd_dist::ReduceOp::Max)?;
                t.f_int64_value(&[0])? as u32
            }
            None => std::process::id(),
        };
        let tmp = checkpoint::temp_dir_for(&self.out, step, pid);
        let mut cleanup = checkpoint::RemoveOnDrop(None);
        // Each phase ends with every rank learning whether it held on all (DataParallel::all_ok,
        // which also waits for all as a barrier would): a rank that fails to write stops every
        // rank at once, not after the others' collective timeout.
        let created = match self.dp.is_main() {
            true => checkpoint::create_temp(&tmp).map(|()| cleanup.0 = Some(tmp.clone())),
            false => Ok(()),
        };
        self.dp
            .all_ok("creating the checkpoint's directory", created)?;
        let files = self.opt.save_shards(&self.dp, &tmp, step)?;
        let written = match self.dp.is_main() {
            true => checkpoint::write_main(
                &tmp,
                &self.model,
                self.opt.replicated_state().as_deref(),
                &self.state,
                &self.cfg,
                self.tokenizer_dir.as_deref(),
            )
            .map(|()| checkpoint::die_at("main", step, rank)),
            false => Ok(()),
        };
        // Every rank's file is written and fsynced before the manifest names it.
        self.dp
            .all_ok("writing the checkpoint's model and state", written)?;
        let published = match self.dp.is_main() {
            true => {
                let manifest = Manifest {
                    version: checkpoint::MANIFEST_VERSION,
                    world: self.dp.world(),
                    dp: self.dp.size(),
                    cp: self.dp.cp_size(),
                    optimizer: self.opt.layout(),
                    files,
                };
                checkpoint::publish(&self.out, &tmp, step, manifest, self.cfg.keep).map(Some)
            }
            false => Ok(None),
        };
        let path = self.dp.all_ok("publishing the checkpoint", published)?;
        if path.is_some() {
            cleanup.0 = None;
        }
        checkpoint::die_at("after", step, rank);
        Ok(path)
    }

    /// Leaves a checkpoint of where the run is, the final model of a complete run, and
    /// `summary.json`.
    fn finish(&mut self, run: RunProgress, metrics: PathBuf, t0: Instant) -> Result<Summary> {
        let (first_loss_mean, last_loss_mean, loss_window) = loss_means(&run.losses);
        // Leave a checkpoint of where we are (unless the last one is exactly this step, or the
        // run saves nothing at its end). Rank 0 decides, so every rank takes part in the same
        // barriers.
        // A run stopped early (a signal, `stop_at`) that checkpoints as it goes saves where it
        // stopped even when it saves nothing at its end.
        let saves = self.cfg.save_at_end
            || (run.interrupted && (self.cfg.save_every > 0 || self.cfg.save_every_minutes > 0.0));
        let due = self.dp.is_main()
            && saves
            && !matches!(checkpoint::list(&self.out).pop(), Some((step, _)) if step == self.state.step);
        let checkpoint = if self.dp.any(due)? {
            self.save()?
        } else {
            run.checkpoint
                .or_else(|| checkpoint::list(&self.out).pop().map(|(_, p)| p))
        };
        // Rank 0 writes checkpoints and says whether one holds this step; a run that has not
        // stepped since its start (or has never stepped) loses nothing either way.
        let held = run.losses.is_empty()
            || self.state.step == 0
            || matches!(checkpoint::list(&self.out).pop(), Some((step, _)) if step == self.state.step);
        let checkpointed = !self.dp.any(self.dp.is_main() && !held)?;
        if !self.dp.is_main() {
            // Wait for rank 0's final model and summary, so the run ends complete everywhere.
            self.dp.checkpoint_phase(|| self.dp.barrier())?;
            return Ok(Summary {
                steps: self.state.step,
                tokens: self.state.tokens,
                first_loss: run.losses.first().copied(),
                last_loss: run.losses.last().copied(),
                first_loss_mean,
                last_loss_mean,
                loss_window,
                interrupted: run.interrupted,
                signalled: run.signalled,
                out_of_time: run.out_of_time,
                checkpointed,
                checkpoint: None,
                final_model: None,
                metrics,
                wall_s: t0.elapsed().as_secs_f64(),
                skipped: self.state.skipped,
            });
        }
        let final_model = if run.interrupted || !self.cfg.save_at_end {
            None
        } else {
            let dir = self.out.join("model");
            self.model.save(
                &dir,
                &rsd_model::SaveOptions {
                    overwrite: true,
                    tokenizer_from: self.tokenizer_dir.clone(),
                    ..Default::default()
                },
            )?;
            crate::checkpoint::write_training_record(&dir, &self.cfg, self.state.step)?;
            Some(dir)
        };
        let summary = Summary {
            steps: self.state.step,
            tokens: self.state.tokens,
            first_loss: run.losses.first().copied(),
            last_loss: run.losses.last().copied(),
            first_loss_mean,
            last_loss_mean,
            loss_window,
            interrupted: run.interrupted,
            signalled: run.signalled,
            out_of_time: run.out_of_time,
            checkpointed,
            checkpoint,
            final_model,
            metrics,
            wall_s: t0.elapsed().as_secs_f64(),
            skipped: self.state.skipped,
        };
        let sp = self.out.join("summary.json");
        let text =
            serde_json::to_string_pretty(&summary).map_err(|e| Error::Input(e.to_string()))?;
        // Written under a new name and renamed: a link planted at the name is replaced, never
        // written through.
        rsd_common::safe_fs::write_file_atomic(&sp, text.as_bytes())?;
        self.dp.checkpoint_phase(|| self.dp.barrier())?;
        Ok(summary)
    }
}

/// On CUDA, the most the caching allocator has held from the device so far.
fn device_peak_reserved(device: tch::Device) -> Option<u64> {
    match device {
        tch::Device::Cuda(n) => rsd_model::alloc::cuda_memory(n).map(|m| m.peak_reserved),
        _ => None,
    }
}

/// The tokens a rank counts of a loader batch for the log: every row's stored length (what one
/// process holds). Under context parallelism (`cp_rank`: this rank's place in its group) the
/// rows are counted once, by the group's rank 0, without the padding that makes them a multiple
/// of 2·cp.
fn counted_tokens(batch: &rsd_loader::Batch, cp_rank: Option<usize>) -> u64 {
    let ro = &batch.row_offsets;
    let local = || ro.windows(2).map(|w| u64::from(w[1] - w[0])).sum::<u64>();
    match cp_rank {
        None => local(),
        Some(0) => {
            let fro = &batch.full_row_offsets;
            if batch.row_meta.len() + 1 == fro.len() {
                fro.windows(2)
                    .zip(&batch.row_meta)
                    .map(|(w, m)| u64::from(w[1] - w[0]) - u64::from(m.cp_pad))
                    .sum()
            } else {
                fro.windows(2).map(|w| u64::from(w[1] - w[0])).sum()
            }
        }
        Some(_) => 0,
    }
}

/// The loss terms of one optimizer step (normalised).
struct StepLosses {
    total: f64,
    clm: f64,
    kl: f64,
    clm_pert: f64,
}

/// The mean of the first and of the last `w` losses, and `w`: a tenth of them, in 1..=50.
fn loss_means(losses: &[f64]) -> (Option<f64>, Option<f64>, usize) {
    let w = (losses.len() / 10).clamp(1, 50);
    if losses.is_empty() {
        return (None, None, w);
    }
    let w = w.min(losses.len());
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len() as f64;
    (
        Some(mean(&losses[..w])),
        Some(mean(&losses[losses.len() - w..])),
        w,
    )
}

/// What [`Trainer::run`] tracks across steps of this invocation.
#[derive(Default)]
struct RunProgress {
    /// Every step's loss, for the summary's first, last and mean losses.
    losses: Vec<f64>,
    /// Updates skipped in a row (non-finite values), against `max_skips`.
    consecutive_skips: u64,
    /// The newest checkpoint written.
    checkpoint: Option<PathBuf>,
    interrupted: bool,
    /// Stopped by a signal (any rank's) or before the job's end time.
    signalled: bool,
    /// Stopped because the job's end time was near (rank 0's decision).
    out_of_time: bool,
    /// The last [`RECENT_STEPS`] steps' wall times, for the job-end check.
    recent_steps: std::collections::VecDeque<f64>,
    /// The last checkpoint's wall time in this invocation.
    save_s: Option<f64>,
}

/// Steps whose longest time the job-end check allows for: recent enough to follow a run whose
/// steps slow down, long enough to cover a held-out evaluation every few steps.
const RECENT_STEPS: usize = 16;

/// Where each step is reported: a line of `metrics.jsonl`, and a progress bar (or, when stderr is
/// not a terminal, a line every 5% of the run).
struct StepLog {
    path: PathBuf,
    /// `None` on ranks other than 0.
    file: Option<File>,
    bar: ProgressBar,
    end: u64,
    progress: bool,
    /// Elapsed time and the time left, for the lines.
    lines: ProgressLines,
}

/// `x` with 4 significant digits (`1.234e-5`, `0.1234`, `2.345`).
fn sig(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-3..1e4).contains(&x.abs()) {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

impl StepLog {
    /// The log of rank 0 (`main`); other ranks' log writes and shows nothing.
    fn open(out: &Path, end: u64, step: u64, progress: bool, main: bool) -> Result<Self> {
        let path = out.join("metrics.jsonl");
        let progress = progress && main;
        // A link planted at the log's name is refused, not appended through.
        let file = match main {
            true => Some(rsd_common::safe_fs::open_append(&path)?),
            false => None,
        };
        let bar = if progress {
            ProgressBar::with_draw_target(Some(end), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise} < {eta}]")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_position(step);
        Ok(StepLog {
            path,
            file,
            bar,
            end,
            progress,
            lines: ProgressLines::new("steps", end, step, std::time::Duration::ZERO),
        })
    }

    fn record(&mut self, rec: &StepRecord) -> Result<()> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        let line = serde_json::to_string(rec).map_err(|e| Error::Input(e.to_string()))?;
        writeln!(file, "{line}").map_err(io_err(&self.path))?;
        let StepRecord {
            step,
            loss,
            clm,
            kl,
            lr,
            grad_norm,
            tokens_per_s,
            ..
        } = *rec;
        self.bar.set_position(step);
        // Significant digits: the KL of a run whose views agree is 1e-5, not 0.0000.
        let (loss, clm, kl) = (sig(loss), sig(clm), sig(kl));
        self.bar.set_message(format!(
            "loss {loss} clm {clm} kl {kl} {tokens_per_s:.0} tok/s"
        ));
        if self.bar.is_hidden() && self.progress {
            let end = self.end;
            let every = (end / 20).max(1);
            if step.is_multiple_of(every) || step == end {
                eprintln!(
                    "step {step}/{end} loss {loss} clm {clm} kl {kl} lr {lr:.3e} |g| \
                     {grad_norm:.3} {tokens_per_s:.0} tok/s; {}",
                    self.lines.line(step)
                );
            }
        }
        Ok(())
    }

    /// A message above the progress bar.
    fn note(&self, msg: String) {
        self.bar.println(msg);
    }

    /// Leaves the bar as it is (the run stops with an error).
    fn abandon(&self) {
        self.bar.abandon();
    }

    fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

/// What the ranks decide together at a step boundary; the most any rank asks for wins.
#[derive(Clone, Copy)]
enum Boundary {
    /// Run the next step.
    Go = 0,
    /// Write a checkpoint first (`save_every_minutes`).
    Save = 1,
    /// Stop here (a signal): the run's end writes the checkpoint.
    Stop = 2,
}

/// Test hooks, compiled only with the `fault-injection` feature (tests/test_train_loop.py).
mod fault {
    use std::sync::atomic::AtomicBool;

    /// `RSD_TRAIN_FAULT_SIGNAL_AT=STEP:RANK:SIG` (SIG `TERM`, `USR1` or `INT`): rank RANK sends
    /// itself the signal as step STEP begins, and waits until its handler has set the stop flag,
    /// so the test knows at which boundary it arrived.
    #[cfg(feature = "fault-injection")]
    pub fn signal_at(step: u64, rank: usize, stop: &AtomicBool) {
        let Ok(spec) = std::env::var("RSD_TRAIN_FAULT_SIGNAL_AT") else {
            return;
        };
        let want: Vec<&str> = spec.split(':').collect();
        let [s, r, sig] = want.as_slice() else { return };
        if *s != step.to_string() || *r != rank.to_string() {
            return;
        }
        let sig = match *sig {
            "TERM" => libc::SIGTERM,
            "USR1" => libc::SIGUSR1,
            "INT" => libc::SIGINT,
            _ => return,
        };
        // SAFETY: raise(3) signals this process; the handler thread sets the flag.
        unsafe { libc::raise(sig) };
        // However long the handler thread takes to run on a loaded machine (the test's own
        // timeout guards against a hang).
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn signal_at(_step: u64, _rank: usize, _stop: &AtomicBool) {}

    /// `RSD_TRAIN_FAULT_HOLD_AT=STEP:PATH`: every rank waits before step STEP until PATH exists
    /// (or a signal stops the run), so that a test can keep a run going until the event it waits
    /// for has happened, however fast the machine trains.
    #[cfg(feature = "fault-injection")]
    pub fn hold_at(step: u64, stop: &AtomicBool) {
        let Ok(spec) = std::env::var("RSD_TRAIN_FAULT_HOLD_AT") else {
            return;
        };
        let Some((s, path)) = spec.split_once(':') else {
            return;
        };
        if s != step.to_string() {
            return;
        }
        while !std::path::Path::new(path).exists()
            && !stop.load(std::sync::atomic::Ordering::SeqCst)
        {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn hold_at(_step: u64, _stop: &AtomicBool) {}

    /// `RSD_TRAIN_FAULT_STEP_SLEEP_S=X`: every step takes X seconds more, as a large model's
    /// does: a floor under a step's time, so that a test of a time limit knows the run cannot
    /// finish before it, however fast the machine.
    #[cfg(feature = "fault-injection")]
    pub fn slow_step() {
        if let Some(s) = std::env::var("RSD_TRAIN_FAULT_STEP_SLEEP_S")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_secs_f64(s.max(0.0)));
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn slow_step() {}

    /// `RSD_TRAIN_FAULT_FREEZE_LOAD_RANK=K`: rank K stops itself (SIGSTOP) while it loads the
    /// model or checkpoint, its connections open, as a rank frozen or on a lost node looks to the
    /// others before its first step.
    #[cfg(feature = "fault-injection")]
    pub fn freeze_while_loading(rank: usize) {
        if rank_named("RSD_TRAIN_FAULT_FREEZE_LOAD_RANK", rank) {
            eprintln!("fault injection: rank {rank} freezes while loading");
            // SAFETY: stops this process until a SIGCONT (or SIGKILL).
            unsafe { libc::raise(libc::SIGSTOP) };
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn freeze_while_loading(_rank: usize) {}

    /// `RSD_TRAIN_FAULT_NAN_AT_STEP=N`: step N's gradient norm reads as NaN.
    #[cfg(feature = "fault-injection")]
    pub fn nan_gradient_at(step: u64) -> bool {
        std::env::var("RSD_TRAIN_FAULT_NAN_AT_STEP")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            == Some(step)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn nan_gradient_at(_step: u64) -> bool {
        false
    }

    /// `RSD_TRAIN_FAULT_FAIL_RANK=K`: data-parallel rank K fails before its first step.
    #[cfg(feature = "fault-injection")]
    pub fn fail_rank(rank: usize) -> bool {
        std::env::var("RSD_TRAIN_FAULT_FAIL_RANK")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn fail_rank(_rank: usize) -> bool {
        false
    }

    /// `RSD_TRAIN_FAULT_OLDER_CHECKPOINT_RANK=K`: rank K resumes the checkpoint before the one it
    /// was given, as a host whose view of a shared run directory lags would.
    #[cfg(feature = "fault-injection")]
    pub fn older_checkpoint(rank: usize) -> bool {
        rank_named("RSD_TRAIN_FAULT_OLDER_CHECKPOINT_RANK", rank)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn older_checkpoint(_rank: usize) -> bool {
        false
    }

    /// `RSD_TRAIN_FAULT_LOAD_FAIL_RANK=K`: rank K fails to load the checkpoint.
    #[cfg(feature = "fault-injection")]
    pub fn load_fails(rank: usize) -> bool {
        rank_named("RSD_TRAIN_FAULT_LOAD_FAIL_RANK", rank)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn load_fails(_rank: usize) -> bool {
        false
    }

    /// `RSD_TRAIN_FAULT_DATA_FAIL_RANK=K`: rank K fails to read its first step's data.
    #[cfg(feature = "fault-injection")]
    pub fn data_fails(rank: usize) -> bool {
        rank_named("RSD_TRAIN_FAULT_DATA_FAIL_RANK", rank)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn data_fails(_rank: usize) -> bool {
        false
    }

    /// `RSD_TRAIN_FAULT_STEP_FAIL_RANK=K`: rank K fails inside its first step, after its
    /// backward, while the others wait for it in the gradients' reduction.
    #[cfg(feature = "fault-injection")]
    pub fn step_fails(rank: usize) -> bool {
        rank_named("RSD_TRAIN_FAULT_STEP_FAIL_RANK", rank)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn step_fails(_rank: usize) -> bool {
        false
    }

    /// `RSD_TRAIN_FAULT_HOLD_S=N`: a rank whose run failed stays alive N seconds after announcing
    /// it, its connections open, as an NCCL peer's failure looks to the others (they hear of it
    /// only through the store).
    #[cfg(feature = "fault-injection")]
    pub fn hold_after_failure() {
        if let Some(s) = std::env::var("RSD_TRAIN_FAULT_HOLD_S")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_secs(s));
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn hold_after_failure() {}

    #[cfg(feature = "fault-injection")]
    fn rank_named(var: &str, rank: usize) -> bool {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            == Some(rank)
    }
}

#[cfg(test)]
mod tests {
    use super::{local_gpu, loss_means};

    #[test]
    fn a_rank_gets_its_node_gpu_or_the_one_its_task_sees() {
        use tch::Device::Cuda;
        // torchrun: every GPU of the node visible, one rank per GPU.
        for local in 0..8 {
            assert_eq!(local_gpu(local, 8).unwrap(), Cuda(local));
        }
        // SLURM --gpus-per-task=1: each task sees its one GPU, whatever its local rank.
        for local in 0..8 {
            assert_eq!(local_gpu(local, 1).unwrap(), Cuda(0));
        }
        // More ranks than GPUs, or none: errors that say what to change.
        let err = local_gpu(4, 4).unwrap_err().to_string();
        assert!(
            err.contains("local rank 4") && err.contains("sees 4 GPUs"),
            "{err}"
        );
        assert!(
            err.contains("--gpus-per-task=1") && err.contains("cuda:N"),
            "{err}"
        );
        let err = local_gpu(0, 0).unwrap_err().to_string();
        assert!(err.contains("no CUDA device"), "{err}");
    }

    #[test]
    fn loss_means_average_a_tenth_of_the_steps_at_each_end() {
        assert_eq!(loss_means(&[]), (None, None, 1));
        assert_eq!(loss_means(&[3.0]), (Some(3.0), Some(3.0), 1));
        // 40 steps: windows of 4
        let losses: Vec<f64> = (0..40).map(|i| i as f64).collect();
        assert_eq!(loss_means(&losses), (Some(1.5), Some(37.5), 4));
        // at most 50 steps a window
        let long: Vec<f64> = (0..1000).map(|i| i as f64).collect();
        assert_eq!(loss_means(&long), (Some(24.5), Some(974.5), 50));
    }
}
