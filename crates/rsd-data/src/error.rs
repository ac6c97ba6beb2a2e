//! Typed errors: every message names the file and the line, row or offset it is about.

use std::path::PathBuf;

/// Everything that can go wrong turning a corpus into shards. Messages name the file, and the line,
/// row or byte offset where it applies, and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// One record (a JSON line, a file, a row) is bad; `--skip-bad` skips and counts these.
    #[error("{path}:{location}: {what}")]
    BadRecord {
        /// The file.
        path: PathBuf,
        /// `line N`, `row N`, `byte N`, `sample N`…
        location: String,
        /// What was found and what was expected.
        what: String,
    },
    /// A file cannot be read as the format it claims to be (truncated, corrupt, wrong schema).
    #[error("{path}: {what}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// What is wrong and what was expected.
        what: String,
    },
    /// An operating-system error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The tokenizer cannot be loaded or used.
    #[error("tokenizer {name}: {what}")]
    Tokenizer {
        /// File name or bundled name.
        name: String,
        /// What went wrong.
        what: String,
    },
    /// A `--src` that cannot be resolved, or options that contradict each other.
    #[error("{0}")]
    Config(String),
    /// Writing or reading shards failed.
    #[error(transparent)]
    Shard(#[from] rsd_shard::ShardError),
    /// The loader failed (`stream`, `bench`).
    #[error(transparent)]
    Loader(#[from] rsd_loader::LoaderError),
    /// The loader state could not be saved.
    #[error("saving the loader state to {}", path.display())]
    SaveState {
        /// The state file.
        path: PathBuf,
        /// Why.
        #[source]
        source: rsd_loader::LoaderError,
    },
    /// Writing the command's output failed (a closed pipe, a full disk).
    #[error(transparent)]
    Output(std::io::Error),
    /// The run was interrupted (Ctrl-C); completed shards are kept for a resume.
    #[error("interrupted; completed shards are kept and the next run resumes from them")]
    Interrupted,
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn bad_file(path: impl Into<PathBuf>, what: impl Into<String>) -> Self {
        DataError::BadFile {
            path: path.into(),
            what: what.into(),
        }
    }
    pub(crate) fn bad_record(
        path: impl Into<PathBuf>,
        location: impl Into<String>,
        what: impl Into<String>,
    ) -> Self {
        DataError::BadRecord {
            path: path.into(),
            location: location.into(),
            what: what.into(),
        }
    }
    /// Whether `--skip-bad` may skip this error and go on.
    pub fn is_skippable(&self) -> bool {
        matches!(self, DataError::BadRecord { .. })
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, DataError>;
