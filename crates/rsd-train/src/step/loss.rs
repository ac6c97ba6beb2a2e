//! The loss in chunks of rows, with closed-form logit gradients (Liger-style).
//!
//! The final hidden states of both views arrive without a graph. For each chunk of rows the
//! logits are formed (fp32; fp64 for fp64 models), the loss terms *and their gradients with
//! respect to the logits* computed directly, and the gradients pushed through the LM head at once
//! (`dW += gᵀ h`, `dh = g W`). So at most one chunk of `[rows × vocab]` exists and nothing
//! vocabulary-wide is kept for autograd; the caller back-propagates `dh` into the decoder.
use tch::{Kind, Tensor};

use super::long_ce::ShortContext;
use super::prefix_reuse::{Plan, Stage};
use super::{KlDirection, LossNormalizers, MicroBatch, Objective, StepOptions, Sums, IGNORE};
use crate::perturb::RowView;
use crate::Result;

/// Gradients of the loss with respect to the final hidden states (laid out like the [`Stage`])
/// and the LM-head weight.
pub(super) struct LossGrads {
    pub hidden: Stage,
    pub weight: Tensor,
}

/// What the chunked loss reads besides the final hidden states.
pub(super) struct LossInputs<'a> {
    pub plan: &'a Plan<'a>,
    pub mb: &'a MicroBatch,
    pub views: Option<&'a [RowView]>,
    pub opts: &'a StepOptions,
    pub norm: LossNormalizers,
    /// LongCE: the labels' log-probabilities under the short context.
    pub short: Option<&'a ShortContext>,
}

/// The loss of the final hidden states `h` (no graph), chunk by chunk; adds the loss terms to
/// `sums` and returns the gradients for the backward.
pub(super) fn chunked_loss(inp: &LossInputs<'_>, h: &Stage, sums: &mut Sums) -> Result<LossGrads> {
    let mut head = Head::new(inp.plan.model, inp.mb.tokens.device())?;
    let dh = h.zeros_like()?;
    let scales = Scales::new(inp.opts, inp.norm);
    let (l, c) = (inp.mb.len(), inp.opts.loss_chunk.max(1));
    for b in 0..inp.mb.rows() {
        let row = RowLoss::new(inp, &head, h, &dh, b)?;
        let mut i0 = 0;
        while i0 < l {
            let i1 = (i0 + c).min(l);
            let teacher = row.standard_chunk(inp.opts, &scales, &mut head, (i0, i1), sums)?;
            row.perturbed_chunk(
                inp.opts,
                &scales,
                &mut head,
                (i0, i1),
                teacher.as_ref(),
                sums,
            )?;
            i0 = i1;
        }
    }
    Ok(LossGrads {
        hidden: dh,
        weight: head.grad,
    })
}

/// The LM head while the loss runs: forms a chunk's logits and takes back its logit gradient.
struct Head<'a> {
    weight: &'a Tensor,
    /// The model dtype: logits are formed in it, and gradients go back in it.
    kind: Kind,
    /// The loss dtype.
    loss_kind: Kind,
    /// `dW`, accumulated in the loss dtype.
    grad: Tensor,
}

impl<'a> Head<'a> {
    fn new(model: &'a rsd_model::Model, device: tch::Device) -> Result<Self> {
        let weight = model.lm_head_weight();
        let kind = weight.kind();
        let loss_kind = rsd_model::accum_kind(kind);
        Ok(Head {
            weight,
            kind,
            loss_kind,
            grad: Tensor::f_zeros(weight.size(), (loss_kind, device))?,
        })
    }

    /// `h Wᵀ` in the model dtype, returned in the loss dtype.
    fn logits(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.f_matmul(&self.weight.f_tr()?)?
            .f_to_kind(self.loss_kind)?)
    }

    /// Pushes the logit gradient `g` of rows `x` back: `dx += g W`, `dW += gᵀ x`.
    fn backward(&mut self, g: &Tensor, x: &Tensor, mut dx: Tensor) -> Result<()> {
        let g = g.f_to_kind(self.kind)?;
        let _ = dx.f_addmm_(&g, self.weight)?;
        let gt = g.f_tr()?;
        if self.kind == self.loss_kind {
            let _ = self.grad.f_addmm_(&gt, x)?;
        } else if !(x.device().is_cuda() && accumulate_in_fp32(&self.grad, &gt, x)) {
            let _ = self
                .grad
                .f_add_(&gt.f_matmul(x)?.f_to_kind(self.loss_kind)?)?;
        }
        Ok(())
    }

    fn weights(&self, n: i64, v: f64, device: tch::Device) -> Result<Tensor> {
        Ok(Tensor::f_full([n], v, (self.loss_kind, device))?)
    }
}

/// Whether the half-precision product `a b` could be added to the fp32 `acc` in place by one
/// matrix multiply with an fp32 output (`addmm` with `out_dtype`, libtorch ≥ 2.8 on CUDA): the
/// `[vocab × d]` product is then neither rounded to half precision nor materialised and upcast
/// (three passes over the LM head's size per loss chunk). Where libtorch refuses it, the caller
/// takes the plain path, and this is not tried again.
fn accumulate_in_fp32(acc: &Tensor, a: &Tensor, b: &Tensor) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static REFUSED: AtomicBool = AtomicBool::new(false);
    if REFUSED.load(Ordering::Relaxed) {
        return false;
    }
    match acc.f_addmm_dtype_out(acc, a, b, acc.kind()) {
        Ok(_) => true,
        Err(_) => {
            REFUSED.store(true, Ordering::Relaxed);
            false
        }
    }
}

/// The step's normalisers folded into per-row loss weights.
struct Scales {
    /// Of a CE token: `1 / label tokens`.
    ce: f64,
    /// Of a KL row before the per-sample mean: `λ / samples`.
    kl: f64,
    lambda: f64,
}

impl Scales {
    fn new(opts: &StepOptions, norm: LossNormalizers) -> Self {
        Scales {
            ce: 1.0 / norm.label_tokens.max(1.0),
            kl: opts.lambda / norm.samples.max(1.0),
            lambda: opts.lambda,
        }
    }
}

/// One view's final hidden states of one row `[L', D]` and their gradient accumulator.
struct ViewRows {
    h: Tensor,
    dh: Tensor,
}

/// One row of the micro-batch as the loss sees it.
struct RowLoss<'a> {
    device: tch::Device,
    labels: Tensor,
    /// The standard view (`None` for `pose`).
    std: Option<ViewRows>,
    /// The perturbed view's rows `start..L` (`None` when the row has none).
    pert: Option<ViewRows>,
    /// First row of `pert` (`L` when there is none): rows before it are shared by both views.
    start: i64,
    view: Option<&'a RowView>,
    /// `rsd`: the row's KL mask (loss dtype) and its number of rows.
    kl_mask: Option<(Tensor, f64)>,
    /// LongCE: the labels' log-probabilities under the short context `[L]`, and where they apply
    /// (1) rather than the whole context (0: weight 1).
    short: Option<(Tensor, Tensor)>,
}

impl<'a> RowLoss<'a> {
    fn new(inp: &LossInputs<'a>, head: &Head<'_>, h: &Stage, dh: &Stage, b: usize) -> Result<Self> {
        let device = inp.mb.tokens.device();
        let bi = b as i64;
        let std = match (&h.std, &dh.std) {
            (Some(t), Some(d)) => Some(ViewRows {
                h: t.f_get(bi)?,
                dh: d.f_get(bi)?,
            }),
            _ => None,
        };
        let at = inp.plan.perturbed_row(b);
        let pert =
            match at.and_then(|r| Some((r, h.perturbed.get(r.pass)?, dh.perturbed.get(r.pass)?))) {
                Some((r, t, d)) => Some(ViewRows {
                    h: t.f_get(r.index)?,
                    dh: d.f_get(r.index)?,
                }),
                None => None,
            };
        let view = inp.views.map(|v| &v[b]);
        let kl_mask = match view {
            Some(v) if inp.opts.objective == Objective::Rsd && v.kl_rows > 0 => {
                let m: Vec<f64> = v.kl_mask.iter().map(|&x| x as u8 as f64).collect();
                Some((
                    super::upload(&m, device)?.f_to_kind(head.loss_kind)?,
                    v.kl_norm,
                ))
            }
            _ => None,
        };
        let short = match inp.short {
            Some(s) => Some((s.logp.f_get(bi)?, s.scored.f_get(bi)?)),
            None => None,
        };
        Ok(RowLoss {
            device,
            labels: inp.mb.labels.f_get(bi)?,
            std,
            pert,
            start: at.map_or(inp.mb.len(), |r| r.start),
            view,
            kl_mask,
            short,
        })
    }

    /// Standard rows `[i0, i1)`: the CLM term (and, for `two-view-clm`, the rows before `start`
    /// that the perturbed view shares). Returns the teacher's log-probabilities of these rows.
    fn standard_chunk(
        &self,
        opts: &StepOptions,
        scales: &Scales,
        head: &mut Head<'_>,
        (i0, i1): (i64, i64),
        sums: &mut Sums,
    ) -> Result<Option<Tensor>> {
        let obj = opts.objective;
        let Some(std) = self.std.as_ref().filter(|_| obj != Objective::Pose) else {
            return Ok(None);
        };
        let n = i1 - i0;
        let x = std.h.f_narrow(0, i0, n)?;
        let weights = head.weights(n, scales.ce, self.device)?;
        let shared = if obj == Objective::TwoViewClm {
            self.start.min(i1) - i0
        } else {
            0
        };
        if shared > 0 {
            let _ = weights
                .f_narrow(0, 0, shared)?
                .f_fill_(scales.ce * (1.0 + scales.lambda))?;
        }
        let short = match &self.short {
            Some((logp, scored)) => Some((logp.f_narrow(0, i0, n)?, scored.f_narrow(0, i0, n)?)),
            None => None,
        };
        let long_ce = match (&short, opts.long_ce) {
            (Some((logp, scored)), Some(lc)) => Some((logp, scored, lc.gamma)),
            _ => None,
        };
        let (ce, logq, g) = cross_entropy(
            &head.logits(&x)?,
            &self.labels.f_narrow(0, i0, n)?,
            &weights,
            long_ce,
        )?;
        Sums::add(&mut sums.clm, &ce)?;
        if shared > 0 {
            Sums::add(&mut sums.clm_pert, &ce.f_narrow(0, 0, shared)?)?;
        }
        head.backward(&g, &x, std.dh.f_narrow(0, i0, n)?)?;
        Ok(Some(logq))
    }

    /// Perturbed rows of chunk `[i0, i1)`, i.e. `[max(i0, start), i1)`: the KL against the
    /// `teacher` (`rsd`) or the perturbed CLM (`pose`, `two-view-clm`).
    fn perturbed_chunk(
        &self,
        opts: &StepOptions,
        scales: &Scales,
        head: &mut Head<'_>,
        (i0, i1): (i64, i64),
        teacher: Option<&Tensor>,
        sums: &mut Sums,
    ) -> Result<()> {
        let j0 = i0.max(self.start);
        let Some(pert) = self.pert.as_ref().filter(|_| j0 < i1) else {
            return Ok(());
        };
        let m = i1 - j0;
        let x = pert.h.f_narrow(0, j0 - self.start, m)?;
        let dx = pert.dh.f_narrow(0, j0 - self.start, m)?;
        match opts.objective {
            Objective::Standard | Objective::Sft => {}
            Objective::Rsd | Objective::SftRsd => {
                let any = self
                    .view
                    .is_some_and(|v| v.kl_mask[j0 as usize..i1 as usize].contains(&true));
                if let (Some((mask, rows)), Some(logq), true) = (&self.kl_mask, teacher, any) {
                    let mask = mask.f_narrow(0, j0, m)?;
                    let weights = mask.f_mul_scalar(scales.kl / rows)?;
                    let teacher = logq.f_narrow(0, j0 - i0, m)?;
                    let (kl, g) = kl_rows(&head.logits(&x)?, &teacher, &weights, opts.kl)?;
                    Sums::add(&mut sums.kl, &kl.f_mul(&mask)?.f_div_scalar(*rows)?)?;
                    head.backward(&g, &x, dx)?;
                }
            }
            Objective::Pose | Objective::TwoViewClm => {
                let pose = opts.objective == Objective::Pose;
                let scale = if pose {
                    scales.ce
                } else {
                    scales.ce * scales.lambda
                };
                let (ce, _, g) = cross_entropy(
                    &head.logits(&x)?,
                    &self.labels.f_narrow(0, j0, m)?,
                    &head.weights(m, scale, self.device)?,
                    None,
                )?;
                Sums::add(
                    if pose {
                        &mut sums.clm
                    } else {
                        &mut sums.clm_pert
                    },
                    &ce,
                )?;
                head.backward(&g, &x, dx)?;
            }
        }
        Ok(())
    }
}

/// Per-row cross entropy of `logits` `[n, V]` (fp32/fp64) against `labels` `[n]` (ignored:
/// [`rsd_loader::IGNORE_INDEX`]), its log-softmax, and the closed-form logit gradient
/// `w_i · (softmax_i − onehot(y_i))` for per-row weights `w` `[n]` (rows without a label get no
/// gradient).
///
/// With `long_ce = Some((short, scored, γ))` (`short`: the labels' log-probabilities under the
/// short context, where `scored` is 1), each row's CE and gradient are also weighted by the LongCE
/// importance `min(exp(log p_long − log p_short), γ)` (exactly 1 where `scored` is 0: the short
/// context is the whole context), a constant (no gradient flows through it); the returned CE is
/// then the weighted one, the term actually optimised.
fn cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    w: &Tensor,
    long_ce: Option<(&Tensor, &Tensor, f64)>,
) -> Result<(Tensor, Tensor, Tensor)> {
    let kind = logits.kind();
    let logq = logits.f_log_softmax(-1, kind)?;
    let mut valid = labels.f_ne(IGNORE)?.f_to_kind(kind)?;
    let target = labels.f_clamp_min(0)?.f_unsqueeze(1)?;
    let picked = logq.f_gather(1, &target, false)?.f_squeeze_dim(1)?;
    let mut grad = logq.f_exp()?;
    let _ = grad.f_scatter_add_(1, &target, &valid.f_neg()?.f_unsqueeze(1)?)?;
    if let Some((short, scored, gamma)) = long_ce {
        valid = valid.f_mul(&long_ce_importance(&picked, short, scored, gamma)?)?;
    }
    let ce = picked.f_mul(&valid)?.f_neg()?;
    let _ = grad.f_mul_(&w.f_mul(&valid)?.f_unsqueeze(1)?)?;
    Ok((ce, logq, grad))
}

/// LongCE's weight of each row: `min(exp(log p_long − log p_short), γ)` where `scored` is 1,
/// exactly 1 where it is 0.
pub(super) fn long_ce_importance(
    long: &Tensor,
    short: &Tensor,
    scored: &Tensor,
    gamma: f64,
) -> Result<Tensor> {
    let w = long.f_sub(short)?.f_exp()?.f_clamp_max(gamma)?;
    Ok(w.f_where_self(&scored.f_gt(0.5)?, &w.f_ones_like()?)?)
}

/// `KL(a ‖ b)` of each row of distributions over the vocabulary (last dimension), given `a`'s
/// probabilities `p_a` and both log-probabilities: `Σ_v a_v (log a_v − log b_v)`, summed in
/// `kind`. The one definition of the views' divergence: the forward-direction training
/// term and `rsd-eval ppl`'s view gap take it from here (the reverse direction's fused form
/// below computes the same sum in place).
pub fn kl_rows_of(
    p_a: &Tensor,
    log_a: &Tensor,
    log_b: &Tensor,
    kind: Kind,
) -> std::result::Result<Tensor, tch::TchError> {
    p_a.f_mul(&log_a.f_sub(log_b)?)?
        .f_sum_dim_intlist(-1, false, kind)
}

/// Per-row KL between the perturbed view (`logits`, raw) and the detached teacher
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
            // `kl_rows_of(p, log p, log q)` in fewer passes over [rows × vocab]: d = log p − log q
            // in place, the row sums as a batched dot product (no product tensor), then
            // g = (d − KL) ⊙ p ⊙ w in place.
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
            let kl = kl_rows_of(&q, logq, &logp, kind)?;
            let _ = logp.f_exp_()?;
            let _ = logp.f_sub_(&q)?;
            let _ = logp.f_mul_(&w)?;
            Ok((kl, logp))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On CUDA: the LM head's gradient accumulates a bf16 product into fp32 in one multiply, and
    /// the sum is the fp32 product's (to bf16's input rounding). `scripts/gpu-check.sh` runs the
    /// library's `cuda_` tests on a GPU; here, without one, it returns at once.
    #[test]
    fn cuda_head_gradient_accumulates_in_fp32() {
        if !tch::Cuda::is_available() {
            eprintln!("no CUDA device: skipped");
            return;
        }
        let dev = tch::Device::Cuda(0);
        tch::manual_seed(3);
        let a = Tensor::randn([64, 48], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let b = Tensor::randn([48, 32], (Kind::Float, dev)).to_kind(Kind::BFloat16);
        let acc = Tensor::randn([64, 32], (Kind::Float, dev));
        let want = &acc + a.to_kind(Kind::Float).matmul(&b.to_kind(Kind::Float));
        assert!(
            accumulate_in_fp32(&acc, &a, &b),
            "addmm with an fp32 output was refused"
        );
        let err = (&acc - &want).abs().max().double_value(&[]);
        assert!(err < 1e-3, "max |Δ| {err}");
    }
}
