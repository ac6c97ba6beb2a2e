//! The two-view step: forward both views, chunked CE/KL from the final hidden states, backward.
//!
//! ```text
//! standard view  tokens[B, L] @ positions p ──► layers ──► h_std [B, L, D] ─┐
//!                                   │ per-layer K/V[:, :, :P]              ├─► chunks of rows:
//! perturbed view tokens[b, P:] @ r[P:] ──► layers (prefix = std K/V) ──► h_pert ┘   logits → CE, KL
//! ```
//!
//! [`step_micro`] reads top to bottom: plan both views, run them layer by layer, compute the
//! loss, back-propagate. The parts:
//!
//! * `prefix_reuse`: the two views' forward. Rows before the shared prefix `P` are identical in
//!   both views, so the perturbed pass runs only rows `P..L` and attends to the standard pass's
//!   K/V of rows `0..P` (kept in the graph, so the gradient stays exact).
//! * `loss`: the chunked loss (Liger-style). The final hidden states are cut from the graph as
//!   leaves; for each chunk of rows the logits are formed (fp32), CE and KL computed with their
//!   closed-form logit gradients and pushed through the LM head at once, and the chunk's logits
//!   freed. One backward of the surrogate `Σ h · sg(∂loss/∂h)` then runs the decoder's backward
//!   for both views together. No `[tokens × vocab]` tensor ever exists beyond one chunk.
//! * `long_ce`: LongCE's short-context log-probabilities (forwards without a graph over the
//!   overlapping short-context windows).
//! * `reference`: the slow full-logits reference the tests compare against.
//! * **Activation checkpointing** (`checkpoint_layers`): the forward keeps only each layer's
//!   inputs (no graph); the backward walks the layers top-down, recomputes layer `i` for both
//!   views from its stored inputs (the perturbed rows take the recomputed standard K/V as their
//!   prefix, so the cross-view gradient is exact) and pushes the gradient down with the same
//!   surrogate.
//!
//! **Normalisation.** CE is summed over label tokens ≠ [`rsd_loader::IGNORE_INDEX`] and divided by
//! the step's label-token count (over all micro-batches and ranks). The KL of one sample is summed
//! over the rows that can differ and divided by their number (the paper's `1/(L−s) Σ_{i≥s}`), then
//! averaged over the step's samples; a sample with no such row contributes 0. So the numbers are
//! the paper's whatever the micro-batching. `loss = CLM + λ·KL`.
mod long_ce;
mod loss;
mod prefix_reuse;
mod reference;

use std::fmt;

use serde::{Deserialize, Serialize};
use tch::{Kind, Tensor};

use rsd_model::phases::{timed, Phase};
use rsd_model::Model;

use crate::perturb::{PerturbKind, RowView};
use crate::{Error, Result};
use loss::{chunked_loss, LossGrads, LossInputs};
use prefix_reuse::{Plan, Stage};

pub use loss::kl_rows_of;
pub use prefix_reuse::prefix_reuse_floor;
pub use reference::reference_loss;

/// LongCE's weight of every row of `mb` `[B, L]` (loss dtype; 0 where there is no label), as the
/// step computes it: the standard view's log-probabilities from one forward without a graph
/// against the short-context ones. For reports and tests (`rsd-train probe`); the step itself
/// takes the long-context side from its own forward.
pub fn long_ce_weights(model: &Model, mb: &MicroBatch, lc: LongCe, chunk: i64) -> Result<Tensor> {
    tch::no_grad(|| -> Result<Tensor> {
        let short = long_ce::short_context_logprobs(model, mb, lc, chunk, None)?;
        let doc_bounds = match &mb.doc_bounds {
            Some(d) => Some(rsd_model::DocBoundaries::new(d.clone(), mb.len())?),
            None => None,
        };
        let pos = prefix_reuse::pos_tensor(&mb.positions, mb.tokens.device())?;
        let hidden = model
            .forward(&rsd_model::ForwardArgs {
                doc_bounds: doc_bounds.as_ref(),
                ..rsd_model::ForwardArgs::new(&mb.tokens, &pos)
            })?
            .hidden;
        let w = model.lm_head_weight();
        let lk = rsd_model::accum_kind(w.kind());
        let (b, l) = (mb.rows() as i64, mb.len());
        let out = Tensor::f_zeros([b, l], (lk, mb.tokens.device()))?;
        let c = chunk.max(1);
        for r in 0..b {
            let mut i0 = 0;
            while i0 < l {
                let n = c.min(l - i0);
                let y = mb.labels.f_get(r)?.f_narrow(0, i0, n)?;
                let long = hidden
                    .f_get(r)?
                    .f_narrow(0, i0, n)?
                    .f_matmul(&w.f_tr()?)?
                    .f_to_kind(lk)?
                    .f_log_softmax(-1, lk)?
                    .f_gather(1, &y.f_clamp_min(0)?.f_unsqueeze(1)?, false)?
                    .f_squeeze_dim(1)?;
                let weight = loss::long_ce_importance(
                    &long,
                    &short.logp.f_get(r)?.f_narrow(0, i0, n)?,
                    &short.scored.f_get(r)?.f_narrow(0, i0, n)?,
                    lc.gamma,
                )?
                .f_mul(&y.f_ne(IGNORE)?.f_to_kind(lk)?)?;
                out.f_get(r)?.f_narrow(0, i0, n)?.f_copy_(&weight)?;
                i0 += n;
            }
        }
        Ok(out)
    })
}

/// Host values as a tensor on `device`, without making the host wait for the device: on CUDA the
/// values are staged in pinned memory and copied asynchronously on the current stream (a copy from
/// pageable memory waits for every kernel queued before it, a synchronisation inside the step; the
/// caching host allocator keeps the staging buffer until the copy has run). Elsewhere a plain copy.
pub(crate) fn upload<T: tch::kind::Element>(values: &[T], device: tch::Device) -> Result<Tensor> {
    let t = Tensor::f_from_slice(values)?;
    Ok(match device {
        tch::Device::Cuda(_) => {
            t.f_pin_memory(device)?
                .f_to_device_(device, t.kind(), true, false)?
        }
        _ => t.f_to_device(device)?,
    })
}

/// The label that carries no loss, as the tensors hold it.
const IGNORE: i64 = rsd_loader::IGNORE_INDEX as i64;

/// What the step optimises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Objective {
    /// CLM on the standard view.
    Standard,
    /// CLM on the standard view + λ·KL between the views (RSD).
    Rsd,
    /// CLM on the perturbed view only (the paper's PoSE baseline).
    Pose,
    /// CLM on the standard view + λ·CLM on the perturbed view.
    TwoViewClm,
    /// Instruction SFT: CLM on the tokens the shards' loss mask marks (chat data packed with
    /// `rsd-data pack --chat`), as `standard` computes it.
    Sft,
    /// SFT with RSD's KL on the same rows: CLM on the marked tokens + λ·KL, as `rsd` computes it.
    SftRsd,
}

impl Objective {
    /// The loss the step computes: `sft` is `standard`'s and `sft-rsd` is `rsd`'s (on masked
    /// labels); the others are their own.
    pub fn loss(self) -> Objective {
        match self {
            Objective::Sft => Objective::Standard,
            Objective::SftRsd => Objective::Rsd,
            other => other,
        }
    }

    /// Whether the data must carry a loss mask (the SFT objectives).
    pub fn needs_loss_mask(self) -> bool {
        matches!(self, Objective::Sft | Objective::SftRsd)
    }

    /// Whether a perturbed view is needed.
    pub fn needs_perturbed(self) -> bool {
        self.loss() != Objective::Standard
    }

    /// The name in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Objective::Standard => "standard",
            Objective::Rsd => "rsd",
            Objective::Pose => "pose",
            Objective::TwoViewClm => "two-view-clm",
            Objective::Sft => "sft",
            Objective::SftRsd => "sft-rsd",
        }
    }
}

impl fmt::Display for Objective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Direction of the KL term.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KlDirection {
    /// KL(p_pert ‖ sg(p_std)) (the paper's default).
    Reverse,
    /// KL(sg(p_std) ‖ p_pert).
    Forward,
}

impl fmt::Display for KlDirection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KlDirection::Reverse => "reverse",
            KlDirection::Forward => "forward",
        })
    }
}

/// What the second view changes. Position perturbations change [`RowView::positions`]; the
/// control views (the paper's NoPE, attention-noise and dropout ablations) keep the positions and
/// change the attention of a pass instead.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum SecondView {
    /// Its positions (skip, cyclic, dilation, chunk-permute).
    #[default]
    Positions,
    /// No rotary embeddings: queries and keys are not rotated (NoPE).
    Nope,
    /// Noise `N(0, σ²)` added to the second pass's scaled attention scores before the softmax.
    AttnNoise {
        /// σ (`attn_noise_sigma`).
        sigma: f64,
    },
    /// Dropout of the attention probabilities in both passes (`attn_dropout`), as transformers
    /// places Llama's and Qwen3's `attention_dropout`; no dropout on the residual branches.
    Dropout {
        /// The rate p.
        rate: f64,
    },
}

impl SecondView {
    /// The second view a perturbation kind makes, with the control views' parameters.
    pub fn of(kind: PerturbKind, sigma: f64, rate: f64) -> Self {
        match kind {
            PerturbKind::Nope => SecondView::Nope,
            PerturbKind::AttnNoise => SecondView::AttnNoise { sigma },
            PerturbKind::Dropout => SecondView::Dropout { rate },
            _ => SecondView::Positions,
        }
    }

    /// Refuses a σ or a rate outside its range, naming the key and the value.
    pub fn check(self) -> Result<()> {
        match self {
            SecondView::AttnNoise { sigma } if !(sigma.is_finite() && sigma >= 0.0) => {
                Err(Error::Input(format!(
                    "attn_noise_sigma {sigma}: the noise's standard deviation must be a finite \
                     number ≥ 0"
                )))
            }
            SecondView::Dropout { rate } if !(0.0..1.0).contains(&rate) => Err(Error::Input(
                format!("attn_dropout {rate}: the dropout rate must lie in [0, 1)"),
            )),
            _ => Ok(()),
        }
    }
}

/// How one step is computed.
#[derive(Debug, Clone, Copy)]
pub struct StepOptions {
    /// The objective.
    pub objective: Objective,
    /// KL direction (rsd).
    pub kl: KlDirection,
    /// λ.
    pub lambda: f64,
    /// Run the perturbed view only from the shared prefix on, reusing the standard K/V.
    pub prefix_reuse: bool,
    /// Rows per loss chunk (logits of at most this many rows exist at once).
    pub loss_chunk: i64,
    /// Per-layer activation checkpointing.
    pub checkpoint_layers: bool,
    /// LongCE reweighting of the standard-view CLM term (`None` = plain CE).
    pub long_ce: Option<LongCe>,
    /// What the second view changes (its positions, or a control view's attention).
    pub view: SecondView,
}

/// LongCE (Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?"): each
/// CLM token's CE is weighted by `min(exp(log p(x_i | long) − log p(x_i | short)), γ)`, computed
/// with the current model and detached, so tokens the long context helps predict weigh more.
///
/// The short context slides as in LongCE's own training code: windows start every `stride`
/// tokens, and the logit row `p` is scored in the window starting at the multiple of `stride`
/// that leaves it between `window` and `window + stride − 1` tokens of context (`x_s … x_p`, run
/// as its own sequence from position 0). Where that window would start at or before the start of
/// `p`'s document (or of the sequence), the short context is the whole context and the weight is
/// exactly 1. See `docs/TRAIN.md` ("LongCE").
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongCe {
    /// The reference length: the fewest tokens of short context a reweighted token has.
    pub window: i64,
    /// How far the short-context windows advance (each scores `stride` logit rows).
    pub stride: i64,
    /// The cap γ on a token's weight.
    pub gamma: f64,
}

impl LongCe {
    /// The paper's stride (RSD Appendix A.2 and LongCE's code: a 1K sliding window).
    pub const PAPER_STRIDE: i64 = 1024;

    /// Checked settings: `window ≥ 1`, `stride ≥ 1`, `γ` finite and positive.
    pub fn new(window: i64, stride: i64, gamma: f64) -> Result<Self> {
        if window < 1 {
            return Err(Error::Input(format!(
                "long_ce_window {window}: expected a reference length of ≥ 1 tokens (0 = off)"
            )));
        }
        if stride < 1 {
            return Err(Error::Input(format!(
                "long_ce_stride {stride}: expected ≥ 1 tokens (the paper uses 1024)"
            )));
        }
        if !(gamma.is_finite() && gamma > 0.0) {
            return Err(Error::Input(format!(
                "long_ce_gamma {gamma}: expected a positive cap (the paper uses 5)"
            )));
        }
        Ok(LongCe {
            window,
            stride,
            gamma,
        })
    }
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions {
            objective: Objective::Rsd,
            kl: KlDirection::Reverse,
            lambda: 1.0,
            prefix_reuse: true,
            loss_chunk: 1024,
            checkpoint_layers: false,
            long_ce: None,
            view: SecondView::Positions,
        }
    }
}

/// One micro-batch on the device, with the host-side metadata the views are built from.
#[derive(Debug)]
pub struct MicroBatch {
    /// Token ids `[B, L]` (int64).
    pub tokens: Tensor,
    /// Targets `[B, L]` (int64), [`rsd_loader::IGNORE_INDEX`] = no loss.
    pub labels: Tensor,
    /// Standard position ids per row.
    pub positions: Vec<Vec<i64>>,
    /// Document boundaries per row (`[0, …, L]`) for document-masked batches.
    pub doc_bounds: Option<Vec<Vec<i64>>>,
    /// Number of labels that carry a loss.
    pub label_tokens: i64,
    /// Real tokens per row, in whole-row coordinates (the rest is the pack's tail padding or
    /// context-parallel padding): the perturbation and the KL rows cover these only.
    pub real_len: Vec<i64>,
}

impl MicroBatch {
    /// Builds a micro-batch from host rows (labels: [`rsd_loader::IGNORE_INDEX`] = ignore).
    pub fn from_rows(
        tokens: &[Vec<i64>],
        labels: &[Vec<i64>],
        positions: Vec<Vec<i64>>,
        doc_bounds: Option<Vec<Vec<i64>>>,
        device: tch::Device,
    ) -> Result<Self> {
        let b = tokens.len();
        let l = tokens.first().map_or(0, |r| r.len());
        let same = |v: &[Vec<i64>]| v.len() == b && v.iter().all(|r| r.len() == l);
        if b == 0 || l == 0 || !same(labels) || !same(&positions) {
            return Err(Error::Input(format!(
                "a micro-batch needs B ≥ 1 rows of one length L ≥ 1 for tokens, labels and \
                 positions (got {b} rows)"
            )));
        }
        let flat = |v: &[Vec<i64>]| -> Result<Tensor> {
            let f: Vec<i64> = v.iter().flatten().copied().collect();
            Ok(upload(&f, device)?.f_view([b as i64, l as i64])?)
        };
        let label_tokens = labels.iter().flatten().filter(|&&x| x != IGNORE).count() as i64;
        Ok(MicroBatch {
            tokens: flat(tokens)?,
            labels: flat(labels)?,
            real_len: vec![l as i64; b],
            positions,
            doc_bounds,
            label_tokens,
        })
    }

    /// Marks the tokens of row `r` from `real[r]` on (whole-row coordinates) as padding.
    pub fn with_real_len(mut self, real: Vec<i64>) -> Result<Self> {
        if real.len() != self.rows() {
            return Err(Error::Input(format!(
                "{} real lengths for a micro-batch of {} rows",
                real.len(),
                self.rows()
            )));
        }
        self.real_len = real;
        Ok(self)
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.positions.len()
    }

    /// Row length.
    pub fn len(&self) -> i64 {
        self.positions.first().map_or(0, |r| r.len() as i64)
    }

    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The loss normalisers of one optimizer step (summed over its micro-batches and data-parallel
/// ranks): the CE is a mean over `label_tokens`, the KL a mean over `samples`.
#[derive(Debug, Clone, Copy)]
pub struct LossNormalizers {
    /// Label tokens that carry a loss.
    pub label_tokens: f64,
    /// Samples (rows).
    pub samples: f64,
}

impl LossNormalizers {
    /// The normalisers of a step made of these micro-batches.
    pub fn of(mbs: &[MicroBatch]) -> Self {
        Self::of_iter(mbs)
    }

    /// [`LossNormalizers::of`] for micro-batches held elsewhere.
    pub fn of_iter<'a>(mbs: impl IntoIterator<Item = &'a MicroBatch>) -> Self {
        mbs.into_iter().fold(
            LossNormalizers {
                label_tokens: 0.0,
                samples: 0.0,
            },
            |n, m| LossNormalizers {
                label_tokens: n.label_tokens + m.label_tokens as f64,
                samples: n.samples + m.rows() as f64,
            },
        )
    }
}

/// Running sums of the loss terms, as device scalars (read once per step: no host syncs inside).
#[derive(Debug)]
pub struct Sums {
    /// Σ token CE of the CLM term (standard view; perturbed view for `pose`).
    pub clm: Tensor,
    /// Σ over samples of the per-sample mean KL.
    pub kl: Tensor,
    /// Σ token CE on the perturbed view (`two-view-clm`).
    pub clm_pert: Tensor,
}

impl Sums {
    /// Zeros on `device`.
    pub fn new(device: tch::Device) -> Self {
        let z = || Tensor::zeros([], (Kind::Double, device));
        Sums {
            clm: z(),
            kl: z(),
            clm_pert: z(),
        }
    }

    /// `(clm, kl, clm_pert)` normalised: token mean, sample mean, token mean.
    pub fn values(&self, norm: LossNormalizers) -> (f64, f64, f64) {
        let v = |t: &Tensor| t.double_value(&[]);
        (
            v(&self.clm) / norm.label_tokens.max(1.0),
            v(&self.kl) / norm.samples.max(1.0),
            v(&self.clm_pert) / norm.label_tokens.max(1.0),
        )
    }

    /// `acc += Σ v` in fp64.
    fn add(acc: &mut Tensor, v: &Tensor) -> Result<()> {
        *acc = acc.f_add(&v.f_sum(Kind::Double)?)?;
        Ok(())
    }
}

/// Tokens the perturbed view of `mb` computes under `opts` (its passes' rows × positions, one
/// process): the second view's work, 0 when no row needs it. Plans the step, runs nothing.
pub fn perturbed_tokens(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
) -> Result<i64> {
    Ok(Plan::new(model, mb, views, opts, None, None)?.perturbed_tokens())
}

/// The random tensors a step drew for its control views, by name (`layers.{i}.{view}.{what}`,
/// view `standard` or `perturbed`, what `keep` (dropout) or `score_noise`), each `[rows of the
/// pass, heads, L, L]`: for checking the step against an independent implementation.
pub type Draws = std::cell::RefCell<std::collections::BTreeMap<String, Tensor>>;

/// This rank's share of the perturbed view's work under `opts` (with `cp_batch`: of a
/// context-parallel micro-batch, `mb` and `views` being this rank's parts): `(tokens, matmul
/// FLOPs of the decoder forward)`, see `Plan::perturbed_flops`. Plans the step, runs nothing.
pub fn perturbed_work(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
    cp_batch: Option<&crate::cp::CpBatch<'_>>,
) -> Result<(i64, f64)> {
    let plan = Plan::new(model, mb, views, opts, cp_batch, None)?;
    Ok((plan.perturbed_tokens(), plan.perturbed_flops()))
}

/// The standard view's CLM (token mean, plain CE) and the view gap — the KL between the
/// standard view and the perturbed one (`views`), the per-sample mean of the KL rows' mean, in
/// `opts.kl`'s direction — of held-out micro-batches, without a graph or gradients: the same
/// forward and chunked loss as a training step of `rsd` with λ = 1.
pub fn evaluate(
    model: &Model,
    batches: &[(MicroBatch, Vec<RowView>)],
    opts: &StepOptions,
) -> Result<(f64, f64)> {
    let opts = StepOptions {
        objective: Objective::Rsd,
        lambda: 1.0,
        long_ce: None,
        checkpoint_layers: false,
        ..*opts
    };
    let norm = LossNormalizers::of_iter(batches.iter().map(|(mb, _)| mb));
    let mut sums = Sums::new(model.options().device);
    tch::no_grad(|| -> Result<()> {
        for (mb, views) in batches {
            let plan = Plan::new(model, mb, Some(views), &opts, None, None)?;
            let h = plan.forward()?;
            let inputs = LossInputs {
                plan: &plan,
                mb,
                views: Some(views),
                opts: &opts,
                norm,
                short: None,
            };
            chunked_loss(&inputs, &h, &mut sums)?;
        }
        Ok(())
    })?;
    let (clm, kl, _) = sums.values(norm);
    Ok((clm, kl))
}

/// What a step may take beyond one process's micro-batch.
#[derive(Clone, Copy, Default)]
pub struct StepExtras<'a> {
    /// Context parallelism: `mb` and `views` hold this rank's rows only, and each view's
    /// `kl_rows` counts the whole sequence's, so the per-rank loss sums add up to the sequence's;
    /// the batch holds the whole rows, which prefix reuse re-shards the perturbed suffix from
    /// (module `prefix_reuse`). The step is then a collective: every rank of the
    /// context-parallel group runs the same micro-batches.
    pub cp_batch: Option<&'a crate::cp::CpBatch<'a>>,
    /// Where to record the control views' random draws (checks against an independent
    /// implementation).
    pub draws: Option<&'a Draws>,
    /// Called as each part's gradients become complete under per-layer checkpointing (top, each
    /// layer top-down, embedding), where a sharded optimizer reduces and frees them. Without
    /// checkpointing it is never called: every gradient is complete when the step returns.
    pub on_grads: Option<OnGrads<'a>>,
}

/// Refuses a control view with options it does not combine with, naming the key.
fn check_control(opts: &StepOptions, cp: bool) -> Result<()> {
    opts.view.check()?;
    if opts.view == SecondView::Positions {
        return Ok(());
    }
    let kind = match opts.view {
        SecondView::Nope => "nope",
        SecondView::AttnNoise { .. } => "attn-noise",
        _ => "dropout",
    };
    if opts.objective != Objective::Rsd {
        return Err(Error::Input(format!(
            "perturb {kind}: a control view is compared with the standard view by the KL, so it \
             needs objective rsd (got objective {})",
            opts.objective
        )));
    }
    if cp {
        return Err(Error::Input(format!(
            "perturb {kind} under context parallelism (cp > 1) is not supported (set cp = 1)"
        )));
    }
    if matches!(opts.view, SecondView::Dropout { .. }) && opts.long_ce.is_some() {
        return Err(Error::Input(
            "perturb dropout with LongCE (long_ce_window > 0) is not supported: the CLM term is \
             a dropout pass, LongCE's short context is not (set long_ce_window = 0)"
                .into(),
        ));
    }
    Ok(())
}

/// A part of the model whose parameter gradients a step has completed, in the order the
/// backward completes them: the top (final norm and an untied LM head), the layers from the last
/// down, then the embedding (with tied embeddings also the LM head, so only at the very end).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GradsDone {
    /// `model.norm.*` and an untied `lm_head.weight`.
    Top,
    /// `model.layers.{i}.*`, counted from the last layer (`Layer(0)` comes first only for a
    /// one-layer model): the backward order sorts these by descending index.
    Layer(std::cmp::Reverse<usize>),
    /// `model.embed_tokens.weight` (and the LM head it is tied to).
    Embedding,
}

impl GradsDone {
    /// The part parameter `name` (an HF name) belongs to.
    pub fn of(name: &str) -> Self {
        if let Some(rest) = name.strip_prefix("model.layers.") {
            if let Some(i) = rest.split('.').next().and_then(|i| i.parse().ok()) {
                return GradsDone::Layer(std::cmp::Reverse(i));
            }
        }
        if name.starts_with("model.embed_tokens.") {
            GradsDone::Embedding
        } else {
            GradsDone::Top
        }
    }
}

/// Called by a step as soon as a part's gradients are complete (with per-layer checkpointing
/// only: the plain backward completes everything at once): the place to reduce and free them.
pub type OnGrads<'a> = &'a dyn Fn(GradsDone) -> Result<()>;

/// Forward both views, compute the chunked loss (closed-form logit gradients), then one backward
/// through the LM head and the decoder. Accumulates parameter gradients (scaled by `norm`) and
/// adds the step's loss terms to `sums`. `extras` (default: none) adds context-parallel rows,
/// recorded draws or the gradients hook.
pub fn step_micro(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
    norm: LossNormalizers,
    sums: &mut Sums,
    extras: StepExtras<'_>,
) -> Result<()> {
    let StepExtras {
        cp_batch,
        draws,
        on_grads,
    } = extras;
    check_control(opts, cp_batch.is_some())?;
    if cp_batch.is_some_and(|c| c.tokens().is_empty()) && opts.long_ce.is_some() {
        return Err(Error::Input(
            "LongCE under context parallelism needs the whole rows' tokens (CpBatch::gather)"
                .into(),
        ));
    }
    if let Some(lc) = opts.long_ce {
        LongCe::new(lc.window, lc.stride, lc.gamma)?;
    }
    if opts.long_ce.is_some() && !matches!(opts.objective, Objective::Standard | Objective::Rsd) {
        return Err(Error::Input(format!(
            "LongCE reweights the standard-view CLM term of `standard` and `rsd`; objective {} \
             has none to reweight (set long_ce_window = 0)",
            opts.objective
        )));
    }
    let plan = Plan::new(model, mb, views, opts, cp_batch, draws)?;
    let loss = LossStage {
        plan: &plan,
        mb,
        views,
        opts,
        norm,
    };
    if opts.checkpoint_layers {
        return checkpointed_forward_backward(&loss, sums, on_grads);
    }
    let h = timed("forward", || plan.forward())?;
    crate::memory_measure::mark(crate::memory_measure::Phase::Forward);
    loss.backward(&h, sums)
}

/// Per-layer activation checkpointing: a forward without a graph that keeps each layer's input,
/// the loss's backward, then each layer recomputed from its input and back-propagated, top-down.
fn checkpointed_forward_backward(
    loss: &LossStage<'_>,
    sums: &mut Sums,
    on_grads: Option<OnGrads<'_>>,
) -> Result<()> {
    let done = |part| on_grads.map_or(Ok(()), |f| f(part));
    let (plan, layers) = (loss.plan, loss.plan.model.num_layers());
    let mut inputs: Vec<Stage> = Vec::with_capacity(layers + 1);
    let forward = Phase::begin("forward");
    tch::no_grad(|| -> Result<()> {
        let mut x = plan.embed()?;
        for i in 0..layers {
            let y = plan.layer(i, &x)?;
            inputs.push(x.detached());
            x = y;
        }
        inputs.push(x.detached());
        Ok(())
    })?;
    drop(forward);
    crate::memory_measure::mark(crate::memory_measure::Phase::Forward);
    let top = inputs.pop().expect("final stage input");
    let leaf = top.leaves();
    let h = plan.final_norm(&leaf)?;
    loss.backward(&h, sums)?;
    done(GradsDone::Top)?;
    let mut grads = leaf.grads();
    for i in (0..layers).rev() {
        let _backward = Phase::begin("backward");
        let leaf = inputs.pop().expect("layer input").leaves();
        let y = timed("recompute", || plan.layer(i, &leaf))?;
        surrogate_backward(y.tensors().zip(&grads))?;
        grads = leaf.grads();
        done(GradsDone::Layer(std::cmp::Reverse(i)))?;
    }
    let _backward = Phase::begin("backward");
    let emb = plan.embed()?;
    surrogate_backward(emb.tensors().zip(&grads))?;
    done(GradsDone::Embedding)
}

/// The loss at the top of the step, over the final hidden states of a planned micro-batch.
struct LossStage<'a> {
    plan: &'a Plan<'a>,
    mb: &'a MicroBatch,
    views: Option<&'a [RowView]>,
    opts: &'a StepOptions,
    norm: LossNormalizers,
}

impl LossStage<'_> {
    /// Runs the chunked loss on the final hidden states `h` (in the graph) and back-propagates
    /// it: into the LM head and through `h` into the decoder, in one backward.
    fn backward(&self, h: &Stage, sums: &mut Sums) -> Result<()> {
        let loss = Phase::begin("loss");
        let g = tch::no_grad(|| -> Result<LossGrads> {
            let short = match self.opts.long_ce {
                Some(lc) => Some(long_ce::short_context_logprobs(
                    self.plan.model,
                    self.mb,
                    lc,
                    self.opts.loss_chunk,
                    self.plan.cp_split(),
                )?),
                None => None,
            };
            let inputs = LossInputs {
                plan: self.plan,
                mb: self.mb,
                views: self.views,
                opts: self.opts,
                norm: self.norm,
                short: short.as_ref(),
            };
            chunked_loss(&inputs, &h.detached(), sums)
        })?;
        drop(loss);
        let _backward = Phase::begin("backward");
        let w = self.plan.model.lm_head_weight();
        surrogate_backward(
            h.tensors()
                .zip(g.hidden.tensors())
                .chain(std::iter::once((w, &g.weight))),
        )
    }
}

/// Back-propagates the given output gradients: `Σ sum(y · sg(g))`.backward().
fn surrogate_backward<'a>(pairs: impl IntoIterator<Item = (&'a Tensor, &'a Tensor)>) -> Result<()> {
    let mut total: Option<Tensor> = None;
    for (y, g) in pairs {
        if !g.defined() || !y.requires_grad() {
            continue;
        }
        // Only the gradient of this sum matters (it is g); fp64 models keep fp64 all the way.
        let kind = rsd_model::accum_kind(y.kind());
        let s = y.f_mul(&g.detach())?.f_sum(kind)?;
        total = Some(match total {
            Some(t) => t.f_add(&s.f_to_kind(t.kind())?)?,
            None => s,
        });
    }
    if let Some(t) = total {
        t.f_backward()?;
    }
    Ok(())
}

/// Global L2 norm of the parameters' gradients: each gradient's norm on its device (accumulated in
/// fp32, fp64 for fp64 models, read in place without a widened copy), their squares summed in
/// fp64, and one host read at the end (the one synchronisation of the update).
pub fn grad_norm(model: &Model) -> Result<f64> {
    let mut norms = Vec::new();
    for (_, p) in model.named_parameters() {
        let g = p.grad();
        if g.defined() {
            let acc = rsd_model::accum_kind(g.kind());
            norms.push(
                g.f_norm_scalaropt_dtype(2.0, acc)?
                    .f_to_kind(Kind::Double)?,
            );
        }
    }
    if norms.is_empty() {
        return Ok(0.0);
    }
    let sq = Tensor::f_stack(&norms, 0)?
        .f_square()?
        .f_sum(Kind::Double)?;
    Ok(sq.f_double_value(&[])?.sqrt())
}

/// Sets every parameter's gradient to zero (or leaves it undefined if it never had one).
pub fn zero_grads(model: &Model) {
    for (_, p) in model.named_parameters() {
        let mut g = p.grad();
        if g.defined() {
            let _ = g.f_zero_();
        }
    }
}
