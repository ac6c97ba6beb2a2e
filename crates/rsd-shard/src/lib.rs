//! The rsd on-disk token shard format.
//!
//! A shard directory holds Megatron-compatible `.bin`/`.idx` pairs plus a manifest, `index.json`,
//! written last. One packed training sample is one Megatron *document*; each document piece inside
//! the sample is one Megatron *sequence*. That mapping gives document boundaries for free, keeps
//! reads zero-copy, and lets megatron-core's `IndexedDataset` open our output unchanged.
//!
//! * [`ShardWriter`] writes one pair under temporary names and renames it into place when done;
//!   [`ShardSetWriter`] rolls shards at a size target.
//! * [`ShardSet`] memory-maps a directory and hands out [`Sample`]s that borrow the mapped bytes.
//! * [`verify`] checks structure and checksums, naming the file and byte offset of any damage.
//! * Both open only the files the manifest names inside its directory, and only regular files
//!   (`rsd_common::safe_fs`; docs/UNTRUSTED.md).
//! * [`Manifest`] is the `index.json` schema.
//!
//! The full byte layout is in `docs/FORMAT.md`.

mod dtype;
mod error;
mod fsutil;
mod idx;
mod manifest;
mod reader;
pub mod tokenizer_match;
mod verify;
mod writer;

pub use dtype::TokenDtype;
pub use error::{Result, ShardError};
pub use idx::{IdxHeader, IDX_MAGIC, IDX_VERSION};
pub use manifest::{
    mask_prefix, BadInput, LossMaskInfo, Manifest, MaskFiles, PackMode, ShardInfo, SourceInfo,
    TokenizerInfo, Totals, FORMAT_NAME, FORMAT_VERSION, MANIFEST_FILE, TOKENIZER_FILE,
};
pub use reader::{Sample, Shard, ShardSet, TokenElem, Tokens};
pub use verify::{verify, VerifyOptions, VerifyReport};
pub use writer::{ShardSetWriter, ShardWriter};

/// The checksum recorded for every shard file (xxh3-64): fast enough to verify at memory speed.
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}
