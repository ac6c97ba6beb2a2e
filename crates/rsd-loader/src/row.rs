//! What a training row is: the labels and positions that follow from a row's tokens and its
//! facts (real length, document boundaries, loss mask). This is the one definition; the
//! loader's two layouts build the same arrays in bulk and chunk by chunk (their tests compare
//! every row they produce with [`RowRules`]), and whatever builds a row from scratch (the
//! trainer's probe, evaluation) calls it.
//!
//! For the token at row position `j`:
//!
//! * its label is the next token `j + 1`, or [`IGNORE_INDEX`] when `j + 1` is not a real token
//!   (the row's end, the pack's tail padding, CP padding), when `j + 1` starts a document and the
//!   last token of each document is masked, or when the loss mask leaves token `j + 1` out;
//! * its position is `j`, or with document positions `j` minus the start of the document holding
//!   `j` (tokens past the last boundary, i.e. CP padding, continue the last document).

use crate::IGNORE_INDEX;

/// The facts of one row that its labels and positions follow from.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowRules<'a> {
    /// Tokens that are real (the rest are padding): a token has a label only if its target is
    /// one of them.
    pub real_len: usize,
    /// Document boundaries as cumulative offsets `[0, e1, …, end]`; `None` or one span: the row
    /// is one document.
    pub doc_bounds: Option<&'a [usize]>,
    /// The last token of each document has no label (it would predict the next document).
    pub mask_doc_boundaries: bool,
    /// Positions restart at 0 at each document (else `0..len` along the row).
    pub doc_positions: bool,
    /// Per token: whether it is trained on as a target (the shards' loss mask, chat data);
    /// `None`: every token is.
    pub trained: Option<&'a [bool]>,
}

impl RowRules<'_> {
    /// Whether the token at `j` has a label: its target `j + 1` is real, does not start a
    /// document whose predecessor is masked, and is trained on.
    pub fn has_label(&self, j: usize) -> bool {
        let target = j + 1;
        let at_doc_start = self.mask_doc_boundaries
            && self
                .doc_bounds
                .is_some_and(|b| b.len() > 2 && b[1..b.len() - 1].contains(&target));
        let trained = self
            .trained
            .is_none_or(|m| m.get(target).copied().unwrap_or(false));
        target < self.real_len && !at_doc_start && trained
    }

    /// The labels of a row with `tokens`: the next token where [`has_label`](Self::has_label),
    /// else [`IGNORE_INDEX`].
    pub fn labels<T: Copy + From<i32>>(&self, tokens: &[T]) -> Vec<T> {
        (0..tokens.len())
            .map(|j| {
                if self.has_label(j) {
                    tokens[j + 1]
                } else {
                    T::from(IGNORE_INDEX)
                }
            })
            .collect()
    }

    /// The RoPE positions of a row of `len` tokens.
    pub fn positions(&self, len: usize) -> Vec<i64> {
        let bounds = match self.doc_bounds {
            Some(b) if self.doc_positions && !b.is_empty() => b,
            _ => return (0..len as i64).collect(),
        };
        // The start of the document holding `j`: the last boundary ≤ j, among the document
        // starts (the closing boundary starts nothing).
        let starts = &bounds[..bounds.len().saturating_sub(1).max(1)];
        let mut doc = 0;
        (0..len)
            .map(|j| {
                while doc + 1 < starts.len() && starts[doc + 1] <= j {
                    doc += 1;
                }
                (j - starts[doc]) as i64
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_document_rows_predict_the_next_token_until_the_real_end() {
        let tokens = [10, 11, 12, 13, 0, 0];
        let rules = RowRules {
            real_len: 4,
            ..Default::default()
        };
        assert_eq!(rules.labels(&tokens), [11, 12, 13, -100, -100, -100]);
        assert_eq!(rules.positions(6), [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn documents_restart_positions_and_mask_their_last_token() {
        let tokens: Vec<i64> = (0..8).collect();
        let bounds = [0, 3, 5, 8];
        let rules = RowRules {
            real_len: 8,
            doc_bounds: Some(&bounds),
            mask_doc_boundaries: true,
            doc_positions: true,
            trained: None,
        };
        assert_eq!(rules.labels(&tokens), [1, 2, -100, 4, -100, 6, 7, -100]);
        assert_eq!(rules.positions(8), [0, 1, 2, 0, 1, 0, 1, 2]);
        // Padding past the last boundary continues the last document.
        assert_eq!(rules.positions(10), [0, 1, 2, 0, 1, 0, 1, 2, 3, 4]);
        let unmasked = RowRules {
            mask_doc_boundaries: false,
            doc_positions: false,
            ..rules
        };
        assert_eq!(unmasked.labels(&tokens), [1, 2, 3, 4, 5, 6, 7, -100]);
        assert_eq!(unmasked.positions(8), [0, 1, 2, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn the_loss_mask_names_trained_targets() {
        let tokens = [5, 6, 7, 8];
        let trained = [true, false, true, true];
        let rules = RowRules {
            real_len: 4,
            trained: Some(&trained),
            ..Default::default()
        };
        assert_eq!(rules.labels(&tokens), [-100, 7, 8, -100]);
    }
}
