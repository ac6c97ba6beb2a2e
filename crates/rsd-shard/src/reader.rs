//! Reading shards: [`Shard`] maps one `.bin`/`.idx` pair, checks it, and gives access to its
//! samples two ways — zero-copy views into the map, or `pread` copies into caller storage. How a
//! reader chooses between them and what it does with mapped pages afterwards (releasing them) is
//! the reader's business (`rsd-loader`), not the format's.

use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::dtype::TokenDtype;
use crate::error::{Result, ShardError};
use crate::fsutil::shard_files;
use crate::idx::{i32_at, i64_at, IdxHeader};
use crate::manifest::Manifest;
use rsd_common::safe_fs::open_regular;

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

/// One packed sample: its tokens, the lengths of the document pieces inside it, and where its
/// tokens lie in the `.bin`.
#[derive(Debug, Clone)]
pub struct Sample<'a> {
    /// The tokens, zero-copy from the mapped `.bin` (its pages are faulted in only when read).
    pub tokens: Tokens<'a>,
    /// Lengths of consecutive document pieces; they sum to `tokens.len()`.
    pub pieces: Vec<u32>,
    /// The tokens' bytes in the `.bin`, for reading them with [`Shard::read_tokens`] instead.
    pub bytes: std::ops::Range<usize>,
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
    /// The loss mask's `.bin` (one byte per token), when the directory has masks.
    mask: Option<Mmap>,
}

fn map(path: &Path) -> Result<(Mmap, File)> {
    // Regular files only: a FIFO named as a shard is refused instead of blocking the open.
    let file = open_regular(path)?;
    // SAFETY: shards are written once and renamed into place; nothing rewrites them in place.
    // A file truncated under us would fault, which is the documented mmap caveat.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| ShardError::io(path, e))?;
    Ok((map, file))
}

impl Shard {
    /// Map `<prefix>.bin` and `<prefix>.idx` and check the header and both files' sizes.
    pub fn open(prefix: &Path) -> Result<Shard> {
        Shard::open_files(&prefix.with_extension("bin"), &prefix.with_extension("idx"))
    }

    /// Map the pair `bin_path` and `idx_path` and check the header and both files' sizes.
    pub fn open_files(bin_path: &Path, idx_path: &Path) -> Result<Shard> {
        let (bin_path, idx_path) = (bin_path.to_path_buf(), idx_path.to_path_buf());
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
            mask: None,
        };
        shard.check_ends()?;
        Ok(shard)
    }

    /// Map the shard's loss-mask `.bin`, which must hold one byte per token.
    pub fn attach_mask(&mut self, mask_bin: &Path) -> Result<()> {
        let (map, _) = map(mask_bin)?;
        let tokens = self.bin.len() / self.header.dtype.size();
        if map.len() != tokens {
            return Err(ShardError::corrupt(
                mask_bin,
                (map.len().min(tokens)) as u64,
                format!(
                    "the loss mask is {} bytes, but the shard holds {tokens} tokens (one byte per token expected)",
                    map.len()
                ),
            ));
        }
        self.mask = Some(map);
        Ok(())
    }

    /// Whether a loss mask is attached.
    pub fn has_mask(&self) -> bool {
        self.mask.is_some()
    }

    /// The loss mask of the tokens at bytes `start..end` of the `.bin` (a sample's
    /// [`Sample::bytes`], or part of it), if a mask is attached: 1 = a training target.
    pub fn mask_of(&self, start: usize, end: usize) -> Option<&[u8]> {
        let size = self.header.dtype.size();
        self.mask
            .as_ref()
            .and_then(|m| m.get(start / size..end / size))
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
        // Checked sums: a damaged .idx can hold counts and lengths whose sum overflows.
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
            tokens = tokens.saturating_add(len as i64);
        }
        let size = self.header.dtype.size() as i64;
        let byte_end = tokens
            .checked_mul(size)
            .and_then(|bytes| start.checked_add(bytes))
            .unwrap_or(i64::MAX);
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
        Ok(Sample {
            tokens,
            pieces,
            bytes: start..byte_end,
        })
    }
}

/// Descriptors and memory maps kept for everything but one directory's shards: libraries, the
/// loader's threads, a distributed run's sockets, libtorch's allocations.
const RESERVE_FILES: u64 = 256;
const RESERVE_MAPS: u64 = 4096;

/// A directory of `shards` shards keeps one file open per shard (the `.bin`, for `pread`) and two
/// maps per shard (three with loss masks). When this process cannot hold that many, the error
/// says so before the first shard is opened, with what to do, instead of "Too many open files"
/// (or a map that fails) part-way through. Binaries raise the soft limit on open files to the
/// hard one first.
fn check_headroom(dir: &Path, shards: u64, masks: bool) -> Result<()> {
    use rsd_common::process_limits::headroom;
    let h = headroom(RESERVE_FILES, RESERVE_MAPS);
    let too_many = |what: String| ShardError::Manifest {
        path: dir.join(crate::MANIFEST_FILE),
        what: format!(
            "lists {shards} shards: {what}; repack into fewer, larger shards (rsd-data pack \
             --shard-size, 1GiB by default) or raise the limit"
        ),
    };
    if let (Some(left), Some(limit)) = (h.files, h.files_limit) {
        if shards > left {
            return Err(too_many(format!(
                "reading them keeps {shards} files open, and this process may open only {left} \
                 more (its limit on open files is {limit}: `ulimit -n`, at most `ulimit -Hn`; \
                 LimitNOFILE= for a service, /etc/security/limits.conf for a cluster's jobs)"
            )));
        }
    }
    let maps = shards * if masks { 3 } else { 2 };
    if let (Some(left), Some(limit)) = (h.maps, h.maps_limit) {
        if maps > left {
            return Err(too_many(format!(
                "mapping them takes {maps} memory maps, and this process may make only {left} \
                 more (the kernel allows {limit} per process: `sysctl vm.max_map_count`)"
            )));
        }
    }
    Ok(())
}

/// A whole shard directory: the manifest and every shard it lists, mapped.
pub struct ShardSet {
    dir: PathBuf,
    manifest: Manifest,
    shards: Vec<Shard>,
    /// `starts[k]` = global index of shard k's first sample; one extra entry holds the total.
    starts: Vec<u64>,
}

impl ShardSet {
    /// Open `dir`: read `index.json`, map every shard, and check counts against the manifest.
    pub fn open(dir: &Path) -> Result<ShardSet> {
        let manifest = Manifest::read(dir)?;
        check_headroom(
            dir,
            manifest.shards.len() as u64,
            manifest.loss_mask.is_some(),
        )?;
        let mut shards = Vec::with_capacity(manifest.shards.len());
        let mut starts = vec![0u64];
        for (k, info) in manifest.shards.iter().enumerate() {
            let (bin, idx) = shard_files(dir, k, info)?;
            let mut shard = Shard::open_files(&bin, &idx)?;
            if manifest.loss_mask.is_some() {
                if info.loss_mask.is_none() {
                    return Err(ShardError::Manifest {
                        path: dir.join(crate::MANIFEST_FILE),
                        what: format!(
                            "the directory has loss masks, but shards[{k}] ({}) lists none",
                            info.prefix
                        ),
                    });
                }
                let (mask_bin, _) = crate::fsutil::mask_files(dir, k, info)?;
                shard.attach_mask(&mask_bin)?;
            }
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
        })
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
