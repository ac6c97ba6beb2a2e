//! `rsd-train`: train with RoPE-perturbed self-distillation, or probe one batch.
//!
//! ```text
//! rsd-train --config configs/tiny-cpu.toml [--shards DIR] [--init CFG | --model DIR] --out runs/x
//!           [--any-config-key VALUE …] [--resume [CKPT_DIR|auto]] [--nproc N]
//! rsd-train probe --model DIR|--init CFG --tokens T.npy [--objective rsd] [--perturb skip]
//!           [--split 5,9 --skip 100,3] [--kl reverse] [--lambda 1] [--dtype fp32|fp64]
//! rsd-train probe … --perturb nope|attn-noise|dropout [--attn-noise-sigma 1] [--attn-dropout 0.1]
//!           [--seed 0] [--dump DRAWS.safetensors]
//! ```
//! The binary only turns arguments into calls of the `rsd_train` library (docs/TRAIN.md).
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use rsd_train::config::TrainConfig;

use crate::args::{ProbeArgs, TrainArgs};

mod args;
mod launch;
mod memory_cmd;
mod probe_cmd;
mod process;
mod signals;
mod train_cmd;

/// Exit status of a rank whose collective failed, usually because another rank failed first (the
/// launcher then names that one).
const EXIT_COLLECTIVE_FAILED: i32 = 3;

/// The exit status for an error: [`EXIT_COLLECTIVE_FAILED`] or 1.
fn exit_status(e: &anyhow::Error) -> i32 {
    match e.downcast_ref::<rsd_train::Error>() {
        Some(rsd_train::Error::Dist(rsd_dist::DistError::Collective { .. })) => {
            EXIT_COLLECTIVE_FAILED
        }
        _ => 1,
    }
}

#[derive(Parser)]
#[command(
    name = "rsd-train",
    version,
    about = "RoPE-perturbed self-distillation trainer",
    after_help = "Environment: RSD_BACKTRACE=1 prints libtorch's full error text (with its C++ \
                  backtrace); by default an error is one line. On clusters, restart jobs with the \
                  same command line and --resume auto (docs/TRAIN.md)."
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train (the default when no subcommand is given).
    Train(Box<TrainArgs>),
    /// Loss terms and gradient norm of one batch, as JSON; nothing is updated.
    Probe(Box<ProbeArgs>),
    /// The memory plan per rank by category (weights, gradients, optimizer state, saved
    /// activations, transient, communication, update; the CUDA runtime apart); with --measure,
    /// the same run here (the config's GPU, else this CPU) with libtorch's allocator counted, and
    /// plan/measured per category. `--print-memory-plan` is an alias of the plan alone.
    Memory(Box<memory_cmd::MemoryArgs>),
}

/// The command line, with each config key's default in its help: the keys are optional flags
/// (a flag left out keeps the config file's value), so clap has no default of its own to show.
fn command() -> clap::Command {
    let defaults = TrainConfig::default().to_toml_table();
    let with_defaults = |mut cmd: clap::Command| {
        for key in TrainConfig::KEYS {
            let Some(value) = defaults.get(*key).filter(|v| v.as_str() != Some("")) else {
                continue;
            };
            cmd = cmd.mut_arg(*key, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [default: {value}]"))
            });
        }
        cmd
    };
    let cmd = with_defaults(Cli::command());
    cmd.mut_subcommand("train", with_defaults)
        .mut_subcommand("memory", with_defaults)
}

fn main() {
    process::set_up();
    let cli = Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Some(Cmd::Probe(p)) => probe_cmd::run(*p),
        Some(Cmd::Memory(m)) => memory_cmd::run(*m),
        Some(Cmd::Train(t)) => train_cmd::run(*t),
        None => train_cmd::run(cli.train),
    };
    if let Err(e) = r {
        // Each cause once (library errors quote their source), libtorch's C++ backtrace only on
        // request (RSD_BACKTRACE=1).
        eprintln!(
            "rsd-train: error: {}",
            rsd_common::report::one_line(e.chain().map(|c| c.to_string()))
        );
        std::process::exit(exit_status(&e));
    }
}
