//! rsd-eval: does a checkpoint's accuracy depend on where the evidence sits in a long prompt?
//!
//! * [`results`]: the records every command reads and writes (`results.jsonl`, one line per prompt).
//! * [`tasks`]: RULER's synthetic tasks, generated from (seed, task, length, depth, sample) and
//!   the model's tokenizer, to exact token budgets.
//! * [`score`]: RULER's metrics.
//! * [`run`]: `rsd-eval run`: generate, score, write results and summaries; resumable.
//! * [`items`]: `rsd-eval score`: teacher-forced scoring of a JSONL of (context, candidates,
//!   answer), or completions made elsewhere (`--pred`), into the same records as `run`.
//! * [`qa`]: the QA tasks' datasets (SQuAD, HotpotQA) in their published formats.
//! * [`longbench`]: `rsd-eval longbench`: LongBench v2 from its data.json, with its prompts,
//!   truncation, answer extraction and summary.
//! * [`mc`]: `rsd-eval mc`: MMLU, HellaSwag, WinoGrande, OpenBookQA by log-likelihood, as
//!   lm-evaluation-harness scores them, from their published files.
//! * [`ruler`]: RULER's 13 tasks, its aggregation and its prediction files.
//! * [`plot`]: a run's figures (accuracy by depth and length, the depth × length heat map).
//! * [`compare`]: several runs in one figure and one table.
//! * [`ppl`]: perplexity by position on held-out shards, and the view gap under RSD's skip view.
//! * [`figure`]: figures as data, drawn to PNG and SVG with the values written beside them.
//! * [`lines`]: the JSON-lines files rsd-eval reads, a bounded line at a time.
//!
//! Every file rsd-eval reads may come from anyone: reads are of regular files within stated
//! bounds, values are checked for range, and every write is atomic or an append that follows no
//! link (docs/UNTRUSTED.md, "rsd-eval").
//!
//! The `rsd-eval` binary (src/main.rs) only parses arguments and calls this library (docs/EVAL.md).

pub mod compare;
pub mod error;
pub mod figure;
pub mod items;
pub mod lines;
pub mod longbench;
pub mod mc;
pub mod paired;
pub mod plot;
pub mod ppl;
pub mod qa;
pub mod results;
pub mod ruler;
pub mod run;
pub mod score;
pub mod tasks;

/// Shards whose tokenizer is not the model's (`problems`, from
/// `rsd_shard::tokenizer_match::mismatches`): none is fine; with `allow`
/// (`--allow-tokenizer-mismatch`) each is a warning on stderr; else they are the error, with how
/// to go on (`anyway`: what the flag lets the command do).
pub(crate) fn refuse_other_tokenizer(
    problems: Vec<String>,
    allow: bool,
    anyway: &str,
) -> Result<(), String> {
    if problems.is_empty() {
        return Ok(());
    }
    if allow {
        for p in &problems {
            eprintln!("rsd-eval: warning: {p} (allowed by --allow-tokenizer-mismatch)");
        }
        return Ok(());
    }
    Err(format!(
        "{}\n(pass --allow-tokenizer-mismatch to {anyway})",
        problems.join("\n")
    ))
}
