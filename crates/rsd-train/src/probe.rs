//! One batch through the training step, nothing updated: the loss terms, the gradient norm and the
//! step time, for comparisons with an independent implementation (tests/test_train.py) and for
//! measuring the cost of a step (`rsd-train probe`).
//!
//! A [`ProbeRequest`] mirrors the probe's command-line flags; [`run`] reads the tokens, derives
//! labels (the next token; the last position of a row has none), positions (`0..L`, or restarting
//! at each document) and one perturbation per row, runs [`step_micro`] (or the slow
//! [`reference_loss`]) and returns a [`ProbeReport`].
use std::path::PathBuf;

use serde::Serialize;
use tch::{Device, Kind, Tensor};

use rsd_model::{shape_str, DocBoundaries, Model, ModelConfig, ModelOptions};

use crate::cp::{ContextParallel, CpBatch};
use rsd_common::rng::SplitMix64;
use rsd_loader::RowRules;

use crate::perturb::{clip_doc_bounds, KlNorm, PerturbKind, Perturbation, RowView, Sampler, Scope};
use crate::step::{
    grad_norm, long_ce_weights, perturbed_tokens, perturbed_work, prefix_reuse_floor,
    reference_loss, step_micro, zero_grads, Draws, LossNormalizers, MicroBatch, Objective,
    SecondView, StepExtras, StepOptions, Sums,
};
use crate::{Error, Result};

/// Where the probed model comes from.
#[derive(Debug, Clone)]
pub enum ProbeModel {
    /// An HF checkpoint directory.
    Dir(PathBuf),
    /// A seeded random model from an HF `config.json`.
    Init {
        /// The config file.
        config: PathBuf,
        /// Seed of the initialisation.
        seed: i64,
    },
}

/// The perturbation parameters; each list holds one value for every row or one per row.
#[derive(Debug, Clone, Default)]
pub struct PerturbParams {
    /// Skip split s.
    pub split: Option<Vec<i64>>,
    /// Skip length y.
    pub skip: Option<Vec<i64>>,
    /// Cyclic shift u.
    pub shift: Option<Vec<i64>>,
    /// Dilation factor a.
    pub factor: Option<Vec<f64>>,
    /// Chunk-permute order (the same for every row).
    pub order: Option<Vec<usize>>,
}

/// What to probe (the flags of `rsd-train probe`).
#[derive(Debug, Clone)]
pub struct ProbeRequest {
    /// The model.
    pub model: ProbeModel,
    /// Token ids, an integer `.npy` of shape `[B, L]`.
    pub tokens: PathBuf,
    /// Document boundaries spec (see [`DocBoundaries::parse`]): document-masked attention, and
    /// positions restart at each document.
    pub doc_bounds: Option<String>,
    /// Which perturbation makes the second view.
    pub perturb: PerturbKind,
    /// The KL's per-sample normaliser.
    pub kl_norm: KlNorm,
    /// Real tokens per row (one value or one per row; `None` = all): the rest is padding, with
    /// no labels and outside the perturbation and the KL rows.
    pub real_len: Option<Vec<i64>>,
    /// With `doc_bounds`: the first token of each document is not predicted (no label on the token
    /// before it), as training with `doc_mask` (ProLong's collator).
    pub mask_doc_starts: bool,
    /// A loss mask, an integer `.npy` of shape `[B, L]` (1 = the token is a training target), as
    /// chat shards carry it: the token before an unmarked one has no label.
    pub loss_mask: Option<PathBuf>,
    /// Its parameters.
    pub params: PerturbParams,
    /// Parameter dtype: `fp32`/`float32` or `fp64`/`float64` (echoed in the report as given).
    pub dtype: String,
    /// Objective, KL direction, λ, chunking, prefix reuse, checkpointing, LongCE.
    pub step: StepOptions,
    /// Use the slow full-logits reference instead of the training step.
    pub reference: bool,
    /// Also write every parameter gradient (fp32) to this `.safetensors` file.
    pub grads_out: Option<PathBuf>,
    /// Run the step this many times (gradients zeroed between runs); at least 1.
    pub repeat: u32,
    /// Context-parallel ranks: with N > 1 the probe runs as one of N processes (torchrun's
    /// variables set, `rsd-train probe --nproc N`), each holding its zigzag chunks of every
    /// row; the report is the whole batch's, as one process computes it.
    pub cp: usize,
    /// Seed of the control views' draws: row `r` draws as row `r` of step 0 of a training run
    /// with this `seed`.
    pub seed: u64,
    /// Also write the control views' random draws (noise, dropout masks) of the (last) run to
    /// this `.safetensors` file (see [`Draws`]).
    pub dump: Option<PathBuf>,
}

/// The perturbation of one row and what it implies.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeRow {
    /// The perturbation applied.
    pub perturbation: Perturbation,
    /// Logit rows that can differ between the views (carry the KL).
    pub kl_rows: i64,
    /// Rows with identical positions in both views (reused by prefix reuse).
    pub shared_prefix: i64,
    /// Control views: the seed of the row's draws (`manual_seed(seed + 2·layer + pass)`, pass
    /// 0 the standard view, 1 the perturbed one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

/// The result of [`run`]; serialised (field names as written) it is the probe's JSON output.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// The objective.
    pub objective: Objective,
    /// The perturbation kind.
    pub perturb: PerturbKind,
    /// The KL direction.
    pub kl_direction: crate::step::KlDirection,
    /// λ.
    pub lambda: f64,
    /// The CLM term (LongCE-weighted when LongCE is on).
    pub clm: f64,
    /// The KL term (`rsd`; 0 otherwise).
    pub kl: f64,
    /// The perturbed view's CLM term (`two-view-clm`; 0 otherwise).
    pub clm_pert: f64,
    /// The total loss.
    pub loss: f64,
    /// Global gradient norm after the (last) run.
    pub grad_norm: f64,
    /// Label tokens (positions with a next token).
    pub label_tokens: i64,
    /// Rows.
    pub samples: i64,
    /// Tokens the perturbed view computes (rows × positions over its passes; one process): 0
    /// for rows whose view changes nothing under `rsd`.
    pub perturbed_tokens: i64,
    /// Each rank's share of the perturbed view's work (one entry without context parallelism):
    /// tokens it computes.
    pub perturbed_tokens_per_rank: Vec<i64>,
    /// Each rank's matmul FLOPs of the perturbed view's decoder forward (linear maps per token,
    /// `4·q` per causal query–key pair, document masking not counted): the balance of context
    /// parallelism is `max / mean` of these.
    pub perturbed_flops_per_rank: Vec<f64>,
    /// Per-row perturbations.
    pub rows: Vec<ProbeRow>,
    /// The dtype as requested.
    pub dtype: String,
    /// Fastest run, seconds.
    pub seconds: f64,
    /// Every run, seconds.
    pub step_seconds: Vec<f64>,
    /// FLOP floor of the rsd skip step with prefix reuse relative to a standard step.
    pub flop_floor_rsd_over_standard: f64,
    /// LongCE (when on): every row's weight `[B][L]` on the standard view (0 where there is no
    /// label; exactly 1 where the short context is the whole context).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub long_ce_weights: Option<Vec<Vec<f64>>>,
    /// Peak resident set size of the process, bytes.
    pub peak_rss: u64,
    /// Context-parallel ranks (1: one process).
    pub cp: usize,
    /// Payload this rank handed to collectives per run of the step (the K/V gathers and the loss
    /// sums; the gathers' backward reduce-scatters run inside autograd and are not counted), bytes.
    pub comm_bytes_per_run: u64,
    /// Seconds this rank spent in those collectives per run.
    pub comm_s_per_run: f64,
}

/// A probe's rows as training defines them ([`RowRules`]): tokens, labels, positions, document
/// boundaries and real lengths.
struct ProbeRows {
    tokens: Vec<Vec<i64>>,
    labels: Vec<Vec<i64>>,
    positions: Vec<Vec<i64>>,
    doc_bounds: Option<Vec<Vec<i64>>>,
    real: Vec<i64>,
}

impl ProbeRows {
    /// Reads `--tokens` (and `--loss-mask`) and derives each row's labels and positions: the next
    /// token, none for the last real token and the padding after it, nor (with
    /// `mask_doc_starts`) for the last token of a document, nor for a token before one the loss
    /// mask leaves out; positions `0..L`, or restarting at each document.
    fn read(req: &ProbeRequest) -> Result<ProbeRows> {
        let tokens = read_tokens(&req.tokens)?;
        let (b, l) = (tokens.len(), tokens.first().map_or(0, |r| r.len() as i64));
        let doc_bounds: Option<Vec<Vec<i64>>> = match &req.doc_bounds {
            None => None,
            Some(spec) => Some(DocBoundaries::parse(spec, b, l)?.rows().to_vec()),
        };
        let real: Vec<i64> = match per_row(&req.real_len, "real-len", b)? {
            Some(v) => v.iter().map(|&n| n.clamp(0, l)).collect(),
            None => vec![l; b],
        };
        let trained = match &req.loss_mask {
            None => None,
            Some(path) => {
                let m = read_tokens(path)?;
                if m.len() != b || m.iter().any(|r| r.len() as i64 != l) {
                    return Err(Error::Input(format!(
                        "{}: the loss mask must have the tokens' shape [{b}, {l}]",
                        path.display()
                    )));
                }
                let marked = |r: &Vec<i64>| r.iter().map(|&v| v == 1).collect::<Vec<bool>>();
                Some(m.iter().map(marked).collect::<Vec<_>>())
            }
        };
        let (mut labels, mut positions) = (Vec::with_capacity(b), Vec::with_capacity(b));
        for (k, row) in tokens.iter().enumerate() {
            let bounds: Option<Vec<usize>> = doc_bounds
                .as_ref()
                .map(|d| d[k].iter().map(|&o| o as usize).collect());
            let rules = RowRules {
                real_len: real[k] as usize,
                doc_bounds: bounds.as_deref(),
                mask_doc_boundaries: req.mask_doc_starts,
                doc_positions: true,
                trained: trained.as_ref().map(|t| t[k].as_slice()),
            };
            labels.push(rules.labels(row));
            positions.push(rules.positions(row.len()));
        }
        Ok(ProbeRows {
            tokens,
            labels,
            positions,
            doc_bounds,
            real,
        })
    }

    fn len(&self) -> usize {
        self.tokens.len()
    }
}

fn parse_dtype(dtype: &str) -> Result<Kind> {
    match dtype {
        "fp32" | "float32" => Ok(Kind::Float),
        "fp64" | "float64" => Ok(Kind::Double),
        d => Err(Error::Input(format!("--dtype \"{d}\": fp32 or fp64"))),
    }
}

/// Refuses a perturbation the step's second view or the process layout cannot run.
fn check_view(req: &ProbeRequest) -> Result<()> {
    let control = req.perturb.is_control();
    if control != (req.step.view != SecondView::Positions) {
        return Err(Error::Input(format!(
            "perturb {} with a step for a different second view",
            req.perturb
        )));
    }
    if control && req.cp > 1 {
        return Err(Error::Input(format!(
            "--cp {}: perturb {} is not supported under context parallelism (use --cp 1)",
            req.cp, req.perturb
        )));
    }
    Ok(())
}

/// Each row's second view: its perturbation applied to the real tokens, or (control kinds) the
/// view row `r` of step 0 of a training run with `req.seed` gets.
fn row_views(req: &ProbeRequest, rows: &ProbeRows, perts: &[Perturbation]) -> Vec<RowView> {
    let sampler = Sampler {
        kind: req.perturb,
        scope: Scope::Sequence,
        skip_range: None,
        fixed_split: None,
        chunks: 1,
        kl_norm: req.kl_norm,
    };
    (0..rows.len())
        .map(|r| {
            let real = rows.real[r];
            let doc_bounds = rows
                .doc_bounds
                .as_ref()
                .map(|d| clip_doc_bounds(&d[r], real));
            // As training draws row r of step 0: the row's generator (a control kind draws no
            // perturbation from it, only its seed).
            let mut g = SplitMix64::keyed(&[req.seed, 0, r as u64]);
            let pert = &perts[r..=r];
            sampler.view(
                &rows.positions[r],
                real,
                doc_bounds.as_deref(),
                pert,
                &mut g,
            )
        })
        .collect()
}

/// What the runs measured, for the report.
struct Measured {
    /// The CLM term and the second term of the last run.
    terms: (f64, f64),
    step_seconds: Vec<f64>,
    comm_bytes_per_run: u64,
    comm_s_per_run: f64,
}

/// The probed step: this process's rows, their views (`None` when the objective has no second
/// view), the request, the loss normalisers, and this rank's share under context parallelism.
struct ProbeStep<'a> {
    model: &'a Model,
    mb: &'a MicroBatch,
    views: Option<&'a [RowView]>,
    req: &'a ProbeRequest,
    norm: LossNormalizers,
    split: Option<&'a Split>,
}

impl ProbeStep<'_> {
    /// Every rank's share of the perturbed view's work, in rank order: tokens it computes and
    /// the matmul FLOPs of its decoder forward (one entry without context parallelism).
    fn work_per_rank(&self) -> Result<(Vec<i64>, Vec<f64>)> {
        let ProbeStep {
            model,
            mb,
            views,
            req,
            split,
            ..
        } = *self;
        match split {
            Some(s) => {
                let batch = s.batch(views.is_some());
                let (t, f) = perturbed_work(model, mb, views, &req.step, Some(&batch))?;
                s.per_rank(t, f)
            }
            None => {
                let (t, f) = perturbed_work(model, mb, views, &req.step, None)?;
                Ok((vec![t], vec![f]))
            }
        }
    }

    /// Runs the step `req.repeat` times (gradients zeroed between runs), timing each and counting
    /// this rank's collective traffic; under context parallelism the gradients are then summed over
    /// the ranks, each holding its rows' share.
    fn repeated(&self) -> Result<Measured> {
        let ProbeStep {
            model, req, split, ..
        } = *self;
        let mut step_seconds = Vec::new();
        let mut terms = (0.0, 0.0);
        let comm0 = split.map(|s| s.cp.group().stats());
        for _ in 0..req.repeat.max(1) {
            zero_grads(model);
            let t0 = std::time::Instant::now();
            terms = self.once()?;
            step_seconds.push(t0.elapsed().as_secs_f64());
        }
        let runs = f64::from(req.repeat.max(1));
        let (comm_bytes_per_run, comm_s_per_run) = match (split, comm0) {
            (Some(s), Some(c0)) => {
                let c = s.cp.group().stats();
                (
                    ((c.bytes - c0.bytes) as f64 / runs) as u64,
                    (c.seconds - c0.seconds) / runs,
                )
            }
            _ => (0, 0.0),
        };
        if let Some(s) = split {
            for (_, p) in model.named_parameters() {
                let mut g = p.grad();
                if g.defined() {
                    s.cp.group().all_reduce(&mut g, rsd_dist::ReduceOp::Sum)?;
                }
            }
        }
        Ok(Measured {
            terms,
            step_seconds,
            comm_bytes_per_run,
            comm_s_per_run,
        })
    }

    /// One run of the step: the CLM term and the second term (KL, or the perturbed CLM for
    /// `two-view-clm`).
    fn once(&self) -> Result<(f64, f64)> {
        let ProbeStep {
            model,
            mb,
            views,
            req,
            norm,
            split,
        } = *self;
        let opts = &req.step;
        if req.reference {
            let (total, clm, second) = reference_loss(model, mb, views, opts, norm)?;
            total.f_backward()?;
            return Ok((clm, second));
        }
        let mut sums = Sums::new(Device::Cpu);
        match split {
            None => {
                let draws = Draws::default();
                let extras = StepExtras {
                    draws: req.dump.is_some().then_some(&draws),
                    ..StepExtras::default()
                };
                step_micro(model, mb, views, opts, norm, &mut sums, extras)?;
                if let Some(path) = &req.dump {
                    write_draws(draws.into_inner(), path)?;
                }
            }
            Some(s) => {
                let cp_batch = s.batch(views.is_some());
                let extras = StepExtras {
                    cp_batch: Some(&cp_batch),
                    draws: None,
                    on_grads: None,
                };
                step_micro(model, mb, views, opts, norm, &mut sums, extras)?;
                let mut t = Tensor::f_stack(&[&sums.clm, &sums.kl, &sums.clm_pert], 0)?;
                s.cp.group().all_reduce(&mut t, rsd_dist::ReduceOp::Sum)?;
                sums.clm = t.f_get(0)?;
                sums.kl = t.f_get(1)?;
                sums.clm_pert = t.f_get(2)?;
            }
        }
        let (clm, kl, clm_pert) = sums.values(norm);
        let second = if opts.objective == Objective::TwoViewClm {
            clm_pert
        } else {
            kl
        };
        Ok((clm, second))
    }
}

/// Runs the probe. See the module docs.
pub fn run(req: &ProbeRequest) -> Result<ProbeReport> {
    let model = load_model(&req.model, parse_dtype(&req.dtype)?)?;
    let rows = ProbeRows::read(req)?;
    check_token_ids(&req.tokens, &rows.tokens, model.config().vocab_size)?;
    injected_torch_error()?;
    check_view(req)?;
    let mb = MicroBatch::from_rows(
        &rows.tokens,
        &rows.labels,
        rows.positions.clone(),
        rows.doc_bounds.clone(),
        Device::Cpu,
    )?
    .with_real_len(rows.real.clone())?;
    let objective = req.step.objective;
    let perts = if objective.needs_perturbed() && !req.perturb.is_control() {
        perturbations(req.perturb, &req.params, &rows.real)?
    } else {
        vec![Perturbation::None; rows.len()]
    };
    let views = row_views(req, &rows, &perts);
    let perturbed_tokens = if objective.needs_perturbed() {
        perturbed_tokens(&model, &mb, Some(&views), &req.step)?
    } else {
        0
    };
    let norm = LossNormalizers::of(std::slice::from_ref(&mb));
    let split = Split::new(req, &rows, &views)?;
    let (mb_run, views_run) = match &split {
        Some(s) => (&s.mb, &s.views),
        None => (&mb, &views),
    };
    let step = ProbeStep {
        model: &model,
        mb: mb_run,
        views: objective.needs_perturbed().then_some(views_run.as_slice()),
        req,
        norm,
        split: split.as_ref(),
    };
    let (perturbed_tokens_per_rank, perturbed_flops_per_rank) = step.work_per_rank()?;
    let measured = step.repeated()?;
    let grad_norm = grad_norm(&model)?;
    let main = split.as_ref().is_none_or(|s| s.cp.rank() == 0);
    if let (Some(path), true) = (&req.grads_out, main) {
        write_grads(&model, path)?;
    }
    let long_ce_weights = match req.step.long_ce {
        Some(lc) if split.is_none() => {
            let w =
                long_ce_weights(&model, &mb, lc, req.step.loss_chunk)?.f_to_kind(Kind::Double)?;
            Some(Vec::<Vec<f64>>::try_from(&w)?)
        }
        _ => None,
    };
    let (clm, second) = measured.terms;
    // `second` is the KL for rsd, the perturbed CLM for two-view-clm; pose has only one term.
    let weighted = objective.needs_perturbed() && objective != Objective::Pose;
    let only = |o: Objective| if objective == o { second } else { 0.0 };
    Ok(ProbeReport {
        objective,
        perturb: req.perturb,
        kl_direction: req.step.kl,
        lambda: req.step.lambda,
        clm,
        kl: only(Objective::Rsd),
        clm_pert: only(Objective::TwoViewClm),
        loss: clm + req.step.lambda * second * f64::from(u8::from(weighted)),
        grad_norm,
        label_tokens: mb.label_tokens,
        samples: rows.len() as i64,
        perturbed_tokens,
        perturbed_tokens_per_rank,
        perturbed_flops_per_rank,
        rows: views
            .iter()
            .zip(perts)
            .map(|(v, perturbation)| ProbeRow {
                perturbation,
                kl_rows: v.kl_rows,
                shared_prefix: v.shared_prefix,
                seed: req.perturb.is_control().then_some(v.seed),
            })
            .collect(),
        dtype: req.dtype.clone(),
        seconds: measured
            .step_seconds
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min),
        step_seconds: measured.step_seconds,
        flop_floor_rsd_over_standard: prefix_reuse_floor(model.config(), mb.len()),
        long_ce_weights,
        peak_rss: rsd_common::mem::Memory::now().peak_rss,
        cp: req.cp.max(1),
        comm_bytes_per_run: measured.comm_bytes_per_run,
        comm_s_per_run: measured.comm_s_per_run,
    })
}

fn load_model(source: &ProbeModel, kind: Kind) -> Result<Model> {
    let options = ModelOptions {
        device: Device::Cpu,
        kind,
    };
    Ok(match source {
        ProbeModel::Dir(dir) => Model::load(dir, options)?,
        ProbeModel::Init { config, seed } => {
            Model::random(ModelConfig::from_file(config)?, options, *seed)?
        }
    })
}

/// Every id of `--tokens` is a row of the model's embedding: the first one that is not is named
/// with its file, row and column (libtorch would only say "index out of range in self").
fn check_token_ids(path: &std::path::Path, tokens: &[Vec<i64>], vocab_size: i64) -> Result<()> {
    for (r, row) in tokens.iter().enumerate() {
        if let Some(c) = row.iter().position(|&id| !(0..vocab_size).contains(&id)) {
            return Err(Error::Input(format!(
                "{}: token id {} at row {r}, column {c} is not in the model's vocabulary \
                 [0, {vocab_size}) (config.json's vocab_size); were the tokens made with \
                 another tokenizer?",
                path.display(),
                row[c]
            )));
        }
    }
    Ok(())
}

/// Test hook, compiled only with the `fault-injection` feature (tests/test_train_faults.py):
/// `RSD_TRAIN_FAULT_TORCH_ERROR=1` asks libtorch for an embedding row that does not exist, so that
/// how a libtorch error is printed (one line unless `RSD_BACKTRACE=1`) stays tested now that the
/// probe checks every id itself.
fn injected_torch_error() -> Result<()> {
    #[cfg(feature = "fault-injection")]
    if std::env::var_os("RSD_TRAIN_FAULT_TORCH_ERROR").is_some() {
        let table = Tensor::zeros([2, 2], (Kind::Float, Device::Cpu));
        let _ = Tensor::f_embedding(&table, &Tensor::from_slice(&[5i64]), -1, false, false)?;
    }
    Ok(())
}

/// The rows of an integer `.npy` of shape `[B, L]`.
fn read_tokens(path: &std::path::Path) -> Result<Vec<Vec<i64>>> {
    // rsd's own reader: the header is checked against the file before anything is read.
    let t = rsd_model::npy::read(path)?;
    let [b, l] = t.size()[..] else {
        return Err(Error::Input(format!(
            "--tokens must be [B, L], got {}",
            shape_str(&t.size())
        )));
    };
    if b == 0 || l == 0 {
        return Err(Error::Input(format!(
            "--tokens must be [B, L] with B, L ≥ 1, got {}",
            shape_str(&t.size())
        )));
    }
    let t = t.f_to_kind(Kind::Int64)?;
    (0..b)
        .map(|r| Ok(Vec::<i64>::try_from(t.f_get(r)?)?))
        .collect()
}

/// One perturbation per row from the parameters `kind` needs; `real` holds each row's real
/// length.
fn perturbations(kind: PerturbKind, p: &PerturbParams, real: &[i64]) -> Result<Vec<Perturbation>> {
    let rows = real.len();
    let required =
        |flag: &str, kind: &str| Error::Input(format!("--{flag} is required for {kind}"));
    Ok(match kind {
        PerturbKind::Skip => {
            let s = per_row(&p.split, "split", rows)?.ok_or_else(|| required("split", "skip"))?;
            let y = per_row(&p.skip, "skip", rows)?.ok_or_else(|| required("skip", "skip"))?;
            // A split at or past a row's end perturbs nothing: the KL would be 0 by
            // construction, not because the views agree.
            for (r, (&split, &len)) in s.iter().zip(real).enumerate() {
                if split < 0 || split >= len {
                    return Err(Error::Input(format!(
                        "--split {split}: row {r} has {len} real tokens; the perturbed suffix \
                         starts at the split, so it must lie in 0..{len}"
                    )));
                }
            }
            s.into_iter()
                .zip(y)
                .map(|(split, skip)| Perturbation::Skip { split, skip })
                .collect()
        }
        PerturbKind::Cyclic => per_row(&p.shift, "shift", rows)?
            .ok_or_else(|| required("shift", "cyclic"))?
            .into_iter()
            .map(|shift| Perturbation::Cyclic { shift })
            .collect(),
        PerturbKind::Dilation => per_row(&p.factor, "factor", rows)?
            .ok_or_else(|| required("factor", "dilation"))?
            .into_iter()
            .map(|factor| Perturbation::Dilation { factor })
            .collect(),
        PerturbKind::Nope | PerturbKind::AttnNoise | PerturbKind::Dropout => {
            vec![Perturbation::None; rows]
        }
        PerturbKind::ChunkPermute => {
            let order = p
                .order
                .clone()
                .ok_or_else(|| required("order", "chunk-permute"))?;
            let mut sorted = order.clone();
            sorted.sort_unstable();
            if sorted.iter().enumerate().any(|(k, &r)| k != r) {
                let text: Vec<String> = order.iter().map(usize::to_string).collect();
                return Err(Error::Input(format!(
                    "--order {}: expected a permutation of 0..{} (the rank of each chunk)",
                    text.join(","),
                    order.len()
                )));
            }
            vec![Perturbation::ChunkPermute { order }; rows]
        }
    })
}

/// `values` for each of `rows` rows: one value repeated, or exactly one per row.
fn per_row<T: Clone>(values: &Option<Vec<T>>, name: &str, rows: usize) -> Result<Option<Vec<T>>> {
    let Some(v) = values else { return Ok(None) };
    match v.len() {
        1 => Ok(Some(vec![v[0].clone(); rows])),
        n if n == rows => Ok(Some(v.clone())),
        n => Err(Error::Input(format!(
            "--{name}: {n} values for {}",
            if rows == 1 {
                "1 sample (give 1)".to_string()
            } else {
                format!("{rows} samples (give 1 or {rows})")
            }
        ))),
    }
}

/// The control views' draws as safetensors (dropout masks as uint8 0/1, noise in its dtype).
fn write_draws(
    draws: std::collections::BTreeMap<String, Tensor>,
    path: &std::path::Path,
) -> Result<()> {
    let tensors: Vec<(String, Tensor)> = draws
        .into_iter()
        .map(|(n, t)| {
            let t = if t.kind() == Kind::Bool {
                t.f_to_kind(Kind::Uint8)?
            } else {
                t
            };
            Ok((n, t))
        })
        .collect::<Result<_>>()?;
    rsd_common::safe_fs::write_atomic_by_path(path, |tmp| {
        Tensor::write_safetensors(&tensors, tmp)
            .map_err(|e| Error::Input(format!("writing {}: {e}", path.display())))
    })
}

fn write_grads(model: &Model, path: &std::path::Path) -> Result<()> {
    let grads: Vec<(String, Tensor)> = model
        .named_parameters()
        .into_iter()
        .filter(|(_, t)| t.grad().defined())
        .map(|(n, t)| Ok((n, t.grad().f_to_kind(Kind::Float)?)))
        .collect::<Result<_>>()?;
    rsd_common::safe_fs::write_atomic_by_path(path, |tmp| {
        Tensor::write_safetensors(&grads, tmp)
            .map_err(|e| Error::Input(format!("writing {}: {e}", path.display())))
    })
}

/// This process's share of the batch under context parallelism.
struct Split {
    cp: ContextParallel,
    /// This rank's chunks of every row.
    mb: MicroBatch,
    /// Their views (`kl_rows` stays the whole row's, the normaliser).
    views: Vec<RowView>,
    /// The whole rows' tokens and views (the perturbed suffix is re-sharded from them).
    whole_tokens: Vec<Vec<i64>>,
    whole_views: Vec<RowView>,
}

impl Split {
    /// `None` without context parallelism; otherwise joins the world (torchrun's variables)
    /// and keeps this rank's chunks.
    fn new(req: &ProbeRequest, rows: &ProbeRows, views: &[RowView]) -> Result<Option<Split>> {
        if req.cp <= 1 {
            return Ok(None);
        }
        if req.reference {
            return Err(Error::Input(
                "--cp: the full-logits reference runs in one process; drop --reference".into(),
            ));
        }
        if std::env::var_os("WORLD_SIZE").is_none() {
            return Err(Error::Input(format!(
                "--cp {}: run the probe as {} processes (`rsd-train probe --nproc {} --cp {} …` \
                 or under torchrun)",
                req.cp, req.cp, req.cp, req.cp
            )));
        }
        // One context-parallel group: dp = 1, so a world of another size is refused, naming
        // --cp and --nproc.
        let mesh = rsd_dist::Mesh::from_env(
            rsd_dist::MeshShape { dp: 1, cp: req.cp },
            Device::Cpu,
            std::time::Duration::from_secs(300),
        )?;
        let cp = ContextParallel::of(&mesh)?;
        let local = |rows: &[Vec<i64>]| -> Result<Vec<Vec<i64>>> {
            rows.iter().map(|r| cp.local_of(r)).collect()
        };
        let mb = MicroBatch::from_rows(
            &local(&rows.tokens)?,
            &local(&rows.labels)?,
            local(&rows.positions)?,
            // The whole rows' boundaries: the chunks' attention needs them (see StepExtras::cp_batch).
            rows.doc_bounds.clone(),
            Device::Cpu,
        )?
        // Whole-row coordinates, as the trainer's context-parallel micro-batches have them.
        .with_real_len(rows.real.clone())?;
        let local_views = views
            .iter()
            .map(|v| cp.local_view(v))
            .collect::<Result<_>>()?;
        Ok(Some(Split {
            cp,
            mb,
            views: local_views,
            whole_tokens: rows.tokens.clone(),
            whole_views: views.to_vec(),
        }))
    }

    /// The step's view of the whole rows.
    fn batch(&self, perturbed: bool) -> CpBatch<'_> {
        CpBatch::from_whole(
            &self.cp,
            self.whole_tokens.clone(),
            perturbed.then(|| self.whole_views.clone()),
        )
    }

    /// Every rank's `(tokens, flops)`, in rank order (a collective).
    fn per_rank(&self, tokens: i64, flops: f64) -> Result<(Vec<i64>, Vec<f64>)> {
        // Host numbers for the report: the group stages them on its device and back.
        let mine = Tensor::f_from_slice(&[tokens as f64, flops])?;
        let all = Vec::<f64>::try_from(&self.cp.group().all_gather(&mine)?.f_reshape([-1])?)?;
        Ok((
            all.chunks(2).map(|p| p[0] as i64).collect(),
            all.chunks(2).map(|p| p[1]).collect(),
        ))
    }
}
