//! Line-by-line reading of the JSON-lines files rsd-eval reads (`results.jsonl`, items,
//! prediction files, `longbench.jsonl`): a regular file only, of at most a stated size, read one
//! line at a time with a cap on each line, so that a file without newlines, or a sparse file
//! declaring gigabytes, costs at most one line's bound of memory, never the whole file.
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Take};
use std::path::{Path, PathBuf};

use rsd_common::safe_fs::FsError;

/// What reading a JSON-lines file can go wrong with; every message names the file (and the
/// line).
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// The file is not a regular file, or could not be opened.
    #[error(transparent)]
    File(#[from] FsError),
    /// The file is larger than a file of its kind may be.
    #[error("{}: {size} bytes, more than the {limit} bytes a {what} may have", path.display())]
    FileTooLarge {
        /// The file.
        path: PathBuf,
        /// Its size (as its metadata says, or as read so far).
        size: u64,
        /// The limit.
        limit: u64,
        /// What the file is read as.
        what: &'static str,
    },
    /// A line is longer than a line of its kind may be.
    #[error("{}:{line}: a line of more than {limit} bytes, the most a line of a {what} may have", path.display())]
    LineTooLong {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The limit in bytes.
        limit: u64,
        /// What the file is read as.
        what: &'static str,
    },
    /// A line is not UTF-8.
    #[error("{}:{line}: not UTF-8 text (byte {offset} of the line)", path.display())]
    NotUtf8 {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Byte offset of the first invalid byte within the line.
        offset: usize,
    },
    /// Reading failed.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The lines of one file, read one at a time (see the module docs).
pub struct Lines {
    reader: BufReader<Take<File>>,
    path: PathBuf,
    file_limit: u64,
    line_limit: u64,
    what: &'static str,
    number: usize,
    read: u64,
    bytes: Vec<u8>,
}

/// One line: its 1-based number, its text without the line ending, and whether it ended with a
/// newline (a last line without one may be torn: a run killed while writing it).
pub struct Line<'a> {
    /// 1-based line number.
    pub number: usize,
    /// The text, without `\n` (or `\r\n`).
    pub text: &'a str,
    /// Whether a newline ended it.
    pub complete: bool,
}

impl Lines {
    /// Opens `path` (a regular file of at most `file_limit` bytes, checked before anything is
    /// read), to read lines of at most `line_limit` bytes; `what` names the file's kind in
    /// messages.
    pub fn open(
        path: &Path,
        file_limit: u64,
        line_limit: u64,
        what: &'static str,
    ) -> Result<Lines, LineError> {
        let file = rsd_common::safe_fs::open_regular(path)?;
        let size = file
            .metadata()
            .map_err(|source| LineError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        if size > file_limit {
            return Err(LineError::FileTooLarge {
                path: path.to_path_buf(),
                size,
                limit: file_limit,
                what,
            });
        }
        // The limit bounds the read too, should the file grow while it is read.
        Ok(Lines {
            reader: BufReader::new(file.take(file_limit.saturating_add(1))),
            path: path.to_path_buf(),
            file_limit,
            line_limit,
            what,
            number: 0,
            read: 0,
            bytes: Vec::new(),
        })
    }

    /// The file being read.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The next line, `None` at the end of the file.
    pub fn next_line(&mut self) -> Result<Option<Line<'_>>, LineError> {
        self.bytes.clear();
        let n = (&mut self.reader)
            .take(self.line_limit.saturating_add(1))
            .read_until(b'\n', &mut self.bytes)
            .map_err(|source| LineError::Io {
                path: self.path.clone(),
                source,
            })?;
        if n == 0 {
            return Ok(None);
        }
        self.number += 1;
        self.read += n as u64;
        if self.read > self.file_limit {
            return Err(LineError::FileTooLarge {
                path: self.path.clone(),
                size: self.read,
                limit: self.file_limit,
                what: self.what,
            });
        }
        let complete = self.bytes.last() == Some(&b'\n');
        let content = self.bytes.len() - usize::from(complete);
        if content as u64 > self.line_limit {
            return Err(LineError::LineTooLong {
                path: self.path.clone(),
                line: self.number,
                limit: self.line_limit,
                what: self.what,
            });
        }
        let mut text =
            std::str::from_utf8(&self.bytes[..content]).map_err(|e| LineError::NotUtf8 {
                path: self.path.clone(),
                line: self.number,
                offset: e.valid_up_to(),
            })?;
        if complete {
            text = text.strip_suffix('\r').unwrap_or(text);
        }
        Ok(Some(Line {
            number: self.number,
            text,
            complete,
        }))
    }
}

/// serde's description of a JSON value it refused, cut to a readable length and escaped: serde
/// quotes the offending string or key, which may be megabytes long or hold control characters.
pub fn json_message(e: &serde_json::Error) -> String {
    rsd_common::printable::shortened(&e.to_string()).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines_of(bytes: &[u8], line_limit: u64) -> Result<Vec<(usize, String, bool)>, String> {
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let path = dir.path().join("f.jsonl");
        std::fs::write(&path, bytes).map_err(|e| e.to_string())?;
        let mut lines =
            Lines::open(&path, 1 << 20, line_limit, "test file").map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(l) = lines.next_line().map_err(|e| e.to_string())? {
            out.push((l.number, l.text.to_string(), l.complete));
        }
        Ok(out)
    }

    #[test]
    fn reads_lines_and_marks_a_torn_last_one() {
        let got = lines_of(b"a\r\nbc\n\nd", 8).unwrap();
        assert_eq!(
            got,
            vec![
                (1, "a".into(), true),
                (2, "bc".into(), true),
                (3, "".into(), true),
                (4, "d".into(), false)
            ]
        );
    }

    #[test]
    fn a_long_line_and_bad_utf8_name_the_line() {
        let e = lines_of(b"ok\n0123456789\n", 8).unwrap_err();
        assert!(e.contains("f.jsonl:2: a line of more than 8 bytes"), "{e}");
        let e = lines_of(b"ok\nab\xffc\n", 8).unwrap_err();
        assert!(
            e.contains("f.jsonl:2: not UTF-8 text (byte 2 of the line)"),
            "{e}"
        );
    }

    #[test]
    fn a_sparse_file_over_the_limit_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.jsonl");
        let f = File::create(&path).unwrap();
        f.set_len(60 << 30).unwrap();
        let e = Lines::open(&path, 1 << 30, 1 << 20, "test file")
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(
                "big.jsonl: 64424509440 bytes, more than the 1073741824 bytes a test file may have"
            ),
            "{e}"
        );
    }
}
