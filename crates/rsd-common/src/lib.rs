//! Small leaf helpers that several rsd crates need and none of them owns: one deterministic
//! generator (the loader's shuffle keys, the model's initial weights and the trainer's
//! perturbation draws all derive from it), the process's memory counters (progress lines and
//! benchmarks), a median (benchmark reports), and error text without libtorch's C++ backtraces
//! (binaries). No dependencies, nothing rsd-specific.

pub mod mem;
pub mod report;
pub mod rng;
pub mod stats;
