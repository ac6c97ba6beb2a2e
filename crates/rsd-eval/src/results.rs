//! The evaluation's records: `RUN/results.jsonl` holds one [`ItemResult`] per scored prompt, in the
//! order they finished. Every other command (summaries, plots, `compare`) reads only this file and
//! `RUN/run.json`, so results written by an older run, or by another engine scored with the same
//! items, plot the same way.
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

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
    /// This result's [`item_key`].
    pub fn key(&self) -> ItemKey {
        item_key(&self.task, self.length, self.depth, self.sample)
    }
}

/// What reading a results file can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The results file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line is not an [`ItemResult`].
    #[error("{path}:{line}: not a result record ({message}); expected one JSON object per line with task, length, depth, sample, expected, output, score, prompt_tokens")]
    Parse {
        /// The results file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// serde's description of the problem.
        message: String,
    },
    /// The file is not a regular file.
    #[error(transparent)]
    File(#[from] rsd_common::safe_fs::FsError),
    /// A line is longer than any record (results of another kind, or no newlines at all).
    #[error("{path}:{line}: a line of more than {limit} bytes; a result record is a few KB")]
    LineTooLong {
        /// The results file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The limit in bytes.
        limit: u64,
    },
}

/// The longest line of a results file read (a record holds a prompt's answer, not the prompt).
const MAX_LINE_BYTES: u64 = 64 << 20;

/// Reads every record of a `results.jsonl`. A final line without its newline (a run killed while
/// writing) is ignored, so an interrupted run resumes from the last whole record.
pub fn read_results(path: &Path) -> Result<Vec<ItemResult>, ResultsError> {
    let io = |source| ResultsError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(rsd_common::safe_fs::open_regular(path)?);
    let mut items = Vec::new();
    let mut line = String::new();
    let mut number = 0;
    loop {
        line.clear();
        // At most one line's bound at a time: a file without newlines is not read into memory.
        let read = (&mut reader)
            .take(MAX_LINE_BYTES + 1)
            .read_line(&mut line)
            .map_err(io)?;
        if read == 0 {
            return Ok(items);
        }
        number += 1;
        if read as u64 > MAX_LINE_BYTES {
            return Err(ResultsError::LineTooLong {
                path: path.to_path_buf(),
                line: number,
                limit: MAX_LINE_BYTES,
            });
        }
        if !line.ends_with('\n') {
            return Ok(items);
        }
        if line.trim().is_empty() {
            continue;
        }
        let item = serde_json::from_str(&line).map_err(|e| ResultsError::Parse {
            path: path.to_path_buf(),
            line: number,
            message: e.to_string(),
        })?;
        items.push(item);
    }
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
