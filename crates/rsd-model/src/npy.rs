//! `.npy` files (token ids, positions) read by rsd itself, trusting nothing in them.
//!
//! libtorch's reader (`Tensor::read_npy`) believes the header: a header declaring more elements
//! than the file holds makes it read past the data. This reader checks the header completely
//! first — magic, version (1.0, 2.0, 3.0), a header dict with exactly `descr`, `fortran_order` and
//! `shape`, a little-endian dtype it knows, C order — and computes the data size from the shape
//! with checked arithmetic. The file must hold exactly that many bytes after the header; only
//! then is the data read, so a header declaring a huge shape allocates nothing.
//!
//! Accepted dtypes: `|u1`, `|i1`, `<i2`, `<i4`, `<i8` (ids) and `<f4`, `<f8` (callers that want
//! ids refuse floats with their own message naming the dtype).
use std::io::Read;
use std::path::Path;

use tch::{Kind, Tensor};

use crate::error::{ModelError, Result, TchContext};

/// The magic string every `.npy` file starts with.
const MAGIC: &[u8] = b"\x93NUMPY";

/// The largest header accepted. numpy itself refuses headers over 10 000 bytes unless told
/// otherwise; real ones are about a hundred bytes.
pub const MAX_HEADER_BYTES: usize = 1 << 20;

pub use crate::error::NpyError;

/// A parsed `.npy` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// The dtype as written (`<i8`).
    pub descr: String,
    /// Its libtorch kind.
    pub kind: Kind,
    /// The shape (empty for a scalar).
    pub shape: Vec<u64>,
    /// Bytes before the data: preamble and header.
    pub data_offset: u64,
    /// Bytes of data the shape and dtype declare.
    pub data_bytes: u64,
}

/// The kind and item size of a `descr`, if supported.
fn dtype(descr: &str) -> Option<(Kind, u64)> {
    Some(match descr {
        "|u1" | "<u1" => (Kind::Uint8, 1),
        "|i1" | "<i1" => (Kind::Int8, 1),
        "<i2" => (Kind::Int16, 2),
        "<i4" => (Kind::Int, 4),
        "<i8" => (Kind::Int64, 8),
        "<f4" => (Kind::Float, 4),
        "<f8" => (Kind::Double, 8),
        _ => return None,
    })
}

/// A value of the header dict.
#[derive(Debug)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
}

/// A cursor over the header text: the subset of Python literal syntax numpy writes (a dict of
/// string keys to strings, booleans and tuples of integers).
struct Lexer<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Lexer<'a> {
    fn skip_space(&mut self) {
        let rest = &self.text[self.at..];
        self.at += rest.len() - rest.trim_start().len();
    }

    fn peek(&mut self) -> Option<char> {
        self.skip_space();
        self.text[self.at..].chars().next()
    }

    /// Consumes `c` (after spaces) or says what was found instead.
    fn expect(&mut self, c: char) -> std::result::Result<(), String> {
        match self.peek() {
            Some(found) if found == c => {
                self.at += c.len_utf8();
                Ok(())
            }
            found => Err(format!(
                "expected {c:?} at byte {}, found {found:?}",
                self.at
            )),
        }
    }

    /// A quoted string (no escapes: numpy writes none in these fields).
    fn string(&mut self) -> std::result::Result<String, String> {
        let quote = match self.peek() {
            Some(q @ ('\'' | '"')) => q,
            found => {
                return Err(format!(
                    "expected a quoted string at byte {}, found {found:?}",
                    self.at
                ))
            }
        };
        let start = self.at + 1;
        let Some(len) = self.text[start..].find(quote) else {
            return Err(format!("unterminated string at byte {}", self.at));
        };
        self.at = start + len + 1;
        Ok(self.text[start..start + len].to_string())
    }

    fn word(&mut self) -> &'a str {
        self.skip_space();
        let rest = &self.text[self.at..];
        let len = rest
            .find(|c: char| !c.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        self.at += len;
        &rest[..len]
    }

    fn value(&mut self) -> std::result::Result<Value, String> {
        match self.peek() {
            Some('\'' | '"') => Ok(Value::Str(self.string()?)),
            Some('(') => {
                self.at += 1;
                let mut dims = Vec::new();
                loop {
                    if self.peek() == Some(')') {
                        self.at += 1;
                        return Ok(Value::Tuple(dims));
                    }
                    let at = self.at;
                    let word = self.word();
                    let dim = word.parse::<u64>().map_err(|_| {
                        format!("expected a dimension at byte {at}, found {word:?}")
                    })?;
                    dims.push(dim);
                    match self.peek() {
                        Some(',') => self.at += 1,
                        Some(')') => {}
                        found => {
                            return Err(format!(
                                "expected ',' or ')' in shape at byte {}, found {found:?}",
                                self.at
                            ))
                        }
                    }
                }
            }
            _ => {
                let at = self.at;
                match self.word() {
                    "True" => Ok(Value::Bool(true)),
                    "False" => Ok(Value::Bool(false)),
                    word => Err(format!(
                        "expected a string, True, False or a tuple at byte {at}, found {word:?}"
                    )),
                }
            }
        }
    }

    /// The dict, as (key, value) pairs in order.
    fn dict(&mut self) -> std::result::Result<Vec<(String, Value)>, String> {
        self.expect('{')?;
        let mut items = Vec::new();
        loop {
            if self.peek() == Some('}') {
                self.at += 1;
                break;
            }
            let key = self.string()?;
            self.expect(':')?;
            items.push((key, self.value()?));
            match self.peek() {
                Some(',') => self.at += 1,
                Some('}') => {}
                found => {
                    return Err(format!(
                        "expected ',' or '}}' at byte {}, found {found:?}",
                        self.at
                    ))
                }
            }
        }
        if self.peek().is_some() {
            return Err(format!(
                "unexpected text after the dict at byte {}",
                self.at
            ));
        }
        Ok(items)
    }
}

/// Checks the start of a `.npy` file: `bytes` holds at least the preamble and header (more is
/// ignored). `file_len` is the whole file's size; the data after the header must be exactly what
/// the header declares. `path` is for messages only.
pub fn parse_header(path: &Path, bytes: &[u8], file_len: u64) -> Result<Header, NpyError> {
    let header_err = |reason: String| header_error(path, reason);
    let (text, data_offset) = header_text(path, bytes)?;
    let items = Lexer { text, at: 0 }.dict().map_err(header_err)?;
    let (descr, fortran, shape) = header_fields(path, items)?;
    let Some((kind, item)) = dtype(&descr) else {
        return Err(NpyError::Dtype {
            path: path.to_path_buf(),
            descr,
        });
    };
    if fortran {
        return Err(NpyError::FortranOrder {
            path: path.to_path_buf(),
        });
    }
    let data_offset = data_offset as u64;
    let declared = shape
        .iter()
        .try_fold(item, |acc, &d| acc.checked_mul(d))
        // libtorch sizes are i64: a shape whose element count does not fit is refused too.
        .filter(|&n| i64::try_from(n).is_ok());
    let found = file_len.saturating_sub(data_offset);
    if file_len < data_offset || declared != Some(found) {
        return Err(NpyError::Size {
            path: path.to_path_buf(),
            shape,
            descr,
            declared,
            found,
        });
    }
    Ok(Header {
        descr,
        kind,
        shape,
        data_offset,
        data_bytes: found,
    })
}

/// A header that is not what `.npy` files hold: `reason`.
fn header_error(path: &Path, reason: String) -> NpyError {
    NpyError::Header {
        path: path.to_path_buf(),
        reason,
    }
}

/// The header's text, after the magic bytes, the version and the header length have been
/// checked, and the offset of the data after it.
fn header_text<'a>(path: &Path, bytes: &'a [u8]) -> Result<(&'a str, usize), NpyError> {
    let header_err = |reason: String| header_error(path, reason);
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(NpyError::NotNpy {
            path: path.to_path_buf(),
        });
    }
    let (major, minor) = match bytes.get(6..8) {
        Some(&[major, minor]) => (major, minor),
        _ => return Err(header_err("the file ends inside the version bytes".into())),
    };
    // Version 1 has a 2-byte header length, versions 2 and 3 a 4-byte one; 3 allows UTF-8.
    let len_bytes = match (major, minor) {
        (1, 0) => 2,
        (2, 0) | (3, 0) => 4,
        _ => {
            return Err(NpyError::Version {
                path: path.to_path_buf(),
                major,
                minor,
            })
        }
    };
    let Some(len_field) = bytes.get(8..8 + len_bytes) else {
        return Err(header_err("the file ends inside the header length".into()));
    };
    let header_len = len_field
        .iter()
        .rev()
        .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
    if header_len > MAX_HEADER_BYTES {
        return Err(header_err(format!(
            "a header of {header_len} bytes; at most {MAX_HEADER_BYTES} are read"
        )));
    }
    let start = 8 + len_bytes;
    let Some(text) = bytes.get(start..start + header_len) else {
        return Err(header_err(format!(
            "the header length says {header_len} bytes, the file ends before"
        )));
    };
    let text = std::str::from_utf8(text)
        .map_err(|e| header_err(format!("the header is not text: {e}")))?;
    Ok((text, start + header_len))
}

/// The header dict's three fields, `descr`, `fortran_order` and `shape`: each present once,
/// with its type, and no other.
fn header_fields(
    path: &Path,
    items: Vec<(String, Value)>,
) -> Result<(String, bool, Vec<u64>), NpyError> {
    let header_err = |reason: String| header_error(path, reason);
    let mut descr = None;
    let mut fortran = None;
    let mut shape = None;
    for (key, value) in items {
        let slot_taken = match (key.as_str(), value) {
            ("descr", Value::Str(s)) => descr.replace(s).is_some(),
            ("fortran_order", Value::Bool(b)) => fortran.replace(b).is_some(),
            ("shape", Value::Tuple(t)) => shape.replace(t).is_some(),
            ("descr" | "fortran_order" | "shape", value) => {
                return Err(header_err(format!(
                    "field {key:?} has the wrong type: {value:?}"
                )))
            }
            _ => {
                return Err(header_err(format!(
                    "unexpected field {key:?} (expected descr, fortran_order, shape)"
                )))
            }
        };
        if slot_taken {
            return Err(header_err(format!("field {key:?} appears twice")));
        }
    }
    let missing = |field: &str| header_err(format!("no field {field:?}"));
    let descr = descr.ok_or_else(|| missing("descr"))?;
    let fortran = fortran.ok_or_else(|| missing("fortran_order"))?;
    let shape = shape.ok_or_else(|| missing("shape"))?;
    Ok((descr, fortran, shape))
}

/// Reads a `.npy` file as a CPU tensor, after checking its header against its size (see the
/// module docs). The file must be a regular file (a FIFO is refused, not waited on).
pub fn read(path: &Path) -> Result<Tensor> {
    // The data is copied as is: these formats are little-endian, as the host must be.
    if cfg!(target_endian = "big") {
        return Err(ModelError::Input(
            "reading .npy files needs a little-endian machine".into(),
        ));
    }
    let io = |e| crate::error::io_err(path)(e);
    let file = rsd_common::safe_fs::open_regular(path)?;
    let file_len = file.metadata().map_err(io)?.len();
    // The preamble is at most 12 bytes; the header at most MAX_HEADER_BYTES after it.
    let mut head = Vec::new();
    let mut reader = std::io::BufReader::new(file);
    (&mut reader)
        .take(12 + MAX_HEADER_BYTES as u64)
        .read_to_end(&mut head)
        .map_err(io)?;
    let header = parse_header(path, &head, file_len)?;
    // The data: what the header declares, which is exactly what the file holds (checked above),
    // so this allocates no more than the file's size.
    let offset = header.data_offset as usize;
    let mut data = head.split_off(offset.min(head.len()));
    let want = usize::try_from(header.data_bytes).map_err(|_| {
        ModelError::Input(format!("{}: too large for this machine", path.display()))
    })?;
    if data.len() < want {
        data.reserve_exact(want - data.len());
        reader
            .take((want - data.len()) as u64)
            .read_to_end(&mut data)
            .map_err(io)?;
    }
    if data.len() != want {
        // The file changed size while read.
        return Err(ModelError::from(NpyError::Size {
            path: path.to_path_buf(),
            shape: header.shape,
            descr: header.descr,
            declared: Some(header.data_bytes),
            found: data.len() as u64,
        }));
    }
    // Each dimension is at most the element count, which fits in i64 (checked in parse_header).
    let shape: Vec<i64> = header.shape.iter().map(|&d| d as i64).collect();
    Tensor::f_from_data_size(&data, &shape, header.kind).ctx("reading a .npy file")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes numpy's `np.save` writes for a header `dict` (version 1.0, padded to 64).
    fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
        let mut header = dict.as_bytes().to_vec();
        let total = 10 + header.len() + 1;
        header.resize(header.len() + (64 - total % 64) % 64, b' ');
        header.push(b'\n');
        let mut out = MAGIC.to_vec();
        out.extend([1, 0]);
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header);
        out.extend(data);
        out
    }

    fn parse(bytes: &[u8]) -> Result<Header, NpyError> {
        parse_header(Path::new("t.npy"), bytes, bytes.len() as u64)
    }

    #[test]
    fn numpy_headers_parse() {
        let b = npy(
            "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }",
            &[0; 48],
        );
        let h = parse(&b).unwrap();
        assert_eq!((h.kind, h.shape.clone()), (Kind::Int64, vec![2, 3]));
        assert_eq!((h.data_offset % 64, h.data_bytes), (0, 48));
        let b = npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }",
            &[0; 20],
        );
        assert_eq!(parse(&b).unwrap().shape, vec![5]);
        let b = npy(
            "{'descr': '|u1', 'fortran_order': False, 'shape': (), }",
            &[7],
        );
        assert_eq!(parse(&b).unwrap().shape, Vec::<u64>::new());
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        let cases = [
            (
                "{'descr': '>i8', 'fortran_order': False, 'shape': (1,), }",
                "dtype \">i8\"",
            ),
            (
                "{'descr': '<i8', 'fortran_order': True, 'shape': (1,), }",
                "Fortran order",
            ),
            (
                "{'descr': '<i8', 'shape': (1,), }",
                "no field \"fortran_order\"",
            ),
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': (1,), 'x': 'y'}",
                "unexpected field \"x\"",
            ),
            (
                "{'descr': '<i8', 'descr': '<i8', 'fortran_order': False, 'shape': (1,)}",
                "appears twice",
            ),
            (
                "{'descr': '<i8', 'fortran_order': False, 'shape': (-1,), }",
                "expected a dimension",
            ),
            (
                "{'descr': 8, 'fortran_order': False, 'shape': (1,), }",
                "expected a string",
            ),
            (
                "{'descr': '<i8', 'fortran_order': 0, 'shape': (1,), }",
                "expected a string, True",
            ),
        ];
        for (dict, want) in cases {
            let e = parse(&npy(dict, &[0; 8])).unwrap_err().to_string();
            assert!(e.contains("t.npy") && e.contains(want), "{dict}: {e}");
        }
        let e = parse(b"\x93NUMPX\x01\x00").unwrap_err().to_string();
        assert!(e.contains("not a .npy file"), "{e}");
        let e = parse(b"\x93NUMPY\x04\x00\x10\x00").unwrap_err().to_string();
        assert!(e.contains("version 4.0"), "{e}");
    }

    #[test]
    fn the_data_must_be_exactly_what_the_header_declares() {
        let dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
        for len in [0, 23, 25] {
            let e = parse(&npy(dict, &vec![0; len])).unwrap_err().to_string();
            assert!(
                e.contains("declares shape [2, 3] of <i4 (24 bytes)")
                    && e.contains(&format!("holds {len} bytes")),
                "{e}"
            );
        }
        // A shape whose size overflows u64: an error, not a wrap.
        let huge = "{'descr': '<i8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }";
        let e = parse(&npy(huge, &[0; 8])).unwrap_err().to_string();
        assert!(e.contains("more than 2^63 - 1 bytes"), "{e}");
        // A header length past the end of the file.
        let mut b = npy(dict, &[0; 24]);
        b[8] = 0xff;
        assert!(parse(&b[..100])
            .unwrap_err()
            .to_string()
            .contains("ends before"));
    }
}
