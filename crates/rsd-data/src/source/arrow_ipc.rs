//! Arrow IPC files and streams, and the directories Hugging Face `datasets` writes with
//! `save_to_disk` (`state.json` listing stream-format `.arrow` files).

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, LargeStringArray, RecordBatch, StringArray, StringViewArray};
use arrow::datatypes::Schema;
use arrow::error::ArrowError;
use arrow::ipc::reader::{FileReader, StreamReader};
use serde_json::Value;

use rsd_common::safe_fs::{confined_name, open_regular, read_regular, NamedBy, MAX_METADATA_BYTES};

use super::{Content, RawDoc};
use crate::error::{json_error, Cause, DataError, Result};

/// The index of the text column, or an error listing the columns there are.
pub(super) fn column_index(path: &Path, schema: &Schema, field: &str) -> Result<usize> {
    schema.index_of(field).map_err(|_| {
        let names: Vec<String> = schema
            .fields()
            .iter()
            .map(|f| format!("{} ({})", f.name(), f.data_type()))
            .collect();
        DataError::bad_file(
            path,
            Cause::Schema,
            format!(
                "no column \"{field}\"; the file has: {} (choose one with --text-field)",
                names.join(", ")
            ),
        )
    })
}

/// Yields one document per row of the single projected text column of each batch.
pub(super) struct TextBatches<R> {
    path: Arc<Path>,
    reader: R,
    field: String,
    batch: Option<RecordBatch>,
    row_in_batch: usize,
    row: u64,
    failed: bool,
    /// Values longer than this many bytes are bad records.
    max_doc_bytes: u64,
}

impl<R> TextBatches<R> {
    pub(super) fn new(path: &Path, reader: R, field: &str, max_doc_bytes: u64) -> Self {
        TextBatches {
            path: Arc::from(path),
            reader,
            field: field.to_string(),
            batch: None,
            row_in_batch: 0,
            row: 0,
            failed: false,
            max_doc_bytes,
        }
    }
}

fn string_at(array: &dyn Array, i: usize) -> Option<std::result::Result<Option<&str>, String>> {
    if let Some(a) = array.as_any().downcast_ref::<StringArray>() {
        return Some(Ok(a.is_valid(i).then(|| a.value(i))));
    }
    if let Some(a) = array.as_any().downcast_ref::<LargeStringArray>() {
        return Some(Ok(a.is_valid(i).then(|| a.value(i))));
    }
    if let Some(a) = array.as_any().downcast_ref::<StringViewArray>() {
        return Some(Ok(a.is_valid(i).then(|| a.value(i))));
    }
    Some(Err(format!("{}", array.data_type())))
}

impl<R: Iterator<Item = std::result::Result<RecordBatch, ArrowError>>> Iterator for TextBatches<R> {
    type Item = Result<RawDoc>;
    fn next(&mut self) -> Option<Result<RawDoc>> {
        if self.failed {
            return None;
        }
        loop {
            if let Some(batch) = &self.batch {
                if self.row_in_batch < batch.num_rows() {
                    let i = self.row_in_batch;
                    self.row_in_batch += 1;
                    self.row += 1;
                    let row = self.row - 1;
                    let column = batch.column(0);
                    return match string_at(column.as_ref(), i)? {
                        // Checked once the batch is decoded: the batch itself is bounded by the
                        // format's page and message sizes, not by this limit.
                        Ok(Some(s)) if s.len() as u64 > self.max_doc_bytes => {
                            Some(Err(DataError::bad_record(
                                &*self.path,
                                format!("row {row}"),
                                format!(
                                    "{} bytes of text, more than --max-doc-bytes ({} bytes)",
                                    s.len(),
                                    self.max_doc_bytes
                                ),
                            )))
                        }
                        Ok(Some(s)) => Some(Ok(RawDoc {
                            path: self.path.clone(),
                            location: format!("row {row}"),
                            bytes: s.len() as u64,
                            content: Content::Text(s.to_string()),
                        })),
                        // A null is not text: a bad record (an empty string is an empty document).
                        Ok(None) => Some(Err(DataError::bad_record(
                            &*self.path,
                            format!("row {row}"),
                            format!("column \"{}\" is null, expected a string", self.field),
                        ))),
                        Err(ty) => {
                            self.failed = true;
                            Some(Err(DataError::bad_file(
                                &*self.path,
                                Cause::Schema,
                                format!(
                                    "column \"{}\" has type {ty}, expected a string column",
                                    self.field
                                ),
                            )))
                        }
                    };
                }
                self.batch = None;
            }
            match self.reader.next()? {
                Ok(batch) => {
                    self.batch = Some(batch);
                    self.row_in_batch = 0;
                }
                Err(e) => {
                    self.failed = true;
                    let (cause, what) = if is_eof(&e) {
                        (Cause::Truncated, "truncated")
                    } else {
                        (Cause::Corrupt, "corrupt data")
                    };
                    return Some(Err(DataError::bad_file(
                        &*self.path,
                        cause,
                        format!("{what} after row {}: {e}", self.row),
                    )));
                }
            }
        }
    }
}

/// Whether a read failed because the data ended early.
fn is_eof(e: &ArrowError) -> bool {
    match e {
        ArrowError::IoError(_, io) => io.kind() == std::io::ErrorKind::UnexpectedEof,
        ArrowError::ExternalError(inner) => inner
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof),
        _ => false,
    }
}

/// Either IPC flavour, decided by the file's magic bytes.
pub(super) enum IpcReader {
    File(FileReader<BufReader<File>>),
    Stream(StreamReader<BufReader<File>>),
}

impl Iterator for IpcReader {
    type Item = std::result::Result<RecordBatch, ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            IpcReader::File(r) => r.next(),
            IpcReader::Stream(r) => r.next(),
        }
    }
}

/// The first and last `N` bytes of a file (fewer if it is shorter), to tell a truncated file from
/// one of another format by its magic bytes.
pub(super) fn head_and_tail<const N: usize>(path: &Path) -> Result<(Vec<u8>, Vec<u8>)> {
    let io = |e| DataError::io(path, e);
    let mut f = open_regular(path)?;
    let len = f.metadata().map_err(io)?.len();
    let mut head = vec![0u8; (len as usize).min(N)];
    f.read_exact(&mut head).map_err(io)?;
    let mut tail = vec![0u8; (len as usize).min(N)];
    f.seek(SeekFrom::Start(len - tail.len() as u64))
        .map_err(io)?;
    f.read_exact(&mut tail).map_err(io)?;
    Ok((head, tail))
}

fn reader(path: &Path, projection: Option<Vec<usize>>) -> Result<IpcReader> {
    let file = open_regular(path)?;
    let buffered = BufReader::with_capacity(1 << 20, file);
    let (head, tail) = head_and_tail::<6>(path)?;
    // An IPC file starts and ends with ARROW1; a stream starts with a message (the continuation
    // marker 0xFFFFFFFF, or a length in the pre-1.0 format).
    let is_file = head == b"ARROW1";
    let bad = |e: ArrowError| {
        let (cause, what) = if is_file && tail != b"ARROW1" {
            (
                Cause::Truncated,
                "truncated Arrow IPC file (it does not end with ARROW1)",
            )
        } else if is_eof(&e) {
            (Cause::Truncated, "truncated Arrow IPC data")
        } else if is_file || head.starts_with(&[0xff; 4]) {
            (Cause::Corrupt, "corrupt Arrow IPC data")
        } else {
            (
                Cause::WrongFormat,
                "not an Arrow IPC file or stream (it starts with neither ARROW1 nor a stream message)",
            )
        };
        DataError::bad_file(path, cause, format!("{what}: {e}"))
    };
    Ok(if is_file {
        IpcReader::File(FileReader::try_new(buffered, projection).map_err(bad)?)
    } else {
        IpcReader::Stream(StreamReader::try_new(buffered, projection).map_err(bad)?)
    })
}

pub(super) fn open(path: &Path, field: &str, max_doc_bytes: u64) -> Result<TextBatches<IpcReader>> {
    // Open once for the schema, then again with the text column projected.
    let schema = match reader(path, None)? {
        IpcReader::File(r) => r.schema(),
        IpcReader::Stream(r) => r.schema(),
    };
    let index = column_index(path, &schema, field)?;
    Ok(TextBatches::new(
        path,
        reader(path, Some(vec![index]))?,
        field,
        max_doc_bytes,
    ))
}

/// The `.arrow` files of a `datasets.save_to_disk` directory, in order; `None` if `dir` is not one.
pub(super) fn saved_dataset_files(dir: &Path) -> Result<Option<Vec<PathBuf>>> {
    if dir.join("dataset_dict.json").is_file() {
        return Err(DataError::Config(format!(
            "{} is a Hugging Face DatasetDict; pass one split's directory, e.g. {}/train",
            dir.display(),
            dir.display()
        )));
    }
    let state = dir.join("state.json");
    if !state.is_file() {
        return Ok(None);
    }
    let text = read_regular(&state, MAX_METADATA_BYTES, "datasets state.json")?;
    let json: Value = serde_json::from_slice(&text).map_err(|e| {
        DataError::bad_file(
            &state,
            Cause::Corrupt,
            format!("not valid JSON {}", json_error(&e)),
        )
    })?;
    let files = json
        .get("_data_files")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            DataError::bad_file(
                &state,
                Cause::Schema,
                "no \"_data_files\" list: not a datasets save_to_disk directory",
            )
        })?;
    let mut out = vec![];
    for (k, f) in files.iter().enumerate() {
        let name = f.get("filename").and_then(Value::as_str).ok_or_else(|| {
            DataError::bad_file(
                &state,
                Cause::Schema,
                "an entry of \"_data_files\" has no \"filename\"",
            )
        })?;
        // The name comes from a file anyone may have written: it must stay inside `dir`.
        let named_by = NamedBy::new(&state, format!("_data_files[{k}].filename"));
        out.push(confined_name(dir, name, &named_by)?);
    }
    Ok(Some(out))
}
