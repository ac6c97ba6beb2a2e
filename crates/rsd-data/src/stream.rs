//! `rsd-data stream`: what the loader hands one (DP, CP) rank, summarised row by row, with its
//! state saved or resumed (docs/LOADER.md).

use std::path::PathBuf;

use rsd_loader::{Batch, Loader, LoaderConfig, SampleId, IGNORE_INDEX};

use crate::error::{DataError, Result};

/// What to stream.
#[derive(Debug, Clone)]
pub struct StreamRequest {
    /// The loader, configured for one rank.
    pub loader: LoaderConfig,
    /// Continue from this saved state.
    pub resume: Option<PathBuf>,
    /// Stop after this many batches (else at the end of the loader's epochs).
    pub batches: Option<u64>,
    /// Token ids kept from each end of a row.
    pub edge: usize,
    /// Keep each row's whole ids, labels and position ids too ([`RowSummary::full`]).
    pub full: bool,
    /// Save the loader state here after the last batch.
    pub save_state: Option<PathBuf>,
}

/// One sample row of a batch, as this rank holds it.
#[derive(Debug, Clone)]
pub struct RowSummary {
    /// Global step.
    pub step: u64,
    /// Row within the batch.
    pub row: usize,
    /// Where the sample comes from.
    pub sample: SampleId,
    /// Tokens this rank holds of the row.
    pub tokens: usize,
    /// The first `edge` of them.
    pub first: Vec<i32>,
    /// The last `edge` of them.
    pub last: Vec<i32>,
    /// The smallest and largest position id (none for an empty row).
    pub positions: (Option<i32>, Option<i32>),
    /// Labels that count in the loss.
    pub labels: usize,
    /// Document ends inside the row, in row coordinates.
    pub doc_ends: Vec<u32>,
    /// The `[start, end)` chunks of the row this rank holds, in row coordinates.
    pub chunks: Vec<[u32; 2]>,
    /// The full row's length (padding for context parallelism included).
    pub row_len: u32,
    /// With [`StreamRequest::full`]: the arrays this rank holds of the row.
    pub full: Option<FullRow>,
}

/// A row's arrays as the trainer gets them (this rank's part, after context-parallel slicing).
#[derive(Debug, Clone)]
pub struct FullRow {
    /// Token ids.
    pub ids: Vec<i32>,
    /// Next-token targets, −100 where there is no loss.
    pub labels: Vec<i32>,
    /// RoPE position ids.
    pub positions: Vec<i32>,
}

/// How a stream ended.
#[derive(Debug, Clone, Copy)]
pub struct StreamReport {
    /// Batches streamed.
    pub batches: u64,
    /// The loader's global step after them.
    pub step: u64,
}

/// Stream batches, calling `on_row` with every row in order; save the state if asked.
pub fn run(
    request: &StreamRequest,
    on_row: &mut dyn FnMut(RowSummary) -> std::io::Result<()>,
) -> Result<StreamReport> {
    let mut loader = match &request.resume {
        Some(p) => Loader::resume_file(request.loader.clone(), p)?,
        None => Loader::new(request.loader.clone())?,
    };
    let mut done = 0u64;
    while request.batches.is_none_or(|n| done < n) {
        let Some(b) = loader.next() else { break };
        let b = b?;
        for row in 0..b.samples.len() {
            on_row(summarize(&b, row, request.edge, request.full)).map_err(DataError::Output)?;
        }
        done += 1;
    }
    if let Some(p) = &request.save_state {
        loader
            .state()
            .write(p)
            .map_err(|source| DataError::SaveState {
                path: p.clone(),
                source,
            })?;
    }
    Ok(StreamReport {
        batches: done,
        step: loader.state().step,
    })
}

/// Row `row` of batch `b`.
fn summarize(b: &Batch, row: usize, edge: usize, full: bool) -> RowSummary {
    let (lo, hi) = (b.row_offsets[row] as usize, b.row_offsets[row + 1] as usize);
    let toks = &b.tokens[lo..hi];
    let pos = &b.position_ids[lo..hi];
    let base = b.full_row_offsets[row];
    let end = b.full_row_offsets[row + 1];
    let doc_ends: Vec<u32> = b
        .doc_offsets
        .iter()
        .filter(|&&d| d > base && d <= end)
        .map(|d| d - base)
        .collect();
    // With context parallelism a rank holds two chunks of each row (zigzag), else one.
    let chunks: Vec<[u32; 2]> = if b.chunks.len() == 2 * b.samples.len() {
        vec![b.chunks[2 * row], b.chunks[2 * row + 1]]
    } else {
        vec![b.chunks[row]]
    };
    RowSummary {
        step: b.step,
        row,
        sample: b.samples[row],
        tokens: toks.len(),
        first: toks[..edge.min(toks.len())].to_vec(),
        last: toks[toks.len().saturating_sub(edge)..].to_vec(),
        positions: (pos.iter().min().copied(), pos.iter().max().copied()),
        labels: b.labels[lo..hi]
            .iter()
            .filter(|&&l| l != IGNORE_INDEX)
            .count(),
        doc_ends,
        chunks: chunks.iter().map(|[x, y]| [x - base, y - base]).collect(),
        row_len: end - base,
        full: full.then(|| FullRow {
            ids: toks.to_vec(),
            labels: b.labels[lo..hi].to_vec(),
            positions: pos.to_vec(),
        }),
    }
}
