//! Parquet: the text column is read row group by row group with a projection, so only that column
//! is decoded and memory stays at one batch.
//!
//! A Parquet file says how large its pieces are, and the reader believes it: a page declares its
//! uncompressed size (up to 2 GiB) and is decompressed whole before any value in it can be checked
//! against `--max-doc-bytes`, and a dictionary value is copied into every row that refers to it.
//! So before anything is decoded, the text column's metadata and page headers are checked
//! ([`check_column`]):
//!
//! * every column chunk lies inside the file, and declares at most `--max-doc-bytes` (plus a
//!   little per value) per row of its row group;
//! * every page declares at most `--max-doc-bytes` + [`PAGE_SLACK`] uncompressed bytes (writers
//!   cut pages at about 1 MiB, and a page holds at least one value).
//!
//! The footer and the page headers are Thrift structs, whose readers allocate a binary's declared
//! length and a list's declared count before reading them, so each is checked against the bytes
//! present before it is parsed ([`check_footer`], [`read_page_header`], and
//! [`thrift_check`](super::thrift_check) for how).
//!
//! The column is then read as Utf8View, whose values point into the page (or dictionary) they
//! came from instead of being copied, so a dictionary value shared by many rows is held once;
//! only `DELTA_BYTE_ARRAY` pages build each value anew (from the previous one's prefix), so when
//! the column has such pages the batch holds fewer rows ([`batch_rows`]).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema};
use parquet::arrow::arrow_reader::{
    ArrowReaderMetadata, ArrowReaderOptions, ParquetRecordBatchReader,
    ParquetRecordBatchReaderBuilder,
};
use parquet::arrow::ProjectionMask;
use parquet::file::metadata::{ColumnChunkMetaData, ParquetMetaData};
use parquet::format::{Encoding, FileMetaData, PageHeader, PageType};

use rsd_common::safe_fs::open_regular;

use super::arrow_ipc::{column_index, head_and_tail, TextBatches};
use super::thrift_check;
use crate::error::{Cause, DataError, Result};

/// Rows per batch: enough that decoding costs little per document.
const BATCH_ROWS: usize = 256;

/// How far a page may exceed `--max-doc-bytes`: writers cut pages (dictionary pages too) at
/// about 1 MiB by default (parquet-rs, pyarrow, parquet-mr), so an honest page is at most that
/// plus one value; 64 MiB leaves room for writers configured with larger pages.
pub(super) const PAGE_SLACK: u64 = 64 << 20;

/// Bytes per value a column chunk may hold beyond the value itself: a length prefix, levels.
const VALUE_OVERHEAD: u64 = 16;

/// The most memory a footer's lists may make the parse reserve: an honest footer of a million
/// column chunks takes about half of it.
const FOOTER_RESERVE_LIMIT: u64 = 1 << 30;

/// Bytes a column chunk may hold beyond its values: a dictionary page's and page headers' room.
const CHUNK_SLACK: u64 = 1 << 20;

/// Decoded bytes a batch of `DELTA_BYTE_ARRAY` values may reach: each such value is built anew
/// and can be as long as its page, so a batch of N rows holds up to N pages' worth.
const DELTA_BATCH_BYTES: u64 = 1 << 30;

/// Rows per batch for a column whose largest `DELTA_BYTE_ARRAY` page declares `largest_delta`
/// uncompressed bytes (0: none): at most [`BATCH_ROWS`], at least 1, and few enough that that
/// many values of that size stay within [`DELTA_BATCH_BYTES`].
pub(super) fn batch_rows(largest_delta: u64) -> usize {
    let fit = DELTA_BATCH_BYTES / largest_delta.max(1);
    usize::try_from(fit).map_or(BATCH_ROWS, |f| f.clamp(1, BATCH_ROWS))
}

pub(super) fn open(
    path: &Path,
    field: &str,
    max_doc_bytes: u64,
) -> Result<TextBatches<ParquetRecordBatchReader>> {
    let file = open_regular(path)?;
    check_footer(path, &file)?;
    let meta = match ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()) {
        Ok(m) => m,
        Err(e) => return Err(open_error(path, e)),
    };
    let index = column_index(path, meta.schema(), field)?;
    let largest_delta = check_column(path, &file, meta.metadata(), index, field, max_doc_bytes)?;
    // Read a string column as Utf8View (values are views into their page or dictionary, not
    // copies); any other type is read as it is, and refused as not text by `TextBatches`.
    let meta = match meta.schema().field(index).data_type() {
        DataType::Utf8 | DataType::LargeUtf8 => {
            let fields: Vec<Field> = meta
                .schema()
                .fields()
                .iter()
                .enumerate()
                .map(|(k, f)| {
                    let f = f.as_ref().clone();
                    if k == index {
                        f.with_data_type(DataType::Utf8View)
                    } else {
                        f
                    }
                })
                .collect();
            let schema = Schema::new_with_metadata(fields, meta.schema().metadata().clone());
            let options = ArrowReaderOptions::new().with_schema(Arc::new(schema));
            ArrowReaderMetadata::try_new(meta.metadata().clone(), options).map_err(|e| {
                DataError::bad_file(
                    path,
                    Cause::Corrupt,
                    format!("cannot read column \"{field}\" as text: {e}"),
                )
            })?
        }
        _ => meta,
    };
    let builder = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta);
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(batch_rows(largest_delta))
        .build()
        .map_err(|e| {
            DataError::bad_file(
                path,
                Cause::Corrupt,
                format!("cannot read column \"{field}\": {e}"),
            )
        })?;
    Ok(TextBatches::new(path, reader, field, max_doc_bytes))
}

/// Check what the file declares about the text column (top-level column `index`) before any of
/// it is decoded: each column chunk lies inside the file and declares at most
/// `rows × (max_doc_bytes + VALUE_OVERHEAD) + CHUNK_SLACK` uncompressed bytes, and each of its
/// pages at most `max_doc_bytes + PAGE_SLACK`. Reads the page headers only, skipping the pages.
/// Returns the largest uncompressed size of a `DELTA_BYTE_ARRAY` data page (0 if none).
fn check_column(
    path: &Path,
    file: &File,
    metadata: &ParquetMetaData,
    index: usize,
    field: &str,
    max_doc_bytes: u64,
) -> Result<u64> {
    let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let mut input = BufReader::with_capacity(64 << 10, file);
    let schema = metadata.file_metadata().schema_descr();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&leaf| schema.get_column_root_idx(leaf) == index)
        .collect();
    // Every extent is checked, and checked against the others, before any page header is read:
    // a footer of many row groups that all point at one chunk would otherwise be read (and
    // decoded) once per row group.
    let mut chunks = vec![];
    // The file's first row in the row group, for messages (rows are counted across the file).
    let mut first_row = 0u64;
    for (rg, group) in metadata.row_groups().iter().enumerate() {
        for &leaf in &leaves {
            let at = ChunkAt {
                path,
                rg,
                first_row,
                field,
            };
            let rows = u64::try_from(group.num_rows())
                .map_err(|_| at.bad(format!("a row count of {}", group.num_rows())))?;
            let (start, end) =
                chunk_extent(&at, group.column(leaf), rows, file_len, max_doc_bytes)?;
            chunks.push((at, leaf, start, end));
        }
        first_row = first_row.saturating_add(u64::try_from(group.num_rows()).unwrap_or(0));
    }
    check_disjoint(&chunks, schema)?;
    let mut largest_delta = 0u64;
    for (at, _, start, end) in &chunks {
        let delta = check_pages(at, &mut input, *start, *end, max_doc_bytes)?;
        largest_delta = largest_delta.max(delta);
    }
    Ok(largest_delta)
}

/// Refuses column chunks whose bytes overlap (or repeat) those of another: a writer gives every
/// column chunk of every row group bytes of its own, and a footer that points several at the
/// same bytes makes a few bytes of file decode once per reference. `chunks` holds each chunk's
/// row group, leaf column and extent `[start, end)`; empty extents hold no bytes to share.
fn check_disjoint(
    chunks: &[(ChunkAt<'_>, usize, u64, u64)],
    schema: &parquet::schema::types::SchemaDescriptor,
) -> Result<()> {
    let mut order: Vec<usize> = (0..chunks.len())
        .filter(|&k| chunks[k].2 < chunks[k].3)
        .collect();
    order.sort_by_key(|&k| (chunks[k].2, chunks[k].3));
    for pair in order.windows(2) {
        let (before, after) = (&chunks[pair[0]], &chunks[pair[1]]);
        if after.2 < before.3 {
            let leaf_name = |leaf: usize| schema.column(leaf).path().string();
            let (at, _, start, end) = after;
            return Err(at.bad(format!(
                "the column chunk of leaf \"{}\" at bytes {start}..{end} overlaps that of leaf \
                 \"{}\" in row group {} at bytes {}..{}; every column chunk must have bytes of \
                 its own (a crafted footer reads the same bytes again for each reference)",
                leaf_name(after.1),
                leaf_name(before.1),
                before.0.rg,
                before.2,
                before.3
            )));
        }
    }
    Ok(())
}

/// Which column chunk [`check_column`] is checking, for its messages.
struct ChunkAt<'a> {
    path: &'a Path,
    /// The row group.
    rg: usize,
    /// The file's first row in the row group.
    first_row: u64,
    field: &'a str,
}

impl ChunkAt<'_> {
    /// The chunk is corrupt: `what`.
    fn bad(&self, what: String) -> DataError {
        let ChunkAt {
            rg,
            first_row,
            field,
            ..
        } = self;
        DataError::bad_file(
            self.path,
            Cause::Corrupt,
            format!("row group {rg} (first row {first_row}), column \"{field}\": {what}"),
        )
    }
}

/// Where a column chunk of `rows` rows lies, `[start, end)`, checked to lie inside the file and
/// to declare no more uncompressed bytes than `max_doc_bytes` per row allows.
fn chunk_extent(
    at: &ChunkAt<'_>,
    chunk: &ColumnChunkMetaData,
    rows: u64,
    file_len: u64,
    max_doc_bytes: u64,
) -> Result<(u64, u64)> {
    let start = chunk
        .dictionary_page_offset()
        .unwrap_or_else(|| chunk.data_page_offset());
    // Checked here, not trusted: the parquet crate asserts (panics) on negative ones.
    let (start, len) = match (u64::try_from(start), u64::try_from(chunk.compressed_size())) {
        (Ok(s), Ok(l)) if s.checked_add(l).is_some_and(|end| end <= file_len) => (s, l),
        _ => {
            return Err(at.bad(format!(
                "the column chunk at offset {start}, {} bytes long, does not lie inside \
                 the file ({file_len} bytes)",
                chunk.compressed_size()
            )))
        }
    };
    let declared = chunk.uncompressed_size();
    let chunk_limit = rows
        .saturating_mul(max_doc_bytes.saturating_add(VALUE_OVERHEAD))
        .saturating_add(CHUNK_SLACK);
    if u64::try_from(declared).map_or(true, |d| d > chunk_limit) {
        return Err(at.bad(format!(
            "the column chunk declares {declared} bytes uncompressed for {rows} rows, more \
             than --max-doc-bytes ({max_doc_bytes} bytes) per row allows ({chunk_limit} \
             bytes)"
        )));
    }
    Ok((start, start + len))
}

/// Reads the headers of the pages in `[start, end)`, skipping the pages, and checks that none
/// declares more than `max_doc_bytes + PAGE_SLACK` uncompressed bytes. Returns the largest
/// uncompressed size of a `DELTA_BYTE_ARRAY` data page (0 if none).
fn check_pages(
    at: &ChunkAt<'_>,
    input: &mut BufReader<&File>,
    start: u64,
    end: u64,
    max_doc_bytes: u64,
) -> Result<u64> {
    let page_limit = max_doc_bytes.saturating_add(PAGE_SLACK);
    let header_cap = page_header_cap(max_doc_bytes);
    let mut largest_delta = 0u64;
    let mut pos = start;
    let mut page = 0usize;
    let mut buf = Vec::new();
    while pos < end {
        let (header, header_len) =
            read_page_header(at, input, &mut buf, page, pos, end, header_cap)?;
        let (Ok(compressed), Ok(uncompressed)) = (
            u64::try_from(header.compressed_page_size),
            u64::try_from(header.uncompressed_page_size),
        ) else {
            return Err(at.bad(format!(
                "page {page}: negative page size ({} compressed, {} uncompressed)",
                header.compressed_page_size, header.uncompressed_page_size
            )));
        };
        if uncompressed > page_limit {
            return Err(at.bad(format!(
                "page {page} declares {uncompressed} bytes uncompressed, more than \
                 --max-doc-bytes ({max_doc_bytes} bytes) + {} MiB allows; not decoding it",
                PAGE_SLACK >> 20
            )));
        }
        let delta = match header.type_ {
            PageType::DATA_PAGE => header
                .data_page_header
                .as_ref()
                .is_some_and(|h| h.encoding == Encoding::DELTA_BYTE_ARRAY),
            PageType::DATA_PAGE_V2 => header
                .data_page_header_v2
                .as_ref()
                .is_some_and(|h| h.encoding == Encoding::DELTA_BYTE_ARRAY),
            _ => false,
        };
        if delta {
            largest_delta = largest_delta.max(uncompressed);
        }
        // Past the chunk's end is the reader's error to report (a truncated chunk).
        pos = pos.saturating_add(header_len).saturating_add(compressed);
        page += 1;
    }
    Ok(largest_delta)
}

/// The most bytes a page header may take: its statistics may hold a column's smallest and
/// largest value, in both the old and the new fields (four values of up to `--max-doc-bytes`),
/// plus [`PAGE_SLACK`] for the rest. Only the bytes a header really has are ever read.
fn page_header_cap(max_doc_bytes: u64) -> u64 {
    max_doc_bytes.saturating_mul(4).saturating_add(PAGE_SLACK)
}

/// First bytes of a page header read at once (most take under a hundred); more are read,
/// doubling, only if it is longer.
const HEADER_READ: u64 = 8 << 10;

/// Reads page `page`'s header at `pos` (its column chunk ends at `end`), checked before it is
/// parsed ([`thrift_check::read_checked`]): no binary length or element count in it may exceed
/// the bytes that follow in the chunk, nor the header `cap`. Returns it and its length in bytes.
fn read_page_header(
    at: &ChunkAt<'_>,
    input: &mut BufReader<&File>,
    buf: &mut Vec<u8>,
    page: usize,
    pos: u64,
    end: u64,
    cap: u64,
) -> Result<(PageHeader, u64)> {
    let region = end - pos;
    let limit = region.min(cap);
    let mut want = limit.min(HEADER_READ);
    loop {
        input
            .seek(SeekFrom::Start(pos))
            .map_err(|e| DataError::io(at.path, e))?;
        buf.clear();
        (&mut *input)
            .take(want)
            .read_to_end(buf)
            .map_err(|e| DataError::io(at.path, e))?;
        let e = match thrift_check::read_checked::<PageHeader>(buf) {
            Ok((header, len)) => return Ok((header, len as u64)),
            Err(e) => e,
        };
        if e.truncated && buf.len() as u64 == want && want < limit {
            want = want.saturating_mul(2).min(limit);
            continue;
        }
        let room = if e.truncated && limit < region {
            format!(
                "; a page header may take at most {cap} bytes (4 × --max-doc-bytes + {} MiB)",
                PAGE_SLACK >> 20
            )
        } else {
            format!("; the column chunk holds {region} bytes from the header on")
        };
        return Err(at.bad(format!(
            "page {page}: bad page header at byte {pos} of the file: {} (at byte {} of the \
             header{room})",
            e.what, e.offset
        )));
    }
}

/// Checks the file's footer (its `FileMetaData`) before the parquet crate parses it: no binary
/// length or list count in it may exceed the footer's bytes ([`thrift_check::read_checked`]).
/// A file whose last 8 bytes are not a footer length and `PAR1`, or whose footer does not fit in
/// it, is left for the parquet crate to refuse (see [`open_error`]).
fn check_footer(path: &Path, file: &File) -> Result<()> {
    let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    if file_len < 12 {
        return Ok(());
    }
    let mut input = file;
    let mut tail = [0u8; 8];
    input
        .seek(SeekFrom::Start(file_len - 8))
        .and_then(|_| input.read_exact(&mut tail))
        .map_err(|e| DataError::io(path, e))?;
    let len = u64::from(u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]));
    if &tail[4..] != b"PAR1" || len + 8 > file_len {
        return Ok(());
    }
    let start = file_len - 8 - len;
    let mut footer = Vec::new();
    input
        .seek(SeekFrom::Start(start))
        .map_err(|e| DataError::io(path, e))?;
    input
        .take(len)
        .read_to_end(&mut footer)
        .map_err(|e| DataError::io(path, e))?;
    let checked = thrift_check::walk(&footer).and_then(|walked| {
        if walked.reserves > FOOTER_RESERVE_LIMIT {
            return Err(thrift_check::ThriftError {
                offset: 0,
                what: format!(
                    "its lists would take {} bytes of memory once parsed (up to {} bytes per \
                     element), more than the {} MiB rsd allows a footer: a file of millions of \
                     column chunks (split it into smaller files) or a crafted one",
                    walked.reserves,
                    thrift_check::MAX_ELEMENT_BYTES,
                    FOOTER_RESERVE_LIMIT >> 20
                ),
                truncated: false,
            });
        }
        thrift_check::read_checked::<FileMetaData>(&footer)
    });
    match checked {
        Ok(_) => Ok(()),
        Err(e) => Err(DataError::bad_file(
            path,
            Cause::Corrupt,
            format!(
                "corrupt Parquet footer: {} (at byte {} of its FileMetaData, which is {len} \
                 bytes at byte {start} of the file)",
                e.what, e.offset
            ),
        )),
    }
}

/// Why the footer could not be read: a Parquet file starts and ends with `PAR1`.
fn open_error(path: &Path, e: parquet::errors::ParquetError) -> DataError {
    let (head, tail) = match head_and_tail::<4>(path) {
        Ok(ends) => ends,
        Err(io) => return io,
    };
    let (cause, what) = if head != b"PAR1" {
        (
            Cause::WrongFormat,
            "not a Parquet file (it does not start with PAR1)".to_string(),
        )
    } else if tail != b"PAR1" {
        (
            Cause::Truncated,
            "truncated Parquet file: it does not end with PAR1, so its footer is cut off"
                .to_string(),
        )
    } else {
        (Cause::Corrupt, format!("corrupt Parquet footer: {e}"))
    };
    DataError::bad_file(path, cause, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Content;
    use arrow::array::{RecordBatch, StringArray};
    use parquet::arrow::ArrowWriter;
    use parquet::basic::{Compression, Encoding as ColumnEncoding, ZstdLevel};
    use parquet::file::properties::{EnabledStatistics, WriterProperties};

    /// A Parquet file of one text column holding `values`, zstd-compressed (so large runs of one
    /// letter cost little disk), with or without a dictionary, optionally delta-encoded.
    fn write(path: &Path, values: &[String], dictionary: bool, delta: bool) {
        let array = StringArray::from_iter_values(values);
        let batch = RecordBatch::try_from_iter([("text", Arc::new(array) as _)]).unwrap();
        let mut props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_dictionary_enabled(dictionary)
            .set_statistics_enabled(EnabledStatistics::None);
        if delta {
            props = props.set_encoding(ColumnEncoding::DELTA_BYTE_ARRAY);
        }
        let file = File::create(path).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props.build())).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    fn texts(path: &Path, max_doc_bytes: u64) -> Result<Vec<String>> {
        open(path, "text", max_doc_bytes)?
            .map(|d| match d?.content {
                Content::Text(t) => Ok(t),
                _ => unreachable!("parquet yields text"),
            })
            .collect()
    }

    /// The error reading `path` gives: a bad file, of cause `Corrupt`.
    fn refused_as_corrupt(path: &Path) -> String {
        let err = texts(path, 1 << 20).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(
                err,
                DataError::BadFile {
                    cause: Cause::Corrupt,
                    ..
                }
            ),
            "{text}"
        );
        text
    }

    #[test]
    fn a_page_past_the_bound_is_refused_before_it_is_decoded() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("big-page.parquet");
        // One value of 66 MiB in 100 rows: the column chunk is within 100 × 1 MiB, its page is
        // past 1 MiB + 64 MiB.
        let mut values = vec!["a".repeat((PAGE_SLACK + (2 << 20)) as usize)];
        values.extend((0..99).map(|i| format!("row {i}")));
        write(&path, &values, false, false);
        assert!(
            std::fs::metadata(&path).unwrap().len() < 1 << 20,
            "zstd keeps it small"
        );
        let text = refused_as_corrupt(&path);
        for part in [
            "big-page.parquet",
            "row group 0 (first row 0), column \"text\"",
            "page 0 declares",
            "--max-doc-bytes (1048576 bytes) + 64 MiB",
        ] {
            assert!(text.contains(part), "want {part:?}: {text}");
        }
        // With a cap that admits the value, the same file reads.
        let got = texts(&path, 128 << 20).unwrap();
        assert_eq!(got.len(), 100);
        assert_eq!(got[0].len(), values[0].len());
    }

    #[test]
    fn a_column_chunk_past_its_rows_bound_is_refused_naming_row_group_and_column() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("chunk.parquet");
        write(&path, &["b".repeat(3 << 20)], false, false);
        let err = texts(&path, 1024).unwrap_err().to_string();
        assert!(
            err.contains("chunk.parquet")
                && err.contains("row group 0 (first row 0), column \"text\"")
                && err.contains("for 1 rows"),
            "{err}"
        );
    }

    #[test]
    fn dictionary_and_delta_columns_read_back_exactly() {
        let tmp = tempfile::tempdir().unwrap();
        // Two long values shared by many rows: read as views into the dictionary, not copies.
        let big: Vec<String> = (0..1000)
            .map(|i| format!("{i:02}", i = i % 2).repeat(50_000))
            .collect();
        let dict = tmp.path().join("dict.parquet");
        write(&dict, &big, true, false);
        assert_eq!(texts(&dict, 1 << 20).unwrap(), big);

        let small: Vec<String> = (0..700).map(|i| format!("document number {i}")).collect();
        let delta = tmp.path().join("delta.parquet");
        write(&delta, &small, false, true);
        let file = File::open(&delta).unwrap();
        let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).unwrap();
        let largest = check_column(&delta, &file, meta.metadata(), 0, "text", 1 << 20).unwrap();
        assert!(largest > 0, "the pages are delta-encoded");
        assert_eq!(texts(&delta, 1 << 20).unwrap(), small);
    }

    /// A small uncompressed file whose page headers carry statistics (min and max values).
    fn with_page_statistics(path: &Path, pad: usize) -> Vec<String> {
        let pad = "x".repeat(pad);
        let values: Vec<String> = (0..50)
            .map(|i| format!("value {i:04} of a row{pad}"))
            .collect();
        let array = StringArray::from_iter_values(&values);
        let batch = RecordBatch::try_from_iter([("text", Arc::new(array) as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_dictionary_enabled(false)
            .set_statistics_enabled(EnabledStatistics::Page)
            .build();
        let file = File::create(path).unwrap();
        let mut w = ArrowWriter::try_new(file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        values
    }

    /// `bytes` with `new` written over them from the first occurrence of `find` plus `shift`.
    fn patch(bytes: &mut [u8], find: &[u8], shift: isize, new: &[u8]) -> usize {
        let at = bytes.windows(find.len()).position(|w| w == find).unwrap();
        let at = at.checked_add_signed(shift).unwrap();
        bytes[at..at + new.len()].copy_from_slice(new);
        at
    }

    #[test]
    fn a_page_header_declaring_a_4_gib_statistic_is_refused_before_it_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("stats.parquet");
        let values = with_page_statistics(&path, 0);
        assert_eq!(texts(&path, 1 << 20).unwrap(), values);
        // The min value's length (1 byte, before its text) becomes 4 GiB - 1 (5 bytes).
        let mut bytes = std::fs::read(&path).unwrap();
        let at = patch(
            &mut bytes,
            b"value 0000",
            -1,
            &[0xFF, 0xFF, 0xFF, 0xFF, 0x0F],
        );
        assert!(at < 200, "in the first page header, at byte {at}");
        std::fs::write(&path, &bytes).unwrap();
        let text = refused_as_corrupt(&path);
        for part in [
            "stats.parquet",
            "row group 0 (first row 0), column \"text\": page 0: bad page header at byte 4 of \
             the file",
            "a binary field declares 4294967295 bytes, but only",
            &format!("(at byte {} of the header;", at - 4),
        ] {
            assert!(text.contains(part), "want {part:?}: {text}");
        }
    }

    #[test]
    fn page_headers_longer_than_a_first_read_are_read_up_to_their_cap() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("long-header.parquet");
        // Statistics of two 100 KB values: the first page's header is past 200 KB, far more than
        // the 8 KiB read at first.
        let values = with_page_statistics(&path, 100_000);
        assert_eq!(texts(&path, 1 << 20).unwrap(), values);
        let file = File::open(&path).unwrap();
        let meta = ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).unwrap();
        let at = ChunkAt {
            path: &path,
            rg: 0,
            first_row: 0,
            field: "text",
        };
        let mut input = BufReader::new(&file);
        let chunk = meta.metadata().row_group(0).column(0);
        let (start, end) = (chunk.data_page_offset() as u64, end_of(chunk));
        let mut buf = Vec::new();
        let err = read_page_header(&at, &mut input, &mut buf, 0, start, end, 150_000)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a page header may take at most 150000 bytes")
                && err.contains("a binary field declares 100019 bytes"),
            "{err}"
        );
        let (header, len) =
            read_page_header(&at, &mut input, &mut buf, 0, start, end, 1 << 20).unwrap();
        assert_eq!(header.type_, PageType::DATA_PAGE);
        assert!(len > 200_000 && len < 210_000, "{len}");
    }

    fn end_of(chunk: &ColumnChunkMetaData) -> u64 {
        (chunk.data_page_offset() + chunk.compressed_size()) as u64
    }

    #[test]
    fn a_footer_declaring_a_list_of_2_gib_elements_is_refused_before_it_is_parsed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("footer.parquet");
        write(&path, &["one".to_string(), "two".to_string()], false, false);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
        let start = n - 8 - len;
        // version (field 1), then the schema (field 2): a list of structs, whose count becomes
        // i32::MAX in the long form; the parquet crate would reserve that many SchemaElements.
        assert_eq!(
            (bytes[start], bytes[start + 2], bytes[start + 3] & 0x0F),
            (0x15, 0x19, 0x0C)
        );
        bytes[start + 3..start + 9].copy_from_slice(&[0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0x07]);
        std::fs::write(&path, &bytes).unwrap();
        let err = texts(&path, 1 << 20).unwrap_err().to_string();
        for part in [
            "footer.parquet",
            "corrupt Parquet footer: a list declares 2147483647 elements",
            &format!(
                "(at byte 3 of its FileMetaData, which is {len} bytes at byte {start} of the file)"
            ),
        ] {
            assert!(err.contains(part), "want {part:?}: {err}");
        }
    }

    #[test]
    fn a_footer_whose_lists_would_take_more_than_a_gib_is_refused_before_it_is_parsed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("many.parquet");
        write(&path, &["one".to_string()], false, false);
        let bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
        // A footer of 2 million empty structs in its schema list (field 2): each fits in one
        // byte of the file, each would take up to 550 bytes once parsed, 1.1 GB in all.
        let count: u32 = 2_000_000;
        let mut footer = vec![0x15, 0x02, 0x19, 0xFC];
        let mut v = count;
        while v >= 0x80 {
            footer.push((v as u8 & 0x7F) | 0x80);
            v >>= 7;
        }
        footer.push(v as u8);
        footer.extend(std::iter::repeat_n(0u8, count as usize));
        footer.push(0);
        let mut crafted = bytes[..n - 8 - len].to_vec();
        crafted.extend(&footer);
        crafted.extend((footer.len() as u32).to_le_bytes());
        crafted.extend(b"PAR1");
        std::fs::write(&path, &crafted).unwrap();
        let err = texts(&path, 1 << 20).unwrap_err().to_string();
        for part in [
            "many.parquet",
            "corrupt Parquet footer: its lists would take 1100000000 bytes of memory",
            "more than the 1024 MiB rsd allows a footer",
        ] {
            assert!(err.contains(part), "want {part:?}: {err}");
        }
    }

    #[test]
    fn batches_of_delta_values_shrink_with_their_pages() {
        assert_eq!(batch_rows(0), BATCH_ROWS);
        assert_eq!(batch_rows(1 << 20), BATCH_ROWS);
        assert_eq!(batch_rows(64 << 20), 16);
        assert_eq!(batch_rows(2 << 30), 1);
        assert_eq!(batch_rows(u64::MAX), 1);
    }
}
