//! rsd-eval: does a checkpoint's accuracy depend on where the evidence sits in a long prompt?
//!
//! * [`results`]: the records every command reads and writes (`results.jsonl`, one line per prompt).
//! * [`tasks`]: RULER's synthetic tasks, generated from (seed, task, length, depth, sample) and
//!   the model's tokenizer, to exact token budgets.
//! * [`score`]: RULER's metrics.
//! * [`run`]: `rsd-eval run`: generate, score, write results and summaries; resumable.
//!
//! The `rsd-eval` binary (src/main.rs) only parses arguments and calls this library (docs/EVAL.md).

pub mod results;
pub mod run;
pub mod score;
pub mod tasks;
