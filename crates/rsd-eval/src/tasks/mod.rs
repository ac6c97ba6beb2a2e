//! RULER's synthetic tasks (Hsieh et al. 2024), generated deterministically from
//! (seed, task, length, depth, sample) and the model's tokenizer.
//!
//! Every prompt is a plain completion prompt, as RULER builds for base models: the task template
//! with its context, then the answer prefix (`… mentioned in the provided text is`), so the model
//! only has to continue. With a chat template ([`Generator::with_chat_template`]) the task's
//! question (everything before the answer prefix) is rendered as one user message with the
//! generation prompt, and the answer prefix follows the generation prompt, as RULER's
//! `prepare.py` appends it after its chat templates. Templates, needle sentences, value formats and task parameters follow
//! RULER's `scripts/data/synthetic`; the few deliberate differences are listed in docs/EVAL.md.
//!
//! **Length.** As in RULER, `length` covers the prompt *and* the tokens the model may generate:
//! the haystack is grown, one unit at a time (a word of an essay, a noise sentence, a distractor
//! needle, …), to the largest size whose whole prompt, in the model tokenizer's tokens, is at most
//! `length - max_new_tokens`. The prompt is therefore never longer than that budget and shorter by
//! less than [`Task::tolerance`] tokens (about one unit).
//!
//! **Depth.** Needle tasks take the depth of their evidence (a fraction of the context in [0, 1]);
//! the needle that answers the question goes to the boundary between haystack units nearest to that
//! fraction of the haystack's text, other needles at random depths. Variable tracking and the
//! word-extraction tasks spread their evidence over the whole context and have no depth.
use std::collections::HashSet;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use rsd_common::hex;
use rsd_common::rng::SplitMix64;
use rsd_model::generate::TextTokenizer;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::qa::{QaData, QaError, QaSource};

mod aggregation;
mod haystack;
mod question_answering;
mod retrieval;
mod tracing;
mod words;

pub use haystack::Haystack;
use retrieval::json_kv_values;
use rsd_chat::{ChatError, ChatTemplate};
use words::random_of;

/// What generating a task can go wrong with.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The task name is not one we know.
    #[error("unknown task \"{name}\"; known tasks: {known}")]
    UnknownTask {
        /// The name given.
        name: String,
        /// Every known name, comma-separated.
        known: String,
    },
    /// Even an empty haystack does not fit the length.
    #[error("{task} at length {length}: the prompt without any haystack already takes {needed} tokens, more than the {budget} left after {max_new_tokens} tokens for the answer; use a larger length")]
    TooShort {
        /// Task name.
        task: String,
        /// Length asked for.
        length: usize,
        /// Tokens the bare prompt takes.
        needed: usize,
        /// Tokens the prompt may take.
        budget: usize,
        /// Tokens reserved for the answer.
        max_new_tokens: usize,
    },
    /// The haystack source is unusable.
    #[error("haystack {path}: {reason}")]
    Haystack {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Tokenizing failed.
    #[error(transparent)]
    Model(#[from] rsd_model::ModelError),
    /// Rendering the chat template failed.
    #[error(transparent)]
    Chat(#[from] ChatError),
    /// A QA dataset is missing or unusable.
    #[error(transparent)]
    Qa(#[from] QaError),
    /// A QA task without its dataset.
    #[error("{task} reads {file} ({url}): pass --qa-dir DIR holding it, as RULER's download_qa_dataset.sh leaves it")]
    NoQaData {
        /// Task name.
        task: String,
        /// The file it reads.
        file: String,
        /// Where the file is published.
        url: String,
    },
}

/// Result alias of this module.
pub type Result<T, E = TaskError> = std::result::Result<T, E>;

/// Which occurrence the ordinal variant asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Ordinal {
    /// The first value inserted.
    First,
    /// The second value inserted.
    Second,
    /// The last value inserted.
    Last,
}

impl Ordinal {
    fn word(self) -> &'static str {
        match self {
            Ordinal::First => "first",
            Ordinal::Second => "second",
            Ordinal::Last => "last",
        }
    }
}

/// One task family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Task {
    /// One needle in repeated noise sentences; word key, 7-digit number value.
    NiahSingle1,
    /// One needle in essays; word key, number value.
    NiahSingle2,
    /// One needle in essays; word key, UUID value.
    NiahSingle3,
    /// Four needles with different keys in essays; one is asked for.
    NiahMultikey1,
    /// The haystack is made of needles; one is asked for.
    NiahMultikey2,
    /// Needle haystack with UUID keys and values.
    NiahMultikey3,
    /// Four values for one key in essays; all are asked for.
    NiahMultivalue,
    /// Four needles with different keys in essays; all four are asked for.
    NiahMultiquery,
    /// The same key inserted three times with different values; one occurrence is asked for.
    NiahOrdinal(Ordinal),
    /// Variable tracking: one chain of four hops in noise.
    Vt,
    /// Common words extraction: the ten most frequent words of a numbered list.
    Cwe,
    /// Frequent words extraction: the three most frequent coded words of Zipf-distributed text.
    Fwe,
    /// Passkey retrieval (Mohtashami & Jaggi 2023, as PoSE and LongLoRA evaluate it): a 5-digit
    /// pass key in noise; the question repeats the needle's words, so finding it is copying.
    Passkey,
    /// Question answering on SQuAD v2.0's dev set among its other paragraphs.
    Qa1,
    /// Multi-hop question answering on HotpotQA's dev set among its other paragraphs.
    Qa2,
    /// HELMET's JSON KV (from "Lost in the Middle"): the value of one UUID key among UUID pairs
    /// of a JSON object.
    JsonKv,
}

/// Every task, in the order summaries list them.
pub const ALL_TASKS: [Task; 18] = [
    Task::NiahSingle1,
    Task::NiahSingle2,
    Task::NiahSingle3,
    Task::NiahMultikey1,
    Task::NiahMultikey2,
    Task::NiahMultikey3,
    Task::NiahMultivalue,
    Task::NiahMultiquery,
    Task::NiahOrdinal(Ordinal::First),
    Task::NiahOrdinal(Ordinal::Second),
    Task::NiahOrdinal(Ordinal::Last),
    Task::Vt,
    Task::Cwe,
    Task::Fwe,
    Task::Qa1,
    Task::Qa2,
    Task::JsonKv,
    Task::Passkey,
];

/// Every distinct task name.
pub fn task_names() -> Vec<&'static str> {
    ALL_TASKS.iter().map(|t| t.name()).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hay {
    /// RULER's `repeat`: one noise paragraph repeated.
    Noise,
    /// Essays (the bundled books or `--haystack`).
    Essay,
    /// Distractor needles with other keys.
    Needles,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Words,
    Numbers,
    Uuids,
}

impl Kind {
    fn plural(self) -> &'static str {
        match self {
            Kind::Words => "words",
            Kind::Numbers => "numbers",
            Kind::Uuids => "uuids",
        }
    }
}

/// RULER's NIAH parameters: haystack, key and value types, keys, values per key, keys queried.
struct Niah {
    hay: Hay,
    key: Kind,
    value: Kind,
    k: usize,
    v: usize,
    q: usize,
}

const NOISE: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

/// Occurrences of the key in the ordinal variant.
const ORDINAL_OCCURRENCES: usize = 3;

impl Task {
    /// The name used on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            Task::NiahSingle1 => "niah_single_1",
            Task::NiahSingle2 => "niah_single_2",
            Task::NiahSingle3 => "niah_single_3",
            Task::NiahMultikey1 => "niah_multikey_1",
            Task::NiahMultikey2 => "niah_multikey_2",
            Task::NiahMultikey3 => "niah_multikey_3",
            Task::NiahMultivalue => "niah_multivalue",
            Task::NiahMultiquery => "niah_multiquery",
            Task::NiahOrdinal(Ordinal::First) => "niah_ordinal_first",
            Task::NiahOrdinal(Ordinal::Second) => "niah_ordinal_second",
            Task::NiahOrdinal(Ordinal::Last) => "niah_ordinal_last",
            Task::Vt => "vt",
            Task::Cwe => "cwe",
            Task::Fwe => "fwe",
            Task::Passkey => "passkey",
            Task::Qa1 => "qa_1",
            Task::Qa2 => "qa_2",
            Task::JsonKv => "json_kv",
        }
    }

    /// The task called `name`.
    pub fn parse(name: &str) -> Result<Task> {
        ALL_TASKS
            .iter()
            .copied()
            .find(|t| t.name() == name)
            .ok_or_else(|| TaskError::UnknownTask {
                name: name.to_string(),
                known: task_names().join(", "),
            })
    }

    /// Whether an item asks for one value (which teacher-forced scoring can rank among the
    /// context's values); multi-value, multi-query, vt, cwe and fwe ask for several, and QA
    /// answers are free text.
    pub fn has_single_answer(self) -> bool {
        !matches!(
            self,
            Task::NiahMultivalue
                | Task::NiahMultiquery
                | Task::Vt
                | Task::Cwe
                | Task::Fwe
                | Task::Qa1
                | Task::Qa2
        )
    }

    /// The published QA set the task reads, for qa_1 and qa_2.
    pub fn qa_source(self) -> Option<QaSource> {
        match self {
            Task::Qa1 => Some(QaSource::Squad),
            Task::Qa2 => Some(QaSource::HotpotQa),
            _ => None,
        }
    }

    /// Whether RULER draws the task's text from its essays (the needle tasks with the essay
    /// haystack) or, for cwe, from a word list: where rsd's haystack stands in for them.
    pub fn uses_haystack_text(self) -> bool {
        self == Task::Cwe || self.niah().is_some_and(|n| n.hay == Hay::Essay)
    }

    /// Whether the evidence sits at one depth (needle tasks) or is spread over the context.
    pub fn has_depth(self) -> bool {
        !matches!(self, Task::Vt | Task::Cwe | Task::Fwe)
    }

    /// RULER's `tokens_to_generate` for the task.
    pub fn default_max_new_tokens(self) -> usize {
        match self {
            Task::Vt => 30,
            Task::Cwe => 120,
            Task::Fwe => 50,
            Task::Passkey => 16,
            Task::Qa1 | Task::Qa2 => 32,
            Task::JsonKv => 100,
            _ => 128,
        }
    }

    /// Most tokens a prompt may fall short of its budget (about one haystack unit).
    pub fn tolerance(self) -> usize {
        match self {
            Task::NiahSingle2
            | Task::NiahSingle3
            | Task::NiahMultikey1
            | Task::NiahMultivalue
            | Task::NiahMultiquery
            | Task::NiahOrdinal(_) => 16,
            Task::NiahMultikey2 => 48,
            Task::NiahMultikey3 => 80,
            Task::NiahSingle1 | Task::Vt | Task::Fwe | Task::Passkey => 32,
            Task::Cwe => 24,
            // One document: a SQuAD paragraph is ~150 tokens, a long one ~700.
            Task::Qa1 | Task::Qa2 => 800,
            // One key-value pair: two UUIDs.
            Task::JsonKv => 64,
        }
    }

    fn niah(self) -> Option<Niah> {
        let n = |hay, key, value, k, v, q| {
            Some(Niah {
                hay,
                key,
                value,
                k,
                v,
                q,
            })
        };
        use Kind::*;
        match self {
            Task::NiahSingle1 => n(Hay::Noise, Words, Numbers, 1, 1, 1),
            Task::NiahSingle2 => n(Hay::Essay, Words, Numbers, 1, 1, 1),
            Task::NiahSingle3 => n(Hay::Essay, Words, Uuids, 1, 1, 1),
            Task::NiahMultikey1 => n(Hay::Essay, Words, Numbers, 4, 1, 1),
            Task::NiahMultikey2 => n(Hay::Needles, Words, Numbers, 1, 1, 1),
            Task::NiahMultikey3 => n(Hay::Needles, Uuids, Uuids, 1, 1, 1),
            Task::NiahMultivalue => n(Hay::Essay, Words, Numbers, 1, 4, 1),
            Task::NiahMultiquery => n(Hay::Essay, Words, Numbers, 4, 1, 4),
            Task::NiahOrdinal(_) => n(Hay::Essay, Words, Numbers, 1, ORDINAL_OCCURRENCES, 1),
            _ => None,
        }
    }
}

impl fmt::Display for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// RULER-style evenly spaced depths: `k` points from 0 to 1 inclusive (one point: the middle),
/// rounded to whole percent as RULER's depth list is.
pub fn depths(k: usize) -> Vec<f64> {
    match k {
        0 => Vec::new(),
        1 => vec![0.5],
        _ => (0..k)
            .map(|i| (100.0 * i as f64 / (k - 1) as f64).round() / 100.0)
            .collect(),
    }
}

/// Where the needle tasks' evidence goes, over a run's samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DepthGrid {
    /// `--depths` evenly spaced depths, every sample at each (tables by depth).
    #[default]
    Even,
    /// RULER's: each sample at one depth drawn from `round(linspace(0, 100, 40))` percent.
    Ruler,
}

/// RULER's needle depths in percent: `np.round(np.linspace(0, 100, num=40))`.
pub fn ruler_depth_grid() -> Vec<u32> {
    (0..40)
        .map(|i| (100.0 * i as f64 / 39.0).round() as u32)
        .collect()
}

/// The depth of sample `sample` of (task, length) under RULER's grid: one of its 40 depths,
/// drawn from the seed.
pub fn ruler_depth(seed: u64, task: Task, length: usize, sample: usize) -> f64 {
    let grid = ruler_depth_grid();
    let mut rng = SplitMix64::keyed(&[
        seed,
        name_key(task.name()),
        length as u64,
        sample as u64,
        name_key("ruler-depth"),
    ]);
    grid[(rng.next_u64() % grid.len() as u64) as usize] as f64 / 100.0
}

/// One generated prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The task.
    pub task: Task,
    /// Length asked for (prompt + answer tokens).
    pub length: usize,
    /// Depth of the answering needle, for needle tasks.
    pub depth: Option<f64>,
    /// Sample index.
    pub sample: usize,
    /// The prompt text (ends with the answer prefix); with a chat template, the rendered text.
    pub prompt: String,
    /// Its tokens (with the tokenizer's special tokens, as `tokenizer(prompt)` gives, except
    /// that a rendered chat prompt that begins with the BOS token's text gets no second one).
    pub ids: Vec<i64>,
    /// What a correct answer contains.
    pub expected: Vec<String>,
    /// Values that must not come first in the answer (the ordinal variant's other values).
    pub distractors: Vec<String>,
    /// Every value the context offers as an answer, `expected[0]` among them, each once, in
    /// context order: for the needle tasks, the value of every needle sentence (the asked one,
    /// the other keys' and the haystack's); for the other tasks, `expected` alone. Teacher-forced
    /// scoring ranks the expected value among these.
    pub candidates: Vec<String>,
    /// Tokens the model may generate; `ids.len() + max_new_tokens <= length`.
    pub max_new_tokens: usize,
    /// The sentences that carry the answer, the one at `depth` first.
    pub evidence: Vec<String>,
    /// Byte range of the context (haystack and needles) inside `prompt`.
    pub context: Range<usize>,
    /// Byte offset of each `evidence` sentence inside `prompt`.
    pub evidence_at: Vec<usize>,
}

/// The value of every needle sentence ("One of the special magic … for KEY is: VALUE.") in
/// `context`, each once, in order; `expected` first-seen where a needle holds it, and added at
/// the end where none does (it always does in a generated item).
fn needle_values(context: &str, expected: &[String]) -> Vec<String> {
    const NEEDLE: &str = "One of the special magic ";
    let mut out: Vec<String> = Vec::new();
    for part in context.split(NEEDLE).skip(1) {
        let sentence = part.split('\n').next().unwrap_or(part);
        let Some((_, rest)) = sentence.split_once(" is: ") else {
            continue;
        };
        // A value is a number, a word or a UUID: it ends at the sentence's full stop.
        let value = rest
            .split(". ")
            .next()
            .unwrap_or(rest)
            .trim_end_matches('.');
        if !value.is_empty() && !out.iter().any(|v| v == value) {
            out.push(value.to_string());
        }
    }
    if let Some(e) = expected.first() {
        if !out.contains(e) {
            out.push(e.clone());
        }
    }
    out
}

/// Generates items; everything random is keyed by (seed, task, length, depth, sample).
#[derive(Clone, Copy)]
pub struct Generator<'a> {
    tokenizer: &'a TextTokenizer,
    haystack: &'a Haystack,
    seed: u64,
    chat: Option<&'a ChatTemplate>,
    qa: Option<&'a QaData>,
}

/// A candidate prompt: text, context range, where each evidence sentence sits, where the answer
/// prefix starts.
struct Built {
    prompt: String,
    context: Range<usize>,
    evidence_at: Vec<usize>,
    answer_at: usize,
}

/// Needles and where they go: (depth in [0, 1], text, evidence index or None for a distractor).
type Placed = Vec<(f64, String, Option<usize>)>;

fn name_key(name: &str) -> u64 {
    // FNV-1a: a stable hash of the task name (std's hasher is not stable across releases).
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Inserts needles between `units` (ties keep needle order), joins with `sep`, and returns the
/// text and each evidence needle's byte offset. A needle at depth `d` goes to the unit boundary
/// nearest to the fraction `d` of the haystack's text: RULER inserts at `int(units * d)`, which for
/// units of unequal length (an essay's sentences) can sit far from `d` of the context.
fn insert(
    units: &[String],
    needles: &Placed,
    sep: &str,
    n_evidence: usize,
) -> (String, Vec<usize>) {
    let mut cum = Vec::with_capacity(units.len() + 1);
    cum.push(0usize);
    for u in units {
        cum.push(cum.last().copied().unwrap_or(0) + u.len() + sep.len());
    }
    let mut at: Vec<(usize, usize)> = needles
        .iter()
        .enumerate()
        .map(|(i, (d, _, _))| (nearest_boundary(&cum, *d), i))
        .collect();
    at.sort();
    let mut pieces: Vec<(&str, Option<usize>)> = Vec::with_capacity(units.len() + needles.len());
    let mut next = at.iter().peekable();
    for u in 0..=units.len() {
        while let Some(&&(pos, i)) = next.peek() {
            if pos > u {
                break;
            }
            pieces.push((needles[i].1.as_str(), needles[i].2));
            next.next();
        }
        if u < units.len() {
            pieces.push((units[u].as_str(), None));
        }
    }
    let mut text = String::new();
    let mut offsets = vec![0; n_evidence];
    for (j, (p, ev)) in pieces.iter().enumerate() {
        if j > 0 {
            text.push_str(sep);
        }
        if let Some(e) = ev {
            offsets[*e] = text.len();
        }
        text.push_str(p);
    }
    (text, offsets)
}

/// The unit boundary (0 before the first unit, `cum.len() - 1` after the last) nearest to the
/// fraction `d` of the text, from the units' cumulative byte lengths `cum` (starting at 0).
fn nearest_boundary(cum: &[usize], d: f64) -> usize {
    let units = cum.len() - 1;
    let target = d * cum[units] as f64;
    let i = cum.partition_point(|&c| (c as f64) < target);
    if i > 0 && (i == cum.len() || target - cum[i - 1] as f64 <= cum[i] as f64 - target) {
        i - 1
    } else {
        i.min(units)
    }
}

/// Sentences of a run of words: a sentence ends at a word ending in `.`, `!` or `?` (possibly
/// followed by closing quotes or brackets).
fn sentences<'w>(words: impl Iterator<Item = &'w str>) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for w in words {
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
        let end = w.trim_end_matches(['"', '\'', ')', ']', '\u{201d}', '\u{2019}']);
        if end.ends_with(['.', '!', '?']) {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

impl<'a> Generator<'a> {
    /// A generator over `haystack`, counting tokens with `tokenizer`.
    pub fn new(tokenizer: &'a TextTokenizer, haystack: &'a Haystack, seed: u64) -> Self {
        Generator {
            tokenizer,
            haystack,
            seed,
            chat: None,
            qa: None,
        }
    }

    /// Generates qa_1 and qa_2 from `qa`.
    pub fn with_qa(mut self, qa: &'a QaData) -> Self {
        self.qa = Some(qa);
        self
    }

    /// Renders every prompt's question with `chat` (see the module docs).
    pub fn with_chat_template(mut self, chat: &'a ChatTemplate) -> Self {
        self.chat = Some(chat);
        self
    }

    /// The prompt as the model sees it: plain, or the question rendered by the chat template
    /// followed by the answer prefix (offsets moved along).
    fn finish(&self, b: Built) -> Result<Built> {
        let Some(chat) = self.chat else {
            return Ok(b);
        };
        let rendered = chat.render_user(&b.prompt[..b.answer_at])?;
        // The message is usually verbatim in the rendered text; a template that trims it still
        // keeps the context.
        let ctx = &b.prompt[b.context.clone()];
        let start = match rendered.find(&b.prompt[..b.answer_at]) {
            Some(q) => q + b.context.start,
            None => rendered.find(ctx).ok_or_else(|| ChatError::Template {
                source_name: chat.source_name().to_string(),
                message: "the rendered prompt does not hold the task's context verbatim".into(),
            })?,
        };
        let shift = |o: usize| o - b.context.start + start;
        let answer_at = rendered.len();
        Ok(Built {
            context: start..start + ctx.len(),
            evidence_at: b.evidence_at.iter().map(|&o| shift(o)).collect(),
            prompt: rendered + &b.prompt[b.answer_at..],
            answer_at,
        })
    }

    /// The prompt's ids: with the tokenizer's special tokens, unless a chat template put the BOS
    /// token's text first already.
    fn encode(&self, prompt: &str) -> Result<Vec<i64>> {
        let bos_in_text = self
            .chat
            .and_then(ChatTemplate::bos)
            .is_some_and(|b| !b.is_empty() && prompt.starts_with(b));
        Ok(self.tokenizer.encode(prompt, !bos_in_text)?)
    }

    /// The item (task, length, depth, sample); `max_new_tokens` defaults to the task's.
    pub fn item(
        &self,
        task: Task,
        length: usize,
        depth: Option<f64>,
        sample: usize,
        max_new_tokens: Option<usize>,
    ) -> Result<Item> {
        let depth = if task.has_depth() {
            Some(depth.unwrap_or(0.5).clamp(0.0, 1.0))
        } else {
            None
        };
        let max_new_tokens = max_new_tokens.unwrap_or(task.default_max_new_tokens());
        let mut rng = SplitMix64::keyed(&[
            self.seed,
            name_key(task.name()),
            length as u64,
            depth.map(f64::to_bits).unwrap_or(u64::MAX),
            sample as u64,
        ]);
        let budget = length.saturating_sub(max_new_tokens);
        let spec = Spec {
            task,
            length,
            budget,
            max_new_tokens,
        };
        let (built, expected, distractors, evidence) = match task {
            Task::Vt => self.vt(&spec, &mut rng)?,
            Task::Cwe => self.cwe(&spec, &mut rng)?,
            Task::Fwe => self.fwe(&spec, &mut rng)?,
            Task::Passkey => self.passkey(&spec, depth.unwrap_or(0.5), &mut rng)?,
            Task::Qa1 | Task::Qa2 => self.qa(&spec, depth.unwrap_or(0.5), sample, &mut rng)?,
            Task::JsonKv => self.json_kv(&spec, depth.unwrap_or(0.5), &mut rng)?,
            _ => self.niah(&spec, depth.unwrap_or(0.5), &mut rng)?,
        };
        let ((_, built), expected, distractors, evidence) =
            (built, expected, distractors, evidence);
        let ids = self.encode(&built.prompt)?;
        let candidates = match task {
            Task::Vt | Task::Cwe | Task::Fwe | Task::Passkey | Task::Qa1 | Task::Qa2 => {
                expected.clone()
            }
            Task::JsonKv => json_kv_values(&built.prompt[built.context.clone()]),
            _ => needle_values(&built.prompt[built.context.clone()], &expected),
        };
        Ok(Item {
            task,
            length,
            depth,
            sample,
            prompt: built.prompt,
            ids,
            expected,
            distractors,
            candidates,
            max_new_tokens,
            evidence,
            context: built.context,
            evidence_at: built.evidence_at,
        })
    }

    fn count(&self, text: &str) -> Result<usize> {
        Ok(self.encode(text)?.len())
    }

    /// The largest `n` in `0..=max_n` whose prompt fits the budget, with its token count. A
    /// prompt's tokens grow about linearly with its haystack units, so a few secant steps
    /// (through the empty prompt and the latest measurement) land next to the answer; bisection
    /// finishes (and takes over if the secant stalls). Every unit is at least one token, so more
    /// than `budget` units never fit.
    fn fill(
        &self,
        spec: &Spec,
        max_n: usize,
        build: impl Fn(usize) -> Built,
    ) -> Result<(usize, Built)> {
        const SECANT_STEPS: usize = 6;
        let first = self.finish(build(0))?;
        let base = self.count(&first.prompt)?;
        if base > spec.budget {
            return Err(TaskError::TooShort {
                task: spec.task.name().into(),
                length: spec.length,
                needed: base,
                budget: spec.budget,
                max_new_tokens: spec.max_new_tokens,
            });
        }
        let (mut lo, mut lo_tokens, mut lo_built) = (0, base, first);
        let mut hi = max_n.min(spec.budget) + 1;
        let mut guess = 64;
        let mut step = 0;
        while hi - lo > 1 {
            let mid = if step < SECANT_STEPS {
                guess.clamp(lo + 1, hi - 1)
            } else {
                lo + (hi - lo) / 2
            };
            step += 1;
            let b = self.finish(build(mid))?;
            let t = self.count(&b.prompt)?;
            let per_unit = (t.saturating_sub(base) as f64 / mid as f64).max(1e-3);
            let estimate = ((spec.budget - base) as f64 / per_unit).floor() as usize;
            if t <= spec.budget {
                (lo, lo_tokens, lo_built) = (mid, t, b);
                guess = estimate.max(lo + 1);
            } else {
                hi = mid;
                guess = estimate.min(hi.saturating_sub(1));
            }
        }
        Ok((lo_tokens, lo_built))
    }
}

/// Task, length, token budget of the prompt, tokens reserved for the answer.
#[derive(Clone, Copy)]
struct Spec {
    task: Task,
    length: usize,
    budget: usize,
    max_new_tokens: usize,
}

/// ((prompt tokens, prompt), expected, distractors, evidence sentences).
type Outcome = ((usize, Built), Vec<String>, Vec<String>, Vec<String>);

/// The plain prompt: `head`, the context, the question's `tail`, then the `answer` prefix.
fn wrap(head: &str, ctx: &str, tail: &str, answer: &str, offs: &[usize]) -> Built {
    Built {
        prompt: format!("{head}{ctx}{tail}{answer}"),
        context: head.len()..head.len() + ctx.len(),
        evidence_at: offs.iter().map(|o| o + head.len()).collect(),
        answer_at: head.len() + ctx.len() + tail.len(),
    }
}

/// RULER's numbered word list: "1. w 2. w …", on one line.
fn numbered(words: &[&str]) -> String {
    let items: Vec<String> = words
        .iter()
        .enumerate()
        .map(|(i, w)| format!("{}. {w}", i + 1))
        .collect();
    items.join(" ")
}

fn singular(plural: &str) -> &str {
    plural.strip_suffix('s').unwrap_or(plural)
}

fn join_and(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{}, and {last}", rest.join(", ")),
    }
}

fn shuffle<T>(v: &mut [T], rng: &mut SplitMix64) {
    for i in (1..v.len()).rev() {
        let j = rng.range(0, i as i64) as usize;
        v.swap(i, j);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qa::QaSet;
    use std::sync::OnceLock;

    /// The bundled Qwen3 tokenizer (the repository's assets), unpacked once per test binary.
    fn tokenizer() -> &'static TextTokenizer {
        static TOK: OnceLock<TextTokenizer> = OnceLock::new();
        TOK.get_or_init(|| {
            let zst = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../assets/tokenizers/qwen3/tokenizer.json.zst");
            let bytes = zstd::decode_all(std::fs::File::open(zst).unwrap()).unwrap();
            let dir = std::env::temp_dir().join(format!("rsd-eval-tok-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("tokenizer.json");
            std::fs::write(&path, bytes).unwrap();
            let tok = TextTokenizer::from_file(&path).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
            tok
        })
    }

    fn haystack() -> &'static Haystack {
        static H: OnceLock<Haystack> = OnceLock::new();
        H.get_or_init(|| {
            Haystack::from_dir(&Haystack::bundled_dir().unwrap(), tokenizer()).unwrap()
        })
    }

    fn count(text: &str) -> usize {
        tokenizer().encode(text, false).unwrap().len()
    }

    /// SQuAD- and HotpotQA-shaped sets of 60-word paragraphs cut from the haystack, each
    /// question answered by a word of its paragraph.
    fn qa_data() -> &'static QaData {
        static QA: OnceLock<QaData> = OnceLock::new();
        QA.get_or_init(|| {
            let words = &haystack().words;
            let para = |i: usize| words.joined(i * 60, (i + 1) * 60);
            let articles: Vec<serde_json::Value> = (0..20)
                .map(|a| {
                    let paragraphs: Vec<serde_json::Value> = (0..5)
                        .map(|p| {
                            let i = a * 5 + p;
                            serde_json::json!({"context": para(i), "qas": [{
                                "question": format!("Which word is word {i}?"), "id": i.to_string(),
                                "answers": [{"text": words.get(i * 60 + 7), "answer_start": 0}],
                                "is_impossible": false}]})
                        })
                        .collect();
                    serde_json::json!({"title": format!("A{a}"), "paragraphs": paragraphs})
                })
                .collect();
            let entries: Vec<serde_json::Value> = (0..20)
                .map(|e| {
                    let context: Vec<serde_json::Value> = (0..10)
                        .map(|j| serde_json::json!([format!("T{e}-{j}"), [para(100 + e * 10 + j)]]))
                        .collect();
                    serde_json::json!({"_id": e.to_string(), "question": format!("q{e}?"),
                        "answer": words.get((100 + e * 10) * 60 + 3),
                        "supporting_facts": [[format!("T{e}-0"), 0], [format!("T{e}-3"), 0]],
                        "context": context})
                })
                .collect();
            let dir = std::env::temp_dir().join(format!("rsd-eval-qa-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let squad = serde_json::json!({"version": "v2.0", "data": articles});
            std::fs::write(dir.join("squad.json"), squad.to_string()).unwrap();
            std::fs::write(
                dir.join("hotpotqa.json"),
                serde_json::Value::from(entries).to_string(),
            )
            .unwrap();
            let qa = QaData {
                squad: Some(QaSet::read(QaSource::Squad, &dir).unwrap()),
                hotpotqa: Some(QaSet::read(QaSource::HotpotQa, &dir).unwrap()),
            };
            std::fs::remove_dir_all(&dir).unwrap();
            qa
        })
    }

    fn generator(seed: u64) -> Generator<'static> {
        Generator::new(tokenizer(), haystack(), seed).with_qa(qa_data())
    }

    #[test]
    fn candidates_are_every_value_the_context_offers() {
        let g = generator(3);
        let needles = |it: &Item| {
            it.prompt[it.context.clone()]
                .matches("One of the special magic ")
                .count()
        };
        for (task, at_least) in [
            (Task::NiahMultikey2, 10),
            (Task::NiahMultikey3, 5),
            (Task::NiahMultikey1, 4),
            (Task::NiahSingle2, 1),
            (Task::NiahOrdinal(Ordinal::Second), 3),
        ] {
            let it = g.item(task, 1024, Some(0.3), 0, None).unwrap();
            assert_eq!(
                it.candidates.len(),
                needles(&it),
                "{task:?}: {:?}",
                it.candidates
            );
            assert!(
                it.candidates.len() >= at_least,
                "{task:?}: {:?}",
                it.candidates
            );
            assert!(it.candidates.contains(&it.expected[0]), "{task:?}");
            for c in &it.candidates {
                assert!(it.prompt.contains(&format!(" is: {c}.")), "{task:?}: {c}");
            }
            let unique: HashSet<&String> = it.candidates.iter().collect();
            assert_eq!(unique.len(), it.candidates.len());
        }
        let it = g.item(Task::Passkey, 512, Some(0.5), 0, None).unwrap();
        assert_eq!(it.candidates, it.expected);
    }

    #[test]
    fn depths_are_evenly_spaced_whole_percents() {
        assert_eq!(depths(1), vec![0.5]);
        assert_eq!(depths(3), vec![0.0, 0.5, 1.0]);
        assert_eq!(depths(10)[1], 0.11);
        assert_eq!(*depths(10).last().unwrap(), 1.0);
    }

    #[test]
    fn unknown_task_names_the_known_ones() {
        let e = Task::parse("niah_single_9").unwrap_err().to_string();
        assert!(
            e.contains("niah_single_9") && e.contains("niah_multiquery, niah_ordinal_first"),
            "{e}"
        );
        for t in ALL_TASKS {
            assert_eq!(Task::parse(t.name()).unwrap(), t);
        }
    }

    #[test]
    fn same_seed_same_prompts_other_seed_other_prompts() {
        for task in ALL_TASKS {
            let a = generator(7).item(task, 1024, Some(0.3), 2, None).unwrap();
            let b = generator(7).item(task, 1024, Some(0.3), 2, None).unwrap();
            let c = generator(8).item(task, 1024, Some(0.3), 2, None).unwrap();
            let d = generator(7).item(task, 1024, Some(0.3), 3, None).unwrap();
            assert_eq!(a, b, "{task}");
            assert_ne!(a.prompt, c.prompt, "{task}: seed changes nothing");
            // A QA sample asks the set's question of that number, whatever the seed (as RULER).
            if task.qa_source().is_none() {
                assert_ne!(a.expected, c.expected, "{task}: seed changes nothing");
            }
            assert_ne!(a.prompt, d.prompt, "{task}: sample changes nothing");
        }
    }

    /// Every task, two lengths: prompt + answer budget within `tolerance` of the length, never
    /// above; the ids are the prompt's tokens; every expected answer is in the context.
    #[test]
    fn every_task_fills_its_token_budget_and_holds_its_answers() {
        let g = generator(1);
        for task in ALL_TASKS {
            for length in [1024, 4096] {
                let it = g.item(task, length, Some(0.5), 0, None).unwrap();
                let total = it.ids.len() + it.max_new_tokens;
                assert!(total <= length, "{task} {length}: {total} tokens");
                assert!(
                    total + task.tolerance() >= length,
                    "{task} {length}: {total} tokens, more than {} short",
                    task.tolerance()
                );
                assert_eq!(it.ids, tokenizer().encode(&it.prompt, true).unwrap());
                assert_eq!(tokenizer().decode(&it.ids).unwrap(), it.prompt);
                let ctx = &it.prompt[it.context.clone()];
                for e in &it.expected {
                    assert!(
                        ctx.contains(e.as_str()),
                        "{task} {length}: {e} not in the context"
                    );
                }
                for (ev, &at) in it.evidence.iter().zip(&it.evidence_at) {
                    assert!(
                        it.prompt[at..].starts_with(ev.as_str()),
                        "{task}: {ev} not at {at}"
                    );
                }
                assert!(
                    it.prompt.ends_with(['e', 's', ':', ' ']),
                    "{task}: no answer prefix"
                );
            }
        }
    }

    /// Decode the tokens, find the answering needle, and measure its depth in tokens of the
    /// context: within 5 % of the stated depth (the needle goes between haystack units).
    #[test]
    fn the_needle_sits_at_the_stated_depth() {
        let g = generator(3);
        for task in ALL_TASKS.into_iter().filter(|t| t.has_depth()) {
            for (s, depth) in [0.0, 0.25, 0.5, 0.8, 1.0].into_iter().enumerate() {
                let it = g.item(task, 8192, Some(depth), s, None).unwrap();
                let text = tokenizer().decode(&it.ids).unwrap();
                let at = text.find(&it.evidence[0]).unwrap();
                assert_eq!(at, it.evidence_at[0], "{task}: the needle is elsewhere");
                let (c0, c1) = (
                    count(&text[..it.context.start]),
                    count(&text[..it.context.end]),
                );
                let measured = (count(&text[..at]) - c0) as f64 / (c1 - c0) as f64;
                assert!(
                    (measured - depth).abs() <= 0.05,
                    "{task}: stated depth {depth}, needle at {measured:.3}"
                );
            }
        }
    }

    #[test]
    fn ordinal_values_come_in_order_around_the_asked_one() {
        let g = generator(5);
        for (o, asked) in [
            (Ordinal::First, 0),
            (Ordinal::Second, 1),
            (Ordinal::Last, 2),
        ] {
            for depth in [0.0, 0.5, 1.0] {
                let it = g
                    .item(Task::NiahOrdinal(o), 2048, Some(depth), 0, None)
                    .unwrap();
                let mut values = it.distractors.clone();
                values.insert(asked, it.expected[0].clone());
                let pos: Vec<usize> = values
                    .iter()
                    .map(|v| it.prompt.find(&format!("is: {v}.")).unwrap())
                    .collect();
                assert!(
                    pos.windows(2).all(|w| w[0] < w[1]),
                    "{o:?} {depth}: {pos:?}"
                );
                assert!(it
                    .prompt
                    .contains(&format!("the {} special magic number", o.word())));
            }
        }
    }

    #[test]
    fn word_extraction_answers_are_the_most_frequent() {
        let g = generator(2);
        let it = g.item(Task::Fwe, 4096, None, 0, None).unwrap();
        let ctx = &it.prompt[it.context.clone()];
        let n = |w: &str| ctx.split(' ').filter(|x| *x == w).count();
        let top: Vec<usize> = it.expected.iter().map(|w| n(w)).collect();
        assert!(
            top[0] >= top[1] && top[1] >= top[2] && top[2] > 0,
            "{top:?}"
        );
        let it = g.item(Task::Vt, 4096, None, 0, None).unwrap();
        assert_eq!(it.expected.len(), 5);
        assert!(it.evidence[0].starts_with(&format!("VAR {} = ", it.expected[0])));
    }

    /// RULER's QA prompt: its template, documents numbered from 1 and joined by blank lines,
    /// the question's own paragraph among them with the other paragraphs of its article as the
    /// first distractors, question `sample` of the set, and its answers expected.
    #[test]
    fn qa_prompts_follow_ruler() {
        let g = generator(4);
        let squad = qa_data().squad.as_ref().unwrap();
        for (sample, length) in [(3, 600), (7, 4096)] {
            let it = g.item(Task::Qa1, length, Some(0.5), sample, None).unwrap();
            let q = &squad.questions[sample];
            assert_eq!(it.expected, q.outputs);
            assert!(it.prompt.starts_with("Answer the question based on the given documents. Only give me the answer and do not output any other words.\n\nThe following are given documents.\n\nDocument 1:\n"));
            assert!(it.prompt.ends_with(&format!("\n\nAnswer the question based on the given documents. Only give me the answer and do not output any other words.\n\nQuestion: {} Answer:", q.query)));
            let ctx = &it.prompt[it.context.clone()];
            let docs: Vec<&str> = ctx.split("\n\n").collect();
            for (i, d) in docs.iter().enumerate() {
                let (head, text) = d.split_once('\n').unwrap();
                assert_eq!(head, format!("Document {}:", i + 1));
                assert!(squad.docs.iter().any(|x| x == text));
            }
            assert!(docs.iter().any(|d| d.ends_with(&squad.docs[q.context[0]])));
            let from_article = docs
                .iter()
                .filter(|d| q.more_context.iter().any(|&m| d.ends_with(&squad.docs[m])))
                .count();
            assert_eq!(
                from_article,
                (docs.len() - 1).min(q.more_context.len()),
                "{length}"
            );
            assert!(
                docs.len() > if length == 600 { 2 } else { 20 },
                "{length}: {}",
                docs.len()
            );
        }
        // HotpotQA: all ten paragraphs of the entry, the two supporting ones together.
        let hotpot = qa_data().hotpotqa.as_ref().unwrap();
        let it = g.item(Task::Qa2, 4096, Some(0.0), 2, None).unwrap();
        let q = &hotpot.questions[2];
        for &d in &q.context {
            assert!(it.prompt.contains(&hotpot.docs[d]));
        }
        assert_eq!(it.evidence.len(), 2);
        assert!(it.prompt[it.context.clone()].starts_with("Document 1:\n"));
        assert_eq!(it.evidence_at[0], it.context.start + "Document 1:\n".len());
        assert_eq!(
            it.evidence_at[1] - it.evidence_at[0],
            it.evidence[0].len() + "\n\nDocument 2:\n".len()
        );
        let none = Generator::new(tokenizer(), haystack(), 4);
        let e = none
            .item(Task::Qa2, 4096, None, 0, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("hotpotqa.json") && e.contains("--qa-dir"), "{e}");
    }

    /// HELMET's JSON KV: the object's pairs as "Lost in the Middle" formats them, the asked pair
    /// once, at the depth; the two demonstrations are pairs of the object; every value is a
    /// candidate.
    #[test]
    fn json_kv_follows_helmets_template() {
        let g = generator(6);
        for depth in [0.0, 0.5, 1.0] {
            let it = g.item(Task::JsonKv, 4096, Some(depth), 0, None).unwrap();
            let ctx = &it.prompt[it.context.clone()];
            assert!(it.prompt.starts_with("JSON data:\n{\""));
            let records: Vec<&str> = ctx.split(",\n ").collect();
            for r in &records {
                let (k, v) = r.split_once(": ").unwrap();
                assert!(
                    k.len() == 38 && v.len() == 38 && k.starts_with('"') && v.ends_with('"'),
                    "{r}"
                );
            }
            let (after, question) = it.prompt[it.context.end..].rsplit_once("Key: ").unwrap();
            assert!(after.starts_with("}\n\nExtract the value corresponding to the specified key in the JSON object below.\n\n"));
            let demos: Vec<&str> = it
                .prompt
                .match_indices("\nCorresponding value: ")
                .map(|(i, _)| &it.prompt[i..])
                .collect();
            assert_eq!(demos.len(), 2);
            for d in demos {
                let v = &d["\nCorresponding value: ".len()..][..36];
                assert!(
                    ctx.contains(&format!(": \"{v}\"")),
                    "a demonstration's pair is in the object"
                );
            }
            let key = &question[..36];
            assert!(it
                .prompt
                .ends_with(&format!("\n\nKey: {key}\nCorresponding value:")));
            assert_eq!(it.evidence[0], format!("\"{key}\": \"{}\"", it.expected[0]));
            assert_eq!(ctx.matches(key).count(), 1);
            assert_eq!(it.candidates.len(), records.len());
            assert!(it.candidates.contains(&it.expected[0]));
            let at = (it.evidence_at[0] - it.context.start) as f64 / ctx.len() as f64;
            assert!((at - depth).abs() < 0.05, "{depth}: {at}");
        }
    }

    /// RULER's variable tracking: a one-shot example of the same task with 3-letter variables
    /// and its own value, answered after the answer prefix ("they are:  V1 … V5"), a blank
    /// line, then the task with 5-letter variables; chain lines "VAR B = VAR A " keep RULER's
    /// trailing space.
    #[test]
    fn vt_has_rulers_one_shot_example() {
        let it = generator(8).item(Task::Vt, 4096, None, 0, None).unwrap();
        let head = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
        assert!(it.prompt.starts_with(head));
        let second = it.prompt[1..].find(head).unwrap() + 1;
        let (example, task) = it.prompt.split_at(second);
        let (ex_question, ex_answer) = example.split_once(", they are: ").unwrap();
        assert!(ex_answer.ends_with("\n\n"));
        let ex_vars: Vec<&str> = ex_answer.trim().split(' ').collect();
        assert!(ex_answer.starts_with(' ') && ex_vars.len() == 5);
        assert!(ex_vars
            .iter()
            .all(|v| v.len() == 3 && v.bytes().all(|b| b.is_ascii_uppercase())));
        assert!(ex_question.contains(&format!("VAR {} = VAR {} \n", ex_vars[1], ex_vars[0])));
        assert!(it
            .expected
            .iter()
            .all(|v| v.len() == 5 && !example.contains(v.as_str())));
        assert!(task.ends_with(", they are: "));
        assert!(it.evidence[1].ends_with(' ') && it.evidence[1].starts_with("VAR "));
        // The example fills about 500 tokens (RULER's), its answer on top, at 4K.
        let n = count(example);
        assert!((400..=530).contains(&n), "{n}");
    }

    /// RULER's common-words setup: one line "1. w 2. w …"; the ten common words 6 times and the
    /// others once below 4K tokens, 30 and 3 times from 4K on; a one-shot example first, with
    /// its own list and its answer numbered after the answer prefix.
    #[test]
    fn cwe_follows_rulers_setup() {
        let g = generator(2);
        for (length, freq_cw, freq_ucw, example_items) in [(2048, 6, 1, 40), (4096, 30, 3, 190)] {
            let it = g.item(Task::Cwe, length, None, 0, None).unwrap();
            let ctx = &it.prompt[it.context.clone()];
            assert!(!ctx.contains('\n'), "{length}: the list is one line");
            let tokens: Vec<&str> = ctx.split(' ').collect();
            let mut words = Vec::new();
            for (i, pair) in tokens.chunks(2).enumerate() {
                assert_eq!(pair[0], format!("{}.", i + 1), "{length}: numbering");
                words.push(pair[1]);
            }
            let n = |w: &str| words.iter().filter(|x| **x == w).count();
            assert_eq!(it.expected.len(), 10);
            for e in &it.expected {
                assert_eq!(n(e), freq_cw, "{length}: {e}");
            }
            for w in words
                .iter()
                .filter(|w| !it.expected.iter().any(|e| e == *w))
            {
                assert_eq!(n(w), freq_ucw, "{length}: {w}");
            }
            // The example: the whole template with its own list, answered, then a newline.
            let head = "Below is a numbered list of words.";
            assert!(it.prompt.starts_with(head));
            let second = it.prompt[1..].find(head).unwrap() + 1;
            let example = &it.prompt[..second];
            let (ex_list, ex_answer) = example
                .split_once("\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that appear most often in the list are: ")
                .unwrap();
            assert_eq!(
                ex_list.rsplit('\n').next().unwrap().split(' ').count(),
                2 * example_items
            );
            assert!(ex_answer.starts_with("1. ") && ex_answer.ends_with('\n'));
            assert!(ex_answer.trim_end().split(' ').nth(18) == Some("10."));
            assert_eq!(second, it.context.start - head.len() - " In these words, some appear more often than others. Memorize the ones that appear most often.\n".len());
        }
    }

    /// With a chat template the question is wrapped, the answer prefix follows the generation
    /// prompt, the wrapper's tokens count, and the offsets still point into the prompt.
    #[test]
    fn chat_prompts_wrap_the_question_and_still_fill_the_length() {
        let chat = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "test.jinja",
            None,
        )
        .unwrap();
        let g = generator(1).with_chat_template(&chat);
        for task in ALL_TASKS {
            let it = g.item(task, 1024, Some(0.5), 0, None).unwrap();
            let total = it.ids.len() + it.max_new_tokens;
            assert!(
                total <= 1024 && total + task.tolerance() >= 1024,
                "{task}: {total}"
            );
            assert_eq!(it.ids, tokenizer().encode(&it.prompt, true).unwrap());
            assert!(it.prompt.starts_with("<|im_start|>user\n"), "{task}");
            let (question, answer) = it
                .prompt
                .split_once("<|im_end|>\n<|im_start|>assistant\n")
                .unwrap();
            if task == Task::JsonKv {
                // HELMET's question is the key itself; its answer prefix starts a new line.
                assert!(question.ends_with(&format!("Key: {}", &it.evidence[0][1..37])));
                assert_eq!(answer, "\nCorresponding value:");
            } else {
                assert!(question.ends_with(['?', '.']), "{task}: {question}");
                assert!(
                    answer.starts_with(" The ") || answer.starts_with(" Answer:"),
                    "{task}"
                );
            }
            let ctx = &it.prompt[it.context.clone()];
            assert!(
                it.expected.iter().all(|e| ctx.contains(e.as_str())),
                "{task}"
            );
            for (ev, &at) in it.evidence.iter().zip(&it.evidence_at) {
                assert!(it.prompt[at..].starts_with(ev.as_str()), "{task}: {ev}");
            }
        }
    }

    #[test]
    fn too_short_a_length_is_an_error() {
        let g = generator(0);
        let e = g
            .item(Task::NiahSingle1, 150, Some(0.5), 0, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("use a larger length"), "{e}");
    }
}
