//! The two-view step: forward both views, chunked CE/KL from the final hidden states, backward.
//!
//! ```text
//! standard view  tokens[B, L] @ positions p ──► layers ──► h_std [B, L, D] ─┐
//!                                   │ per-layer K/V[:, :, :P]              ├─► chunks of rows:
//! perturbed view tokens[b, P:] @ r[P:] ──► layers (prefix = std K/V) ──► h_pert ┘   logits → CE, KL
//! ```
//!
//! * **Prefix reuse.** Rows before the shared prefix `P` (first row whose position changed, see
//!   [`crate::perturb`]) are identical in both views, so the perturbed pass runs only rows `P..L`,
//!   attending to the standard pass's post-RoPE K/V of rows `0..P` (rsd-model's `prefix`). Those K/V
//!   stay in the autograd graph: the KL's gradient through them reaches the standard pass, as the
//!   true gradient of the loss does. `P` differs per row, so the suffix pass runs per row; without
//!   reuse (or for perturbations with `P = 0`, e.g. cyclic) one batched full pass runs instead.
//! * **Chunked loss (Liger-style).** The final hidden states are cut from the graph as leaves; for each
//!   chunk of rows the logits are formed (fp32), CE and KL computed and back-propagated at once into
//!   the leaves and the LM head, and the chunk's logits freed. One backward of the surrogate
//!   `Σ h · sg(∂loss/∂h)` then runs the decoder's backward for both views together. No `[tokens ×
//!   vocab]` tensor ever exists beyond one chunk.
//! * **Activation checkpointing** (`checkpoint_layers`): the forward keeps only each layer's inputs
//!   (no graph); the backward walks the layers top-down, recomputes layer `i` for both views from
//!   its stored inputs (the perturbed rows take the recomputed standard K/V as their prefix, so the
//!   cross-view gradient is exact) and pushes the gradient down with the same surrogate.
//!
//! **Normalisation.** CE is summed over label tokens ≠ −100 and divided by the step's label-token
//! count (over all micro-batches and ranks). The KL of one sample is summed over the rows that can
//! differ and divided by their number (the paper's `1/(L−s) Σ_{i≥s}`), then averaged over the step's
//! samples; a sample with no such row contributes 0. So the numbers are the paper's whatever the
//! micro-batching. `loss = CLM + λ·KL`.
use serde::{Deserialize, Serialize};
use tch::{Kind, Reduction, Tensor};

use rsd_model::{DocBoundaries, LayerKv, Model, Rotary};

use crate::perturb::RowView;
use crate::{Error, Result};

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
}

impl Objective {
    /// Whether a perturbed view is needed.
    pub fn needs_perturbed(self) -> bool {
        self != Objective::Standard
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
}

/// LongCE (Fang et al., "What is Wrong with Perplexity for Long-context Language Modeling?"): each
/// CLM token's CE is weighted by `min(exp(log p(x_i | long) − log p(x_i | short)), γ)`, computed
/// with the current model and detached, so tokens the long context helps predict weigh more.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LongCe {
    /// The short context of token i: the tokens since the start of its `window`-token window (the
    /// sequence cut into consecutive windows, each run as its own sequence from position 0; in
    /// document-masked batches also cut at document starts).
    pub window: i64,
    /// The cap γ on a token's weight.
    pub gamma: f64,
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
        }
    }
}

/// One micro-batch on the device, with the host-side metadata the views are built from.
#[derive(Debug)]
pub struct MicroBatch {
    /// Token ids `[B, L]` (int64).
    pub tokens: Tensor,
    /// Targets `[B, L]` (int64), −100 = no loss.
    pub labels: Tensor,
    /// Standard position ids per row.
    pub positions: Vec<Vec<i64>>,
    /// Document boundaries per row (`[0, …, L]`) for document-masked batches.
    pub docs: Option<Vec<Vec<i64>>>,
    /// Number of labels ≠ −100.
    pub label_tokens: i64,
}

impl MicroBatch {
    /// Builds a micro-batch from host rows (labels: −100 = ignore).
    pub fn from_rows(
        tokens: &[Vec<i64>],
        labels: &[Vec<i64>],
        positions: Vec<Vec<i64>>,
        docs: Option<Vec<Vec<i64>>>,
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
            Ok(Tensor::f_from_slice(&f)?
                .f_view([b as i64, l as i64])?
                .f_to_device(device)?)
        };
        let label_tokens = labels.iter().flatten().filter(|&&x| x != -100).count() as i64;
        Ok(MicroBatch {
            tokens: flat(tokens)?,
            labels: flat(labels)?,
            positions,
            docs,
            label_tokens,
        })
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

/// Normalisers of one optimizer step (summed over its micro-batches and data-parallel ranks).
#[derive(Debug, Clone, Copy)]
pub struct Norm {
    /// Label tokens ≠ −100.
    pub label_tokens: f64,
    /// Samples (rows).
    pub samples: f64,
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
    pub fn values(&self, norm: Norm) -> (f64, f64, f64) {
        let v = |t: &Tensor| t.double_value(&[]);
        (
            v(&self.clm) / norm.label_tokens.max(1.0),
            v(&self.kl) / norm.samples.max(1.0),
            v(&self.clm_pert) / norm.label_tokens.max(1.0),
        )
    }
}

/// A perturbed-view pass over some rows, from row `p` on.
struct Group {
    rows: Vec<i64>,
    p: i64,
    tokens: Tensor,
    rotary: Rotary,
    docs: Option<DocBoundaries>,
}

/// Everything both views need, built once per micro-batch.
struct Plan<'a> {
    model: &'a Model,
    tokens: &'a Tensor,
    std: Option<(Rotary, Option<DocBoundaries>)>,
    groups: Vec<Group>,
    /// Row b → (group, index in group, p).
    row_group: Vec<(usize, i64, i64)>,
}

fn pos_tensor(rows: &[Vec<i64>], device: tch::Device) -> Result<Tensor> {
    let (b, l) = (
        rows.len() as i64,
        rows.first().map_or(0, |r| r.len()) as i64,
    );
    let flat: Vec<i64> = rows.iter().flatten().copied().collect();
    Ok(Tensor::f_from_slice(&flat)?
        .f_view([b, l])?
        .f_to_device(device)?)
}

impl<'a> Plan<'a> {
    fn new(
        model: &'a Model,
        mb: &'a MicroBatch,
        views: Option<&[RowView]>,
        opts: &StepOptions,
    ) -> Result<Self> {
        let device = mb.tokens.device();
        let (b, l) = (mb.rows(), mb.len());
        let docs_of = |rows: &[i64]| -> Result<Option<DocBoundaries>> {
            let Some(d) = &mb.docs else { return Ok(None) };
            let sel = rows.iter().map(|&r| d[r as usize].clone()).collect();
            Ok(Some(DocBoundaries::new(sel, l)?))
        };
        let all: Vec<i64> = (0..b as i64).collect();
        let std = if opts.objective != Objective::Pose {
            Some((
                model.rotary(&pos_tensor(&mb.positions, device)?)?,
                docs_of(&all)?,
            ))
        } else {
            None
        };
        let mut groups = Vec::new();
        let mut row_group = Vec::new();
        if opts.objective.needs_perturbed() {
            let views = views.ok_or_else(|| {
                Error::Input("the objective needs a perturbed view, none was given".into())
            })?;
            if views.len() != b || views.iter().any(|v| v.positions.len() as i64 != l) {
                return Err(Error::Input(format!(
                    "{} perturbed rows for a batch of {b} rows of length {l}",
                    views.len()
                )));
            }
            let reuse =
                opts.prefix_reuse && std.is_some() && views.iter().any(|v| v.shared_prefix > 0);
            let pert: Vec<Vec<i64>> = views.iter().map(|v| v.positions.clone()).collect();
            if !reuse {
                groups.push(Group {
                    rows: all.clone(),
                    p: 0,
                    tokens: mb.tokens.shallow_clone(),
                    rotary: model.rotary(&pos_tensor(&pert, device)?)?,
                    docs: docs_of(&all)?,
                });
                row_group = (0..b as i64).map(|r| (0, r, 0)).collect();
            } else {
                for (r, v) in views.iter().enumerate() {
                    let p = v.shared_prefix.min(l);
                    if p == l {
                        // Nothing changed in this row: no perturbed rows at all.
                        row_group.push((usize::MAX, 0, l));
                        continue;
                    }
                    let suffix = vec![v.positions[p as usize..].to_vec()];
                    row_group.push((groups.len(), 0, p));
                    groups.push(Group {
                        rows: vec![r as i64],
                        p,
                        tokens: mb.tokens.f_narrow(0, r as i64, 1)?.f_narrow(1, p, l - p)?,
                        rotary: model.rotary(&pos_tensor(&suffix, device)?)?,
                        docs: docs_of(&[r as i64])?,
                    });
                }
            }
        }
        Ok(Plan {
            model,
            tokens: &mb.tokens,
            std,
            groups,
            row_group,
        })
    }

    /// Embeddings of both views.
    fn embed(&self) -> Result<Stage> {
        let std = match self.std {
            Some(_) => Some(self.model.embed(self.tokens)?),
            None => None,
        };
        let groups = self
            .groups
            .iter()
            .map(|g| self.model.embed(&g.tokens))
            .collect::<rsd_model::Result<_>>()?;
        Ok(Stage { std, groups })
    }

    /// Layer `i` for both views; the perturbed rows take the standard K/V of rows `0..p` as prefix.
    fn layer(&self, i: usize, x: &Stage) -> Result<Stage> {
        let mut kv = None;
        let std = match (&self.std, &x.std) {
            (Some((rot, docs)), Some(xs)) => {
                let (y, k) = self.model.layer_forward(i, xs, rot, docs.as_ref(), None)?;
                kv = Some(k);
                Some(y)
            }
            _ => None,
        };
        let mut groups = Vec::with_capacity(self.groups.len());
        for (g, xg) in self.groups.iter().zip(&x.groups) {
            let prefix = match (&kv, g.p) {
                (Some(kv), p) if p > 0 => {
                    let r = g.rows[0];
                    Some(LayerKv {
                        k: kv.k.f_narrow(0, r, 1)?.f_narrow(2, 0, p)?,
                        v: kv.v.f_narrow(0, r, 1)?.f_narrow(2, 0, p)?,
                    })
                }
                _ => None,
            };
            let (y, _) =
                self.model
                    .layer_forward(i, xg, &g.rotary, g.docs.as_ref(), prefix.as_ref())?;
            groups.push(y);
        }
        Ok(Stage { std, groups })
    }

    fn final_norm(&self, x: &Stage) -> Result<Stage> {
        Ok(Stage {
            std: match &x.std {
                Some(h) => Some(self.model.final_norm(h)?),
                None => None,
            },
            groups: x
                .groups
                .iter()
                .map(|h| self.model.final_norm(h))
                .collect::<rsd_model::Result<_>>()?,
        })
    }
}

/// Activations of both views at one stage.
struct Stage {
    std: Option<Tensor>,
    groups: Vec<Tensor>,
}

impl Stage {
    fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.std.iter().chain(self.groups.iter())
    }

    /// Detached copies that require grad (leaves).
    fn leaves(&self) -> Stage {
        let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
        Stage {
            std: self.std.as_ref().map(leaf),
            groups: self.groups.iter().map(leaf).collect(),
        }
    }

    fn detached(&self) -> Stage {
        Stage {
            std: self.std.as_ref().map(|t| t.detach()),
            groups: self.groups.iter().map(|t| t.detach()).collect(),
        }
    }

    /// The leaves' gradients (undefined where no loss reached).
    fn grads(&self) -> Vec<Tensor> {
        self.tensors().map(|t| t.grad()).collect()
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

/// Runs the chunked loss on the final hidden states `h` (in the graph) and back-propagates it:
/// into the LM head and through `h` into the decoder, in one backward.
fn loss_backward(
    plan: &Plan<'_>,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    h: &Stage,
    opts: &StepOptions,
    norm: Norm,
    sums: &mut Sums,
) -> Result<()> {
    let g = tch::no_grad(|| -> Result<LossGrads> {
        let short = match opts.long_ce {
            Some(lc) => Some(short_context_logprobs(plan.model, mb, lc, opts.loss_chunk)?),
            None => None,
        };
        chunked_loss(
            plan,
            mb,
            views,
            &h.detached(),
            opts,
            norm,
            short.as_ref(),
            sums,
        )
    })?;
    let w = plan.model.lm_head_weight();
    surrogate_backward(
        h.tensors()
            .zip(g.hidden.tensors())
            .chain(std::iter::once((w, &g.weight))),
    )
}

/// Forward both views, compute the chunked loss (closed-form logit gradients), then one backward
/// through the LM head and the decoder. Accumulates parameter gradients (scaled by `norm`) and
/// adds the step's loss terms to `sums`.
pub fn step_micro(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
    norm: Norm,
    sums: &mut Sums,
) -> Result<()> {
    if opts.long_ce.is_some() && !matches!(opts.objective, Objective::Standard | Objective::Rsd) {
        return Err(Error::Input(format!(
            "LongCE reweights the standard-view CLM term of `standard` and `rsd`; objective {:?} \
             has none to reweight (set long_ce_window = 0)",
            opts.objective
        )));
    }
    let plan = Plan::new(model, mb, views, opts)?;
    if !opts.checkpoint_layers {
        let mut x = plan.embed()?;
        for i in 0..model.num_layers() {
            x = plan.layer(i, &x)?;
        }
        let h = plan.final_norm(&x)?;
        return loss_backward(&plan, mb, views, &h, opts, norm, sums);
    }
    // Checkpointed: keep each stage's input only.
    let mut inputs: Vec<Stage> = Vec::with_capacity(model.num_layers() + 1);
    tch::no_grad(|| -> Result<()> {
        let mut x = plan.embed()?;
        for i in 0..model.num_layers() {
            let y = plan.layer(i, &x)?;
            inputs.push(x.detached());
            x = y;
        }
        inputs.push(x.detached());
        Ok(())
    })?;
    let top = inputs.pop().expect("final stage input");
    let leaf = top.leaves();
    let h = plan.final_norm(&leaf)?;
    loss_backward(&plan, mb, views, &h, opts, norm, sums)?;
    let mut grads = leaf.grads();
    for i in (0..model.num_layers()).rev() {
        let leaf = inputs.pop().expect("layer input").leaves();
        let y = plan.layer(i, &leaf)?;
        surrogate_backward(y.tensors().zip(&grads))?;
        grads = leaf.grads();
    }
    let emb = plan.embed()?;
    surrogate_backward(emb.tensors().zip(&grads))
}

/// `log p(label_i | short context)` for every row and position `[B, L]` (0 where there is no
/// label), from one forward without a graph in which the sequence is cut into `window`-token
/// pieces (and at document starts), each attending only to itself from position 0.
fn short_context_logprobs(
    model: &Model,
    mb: &MicroBatch,
    lc: LongCe,
    chunk: i64,
) -> Result<Tensor> {
    if lc.window < 1 {
        return Err(Error::Input(format!(
            "long_ce_window must be ≥ 1 (got {})",
            lc.window
        )));
    }
    let (b, l) = (mb.rows(), mb.len());
    let mut cuts = Vec::with_capacity(b);
    let mut positions = Vec::with_capacity(b);
    for r in 0..b {
        let mut cu: Vec<i64> = (0..l).step_by(lc.window as usize).collect();
        if let Some(d) = &mb.docs {
            cu.extend(d[r].iter().copied().filter(|&x| x < l));
        }
        cu.push(l);
        cu.sort_unstable();
        cu.dedup();
        let mut pos = Vec::with_capacity(l as usize);
        for w in cu.windows(2) {
            pos.extend(0..w[1] - w[0]);
        }
        cuts.push(cu);
        positions.push(pos);
    }
    let device = mb.tokens.device();
    let docs = DocBoundaries::new(cuts, l)?;
    let pos = pos_tensor(&positions, device)?;
    let hidden = model
        .forward(&rsd_model::ForwardArgs {
            docs: Some(&docs),
            ..rsd_model::ForwardArgs::new(&mb.tokens, &pos)
        })?
        .hidden;
    let w = model.lm_head_weight();
    let lk = rsd_model::accum_kind(w.kind());
    let out = Tensor::f_zeros([b as i64, l], (lk, device))?;
    let c = chunk.max(1);
    for r in 0..b as i64 {
        let (h, labels) = (hidden.f_get(r)?, mb.labels.f_get(r)?);
        let mut i0 = 0;
        while i0 < l {
            let n = c.min(l - i0);
            let logp = h
                .f_narrow(0, i0, n)?
                .f_matmul(&w.f_tr()?)?
                .f_to_kind(lk)?
                .f_log_softmax(-1, lk)?;
            let y = labels.f_narrow(0, i0, n)?;
            let picked = logp
                .f_gather(1, &y.f_clamp_min(0)?.f_unsqueeze(1)?, false)?
                .f_squeeze_dim(1)?
                .f_mul(&y.f_ne(-100)?.f_to_kind(lk)?)?;
            out.f_get(r)?.f_narrow(0, i0, n)?.f_copy_(&picked)?;
            i0 += n;
        }
    }
    Ok(out)
}

/// Gradients of the loss with respect to the final hidden states (laid out like the [`Stage`])
/// and the LM-head weight.
struct LossGrads {
    hidden: Stage,
    weight: Tensor,
}

/// Per-row cross entropy of `logits` `[n, V]` (fp32/fp64) against `labels` `[n]` (−100 = none),
/// its log-softmax, and the closed-form logit gradient `w_i · (softmax_i − onehot(y_i))` for
/// per-row weights `w` `[n]` (rows without a label get no gradient).
///
/// With `long_ce = Some((short, γ))` (`short`: the labels' log-probabilities under the short
/// context), each row's CE and gradient are also weighted by the LongCE importance
/// `min(exp(log p_long − log p_short), γ)`, a constant (no gradient flows through it); the
/// returned CE is then the weighted one, the term actually optimised.
fn cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    w: &Tensor,
    long_ce: Option<(&Tensor, f64)>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let kind = logits.kind();
    let logq = logits.f_log_softmax(-1, kind)?;
    let mut valid = labels.f_ne(-100)?.f_to_kind(kind)?;
    let target = labels.f_clamp_min(0)?.f_unsqueeze(1)?;
    let picked = logq.f_gather(1, &target, false)?.f_squeeze_dim(1)?;
    let mut grad = logq.f_exp()?;
    let _ = grad.f_scatter_add_(1, &target, &valid.f_neg()?.f_unsqueeze(1)?)?;
    if let Some((short, gamma)) = long_ce {
        let importance = picked.f_sub(short)?.f_exp()?.f_clamp_max(gamma)?;
        valid = valid.f_mul(&importance)?;
    }
    let ce = picked.f_mul(&valid)?.f_neg()?;
    let _ = grad.f_mul_(&w.f_mul(&valid)?.f_unsqueeze(1)?)?;
    Ok((ce, logq, grad))
}

/// Per-row KL between the perturbed view (`logp_logits`, raw logits) and the detached teacher
/// log-probabilities `logq`, and the closed-form gradient with respect to the perturbed logits,
/// scaled per row by `w`:
///
/// * reverse `KL(p ‖ q) = Σ_v p_v (log p_v − log q_v)`, gradient `p ⊙ (log p − log q − KL)`;
/// * forward `KL(q ‖ p)`, gradient `p − q`.
fn kl_rows(
    logits: &Tensor,
    logq: &Tensor,
    w: &Tensor,
    dir: KlDirection,
) -> Result<(Tensor, Tensor)> {
    let kind = logits.kind();
    let mut logp = logits.f_log_softmax(-1, kind)?;
    let w = w.f_unsqueeze(1)?;
    match dir {
        KlDirection::Reverse => {
            // Few passes over [rows × vocab]: d = log p − log q in place, the row sums as a
            // batched dot product (no product tensor), then g = (d − KL) ⊙ p ⊙ w in place.
            let p = logp.f_exp()?;
            let mut d = logp.f_sub_(logq)?;
            let (m, v) = (d.size()[0], d.size()[1]);
            let kl = p
                .f_view([m, 1, v])?
                .f_bmm(&d.f_view([m, v, 1])?)?
                .f_view([m])?;
            let _ = d.f_sub_(&kl.f_unsqueeze(1)?)?;
            let _ = d.f_mul_(&p)?;
            let _ = d.f_mul_(&w)?;
            Ok((kl, d))
        }
        KlDirection::Forward => {
            let q = logq.f_exp()?;
            let kl = q
                .f_mul(&logq.f_sub(&logp)?)?
                .f_sum_dim_intlist(-1, false, kind)?;
            let _ = logp.f_exp_()?;
            let _ = logp.f_sub_(&q)?;
            let _ = logp.f_mul_(&w)?;
            Ok((kl, logp))
        }
    }
}

/// The loss in chunks of rows: for each chunk the logits of both views are formed, the loss terms
/// and their closed-form logit gradients computed, and the gradients pushed through the LM head
/// (`dW += gᵀ h`, `dh = g W`) at once, so at most one chunk of `[rows × vocab]` exists and nothing
/// vocabulary-wide is kept for autograd. Runs without a graph.
#[allow(clippy::too_many_arguments)]
fn chunked_loss(
    plan: &Plan<'_>,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    h: &Stage,
    opts: &StepOptions,
    norm: Norm,
    short: Option<&Tensor>,
    sums: &mut Sums,
) -> Result<LossGrads> {
    let model = plan.model;
    let w = model.lm_head_weight();
    let wk = w.kind();
    let lk = rsd_model::accum_kind(wk);
    let device = mb.tokens.device();
    let mut dw = Tensor::f_zeros(w.size(), (lk, device))?;
    let dh = Stage {
        std: match &h.std {
            Some(t) => Some(t.f_zeros_like()?),
            None => None,
        },
        groups: h
            .groups
            .iter()
            .map(|t| t.f_zeros_like())
            .collect::<std::result::Result<_, _>>()?,
    };
    // logits = h Wᵀ in the model dtype, the loss in lk; the gradient goes back the same way.
    let logits = |x: &Tensor| -> Result<Tensor> { Ok(x.f_matmul(&w.f_tr()?)?.f_to_kind(lk)?) };
    let mut push_back = |g: &Tensor, x: &Tensor, mut dx: Tensor| -> Result<()> {
        let g = g.f_to_kind(wk)?;
        let _ = dx.f_addmm_(&g, w)?;
        if wk == lk {
            let _ = dw.f_addmm_(&g.f_tr()?, x)?;
        } else {
            let _ = dw.f_add_(&g.f_tr()?.f_matmul(x)?.f_to_kind(lk)?)?;
        }
        Ok(())
    };
    let (l, c) = (mb.len(), opts.loss_chunk.max(1));
    let ce_scale = 1.0 / norm.label_tokens.max(1.0);
    let kl_scale = opts.lambda / norm.samples.max(1.0);
    let obj = opts.objective;
    let full = |n: i64, v: f64| Tensor::f_full([n], v, (lk, device));
    let add = |acc: &mut Tensor, v: &Tensor| -> Result<()> {
        *acc = acc.f_add(&v.f_sum(Kind::Double)?)?;
        Ok(())
    };
    for b in 0..mb.rows() {
        let labels = mb.labels.f_get(b as i64)?;
        let (gi, gj, p) = plan.row_group.get(b).copied().unwrap_or((usize::MAX, 0, l));
        let hs = match (&h.std, &dh.std) {
            (Some(t), Some(d)) => Some((t.f_get(b as i64)?, d.f_get(b as i64)?)),
            _ => None,
        };
        let hp = match (h.groups.get(gi), dh.groups.get(gi)) {
            (Some(t), Some(d)) => Some((t.f_get(gj)?, d.f_get(gj)?)),
            _ => None,
        };
        let view = views.map(|v| &v[b]);
        let kl_weights = match view {
            Some(v) if obj == Objective::Rsd && v.kl_rows > 0 => {
                let m: Vec<f64> = v.kl_mask.iter().map(|&x| x as u8 as f64).collect();
                Some((
                    Tensor::f_from_slice(&m)?
                        .f_to_kind(lk)?
                        .f_to_device(device)?,
                    v.kl_rows as f64,
                ))
            }
            _ => None,
        };
        let mut i0 = 0;
        while i0 < l {
            let i1 = (i0 + c).min(l);
            let n = i1 - i0;
            // Standard rows [i0, i1): CLM (and, for two-view-clm, the rows before p that the
            // perturbed view shares), and the teacher's log-probabilities.
            let mut logq = None;
            if let (Some((hs, dhs)), true) = (&hs, obj != Objective::Pose) {
                let x = hs.f_narrow(0, i0, n)?;
                let wrow = full(n, ce_scale)?;
                let shared = if obj == Objective::TwoViewClm {
                    p.min(i1) - i0
                } else {
                    0
                };
                if shared > 0 {
                    let _ = wrow
                        .f_narrow(0, 0, shared)?
                        .f_fill_(ce_scale * (1.0 + opts.lambda))?;
                }
                let short_rows = match short {
                    Some(t) => Some(t.f_get(b as i64)?.f_narrow(0, i0, n)?),
                    None => None,
                };
                let long_ce = short_rows.as_ref().zip(opts.long_ce.map(|lc| lc.gamma));
                let (ce, lq, g) =
                    cross_entropy(&logits(&x)?, &labels.f_narrow(0, i0, n)?, &wrow, long_ce)?;
                add(&mut sums.clm, &ce)?;
                if shared > 0 {
                    add(&mut sums.clm_pert, &ce.f_narrow(0, 0, shared)?)?;
                }
                push_back(&g, &x, dhs.f_narrow(0, i0, n)?)?;
                logq = Some(lq);
            }
            // Perturbed rows of this chunk: [j0, i1), read from the suffix pass at j − p.
            let j0 = i0.max(p);
            let Some((hp, dhp)) = hp.as_ref().filter(|_| j0 < i1) else {
                i0 = i1;
                continue;
            };
            let m = i1 - j0;
            let x = hp.f_narrow(0, j0 - p, m)?;
            let dx = dhp.f_narrow(0, j0 - p, m)?;
            match obj {
                Objective::Standard => {}
                Objective::Rsd => {
                    let any =
                        view.is_some_and(|v| v.kl_mask[j0 as usize..i1 as usize].contains(&true));
                    if let (Some((mask, rows)), Some(logq), true) = (&kl_weights, &logq, any) {
                        let mask = mask.f_narrow(0, j0, m)?;
                        let wrow = mask.f_mul_scalar(kl_scale / rows)?;
                        let teacher = logq.f_narrow(0, j0 - i0, m)?;
                        let (kl, g) = kl_rows(&logits(&x)?, &teacher, &wrow, opts.kl)?;
                        add(&mut sums.kl, &kl.f_mul(&mask)?.f_div_scalar(*rows)?)?;
                        push_back(&g, &x, dx)?;
                    }
                }
                Objective::Pose | Objective::TwoViewClm => {
                    let scale = if obj == Objective::Pose {
                        ce_scale
                    } else {
                        ce_scale * opts.lambda
                    };
                    let (ce, _, g) = cross_entropy(
                        &logits(&x)?,
                        &labels.f_narrow(0, j0, m)?,
                        &full(m, scale)?,
                        None,
                    )?;
                    add(
                        if obj == Objective::Pose {
                            &mut sums.clm
                        } else {
                            &mut sums.clm_pert
                        },
                        &ce,
                    )?;
                    push_back(&g, &x, dx)?;
                }
            }
            i0 = i1;
        }
    }
    Ok(LossGrads {
        hidden: dh,
        weight: dw,
    })
}

/// Slow reference of the whole objective: two full passes (no prefix reuse), full `[B, L, V]`
/// logits, the formulas written out, one backward. Tests compare [`step_micro`] against it.
pub fn reference_loss(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
    norm: Norm,
) -> Result<(Tensor, f64, f64)> {
    if opts.long_ce.is_some() {
        return Err(Error::Input(
            "the reference loss has no LongCE (tests/test_train.py checks LongCE against PyTorch)"
                .into(),
        ));
    }
    let device = mb.tokens.device();
    let (b, l) = (mb.rows() as i64, mb.len());
    let docs = match &mb.docs {
        Some(d) => Some(DocBoundaries::new(d.clone(), l)?),
        None => None,
    };
    let logits_at = |pos: &[Vec<i64>]| -> Result<Tensor> {
        let p = pos_tensor(pos, device)?;
        let h = model
            .forward(&rsd_model::ForwardArgs {
                docs: docs.as_ref(),
                ..rsd_model::ForwardArgs::new(&mb.tokens, &p)
            })?
            .hidden;
        Ok(model.logits(&h)?.f_to_kind(Kind::Double)?)
    };
    let ce = |logits: &Tensor| -> Result<Tensor> {
        Ok(logits
            .f_view([b * l, -1])?
            .f_cross_entropy_loss::<Tensor>(
                &mb.labels.f_view([b * l])?,
                None,
                Reduction::Sum,
                -100,
                0.0,
            )?
            .f_div_scalar(norm.label_tokens)?)
    };
    let pert = || -> Result<Tensor> {
        let v = views.ok_or_else(|| Error::Input("no views".into()))?;
        let pos: Vec<Vec<i64>> = v.iter().map(|r| r.positions.clone()).collect();
        logits_at(&pos)
    };
    let zero = Tensor::zeros([], (Kind::Double, device));
    let (clm, second) = match opts.objective {
        Objective::Standard => (ce(&logits_at(&mb.positions)?)?, zero),
        Objective::Pose => (ce(&pert()?)?, zero),
        Objective::TwoViewClm => (ce(&logits_at(&mb.positions)?)?, ce(&pert()?)?),
        Objective::Rsd => {
            let ls = logits_at(&mb.positions)?;
            let lp = pert()?;
            let logp = lp.f_log_softmax(-1, Kind::Double)?;
            let logq = ls.detach().f_log_softmax(-1, Kind::Double)?;
            let rows = match opts.kl {
                KlDirection::Reverse => logp.f_exp()?.f_mul(&logp.f_sub(&logq)?)?,
                KlDirection::Forward => logq.f_exp()?.f_mul(&logq.f_sub(&logp)?)?,
            }
            .f_sum_dim_intlist(-1, false, Kind::Double)?; // [B, L]
            let mut kl = Tensor::zeros([], (Kind::Double, device));
            for (r, v) in views.unwrap_or_default().iter().enumerate() {
                if v.kl_rows == 0 {
                    continue;
                }
                let m: Vec<f64> = v.kl_mask.iter().map(|&x| x as u8 as f64).collect();
                let m = Tensor::f_from_slice(&m)?.f_to_device(device)?;
                kl = kl.f_add(
                    &rows
                        .f_get(r as i64)?
                        .f_mul(&m)?
                        .f_sum(Kind::Double)?
                        .f_div_scalar(v.kl_rows as f64)?,
                )?;
            }
            (ce(&ls)?, kl.f_div_scalar(norm.samples)?)
        }
    };
    let total = clm.f_add(&second.f_mul_scalar(opts.lambda)?)?;
    let (c, s) = (clm.double_value(&[]), second.double_value(&[]));
    Ok((total, c, s))
}

/// The FLOP floor of an `rsd` skip step with prefix reuse, as a multiple of a `standard` step,
/// for split points `s` uniform over the sequence (matmul FLOPs only; backward scales the same).
///
/// Per token, a layer costs `2·(d·(q + 2·kv) + q·d + 3·d·ffn)` in its linear maps and `4·(L/2)·q`
/// in causal attention (`L/2` keys on average); the LM head `2·d·V`. The second view runs the rows
/// after `s`: on average half the rows for the linear maps and the head, and `E[(L² − s²)/2] =
/// L²/3` of the `L²/2` query–key pairs (two thirds) for attention. So the floor is
/// `1 + (½·(lin + head) + ⅔·att) / (lin + head + att)`; it approaches 1.5 for large models.
pub fn prefix_reuse_floor(c: &rsd_model::ModelConfig, seq_len: i64) -> f64 {
    let (d, l) = (c.hidden_size as f64, seq_len as f64);
    let q = (c.num_attention_heads * c.head_dim) as f64;
    let kv = (c.num_key_value_heads * c.head_dim) as f64;
    let layers = c.num_hidden_layers as f64;
    let lin = layers * 2.0 * (d * (q + 2.0 * kv) + q * d + 3.0 * d * c.intermediate_size as f64);
    let head = 2.0 * d * c.vocab_size as f64;
    let att = layers * 4.0 * (l / 2.0) * q;
    1.0 + (0.5 * (lin + head) + 2.0 / 3.0 * att) / (lin + head + att)
}

/// Global L2 norm of the parameters' gradients (fp64 accumulation; one host sync).
pub fn grad_norm(model: &Model) -> Result<f64> {
    let mut sq = 0f64;
    for (_, p) in model.named_parameters() {
        let g = p.grad();
        if g.defined() {
            sq += g
                .f_to_kind(Kind::Double)?
                .f_square()?
                .f_sum(Kind::Double)?
                .double_value(&[]);
        }
    }
    Ok(sq.sqrt())
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
