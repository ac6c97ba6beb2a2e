//! The per-process limits a directory of many shards meets first: open files (one descriptor per
//! shard stays open for `pread`) and memory maps (two or three per shard). A shell's default soft
//! limit on open files is often 1,024 while the hard limit allows far more, so binaries raise the
//! soft limit to the hard one at start ([`raise_open_files_limit`]); what is left is checked
//! before a shard directory is opened, so that a directory of too many shards is one clear error
//! up front instead of "Too many open files" (or a failed map) part-way through.

/// This process's limits on open files (soft and hard).
fn nofile() -> std::io::Result<libc::rlimit> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(lim)
}

/// Raises this process's soft limit on open files to its hard limit; an error only if the limits
/// cannot be read or set (then nothing changed).
pub fn raise_open_files_limit() -> std::io::Result<()> {
    let mut lim = nofile()?;
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: `lim` is a valid rlimit whose soft value does not exceed its hard value.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// This process's soft limit on open files, `None` when unlimited or unknown.
pub fn open_files_limit() -> Option<u64> {
    nofile()
        .ok()
        .filter(|l| l.rlim_cur != libc::RLIM_INFINITY)
        .map(|l| l.rlim_cur)
}

/// Files this process has open now (`/proc/self/fd`), `None` where that cannot be read.
pub fn open_files() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

/// The kernel's limit on a process's memory maps (`vm.max_map_count`), `None` where unknown.
pub fn max_map_count() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Memory maps this process holds now (lines of `/proc/self/maps`), `None` where unknown.
pub fn memory_maps() -> Option<u64> {
    let maps = std::fs::read("/proc/self/maps").ok()?;
    Some(maps.iter().filter(|&&b| b == b'\n').count() as u64)
}

/// What a process may still open, after keeping `reserve` for everything else it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headroom {
    /// Open files left (`None`: no known limit).
    pub files: Option<u64>,
    /// The soft limit on open files.
    pub files_limit: Option<u64>,
    /// Memory maps left (`None`: no known limit).
    pub maps: Option<u64>,
    /// `vm.max_map_count`.
    pub maps_limit: Option<u64>,
}

/// This process's headroom now, keeping `reserve_files` descriptors and `reserve_maps` maps for
/// everything else (libraries, sockets, threads' stacks, allocations).
pub fn headroom(reserve_files: u64, reserve_maps: u64) -> Headroom {
    let files_limit = open_files_limit();
    let maps_limit = max_map_count();
    Headroom {
        files: files_limit.map(|l| l.saturating_sub(open_files().unwrap_or(0) + reserve_files)),
        files_limit,
        maps: maps_limit.map(|l| l.saturating_sub(memory_maps().unwrap_or(0) + reserve_maps)),
        maps_limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counts_are_read_and_the_raise_reaches_the_hard_limit() {
        // A process has its three standard streams open, and maps of its own.
        assert!(open_files().is_some_and(|n| n >= 3));
        assert!(memory_maps().is_some_and(|n| n > 10));
        let before = nofile().unwrap();
        raise_open_files_limit().unwrap();
        let after = nofile().unwrap();
        assert_eq!(after.rlim_max, before.rlim_max);
        assert_eq!(
            after.rlim_cur, before.rlim_max,
            "the soft limit is the hard one"
        );
        assert_eq!(open_files_limit(), Some(after.rlim_cur));
        let h = headroom(10, 10);
        assert!(h.files.is_some_and(|f| f < after.rlim_cur));
    }
}
