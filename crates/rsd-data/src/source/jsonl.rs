//! JSON Lines, plain or zstd-compressed: one document per line, text in `--text-field`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{Content, RawDoc};
use crate::error::{DataError, Result};

pub(super) struct JsonlDocs {
    path: PathBuf,
    reader: Box<dyn BufRead + Send>,
    field: String,
    line: u64,
    buf: Vec<u8>,
    done: bool,
}

pub(super) fn open(path: &Path, field: &str) -> Result<JsonlDocs> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let name = path.to_string_lossy().to_ascii_lowercase();
    let reader: Box<dyn BufRead + Send> = if name.ends_with(".zst") || name.ends_with(".zstd") {
        let decoder = zstd::stream::read::Decoder::new(file)
            .map_err(|e| DataError::bad_file(path, format!("cannot start zstd decoding: {e}")))?;
        Box::new(BufReader::with_capacity(1 << 20, decoder))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file) as BufReader<File>)
    };
    Ok(JsonlDocs {
        path: path.to_path_buf(),
        reader,
        field: field.to_string(),
        line: 0,
        buf: Vec::new(),
        done: false,
    })
}

impl JsonlDocs {
    fn parse_line(&self) -> Result<RawDoc> {
        let line = self.line;
        let text = std::str::from_utf8(&self.buf).map_err(|e| {
            DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!("invalid UTF-8 at byte {} of the line", e.valid_up_to()),
            )
        })?;
        let value: Value = serde_json::from_str(text.trim_end()).map_err(|e| {
            DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!("malformed JSON at column {}: {e}", e.column()),
            )
        })?;
        let Value::Object(map) = value else {
            return Err(DataError::bad_record(
                &self.path,
                format!("line {line}"),
                "expected a JSON object per line",
            ));
        };
        match map.get(&self.field) {
            Some(Value::String(s)) => Ok(RawDoc {
                origin: format!("{}:line {line}", self.path.display()),
                bytes: self.buf.len() as u64,
                content: Content::Text(s.clone()),
            }),
            Some(other) => Err(DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!(
                    "field {:?} is {}, expected a string",
                    self.field,
                    json_kind(other)
                ),
            )),
            None => {
                let keys: Vec<&str> = map.keys().map(String::as_str).collect();
                Err(DataError::bad_record(
                    &self.path,
                    format!("line {line}"),
                    format!(
                        "no field {:?}; this line has: {} (choose one with --text-field)",
                        self.field,
                        keys.join(", ")
                    ),
                ))
            }
        }
    }
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

impl Iterator for JsonlDocs {
    type Item = Result<RawDoc>;
    fn next(&mut self) -> Option<Result<RawDoc>> {
        while !self.done {
            self.buf.clear();
            self.line += 1;
            match self.reader.read_until(b'\n', &mut self.buf) {
                Ok(0) => self.done = true,
                Ok(_) => {
                    if self.buf.iter().all(|b| b.is_ascii_whitespace()) {
                        continue;
                    }
                    return Some(self.parse_line());
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(DataError::bad_file(
                        &self.path,
                        format!(
                            "read failed at line {} (corrupt or truncated compressed data?): {e}",
                            self.line
                        ),
                    )));
                }
            }
        }
        None
    }
}
