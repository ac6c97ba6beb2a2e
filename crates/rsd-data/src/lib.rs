//! rsd-data: tokenize and pack corpora into rsd token shards.
//!
//! The pipeline has one stage per module, in the order data flows:
//!
//! * [`source`] — resolve `--src` (text dirs, code repos, JSONL[.zst], Parquet, Arrow IPC, MDS,
//!   `prolong/<subset>`) and read documents in a fixed order;
//! * [`tokenizer`] — the project's tokenizer type (HF `tokenizer.json`, fast pipeline encoder);
//! * [`pack`] — `fixed` windows or `mixed` best-fit packing;
//! * [`pipeline`] — the threads that join them, the resume journal, and the manifest;
//! * [`inspect`] — what a shard directory holds, for people.
//!
//! The shard format itself lives in `rsd-shard`.

pub mod error;
pub mod inspect;
pub mod pack;
pub mod pipeline;
pub mod source;
pub mod tokenizer;

pub use error::{DataError, Result};
