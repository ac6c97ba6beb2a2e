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

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Kind, Tensor};

    // One test: the counters are process-wide, and tests run on parallel threads.
    #[test]
    fn counts_storages_exactly_and_the_peak_resets() {
        assert!(install());
        assert!(
            install(),
            "a second install is a no-op that still reports counting"
        );
        let before = live_bytes();
        let n = 3 * 1024 * 1024 + 7;
        let t = Tensor::zeros([n], (Kind::Float, tch::Device::Cpu));
        assert_eq!(live_bytes() - before, 4 * n as u64);
        // A view shares the storage: nothing new.
        let v = t.narrow(0, 10, 100);
        assert_eq!(live_bytes() - before, 4 * n as u64);
        drop(t);
        assert_eq!(
            live_bytes() - before,
            4 * n as u64,
            "the view keeps the storage"
        );
        drop(v);
        assert_eq!(live_bytes(), before);
        assert!(peak_bytes() >= before + 4 * n as u64);
        let old = reset_peak();
        assert!(old >= before + 4 * n as u64);
        assert_eq!(peak_bytes(), live_bytes());
        // bf16: 2 bytes a value; a temporary inside an op raises the peak, not the live bytes.
        let a = Tensor::ones([1000, 1000], (Kind::BFloat16, tch::Device::Cpu));
        let live = live_bytes();
        assert_eq!(live - before, 2_000_000);
        let s = (&a * 2.0 + 1.0).sum(Kind::Float);
        assert_eq!(s.double_value(&[]), 3_000_000.0);
        assert!(
            peak_bytes() >= live + 2_000_000,
            "the product's temporary counts at the peak"
        );
        drop(a);
        drop(s);
        assert_eq!(live_bytes(), before);
        // Storages resized in place are counted at their new size.
        let mut r = Tensor::zeros([10], (Kind::Float, tch::Device::Cpu));
        let _ = r.resize_([1 << 20]);
        assert_eq!(live_bytes() - before, 4 << 20);
        drop(r);
        assert_eq!(live_bytes(), before);
        assert!(allocations() > 0);
    }
}
