//! Assembling a batch: copy tokens out of the map, shift labels, number positions, record document
//! boundaries, and cut each row into this CP rank's zigzag chunks.
//!
//! The compact layout copies only the ids (and CP padding) in the shards' dtype and records what
//! labels and positions follow from; `Batch::materialize` is the definition of that derivation.

use rsd_shard::{Shard, TokenDtype, Tokens};
use serde::{Deserialize, Serialize};

use crate::error::{LoaderError, Result};
use crate::ids::IdBuf;
use crate::plan::StepPlan;
use crate::sources::OpenSource;
use crate::{Positions, ReadMethod};

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

/// Token ids exactly as stored in the shards: the compact layout's copy of what `tokens` holds
/// in the full layout, without widening (one copy per chunk from the page cache). The storage is
/// 64-byte aligned ([`IdBuf`]: a `pread` into a misaligned buffer can run at half speed).
#[derive(Debug, Clone, PartialEq)]
pub enum RawTokens {
    /// uint16 shards.
    U16(IdBuf<u16>),
    /// int32 shards.
    I32(IdBuf<i32>),
}

impl Default for RawTokens {
    fn default() -> Self {
        RawTokens::U16(IdBuf::new())
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

    /// Id `i` widened to `i32`. Panics if `i` is out of range, like slice indexing.
    pub fn get(&self, i: usize) -> i32 {
        match self {
            RawTokens::U16(v) => v[i] as i32,
            RawTokens::I32(v) => v[i],
        }
    }

    /// Append every id widened to `i32` (what `Batch::tokens` holds in the full layout).
    pub fn widen_into(&self, out: &mut Vec<i32>) {
        match self {
            RawTokens::U16(v) => out.extend(v.iter().map(|&x| x as i32)),
            RawTokens::I32(v) => out.extend_from_slice(v),
        }
    }

    /// Empty the storage, make it hold `dtype` and make room for `n` ids. Keeps the allocation when
    /// the dtype is unchanged (always, after the first batch of a loader: its sources share a dtype).
    fn prepare(&mut self, dtype: TokenDtype, n: usize) {
        match (&mut *self, dtype) {
            (RawTokens::U16(v), TokenDtype::Uint16) => v.clear(),
            (RawTokens::I32(v), TokenDtype::Int32) => v.clear(),
            (_, TokenDtype::Uint16) => *self = RawTokens::U16(IdBuf::new()),
            (_, TokenDtype::Int32) => *self = RawTokens::I32(IdBuf::new()),
        }
        match self {
            RawTokens::U16(v) => v.reserve_exact(n),
            RawTokens::I32(v) => v.reserve_exact(n),
        }
    }

    pub(crate) fn clear(&mut self) {
        match self {
            RawTokens::U16(v) => v.clear(),
            RawTokens::I32(v) => v.clear(),
        }
    }

    /// Append `t[from..to]`: a plain copy of the stored bytes.
    fn extend(&mut self, t: &Tokens<'_>, from: usize, to: usize) -> Result<()> {
        match (self, t) {
            (RawTokens::U16(v), Tokens::U16(t)) => v.extend_from_slice(&t[from..to]),
            (RawTokens::I32(v), Tokens::I32(t)) => v.extend_from_slice(&t[from..to]),
            // `prepare` set the dtype of the sources, which agree (checked when opening).
            _ => {
                return Err(LoaderError::Config(
                    "sources with different token dtypes in one batch".into(),
                ))
            }
        }
        Ok(())
    }

    /// Append tokens `from..to` of the sample whose bytes start at `sample_start` in `shard`,
    /// read with `pread` (nothing is mapped, so nothing needs releasing).
    fn read_from(
        &mut self,
        shard: &Shard,
        sample_start: usize,
        from: usize,
        to: usize,
    ) -> Result<()> {
        let size = shard.dtype().size();
        self.read_bytes(shard, sample_start + size * from, sample_start + size * to)
    }

    /// Append the ids stored at bytes `start..end` of `shard`'s `.bin`, read with `pread`, in the
    /// shard's dtype.
    pub(crate) fn read_bytes(&mut self, shard: &Shard, start: usize, end: usize) -> Result<()> {
        if self.is_empty() {
            self.prepare(shard.dtype(), 0);
        }
        let n = (end.saturating_sub(start)) / shard.dtype().size();
        match self {
            RawTokens::U16(v) => {
                shard.read_tokens(start, v.tail_mut(n))?;
                v.commit(n);
            }
            RawTokens::I32(v) => {
                shard.read_tokens(start, v.tail_mut(n))?;
                v.commit(n);
            }
        }
        Ok(())
    }

    /// Remove and return the last id, widened.
    fn pop(&mut self) -> Option<i32> {
        match self {
            RawTokens::U16(v) => v.pop().map(i32::from),
            RawTokens::I32(v) => v.pop(),
        }
    }

    /// The ids held, as a `Tokens` view.
    fn as_tokens(&self) -> Tokens<'_> {
        match self {
            RawTokens::U16(v) => Tokens::U16(v),
            RawTokens::I32(v) => Tokens::I32(v),
        }
    }

    /// Append `n` copies of the CP padding id.
    fn push_pad(&mut self, pad: i32, n: usize) -> Result<()> {
        match self {
            RawTokens::U16(v) => {
                let pad = u16::try_from(pad).map_err(|_| {
                    LoaderError::Config(format!(
                        "pad id {pad} does not fit the uint16 shards (compact layout with CP)"
                    ))
                })?;
                v.resize(v.len() + n, pad);
            }
            RawTokens::I32(v) => v.resize(v.len() + n, pad),
        }
        Ok(())
    }
}

/// How a batch hands over its tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BatchLayout {
    /// `tokens`, `labels` and `position_ids` as `i32` arrays, ready to use.
    #[default]
    Full,
    /// `raw_tokens` (the ids of `tokens` as stored, e.g. 2 bytes each), `next_ids` (one look-ahead
    /// id per chunk) and `row_meta`; `tokens`, `labels` and `position_ids` stay empty and
    /// [`Batch::materialize`] derives them. For a trainer that uploads the ids and derives labels
    /// and positions on the device.
    Compact,
}

/// Per-row facts that labels and positions follow from (filled in both layouts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RowMeta {
    /// Tokens of the row as stored (the pack's tail padding included, CP padding not).
    pub len: u32,
    /// Of those, trailing pad tokens of the pack's `--tail pad` (only the set's last sample): no
    /// labels there, and the last real token has none either.
    pub tail_pad: u32,
    /// CP padding appended to the row (to a multiple of 2·cp_size): pad ids, no labels, positions
    /// continuing.
    pub cp_pad: u32,
    /// The id used for CP padding.
    pub pad_id: i32,
    /// Positions restart at 0 at each document (else 0..len along the row).
    pub doc_positions: bool,
    /// The last token of each document has no label.
    pub mask_doc_boundaries: bool,
}

/// One step's data for one (DP, CP) rank. Rows are concatenated (see docs/LOADER.md).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    /// Global step index since the start of the stream (identical on every rank).
    pub step: u64,
    /// Token ids held by this rank (full layout; empty in the compact layout).
    pub tokens: Vec<i32>,
    /// Next-token targets, shifted on the full row before CP slicing; [`IGNORE_INDEX`] = no loss
    /// (full layout; empty in the compact layout).
    pub labels: Vec<i32>,
    /// RoPE position ids of the tokens held (full layout; empty in the compact layout).
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
    /// Which arrays are filled: `Full` fills `tokens`/`labels`/`position_ids`, `Compact`
    /// `raw_tokens`/`next_ids`.
    pub layout: BatchLayout,
    /// Compact layout: `tokens` in the shards' dtype (same length, same `row_offsets`, CP padding
    /// included as `pad_id`).
    pub raw_tokens: RawTokens,
    /// Compact layout: for each entry of `chunks`, the id that follows the chunk in its full row
    /// (the target of the chunk's last position before masking), or [`IGNORE_INDEX`] when the
    /// chunk ends at the row's real end or in padding. Needed because labels are shifted on the
    /// full row: with CP a chunk's last label is the first id of a chunk another rank holds.
    pub next_ids: Vec<i32>,
    /// Per-row facts (both layouts).
    pub row_meta: Vec<RowMeta>,
}

impl Batch {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.samples.len()
    }

    /// The full-layout arrays of this batch: copied for a `Full` batch, derived for a `Compact`
    /// one from `raw_tokens`, `next_ids`, `row_meta`, `chunks`, `full_row_offsets` and
    /// `doc_offsets` — identical to what a `Full` loader produces for the same step. The outputs
    /// are cleared first; their allocations are reused. These rules define the compact layout
    /// (a device-side implementation does the same, vectorised):
    ///
    /// * `tokens[i] = raw_tokens[i]`;
    /// * for local index `i` at full-row position `j` of chunk `c = [lo, hi)` of a row: the
    ///   candidate label is `tokens[i + 1]` if `j + 1 < hi`, else `next_ids[c]`; it becomes
    ///   [`IGNORE_INDEX`] if `j + 1 >= len − tail_pad` (row end, tail padding, CP padding) or if
    ///   `mask_doc_boundaries` and `j + 1` starts a document of the row;
    /// * `position_ids[i] = j`, or with `doc_positions` `j − (start of the document holding j)`,
    ///   where CP padding (`j >= len`) continues the row's last document.
    ///
    /// Panics if the batch's arrays are inconsistent (they are not, as the loader makes them).
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
        let n = self.raw_tokens.len();
        tokens.reserve(n);
        labels.reserve(n);
        position_ids.reserve(n);
        self.raw_tokens.widen_into(tokens);
        let per_row = self.chunks.len() / self.rows().max(1);
        let mut d = 1; // next unread entry of doc_offsets
        let mut starts: Vec<u64> = Vec::new();
        let mut i = 0usize; // local index
        for (r, m) in self.row_meta.iter().enumerate() {
            let base = self.full_row_offsets[r] as u64;
            let len = m.len as u64;
            // The row's document starts relative to the row, closed by the row end `len`.
            starts.clear();
            starts.push(0);
            while d < self.doc_offsets.len() && self.doc_offsets[d] as u64 <= base + len {
                starts.push(self.doc_offsets[d] as u64 - base);
                d += 1;
            }
            if m.cp_pad > 0 {
                d += 1; // the CP padding "document"
            }
            let label_end = len.saturating_sub(m.tail_pad as u64);
            let last_doc = starts.len().saturating_sub(2); // the document CP padding continues
            for c in r * per_row..(r + 1) * per_row {
                let [lo, hi] = self.chunks[c];
                let (lo, hi) = (lo as u64 - base, hi as u64 - base);
                // Document holding `lo`: the last start ≤ lo, among the real documents.
                let mut doc = starts.partition_point(|&s| s <= lo).saturating_sub(1);
                doc = doc.min(last_doc);
                for j in lo..hi {
                    while doc < last_doc && starts[doc + 1] <= j {
                        doc += 1;
                    }
                    let next = if j + 1 < hi {
                        tokens[i + 1]
                    } else {
                        self.next_ids[c]
                    };
                    // `j + 1` starts a document of the row (not the row end).
                    let boundary = doc < last_doc && starts[doc + 1] == j + 1;
                    let ignore = j + 1 >= label_end || (m.mask_doc_boundaries && boundary);
                    labels.push(if ignore { IGNORE_INDEX } else { next });
                    let pos = if m.doc_positions { j - starts[doc] } else { j };
                    position_ids.push(pos as i32);
                    i += 1;
                }
            }
        }
    }
}

/// How rows are cut and labelled.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Layout {
    pub cp_rank: usize,
    pub cp_size: usize,
    pub positions: crate::Positions,
    pub mask_doc_boundaries: Option<bool>,
    pub read: ReadMethod,
    pub release_pages: bool,
    /// Samples come in file order (no shuffle): release pages behind a cursor, in 2 MiB blocks.
    pub in_file_order: bool,
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
        self.raw_tokens.clear();
        self.next_ids.clear();
        self.row_meta.clear();
        (self.num_tokens, self.num_label_tokens) = (0, 0);
    }
}

/// Drop a copied-out row (bytes `start..end` of shard `k`) from this process's mapping; the page
/// cache keeps it. In file order, whole 2 MiB blocks behind a cursor; shuffled, the row's blocks,
/// batched (docs/LOADER.md, "Memory").
pub(crate) fn release_row(
    set: &rsd_shard::ShardSet,
    k: usize,
    start: usize,
    end: usize,
    in_file_order: bool,
) {
    if in_file_order {
        if let Some(shard) = set.shards().get(k) {
            shard.release_behind(start, end);
        }
    } else {
        set.release_blocks_batched(k, start, end);
    }
}

/// Build the batch for `plan` from the shards, reusing `spare`'s allocations if given (fresh
/// multi-MiB vectors cost a page fault per 4 KiB; reused ones are already mapped, often cached).
/// `scratch` holds a row's ids between reading and widening (full layout with `ReadMethod::Pread`);
/// the caller keeps it, so its allocation is reused too.
pub(crate) fn assemble(
    sources: &[OpenSource],
    plan: &StepPlan,
    layout: &Layout,
    spare: Option<Batch>,
    scratch: &mut RawTokens,
) -> Result<Batch> {
    let mut b = spare.unwrap_or_default();
    b.clear();
    b.step = plan.step;
    b.layout = layout.batch_layout;
    let compact = layout.batch_layout == BatchLayout::Compact;
    b.row_offsets.push(0);
    b.full_row_offsets.push(0);
    b.doc_offsets.push(0);
    let two_p = 2 * layout.cp_size as u64;
    let chunks_per_row = if layout.cp_size > 1 { 2 } else { 1 };
    let pread = layout.read == ReadMethod::Pread;
    // The sources share one dtype (checked when opening).
    let dtype = sources
        .first()
        .map_or(TokenDtype::Uint16, |s| s.set.manifest().dtype);
    // Size the arrays once: growing them by doubling would copy every token again.
    let mut local = 0usize;
    for r in &plan.rows {
        let set = &sources[r.source].set;
        let (k, i) = set.locate(r.global)?;
        let (_, _, start, end) = set.shards()[k].sample_span(i)?;
        let len = ((end - start) / set.manifest().dtype.size()) as u64;
        local += (len.div_ceil(two_p) * two_p / layout.cp_size as u64) as usize;
    }
    if compact {
        // A recycled batch keeps its storage. With `pread` each chunk is read together with the
        // id after it (then popped): room for one more id per chunk.
        let lookahead = plan.rows.len() * chunks_per_row;
        b.raw_tokens.prepare(dtype, local + lookahead);
        b.next_ids.reserve(lookahead);
    } else {
        b.tokens.reserve_exact(local);
        b.labels.reserve_exact(local);
        b.position_ids.reserve_exact(local);
    }
    let mut full_base = 0u64;
    for r in &plan.rows {
        let src = &sources[r.source];
        let (k, i) = src.set.locate(r.global)?;
        let shard = &src.set.shards()[k];
        let (_, _, byte_start, byte_end) = shard.sample_span(i)?;
        // The ids and piece lengths; with `pread` only the lengths and the count are used, so the
        // mapped `.bin` is never touched.
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

        // Zigzag: CP rank c keeps chunks c and 2P−1−c of the padded row; without CP the whole row.
        let chunks = if layout.cp_size > 1 {
            let c = padded / two_p;
            let (a, z) = (layout.cp_rank as u64, two_p - 1 - layout.cp_rank as u64);
            [(a * c, (a + 1) * c), (z * c, (z + 1) * c)]
        } else {
            [(0, len), (0, 0)]
        };
        b.row_meta.push(RowMeta {
            len: len as u32,
            tail_pad: tail_pad as u32,
            cp_pad: (padded - len) as u32,
            pad_id: src.pad_id,
            doc_positions: doc_mode,
            mask_doc_boundaries: mask_docs,
        });
        for &(lo, hi) in &chunks[..chunks_per_row] {
            let real_hi = (hi.min(len)) as usize;
            let real_lo = (lo as usize).min(real_hi);
            if compact {
                // The ids as stored, then CP padding; labels and positions are derived later.
                // The chunk's last target lies in the next chunk of the full row (CP), unless the
                // chunk ends at the real end of the row (row end, tail or CP padding).
                let has_next = hi < real_len;
                let next = if pread {
                    let to = real_hi + usize::from(has_next);
                    b.raw_tokens.read_from(shard, byte_start, real_lo, to)?;
                    if has_next {
                        b.raw_tokens.pop()
                    } else {
                        None
                    }
                } else {
                    b.raw_tokens.extend(&sample.tokens, real_lo, real_hi)?;
                    has_next.then(|| sample.tokens.get(hi as usize) as i32)
                };
                b.raw_tokens
                    .push_pad(src.pad_id, (hi - lo) as usize - (real_hi - real_lo))?;
                b.next_ids.push(next.unwrap_or(IGNORE_INDEX));
            } else {
                // The chunk's ids and the one after it (its last label), from the map or read
                // into `scratch`; `first` is the row index of the view's first id.
                let (view, first) = if pread {
                    scratch.prepare(dtype, real_hi + 1 - real_lo);
                    let to = (real_hi + 1).min(len as usize);
                    scratch.read_from(shard, byte_start, real_lo, to)?;
                    (scratch.as_tokens(), real_lo)
                } else {
                    (sample.tokens, 0)
                };
                push_range(
                    &mut b, &view, first, &starts, lo, hi, len, real_len, src.pad_id, doc_mode,
                    mask_docs,
                );
            }
            b.chunks
                .push([(full_base + lo) as u32, (full_base + hi) as u32]);
        }
        b.row_offsets.push(if compact {
            b.raw_tokens.len() as u32
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
        if layout.release_pages && !pread {
            // The row is copied out: drop the pages from our mapping so RSS does not grow with the
            // amount read. The page cache keeps them; this only unmaps them from the process.
            release_row(&src.set, k, byte_start, byte_end, layout.in_file_order);
        }
    }
    Ok(b)
}

/// Append full-row positions `lo..hi` of one row (positions ≥ `len` are CP padding; tokens at
/// `label_end..len` are the pack's tail padding: stored, but without targets). `tokens` holds the
/// row's ids from row index `first` on, at least up to `min(hi + 1, len)`.
#[allow(clippy::too_many_arguments)]
fn push_range(
    b: &mut Batch,
    tokens: &Tokens<'_>,
    first: usize,
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
    // Tokens: a widening copy (vectorises).
    let (lo_t, hi_t) = (real_lo - first, real_hi - first);
    match tokens {
        Tokens::U16(t) => b.tokens.extend(t[lo_t..hi_t].iter().map(|&x| x as i32)),
        Tokens::I32(t) => b.tokens.extend_from_slice(&t[lo_t..hi_t]),
    }
    // Labels: the same copy shifted by one; the row's last position has no target.
    let with_target = real_hi
        .min((label_end as usize).saturating_sub(1))
        .saturating_sub(real_lo);
    let label_base = b.labels.len();
    if with_target > 0 {
        let from = real_lo + 1 - first;
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
