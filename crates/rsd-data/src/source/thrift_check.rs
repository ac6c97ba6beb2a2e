//! Thrift compact-protocol structs from untrusted bytes, read without trusting their lengths.
//!
//! Parquet's footer (`FileMetaData`) and page headers (`PageHeader`) are Thrift compact-protocol
//! structs. The readers the parquet crate reads them with allocate what a field declares before
//! reading it: the `thrift` crate's stream protocol a binary field's length (up to 4 GiB, zeroed),
//! and the generated code a list's element count times its element's size (`Vec::with_capacity`),
//! for the parquet crate's own slice protocol too. So before either sees a struct, rsd:
//!
//! 1. walks it by the types its bytes declare ([`struct_len`]), allocating nothing: every binary
//!    length and every list, set and map element count must fit in the bytes left in the region
//!    given (at least one byte per element, eight per double), varints must be no longer than
//!    their type's (and in its range), field ids must not overflow, and nesting is at most
//!    [`MAX_DEPTH`] deep. This gives the struct's length, or an error naming the byte offset.
//! 2. parses those bytes into the parquet type with [`Bounded`], a protocol that checks each
//!    length and count against the bytes left before the generated code allocates anything
//!    ([`read_checked`]). That closes what the walk cannot see: the generated code reads a field
//!    by its id, not by the type its header declares, so a field declared as a short binary could
//!    hold what the parser reads as a struct with a huge list count. The parse must consume
//!    exactly the walked length.
//!
//! [`Bounded`] decodes every value it accepts exactly as the `thrift` crate's
//! `TCompactInputProtocol` and parquet's slice protocol do (varints of at most 3, 5 and 10 bytes
//! for 16-, 32- and 64-bit values and within their range, as `integer-encoding` reads them), so
//! when rsd has parsed a struct, the parquet crate's own parse of the same bytes takes the same
//! path and allocates only lengths and counts that fit in those bytes.

use std::fmt;

use parquet::thrift::TSerializable;
use thrift::protocol::{
    TFieldIdentifier, TInputProtocol, TListIdentifier, TMapIdentifier, TMessageIdentifier,
    TSetIdentifier, TStructIdentifier, TType,
};

/// How deeply structs, lists, sets and maps may nest in a walked struct (the struct itself is at
/// depth 1). Parquet's own structs nest a few levels deep.
pub(super) const MAX_DEPTH: usize = 64;

/// The most memory one element of a list in a parquet struct takes once parsed (a
/// `ColumnChunk`, the largest; a test checks the parquet types against it).
pub(super) const MAX_ELEMENT_BYTES: u64 = 550;

/// What the parse of a list element of Thrift type `t` reserves, at most: a struct
/// [`MAX_ELEMENT_BYTES`], a binary, string or nested collection its 24-byte handle, a scalar 8.
fn in_memory(t: u8) -> u64 {
    match t {
        STRUCT => MAX_ELEMENT_BYTES,
        BINARY | LIST | SET | MAP => 24,
        _ => 8,
    }
}

/// A walked struct: its length, and at most how many bytes its lists, sets and maps make the
/// parse reserve (element counts times their elements' size in memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Walked {
    pub(super) len: usize,
    pub(super) reserves: u64,
}

/// Why a struct was refused: the byte (from the start of the region) at which it went wrong, and
/// what was wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ThriftError {
    /// The offset, in the region given, of the byte that is wrong (or of the value that does not
    /// fit).
    pub(super) offset: usize,
    pub(super) what: String,
    /// Whether the region ran out: more bytes (a larger region) might make it valid.
    pub(super) truncated: bool,
}

impl fmt::Display for ThriftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.offset, self.what)
    }
}

impl std::error::Error for ThriftError {}

type Checked<T> = std::result::Result<T, ThriftError>;

// Compact-protocol type codes.
const STOP: u8 = 0;
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;

/// The fewest bytes one value of compact type `t` takes inside a collection.
fn min_len(t: u8) -> u64 {
    if t == DOUBLE {
        8
    } else {
        1
    }
}

/// A position in the region, with the primitive reads both the walk and the parse share.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// What the collections read so far make a parse reserve ([`Walked::reserves`]).
    reserves: u64,
}

impl<'a> Cursor<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn error(&self, offset: usize, what: String) -> ThriftError {
        ThriftError {
            offset,
            what,
            truncated: false,
        }
    }

    fn short(&self, offset: usize, what: String) -> ThriftError {
        ThriftError {
            offset,
            what,
            truncated: true,
        }
    }

    fn byte(&mut self, what: &str) -> Checked<u8> {
        match self.buf.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                Ok(b)
            }
            None => Err(self.short(self.pos, format!("the region ends before {what}"))),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Checked<&'a [u8]> {
        if n > self.left() {
            return Err(self.short(
                self.pos,
                format!("{what} needs {n} bytes, but only {} are left", self.left()),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    /// An unsigned varint of at most `max_bytes` bytes whose value is at most `max`.
    fn varint(&mut self, max_bytes: usize, max: u64, what: &str) -> Checked<u64> {
        let start = self.pos;
        let mut value = 0u64;
        for k in 0..max_bytes {
            let b = self.byte(what)?;
            let bits = u64::from(b & 0x7F);
            let shift = 7 * k as u32;
            if shift >= 64 || (bits << shift) >> shift != bits {
                return Err(self.error(start, format!("{what}: a varint past 64 bits")));
            }
            value |= bits << shift;
            if b & 0x80 == 0 {
                if value > max {
                    return Err(self.error(
                        start,
                        format!("{what}: varint {value} is out of range (at most {max})"),
                    ));
                }
                return Ok(value);
            }
        }
        Err(self.error(
            start,
            format!("{what}: a varint longer than {max_bytes} bytes"),
        ))
    }

    fn zigzag(v: u64) -> i64 {
        (v >> 1) as i64 ^ -((v & 1) as i64)
    }

    fn i16(&mut self, what: &str) -> Checked<i16> {
        Ok(Self::zigzag(self.varint(3, u64::from(u16::MAX), what)?) as i16)
    }

    fn i32(&mut self, what: &str) -> Checked<i32> {
        Ok(Self::zigzag(self.varint(5, u64::from(u32::MAX), what)?) as i32)
    }

    fn i64(&mut self, what: &str) -> Checked<i64> {
        Ok(Self::zigzag(self.varint(10, u64::MAX, what)?))
    }

    /// A binary's length, checked against the bytes left after it.
    fn binary_len(&mut self) -> Checked<usize> {
        let at = self.pos;
        let len = self.varint(5, u64::from(u32::MAX), "a binary's length")?;
        if len > self.left() as u64 {
            return Err(self.short(
                at,
                format!(
                    "a binary field declares {len} bytes, but only {} bytes are left",
                    self.left()
                ),
            ));
        }
        Ok(len as usize)
    }

    /// A collection's element type (a nibble): any type but stop; bool is 1 or 2.
    fn element_type(&self, at: usize, t: u8) -> Checked<u8> {
        match t {
            BOOL_TRUE..=STRUCT => Ok(t),
            _ => Err(self.error(at, format!("element type {t} is not a Thrift type"))),
        }
    }

    /// A list's or set's header: its element type and count, the count checked against the
    /// bytes left.
    fn list_header(&mut self) -> Checked<(u8, usize)> {
        let at = self.pos;
        let header = self.byte("a list header")?;
        let elem = self.element_type(at, header & 0x0F)?;
        let count = match header >> 4 {
            15 => self.varint(5, i32::MAX as u64, "a list's element count")?,
            n => u64::from(n),
        };
        self.check_count(at, count, min_len(elem), "list")?;
        self.reserves = self
            .reserves
            .saturating_add(count.saturating_mul(in_memory(elem)));
        Ok((elem, count as usize))
    }

    /// A map's header: key and value types and the count, checked against the bytes left.
    fn map_header(&mut self) -> Checked<(u8, u8, usize)> {
        let at = self.pos;
        let count = self.varint(5, i32::MAX as u64, "a map's entry count")?;
        if count == 0 {
            return Ok((0, 0, 0));
        }
        let types_at = self.pos;
        let types = self.byte("a map's key and value types")?;
        let key = self.element_type(types_at, types >> 4)?;
        let value = self.element_type(types_at, types & 0x0F)?;
        self.check_count(at, count, min_len(key) + min_len(value), "map")?;
        self.reserves = self
            .reserves
            .saturating_add(count.saturating_mul(in_memory(key) + in_memory(value)));
        Ok((key, value, count as usize))
    }

    fn check_count(&self, at: usize, count: u64, each: u64, kind: &str) -> Checked<()> {
        let left = self.left() as u64;
        if count.saturating_mul(each) > left {
            let size = if each == 1 {
                String::new()
            } else {
                format!(" of at least {each} bytes each")
            };
            return Err(self.short(
                at,
                format!("a {kind} declares {count} elements{size}, but only {left} bytes are left"),
            ));
        }
        Ok(())
    }

    /// A field header: its type and id (`None` at the struct's stop byte).
    fn field_header(&mut self, last_id: i16) -> Checked<Option<(u8, i16)>> {
        let at = self.pos;
        let b = self.byte("a field header or the struct's stop byte")?;
        let t = b & 0x0F;
        if t == STOP {
            return Ok(None);
        }
        if t > STRUCT {
            return Err(self.error(at, format!("field type {t} is not a Thrift type")));
        }
        let delta = b >> 4;
        let id = if delta == 0 {
            self.i16("a field id")?
        } else {
            last_id.checked_add(i16::from(delta)).ok_or_else(|| {
                self.error(
                    at,
                    format!("field id {last_id} + {delta} overflows a 16-bit id"),
                )
            })?
        };
        Ok(Some((t, id)))
    }
}

/// The length of the compact-protocol struct at the start of `region`, walked by the types its
/// bytes declare without allocating; or why it is not a struct that fits in `region`.
pub(super) fn struct_len(region: &[u8]) -> Checked<usize> {
    Ok(walk(region)?.len)
}

/// [`struct_len`], with what the struct's collections make a parse reserve.
pub(super) fn walk(region: &[u8]) -> Checked<Walked> {
    let mut c = Cursor {
        buf: region,
        pos: 0,
        reserves: 0,
    };
    walk_struct(&mut c, 1)?;
    Ok(Walked {
        len: c.pos,
        reserves: c.reserves,
    })
}

fn deeper(c: &Cursor<'_>, depth: usize) -> Checked<usize> {
    if depth >= MAX_DEPTH {
        return Err(c.error(c.pos, format!("values nest more than {MAX_DEPTH} deep")));
    }
    Ok(depth + 1)
}

fn walk_struct(c: &mut Cursor<'_>, depth: usize) -> Checked<()> {
    let mut last_id = 0i16;
    while let Some((t, id)) = c.field_header(last_id)? {
        last_id = id;
        match t {
            // A bool field's value is its type nibble.
            BOOL_TRUE | BOOL_FALSE => {}
            t => walk_value(c, t, depth)?,
        }
    }
    Ok(())
}

/// A value of type `t` (a bool is a byte here, as inside a collection).
fn walk_value(c: &mut Cursor<'_>, t: u8, depth: usize) -> Checked<()> {
    match t {
        BOOL_TRUE | BOOL_FALSE => {
            let at = c.pos;
            let b = c.byte("a bool")?;
            if b > 2 {
                return Err(c.error(at, format!("{b} is not a bool")));
            }
        }
        BYTE => {
            c.byte("a byte")?;
        }
        I16 => {
            c.i16("an i16")?;
        }
        I32 => {
            c.i32("an i32")?;
        }
        I64 => {
            c.i64("an i64")?;
        }
        DOUBLE => {
            c.take(8, "a double")?;
        }
        BINARY => {
            let len = c.binary_len()?;
            c.take(len, "a binary")?;
        }
        LIST | SET => {
            let depth = deeper(c, depth)?;
            let (elem, count) = c.list_header()?;
            for _ in 0..count {
                walk_value(c, elem, depth)?;
            }
        }
        MAP => {
            let depth = deeper(c, depth)?;
            let (key, value, count) = c.map_header()?;
            for _ in 0..count {
                walk_value(c, key, depth)?;
                walk_value(c, value, depth)?;
            }
        }
        STRUCT => {
            let depth = deeper(c, depth)?;
            walk_struct(c, depth)?;
        }
        _ => unreachable!("types are checked when their header is read"),
    }
    Ok(())
}

/// Reads a `T` from the struct at the start of `region`: walked first ([`struct_len`]), then
/// parsed with [`Bounded`] from exactly the walked bytes. Returns it and its length in bytes.
pub(super) fn read_checked<T: TSerializable>(region: &[u8]) -> Checked<(T, usize)> {
    let len = struct_len(region)?;
    let mut p = Bounded::new(&region[..len]);
    let value = match T::read_from_in_protocol(&mut p) {
        Ok(v) => v,
        Err(e) => {
            let what = match e {
                thrift::Error::Transport(e) => e.message,
                thrift::Error::Protocol(e) => e.message,
                thrift::Error::Application(e) => e.message,
                thrift::Error::User(e) => e.to_string(),
            };
            return Err(p.fault.take().unwrap_or(ThriftError {
                offset: p.c.pos,
                what,
                truncated: false,
            }));
        }
    };
    if p.c.pos != len {
        return Err(ThriftError {
            offset: p.c.pos,
            what: format!(
                "its fields are not of the types parquet reads them as (the struct's {len} \
                 bytes read as {} bytes)",
                p.c.pos
            ),
            truncated: false,
        });
    }
    Ok((value, len))
}

/// A compact-protocol reader over a slice that checks every binary length and list, set and map
/// count against the bytes left before returning it, so the code it feeds allocates no more than
/// the slice holds (a count × its elements' size). Decodes what it accepts as the `thrift` crate
/// and parquet do.
pub(super) struct Bounded<'a> {
    c: Cursor<'a>,
    last_id: i16,
    ids: Vec<i16>,
    pending_bool: Option<bool>,
    /// The first error, with its offset (the error returned through Thrift carries text only).
    fault: Option<ThriftError>,
}

impl<'a> Bounded<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Bounded {
            c: Cursor {
                buf,
                pos: 0,
                reserves: 0,
            },
            last_id: 0,
            ids: Vec::new(),
            pending_bool: None,
            fault: None,
        }
    }

    fn check<T>(&mut self, r: Checked<T>) -> thrift::Result<T> {
        r.map_err(|e| {
            let err = thrift::Error::Protocol(thrift::ProtocolError::new(
                thrift::ProtocolErrorKind::InvalidData,
                e.to_string(),
            ));
            self.fault.get_or_insert(e);
            err
        })
    }
}

fn ttype(t: u8) -> TType {
    match t {
        BOOL_TRUE | BOOL_FALSE => TType::Bool,
        BYTE => TType::I08,
        I16 => TType::I16,
        I32 => TType::I32,
        I64 => TType::I64,
        DOUBLE => TType::Double,
        BINARY => TType::String,
        LIST => TType::List,
        SET => TType::Set,
        MAP => TType::Map,
        STRUCT => TType::Struct,
        _ => TType::Stop,
    }
}

impl TInputProtocol for Bounded<'_> {
    fn read_message_begin(&mut self) -> thrift::Result<TMessageIdentifier> {
        let e = self
            .c
            .error(self.c.pos, "a message where a struct was expected".into());
        self.check(Err(e))
    }

    fn read_message_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }

    fn read_struct_begin(&mut self) -> thrift::Result<Option<TStructIdentifier>> {
        self.ids.push(self.last_id);
        self.last_id = 0;
        Ok(None)
    }

    fn read_struct_end(&mut self) -> thrift::Result<()> {
        self.last_id = self.ids.pop().unwrap_or(0);
        Ok(())
    }

    fn read_field_begin(&mut self) -> thrift::Result<TFieldIdentifier> {
        let r = self.c.field_header(self.last_id);
        match self.check(r)? {
            None => Ok(
                TFieldIdentifier::new::<Option<String>, String, Option<i16>>(
                    None,
                    TType::Stop,
                    None,
                ),
            ),
            Some((t, id)) => {
                self.last_id = id;
                if t == BOOL_TRUE || t == BOOL_FALSE {
                    self.pending_bool = Some(t == BOOL_TRUE);
                }
                Ok(
                    TFieldIdentifier::new::<Option<String>, String, Option<i16>>(
                        None,
                        ttype(t),
                        Some(id),
                    ),
                )
            }
        }
    }

    fn read_field_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }

    fn read_bool(&mut self) -> thrift::Result<bool> {
        if let Some(b) = self.pending_bool.take() {
            return Ok(b);
        }
        let at = self.c.pos;
        let b = self.c.byte("a bool");
        // 1 and 2, as the thrift crate reads them (parquet's slice reader takes 0 for false too).
        match self.check(b)? {
            1 => Ok(true),
            2 => Ok(false),
            b => {
                let e = self.c.error(at, format!("{b} is not a bool"));
                self.check(Err(e))
            }
        }
    }

    fn read_bytes(&mut self) -> thrift::Result<Vec<u8>> {
        let r = self.c.binary_len().and_then(|n| self.c.take(n, "a binary"));
        Ok(self.check(r)?.to_vec())
    }

    fn read_i8(&mut self) -> thrift::Result<i8> {
        let r = self.c.byte("a byte");
        Ok(self.check(r)? as i8)
    }

    fn read_i16(&mut self) -> thrift::Result<i16> {
        let r = self.c.i16("an i16");
        self.check(r)
    }

    fn read_i32(&mut self) -> thrift::Result<i32> {
        let r = self.c.i32("an i32");
        self.check(r)
    }

    fn read_i64(&mut self) -> thrift::Result<i64> {
        let r = self.c.i64("an i64");
        self.check(r)
    }

    fn read_double(&mut self) -> thrift::Result<f64> {
        let r = self.c.take(8, "a double");
        let b = self.check(r)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(f64::from_le_bytes(a))
    }

    fn read_string(&mut self) -> thrift::Result<String> {
        let at = self.c.pos;
        let bytes = self.read_bytes()?;
        String::from_utf8(bytes).or_else(|_| {
            let e = self.c.error(at, "a string that is not UTF-8".into());
            self.check(Err(e))
        })
    }

    fn read_list_begin(&mut self) -> thrift::Result<TListIdentifier> {
        let r = self.c.list_header();
        let (elem, count) = self.check(r)?;
        Ok(TListIdentifier::new(ttype(elem), count as i32))
    }

    fn read_list_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }

    fn read_set_begin(&mut self) -> thrift::Result<TSetIdentifier> {
        let r = self.c.list_header();
        let (elem, count) = self.check(r)?;
        Ok(TSetIdentifier::new(ttype(elem), count as i32))
    }

    fn read_set_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }

    fn read_map_begin(&mut self) -> thrift::Result<TMapIdentifier> {
        let r = self.c.map_header();
        let (key, value, count) = self.check(r)?;
        if count == 0 {
            return Ok(TMapIdentifier::new(None, None, 0));
        }
        Ok(TMapIdentifier::new(ttype(key), ttype(value), count as i32))
    }

    fn read_map_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }

    fn read_byte(&mut self) -> thrift::Result<u8> {
        let r = self.c.byte("a byte");
        self.check(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::format::{
        DataPageHeader, Encoding, FileMetaData, KeyValue, PageHeader, PageType, Statistics,
    };
    use proptest::prelude::*;
    use thrift::protocol::TCompactOutputProtocol;

    /// A struct holding one field of every type: bools (in the type nibble), byte, i16, i32,
    /// i64, double, binary, a short and a long-form list, a set, a map, a nested struct, and a
    /// field whose id is written in full (after a gap of more than 15).
    fn every_type() -> Vec<u8> {
        let mut b = vec![
            0x11, // field 1: bool true
            0x12, // field 2: bool false
            0x13, 0x7F, // field 3: byte
            0x14, 0xAC, 0x02, // field 4: i16 150 (zigzag 300)
            0x15, 0x81, 0x80, 0x04, // field 5: i32 -32769
            0x16, 0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
            0x01, // field 6: i64::MAX
            0x17, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F, // field 7: double 1.0
            0x18, 3, b'a', b'b', b'c', // field 8: binary "abc"
            0x19, 0x35, 2, 4, 6, // field 9: list<i32> [1, 2, 3]
            0x19, 0xF1, 0x14, // field 10: list<bool> of 20 (long form)
        ];
        b.extend([1; 20]);
        b.extend([0x1A, 0x28, 1, b'x', 0]); // field 11: set<binary> {"x", ""}
        b.extend([0x1B, 2, 0x85, 0, 2, 1, b'k', 4]); // field 12: map<binary, i32> {"": 1, "k": 2}
        b.extend([0x1B, 0]); // field 13: an empty map (no type byte)
        b.extend([0x1C, 0x15, 2, 0x1C, 0x11, 0, 0]); // field 14: struct {1: 1, 2: {1: true}}
        b.extend([0x19, 0x17, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F]); // field 15: list<double> [1.0]
        b.extend([0x06, 0xC8, 0x01, 0x2A]); // field 100 (id in full): i64 21
        b.push(0); // stop
        b
    }

    #[test]
    fn a_struct_of_every_type_is_walked_to_its_end() {
        let b = every_type();
        assert_eq!(struct_len(&b), Ok(b.len()));
        // Bytes after the struct are not its.
        let mut more = b.clone();
        more.extend([0xFF, 0xFF]);
        assert_eq!(struct_len(&more), Ok(b.len()));
    }

    #[test]
    fn what_the_collections_would_reserve_is_counted_by_element_type() {
        // Field 1: a list of 3 structs (empty); field 2: a list of 2 binaries; field 3: a map of
        // one i32 → binary entry.
        let region = [
            0x19, 0x3C, 0x00, 0x00, 0x00, // list<struct>[3]
            0x19, 0x28, 0x00, 0x00, // list<binary>[2], both empty
            0x1B, 0x01, 0x58, 0x02, 0x00, // map<i32, binary>{1: ""}
            0x00,
        ];
        let walked = walk(&region).unwrap();
        assert_eq!(walked.len, region.len());
        assert_eq!(walked.reserves, 3 * MAX_ELEMENT_BYTES + 2 * 24 + (8 + 24));
    }

    #[test]
    fn a_struct_cut_anywhere_is_an_error_at_or_before_the_cut() {
        let b = every_type();
        for cut in 0..b.len() {
            let e = struct_len(&b[..cut]).unwrap_err();
            assert!(e.truncated, "cut at {cut}: {e}");
            assert!(e.offset <= cut, "cut at {cut}: {e}");
            assert!(
                e.to_string().starts_with(&format!("at byte {}", e.offset)),
                "{e}"
            );
        }
    }

    #[test]
    fn lengths_and_counts_past_the_region_are_refused_naming_their_offset() {
        // field 1: binary of 4 GiB - 1, with 3 bytes after it.
        let b = [0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 1, 2, 3];
        let e = struct_len(&b).unwrap_err();
        assert_eq!(e.offset, 1);
        assert!(
            e.what.contains("declares 4294967295 bytes, but only 3"),
            "{e}"
        );
        // field 1: list<struct> of i32::MAX elements (long form).
        let b = [0x19, 0xFC, 0xFF, 0xFF, 0xFF, 0xFF, 0x07, 0, 0];
        let e = struct_len(&b).unwrap_err();
        assert_eq!(e.offset, 1);
        assert!(e.what.contains("2147483647 elements"), "{e}");
        // A list of doubles needs 8 bytes each.
        let e = struct_len(&[0x19, 0x27, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err();
        assert!(e.what.contains("2 elements of at least 8 bytes"), "{e}");
        // A map of i32::MAX + 1 entries is out of range.
        let e = struct_len(&[0x1B, 0x80, 0x80, 0x80, 0x80, 0x08, 0x55, 0]).unwrap_err();
        assert!(e.what.contains("out of range"), "{e}");
        // A binary's length as a 6-byte varint.
        let e = struct_len(&[0x18, 0x81, 0x80, 0x80, 0x80, 0x80, 0x00, 0]).unwrap_err();
        assert!(e.what.contains("longer than 5 bytes"), "{e}");
    }

    #[test]
    fn malformed_structs_are_refused() {
        // Field type 13 does not exist; nor does list element type 0.
        assert!(struct_len(&[0x1D, 0])
            .unwrap_err()
            .what
            .contains("field type 13"));
        assert!(struct_len(&[0x19, 0x10, 0])
            .unwrap_err()
            .what
            .contains("element type 0"));
        // A bool inside a list must be 0, 1 or 2.
        let e = struct_len(&[0x19, 0x11, 7, 0]).unwrap_err();
        assert_eq!((e.offset, e.what.as_str()), (2, "7 is not a bool"));
        // Field id 32767 + 1 overflows (the thrift crate's reader would panic in debug builds).
        let e = struct_len(&[0x03, 0xFE, 0xFF, 0x03, 7, 0x13, 7, 0]).unwrap_err();
        assert_eq!(e.offset, 5, "{e}");
        assert!(e.what.contains("overflows"), "{e}");
        // Nesting: 64 structs deep is the limit.
        let nest = |n: usize| {
            let mut b = vec![0x1C; n - 1];
            b.extend(vec![0; n]);
            b
        };
        // A PageHeader without its required fields is refused by the parse, saying which.
        let e = read_checked::<PageHeader>(&[0x15, 0, 0]).unwrap_err();
        assert!(e.what.contains("PageHeader.uncompressed_page_size"), "{e}");
        assert_eq!(struct_len(&nest(MAX_DEPTH)), Ok(2 * MAX_DEPTH - 1));
        let e = struct_len(&nest(MAX_DEPTH + 1)).unwrap_err();
        assert!(e.what.contains("nest more than 64"), "{e}");
        // And lists of lists count too.
        let mut b = vec![0x19];
        b.extend(vec![0x19; 70]);
        b.push(0x03);
        let e = struct_len(&b).unwrap_err();
        assert!(e.what.contains("nest more than 64") && !e.truncated, "{e}");
    }

    fn write<T: TSerializable>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        let mut p = TCompactOutputProtocol::new(&mut out);
        value.write_to_out_protocol(&mut p).unwrap();
        out
    }

    fn page_header(min: Vec<u8>, max: Vec<u8>) -> PageHeader {
        let statistics = Statistics {
            max: Some(max.clone()),
            min: Some(min.clone()),
            null_count: Some(3),
            distinct_count: Some(-5),
            max_value: Some(max),
            min_value: Some(min),
            is_max_value_exact: Some(true),
            is_min_value_exact: Some(false),
        };
        PageHeader {
            type_: PageType::DATA_PAGE,
            uncompressed_page_size: 1 << 20,
            compressed_page_size: 12345,
            crc: Some(-7),
            data_page_header: Some(DataPageHeader {
                num_values: 1000,
                encoding: Encoding::DELTA_BYTE_ARRAY,
                definition_level_encoding: Encoding::RLE,
                repetition_level_encoding: Encoding::RLE,
                statistics: Some(statistics),
            }),
            index_page_header: None,
            dictionary_page_header: None,
            data_page_header_v2: None,
        }
    }

    #[test]
    fn page_headers_the_thrift_crate_writes_are_read_back_whole() {
        for (min, max) in [
            (vec![], vec![]),
            (b"aardvark".to_vec(), b"zebra".to_vec()),
            (vec![7; 300], vec![9; 70_000]),
        ] {
            let header = page_header(min, max);
            let mut bytes = write(&header);
            let len = bytes.len();
            assert_eq!(struct_len(&bytes), Ok(len));
            bytes.extend([0xAB; 100]); // the page that follows
            assert_eq!(read_checked::<PageHeader>(&bytes), Ok((header, len)));
        }
    }

    #[test]
    fn a_real_footer_is_walked_to_its_length() {
        use arrow::array::{RecordBatch, StringArray};
        use parquet::arrow::ArrowWriter;
        use parquet::file::properties::{EnabledStatistics, WriterProperties};
        use std::sync::Arc;

        let array = StringArray::from_iter_values((0..500).map(|i| format!("row {i}")));
        let batch = RecordBatch::try_from_iter([("text", Arc::new(array) as _)]).unwrap();
        let props = WriterProperties::builder()
            .set_statistics_enabled(EnabledStatistics::Page)
            .set_max_row_group_size(100)
            .set_key_value_metadata(Some(vec![KeyValue::new("k".into(), "v".to_string())]))
            .build();
        let mut file = Vec::new();
        let mut w = ArrowWriter::try_new(&mut file, batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let n = file.len();
        let len = u32::from_le_bytes(file[n - 8..n - 4].try_into().unwrap()) as usize;
        let footer = &file[n - 8 - len..n - 8];
        assert_eq!(struct_len(footer), Ok(len));
        let (meta, used) = read_checked::<FileMetaData>(footer).unwrap();
        assert_eq!((used, meta.row_groups.len(), meta.num_rows), (len, 5, 500));
    }

    #[test]
    fn a_field_whose_declared_type_is_not_parquets_is_refused_by_the_parse() {
        // PageHeader field 5 (data_page_header, a struct) declared as a binary whose bytes hold
        // a DataPageHeader with statistics of 4 GiB: the walk skips the binary, but parquet's
        // generated code reads field 5 as a struct, whatever its header says.
        // The binary's length, 21, reads as the header of field 1 (an i32): num_values.
        let mut inner = vec![2, 0x15, 0, 0x15, 0, 0x15, 0, 0x1C, 0x18];
        inner.extend([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]);
        inner.resize(21, 0);
        let mut b = vec![0x15, 0, 0x15, 2, 0x15, 2, 0x28, inner.len() as u8];
        b.extend(&inner);
        b.push(0);
        assert_eq!(struct_len(&b), Ok(b.len()));
        let e = read_checked::<PageHeader>(&b).unwrap_err();
        assert!(e.what.contains("declares 4294967295 bytes"), "{e}");
        assert_eq!(e.offset, 17);
    }

    /// docs/UNTRUSTED.md states what a list in a crafted footer can make the parquet crate
    /// reserve: its count (at most the footer's bytes) times its element's size, at most about
    /// 550 bytes (a ColumnChunk). A parquet upgrade that grows them must update the docs.
    #[test]
    fn footer_list_elements_take_at_most_550_bytes_each() {
        use parquet::format::{
            ColumnChunk, ColumnOrder, PageEncodingStats, RowGroup, SchemaElement, SortingColumn,
        };
        use std::mem::size_of;
        let sizes = [
            size_of::<RowGroup>(),
            size_of::<ColumnChunk>(),
            size_of::<SchemaElement>(),
            size_of::<KeyValue>(),
            size_of::<ColumnOrder>(),
            size_of::<SortingColumn>(),
            size_of::<PageEncodingStats>(),
            size_of::<Vec<u8>>(),
            size_of::<i64>(),
        ];
        assert!(
            sizes.iter().all(|&s| s as u64 <= MAX_ELEMENT_BYTES),
            "{sizes:?}"
        );
    }

    /// `header` with `edits` (position, byte) applied, positions taken modulo its length.
    fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)]) -> Vec<u8> {
        let n = bytes.len();
        for &(at, b) in edits {
            bytes[at % n] = b;
        }
        bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(len) = struct_len(&bytes) {
                prop_assert!(len <= bytes.len());
            }
            let _ = read_checked::<PageHeader>(&bytes);
            let _ = read_checked::<FileMetaData>(&bytes);
        }

        /// A damaged page header: when it is accepted, the thrift crate's own reader (the one
        /// the parquet crate reads page headers with) reads the same header from the same bytes,
        /// so it allocates no length the check did not see fit. The one difference allowed: a
        /// list or set of bools whose element type is 2, which the compact protocol's spec and
        /// parquet's own footer reader accept, and thrift 0.17 refuses (an error, no allocation).
        #[test]
        fn damaged_page_headers_are_read_alike_or_refused(
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
            tail in proptest::collection::vec(any::<u8>(), 0..16),
        ) {
            let mut bytes = mutate(write(&page_header(b"low".to_vec(), b"high".to_vec())), &edits);
            bytes.extend(tail);
            if let Ok(len) = struct_len(&bytes) {
                prop_assert!(len <= bytes.len());
            }
            if let Ok((header, len)) = read_checked::<PageHeader>(&bytes) {
                let mut input = &bytes[..len];
                let mut p = thrift::protocol::TCompactInputProtocol::new(&mut input);
                match PageHeader::read_from_in_protocol(&mut p) {
                    Ok(theirs) => {
                        prop_assert_eq!(theirs, header);
                        prop_assert!(input.is_empty(), "they read all {} bytes", len);
                    }
                    Err(e) => prop_assert!(
                        matches!(&e, thrift::Error::Protocol(p)
                            if p.message == "cannot convert 2 into TType"),
                        "accepted here, refused by thrift: {:?}", e
                    ),
                }
            }
        }
    }
}
