//! `rsd-model`: check checkpoints and conversions.
//!
//! ```text
//! rsd-model inspect DIR
//! rsd-model logits --model DIR --tokens T.npy [--positions P.npy] [--doc-boundaries 0,5,12] --out L.npy
//! rsd-model convert --model DIR --out DIR2 [--dtype bf16] [--rope-theta 8e6] [--max-positions N]
//! rsd-model init --config config.json --seed 0 --out DIR
//! rsd-model bench --config config.json [--seq-len 2048] [--threads 2] [--iters 5]
//! rsd-model generate --model DIR (--prompt TEXT… | --prompts P.jsonl | --tokens T.npy…) [--max-new-tokens N]
//!     [--temperature T --top-p P --seed S] [--stop STR…] [--prefill-chunk N] [--batch-size B]
//! ```
//! The binary only parses arguments and calls the `rsd_model` library (docs/MODEL.md); each
//! subcommand's flags and output are in its `*_cmd.rs`.
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use bench_cmd::BenchArgs;
use checkpoint_cmd::{ConvertArgs, InitArgs};
use generate_cmd::{GenerateArgs, GENERATE_HELP};
use logits_cmd::LogitsArgs;

mod bench_cmd;
mod checkpoint_cmd;
mod generate_cmd;
mod inspect_cmd;
mod logits_cmd;

#[derive(Parser)]
#[command(
    name = "rsd-model",
    version,
    about = "Inspect Llama/Qwen3 checkpoints, compute logits and generate text",
    after_help = "Environment: RSD_BACKTRACE=1 prints libtorch's full error text (with its C++ \
                  backtrace); by default an error is one line."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Architecture, sizes, parameter count, RoPE settings and dtypes of an HF checkpoint dir.
    Inspect {
        /// Checkpoint directory (config.json + safetensors).
        dir: PathBuf,
    },
    /// Run a forward pass and write fp32 logits [B, T, V] as .npy.
    Logits(LogitsArgs),
    /// Load a checkpoint and save it again: change dtype, RoPE base (ABF), recorded context length
    /// or shard size; tokenizer files are carried over.
    Convert(ConvertArgs),
    /// Time forward+backward (full-logit CE) of a random model, and the attention primitive vs
    /// plain causal SDPA; prints one JSON line. Used by benches/model_bench.py.
    Bench(BenchArgs),
    /// Create a seeded random model from an HF config.json and save it as a checkpoint dir.
    Init(InitArgs),
    /// Generate continuations of prompts with a K/V cache (greedy by default); prints one JSON
    /// line per prompt: {"index", "text", "ids", "stop_reason": "eos"|"stop"|"length", "stop"}.
    #[command(after_help = GENERATE_HELP)]
    Generate(GenerateArgs),
}

fn main() {
    let r = match Cli::parse().cmd {
        Cmd::Inspect { dir } => inspect_cmd::inspect(&dir),
        Cmd::Logits(a) => logits_cmd::logits(a),
        Cmd::Convert(a) => checkpoint_cmd::convert(a),
        Cmd::Bench(a) => bench_cmd::bench(a),
        Cmd::Init(a) => checkpoint_cmd::init(a),
        Cmd::Generate(a) => generate_cmd::generate(a),
    };
    if let Err(e) = r {
        let line = rsd_common::report::one_line(e.chain().map(|c| c.to_string()));
        eprintln!("rsd-model: error: {line}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    /// The binary must list libtorch_cuda as NEEDED when the wheel ships it, or CUDA is silently
    /// unavailable (the linker's --as-needed drops it). Cheap: readelf on our own test binary,
    /// which is linked with the same flags as the CLI.
    #[test]
    fn links_libtorch_cuda_when_available() {
        let lib = std::path::Path::new(env!("RSD_LIBTORCH_LIB"));
        let exe = std::env::current_exe().expect("test binary path");
        let out = std::process::Command::new("readelf")
            .arg("-d")
            .arg(&exe)
            .output();
        let Ok(out) = out else {
            eprintln!("readelf not available; skipping");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&lib.display().to_string()),
            "no rpath to {}:\n{text}",
            lib.display()
        );
        if lib.join("libtorch_cuda.so").exists() {
            assert!(
                text.contains("[libtorch_cuda.so]"),
                "libtorch_cuda.so is not NEEDED:\n{text}"
            );
        }
    }
}
