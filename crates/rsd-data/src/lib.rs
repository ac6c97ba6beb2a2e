//! rsd-data: tokenize and pack corpora into rsd token shards, and look at them.
//!
//! A pack's data flows through one module per stage:
//!
//! * [`source`] — resolve `--src` (text dirs, code repos, JSONL[.zst], Parquet, Arrow IPC, MDS,
//!   `prolong/<subset>`) and read documents in a fixed order;
//! * [`tokenizer`] — the project's tokenizer type (HF `tokenizer.json`, fast pipeline encoder);
//! * [`packer`] — `fixed` windows or `mixed` best-fit packing;
//! * [`pack`] — `rsd-data pack` as one call: the threads that join the stages, the resume
//!   journal, and the manifest.
//!
//! The other commands are one call each too: [`inspect`] (what a shard directory holds, for
//! people), [`stream`] (what the loader hands a rank), [`bench`] (tokenizer and loader rates).
//! [`paths`] says where data and assets are looked for. The shard format itself lives in
//! `rsd-shard`, the loader in `rsd-loader`.
#![deny(missing_docs)]

pub mod bench;
pub mod chat;
pub mod error;
pub mod inspect;
pub mod pack;
pub mod packer;
pub mod paths;
pub mod source;
pub mod stream;
pub mod tokenizer;

pub use error::{Cause, DataError, Result};
