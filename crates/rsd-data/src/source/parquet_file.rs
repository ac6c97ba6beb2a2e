//! Parquet: the text column is read row group by row group with a projection, so only that column
//! is decoded and memory stays at one batch.

use std::fs::File;
use std::path::{Path, PathBuf};

use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::ProjectionMask;

use super::arrow_ipc::{column_index, TextBatches};
use crate::error::{DataError, Result};

const BATCH_ROWS: usize = 256;

pub(super) fn open(path: &Path, field: &str) -> Result<TextBatches<ParquetRecordBatchReader>> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| {
        DataError::bad_file(
            path,
            format!("not a readable Parquet file (truncated or corrupt?): {e}"),
        )
    })?;
    let index = column_index(path, builder.schema(), field)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [index]);
    let reader = builder
        .with_projection(mask)
        .with_batch_size(BATCH_ROWS)
        .build()
        .map_err(|e| DataError::bad_file(path, format!("cannot read column \"{field}\": {e}")))?;
    Ok(TextBatches::new(PathBuf::from(path), reader, field))
}
