//! A text file is one document ("book").

use std::path::Path;
use std::sync::Arc;

use rsd_common::safe_fs::{read_regular, FsError};

use super::{Content, RawDoc};
use crate::error::{DataError, Result};

/// Read a whole regular file of at most `max_bytes` bytes as UTF-8; a larger file, or invalid
/// bytes, is a bad record naming the file (and the byte offset).
pub(super) fn read_utf8(path: &Path, max_bytes: u64) -> Result<String> {
    let bytes = read_regular(path, max_bytes, "document").map_err(|e| match e {
        FsError::TooLarge { limit, .. } => DataError::bad_record(
            path,
            "byte 0",
            format!("the file is larger than --max-doc-bytes ({limit} bytes)"),
        ),
        other => other.into(),
    })?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        DataError::bad_record(
            path,
            format!("byte {at}"),
            "invalid UTF-8 (text files must be UTF-8)",
        )
    })
}

pub(super) fn read(path: &Path, max_bytes: u64) -> Result<RawDoc> {
    let text = read_utf8(path, max_bytes)?;
    Ok(RawDoc {
        path: Arc::from(path),
        location: String::new(),
        bytes: text.len() as u64,
        content: Content::Text(text),
    })
}
