//! Where rsd-data looks for data and assets it is not given explicitly.
//!
//! **The data root** (`--data-root`, else `$RSD_DATA_ROOT`) is the folder that relative data
//! locations are resolved in: `rsd-data pack` looks up `prolong/<subset>` there (raw corpora:
//! `<root>/prolong-data-64K/…`), and `rsd-data stream --pipeline FILE` resolves the pipeline
//! file's relative shard directories there (`<root>/data/demo/books`). Setting the one
//! variable therefore moves both when all data lives under one folder. When neither is set the
//! two look in different places, because what they look for lives in different places by
//! convention: downloaded corpora under `./datasets` ([`CORPORA_DEFAULT`]), while pipeline files
//! name shard directories relative to the repository root ([`PIPELINES_DEFAULT`]).

use std::path::{Path, PathBuf};

/// Where raw corpora (`prolong/<subset>`) are looked up when no data root is given.
pub const CORPORA_DEFAULT: &str = "datasets";
/// Where a pipeline file's relative shard directories are resolved when no data root is given.
pub const PIPELINES_DEFAULT: &str = ".";

/// The data root: `given` (a `--data-root` flag), else `$RSD_DATA_ROOT`, else `unset_default`
/// ([`CORPORA_DEFAULT`] or [`PIPELINES_DEFAULT`]).
pub fn data_root(given: Option<&Path>, unset_default: &str) -> PathBuf {
    given
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("RSD_DATA_ROOT").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(unset_default))
}

/// The Llama-3 `tokenizer.json` that `scripts/setup.sh` fetches (its licence forbids bundling it):
/// in `$RSD_ASSETS`, else `~/.cache/rsd/assets`.
pub fn llama3_tokenizer() -> PathBuf {
    let assets = std::env::var_os("RSD_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/rsd/assets")
        });
    assets.join("llama3-tokenizer.json")
}
