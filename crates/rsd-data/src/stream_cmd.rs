//! `rsd-data stream` and `rsd-data bench`: thin front ends over `rsd-loader` (docs/LOADER.md).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use rsd_loader::bench::{memcpy_limit, pass, pread_limit, sample_copy_rate, SampleCopies};
use rsd_loader::synth::{self, SynthSpec};
use rsd_loader::{
    BatchLayout, Batching, Dataset, Loader, LoaderConfig, LoaderState, Parallel, Pipeline,
    Positions, Rank, ReadMethod, IGNORE_INDEX,
};
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
    fn sources(&self) -> Result<Vec<Dataset>> {
        if let Some(p) = &self.pipeline {
            if !self.dirs.is_empty() {
                bail!("give either DIR… or --pipeline, not both");
            }
            let root = self
                .data_root
                .clone()
                .or_else(|| std::env::var_os("RSD_DATA_ROOT").map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from("."));
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
    let cfg = LoaderConfig {
        datasets: a.src.sources()?,
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
    let mut loader = match &a.resume {
        Some(p) => {
            let state = LoaderState::read(p)?;
            Loader::resume(cfg, &state)?
        }
        None => Loader::new(cfg)?,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut done = 0u64;
    while a.batches.is_none_or(|n| done < n) {
        let Some(b) = loader.next() else { break };
        let b = b?;
        for (row, id) in b.samples.iter().enumerate() {
            let (lo, hi) = (b.row_offsets[row] as usize, b.row_offsets[row + 1] as usize);
            let toks = &b.tokens[lo..hi];
            let pos = &b.position_ids[lo..hi];
            let base = b.full_row_offsets[row];
            let end = b.full_row_offsets[row + 1];
            let docs: Vec<u32> = b
                .doc_offsets
                .iter()
                .filter(|&&d| d > base && d <= end)
                .map(|d| d - base)
                .collect();
            let chunks: Vec<[u32; 2]> = if b.chunks.len() == 2 * b.samples.len() {
                vec![b.chunks[2 * row], b.chunks[2 * row + 1]]
            } else {
                vec![b.chunks[row]]
            };
            let chunks: Vec<[u32; 2]> = chunks.iter().map(|[x, y]| [x - base, y - base]).collect();
            let line = json!({
                "step": b.step,
                "row": row,
                "source": id.dataset,
                "shard": id.shard,
                "index": id.index,
                "global": id.global,
                "epoch": id.epoch,
                "tokens": toks.len(),
                "first": &toks[..a.edge.min(toks.len())],
                "last": &toks[toks.len().saturating_sub(a.edge)..],
                "pos": [pos.iter().min(), pos.iter().max()],
                "labels": b.labels[lo..hi].iter().filter(|&&l| l != IGNORE_INDEX).count(),
                "docs": docs,
                "chunks": chunks,
                "row_len": end - base,
            });
            writeln!(out, "{line}")?;
        }
        done += 1;
    }
    out.flush()?;
    if let Some(p) = &a.save_state {
        loader
            .state()
            .write(p)
            .with_context(|| format!("saving the loader state to {}", p.display()))?;
        eprintln!(
            "saved loader state after {done} batches (global step {}) to {}",
            loader.state().step,
            p.display()
        );
    }
    Ok(())
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
    /// Epochs per measured pass at most: one epoch of a fast layout can take only 0.1 s, too short
    /// to time on a noisy machine. With page release (the default) every epoch re-reads through
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
    if let Some(tokens) = a.synthetic_tokens {
        if !a.dir.join(rsd_shard::MANIFEST_FILE).exists() {
            let spec = SynthSpec {
                samples: (tokens / a.len as f64).ceil() as u64,
                seq_len: a.len,
                vocab: 50_000,
                shard_bytes: 1 << 30,
                ..SynthSpec::default()
            };
            let t = std::time::Instant::now();
            synth::write(&a.dir, &spec)?;
            eprintln!(
                "wrote {} synthetic samples of {} tokens to {} in {:.1}s",
                spec.samples,
                a.len,
                a.dir.display(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    let set = rsd_shard::ShardSet::open(&a.dir)?;
    let m = set.manifest().clone();
    let bpt = m.dtype.size();
    let total_tokens = m.totals.tokens;
    let samples = set.num_samples();
    drop(set);
    let limit = memcpy_limit(&a.dir, a.memcpy_bytes, 2)?;
    let kernel_copy = pread_limit(&a.dir, a.memcpy_bytes, 2)?;
    let emit = |v: serde_json::Value, human: String| {
        if a.json {
            println!("{v}");
        } else {
            println!("{human}");
        }
    };
    emit(
        json!({"what": "memcpy_limit", "dir": a.dir, "bytes_per_s": limit, "pread_1mib_bytes_per_s": kernel_copy, "tokens": total_tokens, "samples": samples, "seq_len": m.seq_len}),
        format!(
            "{}: {} samples, {:.3} B tokens ({}), length {}\nmemcpy limit (page cache → buffer, 1 MiB copies from a built mapping): {:.2} GB/s\nkernel copy (pread of 1 MiB pieces, file order): {:.2} GB/s ({:.0}% of memcpy)",
            a.dir.display(),
            samples,
            total_tokens as f64 / 1e9,
            m.dtype.name(),
            m.seq_len,
            limit / 1e9,
            kernel_copy / 1e9,
            100.0 * kernel_copy / limit
        ),
    );
    // The loader's copies without the loader, in both orders: from an already-built mapping (what
    // the access pattern alone allows), through the map with pages released after each copy, and
    // with pread (the two ways of reading each sample once with flat RSS: the floors the loader's
    // two read methods are held to).
    for shuffled in [false, true] {
        let order = if shuffled { "shuffled" } else { "sequential" };
        let rate = |how| sample_copy_rate(&a.dir, a.memcpy_bytes, shuffled, how, 2);
        let mapped = rate(SampleCopies::BuiltMapping)?;
        let fresh = rate(SampleCopies::ReleasedMapping)?;
        let pread = rate(SampleCopies::Pread)?;
        emit(
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
        );
    }
    let reads: &[ReadMethod] = match a.read {
        ReadChoice::Pread => &[ReadMethod::Pread],
        ReadChoice::Map => &[ReadMethod::Map],
        ReadChoice::Both => &[ReadMethod::Pread, ReadMethod::Map],
    };
    let layouts: &[BatchLayout] = match a.layout {
        LayoutChoice::Full => &[BatchLayout::Full],
        LayoutChoice::Compact => &[BatchLayout::Compact],
        LayoutChoice::Both => &[BatchLayout::Full, BatchLayout::Compact],
    };
    for (&layout, &read) in layouts
        .iter()
        .flat_map(|l| reads.iter().map(move |r| (l, r)))
    {
        let lname = match layout {
            BatchLayout::Full => "full",
            BatchLayout::Compact => "compact",
        };
        let rname = match read {
            ReadMethod::Pread => "pread",
            ReadMethod::Map => "map",
        };
        for shuffle in [false, true] {
            for &workers in &a.workers {
                let cfg = LoaderConfig {
                    layout,
                    datasets: vec![Dataset::new(&a.dir, 1.0)],
                    batching: Batching::Samples(a.batch_size),
                    shuffle,
                    workers,
                    prefetch: a.prefetch,
                    prefetch_bytes: a.prefetch_bytes,
                    epochs: Some(a.epochs.max(1)),
                    read,
                    release_pages: !a.no_release,
                    ..LoaderConfig::default()
                };
                // The VM's speed drifts by tens of percent over minutes: each pass is divided by
                // references measured right before it (512 MiB each), and the row reports medians.
                let near = a.memcpy_bytes.min(512 << 20);
                // The same copies without the loader, read the same way as in this pass.
                let how = match (read, a.no_release) {
                    (ReadMethod::Pread, _) => SampleCopies::Pread,
                    (ReadMethod::Map, false) => SampleCopies::ReleasedMapping,
                    (ReadMethod::Map, true) => SampleCopies::BuiltMapping,
                };
                let mut rounds = Vec::new();
                for _ in 0..a.rounds.max(1) {
                    let limit = memcpy_limit(&a.dir, near, 1)?;
                    let floor = sample_copy_rate(&a.dir, near, shuffle, how, 1)?;
                    let r = pass(cfg.clone(), bpt, u64::MAX, a.seconds)?;
                    rounds.push((limit, floor, r));
                }
                let order = if shuffle { "shuffled" } else { "sequential" };
                let of_memcpy: Vec<f64> =
                    rounds.iter().map(|(l, _, r)| r.bytes_per_s / l).collect();
                let of_copies: Vec<f64> =
                    rounds.iter().map(|(_, f, r)| r.bytes_per_s / f).collect();
                let med = |v: Vec<f64>| median(&v);
                let bytes_per_s = med(rounds.iter().map(|(_, _, r)| r.bytes_per_s).collect());
                let limit = med(rounds.iter().map(|(l, _, _)| *l).collect());
                let floor = med(rounds.iter().map(|(_, f, _)| *f).collect());
                let first_ms = med(rounds.iter().map(|(_, _, r)| r.first_batch_ms).collect());
                let mib = |b: u64| b as f64 / 1048576.0;
                let rss_start = rounds
                    .iter()
                    .map(|(_, _, r)| r.rss_start)
                    .min()
                    .unwrap_or(0);
                let rss_max = rounds.iter().map(|(_, _, r)| r.rss_max).max().unwrap_or(0);
                let rss_end = rounds.last().map_or(0, |(_, _, r)| r.rss_end);
                let file_max = rounds
                    .iter()
                    .map(|(_, _, r)| r.rss_file_max)
                    .max()
                    .unwrap_or(0);
                let (lo, hi) = of_memcpy
                    .iter()
                    .fold((f64::MAX, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
                let reports: Vec<_> = rounds.iter().map(|(l, f, r)| json!({"memcpy_limit_before": l, "sample_copies_before": f, "report": r})).collect();
                emit(
                json!({"what": "loader", "layout": lname, "read": rname, "order": order, "workers": workers, "batch_size": a.batch_size, "release_pages": !a.no_release,
                       "bytes_per_s": bytes_per_s, "tokens_per_s": bytes_per_s / bpt as f64,
                       "fraction_of_memcpy": median(&of_memcpy), "fraction_of_sample_copies": median(&of_copies),
                       "rounds": reports}),
                format!(
                    "{lname:>7} {rname:>5} {order:>10} workers={workers}: {:>7.1} M tok/s {:>6.2} GB/s ({:>3.0}% of memcpy at {:.1} [rounds {:.0}–{:.0}%], {:>3.0}% of the sample copies at {:.1}), first batch {:.1} ms, RSS {:.0}→max {:.0}→end {:.0} MiB (file-backed max {:.0} MiB)",
                    bytes_per_s / bpt as f64 / 1e6,
                    bytes_per_s / 1e9,
                    100.0 * median(&of_memcpy),
                    limit / 1e9,
                    100.0 * lo,
                    100.0 * hi,
                    100.0 * median(&of_copies),
                    floor / 1e9,
                    first_ms,
                    mib(rss_start),
                    mib(rss_max),
                    mib(rss_end),
                    mib(file_max),
                ),
            );
            }
        }
    }
    let now = rsd_common::mem::Memory::now().rss;
    if !a.json {
        println!("process RSS now {:.0} MiB", now as f64 / 1048576.0);
    }
    Ok(())
}

/// The median (the mean of the middle two for an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}
