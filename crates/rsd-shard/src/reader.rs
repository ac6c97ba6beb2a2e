use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use memmap2::Mmap;

use crate::dtype::TokenDtype;
use crate::error::{Result, ShardError};
use crate::idx::{i32_at, i64_at, IdxHeader};
use crate::manifest::Manifest;

/// A sample's token ids, borrowed from the mapped `.bin` in its stored width.
#[derive(Debug, Clone, Copy)]
pub enum Tokens<'a> {
    /// uint16 storage.
    U16(&'a [u16]),
    /// int32 storage.
    I32(&'a [i32]),
}

impl<'a> Tokens<'a> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Tokens::U16(t) => t.len(),
            Tokens::I32(t) => t.len(),
        }
    }
    /// True when there are no tokens.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Token `i` as u32. Panics if `i` is out of range, like slice indexing.
    pub fn get(&self, i: usize) -> u32 {
        match self {
            Tokens::U16(t) => t[i] as u32,
            Tokens::I32(t) => t[i] as u32,
        }
    }
    /// Append the tokens to `out`, widened to u32.
    pub fn extend_into(&self, out: &mut Vec<u32>) {
        match self {
            Tokens::U16(t) => out.extend(t.iter().map(|&x| x as u32)),
            Tokens::I32(t) => out.extend(t.iter().map(|&x| x as u32)),
        }
    }
    /// The tokens widened to u32.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.len());
        self.extend_into(&mut v);
        v
    }
    /// The raw little-endian bytes, as stored.
    pub fn as_bytes(&self) -> &'a [u8] {
        // SAFETY: u16/i32 slices are plain data; viewing them as bytes is always valid.
        unsafe {
            match self {
                Tokens::U16(t) => std::slice::from_raw_parts(t.as_ptr().cast(), t.len() * 2),
                Tokens::I32(t) => std::slice::from_raw_parts(t.as_ptr().cast(), t.len() * 4),
            }
        }
    }
}

/// The element types token ids are read into: `u16` from uint16 shards, `i32` from int32 shards
/// (the stored width, so reading is a plain byte copy).
pub trait TokenElem: Copy + private::Sealed {
    /// The shard dtype this type holds.
    const DTYPE: TokenDtype;
}
impl TokenElem for u16 {
    const DTYPE: TokenDtype = TokenDtype::Uint16;
}
impl TokenElem for i32 {
    const DTYPE: TokenDtype = TokenDtype::Int32;
}
mod private {
    pub trait Sealed {}
    impl Sealed for u16 {}
    impl Sealed for i32 {}
}

/// One packed sample: its tokens and the lengths of the document pieces inside it.
#[derive(Debug, Clone)]
pub struct Sample<'a> {
    /// The tokens, zero-copy from the mapped `.bin`.
    pub tokens: Tokens<'a>,
    /// Lengths of consecutive document pieces; they sum to `tokens.len()`.
    pub pieces: Vec<u32>,
}

/// One memory-mapped `.bin`/`.idx` pair.
pub struct Shard {
    bin_path: PathBuf,
    idx_path: PathBuf,
    bin: Mmap,
    /// The `.bin` opened for `pread` ([`Shard::append_tokens`]): copies that leave the map alone.
    bin_file: File,
    idx: Mmap,
    header: IdxHeader,
    /// [`Shard::release_behind`]'s cursor: bytes below it have been released.
    released_below: AtomicUsize,
}

/// Release granularity for in-order reads: the kernel maps page-cache folios of up to 2 MiB with
/// one page-table entry, and releasing whole 2 MiB blocks avoids splitting those entries.
const RELEASE_BLOCK: usize = 2 << 20;

/// Bytes `start..end` widened to the 2 MiB blocks they touch, clipped to a map of `len` bytes.
fn block_span(start: usize, end: usize, len: usize) -> (usize, usize) {
    let lo = start & !(RELEASE_BLOCK - 1);
    let hi = end.saturating_add(RELEASE_BLOCK - 1) & !(RELEASE_BLOCK - 1);
    (lo.min(len), hi.min(len))
}
/// How far behind the cursor an in-order read may start before it counts as a new pass over the
/// file (another epoch) rather than a worker that lags a little.
const RESTART_LAG: usize = 64 << 20;

fn map(path: &Path) -> Result<(Mmap, File)> {
    let file = File::open(path).map_err(|e| ShardError::io(path, e))?;
    // SAFETY: shards are written once and renamed into place; nothing rewrites them in place.
    // A file truncated under us would fault, which is the documented mmap caveat.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| ShardError::io(path, e))?;
    Ok((map, file))
}

impl Shard {
    /// Map `<prefix>.bin` and `<prefix>.idx` and check the header and both files' sizes.
    pub fn open(prefix: &Path) -> Result<Shard> {
        let bin_path = prefix.with_extension("bin");
        let idx_path = prefix.with_extension("idx");
        let (idx, _) = map(&idx_path)?;
        let header = IdxHeader::parse(&idx, &idx_path)?;
        let (bin, bin_file) = map(&bin_path)?;
        let shard = Shard {
            bin_path,
            idx_path,
            bin,
            bin_file,
            idx,
            header,
            released_below: AtomicUsize::new(0),
        };
        shard.check_ends()?;
        Ok(shard)
    }

    /// O(1) checks that catch truncation and most header damage: the index array starts at 0 and
    /// ends at the sequence count, and the last sequence ends exactly at the end of the `.bin`.
    fn check_ends(&self) -> Result<()> {
        let h = &self.header;
        let first = i64_at(&self.idx, h.doc_index_offset());
        let last = i64_at(
            &self.idx,
            h.doc_index_offset() + 8 * (h.document_count as usize - 1),
        );
        if first != 0 || last != h.sequence_count as i64 {
            return Err(ShardError::corrupt(
                &self.idx_path,
                h.doc_index_offset() as u64,
                format!(
                    "document index runs {first}..{last}, expected 0..{}",
                    h.sequence_count
                ),
            ));
        }
        let expected_bin = if h.sequence_count == 0 {
            0
        } else {
            let n = h.sequence_count as usize - 1;
            let ptr = self.pointer(n);
            let len = self.length(n);
            if ptr < 0 || len < 0 {
                return Err(ShardError::corrupt(
                    &self.idx_path,
                    h.pointers_offset() as u64 + 8 * n as u64,
                    "negative pointer or length",
                ));
            }
            ptr as u64 + len as u64 * h.dtype.size() as u64
        };
        if self.bin.len() as u64 != expected_bin {
            return Err(ShardError::corrupt(
                &self.bin_path,
                (self.bin.len() as u64).min(expected_bin),
                format!(
                    "file is {} bytes, but its .idx says the tokens end at byte {expected_bin}",
                    self.bin.len()
                ),
            ));
        }
        Ok(())
    }

    /// Number of samples.
    pub fn num_samples(&self) -> usize {
        self.header.document_count as usize - 1
    }
    /// Number of document pieces.
    pub fn num_pieces(&self) -> usize {
        self.header.sequence_count as usize
    }
    /// Token dtype.
    pub fn dtype(&self) -> TokenDtype {
        self.header.dtype
    }
    /// Path of the `.bin`.
    pub fn bin_path(&self) -> &Path {
        &self.bin_path
    }
    /// Path of the `.idx`.
    pub fn idx_path(&self) -> &Path {
        &self.idx_path
    }
    /// The whole mapped `.bin`.
    pub fn bin_bytes(&self) -> &[u8] {
        &self.bin
    }
    /// The whole mapped `.idx`.
    pub fn idx_bytes(&self) -> &[u8] {
        &self.idx
    }
    /// The parsed `.idx` header.
    pub fn header(&self) -> &IdxHeader {
        &self.header
    }

    pub(crate) fn length(&self, seq: usize) -> i32 {
        i32_at(&self.idx, self.header.lengths_offset() + 4 * seq)
    }
    pub(crate) fn pointer(&self, seq: usize) -> i64 {
        i64_at(&self.idx, self.header.pointers_offset() + 8 * seq)
    }
    pub(crate) fn doc_index(&self, i: usize) -> i64 {
        i64_at(&self.idx, self.header.doc_index_offset() + 8 * i)
    }

    /// The sequence range `[first, end)` and byte range of sample `i`, checked against the files.
    pub fn sample_span(&self, i: usize) -> Result<(usize, usize, usize, usize)> {
        if i >= self.num_samples() {
            return Err(ShardError::Invalid(format!(
                "{}: sample {i} out of range (the shard has {})",
                self.idx_path.display(),
                self.num_samples()
            )));
        }
        let off = self.header.doc_index_offset() as u64 + 8 * i as u64;
        let (first, end) = (self.doc_index(i), self.doc_index(i + 1));
        if first < 0 || end <= first || end as u64 > self.header.sequence_count {
            return Err(ShardError::corrupt(
                &self.idx_path,
                off,
                format!("sample {i} spans sequences {first}..{end}"),
            ));
        }
        let (first, end) = (first as usize, end as usize);
        let start = self.pointer(first);
        let mut tokens: i64 = 0;
        for s in first..end {
            let len = self.length(s);
            if len <= 0 {
                let at = self.header.lengths_offset() as u64 + 4 * s as u64;
                return Err(ShardError::corrupt(
                    &self.idx_path,
                    at,
                    format!("sequence {s} has length {len}"),
                ));
            }
            tokens += len as i64;
        }
        let size = self.header.dtype.size() as i64;
        let byte_end = start.checked_add(tokens * size).unwrap_or(i64::MAX);
        if start < 0 || start % size != 0 || byte_end as u64 > self.bin.len() as u64 {
            let at = self.header.pointers_offset() as u64 + 8 * first as u64;
            return Err(ShardError::corrupt(
                &self.idx_path,
                at,
                format!(
                    "sample {i} points at bytes {start}..{byte_end} of a {}-byte .bin",
                    self.bin.len()
                ),
            ));
        }
        Ok((first, end, start as usize, byte_end as usize))
    }

    /// Unmap the pages covering bytes `start..end` of the `.bin` from this process
    /// (`madvise(MADV_DONTNEED)`), so a long sequential or shuffled pass does not grow RSS. The
    /// kernel's page cache keeps the data; a later read faults the pages back in. Best effort:
    /// failures are ignored because the only cost is memory.
    pub fn release_bin_range(&self, start: usize, end: usize) {
        // memmap2 rounds the start down to a page boundary (and the kernel rounds the length up),
        // so pages shared with neighbouring samples are released too; rereading them is cheap.
        let (lo, hi) = (start.min(self.bin.len()), end.min(self.bin.len()));
        if hi <= lo {
            return;
        }
        // SAFETY: the map is a read-only file mapping; MADV_DONTNEED on it only drops our page
        // table entries, and later reads see the file's contents again. No `&mut` views exist.
        let _ = unsafe {
            self.bin
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
        };
    }

    /// Release the whole 2 MiB blocks that bytes `start..end` touch. Releasing only a sample's own
    /// bytes inside a block the kernel mapped with one 2 MiB entry splits that entry and can leave
    /// the rest of the block mapped: measured here, a shuffled pass over a 1 GiB shard released per
    /// sample kept ~57 MiB mapped (per shard, so RSS grew with the dataset), against ~2 MiB when
    /// whole blocks are released. Neighbouring samples that are still needed just fault back in.
    pub fn release_blocks(&self, start: usize, end: usize) {
        let (lo, hi) = block_span(start, end, self.bin.len());
        self.release_bin_range(lo, hi);
    }

    /// Release for a reader going through the file in order (sequential sampling): instead of
    /// unmapping each sample's own bytes (which costs a page-table split and a re-fault per sample:
    /// ~4 µs against a 128 KiB copy of ~8 µs), move a cursor and unmap whole 2 MiB blocks once
    /// reads have moved past them. Call it after copying bytes `start..end` out. A read that starts
    /// behind the cursor (a worker lagging another) releases its own blocks
    /// ([`Shard::release_blocks`]); one far behind (a new epoch) also releases what the
    /// previous pass left mapped and restarts the cursor. What stays mapped is bounded by a block,
    /// the samples in flight and the lag, not by the amount read. Best effort, like
    /// [`Shard::release_bin_range`]: a wrong guess only costs a re-fault.
    pub fn release_behind(&self, start: usize, end: usize) {
        let block = start & !(RELEASE_BLOCK - 1);
        let mut cursor = self.released_below.load(Ordering::Relaxed);
        loop {
            let (new_cursor, release) = if start >= cursor {
                if block <= cursor {
                    return;
                }
                (block, cursor..block)
            } else if cursor - start > RESTART_LAG {
                (block, cursor..self.bin.len())
            } else {
                self.release_blocks(start, end);
                return;
            };
            match self.released_below.compare_exchange(
                cursor,
                new_cursor,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.release_bin_range(release.start, release.end);
                    return;
                }
                Err(now) => cursor = now,
            }
        }
    }

    /// Append the tokens stored at bytes `start..end` of the `.bin` to `out`, read with `pread`
    /// straight into `out`'s spare capacity: one copy from the page cache, like copying out of the
    /// map, but without touching this process's page tables — nothing to fault in per sample, and
    /// nothing to release afterwards, so RSS does not grow with the amount read (see
    /// docs/LOADER.md, "Reading"). `T` must match the shard's dtype and the range its element size.
    pub fn append_tokens<T: TokenElem>(
        &self,
        start: usize,
        end: usize,
        out: &mut Vec<T>,
    ) -> Result<()> {
        let n = self.token_count::<T>(start, end)?;
        out.reserve(n);
        let spare = &mut out.spare_capacity_mut()[..n];
        // SAFETY: a slice of `MaybeUninit<T>` viewed as its `n * size` bytes, which may be
        // uninitialised either way; `T` (u16/i32) has no padding and is at least byte-aligned.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                spare.as_mut_ptr().cast::<MaybeUninit<u8>>(),
                n * std::mem::size_of::<T>(),
            )
        };
        self.pread_bin(start, bytes)?;
        // SAFETY: `pread_bin` wrote all `n * size` bytes, and every bit pattern is a valid u16/i32.
        unsafe { out.set_len(out.len() + n) };
        Ok(())
    }

    /// Fill `dst` with the tokens stored from byte `start` of the `.bin` on, read with `pread`
    /// (like [`Shard::append_tokens`], into storage the caller owns, e.g. aligned buffers).
    pub fn read_tokens<T: TokenElem>(&self, start: usize, dst: &mut [T]) -> Result<()> {
        let end = start.saturating_add(std::mem::size_of_val(dst));
        self.token_count::<T>(start, end)?;
        // SAFETY: `dst`'s bytes, viewed as possibly-uninitialised bytes; `pread_bin` only writes
        // initialised bytes into them, and every bit pattern is a valid u16/i32.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<MaybeUninit<u8>>(), end - start)
        };
        self.pread_bin(start, bytes)
    }

    /// Tokens of type `T` in bytes `start..end`, after checking that `T` is the shard's dtype and
    /// the range is whole tokens.
    fn token_count<T: TokenElem>(&self, start: usize, end: usize) -> Result<usize> {
        let size = std::mem::size_of::<T>();
        let aligned = start.is_multiple_of(size) && end.is_multiple_of(size);
        if T::DTYPE != self.header.dtype || !aligned || end < start {
            return Err(ShardError::Invalid(format!(
                "{}: cannot read bytes {start}..{end} as {} tokens (the shard holds {})",
                self.bin_path.display(),
                T::DTYPE.name(),
                self.header.dtype.name()
            )));
        }
        Ok((end - start) / size)
    }

    /// Fill `dst` with the `.bin`'s bytes from `start` on (`pread`, retried when interrupted or
    /// short). A file that ends early (truncated after it was opened) is named with the offset.
    fn pread_bin(&self, start: usize, dst: &mut [MaybeUninit<u8>]) -> Result<()> {
        let end = start.saturating_add(dst.len());
        if end > self.bin.len() {
            return Err(ShardError::Invalid(format!(
                "{}: bytes {start}..{end} are past the end of the {}-byte file",
                self.bin_path.display(),
                self.bin.len()
            )));
        }
        let mut done = 0;
        while done < dst.len() {
            let rest = &mut dst[done..];
            let at = (start + done) as libc::off_t;
            // SAFETY: `rest` is writable memory of `rest.len()` bytes and pread writes at most that
            // many; the descriptor is owned by `self` and open.
            let got = unsafe {
                libc::pread(
                    self.bin_file.as_raw_fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    at,
                )
            };
            if got < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                let what = format!("reading bytes {}..{end}: {e}", start + done);
                return Err(ShardError::io(
                    &self.bin_path,
                    std::io::Error::new(e.kind(), what),
                ));
            }
            if got == 0 {
                return Err(ShardError::corrupt(
                    &self.bin_path,
                    (start + done) as u64,
                    format!(
                        "the file ends here, but bytes up to {end} were expected (was it \
                         truncated or replaced while open?)"
                    ),
                ));
            }
            done += got as usize;
        }
        Ok(())
    }

    /// Sample `i`: zero-copy tokens and piece lengths.
    pub fn sample(&self, i: usize) -> Result<Sample<'_>> {
        let (first, end, start, byte_end) = self.sample_span(i)?;
        let bytes = &self.bin[start..byte_end];
        // SAFETY: the map is page-aligned and `start` is a multiple of the element size (checked
        // in sample_span), so the pointer is aligned; the length is within the mapping.
        let tokens = unsafe {
            match self.header.dtype {
                TokenDtype::Uint16 => Tokens::U16(std::slice::from_raw_parts(
                    bytes.as_ptr().cast(),
                    bytes.len() / 2,
                )),
                TokenDtype::Int32 => Tokens::I32(std::slice::from_raw_parts(
                    bytes.as_ptr().cast(),
                    bytes.len() / 4,
                )),
            }
        };
        let pieces = (first..end).map(|s| self.length(s) as u32).collect();
        Ok(Sample { tokens, pieces })
    }
}

/// A whole shard directory: the manifest and every shard it lists, mapped.
pub struct ShardSet {
    dir: PathBuf,
    manifest: Manifest,
    shards: Vec<Shard>,
    /// `starts[k]` = global index of shard k's first sample; one extra entry holds the total.
    starts: Vec<u64>,
    /// Block ranges `(shard, start, end)` waiting for [`ShardSet::release_blocks_batched`].
    pending_release: Mutex<Vec<(usize, usize, usize)>>,
}

/// Block ranges released together by [`ShardSet::release_blocks_batched`]: each release of a range
/// ends with a TLB flush, which in a multi-threaded process interrupts every core running one of
/// its threads (a VM exit each, on a VM); one `process_madvise` call flushes once for all of them.
/// At most this many blocks (16 MiB) per shard set stay mapped waiting.
const RELEASE_BATCH: usize = 8;

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

impl ShardSet {
    /// Open `dir`: read `index.json`, map every shard, and check counts against the manifest.
    pub fn open(dir: &Path) -> Result<ShardSet> {
        let manifest = Manifest::read(dir)?;
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut starts = vec![0u64];
        for info in &manifest.shards {
            let shard = Shard::open(&dir.join(&info.prefix))?;
            if shard.num_samples() as u64 != info.samples || shard.dtype() != manifest.dtype {
                return Err(ShardError::Manifest {
                    path: dir.join(crate::MANIFEST_FILE),
                    what: format!(
                        "shard {} has {} samples of {}, the manifest says {} of {}",
                        info.prefix,
                        shard.num_samples(),
                        shard.dtype().name(),
                        info.samples,
                        manifest.dtype.name()
                    ),
                });
            }
            starts.push(starts.last().copied().unwrap_or(0) + info.samples);
            shards.push(shard);
        }
        Ok(ShardSet {
            dir: dir.to_path_buf(),
            manifest,
            shards,
            starts,
            pending_release: Mutex::new(Vec::new()),
        })
    }

    /// [`Shard::release_blocks`] for shard `k`, batched: ranges are collected and released
    /// [`RELEASE_BATCH`] at a time with one `process_madvise(MADV_DONTNEED)` (one TLB flush), or
    /// range by range where the kernel does not allow that. Up to `RELEASE_BATCH` blocks of this set
    /// stay mapped meanwhile; a shard index out of range is ignored (releasing is best effort).
    pub fn release_blocks_batched(&self, k: usize, start: usize, end: usize) {
        let Some(shard) = self.shards.get(k) else {
            return;
        };
        let (lo, hi) = block_span(start, end, shard.bin.len());
        if hi <= lo {
            return;
        }
        let batch = {
            let Ok(mut pending) = self.pending_release.lock() else {
                return shard.release_bin_range(lo, hi);
            };
            pending.push((k, lo, hi));
            if pending.len() < RELEASE_BATCH {
                return;
            }
            std::mem::take(&mut *pending)
        };
        if !self.process_madvise(&batch) {
            for &(k, lo, hi) in &batch {
                self.shards[k].release_bin_range(lo, hi);
            }
        }
    }

    /// Release all `(shard, start, end)` ranges with one `process_madvise`; false if not done.
    fn process_madvise(&self, ranges: &[(usize, usize, usize)]) -> bool {
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
                iov_base: self.shards[k].bin.as_ptr().wrapping_add(lo) as *mut libc::c_void,
                iov_len: hi - lo,
            })
            .collect();
        let total: usize = iov.iter().map(|v| v.iov_len).sum();
        // SAFETY: every range lies inside a read-only file mapping owned by `self` (so it stays
        // mapped for the call); MADV_DONTNEED on it only drops our page-table entries, and later
        // reads see the file again. No `&mut` views of the maps exist.
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

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    /// The manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }
    /// The shards, in order.
    pub fn shards(&self) -> &[Shard] {
        &self.shards
    }
    /// Total samples.
    pub fn num_samples(&self) -> u64 {
        self.starts.last().copied().unwrap_or(0)
    }
    /// (shard, index within shard) of global sample `global`.
    pub fn locate(&self, global: u64) -> Result<(usize, usize)> {
        if global >= self.num_samples() {
            return Err(ShardError::Invalid(format!(
                "{}: sample {global} out of range ({} samples)",
                self.dir.display(),
                self.num_samples()
            )));
        }
        let k = self.starts.partition_point(|&s| s <= global) - 1;
        Ok((k, (global - self.starts[k]) as usize))
    }
    /// Global sample `global`.
    pub fn sample(&self, global: u64) -> Result<Sample<'_>> {
        let (k, i) = self.locate(global)?;
        self.shards[k].sample(i)
    }
}
