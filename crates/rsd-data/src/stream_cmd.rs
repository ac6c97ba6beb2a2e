//! `rsd-data stream` and `rsd-data bench`: arguments → [`rsd_data::stream::run`] and
//! [`rsd_data::bench::loader::run`] → printed results (docs/LOADER.md).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::Args;
use rsd_common::mem::{mib, Memory};
use rsd_data::bench::loader::{LoaderBenchEvent, LoaderBenchRequest, LoaderRow, SampleCopyRates};
use rsd_data::paths;
use rsd_data::stream::{RowSummary, StreamRequest};
use rsd_loader::{
    BatchLayout, Batching, Dataset, LoaderConfig, Parallel, Pipeline, Positions, Rank, ReadMethod,
};
use rsd_shard::Manifest;
use serde_json::json;

/// Where the data comes from and how it is mixed, shared by `stream` and `bench`.
#[derive(Args)]
pub struct SourceArgs {
    /// Shard directories (the mixture's sources).
    #[arg(value_name = "DIR")]
    dirs: Vec<PathBuf>,
    /// Mixture weights, one per DIR, comma separated (default: equal).
    #[arg(long, value_delimiter = ',')]
    weights: Vec<f64>,
    /// A pipeline file (pipelines/*.json) naming sources and weights, instead of DIR/--weights.
    #[arg(long, value_name = "FILE")]
    pipeline: Option<PathBuf>,
    /// Where relative dirs of a pipeline file are resolved (default: $RSD_DATA_ROOT, else `.`).
    #[arg(long, value_name = "DIR")]
    data_root: Option<PathBuf>,
}

impl SourceArgs {
    fn datasets(&self) -> Result<Vec<Dataset>> {
        if let Some(p) = &self.pipeline {
            if !self.dirs.is_empty() {
                bail!("give either DIR… or --pipeline, not both");
            }
            let root = paths::data_root(self.data_root.as_deref(), paths::PIPELINES_DEFAULT);
            return Ok(Pipeline::read(p, &root)?.datasets);
        }
        if self.dirs.is_empty() {
            bail!("no shard directory given (DIR… or --pipeline FILE)");
        }
        if !self.weights.is_empty() && self.weights.len() != self.dirs.len() {
            bail!(
                "{} weights for {} directories: give one weight per directory",
                self.weights.len(),
                self.dirs.len()
            );
        }
        Ok(self
            .dirs
            .iter()
            .enumerate()
            .map(|(i, d)| Dataset::new(d, self.weights.get(i).copied().unwrap_or(1.0)))
            .collect())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum PositionsArg {
    Auto,
    Row,
    Document,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StreamFormat {
    Jsonl,
}

#[derive(Args)]
pub struct StreamArgs {
    #[command(flatten)]
    src: SourceArgs,
    /// Shuffle seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Epoch to start in.
    #[arg(long, default_value_t = 0)]
    epoch: u64,
    /// Stop when the first source finishes this many epochs (default: 1 unless --batches is given).
    #[arg(long)]
    epochs: Option<u64>,
    /// Data-parallel rank.
    #[arg(long, default_value_t = 0)]
    dp_rank: usize,
    /// Data-parallel world size.
    #[arg(long, default_value_t = 1)]
    dp_size: usize,
    /// Context-parallel rank.
    #[arg(long, default_value_t = 0)]
    cp_rank: usize,
    /// Context-parallel group size (rows are cut into 2·P zigzag chunks).
    #[arg(long, default_value_t = 1)]
    cp_size: usize,
    /// Samples per rank per step.
    #[arg(long, default_value_t = 1, conflicts_with = "token_budget")]
    batch_size: usize,
    /// Tokens per rank per step instead of a sample count (mixed-length shards).
    #[arg(long)]
    token_budget: Option<usize>,
    /// Read in stored order instead of shuffling.
    #[arg(long)]
    no_shuffle: bool,
    /// Position-id numbering.
    #[arg(long, value_enum, default_value_t = PositionsArg::Auto)]
    positions: PositionsArg,
    /// Continue from a state saved with --save-state (or by the trainer).
    #[arg(long, value_name = "STATE.json")]
    resume: Option<PathBuf>,
    /// Stop after this many batches.
    #[arg(long)]
    batches: Option<u64>,
    /// Write the loader state after the last batch printed.
    #[arg(long, value_name = "STATE.json")]
    save_state: Option<PathBuf>,
    /// Token ids printed from each end of a row.
    #[arg(long, default_value_t = 4)]
    edge: usize,
    /// Also print each row's whole arrays: "ids", "target" (labels, -100 = no loss) and
    /// "position_ids", as this rank holds them.
    #[arg(long)]
    full: bool,
    /// Assembling threads (0: on the main thread).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// Verify checksums when opening.
    #[arg(long)]
    verify: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = StreamFormat::Jsonl)]
    format: StreamFormat,
}

pub fn stream(a: StreamArgs) -> Result<()> {
    let _ = a.format;
    let loader = LoaderConfig {
        datasets: a.src.datasets()?,
        seed: a.seed,
        epoch: a.epoch,
        epochs: a
            .epochs
            .or(if a.batches.is_none() { Some(1) } else { None }),
        parallel: Parallel {
            dp: Rank::new(a.dp_rank, a.dp_size),
            cp: Rank::new(a.cp_rank, a.cp_size),
        },
        batching: match a.token_budget {
            Some(t) => Batching::Tokens(t),
            None => Batching::Samples(a.batch_size),
        },
        shuffle: !a.no_shuffle,
        positions: match a.positions {
            PositionsArg::Auto => Positions::Auto,
            PositionsArg::Row => Positions::Row,
            PositionsArg::Document => Positions::Document,
        },
        workers: a.workers,
        verify: a.verify,
        ..LoaderConfig::default()
    };
    let request = StreamRequest {
        loader,
        resume: a.resume,
        batches: a.batches,
        edge: a.edge,
        full: a.full,
        save_state: a.save_state,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let report = rsd_data::stream::run(&request, &mut |row| writeln!(out, "{}", row_json(&row)))?;
    out.flush()?;
    if let Some(p) = &request.save_state {
        eprintln!(
            "saved loader state after {} batches (global step {}) to {}",
            report.batches,
            report.step,
            p.display()
        );
    }
    Ok(())
}

fn row_json(r: &RowSummary) -> serde_json::Value {
    let mut row = json!({
        "step": r.step,
        "row": r.row,
        "source": r.sample.dataset,
        "shard": r.sample.shard,
        "index": r.sample.index,
        "global": r.sample.global,
        "epoch": r.sample.epoch,
        "tokens": r.tokens,
        "first": r.first,
        "last": r.last,
        "pos": [r.positions.0, r.positions.1],
        "labels": r.labels,
        "docs": r.doc_ends,
        "chunks": r.chunks,
        "row_len": r.row_len,
    });
    if let Some(f) = &r.full {
        row["ids"] = json!(f.ids);
        row["target"] = json!(f.labels);
        row["position_ids"] = json!(f.positions);
    }
    row
}

#[derive(Args)]
pub struct BenchArgs {
    /// Shard directory (created with synthetic data when --synthetic-tokens is given and it is missing).
    dir: PathBuf,
    /// Worker-thread counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2])]
    workers: Vec<usize>,
    /// Samples per batch.
    #[arg(long, default_value_t = 1)]
    batch_size: usize,
    /// Prefetch depth (batches), at least.
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Prefetched bytes, at least: small batches get a deeper window (the loader's default).
    #[arg(long, default_value = "8MiB", value_parser = crate::parse_size)]
    prefetch_bytes: u64,
    /// Seconds per measured pass (a pass also stops at the end of --epochs epochs).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Passes per row, each right after its own memcpy and sample-copy references; a row reports
    /// the medians (a shared VM's speed drifts by tens of percent within minutes).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Epochs per measured pass at most: one epoch of a fast layout can be too short to time on a
    /// noisy machine. With page release (the default) every epoch re-reads through
    /// fresh mappings, so later epochs cost the same as the first; with --no-release they do not.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// With --read map: keep consumed pages mapped (shows the RSS growth that release avoids).
    #[arg(long)]
    no_release: bool,
    /// How the loader copies ids out of the shards: pread (the default of the loader: no mapping
    /// to fault in or release), map (copy out of the memory map, release pages after), or both.
    #[arg(long, value_enum, default_value_t = ReadChoice::Both)]
    read: ReadChoice,
    /// Write a synthetic dataset of about this many tokens into DIR first (if it has no manifest).
    #[arg(long)]
    synthetic_tokens: Option<f64>,
    /// Sample length for --synthetic-tokens.
    #[arg(long, default_value_t = 65536)]
    len: u32,
    /// Bytes of data the memcpy-limit pass copies.
    #[arg(long, default_value = "2GiB", value_parser = crate::parse_size)]
    memcpy_bytes: u64,
    /// Print only JSON lines.
    #[arg(long)]
    json: bool,
    /// Batch layouts to measure: full (i32 tokens, labels, positions), compact (ids as stored, for
    /// trainers that derive labels and positions on the device), or both.
    #[arg(long, value_enum, default_value_t = LayoutChoice::Both)]
    layout: LayoutChoice,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ReadChoice {
    Pread,
    Map,
    Both,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LayoutChoice {
    Full,
    Compact,
    Both,
}

pub fn bench(a: BenchArgs) -> Result<()> {
    let request = LoaderBenchRequest {
        dir: a.dir.clone(),
        synthetic_tokens: a.synthetic_tokens,
        synthetic_len: a.len,
        workers: a.workers.clone(),
        batch_size: a.batch_size,
        prefetch: a.prefetch,
        prefetch_bytes: a.prefetch_bytes,
        seconds: a.seconds,
        rounds: a.rounds,
        epochs: a.epochs,
        release_pages: !a.no_release,
        reads: match a.read {
            ReadChoice::Pread => vec![ReadMethod::Pread],
            ReadChoice::Map => vec![ReadMethod::Map],
            ReadChoice::Both => vec![ReadMethod::Pread, ReadMethod::Map],
        },
        layouts: match a.layout {
            LayoutChoice::Full => vec![BatchLayout::Full],
            LayoutChoice::Compact => vec![BatchLayout::Compact],
            LayoutChoice::Both => vec![BatchLayout::Full, BatchLayout::Compact],
        },
        memcpy_bytes: a.memcpy_bytes,
    };
    // The memcpy limit of the dataset: the sample-copy lines are printed as fractions of it.
    let mut limit = 1.0;
    rsd_data::bench::loader::run(&request, &mut |event| {
        let (json, human) = match event {
            LoaderBenchEvent::Synthesized {
                samples,
                len,
                seconds,
            } => {
                eprintln!(
                    "wrote {samples} synthetic samples of {len} tokens to {} in {seconds:.1}s",
                    a.dir.display(),
                );
                return;
            }
            LoaderBenchEvent::Dataset {
                manifest,
                samples,
                memcpy_limit,
                pread_limit,
            } => {
                limit = memcpy_limit;
                dataset_lines(&a.dir, manifest, samples, memcpy_limit, pread_limit)
            }
            LoaderBenchEvent::SampleCopies(c) => sample_copies_line(&c, limit),
            LoaderBenchEvent::Loader(row) => loader_row(&a, &row),
        };
        if a.json {
            println!("{json}");
        } else {
            println!("{human}");
        }
    })?;
    if !a.json {
        println!("process RSS now {:.0} MiB", mib(Memory::now().rss));
    }
    Ok(())
}

/// The dataset and its read limits, as a JSON value and lines for people.
fn dataset_lines(
    dir: &Path,
    m: &Manifest,
    samples: u64,
    limit: f64,
    kernel_copy: f64,
) -> (serde_json::Value, String) {
    let total_tokens = m.totals.tokens;
    (
        json!({"what": "memcpy_limit", "dir": dir, "bytes_per_s": limit, "pread_1mib_bytes_per_s": kernel_copy, "tokens": total_tokens, "samples": samples, "seq_len": m.seq_len}),
        format!(
            "{}: {} samples, {:.3} B tokens ({}), length {}\nmemcpy limit (page cache → buffer, 1 MiB copies from a built mapping): {:.2} GB/s\nkernel copy (pread of 1 MiB pieces, file order): {:.2} GB/s ({:.0}% of memcpy)",
            dir.display(),
            samples,
            total_tokens as f64 / 1e9,
            m.dtype.name(),
            m.seq_len,
            limit / 1e9,
            kernel_copy / 1e9,
            100.0 * kernel_copy / limit
        ),
    )
}

/// The sample copies without the loader, as a JSON value and a line for people.
fn sample_copies_line(c: &SampleCopyRates, limit: f64) -> (serde_json::Value, String) {
    let order = order_name(c.shuffled);
    let (mapped, fresh, pread) = (c.mapped, c.fresh_mapping, c.pread);
    (
        json!({"what": "sample_copies", "order": order, "mapped_bytes_per_s": mapped, "fresh_mapping_bytes_per_s": fresh, "pread_bytes_per_s": pread}),
        format!(
            "sample copies {order:>10}, no loader: {:.2} GB/s from a built mapping ({:.0}% of memcpy), {:.2} GB/s with pages released as the loader does ({:.0}%), {:.2} GB/s with pread ({:.0}%)",
            mapped / 1e9,
            100.0 * mapped / limit,
            fresh / 1e9,
            100.0 * fresh / limit,
            pread / 1e9,
            100.0 * pread / limit
        ),
    )
}

fn order_name(shuffled: bool) -> &'static str {
    if shuffled {
        "shuffled"
    } else {
        "sequential"
    }
}

/// A loader row as a JSON value and a line for people.
fn loader_row(a: &BenchArgs, row: &LoaderRow) -> (serde_json::Value, String) {
    let lname = match row.layout {
        BatchLayout::Full => "full",
        BatchLayout::Compact => "compact",
    };
    let rname = match row.read {
        ReadMethod::Pread => "pread",
        ReadMethod::Map => "map",
    };
    let order = order_name(row.shuffled);
    let workers = row.workers;
    let bytes_per_s = row.bytes_per_s;
    let (lo, hi) = row.fraction_of_memcpy_range;
    let reports: Vec<_> = row.rounds.iter().map(|r| json!({"memcpy_limit_before": r.memcpy_limit, "sample_copies_before": r.sample_copies, "report": r.report})).collect();
    (
        json!({"what": "loader", "layout": lname, "read": rname, "order": order, "workers": workers, "batch_size": a.batch_size, "release_pages": !a.no_release,
               "bytes_per_s": bytes_per_s, "tokens_per_s": row.tokens_per_s,
               "fraction_of_memcpy": row.fraction_of_memcpy, "fraction_of_sample_copies": row.fraction_of_sample_copies,
               "id_check_ns_per_token": row.id_check_ns_per_token, "rounds": reports}),
        format!(
            "{lname:>7} {rname:>5} {order:>10} workers={workers}: {:>7.1} M tok/s {:>6.2} GB/s ({:>3.0}% of memcpy at {:.1} [rounds {:.0}–{:.0}%], {:>3.0}% of the sample copies at {:.1}), first batch {:.1} ms, RSS {:.0}→max {:.0}→end {:.0} MiB (file-backed max {:.0} MiB), vocabulary check {:.3} ns/token",
            row.tokens_per_s / 1e6,
            bytes_per_s / 1e9,
            100.0 * row.fraction_of_memcpy,
            row.memcpy_limit / 1e9,
            100.0 * lo,
            100.0 * hi,
            100.0 * row.fraction_of_sample_copies,
            row.sample_copies / 1e9,
            row.first_batch_ms,
            mib(row.rss_start),
            mib(row.rss_max),
            mib(row.rss_end),
            mib(row.rss_file_max),
            row.id_check_ns_per_token,
        ),
    )
}
