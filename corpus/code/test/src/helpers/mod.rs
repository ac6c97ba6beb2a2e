//! Module with common helpers not directly related to tests
//! but used in `libtest`.

pub mod concurrency;
pub mod exit_code;
pub mod isatty;
pub mod metrics;
pub mod shuffle;
