//! Parquet: the text column is read row group by row group with a projection, so only that column
//! is decoded and memory stays at one batch.

use std::path::Path;

use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use rsd_common::safe_fs::open_regular;

use super::arrow_ipc::{column_index, head_and_tail, TextBatches};
use crate::error::{Cause, DataError, Result};

const BATCH_ROWS: usize = 256;

pub(super) fn open(
    path: &Path,
    field: &str,
    max_doc_bytes: u64,
) -> Result<TextBatches<ParquetRecordBatchReader>> {
    let file = open_regular(path)?;
    let builder = match ParquetRecordBatchReaderBuilder::try_new(file) {
        Ok(b) => b,
        Err(e) => return Err(open_error(path, e)),
    };
    let index = column_index(path, builder.schema(), field)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
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
