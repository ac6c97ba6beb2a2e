//! The two views' forward, layer by layer, with prefix reuse.
//!
//! Rows before the shared prefix `P` (first row whose position changed, see [`crate::perturb`])
//! are identical in both views, so the perturbed pass runs only rows `P..L`, attending to the
//! standard pass's post-RoPE K/V of rows `0..P` (rsd-model's `prefix`). Those K/V stay in the
//! autograd graph: the KL's gradient through them reaches the standard pass, as the true gradient
//! of the loss does. `P` differs per row, so the suffix pass runs per row; without reuse (or for
//! perturbations with `P = 0`, e.g. cyclic) one batched full pass runs instead.
//!
//! Under context parallelism the standard view is cut zigzag over the group, so the rows after
//! `P` sit unevenly on the ranks (a late `P` leaves them all on one rank). The suffix is
//! re-sharded instead: zigzag over `[P, L)` itself ([`crate::cp::suffix_chunks`]), each rank
//! computing the same number of suffix rows with the same attention work. Per layer, a suffix
//! piece attends to the standard view's gathered K/V of rows `0..P` (already gathered for the
//! standard view's own attention: no extra traffic) and to the gathered suffix K/V before it.
//! After the final norm the suffix's hidden states are gathered (d-wide, never logits) and each
//! rank takes the rows its standard chunks hold, so the KL meets its teacher on the rank that
//! holds the teacher, and the chunked loss runs per rank as without reuse.
use std::cell::{Cell, RefCell};

use tch::Tensor;

use rsd_model::{ContextChunks, DocBoundaries, LayerKv, Model, Rotary, ScoreChanges};

use super::{Draws, MicroBatch, Objective, SecondView, StepOptions};
use crate::cp::{suffix_chunks, CpBatch};
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
    doc_bounds: Option<DocBoundaries>,
    /// Context parallelism with prefix reuse: this rank's pieces of the row's re-sharded suffix.
    suffix: Option<SuffixPieces>,
}

/// This rank's share of one row's perturbed suffix under context parallelism.
struct SuffixPieces {
    /// The batch row.
    row: i64,
    /// The shared prefix `P`.
    prefix: i64,
    /// The pieces `(first row, rows)` in whole-row coordinates (rows ≥ L are padding).
    chunks: Vec<(i64, i64)>,
    /// The row's document boundaries over `[0, P + padded)`, the padding its own document.
    doc_bounds: Option<Vec<i64>>,
}

/// The standard view's context-parallel layout, and the group.
struct CpPlan<'a> {
    batch: &'a CpBatch<'a>,
    /// This rank's chunks of the whole rows.
    chunks: Vec<(i64, i64)>,
    /// Whole rows' document boundaries.
    doc_bounds: Option<Vec<Vec<i64>>>,
}

impl CpPlan<'_> {
    fn gather(&self, t: &Tensor) -> rsd_model::Result<Tensor> {
        self.batch
            .cp()
            .gather_kv(t)
            .map_err(|e| rsd_model::ModelError::Input(e.to_string()))
    }
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
    cp_batch: Option<CpPlan<'a>>,
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
    Ok(super::upload(&flat, device)?.f_view([b, l])?)
}

impl<'a> Plan<'a> {
    pub fn new(
        model: &'a Model,
        mb: &'a MicroBatch,
        views: Option<&[RowView]>,
        opts: &StepOptions,
        cp_batch: Option<&'a CpBatch<'a>>,
        draws: Option<&'a Draws>,
    ) -> Result<Self> {
        let device = mb.tokens.device();
        let cp_batch = match cp_batch {
            Some(batch) => Some(CpPlan {
                batch,
                chunks: batch.cp().chunks(mb.len() * batch.cp().size() as i64)?,
                doc_bounds: mb.doc_bounds.clone(),
            }),
            None => None,
        };
        let mut plan = Plan {
            model,
            tokens: &mb.tokens,
            std: None,
            perturbed: Vec::new(),
            rows: Vec::new(),
            cp_batch,
            control: None,
        };
        if opts.objective != Objective::Pose {
            let all: Vec<i64> = (0..mb.rows() as i64).collect();
            let rotary = model.rotary(&pos_tensor(&mb.positions, device)?)?;
            plan.std = Some((rotary, plan.pass_doc_bounds(mb, &all)?));
        }
        if opts.view != SecondView::Positions {
            plan.add_control(mb, views, opts.view, draws)?;
        } else if opts.objective.needs_perturbed() {
            plan.add_perturbed(mb, views, opts)?;
        }
        Ok(plan)
    }

    /// Document boundaries of `rows` for one pass; none under context parallelism, where the
    /// whole rows' reach the attention through the context (`ContextChunks::doc_bounds`).
    fn pass_doc_bounds(&self, mb: &MicroBatch, rows: &[i64]) -> Result<Option<DocBoundaries>> {
        if self.cp_batch.is_some() {
            Ok(None)
        } else {
            doc_bounds_of(mb, rows)
        }
    }

    /// A control view: one batched second pass over the rows with KL rows, at the standard
    /// positions (nothing is shared, so no prefix reuse).
    fn add_control(
        &mut self,
        mb: &'a MicroBatch,
        views: Option<&[RowView]>,
        view: SecondView,
        draws: Option<&'a Draws>,
    ) -> Result<()> {
        let views = checked_views(mb, views)?;
        let rows: Vec<i64> = (0..mb.rows() as i64)
            .filter(|&r| views[r as usize].changes_anything())
            .collect();
        self.rows = vec![None; mb.rows()];
        if !rows.is_empty() {
            let nope = view == SecondView::Nope;
            let doc_bounds = self.pass_doc_bounds(mb, &rows)?;
            self.add_full_pass(mb, views, &rows, doc_bounds, nope)?;
        }
        self.control = Some(Control {
            view,
            seeds: views.iter().map(|v| v.seed).collect(),
            perturbed_rows: rows,
            draws,
        });
        Ok(())
    }

    /// The perturbed view's passes: suffix passes over the shared prefix's K/V where prefix
    /// reuse applies, else one full pass over the rows that need it.
    fn add_perturbed(
        &mut self,
        mb: &'a MicroBatch,
        views: Option<&[RowView]>,
        opts: &StepOptions,
    ) -> Result<()> {
        let views = checked_views(mb, views)?;
        // For rsd a row whose view changes no logit row carries nothing (no KL; the CLM is the
        // standard view's): its perturbed view is not computed. The other objectives train on
        // the perturbed logits themselves, so every row runs.
        let needed: Vec<bool> = views
            .iter()
            .map(|v| opts.objective != Objective::Rsd || v.changes_anything())
            .collect();
        // Under context parallelism the shared prefix is a whole-row quantity.
        let whole = match &self.cp_batch {
            Some(c) => c.batch.views().ok_or_else(|| {
                Error::Input("context parallelism: the whole rows' views are missing".into())
            })?,
            None => views,
        };
        let reuse =
            opts.prefix_reuse && self.std.is_some() && whole.iter().any(|v| v.shared_prefix > 0);
        if reuse && self.cp_batch.is_some() {
            self.add_cp_suffix_passes(mb, &needed)?;
        } else if reuse {
            self.add_suffix_passes(mb, views, &needed)?;
        } else if needed.iter().any(|&n| n) {
            // Every rank of a context-parallel group decides alike (`kl_rows` is the whole
            // sequence's); its attention takes the whole micro-batch, so all rows run there.
            let rows: Vec<i64> = (0..mb.rows() as i64)
                .filter(|&r| self.cp_batch.is_some() || needed[r as usize])
                .collect();
            let doc_bounds = self.pass_doc_bounds(mb, &rows)?;
            self.add_full_pass(mb, views, &rows, doc_bounds, false)?;
        } else {
            self.rows = vec![None; mb.rows()];
        }
        Ok(())
    }

    /// One batched perturbed pass over the given rows from row 0 (`nope`: without rotary
    /// embeddings).
    fn add_full_pass(
        &mut self,
        mb: &MicroBatch,
        views: &[RowView],
        rows: &[i64],
        doc_bounds: Option<DocBoundaries>,
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
            mb.tokens.f_index_select(0, &super::upload(rows, device)?)?
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
            doc_bounds,
            suffix: None,
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

    /// Matmul FLOPs of the perturbed view's decoder forward on this rank: per computed token
    /// the layers' linear maps, per (query, key) pair `4·q` (scores and values), a query at row
    /// `i` seeing keys `0..=i` (document masking not counted). The balance of context
    /// parallelism is this number across the ranks.
    pub fn perturbed_flops(&self) -> f64 {
        let c = self.model.config();
        let (d, ffn) = (c.hidden_size as f64, c.intermediate_size as f64);
        let q = (c.num_attention_heads * c.head_dim) as f64;
        let kv = (c.num_key_value_heads * c.head_dim) as f64;
        let layers = c.num_hidden_layers as f64;
        let lin = layers * 2.0 * (d * (q + 2.0 * kv) + q * d + 3.0 * d * ffn);
        let pair = layers * 4.0 * q;
        let pairs = |ranges: &[(i64, i64)]| -> f64 {
            // Σ (i + 1) over the rows of each range.
            ranges
                .iter()
                .map(|&(s, n)| (n * (2 * s + n + 1) / 2) as f64)
                .sum()
        };
        self.perturbed
            .iter()
            .map(|g| {
                let (rows, len) = (g.tokens.size()[0], g.tokens.size()[1]);
                let queries = match (&g.suffix, &self.cp_batch) {
                    (Some(sp), _) => sp.chunks.clone(),
                    (None, Some(ctx)) => ctx.chunks.clone(),
                    (None, None) => vec![(g.start, len)],
                };
                rows as f64 * (len as f64 * lin + pairs(&queries) * pair)
            })
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
                doc_bounds: doc_bounds_of(mb, &[r as i64])?,
                suffix: None,
            });
        }
        Ok(())
    }

    /// Context parallelism: one perturbed pass per row over this rank's pieces of the row's
    /// re-sharded suffix. Every rank of the group plans the same passes (the views are the
    /// whole rows'), so the collectives inside them line up.
    fn add_cp_suffix_passes(&mut self, mb: &MicroBatch, needed: &[bool]) -> Result<()> {
        let device = mb.tokens.device();
        let Some(ctx) = &self.cp_batch else {
            return Ok(());
        };
        let (batch, l_local) = (ctx.batch, mb.len());
        let (r, n) = (batch.cp().rank() as i64, batch.cp().size() as i64);
        let l = l_local * n;
        let whole = batch.views().unwrap_or_default();
        let mut passes = Vec::new();
        let mut rows = Vec::with_capacity(mb.rows());
        for (b, v) in whole.iter().enumerate() {
            let p = v.shared_prefix.min(l);
            if p == l || !needed[b] {
                rows.push(None);
                continue;
            }
            let (padded, chunks) = suffix_chunks(r, n, p, l);
            let tokens = &batch.tokens()[b];
            let last = v.positions[(l - 1) as usize];
            let (mut tok, mut pos) = (Vec::new(), Vec::new());
            for i in chunks.iter().flat_map(|&(s, c)| s..s + c) {
                // Padding rows: any token, positions continuing past the row's last one.
                tok.push(if i < l { tokens[i as usize] } else { 0 });
                pos.push(if i < l {
                    v.positions[i as usize]
                } else {
                    last + 1 + i - l
                });
            }
            let doc_bounds = ctx.doc_bounds.as_ref().map(|d| {
                let mut cu = d[b].clone();
                if p + padded > l {
                    cu.push(p + padded);
                }
                cu
            });
            rows.push(Some(PerturbedRow {
                pass: passes.len(),
                index: 0,
                start: 0,
            }));
            let count = tok.len() as i64;
            passes.push(PerturbedPass {
                prefix_row: b as i64,
                start: p,
                tokens: super::upload(&tok, device)?.f_view([1, count])?,
                rotary: self.model.rotary(&pos_tensor(&[pos], device)?)?,
                doc_bounds: None,
                suffix: Some(SuffixPieces {
                    row: b as i64,
                    prefix: p,
                    chunks,
                    doc_bounds,
                }),
            });
        }
        self.perturbed = passes;
        self.rows = rows;
        Ok(())
    }

    /// Context parallelism: the whole rows and this rank's chunks of them.
    pub fn cp_split(&self) -> Option<(&CpBatch<'a>, &[(i64, i64)])> {
        self.cp_batch
            .as_ref()
            .map(|c| (c.batch, c.chunks.as_slice()))
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
        // Context parallelism: the standard view's gathered keys, then values (the order
        // rsd-model's attention gathers them in), for the suffix passes' prefixes.
        let gathered: RefCell<Vec<Tensor>> = RefCell::new(Vec::new());
        let std = match (&self.std, &x.std) {
            (Some((rot, doc_bounds)), Some(xs)) => {
                let changed = self.changes(i, STANDARD_PASS)?;
                let y = match (&self.cp_batch, changed) {
                    (Some(ctx), _) => {
                        let gather = |t: &Tensor| {
                            let g = ctx.gather(t)?;
                            gathered.borrow_mut().push(g.shallow_clone());
                            Ok(g)
                        };
                        let cc = ContextChunks {
                            chunks: ctx.chunks.clone(),
                            doc_bounds: ctx.doc_bounds.clone(),
                            gather: &gather,
                        };
                        self.model.layer_forward_split(i, xs, rot, &cc)?.0
                    }
                    (None, Some(c)) => self.model.layer_forward_changed(
                        i,
                        xs,
                        rot,
                        doc_bounds.as_ref(),
                        &c.as_changes(),
                    )?,
                    (None, None) => {
                        let (y, k) =
                            self.model
                                .layer_forward(i, xs, rot, doc_bounds.as_ref(), None)?;
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
            if let (Some(ctx), Some(sp)) = (&self.cp_batch, &g.suffix) {
                perturbed.push(self.suffix_layer(i, ctx, sp, g, xg, &gathered.borrow())?);
                continue;
            }
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
            let y = match (&self.cp_batch, changed) {
                (Some(ctx), _) => {
                    let gather = |t: &Tensor| ctx.gather(t);
                    let cc = ContextChunks {
                        chunks: ctx.chunks.clone(),
                        doc_bounds: ctx.doc_bounds.clone(),
                        gather: &gather,
                    };
                    self.model.layer_forward_split(i, xg, &g.rotary, &cc)?.0
                }
                (None, Some(c)) => self.model.layer_forward_changed(
                    i,
                    xg,
                    &g.rotary,
                    g.doc_bounds.as_ref(),
                    &c.as_changes(),
                )?,
                (None, None) => {
                    self.model
                        .layer_forward(i, xg, &g.rotary, g.doc_bounds.as_ref(), prefix.as_ref())?
                        .0
                }
            };
            perturbed.push(y);
        }
        Ok(Stage { std, perturbed })
    }

    /// Layer `i` of a re-sharded suffix pass: its pieces attend to the standard view's K/V of
    /// rows `0..P` (`std_kv`: this layer's gathered keys and values) and to the gathered suffix.
    fn suffix_layer(
        &self,
        i: usize,
        ctx: &CpPlan<'_>,
        sp: &SuffixPieces,
        g: &PerturbedPass,
        x: &Tensor,
        std_kv: &[Tensor],
    ) -> Result<Tensor> {
        let calls = Cell::new(0usize);
        let gather = |t: &Tensor| -> rsd_model::Result<Tensor> {
            let suffix = ctx.gather(t)?;
            let which = calls.replace(calls.get() + 1);
            if sp.prefix == 0 {
                return Ok(suffix);
            }
            let all = std_kv.get(which).ok_or_else(|| {
                rsd_model::ModelError::Input(
                    "context parallelism: the standard view's K/V were not gathered".into(),
                )
            })?;
            let torch = |e: tch::TchError| rsd_model::ModelError::Input(e.to_string());
            let prefix = all
                .f_narrow(0, sp.row, 1)
                .and_then(|t| t.f_narrow(2, 0, sp.prefix))
                .map_err(torch)?;
            Tensor::f_cat(&[prefix, suffix], 2).map_err(torch)
        };
        let cc = ContextChunks {
            chunks: sp.chunks.clone(),
            doc_bounds: sp.doc_bounds.clone().map(|d| vec![d]),
            gather: &gather,
        };
        Ok(self.model.layer_forward_split(i, x, &g.rotary, &cc)?.0)
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

    /// Both views through every layer and the final norm (in the graph when grad mode is on).
    pub fn forward(&self) -> Result<Stage> {
        let mut x = self.embed()?;
        for i in 0..self.model.num_layers() {
            x = self.layer(i, &x)?;
        }
        self.final_norm(&x)
    }

    pub fn final_norm(&self, x: &Stage) -> Result<Stage> {
        let std = match &x.std {
            Some(h) => Some(self.model.final_norm(h)?),
            None => None,
        };
        let mut perturbed = Vec::with_capacity(x.perturbed.len());
        for (g, h) in self.perturbed.iter().zip(&x.perturbed) {
            let h = self.model.final_norm(h)?;
            perturbed.push(match (&self.cp_batch, &g.suffix, &std) {
                (Some(ctx), Some(sp), Some(hs)) => aligned_suffix(ctx, sp, &h, hs)?,
                _ => h,
            });
        }
        Ok(Stage { std, perturbed })
    }
}

/// A re-sharded suffix's final hidden states `h` (`[1, 2c, D]`, this rank's pieces) laid out
/// like this rank's standard chunks of its row (`[1, Llocal, D]`): each local row `i ≥ P` takes
/// the perturbed hidden state of row `i` from the rank that computed it — one all-to-all of
/// d-wide rows, each rank sending every other rank exactly the rows it needs (blocks padded to
/// the largest such set, the same on every rank); rows before `P`, identical in both views, take
/// the standard view's hidden state (`hs`, `[B, Llocal, D]`), as the one-process step's shared
/// rows do. The all-to-all is differentiable: its backward returns each row's gradient to the
/// rank that computed it.
fn aligned_suffix(ctx: &CpPlan<'_>, sp: &SuffixPieces, h: &Tensor, hs: &Tensor) -> Result<Tensor> {
    let cp = ctx.batch.cp();
    let (me, n) = (cp.rank(), cp.size() as i64);
    let l = hs.size()[1] * n;
    let p = sp.prefix;
    // Zigzag ownership: chunk `c` of `2n` belongs to rank `c` or `2n−1−c`.
    let owner = |chunk: i64| if chunk < n { chunk } else { 2 * n - 1 - chunk };
    let std_rows = l / (2 * n);
    let (padded, _) = suffix_chunks(0, n, p, l);
    let suf_rows = padded / (2 * n);
    let std_owner = |i: i64| owner(i / std_rows) as usize;
    let suf_owner = |i: i64| owner((i - p) / suf_rows) as usize;
    // The rows rank q sends rank j are the real suffix rows q computed that j's standard chunks
    // hold, in row order; every rank counts them alike, so the blocks' size agrees.
    let mut count = vec![vec![0i64; n as usize]; n as usize];
    for i in p..l {
        count[suf_owner(i)][std_owner(i)] += 1;
    }
    let k = count.iter().flatten().copied().max().unwrap_or(0).max(1);
    // This rank's suffix rows are its pieces in row order: local index = rank in that order.
    let mine = rows_of(&suffix_chunks(me as i64, n, p, l).1);
    let mut send = vec![Vec::new(); n as usize];
    for (local, &i) in mine.iter().enumerate() {
        if i < l {
            send[std_owner(i)].push(local as i64);
        }
    }
    let send: Vec<i64> = send
        .into_iter()
        .flat_map(|mut b| {
            b.resize(k as usize, 0);
            b
        })
        .collect();
    let device = h.device();
    let send = h
        .f_squeeze_dim(0)?
        .f_index_select(0, &super::upload(&send, device)?)?;
    let received = cp.group().all_to_all_autograd(&send)?;
    // Row i ≥ P of this rank's chunks arrived in block `suf_owner(i)`, after the earlier rows
    // of that block (this rank's chunks are in row order).
    let mut next = vec![0i64; n as usize];
    let mut place = |i: i64| {
        let q = suf_owner(i);
        next[q] += 1;
        q as i64 * k + next[q] - 1
    };
    let std_row = hs.f_narrow(0, sp.row, 1)?;
    // An empty slice keeps the all-to-all in this rank's graph even when none of its rows is
    // past the prefix: the backward is a collective every rank must join.
    let mut parts = vec![received.f_narrow(0, 0, 0)?.f_unsqueeze(0)?];
    let mut at = 0;
    for &(start, rows_in) in &ctx.chunks {
        let shared_end = (start + rows_in).min(sp.prefix).max(start);
        if shared_end > start {
            parts.push(std_row.f_narrow(1, at, shared_end - start)?);
        }
        if start + rows_in > shared_end {
            let index: Vec<i64> = (shared_end..start + rows_in).map(&mut place).collect();
            let index = super::upload(&index, device)?;
            parts.push(received.f_index_select(0, &index)?.f_unsqueeze(0)?);
        }
        at += rows_in;
    }
    Ok(Tensor::f_cat(&parts, 1)?)
}

/// The rows of `(first row, rows)` ranges, in order.
fn rows_of(ranges: &[(i64, i64)]) -> Vec<i64> {
    ranges.iter().flat_map(|&(s, c)| s..s + c).collect()
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
fn doc_bounds_of(mb: &MicroBatch, rows: &[i64]) -> Result<Option<DocBoundaries>> {
    let Some(d) = &mb.doc_bounds else {
        return Ok(None);
    };
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
