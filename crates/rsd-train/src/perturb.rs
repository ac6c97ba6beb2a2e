//! Position perturbations (the second view) and which logit rows can differ between the views.
//!
//! Every perturbation is an index map `f` over a span of length `n` (a row, or one document with
//! `--perturb-scope document`); the perturbed position of token `i` is `p_i + (f(i) − i)`, where `p`
//! are the standard positions (`0..L` per row, or restarting per document in mixed batches).
//! With row positions this is exactly the paper's definitions:
//!
//! | kind | `f(i)` | rows that can differ |
//! |---|---|---|
//! | skip (s, y) | `i` for `i < s`, `i + y` for `i ≥ s` | `s..L−1` |
//! | cyclic (u) | `(i + u) mod L` | `L−u..L−1` (the wrap point on) |
//! | dilation (a) | `floor(a·i)` | from the first `i` with `floor(a·i) ≠ i` |
//! | chunk-permute (π) | chunk `c` placed where the order π puts it | from the first moved chunk |
//!
//! **Which rows carry the KL.** Logit row `i` is `p(·|x_≤i)`; it sees keys `j` in its attention span
//! (the row, or its document) up to `i`, through the relative offsets `r_i − r_j`. Those offsets are
//! unchanged iff `δ_j = r_j − p_j` is constant over `j ∈ [span start, i]`. Rows where it is constant
//! are identical in both views (RoPE is relative) and carry no KL; the others "can differ". For the
//! skip view that is rows `s..L−1`, the paper's sum `Σ_{i≥s}`; for a document lying wholly after `s`
//! the shift is a block shift and its rows carry nothing (the rule for document-masked rows).
//!
//! **Shared prefix.** Rows before the first `i` with `δ_i ≠ 0` have identical positions, so every
//! layer's hidden states and K/V there are identical in both views: the perturbed pass can start at
//! that row and attend to the standard pass's K/V (prefix reuse, exact).
use serde::{Deserialize, Serialize};

use rsd_common::rng::SplitMix64;

/// Which position perturbation makes the second view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum PerturbKind {
    /// Skip `y` positions at a split `s` (the paper's RSD view).
    Skip,
    /// Cyclic shift by `u`: `r_i = (i + u) mod L`.
    Cyclic,
    /// Random dilation `r_i = floor(a·i)`, `a` log-uniform in `[0.5, 2]`.
    Dilation,
    /// Split into chunks and permute their positions.
    ChunkPermute,
    /// Control: the same tokens without rotary embeddings (NoPE), positions unchanged.
    Nope,
    /// Control: Gaussian noise N(0, σ²) on the second pass's attention scores (pre-softmax),
    /// positions unchanged (`attn_noise_sigma`).
    AttnNoise,
    /// Control: two passes with dropout on the attention probabilities (`attn_dropout`), KL
    /// between them, positions unchanged.
    Dropout,
}

impl PerturbKind {
    /// The name in configs and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PerturbKind::Skip => "skip",
            PerturbKind::Cyclic => "cyclic",
            PerturbKind::Dilation => "dilation",
            PerturbKind::ChunkPermute => "chunk-permute",
            PerturbKind::Nope => "nope",
            PerturbKind::AttnNoise => "attn-noise",
            PerturbKind::Dropout => "dropout",
        }
    }

    /// A control view: the second view keeps the standard positions and changes the attention
    /// itself (no RoPE, noisy scores, dropout); see [`control_view`].
    pub fn is_control(self) -> bool {
        matches!(
            self,
            PerturbKind::Nope | PerturbKind::AttnNoise | PerturbKind::Dropout
        )
    }
}

impl std::fmt::Display for PerturbKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the split is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// One perturbation per sequence (the paper).
    Sequence,
    /// One perturbation inside each document (mixed, document-masked batches).
    Document,
}

/// How one sample's KL sum is normalised.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KlNorm {
    /// `1/|R_b|`, the rows that can differ (the paper's `1/(L−s) Σ_{i≥s}`; `1/u` for cyclic).
    #[default]
    Rows,
    /// `1/L_b`, the sample's real (unpadded) tokens, whichever rows differ (`1/L` for cyclic).
    Length,
}

/// One concrete perturbation of one span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Perturbation {
    /// Identity.
    None,
    /// `f(i) = i + skip·[i ≥ split]`.
    Skip {
        /// s
        split: i64,
        /// y
        skip: i64,
    },
    /// `f(i) = (i + shift) mod n`.
    Cyclic {
        /// u
        shift: i64,
    },
    /// `f(i) = floor(factor·i)`.
    Dilation {
        /// a
        factor: f64,
    },
    /// Chunk `c` (of `order.len()` near-equal chunks) is placed at rank `order[c]`.
    ChunkPermute {
        /// Rank of each chunk in the permuted sequence.
        order: Vec<usize>,
    },
}

impl Perturbation {
    /// `f(i) − i` for `i` in `0..n`.
    pub fn offsets(&self, n: i64) -> Vec<i64> {
        let idx = 0..n;
        match self {
            Perturbation::None => vec![0; n as usize],
            Perturbation::Skip { split, skip } => {
                idx.map(|i| if i >= *split { *skip } else { 0 }).collect()
            }
            Perturbation::Cyclic { shift } => idx.map(|i| (i + shift).rem_euclid(n) - i).collect(),
            Perturbation::Dilation { factor } => idx
                .map(|i| (factor * i as f64).floor() as i64 - i)
                .collect(),
            Perturbation::ChunkPermute { order } => {
                let c = order.len().max(1) as i64;
                let bounds: Vec<i64> = (0..=c).map(|k| k * n / c).collect();
                let len = |k: usize| bounds[k + 1] - bounds[k];
                // New start of chunk k: total length of the chunks ranked before it.
                let starts: Vec<i64> = (0..order.len())
                    .map(|k| {
                        (0..order.len())
                            .filter(|&j| order[j] < order[k])
                            .map(len)
                            .sum()
                    })
                    .collect();
                let mut out = Vec::with_capacity(n as usize);
                for k in 0..order.len() {
                    for i in bounds[k]..bounds[k + 1] {
                        out.push(starts[k] + (i - bounds[k]) - i);
                    }
                }
                out
            }
        }
    }
}

/// How perturbations are drawn.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    /// The kind of view.
    pub kind: PerturbKind,
    /// Per sequence or per document.
    pub scope: Scope,
    /// `Y` for skip: `y ~ U{1..Y}`; `None` = the span length.
    pub skip_range: Option<i64>,
    /// Fixed `(s, y)` for the ablation (skip only; clamped to the span).
    pub fixed_split: Option<(i64, i64)>,
    /// Chunks for chunk-permute.
    pub chunks: usize,
    /// The KL's per-sample normaliser.
    pub kl_norm: KlNorm,
}

impl Sampler {
    /// A perturbation for a span of length `n` (the paper: `s ~ U{0..n−1}`, `y ~ U{1..Y}`;
    /// cyclic `u ~ U{1..n−1}`, since `u = 0` would be the identity; dilation log-uniform in
    /// `[0.5, 2]`; chunk-permute a uniform permutation).
    pub fn sample(&self, g: &mut SplitMix64, n: i64) -> Perturbation {
        if n <= 1 {
            return Perturbation::None;
        }
        match self.kind {
            // No positions to draw: their randomness is the row's seed ([`row_seed`]).
            PerturbKind::Nope | PerturbKind::AttnNoise | PerturbKind::Dropout => Perturbation::None,
            PerturbKind::Skip => {
                if let Some((s, y)) = self.fixed_split {
                    return Perturbation::Skip {
                        split: s.clamp(0, n - 1),
                        skip: y,
                    };
                }
                let split = g.range(0, n - 1);
                let skip = g.range(1, self.skip_range.unwrap_or(n).max(1));
                Perturbation::Skip { split, skip }
            }
            PerturbKind::Cyclic => Perturbation::Cyclic {
                shift: g.range(1, n - 1),
            },
            PerturbKind::Dilation => {
                let (lo, hi) = (0.5f64.ln(), 2f64.ln());
                Perturbation::Dilation {
                    factor: (lo + (hi - lo) * g.uniform()).exp(),
                }
            }
            PerturbKind::ChunkPermute => {
                let c = self.chunks.clamp(1, n as usize);
                let mut order: Vec<usize> = (0..c).collect();
                for i in (1..c).rev() {
                    let j = g.range(0, i as i64) as usize;
                    order.swap(i, j);
                }
                Perturbation::ChunkPermute { order }
            }
        }
    }
}

impl Sampler {
    /// The second view of one row, given its draws: the standard positions `std_pos` of which
    /// `n` are real, the row's document boundaries `doc_bounds` (already ending at `n`, [`clip_doc_bounds`]),
    /// and the row's perturbations `perts` (one, or one per document with document scope). A
    /// control kind's view takes its seed from the row's generator `g` ([`row_seed`]); the KL
    /// normaliser is the one [`KlNorm`] asks for. Training and the probe build every view here.
    pub fn view(
        &self,
        std_pos: &[i64],
        n: i64,
        doc_bounds: Option<&[i64]>,
        perts: &[Perturbation],
        g: &mut SplitMix64,
    ) -> RowView {
        let scope = if doc_bounds.is_some() {
            self.scope
        } else {
            Scope::Sequence
        };
        let mut v = if self.kind.is_control() {
            control_view(std_pos, n, doc_bounds, self.kind, row_seed(g))
        } else {
            perturb_real(std_pos, n, doc_bounds, scope, perts)
        };
        if self.kl_norm == KlNorm::Length {
            v.kl_norm = n as f64;
        }
        v
    }
}

/// The perturbed view of one row.
#[derive(Debug, Clone, PartialEq)]
pub struct RowView {
    /// Perturbed position ids, one per token.
    pub positions: Vec<i64>,
    /// Logit rows that can differ from the standard view (carry the KL).
    pub kl_mask: Vec<bool>,
    /// Number of `true` in `kl_mask`.
    pub kl_rows: i64,
    /// Rows `0..shared_prefix` have identical positions in both views.
    pub shared_prefix: i64,
    /// What the sample's KL sum is divided by (`kl_rows` unless [`KlNorm::Length`]).
    pub kl_norm: f64,
    /// Control views (attention noise, dropout): the seed of the row's random draws (layer
    /// `i` of pass `k` draws after `manual_seed(seed + 2·i + k)`; pass 0 is the standard view).
    pub seed: i64,
}

impl RowView {
    /// Whether the perturbed view can change any logit row of the sample (else it carries no KL
    /// and, for `rsd`, need not be computed).
    pub fn changes_anything(&self) -> bool {
        self.kl_rows > 0
    }
}

/// Document boundaries `doc_bounds` (`[0, …, L]`) cut at the row's real length `n`: the pack's tail
/// padding and context-parallel padding (each the row's last "document") drop out.
pub fn clip_doc_bounds(doc_bounds: &[i64], n: i64) -> Vec<i64> {
    let mut d: Vec<i64> = doc_bounds.iter().copied().filter(|&o| o < n).collect();
    if d.first() != Some(&0) {
        d.insert(0, 0);
    }
    d.push(n);
    d
}

/// [`perturb_row`] on the row's first `n` tokens (its real ones), the view extended over the
/// padding after them: standard positions there and no KL rows, so padding never enters the KL
/// or its normaliser, and a padded row's view equals the unpadded row's on the real tokens.
/// `doc_bounds` must already end at `n` ([`clip_doc_bounds`]).
pub fn perturb_real(
    std_pos: &[i64],
    n: i64,
    doc_bounds: Option<&[i64]>,
    scope: Scope,
    perts: &[Perturbation],
) -> RowView {
    let l = std_pos.len() as i64;
    let n = n.clamp(0, l);
    let mut v = perturb_row(&std_pos[..n as usize], doc_bounds, scope, perts);
    if n < l {
        v.positions.extend_from_slice(&std_pos[n as usize..]);
        v.kl_mask.resize(l as usize, false);
        if v.shared_prefix == n {
            v.shared_prefix = l;
        }
    }
    v
}

/// Applies `perts` (one for sequence scope, one per document for document scope) to a row with
/// standard positions `std_pos` and optional document boundaries `doc_bounds` (`[0, e1, …, L]`).
pub fn perturb_row(
    std_pos: &[i64],
    doc_bounds: Option<&[i64]>,
    scope: Scope,
    perts: &[Perturbation],
) -> RowView {
    let l = std_pos.len() as i64;
    let whole = [0, l];
    let spans = doc_bounds.unwrap_or(&whole);
    let delta: Vec<i64> = match scope {
        Scope::Sequence => perts[0].offsets(l),
        Scope::Document => spans
            .windows(2)
            .zip(perts)
            .flat_map(|(w, p)| p.offsets(w[1] - w[0]))
            .collect(),
    };
    let positions = std_pos.iter().zip(&delta).map(|(p, d)| p + d).collect();
    let mut kl_mask = vec![false; l as usize];
    for w in spans.windows(2) {
        let (a, b) = (w[0] as usize, w[1] as usize);
        let mut differs = false;
        for i in a..b {
            differs |= delta[i] != delta[a];
            kl_mask[i] = differs;
        }
    }
    let kl_rows = kl_mask.iter().filter(|&&m| m).count() as i64;
    let shared_prefix = delta.iter().position(|&d| d != 0).unwrap_or(l as usize) as i64;
    RowView {
        positions,
        kl_mask,
        kl_rows,
        shared_prefix,
        kl_norm: kl_rows as f64,
        seed: 0,
    }
}

/// The seed of a row's control-view draws, taken from the row's generator after its
/// perturbation: non-negative and far below `i64::MAX`, so `seed + 2·layer + pass` stays a valid
/// libtorch seed.
pub fn row_seed(g: &mut SplitMix64) -> i64 {
    (g.next_u64() >> 2) as i64
}

/// The second view of a control kind ([`PerturbKind::is_control`]) for a row with standard
/// positions `std_pos`, `n` real tokens and document boundaries `doc_bounds` (already ending at `n`,
/// [`clip_doc_bounds`]). Positions stay the standard ones and nothing is shared (the second pass runs
/// whole: no prefix reuse). The rows that can differ, which carry the KL:
///
/// * NoPE and attention noise: every row with at least two visible keys, i.e. each document's
///   rows after its first. A document's first row attends only to itself: its softmax is 1
///   whatever the scores, and the rotation of a query and key at one position cancels.
/// * Dropout: every real row (a dropped probability changes even a single-key row).
pub fn control_view(
    std_pos: &[i64],
    n: i64,
    doc_bounds: Option<&[i64]>,
    kind: PerturbKind,
    seed: i64,
) -> RowView {
    let l = std_pos.len() as i64;
    let n = n.clamp(0, l);
    let whole = [0, n];
    let spans = doc_bounds.unwrap_or(&whole);
    let first = i64::from(kind != PerturbKind::Dropout);
    let mut kl_mask = vec![false; l as usize];
    for w in spans.windows(2) {
        for i in (w[0] + first).min(w[1])..w[1].min(n) {
            kl_mask[i as usize] = true;
        }
    }
    let kl_rows = kl_mask.iter().filter(|&&m| m).count() as i64;
    RowView {
        positions: std_pos.to_vec(),
        kl_mask,
        kl_rows,
        shared_prefix: 0,
        kl_norm: kl_rows as f64,
        seed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(n: i64) -> Vec<i64> {
        (0..n).collect()
    }

    #[test]
    fn skip_matches_the_paper() {
        let v = perturb_row(
            &row(6),
            None,
            Scope::Sequence,
            &[Perturbation::Skip { split: 2, skip: 10 }],
        );
        assert_eq!(v.positions, vec![0, 1, 12, 13, 14, 15]);
        assert_eq!(v.kl_mask, vec![false, false, true, true, true, true]);
        assert_eq!((v.kl_rows, v.shared_prefix), (4, 2));
    }

    #[test]
    fn cyclic_differs_from_the_wrap_point() {
        let v = perturb_row(
            &row(5),
            None,
            Scope::Sequence,
            &[Perturbation::Cyclic { shift: 2 }],
        );
        assert_eq!(v.positions, vec![2, 3, 4, 0, 1]);
        assert_eq!(v.kl_mask, vec![false, false, false, true, true]);
        assert_eq!((v.kl_rows, v.shared_prefix), (2, 0));
    }

    #[test]
    fn documents_after_the_split_carry_no_kl() {
        // Two documents [0,3) and [3,6) with document positions; split inside the first.
        let pos = vec![0, 1, 2, 0, 1, 2];
        let v = perturb_row(
            &pos,
            Some(&[0, 3, 6]),
            Scope::Sequence,
            &[Perturbation::Skip { split: 1, skip: 5 }],
        );
        assert_eq!(v.positions, vec![0, 6, 7, 5, 6, 7]);
        assert_eq!(v.kl_mask, vec![false, true, true, false, false, false]);
        // Document scope: a split inside each.
        let v = perturb_row(
            &pos,
            Some(&[0, 3, 6]),
            Scope::Document,
            &[
                Perturbation::Skip { split: 2, skip: 1 },
                Perturbation::Skip { split: 1, skip: 4 },
            ],
        );
        assert_eq!(v.positions, vec![0, 1, 3, 0, 5, 6]);
        assert_eq!(v.kl_mask, vec![false, false, true, false, true, true]);
        assert_eq!(v.shared_prefix, 2);
    }

    #[test]
    fn padding_is_outside_the_view() {
        // 5 real tokens, 3 of padding (its own document in the shard).
        let pos = row(8);
        let doc_bounds = clip_doc_bounds(&[0, 2, 5, 8], 5);
        assert_eq!(doc_bounds, vec![0, 2, 5]);
        let p = [Perturbation::Cyclic { shift: 2 }];
        let v = perturb_real(&pos, 5, Some(&doc_bounds), Scope::Sequence, &p);
        let u = perturb_row(&pos[..5], Some(&doc_bounds), Scope::Sequence, &p);
        assert_eq!(&v.positions[..5], &u.positions[..]);
        assert_eq!(&v.positions[5..], &[5, 6, 7]);
        assert_eq!(&v.kl_mask[..5], &u.kl_mask[..]);
        assert_eq!(&v.kl_mask[5..], &[false; 3]);
        assert_eq!((v.kl_rows, v.kl_norm), (u.kl_rows, u.kl_norm));
        // Nothing real changed: the whole padded row is shared.
        let v = perturb_real(&pos, 5, None, Scope::Sequence, &[Perturbation::None]);
        assert_eq!((v.kl_rows, v.shared_prefix), (0, 8));
        assert!(!v.changes_anything());
    }

    #[test]
    fn chunk_permute_and_dilation_are_permutations_and_maps() {
        let p = Perturbation::ChunkPermute {
            order: vec![2, 0, 1],
        };
        let v = perturb_row(&row(7), None, Scope::Sequence, &[p]);
        // chunks [0,2) [2,4) [4,7) -> ranks 2,0,1: chunk1 at 0..2, chunk2 at 2..5, chunk0 at 5..7
        assert_eq!(v.positions, vec![5, 6, 0, 1, 2, 3, 4]);
        let mut s = v.positions.clone();
        s.sort();
        assert_eq!(s, row(7));
        let v = perturb_row(
            &row(5),
            None,
            Scope::Sequence,
            &[Perturbation::Dilation { factor: 2.0 }],
        );
        assert_eq!(v.positions, vec![0, 2, 4, 6, 8]);
        assert_eq!(v.shared_prefix, 1);
    }

    /// The generator behind the perturbations (rsd-common's SplitMix64) draws what the trainer's
    /// own copy drew before it, so runs and their checkpoints sample the same views.
    #[test]
    fn perturbation_draws_are_pinned() {
        let mut g = SplitMix64::keyed(&[0, 3, 1]);
        assert_eq!(g.next_u64(), 0x7d23_344b_bce8_df2c);
        assert_eq!((g.range(0, 127), g.range(1, 128)), (40, 85));
        assert_eq!(g.uniform().to_bits(), 4605233342464309040);
        let s = Sampler {
            kind: PerturbKind::Skip,
            scope: Scope::Sequence,
            skip_range: None,
            fixed_split: None,
            chunks: 8,
            kl_norm: KlNorm::Rows,
        };
        assert_eq!(
            s.sample(&mut SplitMix64::keyed(&[7, 0, 0]), 2048),
            Perturbation::Skip {
                split: 88,
                skip: 1262
            }
        );
    }

    #[test]
    fn control_views_keep_positions_and_mark_the_rows_that_can_differ() {
        let pos = vec![0, 1, 2, 0, 1, 2, 3, 4];
        let doc_bounds = clip_doc_bounds(&[0, 3, 8], 6);
        for (kind, mask) in [
            (PerturbKind::Nope, [false, true, true, false, true, true]),
            (
                PerturbKind::AttnNoise,
                [false, true, true, false, true, true],
            ),
            (PerturbKind::Dropout, [true; 6]),
        ] {
            let v = control_view(&pos, 6, Some(&doc_bounds), kind, 7);
            assert_eq!(v.positions, pos);
            assert_eq!(&v.kl_mask[..6], &mask);
            assert_eq!(&v.kl_mask[6..], &[false, false], "padding carries nothing");
            let rows = mask.iter().filter(|&&m| m).count() as i64;
            assert_eq!(
                (v.kl_rows, v.kl_norm, v.shared_prefix, v.seed),
                (rows, rows as f64, 0, 7)
            );
        }
        let v = control_view(&row(5), 5, None, PerturbKind::Nope, 0);
        assert_eq!(v.kl_rows, 4);
        // Control kinds draw nothing for positions.
        let s = Sampler {
            kind: PerturbKind::Dropout,
            scope: Scope::Sequence,
            skip_range: None,
            fixed_split: None,
            chunks: 8,
            kl_norm: KlNorm::Rows,
        };
        let mut g = SplitMix64::keyed(&[1]);
        assert_eq!(s.sample(&mut g, 10), Perturbation::None);
        assert_eq!(g.next_u64(), SplitMix64::keyed(&[1]).next_u64());
    }

    #[test]
    fn sampler_ranges() {
        let s = Sampler {
            kind: PerturbKind::Skip,
            scope: Scope::Sequence,
            skip_range: Some(3),
            fixed_split: None,
            chunks: 4,
            kl_norm: KlNorm::Rows,
        };
        let mut g = SplitMix64::keyed(&[9]);
        for _ in 0..200 {
            match s.sample(&mut g, 10) {
                Perturbation::Skip { split, skip } => {
                    assert!((0..10).contains(&split) && (1..=3).contains(&skip))
                }
                p => panic!("expected a skip, got {p:?}"),
            }
        }
    }
}
