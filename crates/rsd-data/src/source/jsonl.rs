//! JSON Lines, plain or zstd-compressed: one document per line, text in `--text-field`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use super::{Content, RawDoc};
use crate::error::{DataError, Result};

pub(super) struct JsonlDocs {
    path: Arc<Path>,
    reader: Box<dyn BufRead + Send>,
    field: Arc<str>,
    line: u64,
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
        path: Arc::from(path),
        reader,
        field: Arc::from(field),
        line: 0,
        done: false,
    })
}

/// One JSONL record as read: the line's bytes and where it came from. Decoding (UTF-8, JSON, the
/// text field) is left to whoever holds it, so it can run on the tokenizer threads.
#[derive(Debug)]
pub struct JsonLine {
    bytes: Vec<u8>,
    path: Arc<Path>,
    line: u64,
    field: Arc<str>,
}

impl JsonLine {
    /// The text field's value, or an error naming the file, the line and what was wrong.
    pub fn decode(self) -> Result<String> {
        let JsonLine {
            bytes,
            path,
            line,
            field,
        } = self;
        let bad = |what: String| DataError::bad_record(&*path, format!("line {line}"), what);
        let text = std::str::from_utf8(&bytes).map_err(|e| {
            bad(format!(
                "invalid UTF-8 at byte {} of the line",
                e.valid_up_to()
            ))
        })?;
        let mut de = serde_json::Deserializer::from_str(text.trim_end());
        let found = FieldSeed { field: &field }
            .deserialize(&mut de)
            .and_then(|f| de.end().map(|_| f))
            .map_err(|e| bad(format!("malformed JSON at column {}: {e}", e.column())))?;
        match found {
            Field::Text(s) => Ok(s),
            Field::NotAString(kind) => Err(bad(format!(
                "field \"{field}\" is {kind}, expected a string"
            ))),
            Field::Missing(keys) => Err(bad(format!(
                "no field \"{field}\"; this line has: {} (choose one with --text-field)",
                keys.join(", ")
            ))),
            Field::NotAnObject(kind) => Err(bad(format!(
                "expected a JSON object per line, found {kind}"
            ))),
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
        let mut buf = Vec::new();
        while !self.done {
            buf.clear();
            self.line += 1;
            match self.reader.read_until(b'\n', &mut buf) {
                Ok(0) => self.done = true,
                Ok(_) => {
                    if buf.iter().all(|b| b.is_ascii_whitespace()) {
                        continue;
                    }
                    return Some(Ok(RawDoc {
                        origin: format!("{}:line {}", self.path.display(), self.line),
                        bytes: buf.len() as u64,
                        content: Content::JsonLine(JsonLine {
                            bytes: buf,
                            path: self.path.clone(),
                            line: self.line,
                            field: self.field.clone(),
                        }),
                    }));
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(DataError::bad_file(
                        &*self.path,
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
