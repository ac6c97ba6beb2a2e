//! Typed errors: every message names the file and the line, row or offset it is about.

use std::path::{Path, PathBuf};

use rsd_common::safe_fs::FsError;

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
    /// One conversation cannot be trained on (`pack --chat`): an unknown role, no assistant turn,
    /// a template failure, longer than a row; `--skip-bad` skips and counts these by cause.
    #[error("{path}:{location}: {what}")]
    Conversation {
        /// The file.
        path: PathBuf,
        /// `line N`, `row N`.
        location: String,
        /// Which kind, for the skip report.
        cause: Cause,
        /// What was found and what was expected.
        what: String,
    },
    /// A file cannot be read as the format it claims to be (truncated, corrupt, wrong schema);
    /// `--skip-bad` skips the rest of the file and counts it.
    #[error("{path}: {what}")]
    BadFile {
        /// The file.
        path: PathBuf,
        /// Which kind of damage, for the skip report.
        cause: Cause,
        /// What is wrong and what was expected.
        what: String,
    },
    /// An operating-system error on a file; on an input file `--skip-bad` skips and counts it.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file named by a data file leaves its directory, or a file read as data is not a regular
    /// file or is too large; on an input `--skip-bad` skips and counts it.
    #[error(transparent)]
    File(#[from] rsd_common::safe_fs::FsError),
    /// Writing one of the pack's own output files failed: never a bad input.
    #[error(transparent)]
    OutputFile(rsd_common::safe_fs::FsError),
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
    pub(crate) fn bad_file(
        path: impl Into<PathBuf>,
        cause: Cause,
        what: impl Into<String>,
    ) -> Self {
        DataError::BadFile {
            path: path.into(),
            cause,
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
    /// What is wrong with which input, if this error is about one input (a record, a file): the
    /// errors `--skip-bad` skips and counts. The one place that sorts failures into causes.
    pub fn bad_input(&self) -> Option<(&Path, Cause)> {
        match self {
            DataError::BadRecord { path, .. } => Some((path, Cause::BadRecord)),
            DataError::Conversation { path, cause, .. } => Some((path, *cause)),
            DataError::BadFile { path, cause, .. } => Some((path, *cause)),
            DataError::Io { path, .. } => Some((path, Cause::Unreadable)),
            DataError::File(e) => {
                let cause = match e {
                    // A name that leaves its directory is a damaged (or hostile) index.
                    FsError::UnsafeName(_) | FsError::TooLarge { .. } => Cause::Corrupt,
                    FsError::NotRegularFile { .. } | FsError::Io { .. } => Cause::Unreadable,
                    // A link out of an input directory stops the pack: it is a directory
                    // someone prepared, not one damaged file.
                    FsError::LinkOutside { .. } => return None,
                    // About the output, never an input.
                    FsError::TemporaryInTheWay { .. }
                    | FsError::NotAppendable { .. }
                    | FsError::NotOwnDirectory { .. } => return None,
                };
                Some((e.path(), cause))
            }
            _ => None,
        }
    }
    /// Whether `--skip-bad` may skip this error and go on (it is about one input).
    pub fn is_skippable(&self) -> bool {
        self.bad_input().is_some()
    }
}

/// A JSON parse error as "at line L column C: what", the position once (serde_json's message ends
/// with it too). serde_json quotes the offending value (`invalid type: string "…"`), which a
/// hostile file makes hundreds of KB long: the message is cut with
/// [`rsd_common::printable::shortened`].
pub(crate) fn json_error(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    let what = text.strip_suffix(&position).unwrap_or(&text);
    format!(
        "at line {} column {}: {}",
        e.line(),
        e.column(),
        rsd_common::printable::shortened(what)
    )
}

/// Why an input, or a part of it, could not be packed: the groups `--skip-bad` counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// The operating system would not read it: missing, a dangling link, a loop of links, no
    /// permission, an I/O error; or it is not a regular file (a FIFO, a device).
    Unreadable,
    /// The file ends early: a zstd frame, a Parquet footer, an Arrow message or an MDS sample cut off.
    Truncated,
    /// Damaged bytes inside a file of the right format (a bad zstd block or checksum, bytes after
    /// the last zstd frame, a bad Parquet page, MDS offsets out of range), or an index that names
    /// a file outside its directory, declares impossible sizes, or a zstd shard that decodes to
    /// more than its index declares.
    Corrupt,
    /// Not the format its name says (a `.zst` that is not zstd, a `.parquet` that is not Parquet).
    WrongFormat,
    /// The right format with the wrong contents for a pack: no text column, a column of another
    /// type, an MDS column encoded in a way rsd does not read.
    Schema,
    /// One record: malformed JSON, invalid UTF-8, a missing or null text field, a bad MDS sample,
    /// a `messages` list that is not a list of `{role, content}` strings.
    BadRecord,
    /// A conversation with a role other than system, user or assistant (`pack --chat`).
    UnknownRole,
    /// A conversation without an assistant turn: nothing to train on (`pack --chat`).
    NoAssistant,
    /// The chat template failed on a conversation, or renders a turn where it cannot be found.
    Template,
    /// A conversation longer than the packing length (`pack --chat` never cuts one).
    TooLong,
}

impl Cause {
    /// Every cause.
    pub const ALL: [Cause; 10] = [
        Cause::Unreadable,
        Cause::Truncated,
        Cause::Corrupt,
        Cause::WrongFormat,
        Cause::Schema,
        Cause::BadRecord,
        Cause::UnknownRole,
        Cause::NoAssistant,
        Cause::Template,
        Cause::TooLong,
    ];
    /// The name in messages and in the manifest's skip record.
    pub fn name(self) -> &'static str {
        match self {
            Cause::Unreadable => "unreadable",
            Cause::Truncated => "truncated",
            Cause::Corrupt => "corrupt",
            Cause::WrongFormat => "wrong-format",
            Cause::Schema => "schema",
            Cause::BadRecord => "bad-record",
            Cause::UnknownRole => "unknown-role",
            Cause::NoAssistant => "no-assistant",
            Cause::Template => "template",
            Cause::TooLong => "too-long",
        }
    }
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, DataError>;
