//! Counting of libtorch's CPU memory: a wrapper over c10's CPU allocator (`csrc/cpu_alloc.cpp`)
//! that keeps the bytes of live CPU tensor storages and their peak. `rsd-train memory --measure`
//! reads it to check the memory plan against what a step really allocates.
//!
//! Install it once, before the tensors to be counted exist ([`install`]); storages allocated
//! earlier are never counted, not even when freed. Not counted at all: memory libtorch takes
//! without its CPU allocator (oneDNN scratch pads, OpenMP thread stacks, direct `c10::alloc_cpu`
//! calls), the Gloo transport's own buffers, and CUDA memory.
//!
//! CUDA memory has its own counter: the caching allocator's statistics ([`cuda_memory`],
//! `csrc/device_alloc.cpp`), read the same way (live and peak, the peak restartable).

mod ffi {
    extern "C" {
        pub fn rsd_alloc_install() -> std::ffi::c_int;
        pub fn rsd_alloc_live() -> u64;
        pub fn rsd_alloc_peak() -> u64;
        pub fn rsd_alloc_count() -> u64;
        pub fn rsd_alloc_reset_peak() -> u64;
        pub fn rsd_cuda_memory(device: std::ffi::c_int, out: *mut u64) -> std::ffi::c_int;
        pub fn rsd_cuda_reset_peak(device: std::ffi::c_int) -> std::ffi::c_int;
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

/// What the CUDA caching allocator holds on one device, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaMemory {
    /// Held by live tensors now.
    pub allocated: u64,
    /// The most `allocated` has been since the allocator started or the last [`cuda_reset_peak`].
    pub peak_allocated: u64,
    /// Taken from the driver now: `allocated` plus the cache (what `nvidia-smi` shows, less the
    /// CUDA context and the libraries' workspaces).
    pub reserved: u64,
    /// The most `reserved` has been, likewise.
    pub peak_reserved: u64,
}

/// The caching allocator's counts for CUDA device `device`; `None` when there is no CUDA here,
/// CUDA is not initialised yet (no tensor was put on a GPU), or the device does not exist.
pub fn cuda_memory(device: usize) -> Option<CudaMemory> {
    let device = std::ffi::c_int::try_from(device).ok()?;
    let mut out = [0u64; 4];
    // SAFETY: `out` has the four slots the C side writes; it catches every C++ exception.
    let ok = unsafe { ffi::rsd_cuda_memory(device, out.as_mut_ptr()) } == 1;
    ok.then_some(CudaMemory {
        allocated: out[0],
        peak_allocated: out[1],
        reserved: out[2],
        peak_reserved: out[3],
    })
}

/// Starts new peaks on CUDA device `device` from the current counts; `false` when there is no
/// such device (as for [`cuda_memory`]).
pub fn cuda_reset_peak(device: usize) -> bool {
    let Ok(device) = std::ffi::c_int::try_from(device) else {
        return false;
    };
    // SAFETY: the C side catches every C++ exception.
    unsafe { ffi::rsd_cuda_reset_peak(device) == 1 }
}
