//! `rsd-eval`: positional-robustness evaluation of a checkpoint directory (docs/EVAL.md).
//!
//! The binary only parses arguments and calls the `rsd_eval` library.
use anyhow::Result;
use clap::{Parser, Subcommand};

mod cmd_run;

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
    /// Generate RULER-style tasks, let the model complete them, score and summarise (resumable).
    Run(cmd_run::RunArgs),
    /// Score what you bring: your own items by teacher forcing (--items, a JSONL of {"context",
    /// "candidates", "answer"}), or completions made elsewhere with RULER's metrics (--pred).
    Score(rsd_eval::items::ScoreArgs),
    /// Draw a run's figures (RUN/results.jsonl, RUN/ppl.json) into RUN/plots/: PNG, SVG and the
    /// plotted values as JSON.
    Plot(rsd_eval::plot::PlotArgs),
    /// Compare runs on the (task, length) pairs they share: one figure and one Markdown table.
    Compare(rsd_eval::compare::CompareArgs),
    /// Perplexity by position on held-out shards, and the view gap KL(standard || skip view).
    Ppl(rsd_eval::ppl::PplArgs),
    /// Short-context multiple choice by log-likelihood (MMLU, HellaSwag, WinoGrande,
    /// OpenBookQA), as lm-evaluation-harness scores them, from their published files.
    Mc(rsd_eval::mc::McArgs),
    /// LongBench v2 from its published data.json: official prompts (zero-shot or chain of
    /// thought), middle truncation, answer extraction and summary by difficulty and length.
    Longbench(rsd_eval::longbench::LongBenchArgs),
}

fn main() {
    let cli = Cli::parse();
    // Shard directories keep a file open per shard; a shell's soft limit is often 1,024.
    let _ = rsd_common::process_limits::raise_open_files_limit();
    let r: Result<()> = match cli.cmd {
        Cmd::Run(a) => cmd_run::run(a),
        Cmd::Score(a) => score(&a),
        Cmd::Plot(a) => report(rsd_eval::plot::command(&a)),
        Cmd::Compare(a) => report(rsd_eval::compare::command(&a)),
        Cmd::Ppl(a) => report(rsd_eval::ppl::command(&a)),
        Cmd::Mc(a) => mc(&a),
        Cmd::Longbench(a) => report(rsd_eval::longbench::command(&a)),
    };
    if let Err(e) = r {
        let line = rsd_common::report::one_line(e.chain().map(|c| c.to_string()));
        eprintln!("rsd-eval: error: {line}");
        std::process::exit(1);
    }
}

fn score(a: &rsd_eval::items::ScoreArgs) -> Result<()> {
    let r = rsd_eval::items::score(a)?;
    let overall = r
        .overall
        .map(|o| format!("{:.1}", 100.0 * o))
        .unwrap_or_else(|| "n/a".into());
    let summary = a.out.join("summary.md");
    if a.pred.is_some() {
        println!(
            "{} completions scored with RULER's metrics; overall {overall} (RULER's per-task \
             scores and averages: {})",
            r.total,
            summary.display()
        );
    } else {
        println!(
            "{} items: {} scored by teacher forcing, {} already done; answer ranked first in \
             {overall}% (see {})",
            r.total,
            r.done,
            r.skipped,
            summary.display()
        );
    }
    Ok(())
}

fn mc(a: &rsd_eval::mc::McArgs) -> Result<()> {
    let r = rsd_eval::mc::command(a)?;
    let acc = r
        .overall
        .map(|o| format!("{:.1}", 100.0 * o))
        .unwrap_or_else(|| "n/a".into());
    println!(
        "{} {} questions: {} scored, {} already done; acc {acc}% (acc_norm and the count in {})",
        r.total,
        a.task.name(),
        r.done,
        r.skipped,
        a.out.join("summary.md").display()
    );
    Ok(())
}

/// Prints what a command reports (where it wrote what).
fn report<E: Into<anyhow::Error>>(r: std::result::Result<String, E>) -> Result<()> {
    println!("{}", r.map_err(Into::into)?);
    Ok(())
}
