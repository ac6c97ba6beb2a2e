//! `rsd-data bench`: the loader's throughput on a shard directory, next to the copies it cannot
//! beat: memcpy out of the page cache, and each sample copied once without the loader.
//!
//! A shared VM's speed drifts by tens of percent within minutes, so every measured pass is
//! preceded by its own references and a row reports medians over several such rounds.

use std::path::PathBuf;
use std::time::Instant;

use rsd_common::stats::median;
use rsd_loader::bench::{
    memcpy_limit, pass, pread_limit, sample_copy_rate, PassReport, SampleCopies,
};
use rsd_loader::synth::{self, SynthSpec};
use rsd_loader::{BatchLayout, Batching, Dataset, LoaderConfig, ReadMethod};
use rsd_shard::{Manifest, ShardSet};

use crate::error::Result;

/// What to measure.
#[derive(Debug, Clone)]
pub struct LoaderBenchRequest {
    /// Shard directory.
    pub dir: PathBuf,
    /// Write a synthetic dataset of about this many tokens into `dir` first, if it has no manifest.
    pub synthetic_tokens: Option<f64>,
    /// Sample length of the synthetic dataset.
    pub synthetic_len: u32,
    /// Worker-thread counts to measure.
    pub workers: Vec<usize>,
    /// Samples per batch.
    pub batch_size: usize,
    /// Prefetch depth (batches), at least.
    pub prefetch: usize,
    /// Prefetched bytes, at least.
    pub prefetch_bytes: u64,
    /// Seconds per measured pass.
    pub seconds: f64,
    /// Passes per row (at least 1), each right after its own references.
    pub rounds: usize,
    /// Epochs per measured pass at most (at least 1).
    pub epochs: u64,
    /// Release consumed pages of the memory map (`--read map`).
    pub release_pages: bool,
    /// Read methods to measure.
    pub reads: Vec<ReadMethod>,
    /// Batch layouts to measure.
    pub layouts: Vec<BatchLayout>,
    /// Bytes of data the reference copies move.
    pub memcpy_bytes: u64,
}

/// One result of [`run`], reported as soon as it is measured.
pub enum LoaderBenchEvent<'a> {
    /// A synthetic dataset was written first.
    Synthesized {
        /// Samples written.
        samples: u64,
        /// Their length in tokens.
        len: u32,
        /// Seconds it took.
        seconds: f64,
    },
    /// The dataset and the physical limits of reading it.
    Dataset {
        /// Its manifest.
        manifest: &'a Manifest,
        /// Samples in it.
        samples: u64,
        /// memcpy out of a built mapping of the page-cached `.bin` files, bytes/s.
        memcpy_limit: f64,
        /// pread of 1 MiB pieces in file order, bytes/s.
        pread_limit: f64,
    },
    /// The loader's copies without the loader, in one order.
    SampleCopies(SampleCopyRates),
    /// One configuration of the loader.
    Loader(LoaderRow),
}

/// Each sample copied once without the loader, three ways, bytes/s.
#[derive(Debug, Clone, Copy)]
pub struct SampleCopyRates {
    /// In shuffled order (else sequential).
    pub shuffled: bool,
    /// From an already-built mapping: what the access pattern alone allows.
    pub mapped: f64,
    /// Through the map, releasing pages after each copy, as the loader's `map` read does.
    pub fresh_mapping: f64,
    /// With pread, as the loader's `pread` read does.
    pub pread: f64,
}

/// One measured pass and the references measured right before it.
#[derive(Debug, Clone)]
pub struct Round {
    /// memcpy limit, bytes/s.
    pub memcpy_limit: f64,
    /// The same sample copies without the loader, read the way this pass reads, bytes/s.
    pub sample_copies: f64,
    /// The loader's pass.
    pub report: PassReport,
}

/// One loader configuration: medians over its rounds.
#[derive(Debug, Clone)]
pub struct LoaderRow {
    /// Batch layout.
    pub layout: BatchLayout,
    /// Read method.
    pub read: ReadMethod,
    /// Shuffled (else stored order).
    pub shuffled: bool,
    /// Worker threads.
    pub workers: usize,
    /// Shard bytes per second.
    pub bytes_per_s: f64,
    /// Tokens per second.
    pub tokens_per_s: f64,
    /// The pass's rate over the memcpy limit before it.
    pub fraction_of_memcpy: f64,
    /// The lowest and highest of those fractions over the rounds.
    pub fraction_of_memcpy_range: (f64, f64),
    /// The pass's rate over the sample copies before it.
    pub fraction_of_sample_copies: f64,
    /// The memcpy limit.
    pub memcpy_limit: f64,
    /// The sample copies.
    pub sample_copies: f64,
    /// Latency of the first batch, ms.
    pub first_batch_ms: f64,
    /// Smallest RSS after the first batch, bytes.
    pub rss_start: u64,
    /// Largest RSS seen.
    pub rss_max: u64,
    /// RSS at the end of the last round.
    pub rss_end: u64,
    /// Largest file-backed RSS seen.
    pub rss_file_max: u64,
    /// The vocabulary check of each batch, ns per token (median over the rounds).
    pub id_check_ns_per_token: f64,
    /// Every round.
    pub rounds: Vec<Round>,
}

/// Measure: (synthesize the dataset), the limits, the sample copies in both orders, then every
/// layout × read method × order × worker count, calling `on_event` with each result.
pub fn run(
    request: &LoaderBenchRequest,
    on_event: &mut dyn FnMut(LoaderBenchEvent<'_>),
) -> Result<()> {
    let a = request;
    if let Some(tokens) = a.synthetic_tokens {
        if !a.dir.join(rsd_shard::MANIFEST_FILE).exists() {
            let spec = SynthSpec {
                samples: (tokens / a.synthetic_len as f64).ceil() as u64,
                seq_len: a.synthetic_len,
                vocab: 50_000,
                shard_bytes: 1 << 30,
                ..SynthSpec::default()
            };
            let t = Instant::now();
            synth::write(&a.dir, &spec)?;
            on_event(LoaderBenchEvent::Synthesized {
                samples: spec.samples,
                len: a.synthetic_len,
                seconds: t.elapsed().as_secs_f64(),
            });
        }
    }
    let set = ShardSet::open(&a.dir)?;
    let manifest = set.manifest().clone();
    let samples = set.num_samples();
    drop(set);
    let limit = memcpy_limit(&a.dir, a.memcpy_bytes, 2)?;
    let kernel_copy = pread_limit(&a.dir, a.memcpy_bytes, 2)?;
    on_event(LoaderBenchEvent::Dataset {
        manifest: &manifest,
        samples,
        memcpy_limit: limit,
        pread_limit: kernel_copy,
    });
    // The loader's copies without the loader, in both orders: the floors the loader's two read
    // methods are held to (each sample read once with flat RSS).
    for shuffled in [false, true] {
        let rate = |how| sample_copy_rate(&a.dir, a.memcpy_bytes, shuffled, how, 2);
        let mapped = rate(SampleCopies::BuiltMapping)?;
        let fresh_mapping = rate(SampleCopies::ReleasedMapping)?;
        let pread = rate(SampleCopies::Pread)?;
        on_event(LoaderBenchEvent::SampleCopies(SampleCopyRates {
            shuffled,
            mapped,
            fresh_mapping,
            pread,
        }));
    }
    let bytes_per_token = manifest.dtype.size();
    for &layout in &a.layouts {
        for &read in &a.reads {
            for shuffled in [false, true] {
                for &workers in &a.workers {
                    let row = measure(a, layout, read, shuffled, workers, bytes_per_token)?;
                    on_event(LoaderBenchEvent::Loader(row));
                }
            }
        }
    }
    Ok(())
}

/// One row: `rounds` passes of the loader, each after its own references.
fn measure(
    a: &LoaderBenchRequest,
    layout: BatchLayout,
    read: ReadMethod,
    shuffled: bool,
    workers: usize,
    bytes_per_token: usize,
) -> Result<LoaderRow> {
    let cfg = LoaderConfig {
        layout,
        datasets: vec![Dataset::new(&a.dir, 1.0)],
        batching: Batching::Samples(a.batch_size),
        shuffle: shuffled,
        workers,
        prefetch: a.prefetch,
        prefetch_bytes: a.prefetch_bytes,
        epochs: Some(a.epochs.max(1)),
        read,
        release_pages: a.release_pages,
        ..LoaderConfig::default()
    };
    // References of 512 MiB at most: long enough to time, short enough to sit right before the pass.
    let near = a.memcpy_bytes.min(512 << 20);
    // The same copies without the loader, read the same way as in this pass.
    let how = match (read, a.release_pages) {
        (ReadMethod::Pread, _) => SampleCopies::Pread,
        (ReadMethod::Map, true) => SampleCopies::ReleasedMapping,
        (ReadMethod::Map, false) => SampleCopies::BuiltMapping,
    };
    let mut rounds = Vec::new();
    for _ in 0..a.rounds.max(1) {
        let memcpy_limit = memcpy_limit(&a.dir, near, 1)?;
        let sample_copies = sample_copy_rate(&a.dir, near, shuffled, how, 1)?;
        let report = pass(cfg.clone(), bytes_per_token, u64::MAX, a.seconds)?;
        rounds.push(Round {
            memcpy_limit,
            sample_copies,
            report,
        });
    }
    let of = |f: &dyn Fn(&Round) -> f64| median(&rounds.iter().map(f).collect::<Vec<_>>());
    let of_memcpy: Vec<f64> = rounds
        .iter()
        .map(|r| r.report.bytes_per_s / r.memcpy_limit)
        .collect();
    let bytes_per_s = of(&|r| r.report.bytes_per_s);
    let range = of_memcpy
        .iter()
        .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    Ok(LoaderRow {
        layout,
        read,
        shuffled,
        workers,
        bytes_per_s,
        tokens_per_s: bytes_per_s / bytes_per_token as f64,
        fraction_of_memcpy: median(&of_memcpy),
        fraction_of_memcpy_range: range,
        fraction_of_sample_copies: of(&|r| r.report.bytes_per_s / r.sample_copies),
        memcpy_limit: of(&|r| r.memcpy_limit),
        sample_copies: of(&|r| r.sample_copies),
        first_batch_ms: of(&|r| r.report.first_batch_ms),
        rss_start: rounds.iter().map(|r| r.report.rss_start).min().unwrap_or(0),
        rss_max: rounds.iter().map(|r| r.report.rss_max).max().unwrap_or(0),
        rss_end: rounds.last().map_or(0, |r| r.report.rss_end),
        rss_file_max: rounds
            .iter()
            .map(|r| r.report.rss_file_max)
            .max()
            .unwrap_or(0),
        id_check_ns_per_token: of(&|r| r.report.id_check_ns_per_token),
        rounds,
    })
}
