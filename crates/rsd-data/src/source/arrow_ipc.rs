//! Arrow IPC files and streams, and the directories Hugging Face `datasets` writes with
//! `save_to_disk` (`state.json` listing stream-format `.arrow` files).

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, LargeListArray, LargeStringArray, ListArray, RecordBatch, StringArray,
    StringViewArray, StructArray,
};
use arrow::datatypes::Schema;
use arrow::error::ArrowError;
use arrow::ipc::reader::{FileReader, StreamReader};
use serde_json::Value;

use rsd_common::printable::shortened;
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
                shortened(&names.join(", "))
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
    /// Read `list<struct<role, content>>` values as the JSON of their messages (`pack --chat`).
    message_lists: bool,
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
            message_lists: false,
        }
    }

    /// Read a `list<struct<role, content>>` column as the JSON of each row's messages.
    pub(super) fn with_message_lists(mut self, on: bool) -> Self {
        self.message_lists = on;
        self
    }
}

fn string_at(
    array: &dyn Array,
    i: usize,
    message_lists: bool,
) -> Option<std::result::Result<Option<Cow<'_, str>>, String>> {
    if let Some(a) = array.as_any().downcast_ref::<StringArray>() {
        return Some(Ok(a.is_valid(i).then(|| Cow::Borrowed(a.value(i)))));
    }
    if let Some(a) = array.as_any().downcast_ref::<LargeStringArray>() {
        return Some(Ok(a.is_valid(i).then(|| Cow::Borrowed(a.value(i)))));
    }
    if let Some(a) = array.as_any().downcast_ref::<StringViewArray>() {
        return Some(Ok(a.is_valid(i).then(|| Cow::Borrowed(a.value(i)))));
    }
    if message_lists {
        if let Some(a) = array.as_any().downcast_ref::<ListArray>() {
            return Some(if a.is_valid(i) {
                messages_json(&a.value(i)).map(|s| Some(Cow::Owned(s)))
            } else {
                Ok(None)
            });
        }
        if let Some(a) = array.as_any().downcast_ref::<LargeListArray>() {
            return Some(if a.is_valid(i) {
                messages_json(&a.value(i)).map(|s| Some(Cow::Owned(s)))
            } else {
                Ok(None)
            });
        }
    }
    Some(Err(format!("{}", array.data_type())))
}

/// One row's `list<struct<role, content>>` as the JSON list of its messages (a null role or
/// content becomes a JSON null, which the chat reader reports for that record).
fn messages_json(values: &ArrayRef) -> std::result::Result<String, String> {
    let not_messages = || format!("list<{}>", values.data_type());
    let list = values
        .as_any()
        .downcast_ref::<StructArray>()
        .ok_or_else(not_messages)?;
    let column = |name: &str| list.column_by_name(name).ok_or_else(not_messages);
    let (role, content) = (column("role")?, column("content")?);
    let mut out = Vec::with_capacity(list.len());
    for k in 0..list.len() {
        let text = |c: &ArrayRef| match string_at(c.as_ref(), k, false) {
            Some(Ok(v)) => Ok(v.map(|s| serde_json::Value::String(s.into_owned()))),
            _ => Err(not_messages()),
        };
        let mut m = serde_json::Map::new();
        m.insert(
            "role".into(),
            text(role)?.unwrap_or(serde_json::Value::Null),
        );
        m.insert(
            "content".into(),
            text(content)?.unwrap_or(serde_json::Value::Null),
        );
        out.push(serde_json::Value::Object(m));
    }
    Ok(serde_json::Value::Array(out).to_string())
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
                    return match string_at(column.as_ref(), i, self.message_lists)? {
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
                            content: Content::Text(s.into_owned()),
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
                                    "column \"{}\" has type {ty}, expected a string column{}",
                                    self.field,
                                    if self.message_lists {
                                        " or a list of {role, content} structs"
                                    } else {
                                        ""
                                    }
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
                        format!(
                            "{what} after row {}: {}",
                            self.row,
                            shortened(&reader_message(&e))
                        ),
                    )));
                }
            }
        }
    }
}

/// The reader's error in words. The parquet crate (55.x) gives one of its errors without its
/// numbers, its format string's `{levels_to_read}` and `{levels_read}` left in; that one is said
/// instead (what the counts would have shown: the page ran out of levels).
fn reader_message(e: &ArrowError) -> String {
    e.to_string().replace(
        " - expected {levels_to_read}, got {levels_read}",
        ": a data page holds fewer definition levels than the values its header declares",
    )
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
pub(super) enum IpcInner {
    File(FileReader<BufReader<File>>),
    Stream(StreamReader<BufReader<File>>),
}

/// An IPC reader that stops before the first message whose declared size does not fit in the
/// file ([`scan`]): arrow-rs allocates a message's declared body size before reading it (and
/// panics on a negative one), so such a message is never handed to it.
pub(super) struct IpcReader {
    inner: IpcInner,
    /// Record batches that may be read, and the error that follows them.
    limit: Option<(usize, Stop)>,
}

/// Why reading stops early: a message that runs past the end of the file (truncated, reported
/// as such) or that declares an impossible size (corrupt).
#[derive(Debug, Clone)]
pub(super) struct Stop {
    truncated: bool,
    what: String,
    /// The message (of a stream) that stops it: message 0 is the schema, which arrow-rs reads
    /// when the reader is made, so it must never get that far.
    message: usize,
}

impl Iterator for IpcReader {
    type Item = std::result::Result<RecordBatch, ArrowError>;
    fn next(&mut self) -> Option<Self::Item> {
        if let Some((left, stop)) = &mut self.limit {
            if *left == 0 {
                let Stop {
                    truncated, what, ..
                } = stop.clone();
                return Some(Err(if truncated {
                    let eof = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, what.clone());
                    ArrowError::IoError(what, eof)
                } else {
                    ArrowError::ParseError(what)
                }));
            }
            *left -= 1;
        }
        match &mut self.inner {
            IpcInner::File(r) => r.next(),
            IpcInner::Stream(r) => r.next(),
        }
    }
}

/// Read exactly `buf.len()` bytes, or `Ok(false)` at the end of the input.
fn read_or_end(input: &mut impl Read, buf: &mut [u8]) -> std::io::Result<bool> {
    match input.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

/// Check every message's declared sizes against the file before arrow-rs reads any: how many
/// record batches can be read, and why reading must stop after them (`None`: all of them, or
/// damage that arrow-rs reports itself before it allocates anything). A dictionary block of an
/// IPC file that does not fit is an error at once (the reader loads dictionaries when it opens).
/// Reads message headers only, skipping bodies.
fn scan(path: &Path, is_file: bool) -> Result<Option<(usize, Stop)>> {
    let file = open_regular(path)?;
    let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let mut input = BufReader::with_capacity(64 << 10, file);
    if is_file {
        scan_file(path, &mut input, file_len)
    } else {
        scan_stream(path, &mut input, file_len)
    }
}

/// Whether `offset + a + b` (each declared as a signed number) lies inside a file of
/// `file_len` bytes.
fn fits(file_len: u64, offset: i64, a: i64, b: i64) -> bool {
    match (u64::try_from(offset), u64::try_from(a), u64::try_from(b)) {
        (Ok(o), Ok(a), Ok(b)) => o
            .checked_add(a)
            .and_then(|x| x.checked_add(b))
            .is_some_and(|end| end <= file_len),
        _ => false,
    }
}

/// The buffers arrow-rs takes from a record batch for `field` and its children, as its reader
/// does (`skip_field` in arrow-ipc, which `create_array` matches); `None` where it would stop
/// with an error of its own before taking them all (a missing variadic count or child).
fn buffers_needed(
    field: &arrow::ipc::Field,
    variadic: &mut std::collections::VecDeque<i64>,
) -> Option<u64> {
    use arrow::ipc::Type;
    if field.dictionary().is_some() {
        return Some(2);
    }
    let children = || field.children().into_iter().flat_map(|c| c.iter());
    let sum_children = |variadic: &mut std::collections::VecDeque<i64>| {
        children().try_fold(0u64, |n, c| n.checked_add(buffers_needed(&c, variadic)?))
    };
    let own = match field.type_type() {
        Type::Utf8 | Type::Binary | Type::LargeBinary | Type::LargeUtf8 => 3,
        Type::Utf8View | Type::BinaryView => {
            u64::try_from(variadic.pop_front()?).ok()?.checked_add(2)?
        }
        Type::List | Type::LargeList | Type::Map => {
            return sum_children(variadic)?.checked_add(2);
        }
        Type::FixedSizeList | Type::Struct_ => return sum_children(variadic)?.checked_add(1),
        Type::RunEndEncoded => return sum_children(variadic),
        Type::Union => {
            let dense = field
                .type_as_union()
                .is_some_and(|u| u.mode() == arrow::ipc::UnionMode::Dense);
            return sum_children(variadic)?.checked_add(if dense { 2 } else { 1 });
        }
        Type::Null => 0,
        _ => 2,
    };
    Some(own)
}

/// Why a record or dictionary batch `message` with a body of `body` bytes would make arrow-rs
/// panic, if it would: a buffer that does not lie inside the body (arrow-rs slices the body with
/// the declared offsets and lengths, and asserts they fit), or, for a record batch of `schema`,
/// fewer buffers than its fields take (arrow-rs unwraps the next one). `None` for other messages.
fn buffers_outside(
    message: &arrow::ipc::Message,
    body: i64,
    schema: Option<arrow::ipc::Schema>,
) -> Option<String> {
    if let (Some(batch), Some(schema)) = (message.header_as_record_batch(), schema) {
        let mut variadic = batch
            .variadicBufferCounts()
            .map(|v| v.iter().collect())
            .unwrap_or_default();
        let mut fields = schema.fields().into_iter().flat_map(|f| f.iter());
        let needed = fields.try_fold(0u64, |n, f| {
            n.checked_add(buffers_needed(&f, &mut variadic)?)
        });
        let have = batch.buffers().map_or(0, |b| b.len() as u64);
        if let Some(needed) = needed.filter(|&n| n > have) {
            return Some(format!(
                "{have} buffers, and the schema's columns take {needed}"
            ));
        }
    }
    let buffers = match message.header_type() {
        arrow::ipc::MessageHeader::RecordBatch => message.header_as_record_batch()?.buffers()?,
        arrow::ipc::MessageHeader::DictionaryBatch => {
            message.header_as_dictionary_batch()?.data()?.buffers()?
        }
        _ => return None,
    };
    let body_len = u64::try_from(body).ok()?;
    buffers.iter().enumerate().find_map(|(b, buf)| {
        (!fits(body_len, buf.offset(), buf.length(), 0)).then(|| {
            format!(
                "buffer {b} (offset {}, {} bytes) does not lie inside its body of {body} bytes",
                buf.offset(),
                buf.length()
            )
        })
    })
}

/// Why the IPC file block `block` (which lies inside the file) would make arrow-rs panic, if it
/// would: metadata too short for a message's prefix (arrow-rs indexes the first 8 bytes), or a
/// buffer outside the body.
fn bad_block(
    input: &mut BufReader<File>,
    block: &arrow::ipc::Block,
    schema: Option<arrow::ipc::Schema>,
) -> std::io::Result<Option<String>> {
    let meta_len = block.metaDataLength();
    if meta_len < 8 {
        return Ok(Some(format!(
            "{meta_len} bytes of metadata, too few for a message"
        )));
    }
    // Inside the file (checked by the caller), so at most the file's size.
    let mut meta = vec![0u8; meta_len as usize];
    input.seek(SeekFrom::Start(block.offset() as u64))?;
    input.read_exact(&mut meta)?;
    let skip = if meta[..4] == [0xff; 4] { 8 } else { 4 };
    // Metadata that does not parse is an error arrow-rs reports itself.
    Ok(arrow::ipc::root_as_message(&meta[skip..])
        .ok()
        .and_then(|m| buffers_outside(&m, block.bodyLength(), schema)))
}

/// [`scan`] for an IPC file: the blocks its footer lists.
fn scan_file(
    path: &Path,
    input: &mut BufReader<File>,
    file_len: u64,
) -> Result<Option<(usize, Stop)>> {
    let io = |e| DataError::io(path, e);
    // `<footer> <footer length: i32> ARROW1` at the end; a damaged tail is reported by the
    // reader (and the file as truncated, see `reader`).
    if file_len < 10 {
        return Ok(None);
    }
    let mut tail = [0u8; 10];
    input.seek(SeekFrom::End(-10)).map_err(io)?;
    input.read_exact(&mut tail).map_err(io)?;
    let footer_len = i32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]);
    let Ok(footer_len) = u64::try_from(footer_len) else {
        return Ok(None);
    };
    if &tail[4..] != b"ARROW1" || footer_len > file_len - 10 {
        return Ok(None);
    }
    input
        .seek(SeekFrom::Start(file_len - 10 - footer_len))
        .map_err(io)?;
    let mut footer = vec![0u8; footer_len as usize];
    input.read_exact(&mut footer).map_err(io)?;
    let Ok(footer) = arrow::ipc::root_as_footer(&footer) else {
        return Ok(None);
    };
    let describe = |what: &str, k: usize, b: &arrow::ipc::Block| {
        format!(
            "the footer's {what} block {k} (offset {}, {} bytes of metadata, {} bytes of body) \
             does not lie inside the file ({file_len} bytes)",
            b.offset(),
            b.metaDataLength(),
            b.bodyLength()
        )
    };
    let inside = |b: &arrow::ipc::Block| {
        fits(
            file_len,
            b.offset(),
            i64::from(b.metaDataLength()),
            b.bodyLength(),
        )
    };
    if let Some(what) = shared_blocks(&footer, &inside) {
        return Err(DataError::bad_file(
            path,
            Cause::Corrupt,
            format!("corrupt Arrow IPC file: {what}"),
        ));
    }
    for (k, b) in footer
        .dictionaries()
        .into_iter()
        .flat_map(|v| v.iter())
        .enumerate()
    {
        let what = if inside(b) {
            bad_block(input, b, None)
                .map_err(io)?
                .map(|why| format!("the footer's dictionary block {k}: {why}"))
        } else {
            Some(describe("dictionary", k, b))
        };
        if let Some(what) = what {
            return Err(DataError::bad_file(
                path,
                Cause::Corrupt,
                format!("corrupt Arrow IPC file: {what}"),
            ));
        }
    }
    for (k, b) in footer
        .recordBatches()
        .into_iter()
        .flat_map(|v| v.iter())
        .enumerate()
    {
        let what = if inside(b) {
            bad_block(input, b, footer.schema())
                .map_err(io)?
                .map(|why| format!("the footer's record batch block {k}: {why}"))
        } else {
            Some(describe("record batch", k, b))
        };
        if let Some(what) = what {
            return Ok(Some((
                k,
                Stop {
                    truncated: false,
                    what,
                    message: usize::MAX,
                },
            )));
        }
    }
    Ok(None)
}

/// Two blocks of an IPC file's footer that share bytes, in words (`None`: none do). A writer
/// lists each message once, one after the other; a footer that lists one block 100,000 times
/// (24 bytes each) would have one batch read 100,000 times, and blocks that start inside another
/// read its bytes as a second message. Only blocks that lie inside the file are compared (the
/// others are reported as such).
fn shared_blocks(
    footer: &arrow::ipc::Footer<'_>,
    inside: &dyn Fn(&arrow::ipc::Block) -> bool,
) -> Option<String> {
    let mut spans: Vec<(u64, u64, &str, usize)> = Vec::new();
    for (what, blocks) in [
        ("dictionary", footer.dictionaries()),
        ("record batch", footer.recordBatches()),
    ] {
        for (k, b) in blocks.into_iter().flat_map(|v| v.iter()).enumerate() {
            if inside(b) {
                // Inside the file: each part is non-negative and the sum fits.
                let start = b.offset() as u64;
                let end = start + b.metaDataLength() as u64 + b.bodyLength() as u64;
                spans.push((start, end, what, k));
            }
        }
    }
    spans.sort_unstable();
    spans.windows(2).find_map(|w| {
        let ((s0, e0, what0, k0), (s1, e1, what1, k1)) = (w[0], w[1]);
        (s1 < e0).then(|| {
            format!(
                "the footer's {what0} block {k0} (bytes {s0}..{e0}) and {what1} block {k1} \
                 (bytes {s1}..{e1}) share bytes; each message of the file may be listed once"
            )
        })
    })
}

/// [`scan`] for an IPC stream: messages of `[0xFFFFFFFF] <metadata length: i32> <metadata>
/// <body>` until a zero length or the end of the file.
fn scan_stream(
    path: &Path,
    input: &mut BufReader<File>,
    file_len: u64,
) -> Result<Option<(usize, Stop)>> {
    let io = |e| DataError::io(path, e);
    let (mut pos, mut batches, mut k) = (0u64, 0usize, 0usize);
    // The metadata of the first message, the schema, for the buffer count of record batches.
    let mut schema_meta: Option<Vec<u8>> = None;
    loop {
        let mut word = [0u8; 4];
        if !read_or_end(input, &mut word).map_err(io)? {
            return Ok(None);
        }
        let mut prefix = 4u64;
        if word == [0xff; 4] {
            if !read_or_end(input, &mut word).map_err(io)? {
                return Ok(None);
            }
            prefix = 8;
        }
        let meta_len = i32::from_le_bytes(word);
        if meta_len == 0 {
            return Ok(None);
        }
        let stop = |truncated, what: String| {
            let message = k;
            Ok(Some((
                batches,
                Stop {
                    truncated,
                    what,
                    message,
                },
            )))
        };
        let meta_start = pos + prefix;
        if !fits(file_len, meta_start as i64, i64::from(meta_len), 0) {
            return stop(
                meta_len > 0,
                format!(
                    "message {k} at byte {pos} declares {meta_len} bytes of metadata, but only {} \
                     bytes follow",
                    file_len - meta_start.min(file_len)
                ),
            );
        }
        // At most the rest of the file, checked just above.
        let mut meta = vec![0u8; meta_len as usize];
        input.read_exact(&mut meta).map_err(io)?;
        let Ok(message) = arrow::ipc::root_as_message(&meta) else {
            // Damaged metadata: the reader refuses it before allocating anything.
            return Ok(None);
        };
        let body = message.bodyLength();
        let body_start = meta_start + meta_len as u64;
        if !fits(file_len, body_start as i64, body, 0) {
            return stop(
                body >= 0,
                format!(
                    "message {k} at byte {pos} declares a body of {body} bytes, but only {} bytes \
                     follow",
                    file_len - body_start
                ),
            );
        }
        let schema = schema_meta
            .as_deref()
            .and_then(|m| arrow::ipc::root_as_message(m).ok())
            .and_then(|m| m.header_as_schema());
        if let Some(why) = buffers_outside(&message, body, schema) {
            return stop(false, format!("message {k} at byte {pos}: {why}"));
        }
        if k == 0 && message.header_type() == arrow::ipc::MessageHeader::Schema {
            schema_meta = Some(meta.clone());
        }
        // arrow-rs reads the body of record and dictionary batches only; after a schema (or any
        // other message) it reads the next message right after the metadata, and so must we, or
        // it would read messages we never checked.
        let body = match message.header_type() {
            arrow::ipc::MessageHeader::RecordBatch => {
                batches += 1;
                body
            }
            arrow::ipc::MessageHeader::DictionaryBatch => body,
            _ => 0,
        };
        input.seek_relative(body).map_err(io)?;
        pos = body_start + body as u64;
        k += 1;
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
        DataError::bad_file(
            path,
            cause,
            format!("{what}: {}", shortened(&e.to_string())),
        )
    };
    let limit = scan(path, is_file)?;
    // A stream's first message, its schema, is read when the reader is made, before any limit
    // applies: if it is the one that does not fit, it is never handed to arrow-rs.
    if let Some((_, stop)) = limit.as_ref().filter(|(_, s)| !is_file && s.message == 0) {
        let (cause, what) = if !head.starts_with(&[0xff; 4]) {
            (
                Cause::WrongFormat,
                "not an Arrow IPC file or stream (it starts with neither ARROW1 nor a stream message)",
            )
        } else if stop.truncated {
            (Cause::Truncated, "truncated Arrow IPC stream")
        } else {
            (Cause::Corrupt, "corrupt Arrow IPC stream")
        };
        return Err(DataError::bad_file(
            path,
            cause,
            format!("{what}: {}", stop.what),
        ));
    }
    let inner = if is_file {
        IpcInner::File(FileReader::try_new(buffered, projection).map_err(bad)?)
    } else {
        IpcInner::Stream(StreamReader::try_new(buffered, projection).map_err(bad)?)
    };
    Ok(IpcReader { inner, limit })
}

pub(super) fn open(path: &Path, field: &str, max_doc_bytes: u64) -> Result<TextBatches<IpcReader>> {
    // Open once for the schema, then again with the text column projected.
    let schema = match reader(path, None)?.inner {
        IpcInner::File(r) => r.schema(),
        IpcInner::Stream(r) => r.schema(),
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
    // A file listed twice would be read twice (a list of one file 100,000 times makes a few KB of
    // state.json read a file 100,000 times).
    let mut listed = super::ListedOnce::default();
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
        let file = confined_name(dir, name, &named_by)?;
        if let Some(j) = listed.earlier(k, &file) {
            return Err(DataError::bad_file(
                &state,
                Cause::Corrupt,
                format!(
                    "field _data_files[{k}].filename: {} names the same file as \
                     _data_files[{j}].filename; a data file may be listed once",
                    rsd_common::printable::shortened(name)
                ),
            ));
        }
        out.push(file);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Content;
    use arrow::ipc::writer::{FileWriter, StreamWriter};

    fn batch(values: &[&str]) -> RecordBatch {
        let array = StringArray::from_iter_values(values);
        RecordBatch::try_from_iter([("text", Arc::new(array) as _)]).unwrap()
    }

    /// Two batches of different sizes (so their bodies' lengths differ).
    fn batches() -> [RecordBatch; 2] {
        let long = "a longer one ".repeat(100);
        [batch(&["one", "two"]), batch(&["three", "four", &long])]
    }

    /// Replace the one occurrence of `from` (an i64, little-endian) in `bytes[range]` by `to`.
    fn patch_i64(bytes: &mut [u8], range: std::ops::Range<usize>, from: i64, to: i64) {
        let needle = from.to_le_bytes();
        let hits: Vec<usize> = (range.start..range.end - 7)
            .filter(|&i| bytes[i..i + 8] == needle)
            .collect();
        assert_eq!(hits.len(), 1, "{from} must occur once");
        bytes[hits[0]..hits[0] + 8].copy_from_slice(&to.to_le_bytes());
    }

    /// Each stream message: where its metadata lies and its body's length.
    fn messages(bytes: &[u8]) -> Vec<(std::ops::Range<usize>, i64)> {
        let (mut pos, mut out) = (0usize, vec![]);
        while pos + 8 <= bytes.len() {
            let len = i32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
            if len == 0 {
                break;
            }
            let meta = pos + 8..pos + 8 + len;
            let body = arrow::ipc::root_as_message(&bytes[meta.clone()])
                .unwrap()
                .bodyLength();
            pos = meta.end + body as usize;
            out.push((meta, body));
        }
        out
    }

    /// What reading the text column gives, as a pack reads it (through the guard that turns a
    /// panic of arrow-rs into an error): the texts, then the error that ended it, if any.
    fn read(path: &Path) -> (Vec<String>, Option<DataError>) {
        let mut texts = vec![];
        let options = crate::source::ReadOptions {
            text_field: "text".into(),
            read_threads: 1,
            max_doc_bytes: 1 << 20,
            chat: false,
            max_expansion: crate::source::DEFAULT_MAX_EXPANSION,
        };
        let docs = match super::super::open_input(path, crate::source::Format::Arrow, &options) {
            Ok(docs) => docs,
            Err(e) => return (texts, Some(e)),
        };
        for doc in docs {
            match doc {
                Ok(RawDoc {
                    content: Content::Text(t),
                    ..
                }) => texts.push(t),
                Ok(_) => unreachable!("arrow yields text"),
                Err(e) => return (texts, Some(e)),
            }
        }
        (texts, None)
    }

    #[test]
    fn a_stream_message_declaring_an_impossible_body_is_never_read() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.arrow");
        let mut w =
            StreamWriter::try_new(File::create(&path).unwrap(), &batches()[0].schema()).unwrap();
        for b in batches() {
            w.write(&b).unwrap();
        }
        w.finish().unwrap();
        let good = std::fs::read(&path).unwrap();
        let (texts, err) = read(&path);
        assert!(err.is_none(), "{err:?}");
        assert_eq!(texts.len(), 5);
        // Message 0 is the schema; message 2 the second batch. arrow-rs would allocate 2^60
        // bytes for the first (and panic on the second) before reading.
        let (meta, body) = messages(&good)[2].clone();
        for (declared, cause, words) in [
            (1i64 << 60, Cause::Truncated, "truncated after row 2"),
            (-8, Cause::Corrupt, "corrupt data after row 2"),
        ] {
            let mut bytes = good.clone();
            patch_i64(&mut bytes, meta.clone(), body, declared);
            std::fs::write(&path, &bytes).unwrap();
            let (texts, err) = read(&path);
            assert_eq!(texts, ["one", "two"], "the first batch is read");
            let err = err.expect("an error after the first batch");
            let text = err.to_string();
            assert!(
                matches!(&err, DataError::BadFile { cause: c, .. } if *c == cause),
                "{text}"
            );
            assert!(
                text.contains("s.arrow")
                    && text.contains(words)
                    && text.contains(&format!("message 2 at byte {}", meta.start - 8))
                    && text.contains(&format!("declares a body of {declared} bytes")),
                "{text}"
            );
        }
    }

    #[test]
    fn a_file_block_declaring_an_impossible_body_is_never_read() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.arrow");
        let mut w =
            FileWriter::try_new(File::create(&path).unwrap(), &batches()[0].schema()).unwrap();
        for b in batches() {
            w.write(&b).unwrap();
        }
        w.finish().unwrap();
        let mut bytes = std::fs::read(&path).unwrap();
        let len = bytes.len();
        let footer_len = i32::from_le_bytes(bytes[len - 10..len - 6].try_into().unwrap()) as usize;
        let footer = len - 10 - footer_len..len - 10;
        let body = arrow::ipc::root_as_footer(&bytes[footer.clone()])
            .unwrap()
            .recordBatches()
            .unwrap()
            .get(1)
            .bodyLength();
        patch_i64(&mut bytes, footer, body, -1);
        std::fs::write(&path, &bytes).unwrap();
        let (texts, err) = read(&path);
        assert_eq!(texts, ["one", "two"]);
        let text = err.expect("an error after the first batch").to_string();
        assert!(
            text.contains("f.arrow")
                && text.contains("corrupt data after row 2")
                && text.contains("record batch block 1")
                && text.contains("-1 bytes of body"),
            "{text}"
        );
    }

    /// A footer that lists one record batch twice (block 1 pointing at block 0's bytes) would
    /// have it read twice; it is refused before any batch is read, naming both blocks.
    #[test]
    fn a_footer_listing_one_block_twice_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("f.arrow");
        let mut bytes = ipc_bytes(true);
        let len = bytes.len();
        let footer_len = i32::from_le_bytes(bytes[len - 10..len - 6].try_into().unwrap()) as usize;
        let footer = len - 10 - footer_len..len - 10;
        let blocks: Vec<(i64, i64)> = arrow::ipc::root_as_footer(&bytes[footer.clone()])
            .unwrap()
            .recordBatches()
            .unwrap()
            .iter()
            .map(|b| {
                (
                    b.offset(),
                    b.offset() + i64::from(b.metaDataLength()) + b.bodyLength(),
                )
            })
            .collect();
        patch_i64(&mut bytes, footer, blocks[1].0, blocks[0].0);
        std::fs::write(&path, &bytes).unwrap();
        let (texts, err) = read(&path);
        assert!(texts.is_empty(), "nothing is read: {texts:?}");
        let err = err.expect("refused");
        let text = err.to_string();
        assert!(
            matches!(
                &err,
                DataError::BadFile {
                    cause: Cause::Corrupt,
                    ..
                }
            ),
            "{text}"
        );
        assert!(
            text.contains("f.arrow: corrupt Arrow IPC file: the footer's record batch block 0")
                && text.contains(&format!("(bytes {}..{})", blocks[0].0, blocks[0].1))
                && text.contains("record batch block 1")
                && text.contains("share bytes"),
            "{text}"
        );
    }

    /// The two batches as a stream (`false`) or a file (`true`).
    fn ipc_bytes(file: bool) -> Vec<u8> {
        let mut out = vec![];
        let schema = batches()[0].schema();
        if file {
            let mut w = FileWriter::try_new(&mut out, &schema).unwrap();
            for b in batches() {
                w.write(&b).unwrap();
            }
            w.finish().unwrap();
        } else {
            let mut w = StreamWriter::try_new(&mut out, &schema).unwrap();
            for b in batches() {
                w.write(&b).unwrap();
            }
            w.finish().unwrap();
        }
        out
    }

    #[test]
    fn a_bad_first_stream_message_is_an_error_naming_the_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("s.arrow");
        for (len, cause) in [
            (-8i32, Cause::Corrupt),
            (i32::MIN, Cause::Corrupt),
            (i32::MAX, Cause::Truncated),
        ] {
            let mut bytes = ipc_bytes(false);
            bytes[4..8].copy_from_slice(&len.to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let (texts, err) = read(&path);
            assert!(texts.is_empty());
            let err = err.expect("an error");
            let text = err.to_string();
            assert!(
                matches!(&err, DataError::BadFile { cause: c, .. } if *c == cause)
                    && text.contains("s.arrow")
                    && text.contains(&format!("message 0 at byte 0 declares {len} bytes")),
                "{text}"
            );
        }
    }

    #[test]
    fn a_buffer_outside_its_body_is_never_sliced() {
        let tmp = tempfile::tempdir().unwrap();
        for file in [false, true] {
            let path = tmp.path().join(if file { "f.arrow" } else { "s.arrow" });
            let good = ipc_bytes(file);
            // The second batch's values buffer: "three", "four" and 1300 bytes, 1309 bytes (a
            // length found in its metadata); claim far more.
            let mut bytes = good.clone();
            // An IPC file holds the stream's messages after its magic and padding.
            let skip = good.windows(4).position(|w| w == [0xff; 4]).unwrap();
            let (meta, _) = messages(&good[skip..])[2].clone();
            let at = (meta.start + skip..meta.end + skip - 8)
                .find(|&i| i64::from_le_bytes(bytes[i..i + 8].try_into().unwrap()) == 1309);
            let Some(at) = at else {
                panic!("no buffer length 1309 found");
            };
            bytes[at..at + 8].copy_from_slice(&(1i64 << 40).to_le_bytes());
            std::fs::write(&path, &bytes).unwrap();
            let (texts, err) = read(&path);
            assert_eq!(texts, ["one", "two"], "the first batch is read");
            let text = err.expect("an error after the first batch").to_string();
            assert!(
                text.contains("does not lie inside its body") && text.contains("buffer"),
                "{text}"
            );
        }
    }

    /// A damage to an IPC file or stream: overwrite bytes, cut it short, or insert bytes.
    #[derive(Debug, Clone)]
    enum Damage {
        Set(usize, Vec<u8>),
        Truncate(usize),
        Insert(usize, Vec<u8>),
    }

    fn damage() -> impl proptest::strategy::Strategy<Value = Damage> {
        use proptest::prelude::*;
        prop_oneof![
            (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..9))
                .prop_map(|(at, b)| Damage::Set(at, b)),
            any::<usize>().prop_map(Damage::Truncate),
            (any::<usize>(), proptest::collection::vec(any::<u8>(), 1..9))
                .prop_map(|(at, b)| Damage::Insert(at, b)),
        ]
    }

    fn apply(bytes: &mut Vec<u8>, d: &Damage) {
        let n = bytes.len();
        match d {
            Damage::Set(at, b) => {
                for (k, &x) in b.iter().enumerate() {
                    let i = (at + k) % n;
                    bytes[i] = x;
                }
            }
            Damage::Truncate(at) => bytes.truncate(at % n),
            Damage::Insert(at, b) => {
                let at = at % n;
                bytes.splice(at..at, b.iter().copied());
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Damaged IPC streams and files, and random bytes: the reader answers with texts and
        /// at most one error at the end, never a panic; undamaged data reads whole.
        #[test]
        fn damaged_ipc_never_panics(
            file in proptest::prelude::any::<bool>(),
            damages in proptest::collection::vec(damage(), 0..4),
            random in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            use_random in proptest::prelude::any::<bool>(),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join("x.arrow");
            let mut bytes = if use_random { random } else { ipc_bytes(file) };
            if !bytes.is_empty() {
                for d in &damages {
                    if bytes.is_empty() {
                        break;
                    }
                    apply(&mut bytes, d);
                }
            }
            std::fs::write(&path, &bytes).unwrap();
            let (texts, err) = read(&path);
            if !use_random && damages.is_empty() {
                proptest::prop_assert!(err.is_none(), "{:?}", err);
                proptest::prop_assert_eq!(texts.len(), 5);
            }
            if let Some(e) = err {
                proptest::prop_assert!(e.to_string().contains("x.arrow"), "{}", e);
            }
        }
    }
}
