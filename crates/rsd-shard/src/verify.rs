use std::path::Path;

use crate::dtype::TokenDtype;
use crate::error::{Result, ShardError};
use crate::fsutil::shard_files;
use crate::manifest::{Manifest, PackMode, MANIFEST_FILE};
use crate::reader::Shard;

/// What [`verify`] checks beyond structure.
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions {
    /// Recompute xxh3 checksums of every file and compare with the manifest.
    pub checksums: bool,
    /// Check that every token id is below the manifest's vocabulary size.
    pub token_range: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            checksums: true,
            token_range: true,
        }
    }
}

/// Counts of what was verified, and anything odd that is not an error.
#[derive(Debug, Clone, Default)]
pub struct VerifyReport {
    /// Shards checked.
    pub shards: u64,
    /// Samples checked.
    pub samples: u64,
    /// Tokens checked.
    pub tokens: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Leftover files and similar oddities.
    pub warnings: Vec<String>,
}

/// Check a shard directory completely: manifest, file sizes, checksums, every `.idx` entry, and
/// (optionally) the range of every token. The first problem found is returned as an error naming
/// the file and byte offset.
pub fn verify(dir: &Path, options: VerifyOptions) -> Result<VerifyReport> {
    let manifest = Manifest::read(dir)?;
    let manifest_path = dir.join(MANIFEST_FILE);
    let mut report = VerifyReport::default();
    let (mut samples, mut tokens, mut pieces) = (0u64, 0u64, 0u64);
    let mut mask_trained = 0u64;
    for (k, info) in manifest.shards.iter().enumerate() {
        // The manifest names the files: only plain names inside `dir`, only regular files.
        let (bin_path, idx_path) = shard_files(dir, k, info)?;
        check_size(&bin_path, info.bin_bytes)?;
        check_size(&idx_path, info.idx_bytes)?;
        let shard = Shard::open_files(&bin_path, &idx_path)?;
        // The .idx header's dtype decides how the .bin is read; the manifest's is what readers
        // and the token-range check assume. They must agree.
        if shard.dtype() != manifest.dtype {
            return Err(ShardError::corrupt(
                shard.idx_path(),
                17,
                format!(
                    "dtype {} (code {}), but the manifest says {}",
                    shard.dtype().name(),
                    shard.dtype().megatron_code(),
                    manifest.dtype.name()
                ),
            ));
        }
        if options.checksums {
            check_sum(shard.bin_path(), shard.bin_bytes(), &info.bin_xxh3)?;
            check_sum(shard.idx_path(), shard.idx_bytes(), &info.idx_xxh3)?;
        }
        check_index(&shard, &manifest)?;
        if manifest.loss_mask.is_some() {
            let (n, trained) = check_mask(dir, k, info, &shard, options.checksums)?;
            report.bytes += n;
            mask_trained += trained;
        }
        if options.token_range {
            check_token_range(&shard, manifest.tokenizer.vocab_size)?;
        }
        if shard.num_samples() as u64 != info.samples || shard.num_pieces() as u64 != info.pieces {
            return Err(ShardError::Manifest {
                path: manifest_path,
                what: format!(
                    "shard {} holds {} samples and {} pieces, the manifest says {} and {}",
                    info.prefix,
                    shard.num_samples(),
                    shard.num_pieces(),
                    info.samples,
                    info.pieces
                ),
            });
        }
        samples += info.samples;
        pieces += info.pieces;
        tokens += info.bin_bytes / manifest.dtype.size() as u64;
        report.bytes += info.bin_bytes + info.idx_bytes;
        report.shards += 1;
    }
    if samples != manifest.totals.samples
        || tokens != manifest.totals.tokens
        || pieces != manifest.totals.pieces
    {
        return Err(ShardError::Manifest {
            path: manifest_path,
            what: format!(
                "shards hold {samples} samples, {tokens} tokens, {pieces} pieces; totals say {}, {}, {}",
                manifest.totals.samples, manifest.totals.tokens, manifest.totals.pieces
            ),
        });
    }
    if let Some(mask) = &manifest.loss_mask {
        if mask.trained_tokens != mask_trained {
            return Err(ShardError::Manifest {
                path: manifest_path,
                what: format!(
                    "the loss masks mark {mask_trained} tokens as targets; loss_mask.trained_tokens says {}",
                    mask.trained_tokens
                ),
            });
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                report
                    .warnings
                    .push(format!("leftover temporary file {name} (safe to delete)"));
            }
        }
    }
    report.samples = samples;
    report.tokens = tokens;
    Ok(report)
}

/// Every index entry: pointers contiguous from 0, lengths positive, samples non-empty and no
/// longer than the packing length (exactly that long in `fixed` mode, but for a kept tail).
fn check_index(shard: &Shard, manifest: &Manifest) -> Result<()> {
    let h = shard.header();
    let size = h.dtype.size() as i64;
    let mut expected_ptr = 0i64;
    for s in 0..shard.num_pieces() {
        let len = shard.length(s);
        if len <= 0 {
            return Err(ShardError::corrupt(
                shard.idx_path(),
                h.lengths_offset() as u64 + 4 * s as u64,
                format!("sequence {s} has length {len}, expected > 0"),
            ));
        }
        let ptr = shard.pointer(s);
        if ptr != expected_ptr {
            return Err(ShardError::corrupt(
                shard.idx_path(),
                h.pointers_offset() as u64 + 8 * s as u64,
                format!("sequence {s} starts at byte {ptr}, expected {expected_ptr} (right after sequence {})", s as i64 - 1),
            ));
        }
        expected_ptr += len as i64 * size;
    }
    let n = shard.num_samples();
    for i in 0..n {
        let (first, end) = (shard.doc_index(i), shard.doc_index(i + 1));
        if end <= first {
            return Err(ShardError::corrupt(
                shard.idx_path(),
                h.doc_index_offset() as u64 + 8 * (i as u64 + 1),
                format!("document index {end} after {first}: must increase"),
            ));
        }
        let sample = shard.sample(i)?;
        let len = sample.tokens.len() as u64;
        let is_last_of_set = i + 1 == n;
        let too_long = len > manifest.seq_len;
        let fixed = manifest.mode == PackMode::Fixed;
        let short_fixed = fixed && len != manifest.seq_len && !is_last_of_set;
        if too_long || short_fixed {
            return Err(ShardError::corrupt(
                shard.idx_path(),
                h.doc_index_offset() as u64 + 8 * i as u64,
                format!(
                    "sample {i} has {len} tokens; {} mode with length {} allows {}",
                    manifest.mode,
                    manifest.seq_len,
                    if fixed {
                        "exactly that"
                    } else {
                        "at most that"
                    }
                ),
            ));
        }
    }
    Ok(())
}

fn check_token_range(shard: &Shard, vocab_size: u64) -> Result<()> {
    let bytes = shard.bin_bytes();
    let bad = match shard.dtype() {
        TokenDtype::Uint16 => bytes
            .chunks_exact(2)
            .position(|c| u16::from_le_bytes([c[0], c[1]]) as u64 >= vocab_size)
            .map(|i| {
                (
                    i * 2,
                    u16::from_le_bytes([bytes[i * 2], bytes[i * 2 + 1]]) as i64,
                )
            }),
        TokenDtype::Int32 => bytes
            .chunks_exact(4)
            .position(|c| {
                let v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                v < 0 || v as u64 >= vocab_size
            })
            .map(|i| {
                let c = &bytes[i * 4..i * 4 + 4];
                (i * 4, i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64)
            }),
    };
    match bad {
        Some((offset, id)) => Err(ShardError::corrupt(
            shard.bin_path(),
            offset as u64,
            format!("token id {id} is outside the vocabulary (0..{vocab_size})"),
        )),
        None => Ok(()),
    }
}

/// The file at `path` is `expected` bytes long, as the manifest says.
fn check_size(path: &Path, expected: u64) -> Result<()> {
    let len = std::fs::metadata(path)
        .map_err(|e| ShardError::io(path, e))?
        .len();
    if len != expected {
        return Err(ShardError::corrupt(
            path,
            len.min(expected),
            format!("file is {len} bytes, the manifest says {expected}"),
        ));
    }
    Ok(())
}

/// `bytes` (the file at `path`) have the manifest's xxh3 checksum `expected`.
fn check_sum(path: &Path, bytes: &[u8], expected: &str) -> Result<()> {
    let got = format!("{:016x}", crate::checksum(bytes));
    if got != expected {
        return Err(ShardError::corrupt(
            path,
            0,
            format!("xxh3 checksum {got}, the manifest says {expected}"),
        ));
    }
    Ok(())
}

/// Shard `k`'s loss-mask pair: listed, sized and (with `checksums`) summed as the manifest says,
/// one 0 or 1 per token, and its `.idx` the token index with uint8 elements (what Megatron reads
/// it with). Returns the bytes read and the tokens marked as targets.
fn check_mask(
    dir: &Path,
    k: usize,
    info: &crate::manifest::ShardInfo,
    shard: &Shard,
    checksums: bool,
) -> Result<(u64, u64)> {
    let files = info
        .loss_mask
        .as_ref()
        .ok_or_else(|| ShardError::Manifest {
            path: dir.join(MANIFEST_FILE),
            what: format!(
                "the directory has loss masks, but shards[{k}] ({}) lists none",
                info.prefix
            ),
        })?;
    let (bin_path, idx_path) = crate::fsutil::mask_files(dir, k, info)?;
    check_size(&bin_path, files.bin_bytes)?;
    check_size(&idx_path, files.idx_bytes)?;
    let bin = rsd_common::safe_fs::read_regular(&bin_path, files.bin_bytes, "loss mask")?;
    let idx = rsd_common::safe_fs::read_regular(&idx_path, files.idx_bytes, "loss mask index")?;
    if checksums {
        check_sum(&bin_path, &bin, &files.bin_xxh3)?;
        check_sum(&idx_path, &idx, &files.idx_xxh3)?;
    }
    let tokens = shard.bin_bytes().len() / shard.dtype().size();
    if bin.len() != tokens {
        return Err(ShardError::corrupt(
            &bin_path,
            bin.len().min(tokens) as u64,
            format!(
                "the loss mask has {} entries for the shard's {tokens} tokens",
                bin.len()
            ),
        ));
    }
    if let Some(at) = bin.iter().position(|&m| m > 1) {
        return Err(ShardError::corrupt(
            &bin_path,
            at as u64,
            format!("mask value {}, expected 0 or 1", bin[at]),
        ));
    }
    let lengths: Vec<i32> = (0..shard.num_pieces()).map(|s| shard.length(s)).collect();
    let docs: Vec<i64> = (0..=shard.num_samples())
        .map(|i| shard.doc_index(i))
        .collect();
    let expected = crate::writer::ShardWriter::mask_idx(&lengths, &docs);
    if let Some(at) = idx.iter().zip(&expected).position(|(a, b)| a != b) {
        return Err(ShardError::corrupt(
            &idx_path,
            at as u64,
            "differs from the token index with uint8 elements (what the mask's .idx must be)",
        ));
    }
    let trained: u64 = bin.iter().map(|&m| m as u64).sum();
    if trained != files.trained_tokens {
        return Err(ShardError::Manifest {
            path: dir.join(MANIFEST_FILE),
            what: format!(
                "{} marks {trained} tokens as targets; shards[{k}].loss_mask.trained_tokens says {}",
                bin_path.display(),
                files.trained_tokens
            ),
        });
    }
    Ok(((bin.len() + idx.len()) as u64, trained))
}
