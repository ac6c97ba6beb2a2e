//! Llama-3 and Qwen3 causal LMs in libtorch (tch), shaped for long-context training.
//!
//! - [`ModelConfig`] reads a Hugging Face `config.json` as is and refuses what we do not implement.
//! - [`Model::forward`] takes token ids **and explicit position ids** per token, optional document
//!   boundaries and an optional per-layer K/V prefix from an earlier pass; it returns the final
//!   hidden states (the loss computes logits in chunks) and, on request, every layer's K/V.
//! - All attention goes through one primitive, [`attention::attend`]: queries over key blocks that
//!   are either unmasked (a prefix) or causal (their own block), merged by log-sum-exp in fp32.
//! - [`Model::load`] / [`Model::save`] read and write plain HF directories (sharded safetensors),
//!   so checkpoints go straight to transformers, vLLM and the usual evaluation harnesses.
//! - [`generate::generate`] decodes with a K/V cache on top of `forward` (chunked prefill,
//!   left-padded batches, greedy or sampled, EOS and stop strings).
//!
//! See `docs/MODEL.md` for the design and the API the trainer builds on.

pub mod alloc;
pub mod attention;
pub mod checkpoint;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod error;
pub mod generate;
pub mod model;
pub mod npy;
pub mod phases;
pub mod rope;

pub use attention::{attend, Attended, DocBoundaries, KvBlock, Mask, ScoreChanges};
pub use checkpoint::SaveOptions;
pub use config::{Family, ModelConfig, RopeScaling};
pub use error::{ModelError, Result};
pub use model::{
    ContextChunks, ForwardArgs, ForwardOutput, Init, KvGather, LayerKv, Model, ModelOptions, Rotary,
};

/// The precision reductions (softmax merges, losses) run in for tensors of `kind`: fp64 for fp64
/// (so fp64 checks stay tight), fp32 for everything else (fp32, bf16, fp16).
pub fn accum_kind(kind: tch::Kind) -> tch::Kind {
    if kind == tch::Kind::Double {
        tch::Kind::Double
    } else {
        tch::Kind::Float
    }
}

/// Parses a device name: `cpu`, `cuda` (= `cuda:0`) or `cuda:N`.
pub fn parse_device(s: &str) -> Result<tch::Device> {
    match s {
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" => Ok(tch::Device::Cuda(0)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(tch::Device::Cuda)
            .ok_or_else(|| {
                ModelError::Input(format!("unknown device \"{s}\" (cpu, cuda, cuda:N)"))
            }),
    }
}

/// Checks that `device` exists (a CUDA device on a machine without one otherwise fails deep inside
/// libtorch with a long C++ trace).
pub fn check_device(device: tch::Device) -> Result<()> {
    if let tch::Device::Cuda(n) = device {
        let count = tch::Cuda::device_count();
        if n as i64 >= count {
            return Err(ModelError::Input(format!(
                "device cuda:{n} requested, but libtorch sees {count} CUDA device(s)"
            )));
        }
    }
    Ok(())
}

/// Parses a dtype name: `fp32`/`float32`, `bf16`/`bfloat16`, `fp16`/`float16`.
pub fn parse_kind(s: &str) -> Result<tch::Kind> {
    match s {
        "fp32" | "float32" | "f32" => Ok(tch::Kind::Float),
        "bf16" | "bfloat16" => Ok(tch::Kind::BFloat16),
        "fp16" | "float16" | "f16" => Ok(tch::Kind::Half),
        // For exactness tests (fp64 runs compare to 1e-10).
        "fp64" | "float64" | "f64" => Ok(tch::Kind::Double),
        _ => Err(ModelError::Input(format!(
            "unknown dtype \"{s}\" (fp32, bf16, fp16, fp64)"
        ))),
    }
}

/// The name a user knows a tensor dtype by (`fp32`, `bf16`, `int64`, …), for messages.
pub fn kind_name(kind: tch::Kind) -> &'static str {
    use tch::Kind::*;
    match kind {
        Uint8 => "uint8",
        Int8 => "int8",
        Int16 => "int16",
        Int => "int32",
        Int64 => "int64",
        Half => "fp16",
        Float => "fp32",
        Double => "fp64",
        BFloat16 => "bf16",
        Bool => "bool",
        ComplexHalf | ComplexFloat | ComplexDouble => "complex",
        _ => "an unsupported dtype",
    }
}

/// A shape or an id list as `[2, 16, 64]`, for messages.
pub fn shape_str(dims: &[i64]) -> String {
    let items: Vec<String> = dims.iter().map(i64::to_string).collect();
    format!("[{}]", items.join(", "))
}
