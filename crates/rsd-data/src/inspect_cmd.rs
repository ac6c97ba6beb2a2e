//! `rsd-data inspect` and `rsd-data verify`: what a shard directory holds, and whether it is whole.
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use rsd_common::printable::{printable, printable_text};
use rsd_common::safe_fs::{self, NamedBy};
use rsd_data::tokenizer::{Delimiter, Tokenizer, BUNDLED_NAME};
use rsd_shard::{ShardSet, VerifyOptions};

#[derive(Args)]
pub struct InspectArgs {
    /// Shard directory.
    dir: PathBuf,
    /// Global sample index to decode and print (repeatable).
    #[arg(long = "sample", default_values_t = [0u64])]
    samples: Vec<u64>,
    /// Characters of decoded text to print per sample.
    #[arg(long, default_value_t = 600)]
    chars: usize,
    /// Tokenizer to decode with (default: the one the manifest names, if it is found and its sha256 matches).
    #[arg(long)]
    tokenizer: Option<String>,
}

#[derive(Args)]
pub struct VerifyArgs {
    /// Shard directory.
    dir: PathBuf,
    /// Skip recomputing checksums (structure and sizes are still checked).
    #[arg(long)]
    no_checksums: bool,
    /// Skip checking that every id is below the vocabulary size.
    #[arg(long)]
    no_token_range: bool,
}

fn matching_tokenizer(set: &ShardSet, given: Option<String>) -> Result<Option<Tokenizer>> {
    let info = &set.manifest().tokenizer;
    // The directory's own copy of its tokenizer first (written by every pack since it carried
    // one), else the file the manifest names — but only a file inside the shard directory: the
    // manifest may come from anyone, and its name must not make us read elsewhere.
    let own = set.dir().join(rsd_shard::TOKENIZER_FILE);
    let spec = match given {
        Some(g) => g,
        None if own.is_file() => own.display().to_string(),
        None if info.name == BUNDLED_NAME => info.name.clone(),
        None => {
            let named_by = NamedBy::new(set.dir().join(rsd_shard::MANIFEST_FILE), "tokenizer.name");
            match safe_fs::confined_file(set.dir(), &info.name, &named_by) {
                Ok(path) => path.display().to_string(),
                Err(e) => {
                    eprintln!(
                        "note: not decoding: {}; pass --tokenizer FILE",
                        printable(&e.to_string())
                    );
                    return Ok(None);
                }
            }
        }
    };
    let tok = match Tokenizer::load(&spec, &Delimiter::None, &Delimiter::None) {
        Ok(t) => t,
        Err(_) => return Ok(None),
    };
    if tok.sha256() != info.sha256 {
        eprintln!("note: {} is not the tokenizer these shards were made with (sha256 differs); not decoding", printable(tok.name()));
        return Ok(None);
    }
    Ok(Some(tok))
}

pub fn inspect(a: InspectArgs) -> Result<()> {
    let set = ShardSet::open(&a.dir)?;
    let tok = matching_tokenizer(&set, a.tokenizer)?;
    print!(
        "{}",
        rsd_data::inspect::report(&set, tok.as_ref(), &a.samples, a.chars)?
    );
    Ok(())
}

pub fn verify(a: VerifyArgs) -> Result<()> {
    let start = Instant::now();
    let opts = VerifyOptions {
        checksums: !a.no_checksums,
        token_range: !a.no_token_range,
    };
    let report = rsd_shard::verify(&a.dir, opts)
        .with_context(|| format!("{} failed verification", a.dir.display()))?;
    // Warnings quote the manifest: escape its control characters.
    for w in &report.warnings {
        eprintln!("warning: {}", printable_text(w));
    }
    println!(
        "ok: {} — {} shards, {} samples, {} tokens, {:.1} MB checked in {:.2}s",
        printable(&a.dir.display().to_string()),
        report.shards,
        report.samples,
        report.tokens,
        report.bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    );
    Ok(())
}
