//! The error of `rsd-eval run` and of the modules it calls (tasks, RULER's files, results).
use std::path::{Path, PathBuf};

use rsd_chat::ChatError;

use crate::results::ResultsError;
use crate::tasks::TaskError;

/// What a run can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A setting is unusable (the message says which and why).
    #[error("{0}")]
    Input(String),
    /// The run directory holds a run with other settings.
    #[error("{dir} holds a run with different settings: {setting} was {was}, now {now}; use another --out directory (or the old settings to resume)")]
    Changed {
        /// The run directory.
        dir: PathBuf,
        /// The setting that differs.
        setting: String,
        /// Its value in run.json.
        was: String,
        /// Its value now.
        now: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A JSON file is not what it should be.
    #[error("{path}: {reason}")]
    Json {
        /// The file.
        path: PathBuf,
        /// serde's message.
        reason: String,
    },
    /// Generating a task failed.
    #[error(transparent)]
    Task(#[from] TaskError),
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] rsd_model::ModelError),
    /// results.jsonl is damaged.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// The chat template is missing or unusable.
    #[error(transparent)]
    Chat(#[from] ChatError),
}

/// Result alias of `rsd-eval run` and the modules it calls.
pub type Result<T, E = RunError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RunError + '_ {
    move |source| RunError::Io {
        path: path.to_path_buf(),
        source,
    }
}
