//! Arrow IPC files and streams, and the directories Hugging Face `datasets` writes with
//! `save_to_disk` (`state.json` listing stream-format `.arrow` files).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use arrow::array::{Array, LargeStringArray, RecordBatch, StringArray, StringViewArray};
use arrow::datatypes::Schema;
use arrow::error::ArrowError;
use arrow::ipc::reader::{FileReader, StreamReader};
use serde_json::Value;

use super::{Content, RawDoc};
use crate::error::{DataError, Result};

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
            format!(
                "no column \"{field}\"; the file has: {} (choose one with --text-field)",
                names.join(", ")
            ),
        )
    })
}

/// Yields one document per row of the single projected text column of each batch.
pub(super) struct TextBatches<R> {
    path: PathBuf,
    reader: R,
    field: String,
    batch: Option<RecordBatch>,
    row_in_batch: usize,
    row: u64,
    failed: bool,
}

impl<R> TextBatches<R> {
    pub(super) fn new(path: PathBuf, reader: R, field: &str) -> Self {
        TextBatches {
            path,
            reader,
            field: field.to_string(),
            batch: None,
            row_in_batch: 0,
            row: 0,
            failed: false,
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
                        Ok(Some(s)) => Some(Ok(RawDoc {
                            origin: format!("{}:row {row}", self.path.display()),
                            bytes: s.len() as u64,
                            content: Content::Text(s.to_string()),
                        })),
                        // A null is an empty document: skipped and counted downstream.
                        Ok(None) => Some(Ok(RawDoc {
                            origin: format!("{}:row {row}", self.path.display()),
                            bytes: 0,
                            content: Content::Text(String::new()),
                        })),
                        Err(ty) => {
                            self.failed = true;
                            Some(Err(DataError::bad_file(
                                &self.path,
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
                    return Some(Err(DataError::bad_file(
                        &self.path,
                        format!("corrupt or truncated data after row {}: {e}", self.row),
                    )));
                }
            }
        }
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

fn is_ipc_file(path: &Path) -> Result<bool> {
    let mut magic = [0u8; 6];
    let mut f = File::open(path).map_err(|e| DataError::io(path, e))?;
    let n = f.read(&mut magic).map_err(|e| DataError::io(path, e))?;
    Ok(n == 6 && &magic == b"ARROW1")
}

fn reader(path: &Path, projection: Option<Vec<usize>>) -> Result<IpcReader> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let buffered = BufReader::with_capacity(1 << 20, file);
    let bad = |e: ArrowError| {
        DataError::bad_file(
            path,
            format!("not a readable Arrow IPC file or stream (truncated or corrupt?): {e}"),
        )
    };
    Ok(if is_ipc_file(path)? {
        IpcReader::File(FileReader::try_new(buffered, projection).map_err(bad)?)
    } else {
        IpcReader::Stream(StreamReader::try_new(buffered, projection).map_err(bad)?)
    })
}

pub(super) fn open(path: &Path, field: &str) -> Result<TextBatches<IpcReader>> {
    // Open once for the schema, then again with the text column projected.
    let schema = match reader(path, None)? {
        IpcReader::File(r) => r.schema(),
        IpcReader::Stream(r) => r.schema(),
    };
    let index = column_index(path, &schema, field)?;
    Ok(TextBatches::new(
        path.to_path_buf(),
        reader(path, Some(vec![index]))?,
        field,
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
    let text = std::fs::read_to_string(&state).map_err(|e| DataError::io(&state, e))?;
    let json: Value = serde_json::from_str(&text)
        .map_err(|e| DataError::bad_file(&state, format!("not valid JSON: {e}")))?;
    let files = json
        .get("_data_files")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            DataError::bad_file(
                &state,
                "no \"_data_files\" list: not a datasets save_to_disk directory",
            )
        })?;
    let mut out = vec![];
    for f in files {
        let name = f.get("filename").and_then(Value::as_str).ok_or_else(|| {
            DataError::bad_file(&state, "an entry of \"_data_files\" has no \"filename\"")
        })?;
        out.push(dir.join(name));
    }
    Ok(Some(out))
}
