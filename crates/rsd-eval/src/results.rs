//! The evaluation's records: `RUN/results.jsonl` holds one [`ItemResult`] per scored prompt, in the
//! order they finished. Every other command (summaries, plots, `compare`) reads only this file and
//! `RUN/run.json`, so results written by an older run, or by another engine scored with the same
//! items, plot the same way.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rsd_common::printable::shortened;
use serde::{Deserialize, Serialize};

use crate::lines::{json_message, LineError, Lines};

/// One prompt's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemResult {
    /// RULER's task name (`niah_single_1`, …, `vt`, `cwe`, `fwe`) or one of ours (`niah_ordinal_*`).
    pub task: String,
    /// Context length asked for, in the model tokenizer's tokens.
    pub length: usize,
    /// Where the evidence sits, as a fraction of the context in [0, 1]; `None` for tasks whose
    /// evidence is spread over the context (variable tracking, word extraction).
    pub depth: Option<f64>,
    /// Index of the sample within (task, length, depth); with the seed it identifies the item.
    pub sample: usize,
    /// The answers the generator placed in the context.
    pub expected: Vec<String>,
    /// The model's completion, decoded.
    pub output: String,
    /// Fraction of `expected` found in `output`, in [0, 1].
    pub score: f64,
    /// Prompt length actually fed to the model, in tokens.
    pub prompt_tokens: usize,
    /// Teacher-forced runs only: the expected value's log-probability as the prompt's
    /// continuation (natural log, summed over its tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f64>,
    /// Teacher-forced runs only: the expected value's rank (1 = first) among the candidates, by
    /// log-probability; a candidate scoring the same as the expected value ranks above it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<usize>,
    /// Teacher-forced runs only: how many candidates (values present in the context) were ranked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<usize>,
    /// Teacher-forced runs only: whether greedy decoding would produce the expected value (every
    /// one of its tokens is its position's argmax).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub greedy: Option<bool>,
    /// Multiple-choice runs only: lm-eval's `acc_norm`, 1 when the answer ranks first by
    /// log-probability per character.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score_norm: Option<f64>,
}

/// What identifies an item across runs: task, length, depth (its bits), sample.
pub type ItemKey = (String, usize, Option<u64>, usize);

/// The key of an item, the one a rerun uses to skip finished items.
pub fn item_key(task: &str, length: usize, depth: Option<f64>, sample: usize) -> ItemKey {
    (task.to_string(), length, depth.map(f64::to_bits), sample)
}

impl ItemResult {
    /// The (task, length, depth) cell this result counts in, as [`check_distinct`] takes it.
    pub fn cell(&self) -> (&str, usize, Option<f64>) {
        (&self.task, self.length, self.depth)
    }

    /// This result's [`item_key`].
    pub fn key(&self) -> ItemKey {
        item_key(&self.task, self.length, self.depth, self.sample)
    }
}

/// What reading a results file can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The file is not a regular file, is too large, or a line is too long or not UTF-8.
    #[error(transparent)]
    Read(#[from] LineError),
    /// A line is not an [`ItemResult`].
    #[error("{path}:{line}: not a result record ({message}); expected one JSON object per line with task, length, depth, sample, expected, output, score, prompt_tokens", path = path.display())]
    Parse {
        /// The results file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// serde's description of the problem (shortened, escaped).
        message: String,
    },
    /// A record holds a value out of its range.
    #[error("{path}:{line}: field {field}: {message}", path = path.display())]
    Invalid {
        /// The results file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The field.
        field: &'static str,
        /// What is wrong with its value.
        message: String,
    },
    /// The records span more distinct values of a key than rsd-eval tabulates and plots.
    #[error("{path}: {count} distinct {what}, more than the {limit} rsd-eval tabulates and plots ({hint})", path = path.display())]
    TooMany {
        /// The results file.
        path: PathBuf,
        /// What is counted (`tasks`, `lengths`, `depths`).
        what: &'static str,
        /// How many there are.
        count: usize,
        /// The most allowed.
        limit: usize,
        /// What real runs have.
        hint: &'static str,
    },
}

/// The largest `results.jsonl` read (a record is a few KB; a million of them is a few GB).
pub const MAX_RESULTS_FILE_BYTES: u64 = 4 << 30;

/// The longest line of a results file read (a record holds a prompt's answer, not the prompt).
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// The largest context length a record may name, in tokens (2^30; real runs stop near 2^21).
pub const MAX_LENGTH: usize = 1 << 30;

/// The most characters a task name may have.
pub const MAX_TASK_CHARS: usize = 256;

/// The most expected strings one record may hold (RULER's tasks expect at most 10).
pub const MAX_EXPECTED: usize = 1000;

/// The most candidates one teacher-forced record may have ranked.
pub const MAX_CANDIDATES: usize = 1 << 20;

/// The most distinct tasks, lengths or depths the records of one file may span: summaries and
/// figures draw one row, column or point per distinct value, and a table of tasks × lengths
/// grows with their product.
pub const MAX_DISTINCT: usize = 256;

/// Log-probabilities a little above 0 come from rounding in low precision (a continuation the
/// model is sure of); more is not a log-probability.
const LOGPROB_ROUNDING: f64 = 0.01;

/// Why `r` is not a record rsd-eval can use: the field and what is wrong with its value, or
/// `None` when every value is in its range.
pub fn invalid_field(r: &ItemResult) -> Option<(&'static str, String)> {
    let in_unit = |x: f64| x.is_finite() && (0.0..=1.0).contains(&x);
    if r.task.is_empty() || r.task.chars().count() > MAX_TASK_CHARS {
        return Some((
            "task",
            format!(
                "{:?} must be a name of 1 to {MAX_TASK_CHARS} characters",
                shortened(&r.task)
            ),
        ));
    }
    if r.length == 0 || r.length > MAX_LENGTH {
        return Some((
            "length",
            format!("{} is not a token count in 1..={MAX_LENGTH}", r.length),
        ));
    }
    if let Some(d) = r.depth.filter(|d| !in_unit(*d)) {
        return Some(("depth", format!("{d} is not a fraction in [0, 1]")));
    }
    if r.expected.len() > MAX_EXPECTED {
        return Some((
            "expected",
            format!(
                "{} strings, more than the {MAX_EXPECTED} a record may hold",
                r.expected.len()
            ),
        ));
    }
    if !in_unit(r.score) {
        return Some(("score", format!("{} is not a score in [0, 1]", r.score)));
    }
    if r.prompt_tokens > MAX_LENGTH {
        return Some((
            "prompt_tokens",
            format!("{} is more than {MAX_LENGTH} tokens", r.prompt_tokens),
        ));
    }
    if let Some(lp) = r
        .logprob
        .filter(|lp| !(lp.is_finite() && *lp <= LOGPROB_ROUNDING))
    {
        return Some((
            "logprob",
            format!("{lp} is not a log-probability (finite, at most 0)"),
        ));
    }
    if let Some(c) = r.candidates.filter(|c| !(1..=MAX_CANDIDATES).contains(c)) {
        return Some((
            "candidates",
            format!("{c} is not a count of candidates in 1..={MAX_CANDIDATES}"),
        ));
    }
    if let Some(rank) = r.rank {
        let most = r.candidates.unwrap_or(MAX_CANDIDATES);
        if rank == 0 || rank > most {
            return Some((
                "rank",
                format!("{rank} is not a rank in 1..={most} (the candidates ranked)"),
            ));
        }
    }
    if let Some(x) = r.score_norm.filter(|x| !in_unit(*x)) {
        return Some(("score_norm", format!("{x} is not a score in [0, 1]")));
    }
    None
}

/// Parses one line of a results file: a record whose every value is in its range.
pub fn parse_line(path: &Path, line: usize, text: &str) -> Result<ItemResult, ResultsError> {
    let item: ItemResult = serde_json::from_str(text).map_err(|e| ResultsError::Parse {
        path: path.to_path_buf(),
        line,
        message: json_message(&e),
    })?;
    match invalid_field(&item) {
        Some((field, message)) => Err(ResultsError::Invalid {
            path: path.to_path_buf(),
            line,
            field,
            message,
        }),
        None => Ok(item),
    }
}

/// Refuses records spanning more than [`MAX_DISTINCT`] tasks, lengths or depths (`path` names
/// where they came from).
pub fn check_distinct<'a>(
    path: &Path,
    cells: impl IntoIterator<Item = (&'a str, usize, Option<f64>)>,
) -> Result<(), ResultsError> {
    let (mut tasks, mut lengths, mut depths) = (HashSet::new(), HashSet::new(), HashSet::new());
    for (task, length, depth) in cells {
        tasks.insert(task);
        lengths.insert(length);
        depths.extend(depth.map(f64::to_bits));
    }
    for (what, count, hint) in [
        ("tasks", tasks.len(), "RULER has 13"),
        (
            "lengths",
            lengths.len(),
            "a run has a handful of context lengths",
        ),
        (
            "depths",
            depths.len(),
            "RULER's grid has 40; round finer depths, e.g. to 0.01",
        ),
    ] {
        if count > MAX_DISTINCT {
            return Err(ResultsError::TooMany {
                path: path.to_path_buf(),
                what,
                count,
                limit: MAX_DISTINCT,
                hint,
            });
        }
    }
    Ok(())
}

/// Reads every record of a `results.jsonl` (a regular file of at most
/// [`MAX_RESULTS_FILE_BYTES`], lines of at most [`MAX_LINE_BYTES`], read one at a time), each
/// checked ([`parse_line`]), and together spanning at most [`MAX_DISTINCT`] tasks, lengths and
/// depths. A final line without its newline (a run killed while writing) is ignored, so an
/// interrupted run resumes from the last whole record.
pub fn read_results(path: &Path) -> Result<Vec<ItemResult>, ResultsError> {
    let mut lines = Lines::open(path, MAX_RESULTS_FILE_BYTES, MAX_LINE_BYTES, "results file")?;
    let mut items = Vec::new();
    while let Some(line) = lines.next_line()? {
        if !line.complete {
            break;
        }
        if line.text.trim().is_empty() {
            continue;
        }
        items.push(parse_line(path, line.number, line.text)?);
    }
    check_distinct(path, items.iter().map(ItemResult::cell))?;
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn item(sample: usize) -> ItemResult {
        ItemResult {
            task: "niah_single_1".into(),
            length: 1024,
            depth: Some(0.5),
            sample,
            expected: vec!["7342".into()],
            output: "7342".into(),
            score: 1.0,
            prompt_tokens: 1019,
            logprob: None,
            rank: None,
            candidates: None,
            greedy: None,
            score_norm: None,
        }
    }

    #[test]
    fn reads_whole_lines_and_drops_a_torn_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let mut f = std::fs::File::create(&path).unwrap();
        for s in 0..2 {
            writeln!(f, "{}", serde_json::to_string(&item(s)).unwrap()).unwrap();
        }
        write!(f, "{{\"task\": \"niah_si").unwrap();
        drop(f);
        assert_eq!(read_results(&path).unwrap(), vec![item(0), item(1)]);
    }

    #[test]
    fn names_the_line_of_a_bad_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        std::fs::write(
            &path,
            format!(
                "{}\n{{\"task\": 3}}\n",
                serde_json::to_string(&item(0)).unwrap()
            ),
        )
        .unwrap();
        let err = read_results(&path).unwrap_err().to_string();
        assert!(err.contains("results.jsonl:2:"), "{err}");
    }
}
