//! `rsd-data tokenize-bench`: the bare tokenizer's rate on some sources (the ceiling for `pack`).

use anyhow::Result;
use clap::Args;
use rsd_data::bench::tokenizer::TokenizeBenchRequest;

use crate::{default_workers, parse_size};

#[derive(Args)]
pub struct TokenizeBenchArgs {
    /// Sources, as for `pack`.
    #[arg(long = "src", required = true)]
    sources: Vec<String>,
    /// Tokenizer (default: the bundled Qwen3 one).
    #[arg(long)]
    tokenizer: Option<String>,
    /// Threads.
    #[arg(long, default_value_t = default_workers())]
    workers: usize,
    /// Read at most this many bytes of text into memory first.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    max_bytes: u64,
    /// Timed passes over the text. The first pass is what a pack does (each document once, cold
    /// tokenizer caches); the best pass is reported too.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// JSONL field / column holding the text.
    #[arg(long, default_value = "text")]
    text_field: String,
}

pub fn tokenize_bench(a: TokenizeBenchArgs) -> Result<()> {
    let r = rsd_data::bench::tokenizer::run(&TokenizeBenchRequest {
        sources: a.sources,
        tokenizer: a.tokenizer,
        workers: a.workers,
        max_bytes: a.max_bytes,
        repeat: a.repeat,
        text_field: a.text_field,
    })?;
    let (best, first) = (r.best_seconds, r.first_seconds);
    println!(
        "{{\"engine\": \"{}\", \"workers\": {}, \"documents\": {}, \"bytes\": {}, \"tokens\": {}, \"seconds\": {best:.4}, \"tokens_per_s\": {:.0}, \"mb_per_s\": {:.2}, \"first_pass_seconds\": {first:.4}, \"first_pass_tokens_per_s\": {:.0}}}",
        r.engine,
        r.workers,
        r.documents,
        r.bytes,
        r.tokens,
        r.tokens as f64 / best,
        r.bytes as f64 / best / 1e6,
        r.tokens as f64 / first,
    );
    Ok(())
}
