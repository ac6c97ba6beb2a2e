use std::path::PathBuf;

/// Everything that can go wrong reading or writing shards. Each variant names the file, and where
/// it applies the byte offset, so a user can find the damage.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// An operating-system error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The bytes of a file are not what the format says they must be.
    #[error("{path}: at byte {offset}: {what}")]
    Corrupt {
        /// The damaged file.
        path: PathBuf,
        /// Byte offset of the first bad byte (or of the structure that is wrong).
        offset: u64,
        /// What was found and what was expected.
        what: String,
    },
    /// The manifest is missing, unreadable, or disagrees with the files.
    #[error("{path}: {what}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong and what was expected.
        what: String,
    },
    /// A file named by the manifest is not a plain name inside the directory, or not a regular
    /// file; or an atomic write met something other than its own stale temporary file.
    #[error(transparent)]
    File(#[from] rsd_common::safe_fs::FsError),
    /// A caller asked for something the format cannot hold.
    #[error("{0}")]
    Invalid(String),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, ShardError>;

impl ShardError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ShardError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn corrupt(path: impl Into<PathBuf>, offset: u64, what: impl Into<String>) -> Self {
        ShardError::Corrupt {
            path: path.into(),
            offset,
            what: what.into(),
        }
    }
}
