//! LongCE's short-context log-probabilities (the denominator of each token's weight).
use tch::Tensor;

use rsd_model::{DocBoundaries, Model};

use super::prefix_reuse::pos_tensor;
use super::{LongCe, MicroBatch, IGNORE};
use crate::{Error, Result};

/// `log p(label_i | short context)` for every row and position `[B, L]` (0 where there is no
/// label), from one forward without a graph in which the sequence is cut into `window`-token
/// pieces (and at document starts), each attending only to itself from position 0.
pub(super) fn short_context_logprobs(
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
    let (cuts, positions) = short_contexts(mb, lc.window);
    let device = mb.tokens.device();
    let (b, l) = (mb.rows(), mb.len());
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
                .f_mul(&y.f_ne(IGNORE)?.f_to_kind(lk)?)?;
            out.f_get(r)?.f_narrow(0, i0, n)?.f_copy_(&picked)?;
            i0 += n;
        }
    }
    Ok(out)
}

/// Per row: the cuts of the short contexts (every `window` tokens and at document starts,
/// `[0, …, L]`) and the positions restarting at each cut.
fn short_contexts(mb: &MicroBatch, window: i64) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let (b, l) = (mb.rows(), mb.len());
    let mut cuts = Vec::with_capacity(b);
    let mut positions = Vec::with_capacity(b);
    for r in 0..b {
        let mut cu: Vec<i64> = (0..l).step_by(window as usize).collect();
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
    (cuts, positions)
}
