//! RULER's bookkeeping, so an rsd number can stand next to a paper's:
//!
//! * [`aggregate`]: RULER's scores. A task's score is the mean of its samples' metric × 100,
//!   rounded to two decimals as RULER's `evaluate.py` rounds it; a length's score is the mean of
//!   the task scores run; the 13-task average only when all of [`RULER_TASKS`] ran.
//! * [`write_predictions`]: `RUN/ruler/LENGTH/TASK.jsonl` in the format RULER's `evaluate.py`
//!   reads (`index`, `input`, `outputs`, `pred`, `others`, `truncation`, `length`), so RULER's own
//!   scoring of rsd's completions gives rsd's numbers.
//! * [`read_predictions`]: completions made elsewhere (RULER's files, or `--dump-prompts` lines
//!   with a `pred` added), scored with the same metrics (`rsd-eval score --pred`).
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{io_err, EvalError, Result};
use crate::lines::{json_message, LineError, Lines};
use crate::results::ItemResult;
use crate::score::metric;
use rsd_common::printable::printable;

/// RULER's 13 tasks, in its order: the set its headline average is over.
pub const RULER_TASKS: [&str; 13] = [
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
    "vt",
    "cwe",
    "fwe",
    "qa_1",
    "qa_2",
];

/// One task's RULER score at one length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskScore {
    /// Task name.
    pub task: String,
    /// Mean metric × 100, rounded to two decimals.
    pub score: f64,
    /// Samples scored.
    pub samples: usize,
}

/// RULER's scores at one length.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LengthScores {
    /// Context length.
    pub length: usize,
    /// Each task run, in RULER's order (then others by name).
    pub tasks: Vec<TaskScore>,
    /// Mean of the task scores (as rounded), rounded to two decimals.
    pub average: f64,
    /// The same mean, present only when all 13 of RULER's tasks ran (and no other).
    pub ruler_13: Option<f64>,
    /// RULER's tasks that did not run at this length.
    pub missing: Vec<String>,
}

/// Rounds to two decimals as Python's `round(x, 2)` does (correctly rounded, ties to even).
pub fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

/// A task's position in RULER's order; other tasks after, by name.
fn order(task: &str) -> (usize, String) {
    let i = RULER_TASKS
        .iter()
        .position(|t| *t == task)
        .unwrap_or(RULER_TASKS.len());
    (i, task.to_string())
}

/// Per task, in RULER's order: (sum of scores, samples).
type TaskSums = BTreeMap<(usize, String), (f64, usize)>;

/// RULER's aggregation of `results`, one entry per length.
pub fn aggregate(results: &[ItemResult]) -> Vec<LengthScores> {
    let mut cells: BTreeMap<usize, TaskSums> = BTreeMap::new();
    for r in results {
        let c = cells
            .entry(r.length)
            .or_default()
            .entry(order(&r.task))
            .or_default();
        c.0 += r.score;
        c.1 += 1;
    }
    cells
        .into_iter()
        .map(|(length, tasks)| {
            let tasks: Vec<TaskScore> = tasks
                .into_iter()
                .map(|((_, task), (sum, n))| TaskScore {
                    task,
                    score: round2(sum / n as f64 * 100.0),
                    samples: n,
                })
                .collect();
            let average = round2(tasks.iter().map(|t| t.score).sum::<f64>() / tasks.len() as f64);
            let missing: Vec<String> = RULER_TASKS
                .iter()
                .filter(|t| !tasks.iter().any(|s| s.task == **t))
                .map(|t| t.to_string())
                .collect();
            let all_13 = missing.is_empty() && tasks.len() == RULER_TASKS.len();
            LengthScores {
                length,
                ruler_13: all_13.then_some(average),
                tasks,
                average,
                missing,
            }
        })
        .collect()
}

/// The Markdown section of `summary.md` with RULER's aggregation.
pub fn markdown(scores: &[LengthScores]) -> String {
    let mut s = String::from(
        "## RULER's aggregation\n\nPer task: the mean score × 100 over its samples, to two \
         decimals (RULER's `evaluate.py`); per length: the mean of those over the tasks run. \
         RULER's 13-task average is given only where all 13 ran.\n\n| task |",
    );
    let tasks: std::collections::BTreeSet<(usize, &str)> = scores
        .iter()
        .flat_map(|l| l.tasks.iter().map(|t| (order(&t.task).0, t.task.as_str())))
        .collect();
    let tasks: Vec<&str> = tasks.into_iter().map(|(_, t)| t).collect();
    for l in scores {
        s += &format!(" {} |", l.length);
    }
    s += &format!("\n|---|{}\n", "---:|".repeat(scores.len()));
    for t in &tasks {
        s += &format!("| {t} |");
        for l in scores {
            // Each length's tasks are sorted by `order`: found by binary search.
            let found = l
                .tasks
                .binary_search_by(|x| order(&x.task).cmp(&order(t)))
                .ok()
                .map(|i| &l.tasks[i]);
            s += &match found {
                Some(x) => format!(" {:.2} (n={}) |", x.score, x.samples),
                None => " |".into(),
            };
        }
        s.push('\n');
    }
    s += "| **average of the tasks run** |";
    for l in scores {
        s += &format!(" **{:.2}** ({} tasks) |", l.average, l.tasks.len());
    }
    s += "\n| **RULER 13-task average** |";
    for l in scores {
        s += &match l.ruler_13 {
            Some(a) => format!(" **{a:.2}** |"),
            None => format!(" — ({} of 13 ran) |", 13 - l.missing.len()),
        };
    }
    s += "\n";
    s
}

/// One line of a RULER prediction file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    /// The sample's position among the task's samples at this length.
    pub index: usize,
    /// The prompt.
    pub input: String,
    /// What a correct answer contains.
    pub outputs: Vec<String>,
    /// The model's completion.
    pub pred: String,
    /// `id` (= index, which RULER's evaluator prefers) and rsd's keys: task, depth, sample.
    pub others: Value,
    /// RULER's field for truncated inputs; rsd never truncates: -1.
    pub truncation: i64,
    /// Prompt tokens plus the tokens the model may generate, as RULER's generator counts it.
    pub length: usize,
}

impl Prediction {
    /// The prediction line of a generated `item` whose completion scored as `r`; `index` is its
    /// position among the (task, length)'s items.
    pub fn of(item: &crate::tasks::Item, r: &ItemResult, index: usize) -> Prediction {
        let mut others = serde_json::json!({
            "id": index,
            "task": item.task.name(),
            "length": item.length,
            "depth": item.depth,
            "sample": item.sample,
            "prompt_tokens": item.ids.len(),
        });
        if !item.distractors.is_empty() {
            others["distractors"] = serde_json::json!(item.distractors);
        }
        Prediction {
            index,
            input: item.prompt.clone(),
            outputs: item.expected.clone(),
            pred: r.output.clone(),
            others,
            truncation: -1,
            length: item.ids.len() + item.max_new_tokens,
        }
    }
}

/// Writes `dir/LENGTH/TASK.jsonl` for each (task, length) of `preds` (keyed so), atomically.
pub fn write_predictions(
    dir: &Path,
    preds: &BTreeMap<(String, usize), Vec<Prediction>>,
) -> Result<()> {
    // Every level is the run's own: a link planted at RUN/ruler would take RUN/ruler/LENGTH
    // (and its files) wherever it points.
    let own = |d: &Path| {
        rsd_common::safe_fs::create_own_dir(d).map_err(|e| EvalError::Input(e.to_string()))
    };
    own(dir)?;
    for ((task, length), lines) in preds {
        let d = dir.join(length.to_string());
        own(&d)?;
        let path = d.join(format!("{task}.jsonl"));
        let mut text = String::new();
        for p in lines {
            let line = serde_json::to_string(p).map_err(|e| EvalError::Json {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            text += &line;
            text.push('\n');
        }
        rsd_common::safe_fs::write_file_atomic(&path, text.as_bytes())
            .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))?;
    }
    Ok(())
}

/// The largest prediction file read (a line holds its prompt: a 1M-token prompt is a few MB).
pub const MAX_PREDICTION_FILE_BYTES: u64 = 1 << 30;

/// The longest line of a prediction file read.
pub const MAX_PREDICTION_LINE_BYTES: u64 = 64 << 20;

/// The most prediction files under one `--pred` directory (RULER writes 13 per length).
pub const MAX_PREDICTION_FILES: usize = 100_000;

/// The longest completion (`pred`) scored, in bytes: RULER's tasks generate at most a few hundred
/// tokens; each expected string is searched for in it, so its length bounds the scoring's cost.
pub const MAX_PRED_BYTES: usize = 1 << 20;

/// The most expected strings (or distractors) of one prediction (RULER's tasks have at most 10).
pub const MAX_PRED_STRINGS: usize = 100;

/// The prediction files under `path`: the file itself, or every `*.jsonl` below the directory
/// (RULER's layout is one directory per length), sorted. Links to directories are not followed
/// (a link to a parent would never end), and at most [`MAX_PREDICTION_FILES`] files are taken.
fn prediction_files(path: &Path) -> Result<Vec<PathBuf>> {
    if path.is_file() {
        return Ok(vec![path.to_path_buf()]);
    }
    if !path.is_dir() {
        return Err(EvalError::Input(format!(
            "--pred {}: no such file or directory (or not a regular file)",
            path.display()
        )));
    }
    let mut out = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).map_err(io_err(&d))? {
            let e = e.map_err(io_err(&d))?;
            let p = e.path();
            // The entry's own type: a link is not followed into a directory.
            let kind = e.file_type().map_err(io_err(&p))?;
            if kind.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "jsonl") {
                out.push(p);
                if out.len() > MAX_PREDICTION_FILES {
                    return Err(EvalError::Input(format!(
                        "--pred {}: more than {MAX_PREDICTION_FILES} *.jsonl files in it",
                        path.display()
                    )));
                }
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(EvalError::Input(format!(
            "--pred {}: no *.jsonl prediction files in it",
            path.display()
        )));
    }
    Ok(out)
}

/// The strings of a JSON array field, if it is one.
fn strings(v: Option<&Value>) -> Option<Vec<String>> {
    v?.as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_string))
        .collect()
}

/// Reads completions made elsewhere and scores each with its task's metric. A line holds `pred`
/// and the expected strings (`outputs` as RULER writes them, or `expected` as `--dump-prompts`
/// does); its task is its `task` field, else the file's name (`niah_single_1.jsonl`); its length
/// the `length` field; depth and sample come from the line or from `others` (sample falls back
/// to `others.id`, then `index`). Every error names the file, the line and the field. Files are
/// read a line at a time (at most [`MAX_PREDICTION_FILE_BYTES`] each, lines of at most
/// [`MAX_PREDICTION_LINE_BYTES`]); the records together span at most
/// [`crate::results::MAX_DISTINCT`] tasks, lengths and depths.
pub fn read_predictions(path: &Path) -> Result<Vec<ItemResult>> {
    let mut out = Vec::new();
    let mut seen: HashMap<(String, usize, Option<u64>, usize), String> = HashMap::new();
    for file in prediction_files(path)? {
        let read_err = |e: LineError| EvalError::Input(e.to_string());
        let mut lines = Lines::open(
            &file,
            MAX_PREDICTION_FILE_BYTES,
            MAX_PREDICTION_LINE_BYTES,
            "prediction file",
        )
        .map_err(read_err)?;
        let stem = file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        while let Some(line) = lines.next_line().map_err(read_err)? {
            if line.text.trim().is_empty() {
                continue;
            }
            let here = format!("{}:{}", file.display(), line.number);
            let r = prediction_of(line.text, &stem)
                .map_err(|m| EvalError::Input(format!("{here}: {m}")))?;
            let key = (
                r.task.clone(),
                r.length,
                r.depth.map(f64::to_bits),
                r.sample,
            );
            if let Some(first) = seen.insert(key, here.clone()) {
                return Err(EvalError::Input(format!(
                    "{here}: task {}, length {}, depth {:?}, sample {} was already scored at \
                     {first}",
                    printable(&r.task),
                    r.length,
                    r.depth,
                    r.sample
                )));
            }
            out.push(r);
        }
    }
    crate::results::check_distinct(path, out.iter().map(ItemResult::cell))?;
    Ok(out)
}

/// One prediction line scored (see [`read_predictions`]); `stem` is its file's name without
/// `.jsonl`, the task of a line that names none. The error says which field is wrong and why.
pub fn prediction_of(raw: &str, stem: &str) -> std::result::Result<ItemResult, String> {
    let v: Value =
        serde_json::from_str(raw).map_err(|e| format!("not JSON ({})", json_message(&e)))?;
    // rsd's own keys ride in `others` of the files it writes, where RULER's top-level
    // `length` is the prompt plus the answer budget; rsd's dumps have them at the top.
    let others = v.get("others").cloned().unwrap_or(Value::Null);
    let field = |k: &str| others.get(k).filter(|x| !x.is_null()).or_else(|| v.get(k));
    let pred = v
        .get("pred")
        .and_then(Value::as_str)
        .ok_or("no \"pred\" string (the model's completion)")?;
    if pred.len() > MAX_PRED_BYTES {
        return Err(format!(
            "field pred: {} bytes, more than the {MAX_PRED_BYTES} a completion scored may have",
            pred.len()
        ));
    }
    let expected = strings(v.get("outputs"))
        .or_else(|| strings(v.get("expected")))
        .ok_or("no \"outputs\" (RULER) or \"expected\" (rsd) list of strings")?;
    let distractors = strings(field("distractors")).unwrap_or_default();
    for (name, list) in [("outputs", &expected), ("distractors", &distractors)] {
        if list.len() > MAX_PRED_STRINGS {
            return Err(format!(
                "field {name}: {} strings, more than the {MAX_PRED_STRINGS} a prediction may have",
                list.len()
            ));
        }
    }
    let task = match field("task").and_then(Value::as_str) {
        Some(t) => t.to_string(),
        None => stem.to_string(),
    };
    let length = field("length")
        .and_then(Value::as_u64)
        .ok_or("no \"length\" (a token count)")?;
    let length = usize::try_from(length).unwrap_or(usize::MAX);
    let depth = match field("depth") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            d.as_f64()
                .filter(|d| (0.0..=1.0).contains(d))
                .ok_or("\"depth\" is not a number in [0, 1]")?
                + 0.0,
        ),
    };
    let sample = ["sample", "id", "index"]
        .iter()
        .find_map(|k| field(k).and_then(Value::as_u64))
        .ok_or("no \"sample\", \"others.id\" or \"index\" (a number)")?;
    let sample = usize::try_from(sample).unwrap_or(usize::MAX);
    let score =
        metric(&task, pred, &expected, &distractors).map_err(|m| printable(&m).into_owned())?;
    let prompt_tokens = field("prompt_tokens").and_then(Value::as_u64).unwrap_or(0);
    let r = ItemResult {
        task,
        length,
        depth,
        sample,
        expected,
        output: pred.to_string(),
        score,
        prompt_tokens: usize::try_from(prompt_tokens).unwrap_or(usize::MAX),
        logprob: None,
        rank: None,
        candidates: None,
        greedy: None,
        score_norm: None,
    };
    match crate::results::invalid_field(&r) {
        Some((field, message)) => Err(format!("field {field}: {message}")),
        None => Ok(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_planted_at_any_level_of_the_predictions_is_refused_and_its_target_untouched() {
        let run = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let pred = Prediction {
            index: 0,
            input: "p".into(),
            outputs: vec!["x".into()],
            pred: "x".into(),
            others: Value::Null,
            truncation: -1,
            length: 1,
        };
        let preds = BTreeMap::from([(("niah_single_1".to_string(), 256), vec![pred])]);
        for planted in ["ruler", "ruler/256"] {
            let ruler = run.path().join("ruler");
            let _ = std::fs::remove_dir_all(&ruler);
            let _ = std::fs::remove_file(&ruler);
            if planted == "ruler/256" {
                std::fs::create_dir(&ruler).unwrap();
            }
            std::os::unix::fs::symlink(elsewhere.path(), run.path().join(planted)).unwrap();
            let e = write_predictions(&ruler, &preds).unwrap_err().to_string();
            assert!(e.contains(planted) && e.contains("link"), "{planted}: {e}");
            assert_eq!(
                std::fs::read_dir(elsewhere.path()).unwrap().count(),
                0,
                "{planted}"
            );
        }
        // Its own directories: written.
        std::fs::remove_file(run.path().join("ruler/256")).unwrap();
        write_predictions(&run.path().join("ruler"), &preds).unwrap();
        assert!(run.path().join("ruler/256/niah_single_1.jsonl").is_file());
    }

    fn r(task: &str, length: usize, score: f64) -> ItemResult {
        ItemResult {
            task: task.into(),
            length,
            depth: None,
            sample: 0,
            expected: vec![],
            output: String::new(),
            score,
            prompt_tokens: 0,
            logprob: None,
            rank: None,
            candidates: None,
            greedy: None,
            score_norm: None,
        }
    }

    #[test]
    fn tasks_weigh_the_same_whatever_their_sample_counts() {
        // vt: 1 of 1; niah_single_1: 1 of 3. Items would give 0.5; RULER gives (100 + 33.33) / 2.
        let rs = vec![
            r("vt", 4096, 1.0),
            r("niah_single_1", 4096, 1.0),
            r("niah_single_1", 4096, 0.0),
            r("niah_single_1", 4096, 0.0),
        ];
        let a = aggregate(&rs);
        assert_eq!(a.len(), 1);
        let names: Vec<&str> = a[0].tasks.iter().map(|t| t.task.as_str()).collect();
        assert_eq!(names, ["niah_single_1", "vt"]);
        assert_eq!((a[0].tasks[0].score, a[0].tasks[0].samples), (33.33, 3));
        assert_eq!(a[0].average, 66.66); // Python: round((33.33 + 100.0) / 2, 2) == 66.66
        assert_eq!(a[0].ruler_13, None);
        assert_eq!(a[0].missing.len(), 11);
        let all: Vec<ItemResult> = RULER_TASKS.iter().map(|t| r(t, 8192, 0.5)).collect();
        assert_eq!(aggregate(&all)[0].ruler_13, Some(50.0));
        assert!(markdown(&aggregate(&rs)).contains("— (2 of 13 ran)"));
    }

    #[test]
    fn rounding_is_pythons() {
        assert_eq!(round2(33.333333), 33.33);
        assert_eq!(round2(66.665), 66.67); // 66.665 is stored as 66.66500000000000625…
        assert_eq!(round2(2.675), 2.67); // stored as 2.67499999…
    }
}
