//! A text file is one document ("book").

use std::path::Path;
use std::sync::Arc;

use super::{Content, RawDoc};
use crate::error::{DataError, Result};

/// Read a whole file as UTF-8; invalid bytes are a bad record naming the byte offset.
pub(super) fn read_utf8(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(|e| DataError::io(path, e))?;
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        DataError::bad_record(
            path,
            format!("byte {at}"),
            "invalid UTF-8 (text files must be UTF-8)",
        )
    })
}

pub(super) fn read(path: &Path) -> Result<RawDoc> {
    let text = read_utf8(path)?;
    Ok(RawDoc {
        path: Arc::from(path),
        location: String::new(),
        bytes: text.len() as u64,
        content: Content::Text(text),
    })
}
