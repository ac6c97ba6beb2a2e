//! The measurements behind `rsd-data tokenize-bench` ([`tokenizer`]: the bare tokenizer rate, the
//! ceiling for a pack) and `rsd-data bench` ([`loader`]: the loader against the copies it cannot
//! beat). Each runs the measurement and hands back numbers; the binary formats them.

pub mod loader;
pub mod tokenizer;
