//! JSON Lines, plain or zstd-compressed: one document per line, text in `--text-field`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
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
        let mut de = serde_json::Deserializer::from_str(text.trim_end());
        let found = FieldSeed { field: &self.field }
            .deserialize(&mut de)
            .and_then(|f| de.end().map(|_| f));
        let found = found.map_err(|e| {
            DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!("malformed JSON at column {}: {e}", e.column()),
            )
        })?;
        match found {
            Field::Text(s) => Ok(RawDoc {
                origin: format!("{}:line {line}", self.path.display()),
                bytes: self.buf.len() as u64,
                content: Content::Text(s),
            }),
            Field::NotAString(kind) => Err(DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!("field {:?} is {kind}, expected a string", self.field),
            )),
            Field::Missing(keys) => Err(DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!(
                    "no field {:?}; this line has: {} (choose one with --text-field)",
                    self.field,
                    keys.join(", ")
                ),
            )),
            Field::NotAnObject(kind) => Err(DataError::bad_record(
                &self.path,
                format!("line {line}"),
                format!("expected a JSON object per line, found {kind}"),
            )),
        }
    }
}

/// What one line held for the text field.
enum Field {
    Text(String),
    NotAString(&'static str),
    Missing(Vec<String>),
    NotAnObject(&'static str),
}

/// Reads one JSON object, keeping only the text field (the others are skipped without building
/// values), and the key names in case the field is missing.
struct FieldSeed<'f> {
    field: &'f str,
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = Field;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<Field, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for FieldSeed<'_> {
    type Value = Field;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Field, A::Error> {
        let mut found = None;
        let mut keys = vec![];
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if found.is_none() && key == self.field {
                let value: Value = map.next_value()?;
                found = Some(match value {
                    Value::String(s) => Field::Text(s),
                    other => Field::NotAString(json_kind(&other)),
                });
            } else {
                map.next_value::<IgnoredAny>()?;
                keys.push(key.into_owned());
            }
        }
        Ok(found.unwrap_or(Field::Missing(keys)))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Field, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Field::NotAnObject("an array"))
    }
    fn visit_str<E: serde::de::Error>(self, _: &str) -> std::result::Result<Field, E> {
        Ok(Field::NotAnObject("a string"))
    }
    fn visit_bool<E: serde::de::Error>(self, _: bool) -> std::result::Result<Field, E> {
        Ok(Field::NotAnObject("a boolean"))
    }
    fn visit_i64<E: serde::de::Error>(self, _: i64) -> std::result::Result<Field, E> {
        Ok(Field::NotAnObject("a number"))
    }
    fn visit_u64<E: serde::de::Error>(self, _: u64) -> std::result::Result<Field, E> {
        Ok(Field::NotAnObject("a number"))
    }
    fn visit_f64<E: serde::de::Error>(self, _: f64) -> std::result::Result<Field, E> {
        Ok(Field::NotAnObject("a number"))
    }
    fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Field, E> {
        Ok(Field::NotAnObject("null"))
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
