//! `rsd-loader`: a deterministic, resumable, prefetching batch loader over rsd token shards.
//!
//! The pieces, in the order data flows through them:
//!
//! * [`Dataset`]s (shard directories with mixture weights) are opened and checked to agree on
//!   tokenizer, dtype and length (`datasets`).
//! * A keyed bijective [`perm::Permutation`] per dataset and epoch gives a global shuffle with no
//!   index to build: start-up is O(shards), not O(samples).
//! * The planner interleaves the datasets by smooth weighted round-robin into one global stream
//!   and deals each global step to DP ranks, by sample count or token budget (`plan`); this rank's
//!   place in the DP × CP mesh is a [`Parallel`].
//! * Worker threads assemble [`Batch`]es from the mapped bytes — labels shifted on the full row,
//!   position ids, document boundaries, zigzag CP chunks — and pass them through bounded channels
//!   ([`Loader`]). In the compact [`BatchLayout`] only the ids are copied, as stored, and
//!   [`Batch::materialize`] (or the trainer, on its device) derives labels and positions, as
//!   [`RowRules`] defines them for every consumer of rows (`row`). With
//!   [`ReadMethod::Map`] the copied-out pages are released again (`pages`).
//! * [`LoaderState`] records the global cursor, so a stream resumes exactly, also on another DP size.
//!
//! The trainer-facing contract is written down in `docs/LOADER.md`.

mod batch;
pub mod bench;
mod datasets;
mod error;
mod ids;
mod loader;
mod pages;
mod parallel;
pub mod perm;
mod plan;
pub mod row;
mod state;
pub mod synth;

pub use batch::{Batch, BatchLayout, IdOutside, RawTokens, RowMeta, SampleId, IGNORE_INDEX};
pub use datasets::{Dataset, Pipeline};
pub use error::{LoaderError, Result};
pub use ids::IdBuf;
pub use loader::Loader;
pub use parallel::{Parallel, Rank};
pub use row::RowRules;
pub use state::{DatasetState, LoaderState, STATE_VERSION};

/// How many rows a rank gets per step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Batching {
    /// Exactly this many samples per rank per step.
    Samples(usize),
    /// As many samples as fit in this many tokens on every rank (at least one), for mixed shards.
    Tokens(usize),
}

/// How position ids are numbered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Positions {
    /// 0..L−1 along each row.
    Row,
    /// Restart at 0 at every document piece.
    Document,
    /// `Row` for fixed-mode shards, `Document` for mixed-mode shards.
    Auto,
}

/// How batch assembly copies token ids out of the shards. Either way each id is copied once, from
/// the page cache into the batch; the choice is what that copy costs besides the bytes
/// (docs/LOADER.md, "Reading").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadMethod {
    /// `pread` from the `.bin` into the batch: no page-table work in this process, so nothing to
    /// fault in per sample and nothing to release; RSS does not grow with the amount read.
    #[default]
    Pread,
    /// Copy out of the memory-mapped `.bin`: each sample's pages are faulted into the mapping, and
    /// released again afterwards when `release_pages` is on.
    Map,
}

/// Everything that shapes the stream one rank sees.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoaderConfig {
    /// Shard directories and their weights (`sources` in configs serialized before the rename).
    #[serde(alias = "sources")]
    pub datasets: Vec<Dataset>,
    /// Shuffle seed.
    pub seed: u64,
    /// Epoch the stream starts in.
    pub epoch: u64,
    /// Stop when the first dataset would start its `epochs`-th epoch after `epoch`; `None`: never.
    pub epochs: Option<u64>,
    /// This rank's place among the DP ranks and within its CP group (serialized as the flat
    /// fields `dp_rank`, `dp_size`, `cp_rank`, `cp_size`).
    #[serde(flatten)]
    pub parallel: Parallel,
    /// Rows per step.
    pub batching: Batching,
    /// Shuffle within each dataset (`false`: sequential order, for audits and benchmarks).
    pub shuffle: bool,
    /// Position-id numbering.
    pub positions: Positions,
    /// Ignore the label of each document's last token; `None` = on for mixed shards only.
    pub mask_doc_boundaries: Option<bool>,
    /// Batches assembled ahead of the consumer (the total depth of the bounded channels), at
    /// least: see `prefetch_bytes`.
    pub prefetch: usize,
    /// Bytes of batches assembled ahead, at least: the depth is raised to cover this much when
    /// batches are small. A few batches of 128 KiB are gone in tens of microseconds, shorter than a
    /// scheduler's hiccup, and the workers then stall on full channels (docs/BENCHMARKS.md,
    /// "rsd-loader").
    /// Absent in a serialized config from before the field: 8 MiB.
    #[serde(default = "default_prefetch_bytes")]
    pub prefetch_bytes: u64,
    /// Assembling threads; 0 assembles on the caller's thread.
    pub workers: usize,
    /// Verify every shard's checksums when opening (reads all bytes once).
    pub verify: bool,
    /// How ids are copied out of the shards (`pread`, or from the memory map). Absent in a
    /// serialized config from before the field existed: `Pread`.
    #[serde(default)]
    pub read: ReadMethod,
    /// With `read: Map`, unmap consumed ranges (`madvise(DONTNEED)`) so RSS stays flat over long
    /// passes. `Pread` maps nothing to release.
    pub release_pages: bool,
    /// `Full` i32 arrays, or `Compact` ids as stored (see [`BatchLayout`]). Absent in a serialized
    /// config from before the field existed: `Full`.
    #[serde(default)]
    pub layout: BatchLayout,
}

fn default_prefetch_bytes() -> u64 {
    8 << 20
}

impl LoaderConfig {
    /// Batches the workers keep ready: `prefetch`, raised to cover `prefetch_bytes` of this rank's
    /// batches at their largest (full rows of `seq_len` tokens; the full layout holds three `i32`
    /// arrays per token, the compact one the stored ids), capped at 1024.
    pub fn prefetch_depth(&self, seq_len: u64, token_bytes: u64) -> usize {
        let tokens = match self.batching {
            Batching::Samples(rows) => rows as u64 * seq_len,
            Batching::Tokens(budget) => (budget as u64).max(seq_len),
        };
        let per_token = match self.layout {
            BatchLayout::Full => 12,
            BatchLayout::Compact => token_bytes,
        };
        let batch_bytes = (tokens.div_ceil(self.parallel.cp.size.max(1) as u64) * per_token).max(1);
        let for_bytes = self.prefetch_bytes.div_ceil(batch_bytes).min(1024) as usize;
        self.prefetch.max(for_bytes).max(1)
    }
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            datasets: Vec::new(),
            seed: 0,
            epoch: 0,
            epochs: None,
            parallel: Parallel::default(),
            batching: Batching::Samples(1),
            shuffle: true,
            positions: Positions::Auto,
            mask_doc_boundaries: None,
            prefetch: 4,
            prefetch_bytes: default_prefetch_bytes(),
            workers: 2,
            verify: false,
            read: ReadMethod::Pread,
            release_pages: true,
            layout: BatchLayout::Full,
        }
    }
}
