//! The two views' forward, layer by layer, with prefix reuse.
//!
//! Rows before the shared prefix `P` (first row whose position changed, see [`crate::perturb`])
//! are identical in both views, so the perturbed pass runs only rows `P..L`, attending to the
//! standard pass's post-RoPE K/V of rows `0..P` (rsd-model's `prefix`). Those K/V stay in the
//! autograd graph: the KL's gradient through them reaches the standard pass, as the true gradient
//! of the loss does. `P` differs per row, so the suffix pass runs per row; without reuse (or for
//! perturbations with `P = 0`, e.g. cyclic) one batched full pass runs instead.
use tch::Tensor;

use rsd_model::{ContextChunks, DocBoundaries, LayerKv, Model, Rotary, ScoreChanges};

use super::{Draws, MicroBatch, Objective, SecondView, StepOptions};
use crate::perturb::RowView;
use crate::{Error, Result};

/// One pass of the perturbed view: either every row from row 0 (no reuse), or one row from its
/// shared prefix on.
struct PerturbedPass {
    /// The standard row whose K/V of rows `0..start` this pass attends to (one-row passes).
    prefix_row: i64,
    /// First row the pass computes; rows before it come from the standard pass's K/V.
    start: i64,
    /// Token ids `[rows, L − start]`.
    tokens: Tensor,
    rotary: Rotary,
    docs: Option<DocBoundaries>,
}

/// Where one row's perturbed view lives among the plan's perturbed passes.
#[derive(Debug, Clone, Copy)]
pub(super) struct PerturbedRow {
    /// Index of the pass (and of its activations in [`Stage::perturbed`]).
    pub pass: usize,
    /// The row's index in that pass's batch.
    pub index: i64,
    /// First row the pass computes (the row's hidden state `i` is at `i − start`).
    pub start: i64,
}

/// Everything both views need, built once per micro-batch.
pub(super) struct Plan<'a> {
    pub model: &'a Model,
    tokens: &'a Tensor,
    /// The standard view's rotary tables and document mask (`None` for `pose`).
    std: Option<(Rotary, Option<DocBoundaries>)>,
    perturbed: Vec<PerturbedPass>,
    /// Per row: its perturbed view (`None`: no perturbed view, or nothing changed in the row).
    rows: Vec<Option<PerturbedRow>>,
    /// Context parallelism: the rows are this rank's chunks of longer sequences.
    context: Option<&'a ContextChunks<'a>>,
    /// A control view's randomness (`None` for position perturbations).
    control: Option<Control<'a>>,
}

/// What the passes of a control view draw, and from which seeds.
struct Control<'a> {
    view: SecondView,
    /// The seed of each row of the micro-batch ([`RowView::seed`]).
    seeds: Vec<i64>,
    /// The micro-batch rows of the perturbed pass.
    perturbed_rows: Vec<i64>,
    /// Where the draws are recorded, if anywhere.
    draws: Option<&'a Draws>,
}

/// Pass index of the standard view in the seeds (`seed + 2·layer + pass`).
const STANDARD_PASS: i64 = 0;
/// Pass index of the perturbed view.
const PERTURBED_PASS: i64 = 1;

/// Position ids `[B, L]` on `device` from host rows.
pub(super) fn pos_tensor(rows: &[Vec<i64>], device: tch::Device) -> Result<Tensor> {
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
    pub fn new(
        model: &'a Model,
        mb: &'a MicroBatch,
        views: Option<&[RowView]>,
        opts: &StepOptions,
        context: Option<&'a ContextChunks<'a>>,
        draws: Option<&'a Draws>,
    ) -> Result<Self> {
        let device = mb.tokens.device();
        let all: Vec<i64> = (0..mb.rows() as i64).collect();
        // Under context parallelism the document boundaries are the whole rows' and reach the
        // attention through the context (`ContextChunks::docs`), not per pass.
        let docs = |rows: &[i64]| match context {
            Some(_) => Ok(None),
            None => docs_of(mb, rows),
        };
        let std = if opts.objective != Objective::Pose {
            Some((
                model.rotary(&pos_tensor(&mb.positions, device)?)?,
                docs(&all)?,
            ))
        } else {
            None
        };
        let mut plan = Plan {
            model,
            tokens: &mb.tokens,
            std,
            perturbed: Vec::new(),
            rows: Vec::new(),
            context,
            control: None,
        };
        if opts.view != SecondView::Positions {
            // A control view: one batched second pass over the rows with KL rows, at the standard
            // positions (nothing is shared, so no prefix reuse).
            let views = checked_views(mb, views)?;
            let rows: Vec<i64> = (0..mb.rows() as i64)
                .filter(|&r| views[r as usize].changes_anything())
                .collect();
            plan.rows = vec![None; mb.rows()];
            if !rows.is_empty() {
                let nope = opts.view == SecondView::Nope;
                plan.add_full_pass(mb, views, &rows, docs(&rows)?, nope)?;
            }
            plan.control = Some(Control {
                view: opts.view,
                seeds: views.iter().map(|v| v.seed).collect(),
                perturbed_rows: rows,
                draws,
            });
            return Ok(plan);
        }
        if opts.objective.needs_perturbed() {
            let views = checked_views(mb, views)?;
            // For rsd a row whose view changes no logit row carries nothing (no KL; the CLM is the
            // standard view's): its perturbed view is not computed. The other objectives train on
            // the perturbed logits themselves, so every row runs.
            let needed: Vec<bool> = views
                .iter()
                .map(|v| opts.objective != Objective::Rsd || v.changes_anything())
                .collect();
            // Under context parallelism both views run whole (each rank its chunks of both), so a
            // perturbed row and its teacher live on the same rank.
            let reuse = opts.prefix_reuse
                && context.is_none()
                && plan.std.is_some()
                && views.iter().any(|v| v.shared_prefix > 0);
            if reuse {
                plan.add_suffix_passes(mb, views, &needed)?;
            } else if needed.iter().any(|&n| n) {
                // Every rank of a context-parallel group decides alike (`kl_rows` is the whole
                // sequence's); its attention takes the whole micro-batch, so all rows run there.
                let rows: Vec<i64> = match context {
                    Some(_) => all.clone(),
                    None => (0..mb.rows() as i64)
                        .filter(|&r| needed[r as usize])
                        .collect(),
                };
                plan.add_full_pass(mb, views, &rows, docs(&rows)?, false)?;
            } else {
                plan.rows = vec![None; mb.rows()];
            }
        }
        Ok(plan)
    }

    /// One batched perturbed pass over the given rows from row 0 (`nope`: without rotary
    /// embeddings).
    fn add_full_pass(
        &mut self,
        mb: &MicroBatch,
        views: &[RowView],
        rows: &[i64],
        docs: Option<DocBoundaries>,
        nope: bool,
    ) -> Result<()> {
        let device = mb.tokens.device();
        let pert: Vec<Vec<i64>> = rows
            .iter()
            .map(|&r| views[r as usize].positions.clone())
            .collect();
        let tokens = if rows.len() == mb.rows() {
            mb.tokens.shallow_clone()
        } else {
            mb.tokens
                .f_index_select(0, &Tensor::f_from_slice(rows)?.f_to_device(device)?)?
        };
        self.perturbed.push(PerturbedPass {
            prefix_row: 0,
            start: 0,
            tokens,
            rotary: if nope {
                Rotary::none()
            } else {
                self.model.rotary(&pos_tensor(&pert, device)?)?
            },
            docs,
        });
        self.rows = vec![None; mb.rows()];
        for (index, &r) in rows.iter().enumerate() {
            self.rows[r as usize] = Some(PerturbedRow {
                pass: 0,
                index: index as i64,
                start: 0,
            });
        }
        Ok(())
    }

    /// Tokens the perturbed view computes (rows × positions over its passes): the work of the
    /// second view, 0 when no row needs one.
    pub fn perturbed_tokens(&self) -> i64 {
        self.perturbed
            .iter()
            .map(|g| g.tokens.size().iter().product::<i64>())
            .sum()
    }

    /// One perturbed pass per row, over the rows after its shared prefix.
    fn add_suffix_passes(
        &mut self,
        mb: &MicroBatch,
        views: &[RowView],
        needed: &[bool],
    ) -> Result<()> {
        let device = mb.tokens.device();
        let l = mb.len();
        for (r, v) in views.iter().enumerate() {
            let p = v.shared_prefix.min(l);
            if p == l || !needed[r] {
                // Nothing changed in this row (or nothing that carries a loss): no perturbed
                // rows at all.
                self.rows.push(None);
                continue;
            }
            let suffix = vec![v.positions[p as usize..].to_vec()];
            self.rows.push(Some(PerturbedRow {
                pass: self.perturbed.len(),
                index: 0,
                start: p,
            }));
            self.perturbed.push(PerturbedPass {
                prefix_row: r as i64,
                start: p,
                tokens: mb.tokens.f_narrow(0, r as i64, 1)?.f_narrow(1, p, l - p)?,
                rotary: self.model.rotary(&pos_tensor(&suffix, device)?)?,
                docs: docs_of(mb, &[r as i64])?,
            });
        }
        Ok(())
    }

    /// Where row `b`'s perturbed view lives, if it has one.
    pub fn perturbed_row(&self, b: usize) -> Option<PerturbedRow> {
        self.rows.get(b).copied().flatten()
    }

    /// Embeddings of both views.
    pub fn embed(&self) -> Result<Stage> {
        let std = match self.std {
            Some(_) => Some(self.model.embed(self.tokens)?),
            None => None,
        };
        let perturbed = self
            .perturbed
            .iter()
            .map(|g| self.model.embed(&g.tokens))
            .collect::<rsd_model::Result<_>>()?;
        Ok(Stage { std, perturbed })
    }

    /// Layer `i` for both views; the perturbed rows take the standard K/V of rows `0..p` as prefix.
    pub fn layer(&self, i: usize, x: &Stage) -> Result<Stage> {
        let mut kv = None;
        let std = match (&self.std, &x.std) {
            (Some((rot, docs)), Some(xs)) => {
                let changed = self.changes(i, STANDARD_PASS)?;
                let y = match (self.context, changed) {
                    (Some(cc), _) => self.model.layer_forward_split(i, xs, rot, cc)?.0,
                    (None, Some(c)) => self.model.layer_forward_changed(
                        i,
                        xs,
                        rot,
                        docs.as_ref(),
                        &c.as_changes(),
                    )?,
                    (None, None) => {
                        let (y, k) = self.model.layer_forward(i, xs, rot, docs.as_ref(), None)?;
                        kv = Some(k);
                        y
                    }
                };
                Some(y)
            }
            _ => None,
        };
        let mut perturbed = Vec::with_capacity(self.perturbed.len());
        for (g, xg) in self.perturbed.iter().zip(&x.perturbed) {
            let prefix = match (&kv, g.start) {
                (Some(kv), p) if p > 0 => {
                    let r = g.prefix_row;
                    Some(LayerKv {
                        k: kv.k.f_narrow(0, r, 1)?.f_narrow(2, 0, p)?,
                        v: kv.v.f_narrow(0, r, 1)?.f_narrow(2, 0, p)?,
                    })
                }
                _ => None,
            };
            let changed = self.changes(i, PERTURBED_PASS)?;
            let y = match (self.context, changed) {
                (Some(cc), _) => self.model.layer_forward_split(i, xg, &g.rotary, cc)?.0,
                (None, Some(c)) => self.model.layer_forward_changed(
                    i,
                    xg,
                    &g.rotary,
                    g.docs.as_ref(),
                    &c.as_changes(),
                )?,
                (None, None) => {
                    self.model
                        .layer_forward(i, xg, &g.rotary, g.docs.as_ref(), prefix.as_ref())?
                        .0
                }
            };
            perturbed.push(y);
        }
        Ok(Stage { std, perturbed })
    }

    /// The attention changes of a control view in layer `i` of `pass` (`None`: the fused
    /// attention). Attention noise runs both passes through the materialised attention, so that
    /// the noise is their only difference (σ = 0 gives identical views); dropout draws a mask
    /// for each pass.
    fn changes(&self, layer: usize, pass: i64) -> Result<Option<Drawn>> {
        let Some(c) = &self.control else {
            return Ok(None);
        };
        let rows: &[i64] = if pass == STANDARD_PASS {
            &(0..c.seeds.len() as i64).collect::<Vec<_>>()
        } else {
            &c.perturbed_rows
        };
        Ok(match (c.view, pass) {
            (SecondView::AttnNoise { .. }, STANDARD_PASS) => Some(Drawn::default()),
            (SecondView::AttnNoise { .. }, _) => Some(Drawn {
                noise: Some(self.draw(c, layer, pass, rows)?),
                keep: None,
            }),
            (SecondView::Dropout { rate }, _) => Some(Drawn {
                noise: None,
                keep: Some((self.draw(c, layer, pass, rows)?, rate)),
            }),
            _ => None,
        })
    }

    /// One control draw for layer `layer` of `pass` over the micro-batch rows `rows`,
    /// `[rows, heads, L, L]`: each row's after `manual_seed(seed + 2·layer + pass)` from
    /// libtorch's generator, so an activation-checkpointing recompute draws the same values and
    /// PyTorch reproduces them (`torch.manual_seed`, then `torch.randn` / `torch.rand`).
    fn draw(&self, c: &Control<'_>, layer: usize, pass: i64, rows: &[i64]) -> Result<Tensor> {
        let heads = self.model.config().num_attention_heads;
        let l = self.tokens.size()[1];
        let device = self.tokens.device();
        let acc = rsd_model::accum_kind(self.model.options().kind);
        let mut out = Vec::with_capacity(rows.len());
        for &r in rows {
            tch::manual_seed(c.seeds[r as usize] + 2 * layer as i64 + pass);
            out.push(match c.view {
                SecondView::AttnNoise { sigma } => {
                    Tensor::f_randn([heads, l, l], (acc, device))?.f_mul_scalar(sigma)?
                }
                SecondView::Dropout { rate } => {
                    Tensor::f_rand([heads, l, l], (acc, device))?.f_ge(rate)?
                }
                _ => return Err(Error::Input("no random draws for this view".into())),
            });
        }
        let t = Tensor::f_stack(&out, 0)?;
        if let Some(draws) = c.draws {
            let view = if pass == STANDARD_PASS {
                "standard"
            } else {
                "perturbed"
            };
            let what = match c.view {
                SecondView::Dropout { .. } => "keep",
                _ => "score_noise",
            };
            draws
                .borrow_mut()
                .entry(format!("layers.{layer}.{view}.{what}"))
                .or_insert_with(|| t.shallow_clone());
        }
        Ok(t)
    }

    pub fn final_norm(&self, x: &Stage) -> Result<Stage> {
        Ok(Stage {
            std: match &x.std {
                Some(h) => Some(self.model.final_norm(h)?),
                None => None,
            },
            perturbed: x
                .perturbed
                .iter()
                .map(|h| self.model.final_norm(h))
                .collect::<rsd_model::Result<_>>()?,
        })
    }
}

/// A control view's drawn changes of one pass of one layer.
#[derive(Default)]
struct Drawn {
    noise: Option<Tensor>,
    keep: Option<(Tensor, f64)>,
}

impl Drawn {
    fn as_changes(&self) -> ScoreChanges<'_> {
        ScoreChanges {
            score_noise: self.noise.as_ref(),
            dropout: self.keep.as_ref().map(|(k, p)| (k, *p)),
        }
    }
}

/// The views, checked against the batch's shape.
fn checked_views<'v>(mb: &MicroBatch, views: Option<&'v [RowView]>) -> Result<&'v [RowView]> {
    let (b, l) = (mb.rows(), mb.len());
    let views = views.ok_or_else(|| {
        Error::Input("the objective needs a perturbed view, none was given".into())
    })?;
    if views.len() != b || views.iter().any(|v| v.positions.len() as i64 != l) {
        return Err(Error::Input(format!(
            "{} perturbed rows for a batch of {b} rows of length {l}",
            views.len()
        )));
    }
    Ok(views)
}

/// The document mask of the given rows (document-masked batches only).
fn docs_of(mb: &MicroBatch, rows: &[i64]) -> Result<Option<DocBoundaries>> {
    let Some(d) = &mb.docs else { return Ok(None) };
    let sel = rows.iter().map(|&r| d[r as usize].clone()).collect();
    Ok(Some(DocBoundaries::new(sel, mb.len())?))
}

/// Activations of both views at one stage (embeddings, a layer's output, final hidden states).
pub(super) struct Stage {
    /// The standard view `[B, L, D]` (`None` for `pose`).
    pub std: Option<Tensor>,
    /// One tensor per perturbed pass, in [`PerturbedRow::pass`] order.
    pub perturbed: Vec<Tensor>,
}

impl Stage {
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.std.iter().chain(self.perturbed.iter())
    }

    /// Detached copies that require grad (leaves).
    pub fn leaves(&self) -> Stage {
        let leaf = |t: &Tensor| t.detach().set_requires_grad(true);
        Stage {
            std: self.std.as_ref().map(leaf),
            perturbed: self.perturbed.iter().map(leaf).collect(),
        }
    }

    pub fn detached(&self) -> Stage {
        Stage {
            std: self.std.as_ref().map(|t| t.detach()),
            perturbed: self.perturbed.iter().map(|t| t.detach()).collect(),
        }
    }

    /// Zeros shaped like this stage (gradient accumulators).
    pub fn zeros_like(&self) -> Result<Stage> {
        Ok(Stage {
            std: match &self.std {
                Some(t) => Some(t.f_zeros_like()?),
                None => None,
            },
            perturbed: self
                .perturbed
                .iter()
                .map(|t| t.f_zeros_like())
                .collect::<std::result::Result<_, _>>()?,
        })
    }

    /// The leaves' gradients (undefined where no loss reached).
    pub fn grads(&self) -> Vec<Tensor> {
        self.tensors().map(|t| t.grad()).collect()
    }
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
