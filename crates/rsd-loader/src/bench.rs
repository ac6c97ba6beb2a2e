//! Measurement helpers shared by `rsd-data bench` and the criterion bench: the page-cache memcpy
//! limit and timed passes of the loader.

use std::path::Path;
use std::time::Instant;

use rsd_common::mem::Memory;
use rsd_shard::ShardSet;
use serde::Serialize;

use crate::batch::RawTokens;
use crate::error::Result;
use crate::pages::{release_range, PageRelease};
use crate::perm::{key, Permutation};
use crate::{Loader, LoaderConfig};

/// The physical limit: memcpy bandwidth (bytes/s) from the mapped, page-cached `.bin` files of
/// `dir` into a reused buffer, best of `repeat` passes over at most `max_bytes`. The first pass
/// also warms the page cache.
pub fn memcpy_limit(dir: &Path, max_bytes: u64, repeat: usize) -> Result<f64> {
    let set = ShardSet::open(dir)?;
    let chunk = 1 << 20;
    let mut buf = vec![0u8; chunk];
    let mut best = 0f64;
    for _ in 0..repeat.max(1) + 1 {
        let start = Instant::now();
        let mut copied = 0u64;
        'outer: for shard in set.shards() {
            for part in shard.bin_bytes().chunks(chunk) {
                buf[..part.len()].copy_from_slice(part);
                std::hint::black_box(&mut buf);
                copied += part.len() as u64;
                if copied >= max_bytes {
                    break 'outer;
                }
            }
        }
        best = best.max(copied as f64 / start.elapsed().as_secs_f64().max(1e-9));
    }
    Ok(best)
}

/// The kernel's own copy of page-cached data: `pread` of 1 MiB pieces of the `.bin` files of `dir`
/// into a reused buffer, in file order, best of `repeat` passes over at most `max_bytes` (bytes/s).
/// Any reader that keeps RSS flat either copies through the kernel like this or maps pages afresh;
/// against [`memcpy_limit`] it shows what the kernel's copy path costs on this machine.
pub fn pread_limit(dir: &Path, max_bytes: u64, repeat: usize) -> Result<f64> {
    let set = ShardSet::open(dir)?;
    let chunk = 1 << 20;
    let mut buf = RawTokens::default();
    let mut best = 0f64;
    for _ in 0..repeat.max(1) + 1 {
        let start = Instant::now();
        let mut copied = 0u64;
        'outer: for shard in set.shards() {
            let len = shard.bin_bytes().len();
            for lo in (0..len).step_by(chunk) {
                let hi = (lo + chunk).min(len);
                buf.clear();
                buf.read_bytes(shard, lo, hi)?;
                std::hint::black_box(&mut buf);
                copied += (hi - lo) as u64;
                if copied >= max_bytes {
                    break 'outer;
                }
            }
        }
        best = best.max(copied as f64 / start.elapsed().as_secs_f64().max(1e-9));
    }
    Ok(best)
}

/// How [`sample_copy_rate`] copies each sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleCopies {
    /// Out of a mapping already built by an untimed pass (the pages are released at the end): the
    /// same pieces in the same order with no page-table work — what the access pattern allows.
    BuiltMapping,
    /// Out of the mapping, releasing pages as the loader does with `ReadMethod::Map` — the 2 MiB
    /// blocks a sample touches, batched, in shuffled order; whole blocks behind a cursor in file
    /// order: the floor for reading each sample once through the map with flat RSS.
    ReleasedMapping,
    /// With `pread` ([`rsd_shard::Shard::append_tokens`]), as the loader does with
    /// `ReadMethod::Pread`: nothing mapped, nothing to release.
    Pread,
}

/// Copy rate (bytes/s) of the loader's copies without the loader: every sample into a reused
/// buffer, one sample at a time, in file order or in the loader's shuffled order, `how` says how;
/// best of `repeat` passes over at most `max_bytes`. Against [`memcpy_limit`] (1 MiB copies, file
/// order) this shows what the access pattern and the page-table work cost, apart from any loader
/// logic.
pub fn sample_copy_rate(
    dir: &Path,
    max_bytes: u64,
    shuffled: bool,
    how: SampleCopies,
    repeat: usize,
) -> Result<f64> {
    let set = ShardSet::open(dir)?;
    let pages = PageRelease::new(&set);
    let mut buf: Vec<u8> = Vec::new();
    let mut read_buf = RawTokens::default();
    let mut best = 0f64;
    // One untimed pass first: it builds the mapping for `BuiltMapping`, and for the others it
    // keeps the first pass after a loader run (other data in the caches) out of the timing.
    let warmup = 1;
    for pass in 0..repeat.max(1) + warmup {
        let start = Instant::now();
        let mut copied = 0u64;
        'outer: for (s, shard) in set.shards().iter().enumerate() {
            let order = Permutation::new(shard.num_samples() as u64, key(0, s, 0), shuffled);
            let bin = shard.bin_bytes();
            for k in 0..order.len() {
                let (_, _, lo, hi) = shard.sample_span(order.apply(k) as usize)?;
                if how == SampleCopies::Pread {
                    read_buf.clear();
                    read_buf.read_bytes(shard, lo, hi)?;
                    std::hint::black_box(&mut read_buf);
                } else {
                    buf.resize(buf.len().max(hi - lo), 0);
                    buf[..hi - lo].copy_from_slice(&bin[lo..hi]);
                    std::hint::black_box(&mut buf);
                }
                if how == SampleCopies::ReleasedMapping {
                    pages.release_row(&set, s, lo, hi, !shuffled);
                }
                copied += (hi - lo) as u64;
                if copied >= max_bytes {
                    break 'outer;
                }
            }
        }
        if pass >= warmup {
            best = best.max(copied as f64 / start.elapsed().as_secs_f64().max(1e-9));
        }
    }
    for shard in set.shards() {
        release_range(shard, 0, shard.bin_bytes().len());
    }
    Ok(best)
}

/// What one timed pass of the loader did.
#[derive(Debug, Clone, Serialize)]
pub struct PassReport {
    /// Batches consumed.
    pub batches: u64,
    /// Tokens consumed (real tokens in the batches).
    pub tokens: u64,
    /// Bytes of shard data behind those tokens.
    pub bytes: u64,
    /// Wall time of the pass after the first batch.
    pub seconds: f64,
    /// `Loader::new` plus the first `next()`, in milliseconds.
    pub first_batch_ms: f64,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// Shard bytes per second.
    pub bytes_per_s: f64,
    /// RSS after the first batch.
    pub rss_start: u64,
    /// Largest RSS seen during the pass.
    pub rss_max: u64,
    /// RSS at the end of the pass.
    pub rss_end: u64,
    /// Largest file-backed RSS seen (the mapped shards).
    pub rss_file_max: u64,
    /// Nanoseconds per token of the trainer's vocabulary check ([`crate::Batch::find_id_outside`]
    /// against the manifest's vocabulary), timed on the first batch, repeated for at least 5 ms
    /// before the pass (not part of its time).
    pub id_check_ns_per_token: f64,
}

/// ns per token of [`crate::Batch::find_id_outside`] on `batch` (every id in range: the common
/// case, one pass over the ids), repeated for at least 5 ms.
fn id_check_cost(batch: &crate::Batch, vocab: u64) -> f64 {
    let ids = batch.tokens.len().max(batch.raw_tokens.len()).max(1) as f64;
    let start = Instant::now();
    let mut runs = 0u64;
    while runs < 3 || start.elapsed().as_secs_f64() < 0.005 {
        let b = std::hint::black_box(batch);
        std::hint::black_box(b.find_id_outside(std::hint::black_box(vocab)));
        runs += 1;
    }
    start.elapsed().as_secs_f64() * 1e9 / (runs as f64 * ids)
}

/// Run the loader for at most `max_batches` batches or `max_seconds`, whichever comes first.
pub fn pass(
    cfg: LoaderConfig,
    bytes_per_token: usize,
    max_batches: u64,
    max_seconds: f64,
) -> Result<PassReport> {
    let t0 = Instant::now();
    let mut loader = Loader::new(cfg)?;
    let mut tokens = 0u64;
    let mut batches = 0u64;
    let first = loader.next().transpose()?;
    let first_batch_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut id_check_ns_per_token = 0.0;
    if let Some(b) = first {
        tokens += b.num_tokens;
        batches += 1;
        let vocab = loader
            .manifest(0)
            .map_or(u64::MAX, |m| m.tokenizer.vocab_size);
        id_check_ns_per_token = id_check_cost(&b, vocab);
    }
    let rss_start = Memory::now().rss;
    let (mut rss_max, mut rss_file_max) = (rss_start, 0);
    let t1 = Instant::now();
    // Reading /proc/self/status costs tens of µs (open + read + format): sampled every 16 batches
    // it shows up in a profile of a fast pass. Sample RSS every 20 ms instead.
    let mut last_rss = 0f64;
    let mut first_tokens = tokens;
    while batches < max_batches {
        let Some(b) = loader.next() else { break };
        let b = b?;
        tokens += b.num_tokens;
        batches += 1;
        std::hint::black_box(&b);
        loader.recycle(b);
        if batches.is_multiple_of(16) {
            let now = t1.elapsed().as_secs_f64();
            if now - last_rss >= 0.02 {
                let m = Memory::now();
                rss_max = rss_max.max(m.rss);
                rss_file_max = rss_file_max.max(m.rss_file);
                last_rss = now;
            }
            if now > max_seconds {
                break;
            }
        }
    }
    let seconds = t1.elapsed().as_secs_f64().max(1e-9);
    drop(loader);
    let rss_end = Memory::now().rss;
    // Throughput excludes the first batch, which is counted as latency.
    std::mem::swap(&mut first_tokens, &mut tokens);
    let steady = first_tokens - tokens;
    Ok(PassReport {
        batches,
        tokens: first_tokens,
        bytes: first_tokens * bytes_per_token as u64,
        seconds,
        first_batch_ms,
        tokens_per_s: steady as f64 / seconds,
        bytes_per_s: (steady * bytes_per_token as u64) as f64 / seconds,
        rss_start,
        rss_max,
        rss_end,
        rss_file_max,
        id_check_ns_per_token,
    })
}
