use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rsd_common::safe_fs::AtomicFile;

use xxhash_rust::xxh3::Xxh3;

use crate::dtype::TokenDtype;
use crate::error::{Result, ShardError};
use crate::idx;
use crate::manifest::{mask_prefix, MaskFiles, ShardInfo};

/// Asks the kernel to start writing `[from, to)` of `file` to disk without waiting (Linux
/// `sync_file_range(SYNC_FILE_RANGE_WRITE)`); a hint only, so errors are ignored: the fsync before
/// the rename is what guarantees durability.
fn start_writeback(file: &File, from: u64, to: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a plain syscall on an open descriptor; no memory is passed.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                (to - from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, from, to);
}

/// Writes one `.bin`/`.idx` pair. Both are written under `<name>.tmp` (created new, never through
/// a planted link: [`AtomicFile`]) and renamed into place by [`ShardWriter::finish`] after an
/// fsync; a writer dropped unfinished removes its temporary files.
pub struct ShardWriter {
    dir: PathBuf,
    prefix: String,
    dtype: TokenDtype,
    bin_tmp: PathBuf,
    bin: Option<BufWriter<AtomicFile>>,
    hasher: Xxh3,
    bin_bytes: u64,
    lengths: Vec<i32>,
    doc_indices: Vec<i64>,
    encode_buf: Vec<u8>,
    /// Bytes of `.bin` already handed to the kernel for write-back.
    writeback_from: u64,
    /// The loss mask's `.bin`, when samples carry one ([`ShardWriter::create_with_mask`]).
    mask: Option<MaskPart>,
}

/// The loss-mask `.bin` being written next to the tokens.
struct MaskPart {
    tmp: PathBuf,
    file: BufWriter<AtomicFile>,
    hasher: Xxh3,
    bytes: u64,
    trained: u64,
}

/// Megatron's dtype code for uint8 (the mask's element type).
const MASK_CODE: u8 = 1;

/// Start write-back of every this many bytes as they are written, so the fsync in
/// [`ShardWriter::finish`] finds little left to do (the disk works while we pack the next samples).
const WRITEBACK_EVERY: u64 = 32 << 20;

impl ShardWriter {
    /// Start `dir/<prefix>.bin` and `.idx` (under temporary names).
    pub fn create(dir: &Path, prefix: &str, dtype: TokenDtype) -> Result<ShardWriter> {
        let file = AtomicFile::create(&dir.join(format!("{prefix}.bin")))?;
        let bin_tmp = file.temporary_path().to_path_buf();
        Ok(ShardWriter {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            dtype,
            bin_tmp,
            // Small: samples of 32K+ tokens bypass the buffer (no extra copy); short ones batch up.
            bin: Some(BufWriter::with_capacity(64 << 10, file)),
            hasher: Xxh3::new(),
            bin_bytes: 0,
            lengths: Vec::new(),
            doc_indices: vec![0],
            encode_buf: Vec::new(),
            writeback_from: 0,
            mask: None,
        })
    }

    /// Like [`ShardWriter::create`], with a loss mask written beside the tokens
    /// (`<prefix>-mask.bin`/`.idx`): samples are added with [`ShardWriter::add_masked_sample`].
    pub fn create_with_mask(dir: &Path, prefix: &str, dtype: TokenDtype) -> Result<ShardWriter> {
        let mut w = ShardWriter::create(dir, prefix, dtype)?;
        let file = AtomicFile::create(&dir.join(format!("{}.bin", mask_prefix(prefix))))?;
        w.mask = Some(MaskPart {
            tmp: file.temporary_path().to_path_buf(),
            file: BufWriter::with_capacity(64 << 10, file),
            hasher: Xxh3::new(),
            bytes: 0,
            trained: 0,
        });
        Ok(w)
    }

    /// Append one sample with its loss mask (`mask[i]` = 1 when token `i` is a training target,
    /// else 0; one entry per token).
    pub fn add_masked_sample(&mut self, tokens: &[u32], pieces: &[u32], mask: &[u8]) -> Result<()> {
        if self.mask.is_none() {
            return Err(ShardError::Invalid(
                "a loss mask for a shard written without one".into(),
            ));
        }
        if mask.len() != tokens.len() || mask.iter().any(|&m| m > 1) {
            return Err(ShardError::Invalid(format!(
                "a loss mask of {} entries for {} tokens: one 0 or 1 per token expected",
                mask.len(),
                tokens.len()
            )));
        }
        self.write_sample(tokens, pieces)?;
        if let Some(m) = self.mask.as_mut() {
            m.file
                .write_all(mask)
                .map_err(|e| ShardError::io(&m.tmp, e))?;
            m.hasher.update(mask);
            m.bytes += mask.len() as u64;
            m.trained += mask.iter().map(|&x| x as u64).sum::<u64>();
        }
        Ok(())
    }

    /// Append one sample: `tokens`, split into consecutive document pieces of `pieces` lengths
    /// (which must sum to `tokens.len()`; zero-length pieces are not allowed).
    pub fn add_sample(&mut self, tokens: &[u32], pieces: &[u32]) -> Result<()> {
        if self.mask.is_some() {
            return Err(ShardError::Invalid(
                "a sample without its loss mask in a shard that has one".into(),
            ));
        }
        self.write_sample(tokens, pieces)
    }

    fn write_sample(&mut self, tokens: &[u32], pieces: &[u32]) -> Result<()> {
        let total: u64 = pieces.iter().map(|&p| p as u64).sum();
        if total != tokens.len() as u64 || pieces.contains(&0) || tokens.is_empty() {
            let shown: Vec<String> = pieces.iter().take(8).map(u32::to_string).collect();
            return Err(ShardError::Invalid(format!(
                "sample of {} tokens with pieces [{}]: pieces must be non-empty and sum to the token count",
                tokens.len(),
                shown.join(", ")
            )));
        }
        // max() vectorises; the search for the culprit runs only on failure.
        let too_big = tokens
            .iter()
            .copied()
            .max()
            .is_some_and(|m| m > self.dtype.max_id());
        if let Some(&bad) = too_big
            .then(|| tokens.iter().find(|&&t| t > self.dtype.max_id()))
            .flatten()
        {
            return Err(ShardError::Invalid(format!(
                "token id {bad} does not fit in {}",
                self.dtype.name()
            )));
        }
        let bin = self
            .bin
            .as_mut()
            .ok_or_else(|| ShardError::Invalid("shard already finished".into()))?;
        let bytes: &[u8] = match self.dtype {
            // Ids were checked to fit in 31 bits, so their u32 little-endian bytes are the int32 bytes.
            TokenDtype::Int32 if cfg!(target_endian = "little") => {
                // SAFETY: viewing initialized u32s as bytes is always valid.
                unsafe {
                    std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), tokens.len() * 4)
                }
            }
            TokenDtype::Int32 => {
                self.encode_buf.clear();
                self.encode_buf
                    .extend(tokens.iter().flat_map(|&t| (t as i32).to_le_bytes()));
                &self.encode_buf
            }
            TokenDtype::Uint16 => {
                self.encode_buf.clear();
                self.encode_buf
                    .extend(tokens.iter().flat_map(|&t| (t as u16).to_le_bytes()));
                &self.encode_buf
            }
        };
        bin.write_all(bytes)
            .map_err(|e| ShardError::io(&self.bin_tmp, e))?;
        self.hasher.update(bytes);
        self.bin_bytes += bytes.len() as u64;
        if self.bin_bytes - self.writeback_from >= WRITEBACK_EVERY {
            bin.flush().map_err(|e| ShardError::io(&self.bin_tmp, e))?;
            start_writeback(bin.get_ref().file(), self.writeback_from, self.bin_bytes);
            self.writeback_from = self.bin_bytes;
        }
        self.lengths.extend(pieces.iter().map(|&p| p as i32));
        self.doc_indices.push(self.lengths.len() as i64);
        Ok(())
    }

    /// Bytes of token data written so far.
    pub fn bin_bytes(&self) -> u64 {
        self.bin_bytes
    }

    /// Samples written so far.
    pub fn samples(&self) -> u64 {
        self.doc_indices.len() as u64 - 1
    }

    /// Write the `.idx`, fsync both files, and rename them into place.
    pub fn finish(mut self) -> Result<ShardInfo> {
        let bin = self
            .bin
            .take()
            .ok_or_else(|| ShardError::Invalid("shard already finished".into()))?;
        let bin = bin
            .into_inner()
            .map_err(|e| ShardError::io(&self.bin_tmp, e.into_error()))?;
        let idx_bytes = idx::encode(
            self.dtype.megatron_code(),
            self.dtype.size(),
            &self.lengths,
            &self.doc_indices,
        );
        let mut idx = AtomicFile::create(&self.dir.join(format!("{}.idx", self.prefix)))?;
        idx.write_all(&idx_bytes)
            .map_err(|e| ShardError::io(idx.temporary_path(), e))?;
        // The mask pair first, then the tokens': every file is in place before the manifest
        // (written last) names it.
        let loss_mask = match self.mask.take() {
            Some(m) => Some(self.finish_mask(m)?),
            None => None,
        };
        // The .bin goes into place first: a crash in between leaves a .bin without its .idx,
        // which no reader opens (the manifest is written last) and a resume rewrites.
        bin.commit()?;
        idx.commit()?;
        Ok(ShardInfo {
            prefix: self.prefix.clone(),
            samples: self.doc_indices.len() as u64 - 1,
            pieces: self.lengths.len() as u64,
            tokens: self.bin_bytes / self.dtype.size() as u64,
            bin_bytes: self.bin_bytes,
            idx_bytes: idx_bytes.len() as u64,
            bin_xxh3: format!("{:016x}", self.hasher.digest()),
            idx_xxh3: format!("{:016x}", crate::checksum(&idx_bytes)),
            loss_mask,
        })
    }

    /// Write the mask's `.idx` (the token index with uint8 elements) and put the pair in place.
    fn finish_mask(&self, m: MaskPart) -> Result<MaskFiles> {
        let bin = m
            .file
            .into_inner()
            .map_err(|e| ShardError::io(&m.tmp, e.into_error()))?;
        let idx_bytes = idx::encode(MASK_CODE, 1, &self.lengths, &self.doc_indices);
        let prefix = mask_prefix(&self.prefix);
        let mut idx = AtomicFile::create(&self.dir.join(format!("{prefix}.idx")))?;
        idx.write_all(&idx_bytes)
            .map_err(|e| ShardError::io(idx.temporary_path(), e))?;
        bin.commit()?;
        idx.commit()?;
        Ok(MaskFiles {
            bin_bytes: m.bytes,
            idx_bytes: idx_bytes.len() as u64,
            bin_xxh3: format!("{:016x}", m.hasher.digest()),
            idx_xxh3: format!("{:016x}", crate::checksum(&idx_bytes)),
            trained_tokens: m.trained,
        })
    }

    /// The `.idx` bytes a loss mask of this shard's layout has (for checks).
    pub(crate) fn mask_idx(lengths: &[i32], doc_indices: &[i64]) -> Vec<u8> {
        idx::encode(MASK_CODE, 1, lengths, doc_indices)
    }
}

/// Writes a sequence of shards named `shard-00000`, `shard-00001`, …, starting a new one when the
/// current `.bin` reaches the size target.
pub struct ShardSetWriter {
    dir: PathBuf,
    dtype: TokenDtype,
    target_bytes: u64,
    next_index: usize,
    current: Option<ShardWriter>,
    with_mask: bool,
}

impl ShardSetWriter {
    /// Shards go into `dir`, numbered from `first_index` (non-zero when resuming).
    pub fn new(
        dir: &Path,
        dtype: TokenDtype,
        target_bytes: u64,
        first_index: usize,
    ) -> ShardSetWriter {
        ShardSetWriter {
            dir: dir.to_path_buf(),
            dtype,
            target_bytes: target_bytes.max(1),
            next_index: first_index,
            current: None,
            with_mask: false,
        }
    }

    /// Shards written with a loss mask beside the tokens ([`ShardWriter::create_with_mask`]).
    pub fn with_loss_mask(mut self) -> ShardSetWriter {
        self.with_mask = true;
        self
    }

    /// The file prefix of shard number `index`.
    pub fn prefix(index: usize) -> String {
        format!("shard-{index:05}")
    }

    /// Append a sample; returns the finished shard when this sample filled one.
    pub fn add_sample(&mut self, tokens: &[u32], pieces: &[u32]) -> Result<Option<ShardInfo>> {
        self.add(tokens, pieces, None)
    }

    /// Append a sample with its loss mask (a set made [`ShardSetWriter::with_loss_mask`]).
    pub fn add_masked_sample(
        &mut self,
        tokens: &[u32],
        pieces: &[u32],
        mask: &[u8],
    ) -> Result<Option<ShardInfo>> {
        self.add(tokens, pieces, Some(mask))
    }

    fn add(
        &mut self,
        tokens: &[u32],
        pieces: &[u32],
        mask: Option<&[u8]>,
    ) -> Result<Option<ShardInfo>> {
        if self.current.is_none() {
            let prefix = Self::prefix(self.next_index);
            self.current = Some(if self.with_mask {
                ShardWriter::create_with_mask(&self.dir, &prefix, self.dtype)?
            } else {
                ShardWriter::create(&self.dir, &prefix, self.dtype)?
            });
            self.next_index += 1;
        }
        let writer = self
            .current
            .as_mut()
            .ok_or_else(|| ShardError::Invalid("no open shard".into()))?;
        match mask {
            Some(m) => writer.add_masked_sample(tokens, pieces, m)?,
            None => writer.add_sample(tokens, pieces)?,
        }
        if writer.bin_bytes() >= self.target_bytes {
            return self.close_current();
        }
        Ok(None)
    }

    /// Finish the open shard, if any.
    pub fn close_current(&mut self) -> Result<Option<ShardInfo>> {
        match self.current.take() {
            Some(writer) => writer.finish().map(Some),
            None => Ok(None),
        }
    }
}
