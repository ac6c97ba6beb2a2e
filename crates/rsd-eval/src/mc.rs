//! `rsd-eval mc`: short-context multiple choice by log-likelihood, as lm-evaluation-harness
//! scores MMLU, HellaSwag, WinoGrande and OpenBookQA zero-shot (the "no short-context regression"
//! table of long-context papers), from the datasets' published files.
//!
//! Each question becomes one teacher-forced item: a context and one continuation per choice
//! (WinoGrande: one context per choice and a shared continuation, lm-eval's partial scoring).
//! `acc` ranks the choices by summed log-probability; `acc_norm` by log-probability per
//! character of the choice (lm-eval's `acc_norm`), reported for HellaSwag and OpenBookQA as
//! lm-eval reports it. Both take the first of equal maxima, as lm-eval's `np.argmax` does.
//!
//! Tokenization follows lm-eval's `_encode_pair` (hf backend): whitespace ending the context
//! moves to the front of the continuation, the context and the context plus continuation are
//! tokenized without special tokens, and the continuation's tokens are the latter's beyond the
//! former's length.
use std::path::{Path, PathBuf};

use rsd_common::printable::shortened;
use rsd_common::pyrandom::{PyRandom, PyRandomError};

use rsd_model::cli::{DeviceArgs, ModelDirArgs};
use rsd_model::generate::TextTokenizer;
use rsd_model::{Model, ModelConfig, RopeScaling};
use serde::{Deserialize, Serialize};

use crate::error::{io_err, EvalError};
use crate::items::{candidate_scores, ScoreReport, ScoreSettings, UserItem};
use crate::results::{item_key, read_results, ItemResult};

/// What a published file can go wrong with.
#[derive(Debug, thiserror::Error)]
#[error("{path}{}: {reason}", line.map(|l| format!(":{l}")).unwrap_or_default())]
pub struct McError {
    /// The file.
    pub path: PathBuf,
    /// 1-based line (or CSV record), where one applies.
    pub line: Option<usize>,
    /// What is wrong and what was expected.
    pub reason: String,
}

/// A benchmark `rsd-eval mc` reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum McTask {
    /// MMLU (Hendrycks et al.): the published `data/test/SUBJECT_test.csv` files (question,
    /// A, B, C, D, answer letter; no header), a directory of them or one file.
    Mmlu,
    /// HellaSwag: `hellaswag_val.jsonl` (activity_label, ctx_a, ctx_b, endings, label).
    Hellaswag,
    /// WinoGrande: `dev.jsonl` (sentence with one `_`, option1, option2, answer "1" or "2").
    Winogrande,
    /// OpenBookQA: `Main/test.jsonl` (question.stem, question.choices[label, text], answerKey)
    /// or the Hugging Face layout (question_stem, choices.text, choices.label, answerKey).
    Openbookqa,
}

impl McTask {
    /// The name used in results.
    pub fn name(self) -> &'static str {
        match self {
            McTask::Mmlu => "mmlu",
            McTask::Hellaswag => "hellaswag",
            McTask::Winogrande => "winogrande",
            McTask::Openbookqa => "openbookqa",
        }
    }

    /// Whether lm-eval reports `acc_norm` for the task.
    pub fn reports_acc_norm(self) -> bool {
        matches!(self, McTask::Hellaswag | McTask::Openbookqa)
    }
}

/// One question, as text.
#[derive(Debug, Clone, PartialEq)]
pub struct McQuestion {
    /// Where it came from (file and line, or file and record), for error messages.
    pub origin: String,
    /// Text before any few-shot examples (MMLU's "The following are multiple choice questions
    /// (with answers) about SUBJECT." and a blank line; empty for the others).
    pub description: String,
    /// Examples of the same group (MMLU: the subject) share a few-shot set.
    pub group: String,
    /// One context shared by every choice, or one per choice (after the description).
    pub contexts: Vec<String>,
    /// One continuation per choice (its leading space included); with one context per choice,
    /// all the same.
    pub continuations: Vec<String>,
    /// The choices' texts without the leading space: what `acc_norm` divides by (in characters).
    pub choices: Vec<String>,
    /// The index of the right choice.
    pub gold: usize,
}

/// Reads `path` in `task`'s published format.
pub fn read(task: McTask, path: &Path) -> Result<Vec<McQuestion>, McError> {
    let qs = match task {
        McTask::Mmlu => read_mmlu(path)?,
        McTask::Hellaswag => read_jsonl(path, hellaswag)?,
        McTask::Winogrande => read_jsonl(path, winogrande)?,
        McTask::Openbookqa => read_jsonl(path, openbookqa)?,
    };
    if qs.is_empty() {
        return Err(McError {
            path: path.to_path_buf(),
            line: None,
            reason: format!("no {} questions", task.name()),
        });
    }
    Ok(qs)
}

/// The largest benchmark file read (MMLU's test set is about 8 MB in all, HellaSwag's validation
/// set 10 MB; a file is parsed whole).
pub const MAX_BENCHMARK_FILE_BYTES: u64 = 256 << 20;

fn read_text(path: &Path) -> Result<String, McError> {
    rsd_common::safe_fs::read_text(path, MAX_BENCHMARK_FILE_BYTES, "benchmark file").map_err(|e| {
        McError {
            path: path.to_path_buf(),
            line: None,
            reason: e.to_string(),
        }
    })
}

fn read_jsonl(
    path: &Path,
    parse: fn(&str) -> Result<McQuestion, String>,
) -> Result<Vec<McQuestion>, McError> {
    let text = read_text(path)?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut q = parse(line).map_err(|reason| McError {
            path: path.to_path_buf(),
            line: Some(i + 1),
            reason,
        })?;
        q.origin = format!("{}:{}", path.display(), i + 1);
        out.push(q);
    }
    Ok(out)
}

fn json<'a, T: Deserialize<'a>>(line: &'a str, expected: &str) -> Result<T, String> {
    serde_json::from_str(line)
        .map_err(|e| format!("{}; expected {expected}", crate::lines::json_message(&e)))
}

/// lm-eval's HellaSwag text cleanup: WikiHow's bracketed artefacts go, " [title]" becomes a
/// sentence break, double spaces become one.
fn hellaswag_clean(text: &str) -> String {
    let text = text.trim().replace(" [title]", ". ");
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(open) = rest.find('[') {
        match rest[open..].find(']') {
            Some(close) => {
                out.push_str(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    out.push_str(rest);
    out.replace("  ", " ")
}

/// Python's `str.capitalize`: the first character upper case, the rest lower case.
fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first
            .to_uppercase()
            .chain(chars.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

fn hellaswag(line: &str) -> Result<McQuestion, String> {
    #[derive(Deserialize)]
    struct Row {
        activity_label: String,
        ctx_a: String,
        ctx_b: String,
        endings: Vec<String>,
        label: serde_json::Value,
    }
    let r: Row = json(
        line,
        "HellaSwag's {\"activity_label\", \"ctx_a\", \"ctx_b\", \"endings\": [4 strings], \"label\"}",
    )?;
    let gold = label_index(&r.label, r.endings.len())?;
    let query = hellaswag_clean(&format!(
        "{}: {} {}",
        r.activity_label,
        r.ctx_a,
        capitalize(&r.ctx_b)
    ));
    let choices: Vec<String> = r.endings.iter().map(|e| hellaswag_clean(e)).collect();
    Ok(McQuestion {
        origin: String::new(),
        description: String::new(),
        group: String::new(),
        contexts: vec![query],
        continuations: choices.iter().map(|c| format!(" {c}")).collect(),
        choices,
        gold,
    })
}

/// A label given as a number or a string of digits, within `n` choices.
fn label_index(v: &serde_json::Value, n: usize) -> Result<usize, String> {
    let i = match v {
        serde_json::Value::Number(x) => x.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    };
    match i {
        Some(i) if (i as usize) < n => Ok(i as usize),
        _ => Err(format!(
            "\"label\" {} is not a choice index below {n}",
            shortened(&v.to_string())
        )),
    }
}

fn winogrande(line: &str) -> Result<McQuestion, String> {
    #[derive(Deserialize)]
    struct Row {
        sentence: String,
        option1: String,
        option2: String,
        answer: String,
    }
    let r: Row = json(
        line,
        "WinoGrande's {\"sentence\" (with one _), \"option1\", \"option2\", \"answer\": \"1\"|\"2\"}",
    )?;
    let blank = r
        .sentence
        .find('_')
        .ok_or("\"sentence\" has no _ to fill in")?;
    let gold = match r.answer.as_str() {
        "1" => 0,
        "2" => 1,
        other => {
            return Err(format!(
                "\"answer\" is \"{}\", expected \"1\" or \"2\"",
                shortened(other)
            ))
        }
    };
    // lm-eval's partial scoring: the sentence up to the blank with each option as the context,
    // the rest of the sentence as the shared continuation.
    let rest = format!(" {}", r.sentence[blank + 1..].trim());
    let options = [r.option1, r.option2];
    Ok(McQuestion {
        origin: String::new(),
        description: String::new(),
        group: String::new(),
        contexts: options
            .iter()
            .map(|o| format!("{}{o}", &r.sentence[..blank]))
            .collect(),
        continuations: vec![rest.clone(), rest],
        choices: options.to_vec(),
        gold,
    })
}

fn openbookqa(line: &str) -> Result<McQuestion, String> {
    #[derive(Deserialize)]
    struct Choice {
        text: String,
        label: String,
    }
    #[derive(Deserialize)]
    struct Question {
        stem: String,
        choices: Vec<Choice>,
    }
    #[derive(Deserialize)]
    struct HfChoices {
        text: Vec<String>,
        label: Vec<String>,
    }
    #[derive(Deserialize)]
    struct Row {
        #[serde(default)]
        question: Option<Question>,
        #[serde(default)]
        question_stem: Option<String>,
        #[serde(default)]
        choices: Option<HfChoices>,
        #[serde(rename = "answerKey")]
        answer_key: String,
    }
    let expected = "OpenBookQA's {\"question\": {\"stem\", \"choices\": [{\"text\", \"label\"}]}, \
                    \"answerKey\"} (or question_stem, choices.text, choices.label)";
    let r: Row = json(line, expected)?;
    let (stem, texts, labels) = match (r.question, r.question_stem, r.choices) {
        (Some(q), _, _) => (
            q.stem,
            q.choices.iter().map(|c| c.text.clone()).collect::<Vec<_>>(),
            q.choices.into_iter().map(|c| c.label).collect::<Vec<_>>(),
        ),
        (None, Some(stem), Some(c)) => (stem, c.text, c.label),
        _ => return Err(format!("no question; expected {expected}")),
    };
    let gold = labels
        .iter()
        .position(|l| l == r.answer_key.trim_start())
        .ok_or_else(|| {
            format!(
                "\"answerKey\" \"{}\" is none of the labels {}",
                shortened(&r.answer_key),
                shortened(&format!("{labels:?}"))
            )
        })?;
    Ok(McQuestion {
        origin: String::new(),
        description: String::new(),
        group: String::new(),
        contexts: vec![stem],
        continuations: texts.iter().map(|t| format!(" {t}")).collect(),
        choices: texts,
        gold,
    })
}

impl McQuestion {
    /// The question as a few-shot example: its (right) context, its right continuation and a
    /// blank line, as lm-eval joins examples.
    fn as_example(&self) -> String {
        let ctx = &self.contexts[if self.contexts.len() > 1 {
            self.gold
        } else {
            0
        }];
        format!("{ctx}{}\n\n", self.continuations[self.gold])
    }

    /// The contexts as scored: the description, `examples`, then each context.
    pub fn full_contexts(&self, examples: &[&McQuestion]) -> Vec<String> {
        let shots: String = examples.iter().map(|e| e.as_example()).collect();
        self.contexts
            .iter()
            .map(|c| format!("{}{shots}{c}", self.description))
            .collect()
    }
}

/// Whether two questions are the same document, as lm-eval compares few-shot documents with
/// the one evaluated (`x != doc`): the same group, prompt, choices and answer.
fn same_doc(a: &McQuestion, b: &McQuestion) -> bool {
    a.group == b.group
        && a.contexts == b.contexts
        && a.continuations == b.continuations
        && a.gold == b.gold
}

/// How many few-shot questions lm-eval draws for one evaluated question: `k + 1` when the
/// task's few-shot split is its test split (`fewshot_split == test_split` in its config; for
/// HellaSwag and WinoGrande neither is set, so both are `None` and equal), or here when the
/// few-shot file is the evaluated file itself (`same_split`); else `k` (MMLU: dev vs test;
/// OpenBookQA: unset vs test).
pub fn drawn_for(task: McTask, k: usize, same_split: bool) -> usize {
    let plus_one = same_split || matches!(task, McTask::Hellaswag | McTask::Winogrande);
    if plus_one {
        k + 1
    } else {
        k
    }
}

/// `q`'s few-shot examples from `pool`, as lm-eval's `ContextSampler.get_context` picks them:
/// `drawn` questions of `q`'s group, then any equal to `q` dropped (`x != doc`) and at most `k`
/// kept. Which `drawn`: MMLU's `first_n` sampler takes the first of the subject's dev questions
/// (`rng` is `None`); the other tasks' default sampler draws `rng.sample(pool, drawn)`, one call
/// per evaluated question in file order on one generator seeded once for the task (lm-eval's
/// `random.Random(fewshot_random_seed)`, 1234 by default), so question `i`'s examples depend on
/// the draws before it exactly as in lm-eval. A question equal to `q` is dropped without a
/// replacement, so `q` may get fewer than `k` examples, as in lm-eval.
pub fn examples_for<'a>(
    q: &McQuestion,
    pool: &'a [McQuestion],
    k: usize,
    drawn: usize,
    rng: Option<&mut PyRandom>,
) -> Result<Vec<&'a McQuestion>, PyRandomError> {
    let group: Vec<&McQuestion> = pool.iter().filter(|e| e.group == q.group).collect();
    let picked: Vec<&McQuestion> = match rng {
        None => group.into_iter().take(drawn).collect(),
        Some(rng) => rng
            .sample(group.len(), drawn)?
            .into_iter()
            .map(|i| group[i])
            .collect(),
    };
    Ok(picked
        .into_iter()
        .filter(|e| !same_doc(e, q))
        .take(k)
        .collect())
}

/// MMLU's subject from a file name: `high_school_biology_test.csv` → "high school biology".
fn mmlu_subject(path: &Path) -> String {
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let stem = ["_test", "_val", "_dev"]
        .iter()
        .find_map(|s| stem.strip_suffix(s))
        .unwrap_or(stem);
    stem.replace('_', " ")
}

fn read_mmlu(path: &Path) -> Result<Vec<McQuestion>, McError> {
    let files: Vec<PathBuf> = if path.is_dir() {
        // The published layout: data/test/SUBJECT_test.csv (a directory above `test` works too).
        let dir = if path.join("test").is_dir() {
            path.join("test")
        } else {
            path.to_path_buf()
        };
        let mut f: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| McError {
                path: dir.clone(),
                line: None,
                reason: e.to_string(),
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "csv"))
            .collect();
        f.sort();
        if f.is_empty() {
            return Err(McError {
                path: dir,
                line: None,
                reason: "no *.csv files (expected MMLU's data/test/SUBJECT_test.csv)".into(),
            });
        }
        f
    } else {
        vec![path.to_path_buf()]
    };
    let mut out = Vec::new();
    for file in files {
        let subject = mmlu_subject(&file);
        let text = read_text(&file)?;
        let mut reader = csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(text.as_bytes());
        for (i, rec) in reader.records().enumerate() {
            let bad = |reason: String| McError {
                path: file.clone(),
                line: Some(i + 1),
                reason,
            };
            let rec = rec.map_err(|e| bad(format!("not CSV: {e}")))?;
            if rec.len() != 6 {
                return Err(bad(format!(
                    "{} fields; expected 6: question, A, B, C, D, answer letter",
                    rec.len()
                )));
            }
            let letters = ["A", "B", "C", "D"];
            let gold = letters
                .iter()
                .position(|l| *l == rec[5].trim())
                .ok_or_else(|| {
                    bad(format!(
                        "answer \"{}\" is not A, B, C or D",
                        shortened(&rec[5])
                    ))
                })?;
            let context = format!(
                "{}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:",
                rec[0].trim(),
                &rec[1],
                &rec[2],
                &rec[3],
                &rec[4]
            );
            out.push(McQuestion {
                origin: format!("{}:{}", file.display(), i + 1),
                description: format!(
                    "The following are multiple choice questions (with answers) about {subject}.\n\n"
                ),
                group: subject.clone(),
                contexts: vec![context],
                continuations: letters.iter().map(|l| format!(" {l}")).collect(),
                choices: letters.iter().map(|l| l.to_string()).collect(),
                gold,
            });
        }
    }
    Ok(out)
}

const MC_HELP: &str = "Zero-shot, as lm-evaluation-harness scores these tasks: MMLU's prompt \
(\"The following are multiple choice questions (with answers) about SUBJECT.\" … \"Answer:\", \
choices \" A\" … \" D\"), HellaSwag's cleaned activity and context with each ending, \
WinoGrande's sentence up to the blank with each option and the rest of the sentence scored, \
OpenBookQA's question stem with each answer. Context and choice are tokenized as lm-eval's \
_encode_pair does (whitespace ending the context moves to the choice; no BOS unless \
--add-bos-token). Results go to RUN/results.jsonl (one line per question: acc as score, \
acc_norm as score_norm, every choice's log-likelihood as choice_logprobs) and RUN/summary.md; \
a rerun skips the questions already scored. See docs/EVAL.md.";

/// Arguments of `rsd-eval mc`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = MC_HELP)]
pub struct McArgs {
    /// The benchmark.
    #[arg(long, value_enum)]
    pub task: McTask,
    /// Its published file (MMLU: a directory of SUBJECT_test.csv, or its parent, or one file).
    #[arg(long, value_name = "PATH")]
    pub data: PathBuf,
    /// --model.
    #[command(flatten)]
    pub checkpoint: ModelDirArgs,
    /// Run directory (run.json, results.jsonl, summary.json, summary.md).
    #[arg(long)]
    pub out: PathBuf,
    /// Score only the first N questions (a quick check; run.json says how many were scored).
    #[arg(long)]
    pub limit: Option<usize>,
    /// Few-shot examples before each question (lm-eval's --num_fewshot; 0 is zero-shot), each
    /// with its right answer, separated by blank lines: MMLU the first K of the subject's dev
    /// questions, the others K drawn from --fewshot-data as lm-eval draws them (--fewshot-seed).
    #[arg(long, default_value_t = 0)]
    pub fewshot: usize,
    /// Where the few-shot examples come from, in the same published format (MMLU: the
    /// directory of SUBJECT_dev.csv files; the others: a training or validation file).
    #[arg(long, value_name = "PATH")]
    pub fewshot_data: Option<PathBuf>,
    /// Seed of the few-shot draw for HellaSwag, WinoGrande and OpenBookQA (lm-eval's
    /// --fewshot_random_seed, 1234 by default): one generator for the whole file, a draw per
    /// question in file order, as lm-eval's sampler draws them. MMLU takes the first K.
    #[arg(long, default_value_t = 1234)]
    pub fewshot_seed: u64,
    /// Choices per forward batch (does not change the scores).
    #[arg(long, default_value_t = 8)]
    pub batch_size: usize,
    /// Tokenize with the tokenizer's special tokens (its BOS), as lm-eval's model argument
    /// `add_bos_token=True` does; by default none are added, as lm-eval adds none.
    #[arg(long)]
    pub add_bos_token: bool,
    /// --device, --dtype.
    #[command(flatten)]
    pub runtime: DeviceArgs,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// SHA-256 of a file, or of a directory's files in name order.
fn sha256_of(path: &Path) -> crate::error::Result<String> {
    if !path.is_dir() {
        return crate::run::sha256_file(path);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(crate::error::io_err(path))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    files.sort();
    let mut all = String::new();
    for f in files.iter().filter(|f| f.is_file()) {
        all.push_str(&crate::run::sha256_file(f)?);
    }
    if path.join("test").is_dir() {
        all.push_str(&sha256_of(&path.join("test"))?);
    }
    Ok(rsd_common::digest::sha256_hex(all.as_bytes()))
}

/// Python's `str.isspace`, which `str.rstrip()` strips: Unicode whitespace and the ASCII
/// separators U+001C to U+001F, which Rust's `char::is_whitespace` leaves out.
fn is_python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// lm-eval's `_encode_pair(context, continuation)` (hf backend, causal model): whitespace
/// ending `context` moves to the front of `continuation`; `context` and `context +
/// continuation` are tokenized without special tokens (lm-eval's `tok_encode` for causal models
/// adds none unless asked to with `add_bos_token`, passed here as it is); the continuation's
/// tokens are the whole's beyond the context's length, even where a merge crosses the boundary.
/// Returns (context tokens, continuation tokens).
pub fn encode_pair(
    tok: &TextTokenizer,
    context: &str,
    continuation: &str,
    add_bos_token: bool,
) -> rsd_model::Result<(Vec<i64>, Vec<i64>)> {
    let kept = context.trim_end_matches(is_python_space);
    let continuation = format!("{}{continuation}", &context[kept.len()..]);
    let whole = tok.encode(&format!("{kept}{continuation}"), add_bos_token)?;
    let context_enc = tok.encode(kept, add_bos_token)?;
    let continuation_enc = whole.get(context_enc.len()..).unwrap_or_default().to_vec();
    Ok((context_enc, continuation_enc))
}

/// `rsd-eval mc`: reads the benchmark, tokenizes each question's contexts and choices as
/// lm-eval does ([`encode_pair`]), and scores them by teacher forcing.
pub fn command(a: &McArgs) -> crate::error::Result<ScoreReport> {
    if a.batch_size == 0 {
        return Err(EvalError::Input("--batch-size must be at least 1".into()));
    }
    let mut questions = read(a.task, &a.data).map_err(|e| EvalError::Input(e.to_string()))?;
    if let Some(n) = a.limit {
        questions.truncate(n);
    }
    let pool = match (a.fewshot, &a.fewshot_data) {
        (0, _) => Vec::new(),
        (_, Some(p)) => read(a.task, p).map_err(|e| EvalError::Input(e.to_string()))?,
        (_, None) => {
            return Err(EvalError::Input(
                "--fewshot needs --fewshot-data PATH (MMLU: its dev directory)".into(),
            ))
        }
    };
    // lm-eval drops the evaluated question from its examples only when they come from the
    // split it evaluates: here, when --fewshot-data is --data itself.
    let same_split = match &a.fewshot_data {
        Some(p) if a.fewshot > 0 => {
            std::fs::canonicalize(p).map_err(io_err(p))?
                == std::fs::canonicalize(&a.data).map_err(io_err(&a.data))?
        }
        _ => false,
    };
    crate::run::check_model_files(&a.checkpoint.model)?;
    let tok = TextTokenizer::from_file(&a.checkpoint.model.join("tokenizer.json"))?;
    let cfg = ModelConfig::from_dir(&a.checkpoint.model)?;
    rsd_model::checkpoint::safetensors_files(&a.checkpoint.model)?;
    // One generator for the task, drawn from once per question in order (lm-eval's sampler);
    // MMLU's first_n sampler draws nothing.
    let mut rng = (a.task != McTask::Mmlu).then(|| PyRandom::new(a.fewshot_seed));
    let drawn = drawn_for(a.task, a.fewshot, same_split);
    let mut items = Vec::with_capacity(questions.len());
    for (i, q) in questions.iter().enumerate() {
        let examples = if a.fewshot == 0 {
            Vec::new()
        } else {
            fewshot_examples(a, q, &pool, drawn, rng.as_mut())?
        };
        items.push(user_item(a, &tok, i, q, &examples)?);
    }
    // One length bucket per benchmark: its longest prompt, rounded up to a power of two.
    let bucket = items
        .iter()
        .map(|it| prompt_tokens(it).1)
        .max()
        .unwrap_or(1)
        .next_power_of_two();
    for it in &mut items {
        it.length = bucket;
    }
    score_items(a, &cfg, &items)
}

/// An item's longest context and its longest context plus continuation, in tokens.
fn prompt_tokens(it: &UserItem) -> (usize, usize) {
    let contexts = it.per_candidate.as_ref();
    let mut longest_context = it.ids.len();
    let mut longest = 0;
    for (j, cont) in it.continuations.iter().enumerate() {
        let ctx = contexts
            .and_then(|c| c.get(j))
            .map_or(it.ids.len(), Vec::len);
        longest_context = longest_context.max(ctx);
        longest = longest.max(ctx + cont.len());
    }
    (longest_context, longest)
}

/// One question's line in results.jsonl: the fields of every teacher-forced result, and every
/// choice's log-likelihood (and, where acc_norm is reported, its per-character form), so that
/// a user can audit the score choice by choice.
#[derive(Serialize)]
struct McResult<'a> {
    #[serde(flatten)]
    result: &'a ItemResult,
    /// Each choice's summed log-probability, in the file's order.
    choice_logprobs: Vec<f64>,
    /// Each choice's log-probability divided by its length in characters (acc_norm's ranking).
    #[serde(skip_serializing_if = "Option::is_none")]
    choice_logprobs_norm: Option<Vec<f64>>,
}

/// The index of the first of the largest values, as `np.argmax` picks it (0 for none).
fn first_argmax(values: &[f64]) -> usize {
    (0..values.len()).fold(0, |best, j| if values[j] > values[best] { j } else { best })
}

/// Scores one question: every choice's log-likelihood, acc (the right choice is the first
/// maximum) and, with `norm_chars`, acc_norm (the same per character).
fn score_question(
    model: &Model,
    it: &UserItem,
    batch_size: usize,
) -> crate::error::Result<(ItemResult, Vec<f64>, Option<Vec<f64>>)> {
    let scores = candidate_scores(model, it, batch_size)?;
    let lls: Vec<f64> = scores.iter().map(|s| s.logprob).collect();
    let gold = it.gold;
    let best = first_argmax(&lls);
    // The rank the first-maximum rule gives: choices scoring higher, or as high and earlier,
    // come first.
    let rank = 1
        + (0..lls.len())
            .filter(|&j| lls[j] > lls[gold] || (lls[j] == lls[gold] && j < gold))
            .count();
    let norm = it.norm_chars.as_ref().map(|chars| {
        lls.iter()
            .zip(chars)
            .map(|(ll, &n)| ll / n.max(1) as f64)
            .collect::<Vec<f64>>()
    });
    let score_norm = norm.as_ref().map(|per_char| {
        if first_argmax(per_char) == gold {
            1.0
        } else {
            0.0
        }
    });
    let result = ItemResult {
        task: it.task.clone(),
        length: it.length,
        depth: it.depth,
        sample: it.line,
        expected: vec![it.candidates[gold].clone()],
        output: it.candidates[best].clone(),
        score: if best == gold { 1.0 } else { 0.0 },
        prompt_tokens: prompt_tokens(it).0,
        logprob: Some(lls[gold]),
        rank: Some(rank),
        candidates: Some(it.candidates.len()),
        greedy: Some(scores[gold].greedy),
        score_norm,
    };
    Ok((result, lls, norm))
}

/// Scores `items` into `a.out` (run.json, results.jsonl, summaries), skipping the questions
/// already there; refuses a run directory made with other settings.
fn score_items(
    a: &McArgs,
    cfg: &ModelConfig,
    items: &[UserItem],
) -> crate::error::Result<ScoreReport> {
    let model_dir = &a.checkpoint.model;
    if let Some(it) = items.iter().find(|it| {
        it.ids
            .iter()
            .chain(it.continuations.iter().flatten())
            .chain(it.per_candidate.iter().flatten().flatten())
            .any(|&t| t >= cfg.vocab_size)
    }) {
        return Err(EvalError::Input(format!(
            "{}: question {}: a token id is beyond the model's embedding ({} rows): the \
             tokenizer does not belong to this model",
            a.data.display(),
            it.line + 1,
            cfg.vocab_size
        )));
    }
    // lm-eval cuts a prompt longer than the model's window from the left; rsd refuses it, so
    // that a score never silently rests on a shortened question.
    if cfg.rope_scaling == RopeScaling::None {
        let max = cfg.max_position_embeddings as usize;
        if let Some(it) = items.iter().find(|it| prompt_tokens(it).1 > max) {
            return Err(EvalError::Input(format!(
                "{}: question {}: the prompt and its longest choice are {} tokens, beyond the \
                 model's max_position_embeddings {max} (lm-eval would cut the prompt from the \
                 left; rsd does not): use fewer --fewshot examples",
                a.data.display(),
                it.line + 1,
                prompt_tokens(it).1
            )));
        }
    }
    let abs = |p: &Path| std::fs::canonicalize(p).map_err(io_err(p));
    let settings = ScoreSettings {
        model: abs(model_dir)?.display().to_string(),
        tokenizer_sha256: crate::run::sha256_file(&model_dir.join("tokenizer.json"))?,
        items: abs(&a.data)?.display().to_string(),
        items_sha256: sha256_of(&a.data)?,
        benchmark: Some(benchmark_name(a)),
        dtype: a.runtime.dtype.clone(),
        rope_scaling: None,
        rope_theta: None,
        scoring: crate::run::Scoring::TeacherForced,
    };
    let options = a.runtime.options()?;
    std::fs::create_dir_all(&a.out).map_err(io_err(&a.out))?;
    let mut now = serde_json::to_value(&settings).map_err(|e| EvalError::Json {
        path: a.out.join("run.json"),
        reason: e.to_string(),
    })?;
    now["model_provenance"] = crate::run::model_provenance(model_dir)?;
    crate::run::settle_run_json(&a.out, &now, &a.runtime.device)?;

    let results_path = a.out.join("results.jsonl");
    let finished = crate::run::done_keys(&results_path)?;
    let mut results = crate::run::Results::open(&results_path)?;
    let pending: Vec<&UserItem> = items
        .iter()
        .filter(|it| !finished.contains(&item_key(&it.task, it.length, it.depth, it.line)))
        .collect();
    let skipped = items.len() - pending.len();
    if !pending.is_empty() {
        let model = crate::run::load_model(model_dir, options, None, None)?;
        let bar = crate::run::progress_bar(!a.quiet, items.len() as u64, skipped as u64);
        for it in &pending {
            let (result, choice_logprobs, choice_logprobs_norm) =
                score_question(&model, it, a.batch_size)?;
            results.append(&McResult {
                result: &result,
                choice_logprobs,
                choice_logprobs_norm,
            })?;
            bar.inc(1);
        }
        bar.finish_and_clear();
    }
    let all = read_results(&results_path)?;
    let summary = crate::run::Summary::of(&all, &[]);
    summary.write(&a.out)?;
    Ok(ScoreReport {
        total: items.len(),
        skipped,
        done: pending.len(),
        overall: summary.overall,
    })
}

/// `q`'s `a.fewshot` examples from `pool` (see [`examples_for`]), or an error naming the
/// question when the pool has fewer than the draw needs.
fn fewshot_examples<'a>(
    a: &McArgs,
    q: &McQuestion,
    pool: &'a [McQuestion],
    drawn: usize,
    rng: Option<&mut PyRandom>,
) -> crate::error::Result<Vec<&'a McQuestion>> {
    let available = pool.iter().filter(|e| e.group == q.group).count();
    // The first_n sampler takes what there is; a random draw of more than the pool is an error
    // in lm-eval too (Python's sample raises).
    let needed = if rng.is_some() { drawn } else { a.fewshot };
    if available < needed {
        let one_more = if needed > a.fewshot {
            format!(" (drawn as {needed}: lm-eval draws one more for this task)")
        } else {
            String::new()
        };
        return Err(EvalError::Input(format!(
            "{}: --fewshot {}{one_more} but --fewshot-data has {available} example(s){}",
            q.origin,
            a.fewshot,
            if q.group.is_empty() {
                String::new()
            } else {
                format!(" for \"{}\"", q.group)
            }
        )));
    }
    examples_for(q, pool, a.fewshot, drawn, rng).map_err(|e| EvalError::Input(e.to_string()))
}

/// Question `i` as an item to score: its contexts after its few-shot `examples`, and its
/// choices, tokenized as lm-eval tokenizes them (its length bucket is set later).
fn user_item(
    a: &McArgs,
    tok: &TextTokenizer,
    i: usize,
    q: &McQuestion,
    examples: &[&McQuestion],
) -> crate::error::Result<UserItem> {
    let full = q.full_contexts(examples);
    // One (context, continuation) pair per choice: the shared context, or the choice's own
    // (WinoGrande).
    let mut contexts = Vec::with_capacity(q.continuations.len());
    let mut continuations = Vec::with_capacity(q.continuations.len());
    for (j, cont) in q.continuations.iter().enumerate() {
        let ctx = if full.len() > 1 { &full[j] } else { &full[0] };
        let (ctx_enc, cont_enc) = encode_pair(tok, ctx, cont, a.add_bos_token)?;
        if ctx_enc.is_empty() {
            return Err(EvalError::Input(format!(
                "{}: the context has no tokens",
                q.origin
            )));
        }
        if cont_enc.is_empty() {
            return Err(EvalError::Input(format!(
                "{}: choice \"{}\" has no tokens",
                q.origin,
                shortened(&q.choices[j])
            )));
        }
        contexts.push(ctx_enc);
        continuations.push(cont_enc);
    }
    // The contexts differ only where each choice has its own (WinoGrande's partial scoring);
    // a shared context is prefilled once for every choice.
    let Some(first) = contexts.first().cloned() else {
        return Err(EvalError::Input(format!("{}: no choices", q.origin)));
    };
    let shared = contexts.iter().all(|c| *c == first);
    Ok(UserItem {
        line: i,
        task: a.task.name().to_string(),
        depth: None,
        length: 0,
        ids: first,
        candidates: q.choices.clone(),
        continuations,
        gold: q.gold,
        per_candidate: (!shared).then_some(contexts),
        norm_chars: a
            .task
            .reports_acc_norm()
            .then(|| q.choices.iter().map(|c| c.chars().count()).collect()),
    })
}

/// The benchmark as the summary names it: the task, how many questions, how many shots.
fn benchmark_name(a: &McArgs) -> String {
    format!(
        "{}{}{}{}",
        a.task.name(),
        match a.limit {
            Some(n) => format!(" (first {n})"),
            None => String::new(),
        },
        match (a.fewshot, a.task) {
            (0, _) => String::new(),
            (k, McTask::Mmlu) => format!(", {k}-shot"),
            // The seed picks the examples: part of the settings a rerun must match.
            (k, _) => format!(", {k}-shot, fewshot seed {}", a.fewshot_seed),
        },
        // Part of the settings a rerun must match: BOS changes every score.
        if a.add_bos_token {
            ", add_bos_token"
        } else {
            ""
        }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        (d, p)
    }

    #[test]
    fn hellaswag_is_cleaned_as_lm_eval_cleans_it() {
        assert_eq!(
            hellaswag_clean(" Fix a tire [title] Remove it. [step] Then  go [header]"),
            "Fix a tire. Remove it. Then go "
        );
        assert_eq!(capitalize("then THE man"), "Then the man");
        let row = r#"{"activity_label": "Roof shingle removal", "ctx_a": "A man is sitting on a roof.", "ctx_b": "he", "endings": ["is using wrap.", "starts pulling up roofing.", "is holding a rubik's cube.", "starts [title] over."], "label": 1}"#;
        let q = hellaswag(row).unwrap();
        assert_eq!(
            q.contexts,
            ["Roof shingle removal: A man is sitting on a roof. He"]
        );
        assert_eq!(q.continuations[1], " starts pulling up roofing.");
        assert_eq!(q.choices[3], "starts. over.");
        assert_eq!(q.gold, 1);
    }

    #[test]
    fn winogrande_scores_the_rest_of_the_sentence_after_each_option() {
        let q = winogrande(r#"{"qID": "x", "sentence": "Sarah was a much better surgeon than Maria so _ always got the harder cases.", "option1": "Sarah", "option2": "Maria", "answer": "1"}"#).unwrap();
        assert_eq!(
            q.contexts,
            [
                "Sarah was a much better surgeon than Maria so Sarah",
                "Sarah was a much better surgeon than Maria so Maria"
            ]
        );
        assert_eq!(q.continuations, [" always got the harder cases."; 2]);
        assert_eq!(q.gold, 0);
        let e = winogrande(
            r#"{"sentence": "no blank", "option1": "a", "option2": "b", "answer": "1"}"#,
        )
        .unwrap_err();
        assert!(e.contains("no _"), "{e}");
    }

    #[test]
    fn openbookqa_reads_both_layouts() {
        let published = r#"{"id": "7-980", "question": {"stem": "The sun is responsible for", "choices": [{"text": "puppies learning new tricks", "label": "A"}, {"text": "plants sprouting, blooming and wilting", "label": "B"}]}, "answerKey": "B"}"#;
        let hf = r#"{"id": "7-980", "question_stem": "The sun is responsible for", "choices": {"text": ["puppies learning new tricks", "plants sprouting, blooming and wilting"], "label": ["A", "B"]}, "answerKey": "B"}"#;
        let (a, b) = (openbookqa(published).unwrap(), openbookqa(hf).unwrap());
        assert_eq!(a, b);
        assert_eq!(a.contexts, ["The sun is responsible for"]);
        assert_eq!(
            a.continuations[1],
            " plants sprouting, blooming and wilting"
        );
        assert_eq!(a.gold, 1);
    }

    #[test]
    fn mmlu_csv_is_lm_evals_zero_shot_prompt() {
        let (_d, p) = file(
            "\"What is 2+2, \"\"roughly\"\"?\",3,4,5,6,B\n",
            "elementary_mathematics_test.csv",
        );
        let qs = read(McTask::Mmlu, &p).unwrap();
        assert_eq!(qs[0].full_contexts(&[])[0], "The following are multiple choice questions (with answers) about elementary mathematics.\n\nWhat is 2+2, \"roughly\"?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:");
        // Few-shot: the description once, each example answered, a blank line after each.
        let ex = McQuestion {
            contexts: vec!["Q0\nA. a\nB. b\nC. c\nD. d\nAnswer:".into()],
            gold: 2,
            ..qs[0].clone()
        };
        assert_eq!(
            qs[0].full_contexts(&[&ex])[0],
            "The following are multiple choice questions (with answers) about elementary mathematics.\n\nQ0\nA. a\nB. b\nC. c\nD. d\nAnswer: C\n\nWhat is 2+2, \"roughly\"?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:"
        );
        assert_eq!(qs[0].continuations, [" A", " B", " C", " D"]);
        assert_eq!(qs[0].gold, 1);
        let (_d, p) = file("q,1,2,3,4,E\n", "x_test.csv");
        let e = read(McTask::Mmlu, &p).unwrap_err().to_string();
        assert!(e.contains("x_test.csv:1") && e.contains("\"E\""), "{e}");
        let (_d, p) = file("{\"ctx_a\": 1}\n", "h.jsonl");
        let e = read(McTask::Hellaswag, &p).unwrap_err().to_string();
        assert!(
            e.contains("h.jsonl:1") && e.contains("activity_label"),
            "{e}"
        );
    }

    fn tokenizer() -> TextTokenizer {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../assets/tokenizers/mini-1k/tokenizer.json");
        TextTokenizer::from_file(&p).unwrap()
    }

    #[test]
    fn encode_pair_moves_trailing_whitespace_to_the_continuation() {
        let tok = tokenizer();
        let (ctx, cont) = encode_pair(&tok, "He starts the car. ", " Then he", false).unwrap();
        assert_eq!(ctx, tok.encode("He starts the car.", false).unwrap());
        let whole = tok.encode("He starts the car.  Then he", false).unwrap();
        assert_eq!([ctx.clone(), cont].concat(), whole);
        // Python's whitespace, which Rust's leaves out, moves too.
        let (ctx2, _) = encode_pair(&tok, "He starts the car.\u{1f}", " x", false).unwrap();
        assert_eq!(ctx2, ctx);
    }

    #[test]
    fn acc_takes_the_first_of_equal_maxima() {
        assert_eq!(first_argmax(&[-2.0, -1.0, -1.0, -3.0]), 1);
        assert_eq!(first_argmax(&[-1.0, -1.0]), 0);
    }

    #[test]
    fn fewshot_drops_the_question_itself_as_lm_eval_does() {
        let q = |c: &str| McQuestion {
            origin: String::new(),
            description: String::new(),
            group: "g".into(),
            contexts: vec![c.into()],
            continuations: vec![" A".into(), " B".into()],
            choices: vec!["A".into(), "B".into()],
            gold: 0,
        };
        let pool = [q("one"), q("two"), q("three")];
        let ctxs =
            |v: Vec<&McQuestion>| v.iter().map(|e| e.contexts[0].clone()).collect::<Vec<_>>();
        let first_n = |q: &McQuestion, drawn| examples_for(q, &pool, 2, drawn, None).unwrap();
        // Another split (MMLU's dev): the first k, the question itself dropped, not replaced.
        assert_eq!(ctxs(first_n(&q("one"), 2)), ["two"]);
        assert_eq!(ctxs(first_n(&q("x"), 2)), ["one", "two"]);
        // The evaluated split itself: k + 1 drawn, so k remain.
        assert_eq!(ctxs(first_n(&q("one"), 3)), ["two", "three"]);
        assert_eq!(ctxs(first_n(&q("x"), 3)), ["one", "two"]);
        assert_eq!(drawn_for(McTask::Mmlu, 2, false), 2);
        assert_eq!(drawn_for(McTask::Openbookqa, 2, false), 2);
        assert_eq!(drawn_for(McTask::Openbookqa, 2, true), 3);
        assert_eq!(drawn_for(McTask::Hellaswag, 2, false), 3);
        assert_eq!(drawn_for(McTask::Winogrande, 2, false), 3);
        // Random draws: Python's random.Random(1234).sample(range(3), 3) (PyRandom is checked
        // against CPython in its own tests), then the question itself dropped.
        let mut rng = PyRandom::new(1234);
        let want: Vec<String> = PyRandom::new(1234)
            .sample(3, 3)
            .unwrap()
            .into_iter()
            .map(|i| pool[i].contexts[0].clone())
            .filter(|c| c != "one")
            .take(2)
            .collect();
        assert_eq!(
            ctxs(examples_for(&q("one"), &pool, 2, 3, Some(&mut rng)).unwrap()),
            want
        );
    }
}
