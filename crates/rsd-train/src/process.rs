//! Process-wide settings made first thing in `main`, before any thread starts.

/// Applies the allocator settings below.
pub fn set_up() {
    keep_large_allocations_on_heap();
    if let Some(conf) =
        default_cuda_alloc_conf(std::env::var_os("PYTORCH_CUDA_ALLOC_CONF").as_deref())
    {
        // Read by the allocator when CUDA first initialises, later in this process (and by the
        // ranks `--nproc` launches, which inherit it). No other thread exists yet.
        std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
}

/// Keeps libtorch's large CPU buffers (logit chunks, activations) on the heap between steps.
///
/// glibc serves every allocation above 32 MiB with a fresh `mmap` and returns it on free, so each
/// step re-faults and re-zeroes every large tensor, a sizeable share of a CPU step
/// (docs/BENCHMARKS.md, "rsd-train").
/// Serving them from the heap and not trimming it makes later steps reuse the pages. No effect
/// on CUDA memory (libtorch's caching allocator already reuses it).
fn keep_large_allocations_on_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// The CUDA caching allocator's setting rsd-train runs with when `PYTORCH_CUDA_ALLOC_CONF` is not
/// set (`None`: leave what is set, an empty value included, which is torch's default).
///
/// With expandable segments the allocator grows mapped segments instead of keeping a pool of
/// fixed-size blocks per phase. On an H200, Llama-3-8B's widths (4 layers, rsd, bf16) at 32K
/// tokens reserved 55.0 GiB with torch's default and 49.2 GiB with expandable segments, for the
/// same 47.9 GiB of live tensors at the peak (docs/GPU.md): the default exceeded the memory plan.
fn default_cuda_alloc_conf(current: Option<&std::ffi::OsStr>) -> Option<&'static str> {
    current.is_none().then_some("expandable_segments:True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_are_the_default_and_a_set_value_is_kept() {
        assert_eq!(
            default_cuda_alloc_conf(None),
            Some("expandable_segments:True")
        );
        assert_eq!(default_cuda_alloc_conf(Some("".as_ref())), None);
        assert_eq!(
            default_cuda_alloc_conf(Some("max_split_size_mb:512".as_ref())),
            None
        );
    }
}
