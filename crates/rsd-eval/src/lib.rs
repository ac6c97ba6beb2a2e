//! rsd-eval: does a checkpoint's accuracy depend on where the evidence sits in a long prompt?
//!
//! * [`results`]: the records every command reads and writes (`results.jsonl`, one line per prompt).
//!
//! The `rsd-eval` binary (src/main.rs) only parses arguments and calls this library (docs/EVAL.md).

pub mod results;
