//! `rsd-eval score`: teacher-forced scoring of your own items, a JSONL file of
//! (context, candidates, answer), one item per line:
//!
//! ```json
//! {"context": "… The capital of France is", "candidates": [" Paris", " Rome"], "answer": " Paris"}
//! ```
//!
//! Optional fields: `task` (a name to group by; default `items`), `depth` (where the evidence
//! sits, in [0, 1], for tables by depth) and `length` (the length bucket to report under;
//! default the context's token count rounded up to a power of two). The context is tokenized
//! with the tokenizer's special tokens (its BOS), each candidate alone without them, and appended
//! as it is: a candidate carries the space that separates it from the context. The item scores 1
//! when the answer's log-probability ranks first among the candidates.
//!
//! The run directory is that of `rsd-eval run` (`run.json`, `results.jsonl`, `summary.*`), so
//! `rsd-eval plot` and `rsd-eval compare --baseline` read it. An item's key is its line number
//! (`sample`, 0-based) with its task, length and depth: runs of several models over one items file
//! pair item by item, and a rerun skips the items already scored.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rsd_model::cli::{DeviceArgs, RopeScalingArgs};
use rsd_model::generate::{self as gen, TextTokenizer};
use rsd_model::{Model, ModelConfig, RopeScaling};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{io_err, EvalError, Result};
use crate::lines::{json_message, LineError, Lines};
use crate::results::{
    check_distinct, item_key, read_results, ItemResult, MAX_LENGTH, MAX_TASK_CHARS,
};
use crate::run::{
    check_model_files, done_keys, load_model, progress_bar, rank_first, settle_run_json,
    sha256_file, Results, Scoring, Summary,
};
use rsd_common::printable::shortened;

const SCORE_HELP: &str = "Each line of --items is one item, for example
  {\"context\": \"… The capital of France is\", \"candidates\": [\" Paris\", \" Rome\"], \"answer\": \" Paris\"}
optional: \"task\" (a name to group by, default items), \"depth\" (where the evidence sits, 0 to 1)
and \"length\" (the length to report under; default the context's tokens rounded up to a power
of two). The context gets the tokenizer's special tokens (BOS); each candidate is tokenized alone
and appended as it is, so give it its leading space. One prompt pass per item, then the candidates
in batches. Results go to RUN/results.jsonl with the answer's log-probability and rank, as in
`rsd-eval run --scoring teacher-forced`; `rsd-eval compare --baseline` pairs runs item by item.
A rerun skips the items already scored. See docs/EVAL.md.";

/// Arguments of `rsd-eval score`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = SCORE_HELP)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["items", "pred"])))]
pub struct ScoreArgs {
    /// Checkpoint directory (config.json, *.safetensors, tokenizer.json); with --items.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The items: JSONL, one {"context", "candidates", "answer"} object per line (optional
    /// "task", "depth", "length"), scored by teacher forcing with --model.
    #[arg(long, value_name = "FILE.jsonl", requires = "model")]
    pub items: Option<PathBuf>,
    /// Completions made elsewhere, scored with RULER's metrics: RULER's prediction files
    /// (a directory of TASK.jsonl with index, input, outputs, pred, length; one directory per
    /// length is RULER's layout), or `rsd-eval run --dump-prompts` lines with a "pred" added.
    #[arg(long, value_name = "FILE_OR_DIR", conflicts_with = "model")]
    pub pred: Option<PathBuf>,
    /// Run directory (run.json, results.jsonl, summary.json, summary.md).
    #[arg(long)]
    pub out: PathBuf,
    /// Candidates per forward batch (does not change the scores).
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// --device, --dtype.
    #[command(flatten)]
    pub runtime: DeviceArgs,
    /// --rope-scaling.
    #[command(flatten)]
    pub rope: RopeScalingArgs,
    /// RoPE base applied at evaluation only.
    #[arg(long)]
    pub rope_theta: Option<f64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// One line of the items file, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    context: String,
    candidates: Vec<String>,
    answer: String,
    #[serde(default)]
    task: Option<String>,
    #[serde(default)]
    depth: Option<f64>,
    #[serde(default)]
    length: Option<usize>,
}

/// An item ready to score.
#[derive(Debug, Clone, PartialEq)]
pub struct UserItem {
    /// 0-based line number: the item's `sample` in results.jsonl.
    pub line: usize,
    /// Task name to group by.
    pub task: String,
    /// Evidence depth, if given.
    pub depth: Option<f64>,
    /// Length bucket.
    pub length: usize,
    /// The context's ids (special tokens included).
    pub ids: Vec<i64>,
    /// The candidates as written.
    pub candidates: Vec<String>,
    /// Each candidate's ids (no special tokens).
    pub continuations: Vec<Vec<i64>>,
    /// Index of the answer among the candidates.
    pub gold: usize,
    /// One context per candidate instead of `ids` for all (WinoGrande's partial scoring).
    pub per_candidate: Option<Vec<Vec<i64>>>,
    /// Each candidate's length in characters, where `acc_norm` (log-probability per character,
    /// lm-eval's) is reported too.
    pub norm_chars: Option<Vec<usize>>,
}

/// The settings a resumed `rsd-eval score` run must match (written into run.json).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreSettings {
    /// The model directory, absolute.
    pub model: String,
    /// SHA-256 of its tokenizer.json.
    pub tokenizer_sha256: String,
    /// The items file (or benchmark data), absolute.
    pub items: String,
    /// SHA-256 of the items file (of a directory's files, in name order).
    pub items_sha256: String,
    /// The benchmark `rsd-eval mc` read the items from, if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<String>,
    /// Model dtype.
    pub dtype: String,
    /// rope_scaling applied at evaluation (an HF dict), if any.
    pub rope_scaling: Option<Value>,
    /// rope_theta applied at evaluation, if any.
    pub rope_theta: Option<f64>,
    /// Always teacher forcing.
    pub scoring: Scoring,
}

/// The largest items file read: its contexts are tokenized and held, at about twice their size.
pub const MAX_ITEMS_FILE_BYTES: u64 = 1 << 30;

/// The longest line (one item, its context included) of an items file read.
pub const MAX_ITEM_LINE_BYTES: u64 = 64 << 20;

/// The most candidates one item may have.
pub const MAX_ITEM_CANDIDATES: usize = 4096;

/// One line of the items file, checked but not tokenized: every value in its range. The error
/// names the field and why (the caller adds the file and line).
fn parse_item_line(raw: &str) -> std::result::Result<(Line, usize), String> {
    let l: Line = serde_json::from_str(raw).map_err(|e| {
        format!(
            "{} (expected {{\"context\": str, \"candidates\": [str, …], \"answer\": str}}, \
             optional \"task\", \"depth\", \"length\")",
            json_message(&e)
        )
    })?;
    if l.context.is_empty() {
        return Err("\"context\" is empty".into());
    }
    if l.candidates.len() < 2 || l.candidates.len() > MAX_ITEM_CANDIDATES {
        return Err(format!(
            "\"candidates\" has {} value(s); ranking needs at least 2 (and at most \
             {MAX_ITEM_CANDIDATES})",
            l.candidates.len()
        ));
    }
    let mut seen = HashSet::new();
    if let Some(c) = l.candidates.iter().find(|c| !seen.insert(c.as_str())) {
        return Err(format!("\"candidates\" lists \"{}\" twice", shortened(c)));
    }
    let gold = l
        .candidates
        .iter()
        .position(|c| *c == l.answer)
        .ok_or_else(|| {
            format!(
                "\"answer\" \"{}\" is not one of \"candidates\"",
                shortened(&l.answer)
            )
        })?;
    if let Some(d) = l.depth.filter(|d| !(0.0..=1.0).contains(d)) {
        return Err(format!("\"depth\" {d} is outside [0, 1]"));
    }
    if let Some(n) = l.length.filter(|n| !(1..=MAX_LENGTH).contains(n)) {
        return Err(format!(
            "\"length\" {n} is not a positive token count of at most {MAX_LENGTH}"
        ));
    }
    if let Some(t) = l
        .task
        .as_ref()
        .filter(|t| t.is_empty() || t.chars().count() > MAX_TASK_CHARS)
    {
        return Err(format!(
            "\"task\" \"{}\" must be a name of 1 to {MAX_TASK_CHARS} characters",
            shortened(t)
        ));
    }
    Ok((l, gold))
}

/// Reads and checks the items file (a regular file of at most [`MAX_ITEMS_FILE_BYTES`], read a
/// line at a time, lines of at most [`MAX_ITEM_LINE_BYTES`]): every error names the file, the
/// line and the field.
pub fn read_items(path: &Path, tok: &TextTokenizer) -> Result<Vec<UserItem>> {
    let read_err = |e: LineError| EvalError::Input(e.to_string());
    let mut lines = Lines::open(
        path,
        MAX_ITEMS_FILE_BYTES,
        MAX_ITEM_LINE_BYTES,
        "file of items",
    )
    .map_err(read_err)?;
    let mut items = Vec::new();
    while let Some(line) = lines.next_line().map_err(read_err)? {
        if line.text.trim().is_empty() {
            continue;
        }
        let i = line.number - 1;
        let at = |m: String| EvalError::Input(format!("{}:{}: {m}", path.display(), i + 1));
        let (l, gold) = parse_item_line(line.text).map_err(at)?;
        let ids = tok.encode(&l.context, true)?;
        let continuations = l
            .candidates
            .iter()
            .map(|c| tok.encode(c, false))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(j) = continuations.iter().position(Vec::is_empty) {
            return Err(at(format!(
                "candidate \"{}\" has no tokens",
                shortened(&l.candidates[j])
            )));
        }
        items.push(UserItem {
            line: i,
            task: l.task.unwrap_or_else(|| "items".into()),
            depth: l.depth.map(|d| d + 0.0),
            length: l.length.unwrap_or_else(|| ids.len().next_power_of_two()),
            ids,
            candidates: l.candidates,
            continuations,
            gold,
            per_candidate: None,
            norm_chars: None,
        });
    }
    if items.is_empty() {
        return Err(EvalError::Input(format!(
            "{}: no items (one JSON object per line)",
            path.display()
        )));
    }
    check_items_distinct(path, &items)?;
    Ok(items)
}

/// Refuses items spanning more tasks, lengths or depths than a summary tabulates (see
/// [`crate::results::check_distinct`]), before anything is scored.
fn check_items_distinct(path: &Path, items: &[UserItem]) -> Result<()> {
    let cells = items
        .iter()
        .map(|it| (it.task.as_str(), it.length, it.depth));
    Ok(check_distinct(path, cells)?)
}

/// The longest context plus candidate must fit the model's window, unless RoPE is rescaled.
fn check_window(path: &Path, items: &[UserItem], cfg: &ModelConfig, scaled: bool) -> Result<()> {
    if scaled || cfg.rope_scaling != RopeScaling::None {
        return Ok(());
    }
    let max = cfg.max_position_embeddings as usize;
    for it in items {
        let longest = it.continuations.iter().map(Vec::len).max().unwrap_or(0);
        let n = it.ids.len() + longest;
        if n > max {
            return Err(EvalError::Input(format!(
                "{}:{}: the context and its longest candidate are {n} tokens, beyond the model's \
                 max_position_embeddings {max}; pass --rope-scaling (e.g. yarn:{}) to evaluate \
                 beyond the trained window",
                path.display(),
                it.line + 1,
                (n as f64 / max as f64).ceil()
            )));
        }
    }
    Ok(())
}

/// What `rsd-eval score` did.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreReport {
    /// Items in the file.
    pub total: usize,
    /// Items already in results.jsonl.
    pub skipped: usize,
    /// Items scored now.
    pub done: usize,
    /// Fraction of all scored items whose answer ranks first.
    pub overall: Option<f64>,
}

/// Every candidate's teacher-forced score: after the item's one prompt, in batches, or each
/// after its own context (`per_candidate`), one at a time.
pub(crate) fn candidate_scores(
    model: &Model,
    it: &UserItem,
    batch_size: usize,
) -> Result<Vec<gen::ContinuationScore>> {
    let Some(contexts) = &it.per_candidate else {
        return Ok(gen::score_continuations(
            model,
            &it.ids,
            &it.continuations,
            batch_size,
            gen::DEFAULT_PREFILL_CHUNK,
        )?);
    };
    let mut scores = Vec::with_capacity(contexts.len());
    for (ctx, cont) in contexts.iter().zip(&it.continuations) {
        scores.extend(gen::score_continuations(
            model,
            ctx,
            std::slice::from_ref(cont),
            1,
            gen::DEFAULT_PREFILL_CHUNK,
        )?);
    }
    Ok(scores)
}

/// Scores one item: its answer's log-probability and rank among its candidates.
fn score_item(model: &Model, it: &UserItem, batch_size: usize) -> Result<ItemResult> {
    let scores = candidate_scores(model, it, batch_size)?;
    let (rank, best) = rank_first(&scores, it.gold);
    // lm-eval's acc_norm: the first argmax of log-probability per character.
    let score_norm = it.norm_chars.as_ref().map(|chars| {
        let per_char = |j: usize| scores[j].logprob / chars[j].max(1) as f64;
        let best = (0..scores.len()).fold(0, |b, j| if per_char(j) > per_char(b) { j } else { b });
        if best == it.gold {
            1.0
        } else {
            0.0
        }
    });
    Ok(ItemResult {
        task: it.task.clone(),
        length: it.length,
        depth: it.depth,
        sample: it.line,
        expected: vec![it.candidates[it.gold].clone()],
        output: it.candidates[best].clone(),
        score: if rank == 1 { 1.0 } else { 0.0 },
        prompt_tokens: it.ids.len(),
        logprob: Some(scores[it.gold].logprob),
        rank: Some(rank),
        candidates: Some(it.candidates.len()),
        greedy: Some(scores[it.gold].greedy),
        score_norm,
    })
}

/// `rsd-eval score`: with `--items`, reads and checks the items, then scores those not yet in
/// RUN/results.jsonl by teacher forcing; with `--pred`, scores the completions in them and
/// writes RUN/results.jsonl anew.
pub fn score(a: &ScoreArgs) -> Result<ScoreReport> {
    match (&a.model, &a.items, &a.pred) {
        (Some(model), Some(items), None) => score_items(a, model, items),
        (None, None, Some(pred)) => score_predictions(pred, &a.out),
        _ => Err(EvalError::Input(
            "give --model DIR --items FILE.jsonl (teacher forcing) or --pred FILE_OR_DIR \
             (completions made elsewhere)"
                .into(),
        )),
    }
}

/// `rsd-eval score --pred`: RULER's metrics over completions made elsewhere.
fn score_predictions(pred: &Path, out: &Path) -> Result<ScoreReport> {
    let results = crate::ruler::read_predictions(pred)?;
    if results.is_empty() {
        return Err(EvalError::Input(format!(
            "--pred {}: no predictions",
            pred.display()
        )));
    }
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let path = out.join("results.jsonl");
    let mut text = String::new();
    for r in &results {
        text += &serde_json::to_string(r).map_err(|e| EvalError::Json {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        text.push('\n');
    }
    rsd_common::safe_fs::write_file_atomic(&path, text.as_bytes())
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))?;
    let summary = Summary::of(&results, &[]);
    summary.write(out)?;
    Ok(ScoreReport {
        total: results.len(),
        skipped: 0,
        done: results.len(),
        overall: summary.overall,
    })
}

fn score_items(a: &ScoreArgs, model: &Path, items_path: &Path) -> Result<ScoreReport> {
    if a.batch_size == 0 {
        return Err(EvalError::Input("--batch-size must be at least 1".into()));
    }
    let tok_path = model.join("tokenizer.json");
    check_model_files(model)?;
    let tok = TextTokenizer::from_file(&tok_path)?;
    let cfg = ModelConfig::from_dir(model)?;
    rsd_model::checkpoint::safetensors_files(model)?;
    let items = read_items(items_path, &tok)?;
    let source = ItemsSource {
        path: items_path.to_path_buf(),
        sha256: sha256_file(items_path)?,
        benchmark: None,
    };
    score_user_items(a, model, &cfg, &items, &source)
}

/// Where a run's items came from, for run.json.
pub(crate) struct ItemsSource {
    /// The file (or directory) read.
    pub path: PathBuf,
    /// Its SHA-256.
    pub sha256: String,
    /// The benchmark, for `rsd-eval mc`.
    pub benchmark: Option<String>,
}

/// Scores `items` with the model in `model` into `a.out` (run.json, results.jsonl, summaries),
/// skipping the items already there; refuses a run directory made with other settings.
pub(crate) fn score_user_items(
    a: &ScoreArgs,
    model: &Path,
    cfg: &ModelConfig,
    items: &[UserItem],
    source: &ItemsSource,
) -> Result<ScoreReport> {
    let items_path = source.path.as_path();
    let tok_path = model.join("tokenizer.json");
    if let Some(it) = items.iter().find(|it| {
        it.ids
            .iter()
            .chain(it.continuations.iter().flatten())
            .chain(it.per_candidate.iter().flatten().flatten())
            .any(|&t| t >= cfg.vocab_size)
    }) {
        return Err(EvalError::Input(format!(
            "{}:{}: a token id is beyond the model's embedding ({} rows): the tokenizer does not belong to this model",
            items_path.display(),
            it.line + 1,
            cfg.vocab_size
        )));
    }
    check_window(items_path, items, cfg, a.rope.rope_scaling.is_some())?;
    let rope_scaling = a
        .rope
        .rope_scaling
        .as_ref()
        .map(|s| s.to_dict(cfg.max_position_embeddings));
    let abs = |p: &Path| std::fs::canonicalize(p).map_err(io_err(p));
    let settings = ScoreSettings {
        model: abs(model)?.display().to_string(),
        tokenizer_sha256: sha256_file(&tok_path)?,
        items: abs(items_path)?.display().to_string(),
        items_sha256: source.sha256.clone(),
        benchmark: source.benchmark.clone(),
        dtype: a.runtime.dtype.clone(),
        rope_scaling: rope_scaling.clone(),
        rope_theta: a.rope_theta,
        scoring: Scoring::TeacherForced,
    };
    let options = a.runtime.options()?;
    std::fs::create_dir_all(&a.out).map_err(io_err(&a.out))?;
    let mut now = serde_json::to_value(&settings).map_err(|e| EvalError::Json {
        path: a.out.join("run.json"),
        reason: e.to_string(),
    })?;
    now["model_provenance"] = crate::run::model_provenance(model)?;
    settle_run_json(&a.out, &now, &a.runtime.device)?;

    let results_path = a.out.join("results.jsonl");
    let finished = done_keys(&results_path)?;
    let mut results = Results::open(&results_path)?;
    let pending: Vec<&UserItem> = items
        .iter()
        .filter(|it| !finished.contains(&item_key(&it.task, it.length, it.depth, it.line)))
        .collect();
    let skipped = items.len() - pending.len();
    if !pending.is_empty() {
        let model = load_model(model, options, a.rope_theta, rope_scaling)?;
        let bar = progress_bar(!a.quiet, items.len() as u64, skipped as u64);
        for it in &pending {
            results.append(&score_item(&model, it, a.batch_size)?)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
    }
    let all = read_results(&results_path)?;
    let summary = Summary::of(&all, &[]);
    summary.write(&a.out)?;
    Ok(ScoreReport {
        total: items.len(),
        skipped,
        done: pending.len(),
        overall: summary.overall,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> TextTokenizer {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../assets/tokenizers/mini-1k/tokenizer.json");
        TextTokenizer::from_file(&p).unwrap()
    }

    fn write(lines: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("items.jsonl");
        std::fs::write(&p, lines).unwrap();
        (d, p)
    }

    #[test]
    fn items_are_read_with_their_defaults_and_line_numbers() {
        let (_d, p) = write(
            "{\"context\": \"the key is\", \"candidates\": [\" red\", \" blue\"], \"answer\": \" blue\"}\n\n\
             {\"context\": \"x\", \"candidates\": [\" a\", \" b\", \" c\"], \"answer\": \" a\", \"task\": \"t\", \"depth\": 0.5, \"length\": 4096}\n",
        );
        let tok = tokenizer();
        let items = read_items(&p, &tok).unwrap();
        assert_eq!(items.len(), 2);
        assert_eq!(
            (items[0].line, items[0].task.as_str(), items[0].gold),
            (0, "items", 1)
        );
        assert_eq!(items[0].ids, tok.encode("the key is", true).unwrap());
        assert_eq!(
            items[0].continuations[1],
            tok.encode(" blue", false).unwrap()
        );
        assert_eq!(items[0].length, items[0].ids.len().next_power_of_two());
        assert_eq!((items[1].line, items[1].task.as_str()), (2, "t"));
        assert_eq!(
            (items[1].depth, items[1].length, items[1].gold),
            (Some(0.5), 4096, 0)
        );
    }

    #[test]
    fn bad_items_name_the_line_and_the_field() {
        let tok = tokenizer();
        let cases = [
            ("{\"candidates\": [\" a\", \" b\"], \"answer\": \" a\"}", "missing field `context`"),
            ("{\"context\": \"c\", \"candidates\": [\" a\"], \"answer\": \" a\"}", "at least 2"),
            ("{\"context\": \"c\", \"candidates\": [\" a\", \" a\"], \"answer\": \" a\"}", "twice"),
            ("{\"context\": \"c\", \"candidates\": [\" a\", \" b\"], \"answer\": \" z\"}", "is not one of"),
            ("{\"context\": \"c\", \"candidates\": [\" a\", \"\"], \"answer\": \" a\"}", "has no tokens"),
            ("{\"context\": \"\", \"candidates\": [\" a\", \" b\"], \"answer\": \" a\"}", "\"context\" is empty"),
            ("{\"context\": \"c\", \"candidates\": [\" a\", \" b\"], \"answer\": \" a\", \"depth\": 2}", "outside [0, 1]"),
            ("{\"context\": \"c\", \"candidates\": [\" a\", \" b\"], \"answer\": \" a\", \"lenght\": 2}", "unknown field `lenght`"),
            ("not json", "expected {\"context\""),
        ];
        for (line, want) in cases {
            let (_d, p) = write(&format!("\n{line}\n"));
            let e = read_items(&p, &tok).unwrap_err().to_string();
            assert!(e.contains("items.jsonl:2: "), "{e}");
            assert!(e.contains(want), "{line}: {e}");
        }
        let (_d, p) = write("\n\n");
        assert!(read_items(&p, &tok)
            .unwrap_err()
            .to_string()
            .contains("no items"));
    }
}
