use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::{Result, ShardError};

/// Write `bytes` to `path` atomically: a temporary file beside it, fsync, rename, fsync the
/// directory. Readers see the old file or the new one, never a torn one.
pub fn write_file_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(match path.extension() {
        Some(ext) => format!("{}.tmp", ext.to_string_lossy()),
        None => "tmp".to_string(),
    });
    let mut file = File::create(&tmp).map_err(|e| ShardError::io(&tmp, e))?;
    file.write_all(bytes).map_err(|e| ShardError::io(&tmp, e))?;
    file.sync_all().map_err(|e| ShardError::io(&tmp, e))?;
    drop(file);
    std::fs::rename(&tmp, path).map_err(|e| ShardError::io(path, e))?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// fsync a directory so that renames inside it survive a crash.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let handle = File::open(dir).map_err(|e| ShardError::io(dir, e))?;
    handle.sync_all().map_err(|e| ShardError::io(dir, e))
}
