//! RULER's QA tasks' data: `qa_1` asks SQuAD v2.0's dev questions, `qa_2` HotpotQA's dev
//! questions (distractor setting), each among documents of the same set. The files are read in
//! their published formats, under the names RULER's `download_qa_dataset.sh` gives them:
//! `squad.json` (`dev-v2.0.json`) and `hotpotqa.json` (`hotpot_dev_distractor_v1.json`).
//!
//! As RULER reads them: the documents are the set's distinct paragraphs in sorted order (a
//! HotpotQA paragraph is its title, a newline and its sentences joined); SQuAD's unanswerable
//! questions are left out; question `i` is the `i`-th answerable one in file order. A SQuAD
//! question's own paragraph is its context and the other paragraphs of its article come first
//! among the distractors; a HotpotQA question's context is all ten of its paragraphs.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The largest QA file read (HotpotQA's dev set is 46 MB; the file is parsed whole, at a few
/// times its size in memory).
pub const QA_FILE_LIMIT: u64 = 256 << 20;

/// Where the datasets come from, for error messages.
pub const SQUAD_URL: &str = "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json";
/// HotpotQA's dev set in the distractor setting.
pub const HOTPOTQA_URL: &str =
    "http://curtis.ml.cmu.edu/datasets/hotpot/hotpot_dev_distractor_v1.json";

/// Which published set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QaSource {
    /// SQuAD v2.0 dev.
    Squad,
    /// HotpotQA dev, distractor setting.
    HotpotQa,
}

impl QaSource {
    /// The file name RULER's download script writes.
    pub fn file_name(self) -> &'static str {
        match self {
            QaSource::Squad => "squad.json",
            QaSource::HotpotQa => "hotpotqa.json",
        }
    }

    /// The name the dataset is published under.
    pub fn published_name(self) -> &'static str {
        match self {
            QaSource::Squad => "dev-v2.0.json",
            QaSource::HotpotQa => "hotpot_dev_distractor_v1.json",
        }
    }

    /// Where the file is published.
    pub fn url(self) -> &'static str {
        match self {
            QaSource::Squad => SQUAD_URL,
            QaSource::HotpotQa => HOTPOTQA_URL,
        }
    }

    /// `dir/squad.json` (or the published name), or an error that says where to get it.
    pub fn find(self, dir: &Path) -> Result<PathBuf, QaError> {
        [self.file_name(), self.published_name()]
            .iter()
            .map(|n| dir.join(n))
            .find(|p| p.is_file())
            .ok_or_else(|| QaError {
                path: dir.join(self.file_name()),
                reason: format!(
                    "not found (nor {}); download {} there, as RULER's \
                     scripts/data/synthetic/json/download_qa_dataset.sh does",
                    self.published_name(),
                    self.url()
                ),
            })
    }
}

/// A QA file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct QaError {
    /// The file.
    pub path: PathBuf,
    /// What is wrong, and where.
    pub reason: String,
}

/// One question.
#[derive(Debug, Clone, PartialEq)]
pub struct QaQuestion {
    /// The question.
    pub query: String,
    /// Every accepted answer.
    pub outputs: Vec<String>,
    /// Its documents (indices into [`QaSet::docs`]), always in the prompt.
    pub context: Vec<usize>,
    /// The documents that answer it (SQuAD: its paragraph; HotpotQA: the paragraphs its
    /// supporting facts name, or all of `context` where none are named).
    pub evidence: Vec<usize>,
    /// Distractors taken before any others (SQuAD: the other paragraphs of its article).
    pub more_context: Vec<usize>,
}

/// A dataset read for the QA tasks.
#[derive(Debug, Clone)]
pub struct QaSet {
    /// Distinct documents, sorted.
    pub docs: Vec<String>,
    /// Answerable questions, in file order.
    pub questions: Vec<QaQuestion>,
    /// The file read.
    pub path: PathBuf,
    /// SHA-256 of the file.
    pub sha256: String,
}

#[derive(Deserialize)]
struct Squad {
    data: Vec<SquadArticle>,
}

#[derive(Deserialize)]
struct SquadArticle {
    paragraphs: Vec<SquadParagraph>,
}

#[derive(Deserialize)]
struct SquadParagraph {
    context: String,
    qas: Vec<SquadQa>,
}

#[derive(Deserialize)]
struct SquadQa {
    question: String,
    answers: Vec<SquadAnswer>,
    #[serde(default)]
    is_impossible: bool,
}

#[derive(Deserialize)]
struct SquadAnswer {
    text: String,
}

#[derive(Deserialize)]
struct HotpotEntry {
    question: String,
    answer: String,
    context: Vec<(String, Vec<String>)>,
    #[serde(default)]
    supporting_facts: Vec<(String, serde_json::Value)>,
}

/// Sorted distinct documents and each one's index.
fn index_docs<'a>(all: impl Iterator<Item = &'a String>) -> (Vec<String>, HashMap<String, usize>) {
    let docs: Vec<String> = all.cloned().collect::<BTreeSet<_>>().into_iter().collect();
    let at = docs
        .iter()
        .enumerate()
        .map(|(i, d)| (d.clone(), i))
        .collect();
    (docs, at)
}

impl QaSet {
    /// Reads `source`'s file from `dir` (see [`QaSource::find`]).
    pub fn read(source: QaSource, dir: &Path) -> Result<QaSet, QaError> {
        let path = source.find(dir)?;
        let bad = |reason: String| QaError {
            path: path.clone(),
            reason,
        };
        let raw = rsd_common::safe_fs::read_text(&path, QA_FILE_LIMIT, "QA file")
            .map_err(|e| bad(e.to_string()))?;
        let json_err = |e: serde_json::Error| {
            bad(format!(
                "{}; expected {} in its published format ({})",
                crate::lines::json_message(&e),
                source.published_name(),
                source.url()
            ))
        };
        let (docs, questions) = match source {
            QaSource::Squad => {
                let squad: Squad = serde_json::from_str(&raw).map_err(json_err)?;
                squad_questions(&squad)
            }
            QaSource::HotpotQa => {
                let entries: Vec<HotpotEntry> = serde_json::from_str(&raw).map_err(json_err)?;
                hotpot_questions(&entries)
            }
        };
        if questions.is_empty() {
            return Err(bad("no answerable question in the file".into()));
        }
        Ok(QaSet {
            docs,
            questions,
            path: path.clone(),
            sha256: rsd_common::digest::sha256_hex(raw.as_bytes()),
        })
    }
}

fn squad_questions(squad: &Squad) -> (Vec<String>, Vec<QaQuestion>) {
    let paragraphs = || squad.data.iter().flat_map(|a| &a.paragraphs);
    let (docs, at) = index_docs(paragraphs().map(|p| &p.context));
    let mut questions = Vec::new();
    for article in &squad.data {
        let article_docs: Vec<usize> = article.paragraphs.iter().map(|p| at[&p.context]).collect();
        for p in &article.paragraphs {
            let own = at[&p.context];
            for qa in p.qas.iter().filter(|q| !q.is_impossible) {
                questions.push(QaQuestion {
                    query: qa.question.clone(),
                    outputs: qa.answers.iter().map(|a| a.text.clone()).collect(),
                    context: vec![own],
                    evidence: vec![own],
                    more_context: article_docs.iter().copied().filter(|&d| d != own).collect(),
                });
            }
        }
    }
    (docs, questions)
}

fn hotpot_doc(title: &str, sentences: &[String]) -> String {
    format!("{title}\n{}", sentences.concat())
}

fn hotpot_questions(entries: &[HotpotEntry]) -> (Vec<String>, Vec<QaQuestion>) {
    let all: Vec<String> = entries
        .iter()
        .flat_map(|e| e.context.iter().map(|(t, s)| hotpot_doc(t, s)))
        .collect();
    let (docs, at) = index_docs(all.iter());
    let questions = entries
        .iter()
        .map(|e| {
            let context: Vec<usize> = e
                .context
                .iter()
                .map(|(t, s)| at[&hotpot_doc(t, s)])
                .collect();
            let supporting: Vec<usize> = e
                .context
                .iter()
                .filter(|(t, _)| e.supporting_facts.iter().any(|(st, _)| st == t))
                .map(|(t, s)| at[&hotpot_doc(t, s)])
                .collect();
            QaQuestion {
                query: e.question.clone(),
                outputs: vec![e.answer.clone()],
                evidence: if supporting.is_empty() {
                    context.clone()
                } else {
                    supporting
                },
                context,
                more_context: Vec::new(),
            }
        })
        .collect();
    (docs, questions)
}

/// The QA sets a run reads, each loaded only when its task runs.
#[derive(Debug, Clone, Default)]
pub struct QaData {
    /// SQuAD (qa_1).
    pub squad: Option<QaSet>,
    /// HotpotQA (qa_2).
    pub hotpotqa: Option<QaSet>,
}

impl QaData {
    /// The set `source` names, if loaded.
    pub fn get(&self, source: QaSource) -> Option<&QaSet> {
        match source {
            QaSource::Squad => self.squad.as_ref(),
            QaSource::HotpotQa => self.hotpotqa.as_ref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn squad_is_read_as_ruler_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let squad = r#"{"version": "v2.0", "data": [
          {"title": "A", "paragraphs": [
            {"context": "b para", "qas": [
              {"question": "q1?", "id": "1", "answers": [{"text": "x", "answer_start": 0}, {"text": "x", "answer_start": 0}], "is_impossible": false},
              {"question": "q2?", "id": "2", "answers": [], "plausible_answers": [{"text": "y", "answer_start": 0}], "is_impossible": true}]},
            {"context": "a para", "qas": [
              {"question": "q3?", "id": "3", "answers": [{"text": "z", "answer_start": 0}], "is_impossible": false}]}]},
          {"title": "B", "paragraphs": [
            {"context": "c para", "qas": []},
            {"context": "a para", "qas": []}]}]}"#;
        write(dir.path(), "squad.json", squad);
        let set = QaSet::read(QaSource::Squad, dir.path()).unwrap();
        assert_eq!(set.docs, ["a para", "b para", "c para"]);
        assert_eq!(set.questions.len(), 2);
        assert_eq!(set.questions[0].query, "q1?");
        assert_eq!(set.questions[0].outputs, ["x", "x"]);
        assert_eq!(set.questions[0].context, [1]);
        assert_eq!(set.questions[0].more_context, [0]);
        assert_eq!(set.questions[1].context, [0]);
        assert_eq!(set.questions[1].more_context, [1]);
    }

    #[test]
    fn hotpotqa_documents_are_title_newline_sentences() {
        let dir = tempfile::tempdir().unwrap();
        let hotpot = r#"[{"_id": "1", "question": "q?", "answer": "yes",
            "supporting_facts": [["T2", 0]],
            "context": [["T1", ["One. ", "Two."]], ["T2", ["Three."]]], "type": "comparison", "level": "hard"}]"#;
        write(dir.path(), "hotpot_dev_distractor_v1.json", hotpot);
        let set = QaSet::read(QaSource::HotpotQa, dir.path()).unwrap();
        assert_eq!(set.docs, ["T1\nOne. Two.", "T2\nThree."]);
        assert_eq!(set.questions[0].context, [0, 1]);
        assert_eq!(set.questions[0].evidence, [1]);
        assert_eq!(set.questions[0].outputs, ["yes"]);
    }

    #[test]
    fn missing_and_malformed_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let e = QaSet::read(QaSource::Squad, dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("squad.json") && e.contains(SQUAD_URL), "{e}");
        write(
            dir.path(),
            "squad.json",
            r#"{"data": [{"paragraphs": [{"qas": []}]}]}"#,
        );
        let e = QaSet::read(QaSource::Squad, dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("missing field `context`") && e.contains("line 1"),
            "{e}"
        );
        write(dir.path(), "squad.json", r#"{"data": []}"#);
        let e = QaSet::read(QaSource::Squad, dir.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("no answerable question"), "{e}");
    }
}
