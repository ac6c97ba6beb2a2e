//! Releasing the pages of copied-out rows with [`ReadMethod::Map`](crate::ReadMethod::Map).
//!
//! Copying a row out of the memory-mapped `.bin` faults its pages into this process; a long pass
//! would map the whole dataset and RSS would grow with the amount read. After the copy the loader
//! unmaps them again (`madvise(MADV_DONTNEED)`): the kernel's page cache keeps the data, and a later
//! read faults the pages back in. Releasing is best effort throughout: a failure or a wrong guess
//! only costs memory or a re-fault. `ReadMethod::Pread` maps nothing, so none of this runs
//! (docs/LOADER.md, "Memory").

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use rsd_shard::{Shard, ShardSet};

/// Release granularity: the kernel maps page-cache folios of up to 2 MiB with one page-table
/// entry, and releasing whole 2 MiB blocks avoids splitting those entries.
const RELEASE_BLOCK: usize = 2 << 20;

/// How far behind the cursor an in-order read may start before it counts as a new pass over the
/// file (another epoch) rather than a worker that lags a little.
const RESTART_LAG: usize = 64 << 20;

/// Block ranges released together by [`PageRelease::release_blocks_batched`]: each release of a
/// range ends with a TLB flush, which in a multi-threaded process interrupts every core running one
/// of its threads (a VM exit each, on a VM); one `process_madvise` call flushes once for all of
/// them. At most this many blocks (16 MiB) per shard set stay mapped waiting.
const RELEASE_BATCH: usize = 8;

/// Bytes `start..end` widened to the 2 MiB blocks they touch, clipped to a map of `len` bytes.
fn block_span(start: usize, end: usize, len: usize) -> (usize, usize) {
    let lo = start & !(RELEASE_BLOCK - 1);
    let hi = end.saturating_add(RELEASE_BLOCK - 1) & !(RELEASE_BLOCK - 1);
    (lo.min(len), hi.min(len))
}

fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as usize,
        _ => 4096,
    })
}

/// Unmap the pages covering bytes `start..end` of `shard`'s `.bin` from this process
/// (`madvise(MADV_DONTNEED)`). The start is rounded down to a page boundary (and the kernel rounds
/// the length up), so pages shared with neighbouring samples are released too; rereading them is
/// cheap.
pub(crate) fn release_range(shard: &Shard, start: usize, end: usize) {
    let bin = shard.bin_bytes();
    let (lo, hi) = (start.min(bin.len()), end.min(bin.len()));
    if hi <= lo {
        return;
    }
    let addr = bin.as_ptr() as usize + lo;
    let misalign = addr % page_size();
    // SAFETY: the range lies inside the shard's read-only file mapping (the map starts on a page,
    // so rounding down stays inside it), which lives as long as `shard`. MADV_DONTNEED on it only
    // drops our page-table entries; later reads see the file's contents again. No `&mut` views of
    // the map exist.
    unsafe {
        libc::madvise(
            (addr - misalign) as *mut libc::c_void,
            hi - lo + misalign,
            libc::MADV_DONTNEED,
        )
    };
}

/// Release the whole 2 MiB blocks that bytes `start..end` touch. Releasing only a sample's own
/// bytes inside a block the kernel mapped with one 2 MiB entry splits that entry and can leave the
/// rest of the block mapped, so a shuffled pass would keep a share of every shard mapped and RSS
/// would grow with the dataset. Neighbouring samples that are still needed just fault back in.
pub(crate) fn release_blocks(shard: &Shard, start: usize, end: usize) {
    let (lo, hi) = block_span(start, end, shard.bin_bytes().len());
    release_range(shard, lo, hi);
}

/// The release state of one opened shard set: a cursor per shard for in-order passes, and the
/// blocks waiting to be released together in shuffled ones.
pub(crate) struct PageRelease {
    /// Per shard, [`PageRelease::release_behind`]'s cursor: bytes below it have been released.
    released_below: Vec<AtomicUsize>,
    /// Block ranges `(shard, start, end)` waiting for [`PageRelease::release_blocks_batched`].
    pending: Mutex<Vec<(usize, usize, usize)>>,
}

impl PageRelease {
    /// Nothing released yet in any of `set`'s shards.
    pub(crate) fn new(set: &ShardSet) -> PageRelease {
        PageRelease {
            released_below: set.shards().iter().map(|_| AtomicUsize::new(0)).collect(),
            pending: Mutex::new(Vec::new()),
        }
    }

    /// Drop a copied-out row (bytes `start..end` of shard `k` of `set`) from this process's
    /// mapping. In file order, whole 2 MiB blocks behind a cursor; shuffled, the row's blocks,
    /// batched.
    pub(crate) fn release_row(
        &self,
        set: &ShardSet,
        k: usize,
        start: usize,
        end: usize,
        in_file_order: bool,
    ) {
        if in_file_order {
            self.release_behind(set, k, start, end);
        } else {
            self.release_blocks_batched(set, k, start, end);
        }
    }

    /// Release for a reader going through shard `k` in order (sequential sampling): instead of
    /// unmapping each sample's own bytes (a page-table split and a re-fault per sample, costing
    /// about half as much as the copy itself), move a cursor and unmap whole 2 MiB blocks once
    /// reads have moved past them. Call it after copying bytes `start..end` out. A read that starts
    /// behind the cursor (a worker lagging another) releases its own blocks ([`release_blocks`]);
    /// one far behind (a new epoch) also releases what the previous pass left mapped and restarts
    /// the cursor. What stays mapped is bounded by a block, the samples in flight and the lag, not
    /// by the amount read.
    pub(crate) fn release_behind(&self, set: &ShardSet, k: usize, start: usize, end: usize) {
        let (Some(shard), Some(released_below)) = (set.shards().get(k), self.released_below.get(k))
        else {
            return;
        };
        let block = start & !(RELEASE_BLOCK - 1);
        let mut cursor = released_below.load(Ordering::Relaxed);
        loop {
            let (new_cursor, release) = if start >= cursor {
                if block <= cursor {
                    return;
                }
                (block, cursor..block)
            } else if cursor - start > RESTART_LAG {
                (block, cursor..shard.bin_bytes().len())
            } else {
                release_blocks(shard, start, end);
                return;
            };
            match released_below.compare_exchange(
                cursor,
                new_cursor,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    release_range(shard, release.start, release.end);
                    return;
                }
                Err(now) => cursor = now,
            }
        }
    }

    /// [`release_blocks`] for shard `k` of `set`, batched: ranges are collected and released
    /// [`RELEASE_BATCH`] at a time with one `process_madvise(MADV_DONTNEED)` (one TLB flush), or
    /// range by range where the kernel does not allow that. Up to `RELEASE_BATCH` blocks of the set
    /// stay mapped meanwhile; a shard index out of range is ignored.
    pub(crate) fn release_blocks_batched(
        &self,
        set: &ShardSet,
        k: usize,
        start: usize,
        end: usize,
    ) {
        let Some(shard) = set.shards().get(k) else {
            return;
        };
        let (lo, hi) = block_span(start, end, shard.bin_bytes().len());
        if hi <= lo {
            return;
        }
        let batch = {
            let Ok(mut pending) = self.pending.lock() else {
                return release_range(shard, lo, hi);
            };
            pending.push((k, lo, hi));
            if pending.len() < RELEASE_BATCH {
                return;
            }
            std::mem::take(&mut *pending)
        };
        if !process_madvise(set, &batch) {
            for &(k, lo, hi) in &batch {
                release_range(&set.shards()[k], lo, hi);
            }
        }
    }
}

/// A pidfd for this process, for `process_madvise` (which allows `MADV_DONTNEED` on the calling
/// process from Linux 6.13 and batches the TLB flushes from 6.16); `None` if it cannot be opened.
/// Kept per pid: after a `fork` the inherited descriptor names the parent, so the child opens its
/// own (the kernel would refuse `MADV_DONTNEED` on another process anyway).
fn self_pidfd() -> Option<i32> {
    static PIDFD: Mutex<Option<(i32, i32)>> = Mutex::new(None);
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut cached = PIDFD.lock().ok()?;
    match *cached {
        Some((p, fd)) if p == pid => Some(fd),
        stale => {
            if let Some((_, fd)) = stale {
                // SAFETY: `fd` is our copy of the parent's pidfd, owned by this cache alone.
                unsafe { libc::close(fd) };
            }
            // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
            *cached = (fd >= 0).then_some((pid, fd as i32));
            cached.map(|(_, fd)| fd)
        }
    }
}

/// Set when `process_madvise` refused `MADV_DONTNEED` once: later batches go range by range.
static PROCESS_MADVISE_REFUSED: AtomicBool = AtomicBool::new(false);

/// Release all `(shard, start, end)` block ranges of `set` with one `process_madvise`; false if
/// not done.
fn process_madvise(set: &ShardSet, ranges: &[(usize, usize, usize)]) -> bool {
    if PROCESS_MADVISE_REFUSED.load(Ordering::Relaxed) {
        return false;
    }
    let Some(pidfd) = self_pidfd() else {
        return false;
    };
    let iov: Vec<libc::iovec> = ranges
        .iter()
        .map(|&(k, lo, hi)| libc::iovec {
            // Page-aligned: the map starts on a page and `lo` is a block boundary.
            iov_base: set.shards()[k].bin_bytes().as_ptr().wrapping_add(lo) as *mut libc::c_void,
            iov_len: hi - lo,
        })
        .collect();
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    // SAFETY: every range lies inside a read-only file mapping owned by `set` (so it stays mapped
    // for the call); MADV_DONTNEED on it only drops our page-table entries, and later reads see
    // the file again. No `&mut` views of the maps exist.
    let done = unsafe {
        libc::syscall(
            libc::SYS_process_madvise,
            pidfd,
            iov.as_ptr(),
            iov.len(),
            libc::MADV_DONTNEED,
            0u32,
        )
    };
    if done < 0 {
        PROCESS_MADVISE_REFUSED.store(true, Ordering::Relaxed);
    }
    done >= 0 && done as usize == total
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::synth::{self, SynthSpec};

    /// 48 MiB of uint16 tokens in samples of 64K tokens (128 KiB), one shard, and its `.bin` path
    /// as `smaps` names it; `None` where `/proc/self/smaps` cannot be read.
    fn big_shard(dir: &Path) -> Option<(ShardSet, PathBuf)> {
        let spec = SynthSpec {
            samples: 384,
            seq_len: 65_536,
            vocab: 60_000,
            shard_bytes: 1 << 40,
            ..SynthSpec::default()
        };
        synth::write(dir, &spec).unwrap();
        let set = ShardSet::open(dir).unwrap();
        assert_eq!(set.shards().len(), 1);
        let bin = std::fs::canonicalize(set.shards()[0].bin_path()).unwrap();
        rsd_common::mem::mapped_kib(&bin)?;
        Some((set, bin))
    }

    /// Read every page of the samples in `order` (as copies out of the map do), calling `release`
    /// with each sample's byte range after it; returns the most KiB of the `.bin` mapped at any
    /// point.
    fn read_and_release(shard: &Shard, order: &[usize], release: impl Fn(usize, usize)) -> u64 {
        let bin = std::fs::canonicalize(shard.bin_path()).unwrap();
        let mut max_kib = 0;
        let mut sum = 0u64;
        for &i in order {
            let (_, _, lo, hi) = shard.sample_span(i).unwrap();
            sum += shard.bin_bytes()[lo..hi]
                .iter()
                .step_by(4096)
                .map(|&b| b as u64)
                .sum::<u64>();
            release(lo, hi);
            max_kib = max_kib.max(rsd_common::mem::mapped_kib(&bin).unwrap());
        }
        assert!(sum > 0);
        max_kib
    }

    #[test]
    fn release_behind_keeps_an_in_order_pass_mapped_to_a_few_blocks() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((set, bin)) = big_shard(tmp.path()) else {
            return; // no /proc: nothing to measure
        };
        let pages = PageRelease::new(&set);
        let shard = &set.shards()[0];
        // In order twice (the second pass is a new epoch); in the second, every fifth read is
        // followed by one of a worker two samples behind, whose pages must be released too, not
        // leaked.
        let n = shard.num_samples();
        let mut order: Vec<usize> = (0..n).collect();
        for i in 0..n {
            order.push(i);
            if i >= 2 && i % 5 == 0 {
                order.push(i - 2);
            }
        }
        let max_kib = read_and_release(shard, &order, |lo, hi| {
            pages.release_behind(&set, 0, lo, hi)
        });
        // At most the current 2 MiB block, the block the sample reaches into, and a lagging
        // sample; without release a pass maps all 48 MiB.
        assert!(max_kib <= 6 * 1024, "{max_kib} KiB mapped at most");
        // What is left at the end is the last block, not the file.
        assert!(rsd_common::mem::mapped_kib(&bin).unwrap() <= 4 * 1024);
        // The same pass without release maps the whole file: the measurement can fail.
        read_and_release(shard, &order[..n], |_, _| {});
        assert!(rsd_common::mem::mapped_kib(&bin).unwrap() >= 40 * 1024);
    }

    #[test]
    fn release_blocks_keeps_a_shuffled_pass_mapped_to_a_few_blocks_batched_or_not() {
        let tmp = tempfile::tempdir().unwrap();
        let Some((set, bin)) = big_shard(tmp.path()) else {
            return; // no /proc: nothing to measure
        };
        let pages = PageRelease::new(&set);
        let shard = &set.shards()[0];
        let n = shard.num_samples();
        // A fixed pseudo-random order (multiplier coprime with n).
        let order: Vec<usize> = (0..n).map(|k| (k * 173 + 11) % n).collect();
        let max_kib = read_and_release(shard, &order, |lo, hi| release_blocks(shard, lo, hi));
        assert!(max_kib <= 4 * 1024, "{max_kib} KiB mapped at most");
        assert!(rsd_common::mem::mapped_kib(&bin).unwrap() <= 2 * 1024);
        // Batched through the set: at most 8 blocks wait, plus the one being read.
        let max_kib = read_and_release(shard, &order, |lo, hi| {
            pages.release_blocks_batched(&set, 0, lo, hi)
        });
        assert!(max_kib <= 9 * 2 * 1024, "{max_kib} KiB mapped at most");
        // Without any release the same order maps the whole file: the measurement can fail.
        read_and_release(shard, &order, |_, _| {});
        assert!(rsd_common::mem::mapped_kib(&bin).unwrap() >= 40 * 1024);
    }
}
