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
fn surrogate_backward(outputs: &Stage, grads: &[Tensor]) -> Result<()> {
    let mut total: Option<Tensor> = None;
    for (y, g) in outputs.tensors().zip(grads) {
        if !g.defined() || !y.requires_grad() {
            continue;
        }
        let s = y.f_mul(&g.detach())?.f_sum(Kind::Float)?;
        total = Some(match total {
            Some(t) => t.f_add(&s)?,
            None => s,
        });
    }
    if let Some(t) = total {
        t.f_backward()?;
    }
    Ok(())
}

/// Forward both views, compute the chunked loss with per-chunk backward into the hidden leaves,
/// then the decoder's backward. Accumulates parameter gradients (scaled by `norm`) and adds the
/// step's loss terms to `sums`.
pub fn step_micro(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
    norm: Norm,
    sums: &mut Sums,
) -> Result<()> {
    let plan = Plan::new(model, mb, views, opts)?;
    if !opts.checkpoint_layers {
        let mut x = plan.embed()?;
        for i in 0..model.num_layers() {
            x = plan.layer(i, &x)?;
        }
        let h = plan.final_norm(&x)?;
        let leaves = h.leaves();
        chunked_loss(&plan, mb, views, &leaves, opts, norm, sums)?;
        return surrogate_backward(&h, &leaves.grads());
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
    let hidden = h.leaves();
    chunked_loss(&plan, mb, views, &hidden, opts, norm, sums)?;
    surrogate_backward(&h, &hidden.grads())?;
    let mut grads = leaf.grads();
    for i in (0..model.num_layers()).rev() {
        let leaf = inputs.pop().expect("layer input").leaves();
        let y = plan.layer(i, &leaf)?;
        surrogate_backward(&y, &grads)?;
        grads = leaf.grads();
    }
    let emb = plan.embed()?;
    surrogate_backward(&emb, &grads)
}

/// The loss in chunks of rows, each chunk back-propagated into the hidden-state leaves at once.
fn chunked_loss(
    plan: &Plan<'_>,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    h: &Stage,
    opts: &StepOptions,
    norm: Norm,
    sums: &mut Sums,
) -> Result<()> {
    let model = plan.model;
    let lk = if model.options().kind == Kind::Double {
        Kind::Double
    } else {
        Kind::Float
    };
    let device = mb.tokens.device();
    let (l, c) = (mb.len(), opts.loss_chunk.max(1));
    let ce_scale = 1.0 / norm.label_tokens.max(1.0);
    let kl_scale = opts.lambda / norm.samples.max(1.0);
    let obj = opts.objective;
    for b in 0..mb.rows() {
        let labels = mb.labels.f_get(b as i64)?;
        let hs = match &h.std {
            Some(t) => Some(t.f_get(b as i64)?),
            None => None,
        };
        let (gi, gj, p) = plan.row_group.get(b).copied().unwrap_or((usize::MAX, 0, l));
        let hp = match h.groups.get(gi) {
            Some(t) => Some(t.f_get(gj)?),
            None => None,
        };
        let view = views.map(|v| &v[b]);
        let mask = match view {
            Some(v) if obj == Objective::Rsd && v.kl_rows > 0 => {
                let m: Vec<f64> = v.kl_mask.iter().map(|&x| x as u8 as f64).collect();
                Some(
                    Tensor::f_from_slice(&m)?
                        .f_to_kind(lk)?
                        .f_to_device(device)?,
                )
            }
            _ => None,
        };
        let mut i0 = 0;
        while i0 < l {
            let i1 = (i0 + c).min(l);
            let n = i1 - i0;
            let mut terms: Vec<Tensor> = Vec::new();
            let ls = match &hs {
                Some(hs) => Some(model.logits(&hs.f_narrow(0, i0, n)?)?.f_to_kind(lk)?),
                None => None,
            };
            let ce = |logits: &Tensor, from: i64, len: i64| -> Result<Tensor> {
                Ok(logits.f_cross_entropy_loss::<Tensor>(
                    &labels.f_narrow(0, from, len)?,
                    None,
                    Reduction::Sum,
                    -100,
                    0.0,
                )?)
            };
            // Standard-view CLM.
            if let (Some(ls), true) = (&ls, obj != Objective::Pose) {
                let v = ce(ls, i0, n)?;
                sums.clm = sums.clm.f_add(&v.detach().f_to_kind(Kind::Double)?)?;
                terms.push(v.f_mul_scalar(ce_scale)?);
            }
            // Perturbed rows of this chunk: [j0, i1), read from the suffix pass at j − p.
            let j0 = i0.max(p);
            let lp = match (&hp, j0 < i1) {
                (Some(hp), true) => Some(model.logits(&hp.f_narrow(0, j0 - p, i1 - j0)?)?),
                _ => None,
            };
            match obj {
                Objective::Standard => {}
                Objective::Rsd => {
                    let any = j0 < i1
                        && view
                            .is_some_and(|v| v.kl_mask[j0 as usize..i1 as usize].contains(&true));
                    if let (Some(lp), Some(ls), Some(mask), true) = (&lp, &ls, &mask, any) {
                        let logp = lp.f_to_kind(lk)?.f_log_softmax(-1, lk)?;
                        let logq = ls
                            .f_narrow(0, j0 - i0, i1 - j0)?
                            .detach()
                            .f_log_softmax(-1, lk)?;
                        let rows = match opts.kl {
                            KlDirection::Reverse => logp.f_exp()?.f_mul(&logp.f_sub(&logq)?)?,
                            KlDirection::Forward => logq.f_exp()?.f_mul(&logq.f_sub(&logp)?)?,
                        }
                        .f_sum_dim_intlist(-1, false, lk)?;
                        let kl_rows = view.map_or(1, |v| v.kl_rows) as f64;
                        let kl = rows
                            .f_mul(&mask.f_narrow(0, j0, i1 - j0)?)?
                            .f_sum(lk)?
                            .f_div_scalar(kl_rows)?;
                        sums.kl = sums.kl.f_add(&kl.detach().f_to_kind(Kind::Double)?)?;
                        terms.push(kl.f_mul_scalar(kl_scale)?);
                    }
                }
                Objective::Pose => {
                    if let Some(lp) = &lp {
                        let v = ce(&lp.f_to_kind(lk)?, j0, i1 - j0)?;
                        sums.clm = sums.clm.f_add(&v.detach().f_to_kind(Kind::Double)?)?;
                        terms.push(v.f_mul_scalar(ce_scale)?);
                    }
                }
                Objective::TwoViewClm => {
                    // Rows before p are the standard rows (identical computation).
                    let mut v = Tensor::zeros([], (lk, device));
                    if let (Some(ls), true) = (&ls, i0 < p) {
                        let k = p.min(i1) - i0;
                        v = v.f_add(&ce(&ls.f_narrow(0, 0, k)?, i0, k)?)?;
                    }
                    if let Some(lp) = &lp {
                        v = v.f_add(&ce(&lp.f_to_kind(lk)?, j0, i1 - j0)?)?;
                    }
                    sums.clm_pert = sums.clm_pert.f_add(&v.detach().f_to_kind(Kind::Double)?)?;
                    terms.push(v.f_mul_scalar(ce_scale * opts.lambda)?);
                }
            }
            let mut total: Option<Tensor> = None;
            for t in terms {
                if t.requires_grad() {
                    total = Some(match total {
                        Some(s) => s.f_add(&t)?,
                        None => t,
                    });
                }
            }
            if let Some(t) = total {
                t.f_backward()?;
            }
            i0 = i1;
        }
    }
    Ok(())
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
