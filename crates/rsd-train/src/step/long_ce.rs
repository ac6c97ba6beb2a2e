//! LongCE's short-context log-probabilities (the denominator of each token's weight).
//!
//! Logit row `p` (predicting the label at `p`) is scored in the short-context window starting at
//! `s = ⌊(p + 1 − window) / stride⌋ · stride`, i.e. with `window … window + stride − 1` tokens
//! of context `x_s … x_p` (LongCE's `trunc_len` and `internal`). Where `s` is at or before the
//! start of `p`'s document (or `p + 1 < window`), the short context is the whole context and the
//! weight is exactly 1, so that row is not run at all. The rows one window scores are contiguous
//! and lie in one document (a document start inside the window would be at or after `s`), so
//! each window is a plain causal sequence from position 0; the windows of a micro-batch are
//! stacked as the rows of a few forwards without a graph, each about the size of the
//! micro-batch.
use tch::{Kind, Tensor};

use rsd_model::Model;

use super::{LongCe, MicroBatch, IGNORE};
use crate::cp::CpBatch;
use crate::Result;

/// The labels' log-probabilities under the short context, and where they apply.
pub(super) struct ShortContext {
    /// `log p(label | short context)` `[B, L]` (loss dtype; 0 where `scored` is 0).
    pub logp: Tensor,
    /// 1 where the row has its own short context, 0 where its weight is exactly 1 `[B, L]`.
    pub scored: Tensor,
}

/// One short-context window: row `row`'s tokens `start..end`, scoring logit rows `first..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub row: usize,
    pub start: i64,
    pub first: i64,
    pub end: i64,
}

/// The start of logit row `p`'s short context, or `None` when that is its whole context (the
/// window would begin at or before `doc_start`, the start of `p`'s document).
pub(super) fn short_start(p: i64, doc_start: i64, lc: LongCe) -> Option<i64> {
    let n = p + 1 - lc.window;
    if n < 0 {
        return None;
    }
    let s = n / lc.stride * lc.stride;
    (s > doc_start).then_some(s)
}

/// The windows of a micro-batch whose rows have `real[r]` real tokens and (document-masked
/// batches) the document boundaries `doc_bounds[r]`, in row order.
pub(super) fn windows(real: &[i64], doc_bounds: Option<&[Vec<i64>]>, lc: LongCe) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::new();
    for (row, &n) in real.iter().enumerate() {
        let bounds = doc_bounds
            .and_then(|d| d.get(row))
            .map_or(&[][..], |d| &d[..]);
        let mut doc = 0;
        let mut next = 1;
        for p in 0..n {
            while next < bounds.len() && bounds[next] <= p {
                doc = bounds[next];
                next += 1;
            }
            let Some(s) = short_start(p, doc, lc) else {
                continue;
            };
            match out.last_mut() {
                Some(w) if w.row == row && w.start == s && w.end == p => w.end = p + 1,
                _ => out.push(Window {
                    row,
                    start: s,
                    first: p,
                    end: p + 1,
                }),
            }
        }
    }
    out
}

/// `log p(label | short context)` for every row and position of `mb`, from forwards without a
/// graph over its short-context windows (at most about `B·L` tokens each); the logits formed
/// `chunk` rows at a time.
///
/// Under context parallelism (`split`: the whole rows, and this rank's chunks of them) `mb`
/// holds this rank's chunks: the windows are those of the whole rows, cut to the rows this rank
/// holds, and their tokens come from the whole rows. Each rank runs only the windows of its own
/// rows, so the work is split as the rows are; no collective.
pub(super) fn short_context_logprobs(
    model: &Model,
    mb: &MicroBatch,
    lc: LongCe,
    chunk: i64,
    split: Option<(&CpBatch<'_>, &[(i64, i64)])>,
) -> Result<ShortContext> {
    let device = mb.tokens.device();
    let (b, l_out) = (mb.rows() as i64, mb.len());
    // Scored rows of a window are contiguous in the output too: (window, output index of
    // `first`).
    let (tokens, l_src, jobs): (Tensor, i64, Vec<(Window, i64)>) = match split {
        None => {
            let jobs = windows(&mb.real_len, mb.doc_bounds.as_deref(), lc)
                .into_iter()
                .map(|w| (w, w.row as i64 * l_out + w.first))
                .collect();
            (mb.tokens.f_reshape([b * l_out])?, l_out, jobs)
        }
        Some((batch, chunks)) => {
            let whole = batch.tokens();
            let l = whole.first().map_or(0, Vec::len) as i64;
            let flat: Vec<i64> = whole.iter().flatten().copied().collect();
            let mut jobs = Vec::new();
            for w in windows(&mb.real_len, mb.doc_bounds.as_deref(), lc) {
                let mut local = 0;
                for &(cs, cn) in chunks {
                    let (first, end) = (w.first.max(cs), w.end.min(cs + cn));
                    if first < end {
                        let cut = Window { first, end, ..w };
                        jobs.push((cut, w.row as i64 * l_out + local + first - cs));
                    }
                    local += cn;
                }
            }
            (super::upload(&flat, device)?, l, jobs)
        }
    };
    let w = model.lm_head_weight();
    let lk = rsd_model::accum_kind(w.kind());
    let mut logp = Tensor::f_zeros([b * l_out], (lk, device))?;
    let mut scored = Tensor::f_zeros([b * l_out], (lk, device))?;
    let longest = jobs.iter().map(|(w, _)| w.end - w.start).max().unwrap_or(0);
    let per_forward = ((b * l_out) / longest.max(1)).max(1) as usize;
    let labels = mb.labels.f_reshape([b * l_out])?;
    for group in jobs.chunks(per_forward) {
        let width = group
            .iter()
            .map(|(w, _)| w.end - w.start)
            .max()
            .unwrap_or(1);
        // Each window a row of `width` tokens; a shorter one repeats its last token, which no
        // scored row sees (causal attention).
        let mut gather = Vec::with_capacity(group.len() * width as usize);
        // Scored rows: index into the stacked hidden states, and into the flat outputs.
        let (mut from, mut to) = (Vec::new(), Vec::new());
        for (k, (win, dst)) in group.iter().enumerate() {
            let base = win.row as i64 * l_src;
            gather.extend((0..width).map(|j| base + (win.start + j).min(win.end - 1)));
            from.extend((win.first..win.end).map(|p| k as i64 * width + p - win.start));
            to.extend((win.first..win.end).map(|p| dst + p - win.first));
        }
        let n = group.len() as i64;
        let idx = |v: &[i64]| -> Result<Tensor> { super::upload(v, device) };
        let x = tokens
            .f_index_select(0, &idx(&gather)?)?
            .f_view([n, width])?;
        let pos = Tensor::f_arange(width, (Kind::Int64, device))?.f_expand([n, width], false)?;
        let hidden = model
            .forward(&rsd_model::ForwardArgs::new(&x, &pos))?
            .hidden
            .f_reshape([n * width, -1])?;
        let (from, to) = (idx(&from)?, idx(&to)?);
        let rows = from.size()[0];
        let c = chunk.max(1);
        let mut i0 = 0;
        while i0 < rows {
            let m = c.min(rows - i0);
            let dst = to.f_narrow(0, i0, m)?;
            let lp = hidden
                .f_index_select(0, &from.f_narrow(0, i0, m)?)?
                .f_matmul(&w.f_tr()?)?
                .f_to_kind(lk)?
                .f_log_softmax(-1, lk)?;
            let y = labels.f_index_select(0, &dst)?;
            let picked = lp
                .f_gather(1, &y.f_clamp_min(0)?.f_unsqueeze(1)?, false)?
                .f_squeeze_dim(1)?
                .f_mul(&y.f_ne(IGNORE)?.f_to_kind(lk)?)?;
            let _ = logp.f_index_copy_(0, &dst, &picked)?;
            let _ = scored.f_index_fill_(0, &dst, 1.0)?;
            i0 += m;
        }
    }
    Ok(ShortContext {
        logp: logp.f_view([b, l_out])?,
        scored: scored.f_view([b, l_out])?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lc(window: i64, stride: i64) -> LongCe {
        LongCe {
            window,
            stride,
            gamma: 5.0,
        }
    }

    /// Every scored row's context `p − s + 1` lies in `[window, window + stride − 1]`.
    fn context_in_range(ws: &[Window], c: LongCe) -> bool {
        ws.iter().all(|w| {
            (w.first..w.end).all(|p| (c.window..c.window + c.stride).contains(&(p - w.start + 1)))
        })
    }

    #[test]
    fn the_paper_setting_scores_each_row_with_4k_to_5k_tokens_of_context() {
        let c = lc(4096, 1024);
        // LongCE's loop: windows x[s : s + 5120] for s = 0, 1024, …; the one at 0 is the whole
        // context (weight 1), so rows 4095…5118 need no window of their own.
        assert_eq!(short_start(4094, 0, c), None);
        assert_eq!(short_start(5118, 0, c), None);
        assert_eq!(short_start(5119, 0, c), Some(1024));
        assert_eq!(short_start(6142, 0, c), Some(1024));
        assert_eq!(short_start(6143, 0, c), Some(2048));
        let ws = windows(&[10_000], None, c);
        let spans: Vec<(i64, i64, i64)> = ws.iter().map(|w| (w.start, w.first, w.end)).collect();
        assert_eq!(
            spans,
            [
                (1024, 5119, 6143),
                (2048, 6143, 7167),
                (3072, 7167, 8191),
                (4096, 8191, 9215),
                (5120, 9215, 10_000) // the last window stops at the row's end
            ]
        );
        assert!(context_in_range(&ws, c));
    }

    #[test]
    fn rows_shorter_than_the_reference_need_no_window() {
        assert!(windows(&[7, 8], None, lc(8, 2)).is_empty());
        assert!(windows(&[100], None, lc(200, 50)).is_empty());
    }

    #[test]
    fn a_length_that_is_no_multiple_of_the_stride_ends_with_a_short_window() {
        let c = lc(3, 2);
        let ws = windows(&[10], None, c);
        let spans: Vec<(i64, i64, i64)> = ws.iter().map(|w| (w.start, w.first, w.end)).collect();
        // Row p: s = ⌊(p − 2) / 2⌋·2; rows 2, 3 have s = 0 (weight 1).
        assert_eq!(spans, [(2, 4, 6), (4, 6, 8), (6, 8, 10)]);
        let ws = windows(&[9], None, c);
        assert_eq!(
            ws.last().map(|w| (w.start, w.first, w.end)),
            Some((6, 8, 9))
        );
        assert!(context_in_range(&ws, c));
    }

    #[test]
    fn document_starts_cut_the_short_context() {
        let c = lc(3, 2);
        // Documents [0, 5) and [5, 16): rows of the second document count from 5; a window that
        // would start at or before 5 is that document's whole context.
        let ws = windows(&[16], Some(&[vec![0, 5, 16]]), c);
        let spans: Vec<(i64, i64, i64)> = ws.iter().map(|w| (w.start, w.first, w.end)).collect();
        assert_eq!(
            spans,
            [
                (2, 4, 5),
                (6, 8, 10),
                (8, 10, 12),
                (10, 12, 14),
                (12, 14, 16)
            ]
        );
        // No window reaches across a document start.
        assert!(ws.iter().all(|w| w.end <= 5 || w.start > 5));
        assert!(context_in_range(&ws, c));
    }

    #[test]
    fn padding_and_rows_are_kept_apart() {
        let c = lc(2, 2);
        let ws = windows(&[6, 3], None, c);
        let spans: Vec<(usize, i64, i64, i64)> = ws
            .iter()
            .map(|w| (w.row, w.start, w.first, w.end))
            .collect();
        // Row 1 has 3 real tokens: row p = 2 would start at 0 (its whole context).
        assert_eq!(spans, [(0, 2, 3, 5), (0, 4, 5, 6)]);
    }

    #[test]
    fn reference_one_and_stride_k_are_the_old_non_overlapping_k_token_windows() {
        let (k, len) = (5, 17);
        let c = lc(1, k);
        for p in 0..len {
            let s = p / k * k;
            assert_eq!(short_start(p, 0, c), (s > 0).then_some(s), "row {p}");
        }
        let ws = windows(&[len], None, c);
        let spans: Vec<(i64, i64, i64)> = ws.iter().map(|w| (w.start, w.first, w.end)).collect();
        assert_eq!(spans, [(5, 5, 10), (10, 10, 15), (15, 15, 17)]);
    }
}
