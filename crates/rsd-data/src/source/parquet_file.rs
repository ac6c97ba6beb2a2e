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
use parquet::format::{Encoding, PageHeader, PageType};
use parquet::thrift::TSerializable;

use rsd_common::safe_fs::open_regular;

use super::arrow_ipc::{column_index, head_and_tail, TextBatches};
use crate::error::{Cause, DataError, Result};

/// Rows per batch: enough that decoding costs little per document.
const BATCH_ROWS: usize = 256;

/// How far a page may exceed `--max-doc-bytes`: writers cut pages (dictionary pages too) at
/// about 1 MiB by default (parquet-rs, pyarrow, parquet-mr), so an honest page is at most that
/// plus one value; 64 MiB leaves room for writers configured with larger pages.
pub(super) const PAGE_SLACK: u64 = 64 << 20;

/// Bytes per value a column chunk may hold beyond the value itself: a length prefix, levels.
const VALUE_OVERHEAD: u64 = 16;

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
    let mut largest_delta = 0u64;
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
            let delta = check_pages(&at, &mut input, start, end, max_doc_bytes)?;
            largest_delta = largest_delta.max(delta);
        }
        first_row = first_row.saturating_add(u64::try_from(group.num_rows()).unwrap_or(0));
    }
    Ok(largest_delta)
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
    let mut largest_delta = 0u64;
    let mut pos = start;
    let mut page = 0usize;
    while pos < end {
        input
            .seek(SeekFrom::Start(pos))
            .map_err(|e| DataError::io(at.path, e))?;
        let mut counted = Counted {
            inner: (&mut *input).take(end - pos),
            read: 0,
        };
        let header = {
            let mut protocol = thrift::protocol::TCompactInputProtocol::new(&mut counted);
            PageHeader::read_from_in_protocol(&mut protocol)
                .map_err(|e| at.bad(format!("page {page}: unreadable page header: {e}")))?
        };
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
        pos = pos.saturating_add(counted.read).saturating_add(compressed);
        page += 1;
    }
    Ok(largest_delta)
}

/// A reader that counts the bytes read through it: the length of a page header.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
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
        let err = texts(&path, 1 << 20).unwrap_err();
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

    #[test]
    fn batches_of_delta_values_shrink_with_their_pages() {
        assert_eq!(batch_rows(0), BATCH_ROWS);
        assert_eq!(batch_rows(1 << 20), BATCH_ROWS);
        assert_eq!(batch_rows(64 << 20), 16);
        assert_eq!(batch_rows(2 << 30), 1);
        assert_eq!(batch_rows(u64::MAX), 1);
    }
}
