//! Assembling a batch: copy tokens out of the map, shift labels, number positions, record document
//! boundaries, and cut each row into this CP rank's zigzag chunks.

use rsd_shard::Tokens;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::plan::StepPlan;
use crate::sources::OpenSource;
use crate::Positions;

/// The label value that losses ignore (PyTorch's default `ignore_index`).
pub const IGNORE_INDEX: i32 = -100;

/// Where a row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleId {
    /// Index of the source in the config.
    pub source: u32,
    /// Shard within the source's directory.
    pub shard: u32,
    /// Sample index within the shard.
    pub index: u64,
    /// Sample index within the source (over all its shards).
    pub global: u64,
    /// The source's epoch this draw belongs to.
    pub epoch: u64,
}

/// Token ids exactly as stored in the shards (one `memcpy` per chunk out of the map).
#[derive(Debug, Clone, PartialEq)]
pub enum RawTokens {
    /// uint16 shards.
    U16(Vec<u16>),
    /// int32 shards.
    I32(Vec<i32>),
}

impl Default for RawTokens {
    fn default() -> Self {
        RawTokens::U16(Vec::new())
    }
}

impl RawTokens {
    /// Ids held.
    pub fn len(&self) -> usize {
        match self {
            RawTokens::U16(v) => v.len(),
            RawTokens::I32(v) => v.len(),
        }
    }

    /// True when no id is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn clear(&mut self) {
        match self {
            RawTokens::U16(v) => v.clear(),
            RawTokens::I32(v) => v.clear(),
        }
    }

    fn view(&self, from: usize, to: usize) -> Tokens<'_> {
        match self {
            RawTokens::U16(v) => Tokens::U16(&v[from..to]),
            RawTokens::I32(v) => Tokens::I32(&v[from..to]),
        }
    }

    /// Append `t[from..to]`, switching to the storage type of `t` when empty.
    fn extend(&mut self, t: &Tokens<'_>, from: usize, to: usize) {
        match (&mut *self, t) {
            (RawTokens::U16(v), Tokens::U16(t)) => v.extend_from_slice(&t[from..to]),
            (RawTokens::I32(v), Tokens::I32(t)) => v.extend_from_slice(&t[from..to]),
            (RawTokens::U16(v), Tokens::I32(t)) if v.is_empty() => {
                *self = RawTokens::I32(t[from..to].to_vec())
            }
            (RawTokens::I32(v), Tokens::U16(t)) if v.is_empty() => {
                *self = RawTokens::U16(t[from..to].to_vec())
            }
            // Sources of one loader share a dtype (checked when opening), so this cannot happen;
            // widening keeps it correct anyway.
            (RawTokens::U16(v), Tokens::I32(t)) => {
                let mut w: Vec<i32> = v.iter().map(|&x| x as i32).collect();
                w.extend_from_slice(&t[from..to]);
                *self = RawTokens::I32(w);
            }
            (RawTokens::I32(v), Tokens::U16(t)) => v.extend(t[from..to].iter().map(|&x| x as i32)),
        }
    }
}

/// How a batch hands over its tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchLayout {
    /// `tokens`, `labels` and `position_ids` as `i32` arrays, ready to use.
    #[default]
    Full,
    /// Only the ids as stored (`raw`, plus one look-ahead id per chunk for its last label) and the
    /// per-row facts the rest follows from; [`Batch::materialize`] derives the full arrays. For a
    /// trainer that uploads the ids and derives labels and positions on the device.
    Compact,
}

/// Per-row facts labels and positions follow from (both layouts fill it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowMeta {
    /// Tokens in the row as stored (pack tail padding included, CP padding not).
    pub len: u32,
    /// Labels exist for positions `< label_end − 1` (excludes the pack's tail padding).
    pub label_end: u32,
    /// Id used for CP padding.
    pub pad: i32,
    /// Positions restart at each document.
    pub doc_positions: bool,
    /// The last token of each document has no label.
    pub mask_doc_boundaries: bool,
}

/// One step's data for one (DP, CP) rank. Rows are concatenated (see docs/LOADER.md).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Global step index since the start of the stream (identical on every rank).
    pub step: u64,
    /// Token ids held by this rank.
    pub tokens: Vec<i32>,
    /// Next-token targets, shifted on the full row before CP slicing; [`IGNORE_INDEX`] = no loss.
    pub labels: Vec<i32>,
    /// RoPE position ids of the tokens held.
    pub position_ids: Vec<i32>,
    /// cu_seqlens over rows in the local arrays (`rows + 1` entries).
    pub row_offsets: Vec<u32>,
    /// cu_seqlens over document pieces in full-row (pre-CP) flat coordinates.
    pub doc_offsets: Vec<u32>,
    /// cu_seqlens over rows in full-row coordinates (rows padded to a multiple of 2·cp_size).
    pub full_row_offsets: Vec<u32>,
    /// Full-coordinate ranges `[start, end)` held locally, in local order.
    pub chunks: Vec<[u32; 2]>,
    /// Origin of each row.
    pub samples: Vec<SampleId>,
    /// Real (non-padding) tokens over the full rows.
    pub num_tokens: u64,
    /// Labels that are not ignored, over the full rows (sum over DP ranks to normalise the loss).
    pub num_label_tokens: u64,
    /// Which arrays are filled: `Full` fills `tokens`/`labels`/`position_ids`, `Compact` `raw`.
    pub layout: BatchLayout,
    /// Compact layout: for each entry of `chunks`, the stored ids of `[start, min(end + 1, row
    /// length))` — the chunk and one look-ahead id for its last label (CP padding not stored).
    pub raw: RawTokens,
    /// cu_seqlens over `chunks` into `raw`.
    pub raw_offsets: Vec<u32>,
    /// Per-row facts (both layouts).
    pub row_meta: Vec<RowMeta>,
}

impl Batch {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.samples.len()
    }

    /// The `Full` arrays of this batch: copied for a `Full` batch, derived from `raw` and the row
    /// facts for a `Compact` one (identical to what a `Full` loader would have produced).
    pub fn materialize(
        &self,
        tokens: &mut Vec<i32>,
        labels: &mut Vec<i32>,
        position_ids: &mut Vec<i32>,
    ) {
        tokens.clear();
        labels.clear();
        position_ids.clear();
        if self.layout == BatchLayout::Full {
            tokens.extend_from_slice(&self.tokens);
            labels.extend_from_slice(&self.labels);
            position_ids.extend_from_slice(&self.position_ids);
            return;
        }
        let mut out = Batch::default();
        std::mem::swap(&mut out.tokens, tokens);
        std::mem::swap(&mut out.labels, labels);
        std::mem::swap(&mut out.position_ids, position_ids);
        let per_row = self.chunks.len() / self.rows().max(1);
        let mut d = 1; // next entry of doc_offsets
        for (r, meta) in self.row_meta.iter().enumerate() {
            let base = self.full_row_offsets[r] as u64;
            let len = meta.len as u64;
            let mut starts = vec![0u64];
            while d < self.doc_offsets.len() && self.doc_offsets[d] as u64 <= base + len {
                starts.push(self.doc_offsets[d] as u64 - base);
                d += 1;
            }
            // Skip the CP padding "document" of this row, if any.
            while d < self.doc_offsets.len()
                && (self.doc_offsets[d] as u64) <= self.full_row_offsets[r + 1] as u64
            {
                d += 1;
            }
            for c in r * per_row..(r + 1) * per_row {
                let [lo, hi] = self.chunks[c];
                let (lo, hi) = (lo as u64 - base, hi as u64 - base);
                let (a, z) = (
                    self.raw_offsets[c] as usize,
                    self.raw_offsets[c + 1] as usize,
                );
                push_range(
                    &mut out,
                    &self.raw.view(a, z),
                    lo.min(len) as usize,
                    &starts,
                    lo,
                    hi,
                    len,
                    meta.label_end as u64,
                    meta.pad,
                    meta.doc_positions,
                    meta.mask_doc_boundaries,
                );
            }
        }
        std::mem::swap(&mut out.tokens, tokens);
        std::mem::swap(&mut out.labels, labels);
        std::mem::swap(&mut out.position_ids, position_ids);
    }
}

/// How rows are cut and labelled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub cp_rank: usize,
    pub cp_size: usize,
    pub positions: crate::Positions,
    pub mask_doc_boundaries: Option<bool>,
    pub release_pages: bool,
    pub batch_layout: BatchLayout,
}

impl Batch {
    /// Empty every array but keep its allocation, for reuse.
    fn clear(&mut self) {
        self.tokens.clear();
        self.labels.clear();
        self.position_ids.clear();
        self.row_offsets.clear();
        self.doc_offsets.clear();
        self.full_row_offsets.clear();
        self.chunks.clear();
        self.samples.clear();
        self.raw.clear();
        self.raw_offsets.clear();
        self.row_meta.clear();
        (self.num_tokens, self.num_label_tokens) = (0, 0);
    }
}

/// Build the batch for `plan` from the mapped shards, reusing `spare`'s allocations if given
/// (fresh multi-MiB vectors cost a page fault per 4 KiB; reused ones are already mapped, often cached).
pub(crate) fn assemble(
    sources: &[OpenSource],
    plan: &StepPlan,
    layout: &Layout,
    spare: Option<Batch>,
) -> Result<Batch> {
    let mut b = spare.unwrap_or_default();
    b.clear();
    b.step = plan.step;
    b.layout = layout.batch_layout;
    let compact = layout.batch_layout == BatchLayout::Compact;
    b.row_offsets.push(0);
    b.full_row_offsets.push(0);
    b.doc_offsets.push(0);
    b.raw_offsets.push(0);
    let two_p = 2 * layout.cp_size as u64;
    // Size the arrays once: growing them by doubling would copy every token again.
    let mut local = 0usize;
    for r in &plan.rows {
        let set = &sources[r.source].set;
        let (k, i) = set.locate(r.global)?;
        let (_, _, start, end) = set.shards()[k].sample_span(i)?;
        let len = ((end - start) / set.manifest().dtype.size()) as u64;
        local += (len.div_ceil(two_p) * two_p / layout.cp_size as u64) as usize;
    }
    if !compact {
        b.tokens.reserve_exact(local);
        b.labels.reserve_exact(local);
        b.position_ids.reserve_exact(local);
    }
    let mut full_base = 0u64;
    let mut local_len = 0u64; // compact: tokens this rank holds so far (what `tokens` would hold)
    for r in &plan.rows {
        let src = &sources[r.source];
        let (k, i) = src.set.locate(r.global)?;
        let shard = &src.set.shards()[k];
        let sample = shard.sample(i)?;
        let len = sample.tokens.len() as u64;
        let padded = if layout.cp_size > 1 {
            len.div_ceil(two_p) * two_p
        } else {
            len
        };
        let doc_mode = match layout.positions {
            Positions::Row => false,
            Positions::Document => true,
            Positions::Auto => src.mixed,
        };
        let mask_docs = layout.mask_doc_boundaries.unwrap_or(src.mixed);
        // The pack's tail padding sits at the end of the set's last sample: no targets there, and
        // the last real token does not predict a pad either.
        let tail_pad = if src.tail_padding > 0 && r.global + 1 == src.samples {
            src.tail_padding.min(len)
        } else {
            0
        };
        let real_len = len - tail_pad;

        // Document starts within the row (plus the row end), and the padding "document".
        let mut starts = Vec::with_capacity(sample.pieces.len() + 2);
        let mut at = 0u64;
        for &p in &sample.pieces {
            starts.push(at);
            at += p as u64;
        }
        starts.push(len);
        for s in &starts[1..] {
            b.doc_offsets.push((full_base + s) as u32);
        }
        if padded > len {
            b.doc_offsets.push((full_base + padded) as u32);
        }

        // Labels over the full row count toward the normaliser, whichever chunk holds them.
        let masked_ends = if mask_docs {
            sample.pieces.len() as u64
        } else {
            1
        };
        b.num_label_tokens += real_len.saturating_sub(masked_ends);
        b.num_tokens += real_len;

        let chunks: Vec<(u64, u64)> = if layout.cp_size > 1 {
            let c = padded / two_p;
            let (a, z) = (layout.cp_rank as u64, two_p - 1 - layout.cp_rank as u64);
            vec![(a * c, (a + 1) * c), (z * c, (z + 1) * c)]
        } else {
            vec![(0, len)]
        };
        b.row_meta.push(RowMeta {
            len: len as u32,
            label_end: real_len as u32,
            pad: src.pad_id,
            doc_positions: doc_mode,
            mask_doc_boundaries: mask_docs,
        });
        for (lo, hi) in chunks {
            if compact {
                let from = lo.min(len) as usize;
                let to = (hi + 1).min(len) as usize;
                b.raw.extend(&sample.tokens, from, to.max(from));
                b.raw_offsets.push(b.raw.len() as u32);
                local_len += hi - lo;
            } else {
                push_range(
                    &mut b,
                    &sample.tokens,
                    0,
                    &starts,
                    lo,
                    hi,
                    len,
                    real_len,
                    src.pad_id,
                    doc_mode,
                    mask_docs,
                );
            }
            b.chunks
                .push([(full_base + lo) as u32, (full_base + hi) as u32]);
        }
        b.row_offsets.push(if compact {
            local_len as u32
        } else {
            b.tokens.len() as u32
        });
        full_base += padded;
        b.full_row_offsets.push(full_base as u32);
        b.samples.push(crate::SampleId {
            source: r.source as u32,
            shard: k as u32,
            index: i as u64,
            global: r.global,
            epoch: r.epoch,
        });
        if layout.release_pages {
            // The row is copied out: drop the pages from our mapping so RSS does not grow with the
            // amount read. The page cache keeps them; this only unmaps them from the process.
            let (_, _, start, end) = shard.sample_span(i)?;
            shard.release_bin_range(start, end);
        }
    }
    Ok(b)
}

/// Append full-row positions `lo..hi` of one row (positions ≥ `len` are CP padding; tokens at
/// `label_end..len` are the pack's tail padding: stored, but without targets). `tokens[0]` is the
/// row's token at position `offset` (0: the whole row; a compact chunk starts later).
#[allow(clippy::too_many_arguments)]
fn push_range(
    b: &mut Batch,
    tokens: &Tokens<'_>,
    offset: usize,
    starts: &[u64],
    lo: u64,
    hi: u64,
    len: u64,
    label_end: u64,
    pad: i32,
    doc_mode: bool,
    mask_docs: bool,
) {
    let (lo_u, hi_u, len_u) = (lo as usize, hi as usize, len as usize);
    let real_hi = hi_u.min(len_u);
    let real_lo = lo_u.min(real_hi);
    // Tokens: a widening copy straight from the map (vectorises).
    let (a, z) = (real_lo - offset.min(real_lo), real_hi - offset.min(real_lo));
    match tokens {
        Tokens::U16(t) => b.tokens.extend(t[a..z].iter().map(|&x| x as i32)),
        Tokens::I32(t) => b.tokens.extend_from_slice(&t[a..z]),
    }
    // Labels: the same copy shifted by one; the row's last position has no target.
    let with_target = real_hi
        .min((label_end as usize).saturating_sub(1))
        .saturating_sub(real_lo);
    let label_base = b.labels.len();
    if with_target > 0 {
        let from = real_lo + 1 - offset;
        let to = from + with_target;
        match tokens {
            Tokens::U16(t) => b.labels.extend(t[from..to].iter().map(|&x| x as i32)),
            Tokens::I32(t) => b.labels.extend_from_slice(&t[from..to]),
        }
    }
    b.labels
        .resize(label_base + (real_hi - real_lo), IGNORE_INDEX);
    if mask_docs {
        // The last token of each document piece must not predict the next document.
        for &s in &starts[1..starts.len() - 1] {
            let end = s as usize - 1;
            if end >= real_lo && end < real_hi {
                b.labels[label_base + end - real_lo] = IGNORE_INDEX;
            }
        }
    }
    // Positions: row positions, or restarting at each document start.
    if doc_mode {
        let mut d = starts
            .partition_point(|&s| s as usize <= real_lo)
            .saturating_sub(1);
        for j in real_lo..real_hi {
            while d + 1 < starts.len() - 1 && starts[d + 1] as usize <= j {
                d += 1;
            }
            b.position_ids.push((j - starts[d] as usize) as i32);
        }
    } else {
        b.position_ids.extend((real_lo..real_hi).map(|j| j as i32));
    }
    // Padding (CP only): pad tokens, no labels, positions continuing from the row's last one.
    if hi_u > real_hi {
        let from = lo_u.max(len_u);
        let last_doc_start = if doc_mode {
            starts[starts.len() - 2] as usize
        } else {
            0
        };
        for j in from..hi_u {
            b.tokens.push(pad);
            b.labels.push(IGNORE_INDEX);
            b.position_ids.push((j - last_doc_start) as i32);
        }
    }
}
