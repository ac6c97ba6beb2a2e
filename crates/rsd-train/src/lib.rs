//! `rsd-train`: RoPE-perturbed self-distillation (RSD) for long-context adaptation of RoPE LMs.
//!
//! The pieces, in the order a step uses them:
//!
//! * [`perturb`]: the second view's position ids (skip, cyclic, dilation, chunk-permute; per
//!   sequence or per document), the logit rows that can differ, and the shared prefix.
//! * [`step`]: the two-view step: the forward with prefix reuse, the chunked CE/KL with closed-form
//!   gradients, per-layer activation checkpointing, and a slow full-logits reference for tests.
//! * [`optim`]: AdamW (decoupled weight decay, fp32 master weights for bf16 models), warmup + cosine
//!   schedule, global-norm clipping; state saved as safetensors.
//! * [`config`]: the training config (TOML), every key a command-line flag too.
//! * [`data`]: loader batches → micro-batches; [`checkpoint`]: atomic, resumable run checkpoints;
//!   [`train`]: the loop that owns them all; [`parallel`]: data parallelism across processes,
//!   applied around the step; [`update`]: the optimizer update across ranks, with the state
//!   replicated or sharded ([`sharded`]).
//! * [`probe`]: one batch through the step, nothing updated (`rsd-train probe`).
//! * [`tokenizer`]: the shards' tokenizer checked against the model's; the tokenizer files every
//!   saved model directory carries.
//!
//! The design and the numbers are in `docs/TRAIN.md`.

pub mod checkpoint;
pub mod comm;
pub mod config;
pub mod cp;
pub mod data;
pub mod driver;
pub mod job_end;
pub mod memory_measure;
pub mod memory_plan;
pub mod memory_run;
pub mod optim;
pub mod parallel;
pub mod perturb;
pub mod probe;
pub mod profile;
pub mod resume;
pub mod run_dir;
pub mod sharded;
pub mod step;
pub mod tokenizer;
pub mod train;
pub mod update;

/// Errors of the trainer library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From the model crate (shapes, checkpoints, configs).
    #[error(transparent)]
    Model(#[from] rsd_model::ModelError),
    /// From libtorch.
    #[error("libtorch: {0}")]
    Torch(#[from] tch::TchError),
    /// From the loader.
    #[error(transparent)]
    Loader(#[from] rsd_loader::LoaderError),
    /// A file operation, with the path.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: std::path::PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing a file atomically, or reading one a run directory holds.
    #[error(transparent)]
    File(#[from] rsd_common::safe_fs::FsError),
    /// From the process group (data-parallel runs).
    #[error(transparent)]
    Dist(#[from] rsd_dist::DistError),
    /// Bad input or config; the message says which.
    #[error("{0}")]
    Input(String),
    /// No NVIDIA driver, or one too old for the torch build's CUDA runtime ([`driver::check`]);
    /// the message names both versions and the fix.
    #[error("{0}")]
    Driver(String),
    /// A checkpoint that cannot be used; the message names the file and field.
    #[error("checkpoint {path}: {reason}")]
    Checkpoint {
        /// The checkpoint directory or file.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Loss or gradient norm is NaN/inf.
    #[error("non-finite {what} at step {step}: {value}")]
    NonFinite {
        /// "loss" or "gradient norm".
        what: &'static str,
        /// Optimizer step.
        step: u64,
        /// The value.
        value: f64,
    },
}

/// Result with [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// Attaches a path to an I/O error.
pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
