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
enum Cmd {
    /// Draw a run's figures (RUN/results.jsonl, RUN/ppl.json) into RUN/plots/: PNG, SVG and the
    /// plotted values as JSON.
    Plot(rsd_eval::plot::PlotArgs),
    /// Compare runs on the (task, length) pairs they share: one figure and one Markdown table.
    Compare(rsd_eval::compare::CompareArgs),
    /// Perplexity by position on held-out shards, and the view gap KL(standard || skip view).
    Ppl(rsd_eval::ppl::PplArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let report = match cli.cmd {
        Cmd::Plot(a) => rsd_eval::plot::command(&a)?,
        Cmd::Compare(a) => rsd_eval::compare::command(&a)?,
        Cmd::Ppl(a) => rsd_eval::ppl::command(&a)?,
    };
    println!("{report}");
    Ok(())
}
