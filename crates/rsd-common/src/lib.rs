//! Small leaf helpers that several rsd crates need and none of them owns: one deterministic
//! generator (the loader's shuffle keys, the model's initial weights and the trainer's
//! perturbation draws all derive from it), the process's memory counters (progress lines and
//! benchmarks), a median (benchmark reports), lowercase hex of digests, error text without libtorch's C++ backtraces
//! (binaries), strings from data made safe to print (`printable`: terminal control characters
//! escaped), and safe file access for data written by strangers (`safe_fs`: names confined to
//! their directory, regular files only, bounded reads, atomic writes that follow no planted link),
//! CPython's `random.Random` sampling (`pyrandom`: reproduces lm-eval's few-shot draws), and the
//! process's limits on open files and memory maps (`process_limits`).
//! Nothing rsd-specific.

pub mod digest;
pub mod mem;
pub mod printable;
pub mod process_limits;
pub mod progress;
pub mod pyrandom;
pub mod report;
pub mod rng;
pub mod safe_fs;
pub mod stats;

/// Lowercase hex of `bytes` (digests in manifests and run records).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
