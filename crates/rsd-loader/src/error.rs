use std::path::PathBuf;

/// Everything the loader can report. Shard damage keeps `rsd-shard`'s file-and-offset context.
#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    /// A shard file is missing, truncated, corrupt, or fails its checksum.
    #[error(transparent)]
    Shard(#[from] rsd_shard::ShardError),
    /// Two sources whose manifests disagree on something that must match to mix them.
    #[error("cannot mix {a} and {b}: {what}")]
    Mismatch {
        /// The first directory.
        a: PathBuf,
        /// The directory that disagrees with it.
        b: PathBuf,
        /// What differs, with both values.
        what: String,
    },
    /// The configuration cannot work (zero sizes, rank out of range, bad weights…).
    #[error("invalid loader config: {0}")]
    Config(String),
    /// A saved state does not belong to this configuration, or holds counters no stream can
    /// reach.
    #[error("cannot resume: {0}")]
    Resume(String),
    /// As [`LoaderError::Resume`], for a state read from a file: the message names the file.
    #[error("{}: cannot resume: {what}", path.display())]
    ResumeFrom {
        /// The state file.
        path: PathBuf,
        /// What is wrong, naming the field (`field drawn[1]: …`).
        what: String,
    },
    /// A pipeline or state file that is not a regular file, or too large to be one.
    #[error(transparent)]
    Fs(#[from] rsd_common::safe_fs::FsError),
    /// A pipeline file or state file could not be read or parsed.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        what: String,
    },
    /// A token id the model has no embedding for: a damaged shard, or shards packed with another
    /// tokenizer.
    #[error(
        "{path}: sample {sample}, token {token}: id {id} is outside the vocabulary (0..{vocab}); \
         the shard is damaged or was packed with another tokenizer"
    )]
    IdOutOfVocab {
        /// The shard's `.bin` file.
        path: PathBuf,
        /// Sample index within that shard.
        sample: u64,
        /// Token index within the sample.
        token: u64,
        /// The id found.
        id: i64,
        /// The vocabulary size it was checked against.
        vocab: u64,
    },
    /// A worker thread ended without delivering its batch (it panicked).
    #[error("loader worker {0} stopped without a result (it panicked); see stderr")]
    WorkerDied(usize),
}

/// Result alias for this crate.
pub type Result<T> = std::result::Result<T, LoaderError>;
