//! JSON Lines, plain or zstd-compressed: one document per line, text in `--text-field`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Arc;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use rsd_common::printable::shortened;
use rsd_common::safe_fs::open_regular;

use super::{Content, RawDoc};
use crate::error::{Cause, DataError, Result};

pub(super) struct JsonlDocs {
    path: Arc<Path>,
    reader: Box<dyn BufRead + Send>,
    field: Arc<str>,
    line: u64,
    done: bool,
    /// Whether the file is zstd-compressed (a read error is then a decoding error).
    zstd: bool,
    /// Lines longer than this many bytes (newline not counted) are bad records.
    max_line_bytes: u64,
    /// The file's size, and `--max-expansion`, for the message of a file that expands past it.
    stored: u64,
    max_expansion: u64,
}

/// The first bytes of a zstd frame, and of a skippable frame (low nibble of the first byte free).
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
const SKIPPABLE_MAGIC: [u8; 3] = [0x2a, 0x4d, 0x18];

/// A file named `.zst` must start with a zstd frame; else it is not zstd at all (an uncompressed
/// file given the wrong name, say), which the decoder would only report as an unknown frame.
fn check_zstd_magic(path: &Path, file: &mut File) -> Result<()> {
    let mut head = [0u8; 4];
    let n = read_up_to(file, &mut head).map_err(|e| DataError::io(path, e))?;
    file.seek(SeekFrom::Start(0))
        .map_err(|e| DataError::io(path, e))?;
    if n == 4 && (head == ZSTD_MAGIC || (head[1..] == SKIPPABLE_MAGIC && head[0] & 0xf0 == 0x50)) {
        return Ok(());
    }
    let found: Vec<String> = head[..n].iter().map(|b| format!("{b:02x}")).collect();
    Err(DataError::bad_file(
        path,
        Cause::WrongFormat,
        format!(
            "not zstd data: the file starts with bytes [{}], a zstd frame with [28 b5 2f fd]",
            found.join(" ")
        ),
    ))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// The zstd decoder's output, cut off with [`Expanded`] once it passes what the file may decode to
/// ([`super::expansion_limit`]): the lines, the whitespace between them and the over-long lines
/// read through all count, so a frame of RLE blocks cannot keep the reader busy without end.
struct ExpansionCap<R> {
    inner: R,
    left: u64,
}

/// The error [`ExpansionCap`] ends the output with.
#[derive(Debug)]
struct Expanded;

impl std::fmt::Display for Expanded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("decodes past its bound")
    }
}

impl std::error::Error for Expanded {}

impl<R: Read> Read for ExpansionCap<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.left == 0 {
            // One byte more than the bound tells a file that ends exactly there from one that
            // goes on.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(std::io::Error::other(Expanded)),
            };
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

pub(super) fn open(
    path: &Path,
    field: &str,
    max_line_bytes: u64,
    max_expansion: u64,
) -> Result<JsonlDocs> {
    let mut file = open_regular(path)?;
    let name = path.to_string_lossy().to_ascii_lowercase();
    let zstd = name.ends_with(".zst") || name.ends_with(".zstd");
    let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let empty = file_len == 0;
    let reader: Box<dyn BufRead + Send> = if zstd && empty {
        // An empty file is an empty input (as an empty .jsonl is), not a damaged one.
        Box::new(std::io::empty())
    } else if zstd {
        check_zstd_magic(path, &mut file)?;
        let decoder = zstd::stream::read::Decoder::new(file).map_err(|e| {
            DataError::bad_file(
                path,
                Cause::Corrupt,
                format!("cannot start zstd decoding: {e}"),
            )
        })?;
        // Reads of zstd's own output size: a damaged block fails the read that reaches it, and
        // what that read had decoded is lost, so a smaller read keeps more of the good data
        // before the damage (at no cost in speed: zstd hands out this much at a time anyway).
        let stored = file_len;
        Box::new(BufReader::with_capacity(
            zstd::zstd_safe::DCtx::out_size(),
            ExpansionCap {
                inner: decoder,
                left: super::expansion_limit(stored, max_expansion),
            },
        ))
    } else {
        Box::new(BufReader::with_capacity(1 << 20, file) as BufReader<File>)
    };
    Ok(JsonlDocs {
        path: Arc::from(path),
        reader,
        field: Arc::from(field),
        line: 0,
        done: false,
        zstd,
        max_line_bytes,
        stored: file_len,
        max_expansion,
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
    /// The line's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// The text field's value, or an error naming the file, the line and what was wrong.
    pub fn decode(self) -> Result<String> {
        let text = self.text()?;
        let (field, bad) = (&self.field, |what: String| self.bad(what));
        let mut de = serde_json::Deserializer::from_str(text.trim_end());
        let found = FieldSeed { field }
            .deserialize(&mut de)
            .and_then(|f| de.end().map(|_| f))
            .map_err(|e| {
                bad(format!(
                    "malformed JSON at column {}: {}",
                    e.column(),
                    shortened(&e.to_string())
                ))
            })?;
        match found {
            Field::Text(s) => Ok(s),
            Field::NotAString(kind) => Err(bad(format!(
                "field \"{field}\" is {kind}, expected a string"
            ))),
            Field::Missing(keys) => Err(bad(format!(
                "no field \"{field}\"; this line has: {} (choose one with --text-field)",
                shortened(&keys.join(", "))
            ))),
            Field::NotAnObject(kind) => Err(bad(format!(
                "expected a JSON object per line, found {kind}"
            ))),
        }
    }
}

impl JsonLine {
    /// The field's value whatever its type (a chat record's list of messages), or an error
    /// naming the file, the line and what was wrong.
    pub fn decode_value(self) -> Result<Value> {
        let text = self.text()?;
        let (field, bad) = (&self.field, |what: String| self.bad(what));
        let value: Value = serde_json::from_str(text.trim_end()).map_err(|e| {
            bad(format!(
                "malformed JSON at column {}: {}",
                e.column(),
                shortened(&e.to_string())
            ))
        })?;
        match value {
            Value::Object(mut map) => match map.remove(&**field) {
                Some(v) => Ok(v),
                None => {
                    let keys: Vec<String> = map.keys().cloned().collect();
                    Err(bad(format!(
                        "no field \"{field}\"; this line has: {} (choose one with --text-field)",
                        shortened(&keys.join(", "))
                    )))
                }
            },
            other => Err(bad(format!(
                "expected a JSON object per line, found {}",
                json_kind(&other)
            ))),
        }
    }

    /// The line as UTF-8.
    fn text(&self) -> Result<&str> {
        std::str::from_utf8(&self.bytes).map_err(|e| {
            self.bad(format!(
                "invalid UTF-8 at byte {} of the line",
                e.valid_up_to()
            ))
        })
    }

    /// A bad-record error naming the file and the line.
    fn bad(&self, what: String) -> DataError {
        DataError::bad_record(&*self.path, format!("line {}", self.line), what)
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

impl JsonlDocs {
    /// A failed read at `self.line`: for zstd, what the decoder found (the lines before it were
    /// read; the one it cut is lost).
    fn read_error(&self, e: std::io::Error) -> DataError {
        let line = self.line;
        if !self.zstd {
            return DataError::io(&*self.path, e);
        }
        if e.get_ref().is_some_and(|inner| inner.is::<Expanded>()) {
            return super::expansion_error(&self.path, self.stored, self.max_expansion);
        }
        let (cause, what) = if e.kind() == std::io::ErrorKind::UnexpectedEof {
            (
                Cause::Truncated,
                format!("truncated: the zstd data ends inside a frame, at line {line}"),
            )
        } else if e.to_string().contains("Unknown frame descriptor") {
            (
                Cause::Corrupt,
                format!(
                    "bytes after the zstd frame that ends before line {line} are not zstd (trailing garbage?)"
                ),
            )
        } else {
            (
                Cause::Corrupt,
                format!("corrupt zstd data at line {line}: {e}"),
            )
        };
        DataError::bad_file(&*self.path, cause, what)
    }
}

impl Iterator for JsonlDocs {
    type Item = Result<RawDoc>;
    fn next(&mut self) -> Option<Result<RawDoc>> {
        let mut buf = Vec::new();
        while !self.done {
            buf.clear();
            self.line += 1;
            // At most the longest allowed line and its newline are kept: a longer line (a zstd
            // bomb of one endless line, say) is read through without being held in memory.
            let limit = self.max_line_bytes.saturating_add(1);
            match Read::take(&mut self.reader, limit).read_until(b'\n', &mut buf) {
                Ok(0) => self.done = true,
                Ok(n) if n as u64 == limit && buf.last() != Some(&b'\n') => {
                    let rest = match self.reader.skip_until(b'\n') {
                        Ok(rest) => rest,
                        Err(e) => {
                            self.done = true;
                            return Some(Err(self.read_error(e)));
                        }
                    };
                    return Some(Err(DataError::bad_record(
                        &*self.path,
                        format!("line {}", self.line),
                        format!(
                            "{} bytes, longer than --max-doc-bytes ({} bytes)",
                            n + rest,
                            self.max_line_bytes
                        ),
                    )));
                }
                Ok(_) => {
                    if buf.iter().all(|b| b.is_ascii_whitespace()) {
                        continue;
                    }
                    return Some(Ok(RawDoc {
                        path: self.path.clone(),
                        location: format!("line {}", self.line),
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
                    return Some(Err(self.read_error(e)));
                }
            }
        }
        None
    }
}
