//! Assembling a batch: copy tokens out of the map, shift labels, number positions, record document
//! boundaries, and cut each row into this CP rank's zigzag chunks.
//!
//! The compact layout copies only the ids (and CP padding) in the shards' dtype and records what
//! labels and positions follow from; `Batch::materialize` is the definition of that derivation.

use rsd_shard::{Sample, Shard, TokenDtype, Tokens};
use serde::{Deserialize, Serialize};

use crate::datasets::OpenDataset;
use crate::error::{LoaderError, Result};
use crate::ids::IdBuf;
use crate::plan::StepPlan;
use crate::{LoaderConfig, Positions, Rank, ReadMethod};

/// The label value that losses ignore (PyTorch's default `ignore_index`).
pub const IGNORE_INDEX: i32 = -100;

/// Where a row came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleId {
    /// Index of the dataset in the config (serialized as `source`).
    #[serde(rename = "source")]
    pub dataset: u32,
    /// Shard within the dataset's directory.
    pub shard: u32,
    /// Sample index within the shard.
    pub index: u64,
    /// Sample index within the dataset (over all its shards).
    pub global: u64,
    /// The dataset's epoch this draw belongs to.
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
    /// the dtype is unchanged (always, after the first batch of a loader: its datasets share one).
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
            // `prepare` set the dtype of the datasets, which agree (checked when opening).
            _ => {
                return Err(LoaderError::Config(
                    "datasets with different token dtypes in one batch".into(),
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
    /// Compact layout with a loss-masked dataset in the mix (chat data): one entry per local
    /// token, 0 where the shards' loss mask says the token's target is not trained on (its
    /// label becomes [`IGNORE_INDEX`] in [`Batch::materialize`]); empty otherwise. The full
    /// layout applies the mask to `labels` directly.
    pub target_mask: Vec<u8>,
}

impl Batch {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.samples.len()
    }

    /// The full-layout arrays of this batch: copied for a `Full` batch, derived for a `Compact`
    /// one from `raw_tokens`, `next_ids`, `row_meta`, `chunks`, `full_row_offsets` and
    /// `doc_offsets` — identical to what a `Full` loader produces for the same step. The outputs
    /// are cleared first; their allocations are reused. What a row's labels and positions are is
    /// defined once, in [`RowRules`](crate::RowRules); for the compact layout's chunks that
    /// reads (a device-side implementation does the same, vectorised):
    ///
    /// * `tokens[i] = raw_tokens[i]`;
    /// * for local index `i` at full-row position `j` of chunk `c = [lo, hi)` of a row: the
    ///   candidate label is `tokens[i + 1]` if `j + 1 < hi`, else `next_ids[c]`; it becomes
    ///   [`IGNORE_INDEX`] if `j + 1 >= len − tail_pad` (row end, tail padding, CP padding) or if
    ///   `mask_doc_boundaries` and `j + 1` starts a document of the row;
    /// * `position_ids[i] = j`, or with `doc_positions` `j − (start of the document holding j)`,
    ///   where CP padding (`j >= len`) continues the row's last document;
    /// * with a `target_mask`, the label is also [`IGNORE_INDEX`] where `target_mask[i] == 0`
    ///   (the shards' loss mask of token `j + 1` is 0).
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
                    let ignore = j + 1 >= label_end
                        || (m.mask_doc_boundaries && boundary)
                        || self.target_mask.get(i) == Some(&0);
                    labels.push(if ignore { IGNORE_INDEX } else { next });
                    let pos = if m.doc_positions { j - starts[doc] } else { j };
                    position_ids.push(pos as i32);
                    i += 1;
                }
            }
        }
    }
}

/// A token id outside the vocabulary, located in its row ([`Batch::find_id_outside`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdOutside {
    /// Row of the batch (index into `samples`).
    pub row: usize,
    /// Token index within the row's sample (full-row position).
    pub token: u64,
    /// The id.
    pub id: i64,
}

/// The largest id of `ids` read as `u32`, so that a negative `i32` id counts as larger than any
/// vocabulary: one comparison per id, which the compiler vectorises.
fn max_unsigned_i32(ids: &[i32]) -> u32 {
    ids.iter().fold(0u32, |m, &x| m.max(x as u32))
}

fn max_u16(ids: &[u16]) -> u32 {
    ids.iter().fold(0u16, |m, &x| m.max(x)) as u32
}

impl Batch {
    /// The first token id of this batch outside `0..vocab_size`, if any (the ids of `tokens`, or
    /// `raw_tokens` in the compact layout, and the compact layout's look-ahead `next_ids`).
    ///
    /// The common case, every id in range, costs one vectorised maximum over the ids (a pass at
    /// memory bandwidth, docs/BENCHMARKS.md, "rsd-loader"); only a batch that fails it is
    /// searched for the offending position.
    pub fn find_id_outside(&self, vocab_size: u64) -> Option<IdOutside> {
        let max = match (self.layout, &self.raw_tokens) {
            (BatchLayout::Full, _) => max_unsigned_i32(&self.tokens),
            (BatchLayout::Compact, RawTokens::U16(v)) => max_u16(v),
            (BatchLayout::Compact, RawTokens::I32(v)) => max_unsigned_i32(v),
        };
        let bad = |id: i64| id < 0 || id as u64 >= vocab_size;
        if (max as u64) < vocab_size {
            // The look-ahead ids are labels of chunk ends held elsewhere; IGNORE_INDEX is no id.
            let next = self
                .next_ids
                .iter()
                .enumerate()
                .find(|&(_, &x)| x != IGNORE_INDEX && bad(x as i64))?;
            let (c, &id) = next;
            let per_row = (self.chunks.len() / self.rows().max(1)).max(1);
            let row = c / per_row;
            let base = self.full_row_offsets.get(row).copied().unwrap_or(0);
            return Some(IdOutside {
                row,
                token: self.chunks.get(c).map_or(0, |ch| (ch[1] - base) as u64),
                id: id as i64,
            });
        }
        let n = match self.layout {
            BatchLayout::Full => self.tokens.len(),
            BatchLayout::Compact => self.raw_tokens.len(),
        };
        let id_at = |i: usize| match self.layout {
            BatchLayout::Full => self.tokens[i] as i64,
            BatchLayout::Compact => self.raw_tokens.get(i) as i64,
        };
        let i = (0..n).find(|&i| bad(id_at(i)))?;
        let row = self
            .row_offsets
            .partition_point(|&o| o as usize <= i)
            .saturating_sub(1);
        // Local offset in the row → full-row position, through the chunks the row holds here.
        let mut off = (i - self.row_offsets.get(row).copied().unwrap_or(0) as usize) as u64;
        let per_row = (self.chunks.len() / self.rows().max(1)).max(1);
        let base = self.full_row_offsets.get(row).copied().unwrap_or(0) as u64;
        let mut token = off;
        for ch in self.chunks.iter().skip(row * per_row).take(per_row) {
            let len = (ch[1] - ch[0]) as u64;
            if off < len {
                token = ch[0] as u64 - base + off;
                break;
            }
            off -= len;
        }
        Some(IdOutside {
            row,
            token,
            id: id_at(i),
        })
    }
}

/// What batch assembly needs from the [`LoaderConfig`]: how rows are cut and labelled, and how
/// their ids are read.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AssemblyConfig {
    pub cp: Rank,
    pub positions: Positions,
    pub mask_doc_boundaries: Option<bool>,
    pub read: ReadMethod,
    pub release_pages: bool,
    /// Samples come in file order (no shuffle): release pages behind a cursor, in 2 MiB blocks.
    pub in_file_order: bool,
    pub batch_layout: BatchLayout,
}

impl AssemblyConfig {
    pub fn new(cfg: &LoaderConfig) -> AssemblyConfig {
        AssemblyConfig {
            cp: cfg.parallel.cp,
            positions: cfg.positions,
            mask_doc_boundaries: cfg.mask_doc_boundaries,
            read: cfg.read,
            release_pages: cfg.release_pages,
            in_file_order: !cfg.shuffle,
            batch_layout: cfg.layout,
        }
    }

    /// Chunks of each row this rank holds: the zigzag pair with CP, else the whole row.
    fn chunks_per_row(&self) -> usize {
        if self.cp.is_parallel() {
            2
        } else {
            1
        }
    }
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
        self.target_mask.clear();
        (self.num_tokens, self.num_label_tokens) = (0, 0);
    }
}

/// A planned row, found in its dataset: the stored sample (looked up once per row).
struct LocatedRow<'a> {
    dataset: &'a OpenDataset,
    /// Shard within the dataset's directory, and the sample's index in it.
    shard: usize,
    index: usize,
    /// Ids (borrowed from the map: touched only with `ReadMethod::Map`), pieces and byte range.
    sample: Sample<'a>,
}

impl LocatedRow<'_> {
    fn shard(&self) -> &Shard {
        &self.dataset.set.shards()[self.shard]
    }
}

/// How one row is cut and labelled: what follows from its length, its dataset and the config.
struct RowShape {
    /// Tokens stored (the pack's tail padding included).
    len: u64,
    /// `len` rounded up to a multiple of 2·cp_size with CP (the rest is CP padding), else `len`.
    padded: u64,
    /// Trailing pad tokens of the pack's `--tail pad`, and the tokens before them.
    tail_pad: u64,
    real_len: u64,
    doc_positions: bool,
    mask_docs: bool,
    /// Document starts within the row, closed by the row end `len`.
    starts: Vec<u64>,
    /// The full-row ranges `[lo, hi)` this CP rank holds (the first `chunks_per_row`).
    chunks: [(u64, u64); 2],
}

impl RowShape {
    fn new(row: &LocatedRow<'_>, global: u64, cfg: &AssemblyConfig) -> RowShape {
        let ds = row.dataset;
        let len = row.sample.tokens.len() as u64;
        let two_p = 2 * cfg.cp.size as u64;
        let padded = if cfg.cp.is_parallel() {
            len.div_ceil(two_p) * two_p
        } else {
            len
        };
        let doc_positions = match cfg.positions {
            Positions::Row => false,
            Positions::Document => true,
            Positions::Auto => ds.mixed,
        };
        // The pack's tail padding sits at the end of the set's last sample: no targets there, and
        // the last real token does not predict a pad either.
        let tail_pad = if ds.tail_padding > 0 && global + 1 == ds.samples {
            ds.tail_padding.min(len)
        } else {
            0
        };
        let mut starts = Vec::with_capacity(row.sample.pieces.len() + 2);
        let mut at = 0u64;
        for &p in &row.sample.pieces {
            starts.push(at);
            at += p as u64;
        }
        starts.push(len);
        // Zigzag: CP rank c keeps chunks c and 2P−1−c of the padded row; without CP the whole row.
        let chunks = if cfg.cp.is_parallel() {
            let c = padded / two_p;
            let (a, z) = (cfg.cp.rank as u64, two_p - 1 - cfg.cp.rank as u64);
            [(a * c, (a + 1) * c), (z * c, (z + 1) * c)]
        } else {
            [(0, len), (0, 0)]
        };
        RowShape {
            len,
            padded,
            tail_pad,
            real_len: len - tail_pad,
            doc_positions,
            mask_docs: cfg.mask_doc_boundaries.unwrap_or(ds.mixed),
            starts,
            chunks,
        }
    }
}

/// Build the batch for `plan` from the shards, reusing `spare`'s allocations if given (fresh
/// multi-MiB vectors cost a page fault per 4 KiB; reused ones are already mapped, often cached).
/// `scratch` holds a row's ids between reading and widening (full layout with `ReadMethod::Pread`);
/// the caller keeps it, so its allocation is reused too.
///
/// The steps: find every row's sample, size the arrays for all of them, then per row record its
/// documents and counts, copy this rank's chunks in the batch's layout, and (reading through the
/// map) release the row's pages.
pub(crate) fn assemble(
    datasets: &[OpenDataset],
    plan: &StepPlan,
    cfg: &AssemblyConfig,
    spare: Option<Batch>,
    scratch: &mut RawTokens,
) -> Result<Batch> {
    let rows = find_rows(datasets, plan)?;
    let mut b = spare.unwrap_or_default();
    b.clear();
    b.step = plan.step;
    b.layout = cfg.batch_layout;
    b.row_offsets.push(0);
    b.full_row_offsets.push(0);
    b.doc_offsets.push(0);
    // The datasets share one dtype (checked when opening).
    let dtype = datasets
        .first()
        .map_or(TokenDtype::Uint16, |d| d.set.manifest().dtype);
    reserve(&mut b, &rows, cfg, dtype);
    let mut full_base = 0u64;
    let any_mask = rows.iter().any(|row| row.shard().has_mask());
    for (r, row) in plan.rows.iter().zip(&rows) {
        let shape = RowShape::new(row, r.global, cfg);
        let mask = row
            .shard()
            .mask_of(row.sample.bytes.start, row.sample.bytes.end);
        push_row_meta(&mut b, row, &shape, full_base, mask);
        for &(lo, hi) in &shape.chunks[..cfg.chunks_per_row()] {
            let local_start = match cfg.batch_layout {
                BatchLayout::Compact => b.raw_tokens.len(),
                BatchLayout::Full => b.labels.len(),
            };
            match cfg.batch_layout {
                BatchLayout::Compact => push_compact_chunk(&mut b, row, &shape, lo, hi, cfg.read)?,
                BatchLayout::Full => {
                    push_full_chunk(&mut b, row, &shape, lo, hi, cfg.read, dtype, scratch)?
                }
            }
            apply_mask(
                &mut b,
                cfg.batch_layout,
                any_mask,
                mask,
                &shape,
                lo,
                hi,
                local_start,
            );
            b.chunks
                .push([(full_base + lo) as u32, (full_base + hi) as u32]);
        }
        b.row_offsets.push(match cfg.batch_layout {
            BatchLayout::Compact => b.raw_tokens.len() as u32,
            BatchLayout::Full => b.tokens.len() as u32,
        });
        full_base += shape.padded;
        b.full_row_offsets.push(full_base as u32);
        b.samples.push(SampleId {
            dataset: r.dataset as u32,
            shard: row.shard as u32,
            index: row.index as u64,
            global: r.global,
            epoch: r.epoch,
        });
        if cfg.release_pages && cfg.read == ReadMethod::Map {
            // The row is copied out: drop the pages from our mapping so RSS does not grow with the
            // amount read. The page cache keeps them; this only unmaps them from the process.
            let bytes = &row.sample.bytes;
            let ds = row.dataset;
            ds.pages.release_row(
                &ds.set,
                row.shard,
                bytes.start,
                bytes.end,
                cfg.in_file_order,
            );
        }
    }
    Ok(b)
}

/// Whether the target of full-row position `j` is trained on by the row's loss mask: the token
/// `j + 1` is marked 1 (positions past the row have no target either way).
fn target_trained(mask: &[u8], j: u64) -> bool {
    mask.get(j as usize + 1) == Some(&1)
}

/// Labels a loss-masked row keeps: the targets its mask marks, less those the document
/// boundaries mask (the row's end has no target either way).
fn trained_label_count(shape: &RowShape, mask: &[u8]) -> u64 {
    let end = (shape.real_len as usize).min(mask.len());
    let marked = mask[1.min(end)..end].iter().map(|&m| m as u64).sum::<u64>();
    let at_boundaries = if shape.mask_docs {
        shape.starts[1..shape.starts.len() - 1]
            .iter()
            .filter(|&&st| (st as usize) < end && mask[st as usize] == 1)
            .count() as u64
    } else {
        0
    };
    marked - at_boundaries
}

/// Chunk `lo..hi` of a row, just pushed from local index `local_start` on, under the row's loss
/// mask: in the full layout its labels are cleared where the mask says so; in the compact layout
/// (when any row of the batch has a mask) the mask of each target is recorded in `target_mask`
/// (all 1 for a row without one).
#[allow(clippy::too_many_arguments)]
fn apply_mask(
    b: &mut Batch,
    layout: BatchLayout,
    any_mask: bool,
    mask: Option<&[u8]>,
    shape: &RowShape,
    lo: u64,
    hi: u64,
    local_start: usize,
) {
    match (layout, mask) {
        (BatchLayout::Full, Some(mask)) => {
            for j in lo..hi.min(shape.len) {
                if !target_trained(mask, j) {
                    b.labels[local_start + (j - lo) as usize] = IGNORE_INDEX;
                }
            }
        }
        (BatchLayout::Full, None) => {}
        (BatchLayout::Compact, _) if !any_mask => {}
        (BatchLayout::Compact, Some(mask)) => b
            .target_mask
            .extend((lo..hi).map(|j| u8::from(target_trained(mask, j)))),
        (BatchLayout::Compact, None) => b
            .target_mask
            .resize(b.target_mask.len() + (hi - lo) as usize, 1),
    }
}

/// Every planned row's sample, from `.idx` metadata (its ids are not read here).
fn find_rows<'a>(datasets: &'a [OpenDataset], plan: &StepPlan) -> Result<Vec<LocatedRow<'a>>> {
    plan.rows
        .iter()
        .map(|r| {
            let dataset = &datasets[r.dataset];
            let (shard, index) = dataset.set.locate(r.global)?;
            let sample = dataset.set.shards()[shard].sample(index)?;
            Ok(LocatedRow {
                dataset,
                shard,
                index,
                sample,
            })
        })
        .collect()
}

/// Size the arrays once for all rows: growing them by doubling would copy every token again.
fn reserve(b: &mut Batch, rows: &[LocatedRow<'_>], cfg: &AssemblyConfig, dtype: TokenDtype) {
    let two_p = 2 * cfg.cp.size as u64;
    let local: usize = rows
        .iter()
        .map(|row| {
            let len = row.sample.tokens.len() as u64;
            (len.div_ceil(two_p) * two_p / cfg.cp.size as u64) as usize
        })
        .sum();
    match cfg.batch_layout {
        BatchLayout::Compact => {
            // A recycled batch keeps its storage. With `pread` each chunk is read together with
            // the id after it (then popped): room for one more id per chunk.
            let lookahead = rows.len() * cfg.chunks_per_row();
            b.raw_tokens.prepare(dtype, local + lookahead);
            b.next_ids.reserve(lookahead);
        }
        BatchLayout::Full => {
            b.tokens.reserve_exact(local);
            b.labels.reserve_exact(local);
            b.position_ids.reserve_exact(local);
        }
    }
}

/// The row's document boundaries (in full-row coordinates from `full_base`), its token and label
/// counts, and its [`RowMeta`]: the same in both layouts.
fn push_row_meta(
    b: &mut Batch,
    row: &LocatedRow<'_>,
    shape: &RowShape,
    full_base: u64,
    mask: Option<&[u8]>,
) {
    // Document starts within the row (plus the row end), and the padding "document".
    for s in &shape.starts[1..] {
        b.doc_offsets.push((full_base + s) as u32);
    }
    if shape.padded > shape.len {
        b.doc_offsets.push((full_base + shape.padded) as u32);
    }
    // Labels over the full row count toward the normaliser, whichever chunk holds them.
    let masked_ends = if shape.mask_docs {
        row.sample.pieces.len() as u64
    } else {
        1
    };
    b.num_label_tokens += match mask {
        Some(mask) => trained_label_count(shape, mask),
        None => shape.real_len.saturating_sub(masked_ends),
    };
    b.num_tokens += shape.real_len;
    b.row_meta.push(RowMeta {
        len: shape.len as u32,
        tail_pad: shape.tail_pad as u32,
        cp_pad: (shape.padded - shape.len) as u32,
        pad_id: row.dataset.pad_id,
        doc_positions: shape.doc_positions,
        mask_doc_boundaries: shape.mask_docs,
    });
}

/// Compact layout: chunk `lo..hi` of the row as stored, then CP padding, and the id after the
/// chunk; labels and positions are derived later ([`Batch::materialize`]).
fn push_compact_chunk(
    b: &mut Batch,
    row: &LocatedRow<'_>,
    shape: &RowShape,
    lo: u64,
    hi: u64,
    read: ReadMethod,
) -> Result<()> {
    let real_hi = (hi.min(shape.len)) as usize;
    let real_lo = (lo as usize).min(real_hi);
    // The chunk's last target lies in the next chunk of the full row (CP), unless the chunk ends
    // at the real end of the row (row end, tail or CP padding).
    let has_next = hi < shape.real_len;
    let next = match read {
        ReadMethod::Pread => {
            let to = real_hi + usize::from(has_next);
            b.raw_tokens
                .read_from(row.shard(), row.sample.bytes.start, real_lo, to)?;
            if has_next {
                b.raw_tokens.pop()
            } else {
                None
            }
        }
        ReadMethod::Map => {
            b.raw_tokens.extend(&row.sample.tokens, real_lo, real_hi)?;
            has_next.then(|| row.sample.tokens.get(hi as usize) as i32)
        }
    };
    b.raw_tokens
        .push_pad(row.dataset.pad_id, (hi - lo) as usize - (real_hi - real_lo))?;
    b.next_ids.push(next.unwrap_or(IGNORE_INDEX));
    Ok(())
}

/// Full layout: chunk `lo..hi` of the row as `i32` tokens, labels and positions. The chunk's ids
/// and the one after it (its last label) come from the map or are read into `scratch`.
#[allow(clippy::too_many_arguments)]
fn push_full_chunk(
    b: &mut Batch,
    row: &LocatedRow<'_>,
    shape: &RowShape,
    lo: u64,
    hi: u64,
    read: ReadMethod,
    dtype: TokenDtype,
    scratch: &mut RawTokens,
) -> Result<()> {
    let real_hi = (hi.min(shape.len)) as usize;
    let real_lo = (lo as usize).min(real_hi);
    // `first` is the row index of the view's first id.
    let (view, first) = match read {
        ReadMethod::Pread => {
            scratch.prepare(dtype, real_hi + 1 - real_lo);
            let to = (real_hi + 1).min(shape.len as usize);
            scratch.read_from(row.shard(), row.sample.bytes.start, real_lo, to)?;
            (scratch.as_tokens(), real_lo)
        }
        ReadMethod::Map => (row.sample.tokens, 0),
    };
    push_range(
        b,
        &view,
        first,
        &shape.starts,
        lo,
        hi,
        shape.len,
        shape.real_len,
        row.dataset.pad_id,
        shape.doc_positions,
        shape.mask_docs,
    );
    Ok(())
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
