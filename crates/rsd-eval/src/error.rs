//! The error of every `rsd-eval` command (run, score, mc, longbench, ppl, plot, compare). Task
//! generation, results files and figures have errors of their own, which it carries.
use std::path::{Path, PathBuf};

use rsd_chat::ChatError;

use crate::results::ResultsError;
use crate::tasks::TaskError;

/// What an `rsd-eval` command can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
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
    /// Loading or running the model failed while doing what `context` says.
    #[error("{context}: {source}")]
    ModelContext {
        /// What was being done.
        context: String,
        /// The model crate's error.
        source: rsd_model::ModelError,
    },
    /// A libtorch operation failed.
    #[error("{context}: {source}")]
    Torch {
        /// What was being computed.
        context: &'static str,
        /// libtorch's error.
        source: tch::TchError,
    },
    /// Opening or reading shards.
    #[error(transparent)]
    Shard(#[from] rsd_shard::ShardError),
    /// Drawing or writing a figure.
    #[error(transparent)]
    Figure(#[from] crate::figure::FigureError),
    /// results.jsonl is damaged.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// The chat template is missing or unusable.
    #[error(transparent)]
    Chat(#[from] ChatError),
}

/// Result alias of the `rsd-eval` commands.
pub type Result<T, E = EvalError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
    move |source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    }
}
