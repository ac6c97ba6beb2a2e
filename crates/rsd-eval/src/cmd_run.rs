//! Arguments of `rsd-eval run` (the work is in `rsd_eval::run`).
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use rsd_eval::run::{run as run_eval, RunOptions, Scoring};
use rsd_eval::tasks::{DepthGrid, Task};
use rsd_model::cli::{DeviceArgs, RopeScalingArgs};

const RUN_HELP: &str = "Items are generated from (seed, task, length, depth, sample) and the \
model's tokenizer: a prompt plus its answer budget (--max-new-tokens, default per task as in \
RULER) fits --lengths exactly up to one haystack unit, never more. Needle tasks are swept over \
--depths evenly spaced depths from 0 to 1. Results are appended to RUN/results.jsonl as they \
finish; a rerun with the same settings skips finished items, a rerun with other settings into \
the same RUN/ is refused. See docs/EVAL.md.";

#[derive(Args)]
#[command(after_help = RUN_HELP)]
pub struct RunArgs {
    /// Checkpoint directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Comma-separated task names (niah_single_1, …, vt, cwe, fwe, qa_1, qa_2,
    /// niah_ordinal_first, …, passkey); `ruler`: RULER's 13 (qa_1 and qa_2 need --qa-dir).
    #[arg(long, value_delimiter = ',', required = true)]
    tasks: Vec<String>,
    /// Comma-separated context lengths in tokens (prompt + generated tokens).
    #[arg(long, value_delimiter = ',', required = true)]
    lengths: Vec<usize>,
    /// Number of evenly spaced needle depths, 0 to 1 inclusive.
    #[arg(long, default_value_t = 10)]
    depths: usize,
    /// even: every sample at each of --depths evenly spaced depths (tables by depth). ruler:
    /// as RULER draws them, each sample at one depth from round(linspace(0, 100, 40)) percent,
    /// drawn from --seed (--depths is then unused; --samples counts all of a task's items).
    #[arg(long, value_enum, default_value_t = DepthGrid::Even)]
    depth_grid: DepthGrid,
    /// Samples per (task, length, depth): 10 gives each depth's score a standard error of at
    /// most 15.8 points and, over 10 depths, each task's at most 5 (printed at the start).
    #[arg(long, default_value_t = 10)]
    samples: usize,
    /// Seed of every random choice in the items.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Run directory (run.json, results.jsonl, summary.json, summary.md). Required with --model;
    /// only --dump-prompts without --model runs without one.
    #[arg(long, required_unless_present = "dump_prompts")]
    out: Option<PathBuf>,
    /// Tokens to generate for every task (default: RULER's per task: niah 128, vt 30, cwe 120,
    /// fwe 50).
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Prompts per generation batch (does not change the outputs).
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    #[command(flatten)]
    runtime: DeviceArgs,
    #[command(flatten)]
    rope: RopeScalingArgs,
    /// RoPE base applied at evaluation only.
    #[arg(long)]
    rope_theta: Option<f64>,
    /// Haystack: RULER's essay file (PaulGrahamEssays.json, {"text": …}, as RULER's download
    /// script leaves it), a directory of text files (*.txt, *.md) or of rsd shards (decoded with
    /// the model's tokenizer). Default: the bundled public-domain books (corpus/books), named in
    /// every summary as a substitute for RULER's essays.
    #[arg(long)]
    haystack: Option<PathBuf>,
    /// Directory of RULER's QA data for qa_1 and qa_2: squad.json (SQuAD v2.0 dev,
    /// dev-v2.0.json) and hotpotqa.json (HotpotQA dev, distractor setting,
    /// hotpot_dev_distractor_v1.json), as RULER's download_qa_dataset.sh leaves them.
    #[arg(long, value_name = "DIR")]
    qa_dir: Option<PathBuf>,
    /// Decode a --haystack of shards whose manifest records another tokenizer than the model's
    /// anyway (a warning instead of the error).
    #[arg(long)]
    allow_tokenizer_mismatch: bool,
    /// Write every prompt and its expected answers as JSONL (and exit when no --model is given).
    #[arg(long)]
    dump_prompts: Option<PathBuf>,
    /// tokenizer.json to count tokens with when --dump-prompts runs without --model.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Render each prompt with the model's chat template (for instruct models): the task's
    /// question becomes one user message, rendered with add_generation_prompt=true as
    /// transformers' apply_chat_template does, and the answer prefix follows the generation
    /// prompt, as in RULER. The template is MODEL/chat_template.jinja, else "chat_template" in
    /// MODEL/tokenizer_config.json (without --model: the --tokenizer's directory). The wrapper's
    /// tokens count toward --lengths.
    #[arg(long)]
    chat_template: bool,
    /// A Jinja chat template to use instead of the model's (implies --chat-template; special
    /// tokens still come from the model's tokenizer_config.json).
    #[arg(long, value_name = "FILE.jinja")]
    chat_template_file: Option<PathBuf>,
    /// How items are scored. generate: greedy generation scored by RULER's metric.
    /// teacher-forced: no generation; every value the context offers (the needles' values) is
    /// scored as the continuation " VALUE" of the prompt, and the item counts as recalled when the
    /// expected value ranks first; results.jsonl also gets its log-probability, rank, the number
    /// of candidates and whether greedy decoding would produce it. For the tasks that ask for one
    /// value (niah_single_*, niah_multikey_*, niah_ordinal_*, passkey).
    #[arg(long, value_enum, default_value_t = Scoring::Generate)]
    scoring: Scoring,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub fn run(a: RunArgs) -> Result<()> {
    let mut tasks = Vec::new();
    for name in a.tasks.iter().map(|t| t.trim()) {
        if name == "ruler" {
            for t in rsd_eval::ruler::RULER_TASKS {
                tasks.push(Task::parse(t)?);
            }
        } else {
            tasks.push(Task::parse(name)?);
        }
    }
    let opts = RunOptions {
        model: a.model,
        tokenizer: a.tokenizer,
        tasks,
        lengths: a.lengths,
        depths: a.depths,
        depth_grid: a.depth_grid,
        samples: a.samples,
        seed: a.seed,
        max_new_tokens: a.max_new_tokens,
        batch_size: a.batch_size,
        runtime: a.runtime,
        rope_scaling: a.rope.rope_scaling,
        rope_theta: a.rope_theta,
        haystack: a.haystack,
        qa_dir: a.qa_dir,
        allow_tokenizer_mismatch: a.allow_tokenizer_mismatch,
        out: a.out.clone(),
        dump_prompts: a.dump_prompts.clone(),
        progress: !a.quiet,
        chat_template: a.chat_template,
        chat_template_file: a.chat_template_file,
        scoring: a.scoring,
    };
    let report = run_eval(&opts)?;
    if let Some(p) = &a.dump_prompts {
        println!("wrote {} prompts to {}", report.total, p.display());
    }
    if let Some(out) = &a.out {
        if opts.model.is_some() {
            let overall = report
                .overall
                .map(|o| format!("{:.1}", 100.0 * o))
                .unwrap_or_else(|| "n/a".into());
            let verb = match opts.scoring {
                Scoring::Generate => "generated",
                Scoring::TeacherForced => "scored by teacher forcing",
            };
            println!(
                "{} items: {} {verb}, {} already done; overall score {overall}; see {}",
                report.total,
                report.done,
                report.skipped,
                out.join("summary.md").display()
            );
        }
    }
    Ok(())
}
