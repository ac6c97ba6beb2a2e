//! `rsd-data`: pack corpora into token shards, and look at the result.

use std::sync::atomic::{AtomicBool, Ordering};

use clap::{Parser, Subcommand};
use rsd_common::printable::printable_text;

use inspect_cmd::{InspectArgs, VerifyArgs};
use pack_cmd::PackArgs;
use tokenize_bench_cmd::TokenizeBenchArgs;

mod inspect_cmd;
mod pack_cmd;
mod stream_cmd;
mod tokenize_bench_cmd;

/// Set by the first Ctrl-C: a pack stops after its current batch (a second exits at once).
pub(crate) static INTERRUPTED: AtomicBool = AtomicBool::new(false);

#[derive(Parser)]
#[command(
    name = "rsd-data",
    version,
    about = "Tokenize and pack corpora into memory-mapped token shards for rsd-train."
)]
#[command(
    long_about = "Tokenize and pack corpora into memory-mapped token shards for rsd-train.\n\n\
The shards are Megatron-compatible .bin/.idx pairs plus an index.json manifest: one packed sample is one \
Megatron document, each document piece inside it one Megatron sequence (docs/FORMAT.md).\n\n\
Typical use:\n  rsd-data pack --len 65536 --src prolong/book --out data/book\n  rsd-data pack --len 8192 --mode mixed --src corpus/books --src corpus/code --out data/demo\n  rsd-data inspect data/demo --sample 0\n  rsd-data verify data/demo"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Tokenize and pack sources into a shard directory (resumable, deterministic).
    Pack(PackArgs),
    /// Summarize a shard directory: counts, waste, length histograms, decoded samples.
    Inspect(InspectArgs),
    /// Check a shard directory's structure and checksums; exit 1 naming the file and offset of any damage.
    Verify(VerifyArgs),
    /// Measure the bare tokenizer rate on some sources (the ceiling for `pack`).
    TokenizeBench(TokenizeBenchArgs),
    /// Print what the loader hands one (DP, CP) rank, one JSON line per sample row; save/resume its state.
    Stream(stream_cmd::StreamArgs),
    /// Benchmark the loader on a shard directory: tokens/s, GB/s, first-batch latency, RSS, vs memcpy.
    Bench(stream_cmd::BenchArgs),
}

/// Threads this machine offers (the default for --workers).
pub(crate) fn default_workers() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

pub(crate) fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("\"{s}\" is not a size (e.g. 1GiB, 512MiB, 1000000)"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit \"{other}\" (use KiB, MiB, GiB)")),
    };
    Ok((n * mult as f64) as u64)
}

fn main() {
    let cli = Cli::parse();
    // Shard directories keep a file open per shard; a shell's soft limit is often 1,024.
    let _ = rsd_common::process_limits::raise_open_files_limit();
    let _ = ctrlc::set_handler(|| {
        if INTERRUPTED.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        eprintln!("\ninterrupt: stopping after the current batch (Ctrl-C again to quit at once)");
    });
    let result = match cli.command {
        Command::Pack(a) => pack_cmd::pack(a),
        Command::Inspect(a) => inspect_cmd::inspect(a),
        Command::Verify(a) => inspect_cmd::verify(a),
        Command::TokenizeBench(a) => tokenize_bench_cmd::tokenize_bench(a),
        Command::Stream(a) => stream_cmd::stream(a),
        Command::Bench(a) => stream_cmd::bench(a),
    };
    if let Err(e) = result {
        // Errors quote data (names, values): escape its control characters (see `printable`).
        let line = rsd_common::report::one_line(e.chain().map(|c| c.to_string()));
        eprintln!("error: {}", printable_text(&line));
        std::process::exit(if INTERRUPTED.load(Ordering::SeqCst) {
            130
        } else {
            1
        });
    }
}
