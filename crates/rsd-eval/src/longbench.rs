//! `rsd-eval longbench`: LongBench v2 (Bai et al. 2024), 503 multiple-choice questions over
//! contexts of 8K to 2M words, from its published `data.json`, with its official prompts,
//! middle truncation, answer extraction and summary (`pred.py`, `result.py` of THUDM/LongBench).
//!
//! * Prompt: `prompts/0shot.txt` (or, with `--cot`, `0shot_cot.txt`, then `0shot_cot_ans.txt`
//!   with the reasoning in place of the document), `$DOC$`, `$Q$`, `$C_A$` … filled with the
//!   stripped fields.
//! * Truncation: a prompt of more than `--max-len` tokens (120,000 for the open models LongBench
//!   reports) keeps its first `max_len / 2` and last `ceil(max_len / 2)` tokens, decoded back to
//!   text; with `--chat-template` the text then becomes the user message.
//! * Answer: `*` removed, then the first `The correct answer is (X)`, else `The correct answer is X`,
//!   X in A–D; none: no answer (wrong).
//! * Summary: accuracy overall, by difficulty (easy, and hard for every other value) and by
//!   length (short, medium, and long for every other value), in percent to one decimal.
//!
//! Results go to `RUN/longbench.jsonl` in LongBench's own format (each item without its context,
//! plus `response`, `pred`, `judge`), so its `result.py` reads them, with rsd's `prompt_tokens`
//! and `truncated`. LongBench samples at temperature 0.1; rsd decodes greedily.
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rsd_model::cli::DeviceArgs;
use rsd_model::generate::{self as gen, GenerateOptions, TextTokenizer};
use rsd_model::Model;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{io_err, EvalError, Result};
use crate::lines::{json_message, LineError, Lines};
use crate::run::{check_model_files, progress_bar, settle_run_json, sha256_file, Results};
use rsd_chat::ChatTemplate;
use rsd_common::printable::shortened;

const ZERO_SHOT: &str = "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nFormat your response as follows: \"The correct answer is (insert answer here)\".";
const ZERO_SHOT_COT: &str = "Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nLet\u{2019}s think step by step:";
const ZERO_SHOT_COT_ANSWER: &str = "Please read the following text and answer the questions below.\n\nThe text is too long and omitted here.\n\nWhat is the correct answer to this question: $Q$\nChoices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\nLet\u{2019}s think step by step: $COT$\n\nBased on the above, what is the single, most likely answer choice? Format your response as follows: \"The correct answer is (insert answer here)\".";

const LONGBENCH_HELP: &str = "Reads LongBench v2's data.json (a JSON array of {_id, domain, \
sub_domain, difficulty, length, question, choice_A … choice_D, answer, context}), builds the \
official zero-shot prompt (--cot: the chain-of-thought prompt, then the answer prompt), truncates \
prompts over --max-len tokens in the middle, generates (greedy), extracts the answer letter as \
LongBench's pred.py does and summarises as its result.py does. --score FILE scores responses \
made elsewhere (LongBench's prediction lines with a \"response\"). See docs/EVAL.md.";

/// Arguments of `rsd-eval longbench`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = LONGBENCH_HELP)]
pub struct LongBenchArgs {
    /// LongBench v2's data.json.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Checkpoint directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// tokenizer.json to truncate with when --dump-prompts runs without --model.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Run directory (run.json, longbench.jsonl, summary.json, summary.md).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Chain of thought: LongBench's two-step prompt (1024 tokens of reasoning, then the answer).
    #[arg(long)]
    pub cot: bool,
    /// Most prompt tokens; longer prompts keep their first and last halves (LongBench: 120000).
    #[arg(long, default_value_t = 120_000)]
    pub max_len: usize,
    /// Render each prompt as the user message of the model's chat template (LongBench sends it
    /// to a chat endpoint; for instruct models).
    #[arg(long)]
    pub chat_template: bool,
    /// Only the first N questions.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Tokens generated for the answer (LongBench: 128).
    #[arg(long, default_value_t = 128)]
    pub max_new_tokens: usize,
    /// Tokens of reasoning generated with --cot (LongBench: 1024).
    #[arg(long, default_value_t = 1024)]
    pub cot_max_new_tokens: usize,
    /// Write each question's prompt (as fed to the model, with its token ids) as JSONL and exit.
    #[arg(long, value_name = "FILE.jsonl")]
    pub dump_prompts: Option<PathBuf>,
    /// Score responses made elsewhere: LongBench prediction lines (the item's fields and a
    /// "response"), into --out.
    #[arg(long, value_name = "FILE.jsonl", conflicts_with_all = ["model", "data"])]
    pub score: Option<PathBuf>,
    /// --device, --dtype.
    #[command(flatten)]
    pub runtime: DeviceArgs,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

/// One question of data.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Question {
    /// Its id.
    #[serde(rename = "_id")]
    pub id: String,
    /// Domain.
    #[serde(default)]
    pub domain: String,
    /// Sub-domain.
    #[serde(default)]
    pub sub_domain: String,
    /// "easy" or "hard".
    pub difficulty: String,
    /// "short", "medium" or "long".
    pub length: String,
    /// The question.
    pub question: String,
    /// Choice A.
    #[serde(rename = "choice_A")]
    pub choice_a: String,
    /// Choice B.
    #[serde(rename = "choice_B")]
    pub choice_b: String,
    /// Choice C.
    #[serde(rename = "choice_C")]
    pub choice_c: String,
    /// Choice D.
    #[serde(rename = "choice_D")]
    pub choice_d: String,
    /// The right letter.
    pub answer: String,
    /// The long text.
    pub context: String,
}

/// The largest LongBench data file read (LongBench v2's data.json is a few hundred MB; it is
/// parsed whole, at a few times its size in memory).
pub const MAX_DATA_BYTES: u64 = 1 << 30;

/// The largest `longbench.jsonl` or `--score` file read (a line is a response, not a context).
pub const MAX_PREDICTIONS_BYTES: u64 = 1 << 30;

/// The longest line of a predictions file.
pub const MAX_PREDICTION_LINE_BYTES: u64 = 16 << 20;

/// The most questions a data file may hold (LongBench v2 has 503).
pub const MAX_QUESTIONS: usize = 1 << 20;

/// Reads data.json (a regular file of at most [`MAX_DATA_BYTES`]): every error names the file,
/// the record and the field.
pub fn read_data(path: &Path) -> Result<Vec<Question>> {
    let text = rsd_common::safe_fs::read_text(path, MAX_DATA_BYTES, "LongBench data file")
        .map_err(|e| EvalError::Input(e.to_string()))?;
    parse_data(path, &text)
}

/// Parses the text of a data.json (`path` names it in errors).
pub fn parse_data(path: &Path, text: &str) -> Result<Vec<Question>> {
    let values: Vec<Value> = serde_json::from_str(text).map_err(|e| {
        EvalError::Input(format!(
            "{}: {}; expected LongBench v2's data.json, a JSON array of questions",
            path.display(),
            json_message(&e)
        ))
    })?;
    if values.len() > MAX_QUESTIONS {
        return Err(EvalError::Input(format!(
            "{}: {} questions, more than the {MAX_QUESTIONS} a data file may hold",
            path.display(),
            values.len()
        )));
    }
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let q: Question = serde_json::from_value(v).map_err(|e| {
                EvalError::Input(format!(
                    "{}: question {i}: {}; expected _id, difficulty, length, question, \
                     choice_A … choice_D, answer, context",
                    path.display(),
                    json_message(&e)
                ))
            })?;
            if !LETTERS.contains(&q.answer.as_str()) {
                return Err(EvalError::Input(format!(
                    "{}: question {i} ({}): \"answer\" is \"{}\", expected A, B, C or D",
                    path.display(),
                    shortened(&q.id),
                    shortened(&q.answer)
                )));
            }
            Ok(q)
        })
        .collect()
}

/// The answer letters.
const LETTERS: [&str; 4] = ["A", "B", "C", "D"];

/// The template filled with the question's stripped fields (and the reasoning, for the CoT
/// answer step).
pub fn fill(template: &str, q: &Question, cot: &str) -> String {
    template
        .replace("$DOC$", q.context.trim())
        .replace("$Q$", q.question.trim())
        .replace("$C_A$", q.choice_a.trim())
        .replace("$C_B$", q.choice_b.trim())
        .replace("$C_C$", q.choice_c.trim())
        .replace("$C_D$", q.choice_d.trim())
        .replace("$COT$", cot)
}

/// LongBench's middle truncation: over `max_len` tokens (special tokens included), the first
/// `max_len / 2` and last `ceil(max_len / 2)` tokens, decoded without special tokens. Returns the
/// text and whether it was cut.
pub fn truncate_middle(
    tok: &TextTokenizer,
    prompt: &str,
    max_len: usize,
) -> Result<(String, bool)> {
    let ids = tok.encode(prompt, true)?;
    if ids.len() <= max_len {
        return Ok((prompt.to_string(), false));
    }
    let head = max_len / 2;
    let tail = max_len - head;
    let kept: Vec<i64> = ids[..head]
        .iter()
        .chain(&ids[ids.len() - tail..])
        .copied()
        .collect();
    Ok((tok.decode(&kept)?, true))
}

/// LongBench's `extract_answer`: the letter of "The correct answer is (X)", else of "The correct
/// answer is X", X in A–D, after removing `*`.
pub fn extract_answer(response: &str) -> Option<char> {
    const SAY: &str = "The correct answer is ";
    let r = response.replace('*', "");
    let letter = |c: Option<char>| c.filter(|c| ('A'..='D').contains(c));
    let bracketed = r.match_indices(SAY).find_map(|(i, _)| {
        let mut rest = r[i + SAY.len()..].chars();
        (rest.next() == Some('('))
            .then(|| letter(rest.next()).filter(|_| rest.next() == Some(')')))
            .flatten()
    });
    bracketed.or_else(|| {
        r.match_indices(SAY)
            .find_map(|(i, _)| letter(r[i + SAY.len()..].chars().next()))
    })
}

/// One line of `longbench.jsonl`: the question without its context, the response, the
/// extracted letter and whether it is right.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Prediction {
    /// Its id.
    #[serde(rename = "_id")]
    pub id: String,
    /// Domain.
    #[serde(default)]
    pub domain: String,
    /// Sub-domain.
    #[serde(default)]
    pub sub_domain: String,
    /// "easy" or "hard".
    pub difficulty: String,
    /// "short", "medium" or "long".
    pub length: String,
    /// The question.
    #[serde(default)]
    pub question: String,
    /// The right letter.
    pub answer: String,
    /// The chain of thought (with --cot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_cot: Option<String>,
    /// The model's answer text.
    pub response: String,
    /// The extracted letter.
    #[serde(default)]
    pub pred: Option<String>,
    /// Whether `pred` is the answer.
    #[serde(default)]
    pub judge: bool,
    /// Prompt tokens fed (of the answer step, with --cot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<usize>,
    /// Whether the prompt was cut in the middle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
}

impl Prediction {
    fn judged(mut self) -> Prediction {
        self.pred = extract_answer(&self.response).map(String::from);
        self.judge = self.pred.as_deref() == Some(self.answer.as_str());
        self
    }
}

/// An accuracy in percent (none without questions) and its question count.
pub type Share = (Option<f64>, usize);

/// `summary.json`: LongBench's result.py columns, in percent to one decimal, with counts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LongBenchSummary {
    /// Questions scored.
    pub n: usize,
    /// Accuracy over all.
    pub overall: f64,
    /// (name, accuracy, count) for easy, hard, short, medium, long.
    pub columns: Vec<(String, Option<f64>, usize)>,
    /// Easy and hard rows, each with (accuracy, count) for short, medium and long.
    pub cross: Vec<(String, Vec<Share>)>,
}

/// result.py's aggregation.
pub fn summarize(preds: &[Prediction]) -> LongBenchSummary {
    let pct =
        |hits: usize, n: usize| (n > 0).then(|| (1000.0 * hits as f64 / n as f64).round() / 10.0);
    let col = |name: &str, keep: &dyn Fn(&Prediction) -> bool| {
        let sel: Vec<&Prediction> = preds.iter().filter(|p| keep(p)).collect();
        let hits = sel.iter().filter(|p| p.judge).count();
        (name.to_string(), pct(hits, sel.len()), sel.len())
    };
    let hard = |p: &Prediction| p.difficulty != "easy";
    let long = |p: &Prediction| p.length != "short" && p.length != "medium";
    let length_of = |p: &Prediction| match p.length.as_str() {
        "short" => 0,
        "medium" => 1,
        _ => 2,
    };
    let cross = [("Easy", false), ("Hard", true)]
        .iter()
        .map(|&(name, is_hard)| {
            let cells = (0..3)
                .map(|l| {
                    let sel: Vec<&Prediction> = preds
                        .iter()
                        .filter(|p| hard(p) == is_hard && length_of(p) == l)
                        .collect();
                    let hits = sel.iter().filter(|p| p.judge).count();
                    (pct(hits, sel.len()), sel.len())
                })
                .collect();
            (name.to_string(), cells)
        })
        .collect();
    LongBenchSummary {
        n: preds.len(),
        cross,
        overall: pct(preds.iter().filter(|p| p.judge).count(), preds.len()).unwrap_or(0.0),
        columns: vec![
            col("Easy", &|p| !hard(p)),
            col("Hard", &hard),
            col("Short", &|p| p.length == "short"),
            col("Medium", &|p| p.length == "medium"),
            col("Long", &long),
        ],
    }
}

fn write_summary(out: &Path, s: &LongBenchSummary, note: &str) -> Result<()> {
    let path = out.join("summary.json");
    let json = serde_json::to_string_pretty(s).map_err(|e| EvalError::Json {
        path: path.clone(),
        reason: e.to_string(),
    })?;
    rsd_common::safe_fs::write_file_atomic(&path, format!("{json}\n").as_bytes())
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))?;
    let mut md = format!(
        "# LongBench v2\n\n{note}\n\n| Overall | Easy | Hard | Short | Medium | Long |\n|---:|---:|---:|---:|---:|---:|\n| {:.1} |",
        s.overall
    );
    for (_, acc, _) in &s.columns {
        md += &match acc {
            Some(a) => format!(" {a:.1} |"),
            None => " — |".into(),
        };
    }
    md += &format!("\n| n = {} |", s.n);
    for (_, _, n) in &s.columns {
        md += &format!(" {n} |");
    }
    md += "\n\n| difficulty × length | Short | Medium | Long |\n|---|---:|---:|---:|\n";
    for (name, cells) in &s.cross {
        md += &format!("| {name} |");
        for (acc, n) in cells {
            md += &match acc {
                Some(a) => format!(" {a:.1} (n = {n}) |"),
                None => " — |".into(),
            };
        }
        md.push('\n');
    }
    md += "\nAccuracy in percent (LongBench's result.py: hard is every difficulty but easy, long every length but short and medium). A share over n questions has a standard error of at most 50/√n points.\n";
    let path = out.join("summary.md");
    rsd_common::safe_fs::write_file_atomic(&path, md.as_bytes())
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))
}

/// Reads a predictions file (`longbench.jsonl`, or `--score`'s) a line at a time: a regular file
/// of at most [`MAX_PREDICTIONS_BYTES`], lines of at most [`MAX_PREDICTION_LINE_BYTES`], each
/// checked ([`parse_prediction`]).
fn read_predictions(path: &Path) -> Result<Vec<Prediction>> {
    let read_err = |e: LineError| EvalError::Input(e.to_string());
    let mut lines = Lines::open(
        path,
        MAX_PREDICTIONS_BYTES,
        MAX_PREDICTION_LINE_BYTES,
        "LongBench predictions file",
    )
    .map_err(read_err)?;
    let mut out = Vec::new();
    while let Some(line) = lines.next_line().map_err(read_err)? {
        if line.text.trim().is_empty() {
            continue;
        }
        let p = parse_prediction(line.text)
            .map_err(|m| EvalError::Input(format!("{}:{}: {m}", path.display(), line.number)))?;
        out.push(p);
    }
    Ok(out)
}

/// One prediction line: the answer a letter, the extracted letter (if any) a letter, and the
/// judgement the one they imply. The error names the field and why.
pub fn parse_prediction(raw: &str) -> std::result::Result<Prediction, String> {
    let p: Prediction = serde_json::from_str(raw).map_err(|e| {
        format!(
            "{}; expected a LongBench prediction line (_id, difficulty, length, answer, response)",
            json_message(&e)
        )
    })?;
    if !LETTERS.contains(&p.answer.as_str()) {
        return Err(format!(
            "field answer: \"{}\", expected A, B, C or D",
            shortened(&p.answer)
        ));
    }
    if let Some(x) = p.pred.as_deref().filter(|x| !LETTERS.contains(x)) {
        return Err(format!(
            "field pred: \"{}\", expected A, B, C, D or null",
            shortened(x)
        ));
    }
    if p.judge != (p.pred.as_deref() == Some(p.answer.as_str())) {
        return Err(format!(
            "field judge: {}, but pred {:?} and answer {} say otherwise",
            p.judge,
            p.pred.as_deref(),
            p.answer
        ));
    }
    Ok(p)
}

/// What `rsd-eval longbench` did, as a line for the user.
pub fn command(a: &LongBenchArgs) -> Result<String> {
    if let Some(file) = &a.score {
        return score_responses(a, file);
    }
    let data = a
        .data
        .as_ref()
        .ok_or_else(|| EvalError::Input("give --data data.json (or --score FILE)".into()))?;
    let tok_path = match (&a.model, &a.tokenizer) {
        (Some(m), _) => m.join("tokenizer.json"),
        (None, Some(t)) if a.dump_prompts.is_some() => t.clone(),
        _ => {
            return Err(EvalError::Input(
                "give --model DIR (or --tokenizer with --dump-prompts)".into(),
            ))
        }
    };
    if a.max_len < 2 {
        return Err(EvalError::Input("--max-len must be at least 2".into()));
    }
    let mut questions = read_data(data)?;
    if let Some(n) = a.limit {
        questions.truncate(n);
    }
    let tok = TextTokenizer::from_file(&tok_path)?;
    let chat = if a.chat_template {
        let dir = tok_path.parent().unwrap_or(Path::new("."));
        Some(ChatTemplate::from_dir(dir)?)
    } else {
        None
    };
    let prompter = Prompter {
        tok: &tok,
        chat: chat.as_ref(),
        max_len: a.max_len,
    };
    if let Some(dump) = &a.dump_prompts {
        return dump_prompts(dump, &questions, &prompter, a.cot);
    }
    let (Some(model_dir), Some(out)) = (&a.model, &a.out) else {
        return Err(EvalError::Input("give --model DIR and --out RUN/".into()));
    };
    check_model_files(model_dir)?;
    let settings = settings(a, model_dir, &tok_path, data)?;
    let options = a.runtime.options()?;
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    settle_run_json(out, &settings, &a.runtime.device)?;
    let results = out.join("longbench.jsonl");
    let mut done: Vec<Prediction> = if results.is_file() {
        read_predictions(&results)?
    } else {
        Vec::new()
    };
    let seen: HashSet<String> = done.iter().map(|p| p.id.clone()).collect();
    let pending: Vec<&Question> = questions.iter().filter(|q| !seen.contains(&q.id)).collect();
    let already = questions.len() - pending.len();
    if !pending.is_empty() {
        let model = Model::load(model_dir, options)?;
        let answerer = Answerer {
            model: &model,
            prompter: &prompter,
            eos: gen::eos_token_ids(model_dir)?,
            a,
        };
        let mut file = Results::open(&results)?;
        let bar = progress_bar(!a.quiet, questions.len() as u64, already as u64);
        for q in pending {
            let p = answerer.answer(q)?;
            file.append(&p)?;
            done.push(p);
            bar.inc(1);
        }
        bar.finish_and_clear();
    }
    let s = summarize(&done);
    write_summary(
        out,
        &s,
        &format!(
            "{} of {} questions scored{}; greedy decoding (LongBench samples at temperature 0.1).",
            s.n,
            questions.len(),
            if a.cot { ", chain of thought" } else { "" }
        ),
    )?;
    Ok(format!(
        "{} questions: {} answered now, {} already done; overall {:.1}% (see {})",
        questions.len(),
        questions.len() - already,
        already,
        s.overall,
        out.join("summary.md").display()
    ))
}

/// The settings run.json records: what defines the prompts and the responses.
fn settings(a: &LongBenchArgs, model_dir: &Path, tok_path: &Path, data: &Path) -> Result<Value> {
    Ok(serde_json::json!({
        "model": std::fs::canonicalize(model_dir).map_err(io_err(model_dir))?.display().to_string(),
        "tokenizer_sha256": sha256_file(tok_path)?,
        "data_sha256": sha256_file(data)?,
        "cot": a.cot,
        "max_len": a.max_len,
        "chat_template": a.chat_template,
        "max_new_tokens": a.max_new_tokens,
        "cot_max_new_tokens": if a.cot { Some(a.cot_max_new_tokens) } else { None },
        "dtype": a.runtime.dtype,
    }))
}

/// `--score FILE`: judges responses made elsewhere, writes them as RUN/longbench.jsonl and
/// summarises them.
fn score_responses(a: &LongBenchArgs, file: &Path) -> Result<String> {
    let out = a
        .out
        .as_ref()
        .ok_or_else(|| EvalError::Input("--score needs --out RUN/".into()))?;
    let preds: Vec<Prediction> = read_predictions(file)?
        .into_iter()
        .map(Prediction::judged)
        .collect();
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut text = String::new();
    for p in &preds {
        text += &serde_json::to_string(p).map_err(|e| EvalError::Json {
            path: out.join("longbench.jsonl"),
            reason: e.to_string(),
        })?;
        text.push('\n');
    }
    let path = out.join("longbench.jsonl");
    rsd_common::safe_fs::write_file_atomic(&path, text.as_bytes())
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))?;
    let s = summarize(&preds);
    write_summary(out, &s, &format!("Responses from {}.", file.display()))?;
    Ok(format!(
        "{} responses scored: overall {:.1}% (see {})",
        s.n,
        s.overall,
        out.join("summary.md").display()
    ))
}

/// Turns a filled-in prompt into what the model reads.
struct Prompter<'a> {
    tok: &'a TextTokenizer,
    chat: Option<&'a ChatTemplate>,
    max_len: usize,
}

impl Prompter<'_> {
    /// The prompt text after truncation, rendered, its ids, and whether it was truncated.
    fn prepare(&self, text: &str) -> Result<(String, Vec<i64>, bool)> {
        let (text, cut) = truncate_middle(self.tok, text, self.max_len)?;
        let text = match self.chat {
            Some(c) => c.render_user(&text)?,
            None => text,
        };
        let bos_in_text = self
            .chat
            .and_then(ChatTemplate::bos)
            .is_some_and(|b| !b.is_empty() && text.starts_with(b));
        let ids = self.tok.encode(&text, !bos_in_text)?;
        Ok((text, ids, cut))
    }
}

/// The first prompt a question is asked with: the zero-shot one, or with `cot` the
/// chain-of-thought one.
fn first_template(cot: bool) -> &'static str {
    if cot {
        ZERO_SHOT_COT
    } else {
        ZERO_SHOT
    }
}

/// `--dump-prompts FILE`: writes every question's first prompt, as the model would read it.
fn dump_prompts(
    dump: &Path,
    questions: &[Question],
    prompter: &Prompter<'_>,
    cot: bool,
) -> Result<String> {
    let mut text = String::new();
    for q in questions {
        let (prompt, ids, cut) = prompter.prepare(&fill(first_template(cot), q, ""))?;
        let line = serde_json::json!({"_id": q.id, "prompt": prompt, "prompt_token_ids": ids,
            "truncated": cut, "answer": q.answer});
        text += &format!("{line}\n");
    }
    rsd_common::safe_fs::write_file_atomic(dump, text.as_bytes())
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", dump.display())))?;
    Ok(format!(
        "wrote {} prompts to {}",
        questions.len(),
        dump.display()
    ))
}

/// Asks the model the questions, one at a time.
struct Answerer<'a> {
    model: &'a Model,
    prompter: &'a Prompter<'a>,
    eos: Vec<i64>,
    a: &'a LongBenchArgs,
}

impl Answerer<'_> {
    /// The model's greedy response to `ids`, trimmed.
    fn generate(&self, ids: Vec<i64>, max_new_tokens: usize) -> Result<String> {
        let gopts = GenerateOptions {
            max_new_tokens,
            eos: self.eos.clone(),
            batch_size: 1,
            ..Default::default()
        };
        let g = gen::generate(self.model, &[ids], &gopts, Some(self.prompter.tok))?;
        Ok(g.into_iter()
            .next()
            .and_then(|g| g.text)
            .unwrap_or_default()
            .trim()
            .to_string())
    }

    /// The judged prediction for `q`: with `--cot` its reasoning first, then the answer prompt
    /// with the reasoning in place of the document.
    fn answer(&self, q: &Question) -> Result<Prediction> {
        let a = self.a;
        let (_, ids, mut cut) = self.prompter.prepare(&fill(first_template(a.cot), q, ""))?;
        let mut prompt_tokens = ids.len();
        let first = self.generate(
            ids,
            if a.cot {
                a.cot_max_new_tokens
            } else {
                a.max_new_tokens
            },
        )?;
        let (response_cot, response) = if a.cot {
            let (_, ids, cut2) = self
                .prompter
                .prepare(&fill(ZERO_SHOT_COT_ANSWER, q, &first))?;
            cut |= cut2;
            prompt_tokens = ids.len();
            (Some(first), self.generate(ids, a.max_new_tokens)?)
        } else {
            (None, first)
        };
        Ok(Prediction {
            id: q.id.clone(),
            domain: q.domain.clone(),
            sub_domain: q.sub_domain.clone(),
            difficulty: q.difficulty.clone(),
            length: q.length.clone(),
            question: q.question.clone(),
            answer: q.answer.clone(),
            response_cot,
            response,
            pred: None,
            judge: false,
            prompt_tokens: Some(prompt_tokens),
            truncated: Some(cut),
        }
        .judged())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_extracted_as_longbench_extracts_them() {
        let cases = [
            ("The correct answer is (B)", Some('B')),
            ("**The correct answer is (C)**.", Some('C')),
            ("The correct answer is D because", Some('D')),
            (
                "The correct answer is E. The correct answer is (A)",
                Some('A'),
            ),
            (
                "The correct answer is (E) or The correct answer is B",
                Some('B'),
            ),
            ("the correct answer is (A)", None),
            ("The correct answer is (a)", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(extract_answer(text), want, "{text}");
        }
    }

    #[test]
    fn summary_columns_follow_result_py() {
        let p = |d: &str, l: &str, judge: bool| Prediction {
            id: String::new(),
            domain: String::new(),
            sub_domain: String::new(),
            difficulty: d.into(),
            length: l.into(),
            question: String::new(),
            answer: "A".into(),
            response_cot: None,
            response: String::new(),
            pred: None,
            judge,
            prompt_tokens: None,
            truncated: None,
        };
        let s = summarize(&[
            p("easy", "short", true),
            p("hard", "medium", false),
            p("other", "huge", true),
        ]);
        assert_eq!(s.overall, 66.7);
        assert_eq!(s.columns[0], ("Easy".into(), Some(100.0), 1));
        assert_eq!(s.columns[1], ("Hard".into(), Some(50.0), 2));
        assert_eq!(s.columns[4], ("Long".into(), Some(100.0), 1));
        assert_eq!(s.cross[0].1, [(Some(100.0), 1), (None, 0), (None, 0)]);
        assert_eq!(s.cross[1].1, [(None, 0), (Some(0.0), 1), (Some(100.0), 1)]);
    }
}
