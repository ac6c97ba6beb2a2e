//! MosaicML MDS shards as ProLong publishes them: already tokenized (`input_ids`, with
//! `indices` = (start, end) of each document), so they are repacked without re-tokenizing and keep
//! their document boundaries.
//!
//! Layout (mosaicml-streaming, format version 2): a dataset directory holds `index.json` listing
//! shards; a shard file is `u32 n`, `u32 offsets[n + 1]` (absolute), the writer's config JSON, then
//! the samples. A sample is one `u32` size per variable-size column, then each column's bytes. An
//! `ndarray` column whose shape is not fixed starts with a byte `(ndim << 2) | c` (shape stored as
//! u8/u16/u32/u64 for c = 0..3) and the shape; one whose dtype is not fixed starts with a dtype byte.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use serde_json::Value;

use rsd_common::printable::shortened;
use rsd_common::safe_fs::{confined_name, open_regular, read_regular, NamedBy, MAX_METADATA_BYTES};

use super::{Content, RawDoc};
use crate::error::{json_error, Cause, DataError, Result};

/// The MDS dataset directories under `root`: `root` itself if it has an MDS `index.json`, else
/// every directory below it that has one (not descending further once found), in path order.
pub fn find_datasets(root: &Path) -> Result<Vec<PathBuf>> {
    if is_mds_index(root) {
        return Ok(vec![root.to_path_buf()]);
    }
    let mut found = vec![];
    let mut walker = walkdir::WalkDir::new(root).sort_by_file_name().into_iter();
    while let Some(entry) = walker.next() {
        let Ok(entry) = entry else { continue };
        if entry.file_type().is_dir() && entry.depth() > 0 && is_mds_index(entry.path()) {
            found.push(entry.path().to_path_buf());
            walker.skip_current_dir();
        }
    }
    Ok(found)
}

/// Whether `dir` is an MDS dataset: its `index.json` has `shards` and `version`, or is not valid
/// JSON but sits beside `.mds` shards (a damaged index, which reading then reports with the line
/// and column of the JSON error; other tools write `index.json` files too).
fn is_mds_index(dir: &Path) -> bool {
    // Regular files only (a FIFO named index.json must not block the search), of bounded size.
    let Ok(bytes) = read_regular(&dir.join("index.json"), MAX_METADATA_BYTES, "MDS index") else {
        return false;
    };
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(json) => {
            json.get("shards").is_some_and(Value::is_array) && json.get("version").is_some()
        }
        Err(_) => has_mds_shards(dir),
    }
}

fn has_mds_shards(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().to_ascii_lowercase();
            name.ends_with(".mds") || name.ends_with(".mds.zstd") || name.ends_with(".mds.zst")
        })
    })
}

/// Total bytes of a dataset's shard files, from its index (for progress).
pub fn dataset_bytes(dir: &Path) -> u64 {
    MdsDataset::open(dir)
        .map(|d| d.shards.iter().map(|s| s.bytes).sum())
        .unwrap_or(0)
}

#[derive(Debug, Clone)]
enum Column {
    /// `ndarray:<dtype>[:shape]` or `ndarray`.
    NdArray {
        dtype: Option<Dtype>,
        fixed_shape: Option<Vec<u64>>,
    },
    /// Anything else; only its size matters to us.
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Dtype {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    U64,
    I64,
}

impl Dtype {
    fn parse(name: &str) -> Option<Dtype> {
        Some(match name {
            "uint8" => Dtype::U8,
            "int8" => Dtype::I8,
            "uint16" => Dtype::U16,
            "int16" => Dtype::I16,
            "uint32" => Dtype::U32,
            "int32" => Dtype::I32,
            "uint64" => Dtype::U64,
            "int64" => Dtype::I64,
            _ => return None,
        })
    }
    fn from_code(code: u8) -> Option<Dtype> {
        Some(match code {
            8 => Dtype::U8,
            9 => Dtype::I8,
            16 => Dtype::U16,
            17 => Dtype::I16,
            32 => Dtype::U32,
            33 => Dtype::I32,
            64 => Dtype::U64,
            65 => Dtype::I64,
            _ => return None,
        })
    }
    fn size(self) -> usize {
        match self {
            Dtype::U8 | Dtype::I8 => 1,
            Dtype::U16 | Dtype::I16 => 2,
            Dtype::U32 | Dtype::I32 => 4,
            Dtype::U64 | Dtype::I64 => 8,
        }
    }
    /// Element `i` of little-endian `bytes` as i64 (u64 values above i64::MAX become negative and
    /// are rejected by the caller's range checks).
    fn get(self, bytes: &[u8], i: usize) -> i64 {
        let s = self.size();
        let b = &bytes[i * s..i * s + s];
        match self {
            Dtype::U8 => b[0] as i64,
            Dtype::I8 => b[0] as i8 as i64,
            Dtype::U16 => u16::from_le_bytes([b[0], b[1]]) as i64,
            Dtype::I16 => i16::from_le_bytes([b[0], b[1]]) as i64,
            Dtype::U32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
            Dtype::I32 => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64,
            Dtype::U64 | Dtype::I64 => {
                i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
            }
        }
    }
}

#[derive(Debug, Clone)]
struct ShardEntry {
    file: PathBuf,
    zstd: bool,
    samples: u64,
    bytes: u64,
    /// The decompressed size the index declares (`raw_data.bytes`): a zstd shard may not decode
    /// to more.
    raw_bytes: Option<u64>,
    columns: Vec<(String, Column, Option<u64>)>,
    /// Documents with more token bytes than this are bad records.
    max_doc_bytes: u64,
}

/// The most bytes an MDS shard can have: its sample offsets are u32s. The cap on a zstd shard's
/// decoded size when its index declares none.
const MAX_SHARD_BYTES: u64 = 1 << 32;

/// One MDS dataset directory.
#[derive(Debug, Clone)]
pub struct MdsDataset {
    dir: PathBuf,
    shards: Vec<ShardEntry>,
}

impl MdsDataset {
    /// Read and check `dir/index.json`.
    pub fn open(dir: &Path) -> Result<MdsDataset> {
        let index = dir.join("index.json");
        let text = read_regular(&index, MAX_METADATA_BYTES, "MDS index")?;
        MdsDataset::parse(dir, &index, &text)
    }

    /// Decode and check the bytes of `index` (the `index.json` of `dir`): every shard's format,
    /// columns, sizes and compression, and its file name (a plain name inside `dir`). Reads no
    /// shard.
    pub fn parse(dir: &Path, index: &Path, text: &[u8]) -> Result<MdsDataset> {
        let json: Value = serde_json::from_slice(text).map_err(|e| {
            DataError::bad_file(
                index,
                Cause::Corrupt,
                format!("not valid JSON {}", json_error(&e)),
            )
        })?;
        let shards = json
            .get("shards")
            .and_then(Value::as_array)
            .ok_or_else(|| schema_error(index, "no \"shards\" list".into()))?;
        let mut entries = vec![];
        // A shard listed twice would be read twice (a few KB of index.json listing one shard
        // 100,000 times would read it 100,000 times).
        let mut listed = super::ListedOnce::default();
        for (k, shard) in shards.iter().enumerate() {
            let entry = shard_entry(dir, index, k, shard)?;
            if let Some(j) = listed.earlier(k, &entry.file) {
                let field = if entry.zstd { "zip_data" } else { "raw_data" };
                return Err(DataError::bad_file(
                    index,
                    Cause::Corrupt,
                    format!(
                        "field shards[{k}].{field}.basename names the same file as shards[{j}] \
                         ({}); a shard may be listed once",
                        entry.file.display()
                    ),
                ));
            }
            entries.push(entry);
        }
        Ok(MdsDataset {
            dir: dir.to_path_buf(),
            shards: entries,
        })
    }

    /// The dataset's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every document of every shard, in order; a document of more than `max_doc_bytes` bytes of
    /// token ids is a bad record.
    pub fn documents(self, max_doc_bytes: u64) -> impl Iterator<Item = Result<RawDoc>> + Send {
        self.shards
            .into_iter()
            .map(move |shard| ShardEntry {
                max_doc_bytes,
                ..shard
            })
            .flat_map(|shard| match ShardDocs::open(shard) {
                Ok(docs) => Box::new(docs) as Box<dyn Iterator<Item = Result<RawDoc>> + Send>,
                Err(e) => Box::new(std::iter::once(Err(e))),
            })
    }
}

/// An index.json that does not describe ProLong-style MDS as rsd reads it.
fn schema_error(index: &Path, what: String) -> DataError {
    DataError::bad_file(index, Cause::Schema, what)
}

/// Shard `k` of `index` (the `index.json` of `dir`): its format, columns, compression, data
/// file (a plain name inside `dir`) and sample count.
fn shard_entry(dir: &Path, index: &Path, k: usize, shard: &Value) -> Result<ShardEntry> {
    let bad = |what: String| schema_error(index, what);
    let format = shard.get("format").and_then(Value::as_str).unwrap_or("");
    if format != "mds" {
        return Err(bad(format!(
            "shard {k} has format \"{}\"; only \"mds\" is supported",
            shortened(format)
        )));
    }
    let columns = shard_columns(index, k, shard)?;
    let compression = shard.get("compression").and_then(Value::as_str);
    let zstd = match compression {
        None => false,
        Some(c) if c == "zstd" || c.starts_with("zstd:") => true,
        Some(other) => {
            return Err(bad(format!(
                "shard {k} is compressed with \"{}\"; only uncompressed or zstd MDS is \
                 supported",
                shortened(other)
            )))
        }
    };
    let data_field = if zstd { "zip_data" } else { "raw_data" };
    let data = shard.get(data_field);
    let basename = data
        .and_then(|d| d.get("basename"))
        .and_then(Value::as_str)
        .ok_or_else(|| {
            bad(format!(
                "shard {k}: no {} basename",
                if zstd { "zip_data" } else { "raw_data" }
            ))
        })?;
    let bytes = data
        .and_then(|d| d.get("bytes"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let raw_bytes = shard
        .get("raw_data")
        .and_then(|d| d.get("bytes"))
        .and_then(Value::as_u64);
    // The name comes from a file anyone may have written: it must stay inside `dir`.
    let named_by = NamedBy::new(index, format!("shards[{k}].{data_field}.basename"));
    let file = confined_name(dir, basename, &named_by)?;
    let samples = shard
        .get("samples")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad(format!("shard {k}: no samples count")))?;
    Ok(ShardEntry {
        file,
        zstd,
        samples,
        bytes,
        raw_bytes,
        columns,
        max_doc_bytes: u64::MAX,
    })
}

/// Shard `k`'s columns (name, encoding, fixed size), checked: as many names as encodings and
/// sizes, every fixed size within a sample, and `input_ids` and `indices` integer ndarrays.
fn shard_columns(
    index: &Path,
    k: usize,
    shard: &Value,
) -> Result<Vec<(String, Column, Option<u64>)>> {
    let bad = |what: String| schema_error(index, what);
    let names = str_list(shard.get("column_names"))
        .ok_or_else(|| bad(format!("shard {k}: no column_names")))?;
    let encodings = str_list(shard.get("column_encodings"))
        .ok_or_else(|| bad(format!("shard {k}: no column_encodings")))?;
    let sizes: Vec<Option<u64>> = shard
        .get("column_sizes")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(Value::as_u64).collect())
        .ok_or_else(|| bad(format!("shard {k}: no column_sizes")))?;
    if names.len() != encodings.len() || names.len() != sizes.len() {
        return Err(bad(format!(
            "shard {k}: column_names, column_encodings and column_sizes differ in length"
        )));
    }
    // A fixed column size is part of every sample, whose size is a u32 in the shard.
    if let Some((c, size)) = sizes
        .iter()
        .enumerate()
        .find_map(|(c, s)| s.filter(|&s| s > u32::MAX as u64).map(|s| (c, s)))
    {
        return Err(DataError::bad_file(
            index,
            Cause::Corrupt,
            format!(
                "field shards[{k}].column_sizes[{c}]: {size} bytes, more than an MDS \
                 sample can hold ({})",
                u32::MAX
            ),
        ));
    }
    for want in ["input_ids", "indices"] {
        match names.iter().position(|n| n == want) {
            None => {
                return Err(bad(format!(
                    "shard {k} has no column \"{want}\" (it has: {}); rsd reads ProLong-style MDS with input_ids and indices",
                    shortened(&names.join(", "))
                )))
            }
            Some(c) => check_ids_encoding(&encodings[c])
                .map_err(|what| bad(format!("shard {k}: column \"{want}\" {what}")))?,
        }
    }
    Ok(names
        .into_iter()
        .zip(encodings)
        .zip(sizes)
        .map(|((n, e), s)| (n, parse_encoding(&e), s))
        .collect())
}

fn str_list(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// `input_ids` and `indices` must be integer ndarrays: rsd decodes nothing else (in particular it
/// never unpickles `pkl` columns, which can run code).
fn check_ids_encoding(enc: &str) -> std::result::Result<(), String> {
    let mut parts = enc.split(':');
    if parts.next() != Some("ndarray") {
        return Err(format!(
            "is encoded \"{}\", expected \"ndarray\" (an integer ndarray: \"ndarray:uint32\" and the like)",
            shortened(enc)
        ));
    }
    match parts.next() {
        Some(dtype) if Dtype::parse(dtype).is_none() => Err(format!(
            "has dtype \"{}\", expected an integer dtype (uint8, int8, uint16, int16, uint32, int32, uint64, int64)",
            shortened(dtype)
        )),
        _ => Ok(()),
    }
}

fn parse_encoding(enc: &str) -> Column {
    let mut parts = enc.split(':');
    if parts.next() != Some("ndarray") {
        return Column::Other;
    }
    let dtype = parts.next().and_then(Dtype::parse);
    let fixed_shape = parts
        .next()
        .map(|s| s.split(',').filter_map(|d| d.parse().ok()).collect());
    Column::NdArray { dtype, fixed_shape }
}

/// The most a zstd shard is decoded to, as a multiple of its compressed size (plus
/// [`ZSTD_SLACK_BYTES`]): token ids compress two to four times; a shard that claims to
/// decompress further is a zstd bomb or a damaged index, and is not held in memory.
pub const MAX_ZSTD_RATIO: u64 = 64;
/// Added to the ratio bound, so that a tiny shard (a few samples) is never refused.
const ZSTD_SLACK_BYTES: u64 = 1 << 20;

/// A zstd shard's bytes, decoded no further than the size the index declares (`raw_data.bytes`;
/// the most an MDS shard can have when it declares none), and never further than
/// [`MAX_ZSTD_RATIO`] times its compressed size (+ 1 MiB): a small file that decompresses to
/// gigabytes is refused, not held in memory. Data that does not decode to the end gives what did
/// decode and the damage.
fn decode_zstd(entry: &ShardEntry, file: std::fs::File) -> Result<(Vec<u8>, Option<DataError>)> {
    let path = &entry.file;
    let compressed = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let by_ratio = compressed
        .saturating_mul(MAX_ZSTD_RATIO)
        .saturating_add(ZSTD_SLACK_BYTES);
    let declared = entry
        .raw_bytes
        .unwrap_or(MAX_SHARD_BYTES)
        .min(MAX_SHARD_BYTES);
    let cap = declared.min(by_ratio);
    let mut raw = vec![];
    let decoded = zstd::stream::read::Decoder::new(file)
        .and_then(|d| d.take(cap.saturating_add(1)).read_to_end(&mut raw));
    if raw.len() as u64 > cap {
        let bound = if by_ratio < declared {
            format!(
                "{MAX_ZSTD_RATIO} times its {compressed} compressed bytes + 1 MiB, the most rsd \
                 decodes a zstd shard to ({})",
                match entry.raw_bytes {
                    Some(n) => format!("index.json declares {n} bytes, raw_data.bytes"),
                    None => "index.json declares no raw_data.bytes".into(),
                }
            )
        } else if entry.raw_bytes.is_some() {
            "the size index.json declares for it (raw_data.bytes)".into()
        } else {
            "the most the MDS format allows (index.json declares no raw_data.bytes)".into()
        };
        return Err(DataError::bad_file(
            path,
            Cause::Corrupt,
            format!(
                "decompresses to more than {cap} bytes, {bound}; a zstd bomb or a damaged index"
            ),
        ));
    }
    let mut damage = None;
    if let Err(e) = decoded {
        let cause = if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Cause::Truncated
        } else {
            Cause::Corrupt
        };
        damage = Some(DataError::bad_file(
            path,
            cause,
            format!(
                "{} zstd data after decompressed byte {}: {e}",
                if cause == Cause::Truncated {
                    "truncated"
                } else {
                    "corrupt"
                },
                raw.len()
            ),
        ));
    }
    Ok((raw, damage))
}

/// Checks a shard's header and offset table against its `samples` count and its size: how many
/// samples can be read, and the damage reported after them (`damage`, that of the zstd data,
/// if any, else a table that runs past the end). With damaged zstd data, the decoding error
/// explains whatever else is wrong.
fn readable_samples(
    path: &Path,
    bytes: &[u8],
    samples: u64,
    mut damage: Option<DataError>,
) -> Result<(usize, Option<DataError>)> {
    let mut fail = |cause, what: String| {
        damage
            .take()
            .unwrap_or_else(|| DataError::bad_file(path, cause, what))
    };
    if bytes.len() < 8 {
        return Err(fail(
            Cause::Truncated,
            format!("{} bytes: too short for an MDS shard header", bytes.len()),
        ));
    }
    let n = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if n as u64 != samples {
        return Err(fail(
            Cause::Corrupt,
            format!("header says {n} samples, index.json says {samples}"),
        ));
    }
    let table_end = 4 + 4 * (n + 1);
    if bytes.len() < table_end {
        return Err(fail(
            Cause::Truncated,
            format!(
                "truncated: {} bytes, the offset table alone needs {table_end}",
                bytes.len()
            ),
        ));
    }
    let last = u32_at(bytes, 4 + 4 * n) as usize;
    // Samples that end inside the file are intact even if the file is cut short.
    let intact = (0..n)
        .take_while(|&i| (u32_at(bytes, 8 + 4 * i) as usize) <= bytes.len())
        .count();
    if damage.is_none() && last > bytes.len() {
        damage = Some(DataError::bad_file(
            path,
            Cause::Truncated,
            format!(
                "truncated: the offset table ends at byte {last} but the file has {} bytes; samples {intact}.. are lost",
                bytes.len()
            ),
        ));
    } else if damage.is_none() && last < bytes.len() {
        return Err(DataError::bad_file(
            path,
            Cause::Corrupt,
            format!(
                "padded: the offset table ends at byte {last} but the file has {} bytes",
                bytes.len()
            ),
        ));
    }
    Ok((if damage.is_some() { intact } else { n }, damage))
}

enum Bytes {
    Mapped(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// The documents of one shard file.
struct ShardDocs {
    entry: ShardEntry,
    /// `entry.file`, shared by the documents.
    path: Arc<Path>,
    bytes: Arc<Bytes>,
    n: usize,
    sample: usize,
    pending: std::vec::IntoIter<Result<RawDoc>>,
    /// Why the samples from `n` on cannot be read: reported after the intact ones.
    damage: Option<DataError>,
}

impl ShardDocs {
    fn open(entry: ShardEntry) -> Result<ShardDocs> {
        let path = &entry.file;
        let file = open_regular(path)?;
        // A zstd shard that does not decode to the end keeps what did decode: the samples before
        // the damage are read, then the damage is reported.
        let (bytes, damage) = if entry.zstd {
            let (raw, damage) = decode_zstd(&entry, file)?;
            (Bytes::Owned(raw), damage)
        } else {
            // SAFETY: read-only map of an input file we do not modify.
            let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(path, e))?;
            (Bytes::Mapped(map), None)
        };
        let (n, damage) = readable_samples(path, &bytes, entry.samples, damage)?;
        Ok(ShardDocs {
            path: Arc::from(entry.file.as_path()),
            entry,
            bytes: Arc::new(bytes),
            n,
            sample: 0,
            pending: Vec::new().into_iter(),
            damage,
        })
    }

    /// Split sample `i` into its documents.
    /// Sample `i`'s `input_ids` and `indices` arrays.
    fn sample_arrays(&self, i: usize, loc: &str) -> Result<(NdArray<'_>, NdArray<'_>)> {
        let path = &self.entry.file;
        let bytes = &self.bytes[..];
        let (start, end) = (
            u32_at(bytes, 4 + 4 * i) as usize,
            u32_at(bytes, 8 + 4 * i) as usize,
        );
        if start > end || end > bytes.len() {
            return Err(DataError::bad_record(
                path,
                loc,
                format!(
                    "offsets {start}..{end} outside the {}-byte file",
                    bytes.len()
                ),
            ));
        }
        let sample = &bytes[start..end];
        // Sizes of the variable-size columns come first.
        let variable = self
            .entry
            .columns
            .iter()
            .filter(|(_, _, s)| s.is_none())
            .count();
        if sample.len() < 4 * variable {
            return Err(DataError::bad_record(
                path,
                loc,
                "sample shorter than its column size table",
            ));
        }
        let mut var_sizes = (0..variable).map(|k| u32_at(sample, 4 * k));
        let mut at = 4 * variable;
        let (mut ids, mut indices) = (None, None);
        for (name, column, fixed) in &self.entry.columns {
            // Sizes come from the index and the sample: checked sums, never trusted to fit.
            let size = match fixed {
                Some(s) => *s,
                None => var_sizes.next().unwrap_or(0) as u64,
            };
            let end = (at as u64).checked_add(size);
            let Some(end) = end.filter(|&e| e <= sample.len() as u64) else {
                return Err(DataError::bad_record(
                    path,
                    loc,
                    format!(
                        "column \"{}\" needs {size} bytes from byte {at} of a {}-byte sample",
                        shortened(name),
                        sample.len()
                    ),
                ));
            };
            let data = &sample[at..end as usize];
            at = end as usize;
            if name == "input_ids" || name == "indices" {
                let array = decode_ndarray(column, data).map_err(|what| {
                    DataError::bad_record(path, loc, format!("column \"{name}\": {what}"))
                })?;
                if name == "input_ids" {
                    ids = Some(array);
                } else {
                    indices = Some(array);
                }
            }
        }
        let (Some(ids), Some(indices)) = (ids, indices) else {
            return Err(DataError::bad_record(
                path,
                loc,
                "missing input_ids or indices",
            ));
        };
        Ok((ids, indices))
    }

    fn sample_docs(&self, i: usize) -> Result<Vec<Result<RawDoc>>> {
        let path = &self.entry.file;
        let loc = format!("sample {i}");
        let ((id_dtype, _, id_bytes), (ix_dtype, ix_shape, ix_bytes)) =
            self.sample_arrays(i, &loc)?;
        let n_ids = id_bytes.len() / id_dtype.size();
        let n_ix = ix_bytes.len() / ix_dtype.size();
        if n_ix % 2 != 0 || (ix_shape.len() == 2 && ix_shape[1] != 2) {
            return Err(DataError::bad_record(
                path,
                &loc,
                format!(
                    "indices has shape {}, expected (documents, 2)",
                    shape_text(&ix_shape)
                ),
            ));
        }
        let mut docs = vec![];
        let spans: Vec<(i64, i64)> = if n_ix == 0 {
            vec![(0, n_ids as i64)]
        } else {
            (0..n_ix / 2)
                .map(|d| {
                    (
                        ix_dtype.get(ix_bytes, 2 * d),
                        ix_dtype.get(ix_bytes, 2 * d + 1),
                    )
                })
                .collect()
        };
        // The documents are copied out of the sample: their spans may cover the ids at most
        // once in all, so a sample holds no more than its own ids again (overlapping spans
        // would copy them once per document).
        let mut covered = 0u64;
        for (d, (s, e)) in spans.into_iter().enumerate() {
            if s < 0 || e < s || e as usize > n_ids {
                return Err(DataError::bad_record(
                    path,
                    &loc,
                    format!(
                        "document {d} spans tokens {s}..{e}, outside input_ids of length {n_ids}"
                    ),
                ));
            }
            if e == s {
                continue;
            }
            covered += (e - s) as u64;
            if covered > n_ids as u64 {
                return Err(DataError::bad_record(
                    path,
                    &loc,
                    format!(
                        "column \"indices\": document {d} spans tokens {s}..{e}, and the \
                         documents' spans so far cover {covered} tokens, more than the {n_ids} of \
                         input_ids: spans overlap"
                    ),
                ));
            }
            let doc_bytes = (e - s) as u64 * id_dtype.size() as u64;
            if doc_bytes > self.entry.max_doc_bytes {
                docs.push(Err(DataError::bad_record(
                    path,
                    format!("sample {i} document {d}"),
                    format!(
                        "{doc_bytes} bytes of token ids, more than --max-doc-bytes ({})",
                        self.entry.max_doc_bytes
                    ),
                )));
                continue;
            }
            let tokens = span_tokens(id_dtype, id_bytes, s as usize, e as usize)
                .map_err(|what| DataError::bad_record(path, &loc, what))?;
            docs.push(Ok(RawDoc {
                path: self.path.clone(),
                location: format!("sample {i} document {d}"),
                bytes: (tokens.len() * id_dtype.size()) as u64,
                content: Content::Tokens {
                    ids: tokens,
                    first_in_sample: docs.is_empty(),
                },
            }));
        }
        Ok(docs)
    }
}

type NdArray<'a> = (Dtype, Vec<u64>, &'a [u8]);

fn decode_ndarray<'a>(column: &Column, data: &'a [u8]) -> std::result::Result<NdArray<'a>, String> {
    let Column::NdArray { dtype, fixed_shape } = column else {
        return Err("expected an ndarray encoding".into());
    };
    let mut at = 0;
    let dtype = match dtype {
        Some(d) => *d,
        None => {
            let code = *data.first().ok_or("empty")?;
            at += 1;
            Dtype::from_code(code).ok_or(format!(
                "ndarray dtype code {code}, expected an integer dtype's (8, 9, 16, 17, 32, 33, 64 or 65)"
            ))?
        }
    };
    let shape = match fixed_shape {
        Some(s) => s.clone(),
        None => {
            let byte = *data.get(at).ok_or("truncated before the shape byte")?;
            at += 1;
            let ndim = (byte >> 2) as usize;
            let width = 1usize << (byte & 3);
            let need = ndim * width;
            let raw = data.get(at..at + need).ok_or("truncated shape")?;
            at += need;
            (0..ndim)
                .map(|k| {
                    let mut b = [0u8; 8];
                    b[..width].copy_from_slice(&raw[k * width..(k + 1) * width]);
                    u64::from_le_bytes(b)
                })
                .collect()
        }
    };
    let values = &data[at..];
    let need = shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| n.checked_mul(dtype.size() as u64));
    if need != Some(values.len() as u64) {
        return Err(format!(
            "shape {} needs {} value bytes, found {}",
            shape_text(&shape),
            need.map_or("more than 2^64".to_string(), |n| n.to_string()),
            values.len()
        ));
    }
    Ok((dtype, shape, values))
}

/// The ids `input_ids[s..e]` as token ids; an id that does not fit a u32 is an error.
fn span_tokens(
    dtype: Dtype,
    id_bytes: &[u8],
    s: usize,
    e: usize,
) -> std::result::Result<Vec<u32>, String> {
    let size = dtype.size();
    let span = &id_bytes[s * size..e * size];
    Ok(match dtype {
        // The common case (ProLong: uint32) converts in bulk.
        Dtype::U32 => le_u32s(span),
        Dtype::U16 => span
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]) as u32)
            .collect(),
        _ => {
            let mut tokens = Vec::with_capacity(e - s);
            for t in s..e {
                let v = dtype.get(id_bytes, t);
                if !(0..=u32::MAX as i64).contains(&v) {
                    return Err(format!("input_ids[{t}] = {v} is not a token id"));
                }
                tokens.push(v as u32);
            }
            tokens
        }
    })
}

/// A shape for messages: `[a, b]`.
fn shape_text(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

/// Little-endian u32s from (possibly unaligned) bytes: one memcpy on little-endian machines.
fn le_u32s(src: &[u8]) -> Vec<u32> {
    let n = src.len() / 4;
    if cfg!(target_endian = "little") {
        let mut ids: Vec<u32> = Vec::with_capacity(n);
        // SAFETY: the destination has room for `n` u32s = `4n` bytes, the source holds at least
        // `4n` bytes, they do not overlap, and every byte pattern is a valid u32; `set_len` follows
        // the copy that initialised all `n` elements.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), ids.as_mut_ptr().cast::<u8>(), 4 * n);
            ids.set_len(n);
        }
        ids
    } else {
        src.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

impl Iterator for ShardDocs {
    type Item = Result<RawDoc>;
    fn next(&mut self) -> Option<Result<RawDoc>> {
        loop {
            if let Some(doc) = self.pending.next() {
                return Some(doc);
            }
            if self.sample >= self.n {
                return self.damage.take().map(Err);
            }
            let i = self.sample;
            self.sample += 1;
            match self.sample_docs(i) {
                Ok(docs) => self.pending = docs.into_iter(),
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! MDS written by a stranger: indexes with hostile sizes and names, shards with random
    //! damage. The answer is a clear error or correct documents, never a panic.

    use super::*;
    use proptest::prelude::*;
    use rsd_common::safe_fs::FsError;
    use serde_json::json;

    /// One ndarray column value: shape byte (u32 dims), shape, uint32 values.
    fn ndarray_u32(shape: &[u32], values: &[u32]) -> Vec<u8> {
        let mut out = vec![((shape.len() as u8) << 2) | 2];
        for d in shape {
            out.extend_from_slice(&d.to_le_bytes());
        }
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// One sample: its `input_ids` and the `(start, end)` of each document in them.
    type Sample = (Vec<u32>, Vec<(u32, u32)>);

    /// An MDS shard (no writer config) of `samples`, with columns `indices` and `input_ids`,
    /// both `ndarray:uint32` of variable size.
    fn shard_bytes(samples: &[Sample]) -> Vec<u8> {
        let encoded: Vec<Vec<u8>> = samples
            .iter()
            .map(|(ids, spans)| {
                let flat: Vec<u32> = spans.iter().flat_map(|&(s, e)| [s, e]).collect();
                let indices = ndarray_u32(&[spans.len() as u32, 2], &flat);
                let ids = ndarray_u32(&[ids.len() as u32], ids);
                let mut out = vec![];
                out.extend_from_slice(&(indices.len() as u32).to_le_bytes());
                out.extend_from_slice(&(ids.len() as u32).to_le_bytes());
                out.extend(indices);
                out.extend(ids);
                out
            })
            .collect();
        let n = samples.len();
        let mut out = (n as u32).to_le_bytes().to_vec();
        let mut offset = (4 + 4 * (n + 1)) as u32;
        out.extend_from_slice(&offset.to_le_bytes());
        for s in &encoded {
            offset += s.len() as u32;
            out.extend_from_slice(&offset.to_le_bytes());
        }
        for s in encoded {
            out.extend(s);
        }
        out
    }

    fn index_json(samples: u64, raw_bytes: u64) -> Value {
        json!({"version": 2, "shards": [{
            "format": "mds", "version": 2,
            "column_names": ["indices", "input_ids"],
            "column_encodings": ["ndarray:uint32", "ndarray:uint32"],
            "column_sizes": [null, null],
            "compression": null, "hashes": [], "size_limit": 1 << 26, "zip_data": null,
            "raw_data": {"basename": "shard.00000.mds", "bytes": raw_bytes, "hashes": {}},
            "samples": samples,
        }]})
    }

    fn samples() -> Vec<Sample> {
        vec![
            ((1..=10).collect(), vec![(0, 4), (4, 10)]),
            ((11..=16).collect(), vec![(0, 6)]),
        ]
    }

    /// Every document (or error) of the dataset `index` describes in `dir`.
    fn read_all(dir: &Path, index: &Value, max_doc_bytes: u64) -> Result<Vec<Result<RawDoc>>> {
        let text = serde_json::to_vec(index).unwrap();
        let dataset = MdsDataset::parse(dir, &dir.join("index.json"), &text)?;
        Ok(dataset.documents(max_doc_bytes).collect())
    }

    fn ids(docs: &[Result<RawDoc>]) -> Vec<Vec<u32>> {
        docs.iter()
            .map(|d| match &d.as_ref().unwrap().content {
                Content::Tokens { ids, .. } => ids.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    /// An index listing one shard twice (by the same name, or by a link to it) is refused
    /// naming both entries, before any shard is read; two shards are read once each.
    #[test]
    fn an_index_listing_one_shard_twice_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let bytes = shard_bytes(&samples());
        std::fs::write(tmp.path().join("shard.00000.mds"), &bytes).unwrap();
        std::fs::write(tmp.path().join("shard.00001.mds"), &bytes).unwrap();
        std::os::unix::fs::symlink("shard.00000.mds", tmp.path().join("again.mds")).unwrap();
        let one = index_json(2, bytes.len() as u64)["shards"][0].clone();
        let named = |name: &str| {
            let mut s = one.clone();
            s["raw_data"]["basename"] = json!(name);
            s
        };
        let two =
            json!({"version": 2, "shards": [named("shard.00000.mds"), named("shard.00001.mds")]});
        assert_eq!(read_all(tmp.path(), &two, u64::MAX).unwrap().len(), 6);
        for second in ["shard.00000.mds", "./shard.00000.mds", "again.mds"] {
            let index = json!({"version": 2, "shards": [
                named("shard.00000.mds"), named("shard.00001.mds"), named(second)]});
            let Err(e) = read_all(tmp.path(), &index, u64::MAX) else {
                panic!("{second}: accepted");
            };
            let text = e.to_string();
            assert!(
                text.contains("index.json")
                    && text.contains(
                        "field shards[2].raw_data.basename names the same file as shards[0]"
                    )
                    && text.contains("a shard may be listed once"),
                "{second}: {text}"
            );
        }
    }

    #[test]
    fn a_valid_shard_reads_back_its_documents() {
        let tmp = tempfile::tempdir().unwrap();
        let bytes = shard_bytes(&samples());
        std::fs::write(tmp.path().join("shard.00000.mds"), &bytes).unwrap();
        let docs = read_all(tmp.path(), &index_json(2, bytes.len() as u64), u64::MAX).unwrap();
        assert_eq!(
            ids(&docs),
            vec![vec![1, 2, 3, 4], (5..=10).collect(), (11..=16).collect()]
        );
        // A document above the size limit (20 bytes: 5 ids) is a bad record; the others are read.
        let docs = read_all(tmp.path(), &index_json(2, bytes.len() as u64), 20).unwrap();
        let text = docs[1].as_ref().unwrap_err().to_string();
        assert!(
            text.contains("sample 0 document 1") && text.contains("--max-doc-bytes (20)"),
            "{text}"
        );
        assert_eq!(ids(&docs[..1]), vec![vec![1, 2, 3, 4]]);
        assert!(docs[2].is_err());
    }

    #[test]
    fn a_column_size_near_u64_max_is_an_error_naming_the_field() {
        let tmp = tempfile::tempdir().unwrap();
        let bytes = shard_bytes(&samples());
        std::fs::write(tmp.path().join("shard.00000.mds"), &bytes).unwrap();
        for size in [u64::MAX, u64::MAX - 3, 1 << 40] {
            let mut index = index_json(2, bytes.len() as u64);
            index["shards"][0]["column_sizes"][1] = json!(size);
            let err = read_all(tmp.path(), &index, u64::MAX)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("index.json")
                    && err.contains("shards[0].column_sizes[1]")
                    && err.contains(&size.to_string()),
                "{err}"
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A valid shard with bytes overwritten anywhere (header, offset table, size table,
        /// shapes, values): errors or documents, never a panic.
        #[test]
        fn damaged_shard_never_panics(
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            cut in proptest::option::of(any::<prop::sample::Index>()),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let mut bytes = shard_bytes(&samples());
            let declared = bytes.len() as u64;
            for (at, byte) in &edits {
                let i = at.index(bytes.len());
                bytes[i] = *byte;
            }
            if let Some(cut) = cut {
                bytes.truncate(cut.index(bytes.len()));
            }
            std::fs::write(tmp.path().join("shard.00000.mds"), &bytes).unwrap();
            if let Ok(docs) = read_all(tmp.path(), &index_json(2, declared), u64::MAX) {
                for doc in docs.into_iter().flatten() {
                    let Content::Tokens { ids, .. } = doc.content else {
                        return Err(TestCaseError::fail("MDS yields token ids"));
                    };
                    prop_assert!(ids.len() <= bytes.len() / 4);
                }
            }
        }

        /// Any values in the index's size, count and name fields: an error or documents, never a
        /// panic; a name that is not a plain relative path is refused naming its field.
        #[test]
        fn any_index_fields_never_panic(
            size0 in proptest::option::of(any::<u64>()),
            size1 in proptest::option::of(prop_oneof![any::<u64>(), (u64::MAX - 16)..=u64::MAX]),
            samples_count in prop_oneof![any::<u64>(), 0u64..4],
            basename in prop_oneof![
                Just("shard.00000.mds".to_string()),
                "[a-z./\\\\:-]{0,12}",
                Just("../shard.00000.mds".to_string()),
                Just("/etc/passwd".to_string()),
            ],
            zstd in any::<bool>(),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let bytes = shard_bytes(&samples());
            std::fs::write(tmp.path().join("shard.00000.mds"), &bytes).unwrap();
            let mut index = index_json(samples_count, bytes.len() as u64);
            let shard = &mut index["shards"][0];
            shard["column_sizes"] = json!([size0, size1]);
            shard["raw_data"]["basename"] = json!(basename);
            if zstd {
                shard["compression"] = json!("zstd");
                shard["zip_data"] = json!({"basename": basename, "bytes": 10});
            }
            match read_all(tmp.path(), &index, u64::MAX) {
                Ok(docs) => drop(docs),
                Err(DataError::File(FsError::UnsafeName(refused))) => {
                    let field = &refused.named_by.field;
                    prop_assert!(field.ends_with(".basename"), "{field}");
                    prop_assert!(rsd_common::safe_fs::check_relative_name(&basename).is_err());
                }
                Err(_) => {}
            }
        }

        /// Any bytes as an ndarray column, under any encoding: an error or an array whose values
        /// fill the bytes, never a panic.
        #[test]
        fn decode_ndarray_never_panics(
            data in proptest::collection::vec(any::<u8>(), 0..64),
            dtype in proptest::option::of(prop_oneof![Just(Dtype::U8), Just(Dtype::U32), Just(Dtype::I64)]),
            fixed_shape in proptest::option::of(proptest::collection::vec(any::<u64>(), 0..3)),
        ) {
            let column = Column::NdArray { dtype, fixed_shape };
            if let Ok((dtype, shape, values)) = decode_ndarray(&column, &data) {
                let count: u64 = shape.iter().product();
                prop_assert_eq!(count * dtype.size() as u64, values.len() as u64);
            }
        }
    }
}
