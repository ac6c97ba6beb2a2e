//! `rsd-eval`: positional-robustness evaluation of a checkpoint directory (docs/EVAL.md).
//!
//! The binary only parses arguments and calls the `rsd_eval` library.
use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rsd-eval",
    version,
    about = "Measure how a model's accuracy depends on where the evidence sits in a long prompt"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {}
}
