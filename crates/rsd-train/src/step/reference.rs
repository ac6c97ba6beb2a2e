//! The slow reference of the whole objective, for tests: two full passes (no prefix reuse), full
//! `[B, L, V]` logits, the formulas written out, one backward through autograd.
use tch::{Kind, Reduction, Tensor};

use rsd_model::{DocBoundaries, Model};

use super::prefix_reuse::pos_tensor;
use super::{KlDirection, LossNormalizers, MicroBatch, Objective, StepOptions, IGNORE};
use crate::perturb::RowView;
use crate::{Error, Result};

/// The objective's total (in the graph: call `backward` on it), CLM term and second term (KL,
/// or the perturbed CLM for `two-view-clm`). Tests compare [`super::step_micro`] against it.
pub fn reference_loss(
    model: &Model,
    mb: &MicroBatch,
    views: Option<&[RowView]>,
    opts: &StepOptions,
    norm: LossNormalizers,
) -> Result<(Tensor, f64, f64)> {
    if opts.long_ce.is_some() {
        return Err(Error::Input(
            "the reference loss has no LongCE (tests/test_train.py checks LongCE against PyTorch)"
                .into(),
        ));
    }
    if opts.view != super::SecondView::Positions {
        return Err(Error::Input(
            "the reference loss has no control views (nope, attn-noise, dropout; \
             tests/test_train_ablations.py checks them against PyTorch)"
                .into(),
        ));
    }
    let device = mb.tokens.device();
    let (b, l) = (mb.rows() as i64, mb.len());
    let doc_bounds = match &mb.doc_bounds {
        Some(d) => Some(DocBoundaries::new(d.clone(), l)?),
        None => None,
    };
    let logits_at = |pos: &[Vec<i64>]| -> Result<Tensor> {
        let p = pos_tensor(pos, device)?;
        let h = model
            .forward(&rsd_model::ForwardArgs {
                doc_bounds: doc_bounds.as_ref(),
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
                IGNORE,
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
        Objective::Standard | Objective::Sft => (ce(&logits_at(&mb.positions)?)?, zero),
        Objective::Pose => (ce(&pert()?)?, zero),
        Objective::TwoViewClm => (ce(&logits_at(&mb.positions)?)?, ce(&pert()?)?),
        Objective::Rsd | Objective::SftRsd => {
            let ls = logits_at(&mb.positions)?;
            let kl = reference_kl(&ls, &pert()?, views.unwrap_or_default(), opts.kl)?;
            (ce(&ls)?, kl.f_div_scalar(norm.samples)?)
        }
    };
    let total = clm.f_add(&second.f_mul_scalar(opts.lambda)?)?;
    let (c, s) = (clm.double_value(&[]), second.double_value(&[]));
    Ok((total, c, s))
}

/// `Σ_b (1/|R_b|) Σ_{i∈R_b} KL_i` from the standard (teacher, detached) and perturbed logits
/// `[B, L, V]`.
fn reference_kl(
    std_logits: &Tensor,
    pert_logits: &Tensor,
    views: &[RowView],
    dir: KlDirection,
) -> Result<Tensor> {
    let device = std_logits.device();
    let logp = pert_logits.f_log_softmax(-1, Kind::Double)?;
    let logq = std_logits.detach().f_log_softmax(-1, Kind::Double)?;
    let rows = match dir {
        KlDirection::Reverse => logp.f_exp()?.f_mul(&logp.f_sub(&logq)?)?,
        KlDirection::Forward => logq.f_exp()?.f_mul(&logq.f_sub(&logp)?)?,
    }
    .f_sum_dim_intlist(-1, false, Kind::Double)?; // [B, L]
    let mut kl = Tensor::zeros([], (Kind::Double, device));
    for (r, v) in views.iter().enumerate() {
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
                .f_div_scalar(v.kl_norm)?,
        )?;
    }
    Ok(kl)
}
