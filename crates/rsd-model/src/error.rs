//! The one error type of the crate. Every variant carries the context a user needs to act: the file,
//! the tensor name, both shapes.
use std::path::PathBuf;

use crate::shape_str;

/// Errors from config parsing, checkpoint I/O and the forward pass.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A file is refused before it is read: a name from a data file (a weight map) that leaves
    /// its directory, a file that is not a regular file (a FIFO would block forever), one too
    /// large. The message names the file and, for a name, the field it came from.
    #[error(transparent)]
    File(#[from] rsd_common::safe_fs::FsError),
    /// A `.npy` file is malformed or does not hold what its header declares (boxed: it is
    /// rare, and every error of the model would otherwise carry its size).
    #[error(transparent)]
    Npy(Box<NpyError>),
    /// `config.json` (or an index file) is not valid JSON or misses a required field.
    #[error("{path}: invalid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error.
        source: serde_json::Error,
    },
    /// The config names an architecture this crate does not implement.
    #[error(
        "unsupported architecture ({found}): supported are LlamaForCausalLM (model_type \"llama\") \
         and Qwen3ForCausalLM (model_type \"qwen3\")"
    )]
    UnsupportedArchitecture {
        /// What `architectures` / `model_type` said.
        found: String,
    },
    /// A config field has a value this crate does not implement (it would silently compute
    /// something else than transformers does).
    #[error("unsupported config: {field} = {value} ({reason})")]
    UnsupportedConfig {
        /// The HF field name.
        field: &'static str,
        /// Its value as written.
        value: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A config is inconsistent (e.g. heads do not divide the hidden size).
    #[error("invalid config: {0}")]
    InvalidConfig(String),
    /// A safetensors file is truncated or malformed.
    #[error("{file}: not a valid safetensors file: {reason}")]
    Safetensors {
        /// The file.
        file: PathBuf,
        /// The parser's message.
        reason: String,
    },
    /// The checkpoint lacks a tensor the model needs.
    #[error("{dir}: missing tensor {name} (model expects shape {})", shape_str(.expected))]
    MissingTensor {
        /// The checkpoint directory.
        dir: PathBuf,
        /// The safetensors key.
        name: String,
        /// The shape the model expects.
        expected: Vec<i64>,
    },
    /// The checkpoint has a tensor the model does not know.
    #[error(
        "{file}: unexpected tensor {name} with shape {} (not a parameter of this model)",
        shape_str(.shape)
    )]
    UnexpectedTensor {
        /// The file holding it.
        file: PathBuf,
        /// The safetensors key.
        name: String,
        /// Its shape in the file.
        shape: Vec<i64>,
    },
    /// A tensor's shape in the checkpoint differs from the model's.
    #[error(
        "{file}: shape mismatch for {name}: checkpoint has {}, model expects {}",
        shape_str(.found),
        shape_str(.expected)
    )]
    ShapeMismatch {
        /// The file holding it.
        file: PathBuf,
        /// The safetensors key.
        name: String,
        /// Shape in the file.
        found: Vec<i64>,
        /// Shape the model expects.
        expected: Vec<i64>,
    },
    /// A tensor is stored in a dtype we do not convert from.
    #[error("{file}: tensor {name} has unsupported dtype {dtype}")]
    UnsupportedDtype {
        /// The file holding it.
        file: PathBuf,
        /// The safetensors key.
        name: String,
        /// The dtype as safetensors names it.
        dtype: String,
    },
    /// The caller's inputs are inconsistent (shapes, token range, document boundaries).
    #[error("invalid input: {0}")]
    Input(String),
    /// The output directory exists and overwriting was not asked for.
    #[error("{0}: already exists (pass --overwrite to replace it)")]
    Exists(PathBuf),
    /// A `tokenizer.json` is missing or cannot be used.
    #[error("{path}: {reason}")]
    Tokenizer {
        /// The tokenizer file (or the directory that lacks one).
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A line of a prompts file is not what generation expects.
    #[error("{path}:{line}: {reason}")]
    PromptFile {
        /// The prompts file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong (names the field).
        reason: String,
    },
    /// libtorch reported an error during `op`.
    #[error("{op}: {source}")]
    Torch {
        /// What we were doing.
        op: &'static str,
        /// libtorch's message.
        source: tch::TchError,
    },
}

/// Crate result type.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// Attaches an operation name to a libtorch error (`.ctx("attention")?`).
pub(crate) trait TchContext<T> {
    fn ctx(self, op: &'static str) -> Result<T>;
}

impl<T> TchContext<T> for std::result::Result<T, tch::TchError> {
    fn ctx(self, op: &'static str) -> Result<T> {
        self.map_err(|source| ModelError::Torch { op, source })
    }
}

/// Wraps an `std::io::Error` with its path.
pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}

impl From<NpyError> for ModelError {
    fn from(e: NpyError) -> Self {
        ModelError::Npy(Box::new(e))
    }
}

/// What is wrong with a `.npy` file. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    /// The file does not start with the `.npy` magic string.
    #[error("{}: not a .npy file (it does not start with \\x93NUMPY)", path.display())]
    NotNpy {
        /// The file.
        path: PathBuf,
    },
    /// The format version is not 1.0, 2.0 or 3.0.
    #[error("{}: .npy format version {major}.{minor}; only 1.0, 2.0 and 3.0 are read", path.display())]
    Version {
        /// The file.
        path: PathBuf,
        /// Major version byte.
        major: u8,
        /// Minor version byte.
        minor: u8,
    },
    /// The header is cut short, too large, or not the dict numpy writes.
    #[error("{}: bad .npy header: {reason}", path.display())]
    Header {
        /// The file.
        path: PathBuf,
        /// What was expected and what was found.
        reason: String,
    },
    /// The dtype is not one this reader converts.
    #[error(
        "{}: .npy dtype {descr:?} is not supported (expected one of |u1, |i1, <i2, <i4, <i8, \
         <f4, <f8: little-endian integers or floats)", path.display()
    )]
    Dtype {
        /// The file.
        path: PathBuf,
        /// The `descr` field as written.
        descr: String,
    },
    /// The array is stored in Fortran (column-major) order.
    #[error("{}: .npy array in Fortran order (fortran_order: True); expected C order", path.display())]
    FortranOrder {
        /// The file.
        path: PathBuf,
    },
    /// The data after the header is not exactly what the shape and dtype declare.
    #[error(
        "{}: the header declares shape {shape:?} of {descr} ({}), but the file holds {found} \
         bytes of data after the header", path.display(),
        match declared { Some(n) => format!("{n} bytes"), None => "more than 2^63 - 1 bytes".into() }
    )]
    Size {
        /// The file.
        path: PathBuf,
        /// The declared shape.
        shape: Vec<u64>,
        /// The declared dtype.
        descr: String,
        /// Shape product × item size, `None` when it overflows.
        declared: Option<u64>,
        /// Bytes after the header.
        found: u64,
    },
}
