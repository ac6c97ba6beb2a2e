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

/// Bytes of memory this process may still take, as far as the machine says: the least of the
/// kernel's `MemAvailable` (`/proc/meminfo`), the room left under this process's cgroup limit
/// (`memory.max` less `memory.current`, cgroup v2) and the room left under its address-space
/// limit (`ulimit -v`, less what is mapped already). `None` where none of them is reported (not
/// Linux). Checked before a size read from a file is allocated, so that a too-large request is
/// an error naming the file rather than an aborted process.
pub fn available_bytes() -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mem = read("/proc/meminfo").and_then(|t| kib_field(&t, "MemAvailable:"));
    let cgroup = read("/proc/self/cgroup").and_then(|c| {
        let dir = c
            .lines()
            .find_map(|l| l.strip_prefix("0::"))?
            .trim()
            .to_string();
        let base = format!("/sys/fs/cgroup{dir}");
        cgroup_room(
            &read(&format!("{base}/memory.max"))?,
            &read(&format!("{base}/memory.current"))?,
        )
    });
    let address_space = read("/proc/self/limits").and_then(|limits| {
        let mapped = read("/proc/self/status").and_then(|s| kib_field(&s, "VmSize:"))?;
        address_space_room(&limits, mapped)
    });
    [mem, cgroup, address_space].into_iter().flatten().min()
}

/// A `Name:   123 kB` line of `/proc/meminfo` or `/proc/self/status`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// Room under a cgroup v2 limit: `memory.max` (a number, or `max` for none) less
/// `memory.current`.
fn cgroup_room(max: &str, current: &str) -> Option<u64> {
    let max: u64 = max.trim().parse().ok()?;
    let current: u64 = current.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// Room under the soft `Max address space` limit of `/proc/self/limits` (`unlimited`: none),
/// given `mapped` bytes mapped already.
fn address_space_room(limits: &str, mapped: u64) -> Option<u64> {
    let rest = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max address space"))?;
    let soft: u64 = rest.split_whitespace().next()?.parse().ok()?;
    Some(soft.saturating_sub(mapped))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_are_read_from_the_kernels_files() {
        let meminfo = "MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n";
        assert_eq!(kib_field(meminfo, "MemAvailable:"), Some(8_192_000_000));
        assert_eq!(kib_field(meminfo, "MemFree:"), None);
        assert_eq!(cgroup_room("max\n", "100\n"), None);
        assert_eq!(cgroup_room("1000\n", "100\n"), Some(900));
        assert_eq!(cgroup_room("1000\n", "2000\n"), Some(0));
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         4000000000           unlimited            bytes\n";
        assert_eq!(
            address_space_room(limits, 1_000_000_000),
            Some(3_000_000_000)
        );
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_room(unlimited, 1), None);
        // This machine reports at least MemAvailable.
        if cfg!(target_os = "linux") {
            assert!(available_bytes().is_some_and(|b| b > 0));
        }
    }
}
