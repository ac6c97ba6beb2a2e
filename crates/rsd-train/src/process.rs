//! Process-wide settings made first thing in `main`, before any thread starts.

/// Takes SLURM's task variables where srun started this process without torchrun, then applies
/// the allocator settings below.
pub fn set_up() {
    adopt_slurm_task();
    keep_large_allocations_on_heap();
    // Shard directories keep a file open per shard; a shell's soft limit is often 1,024.
    let _ = rsd_common::process_limits::raise_open_files_limit();
    if let Some(conf) =
        default_cuda_alloc_conf(std::env::var_os("PYTORCH_CUDA_ALLOC_CONF").as_deref())
    {
        // Read by the allocator when CUDA first initialises, later in this process (and by the
        // ranks `--nproc` launches, which inherit it). No other thread exists yet.
        std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
}

/// Exit status for a malformed SLURM variable or a launch that cannot work (usage errors).
const EXIT_USAGE: i32 = 2;

/// Exits with [`EXIT_USAGE`]. The step's other tasks exit so too, and srun's
/// `--kill-on-bad-exit` sends SIGTERM to those still running when the first ends: ignored here
/// (no handler is installed yet), so that every task reports the usage error's status, not 143.
fn exit_usage() -> ! {
    // SAFETY: sets a signal's disposition to ignore; no handler runs.
    unsafe {
        libc::signal(libc::SIGTERM, libc::SIG_IGN);
    }
    std::process::exit(EXIT_USAGE);
}

/// Under `srun` without torchrun (SLURM's variables, no `WORLD_SIZE`), exports torchrun's six
/// variables computed from SLURM's ([`rsd_dist::slurm`]), so that the rendezvous, the rank-0
/// checks and the launcher's "already launched" test downstream see one multi-process run, as
/// under torchrun. Rank 0 prints what it took from where. A malformed or inconsistent SLURM
/// variable, or `--nproc` in a step of several tasks, exits with status 2.
fn adopt_slurm_task() {
    let task = match rsd_dist::slurm::from_env() {
        Ok(Some(task)) => task,
        Ok(None) => return,
        Err(e) => {
            eprintln!("rsd-train: error: {e}");
            exit_usage();
        }
    };
    if let Some(nproc) = nproc_arg(std::env::args_os().skip(1)) {
        // Each of srun's tasks would start `nproc` ranks of its own: N × nproc processes.
        eprintln!(
            "rsd-train: error: --nproc {nproc} in a SLURM step of {} tasks (SLURM_NTASKS): srun \
             already started a rank per task: either use one task per GPU (`srun rsd-train …` \
             without --nproc), or --nproc inside a single task (--ntasks=1 on one node; \
             pipelines/slurm/README.md)",
            task.rendezvous.world_size
        );
        exit_usage();
    }
    for (name, value) in task.to_env() {
        // SAFETY (set_var): called first thing in main, before any thread exists.
        std::env::set_var(name, value);
    }
    if task.rendezvous.rank == 0 {
        eprintln!("rsd-train: {}", task.describe());
    }
}

/// The value of `--nproc N` / `--nproc=N` among `args` (the value as written), if given.
fn nproc_arg(args: impl IntoIterator<Item = std::ffi::OsString>) -> Option<String> {
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let a = a.to_string_lossy().into_owned();
        if a == "--nproc" {
            return Some(
                args.next()
                    .map_or_else(String::new, |v| v.to_string_lossy().into_owned()),
            );
        }
        if let Some(v) = a.strip_prefix("--nproc=") {
            return Some(v.to_string());
        }
        if a == "--" {
            return None;
        }
    }
    None
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
    fn nproc_is_found_in_either_spelling() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(
            nproc_arg(args(&["--config", "c.toml", "--nproc", "8"])),
            Some("8".into())
        );
        assert_eq!(
            nproc_arg(args(&["--nproc=4", "--out", "x"])),
            Some("4".into())
        );
        assert_eq!(nproc_arg(args(&["--config", "c.toml"])), None);
        assert_eq!(nproc_arg(args(&["--out", "--nprocs"])), None);
    }

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
