//! Counting of libtorch's CPU memory: a wrapper over c10's CPU allocator (`csrc/cpu_alloc.cpp`)
//! that keeps the bytes of live CPU tensor storages and their peak. `rsd-train memory --measure`
//! reads it to check the memory plan against what a step really allocates.
//!
//! Install it once, before the tensors to be counted exist ([`install`]); storages allocated
//! earlier are never counted, not even when freed. Not counted at all: memory libtorch takes
//! without its CPU allocator (oneDNN scratch pads, OpenMP thread stacks, direct `c10::alloc_cpu`
//! calls), the Gloo transport's own buffers, and CUDA memory.

mod ffi {
    extern "C" {
        pub fn rsd_alloc_install() -> std::ffi::c_int;
        pub fn rsd_alloc_live() -> u64;
        pub fn rsd_alloc_peak() -> u64;
        pub fn rsd_alloc_count() -> u64;
        pub fn rsd_alloc_reset_peak() -> u64;
    }
}

/// Puts the counting allocator in front of libtorch's CPU allocator; later calls do nothing.
/// `true` when counting is active (`false`: the current allocator cannot be wrapped).
pub fn install() -> bool {
    // SAFETY: the C side installs at most once (std::call_once) and only reads c10 globals.
    unsafe { ffi::rsd_alloc_install() == 1 }
}

/// Bytes of CPU tensor storage allocated since [`install`] and not yet freed.
pub fn live_bytes() -> u64 {
    // SAFETY: an atomic load.
    unsafe { ffi::rsd_alloc_live() }
}

/// The most [`live_bytes`] has been since [`install`] or the last [`reset_peak`].
pub fn peak_bytes() -> u64 {
    // SAFETY: an atomic load.
    unsafe { ffi::rsd_alloc_peak() }
}

/// Allocations counted since [`install`].
pub fn allocations() -> u64 {
    // SAFETY: an atomic load.
    unsafe { ffi::rsd_alloc_count() }
}

/// Starts a new peak from the bytes live now; returns the peak it ends.
pub fn reset_peak() -> u64 {
    // SAFETY: atomic operations only.
    unsafe { ffi::rsd_alloc_reset_peak() }
}
