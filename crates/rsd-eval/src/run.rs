//! `rsd-eval run`: generate every item, let the model complete it, score it, and keep the results.
//!
//! A run directory holds
//! * `run.json`: the settings that define the items and the model's outputs ([`RunSettings`]),
//!   plus those that do not (batch size, device);
//! * `results.jsonl`: one [`ItemResult`] per item, appended and flushed as each batch finishes;
//! * `summary.json`, `summary.md`: mean scores per task × length, per task × length × depth, per
//!   length and overall, rebuilt from `results.jsonl` at the end of every run.
//!
//! Rerunning into the same directory with the same settings skips the items already in
//! `results.jsonl` (by [`ItemResult::key`]); with different settings it is refused, naming the
//! setting, because the results would mix two experiments.
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{BufWriter, IsTerminal, Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use rsd_common::hex;
use rsd_common::progress::ProgressLines;
use rsd_common::safe_fs;
use rsd_model::cli::{DeviceArgs, ScalingRequest};
use rsd_model::generate::{self as gen, GenerateOptions, TextTokenizer};
use rsd_model::{Model, ModelConfig, RopeScaling};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::qa::{QaData, QaSet, QaSource};
use crate::results::{item_key, read_results, ItemKey, ItemResult};
use crate::score::score;
use crate::tasks::{depths, ruler_depth, DepthGrid, Generator, Haystack, Item, Task, TaskError};
use rsd_chat::ChatTemplate;

/// How run.json names the bundled haystack.
const BUNDLED_HAYSTACK_NAME: &str = "corpus/books (bundled)";

/// What a summary says where the bundled books stood in for RULER's essays.
const BUNDLED_HAYSTACK_NOTE: &str = "Haystack: the bundled public-domain books (corpus/books), a \
    substitute for RULER's Paul Graham essays (and, for cwe, its word lists); pass \
    --haystack PaulGrahamEssays.json (RULER's file) for RULER's own text.";

use crate::error::io_err;
use crate::error::{EvalError, Result};

/// Everything `rsd-eval run` was asked to do.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Checkpoint directory (config.json, safetensors, tokenizer.json).
    pub model: Option<PathBuf>,
    /// A tokenizer.json for `--dump-prompts` without a model.
    pub tokenizer: Option<PathBuf>,
    /// Tasks, in order.
    pub tasks: Vec<Task>,
    /// Context lengths (prompt + answer tokens).
    pub lengths: Vec<usize>,
    /// Number of evenly spaced needle depths (with the even grid).
    pub depths: usize,
    /// Even depths, or RULER's drawn ones.
    pub depth_grid: DepthGrid,
    /// Samples per (task, length, depth).
    pub samples: usize,
    /// Seed of every random choice.
    pub seed: u64,
    /// Tokens to generate; `None`: each task's RULER default.
    pub max_new_tokens: Option<usize>,
    /// Prompts per generation batch.
    pub batch_size: usize,
    /// Device and dtype of the model.
    pub runtime: DeviceArgs,
    /// RoPE scaling applied at evaluation.
    pub rope_scaling: Option<ScalingRequest>,
    /// RoPE base override for evaluation.
    pub rope_theta: Option<f64>,
    /// Haystack directory (text files or rsd shards); `None`: the bundled books.
    pub haystack: Option<PathBuf>,
    /// Decode a haystack of shards made with another tokenizer anyway (a warning, not an error).
    pub allow_tokenizer_mismatch: bool,
    /// Where qa_1 and qa_2 read SQuAD's and HotpotQA's dev sets (squad.json, hotpotqa.json).
    pub qa_dir: Option<PathBuf>,
    /// Run directory.
    pub out: Option<PathBuf>,
    /// Write the prompts and expected answers here.
    pub dump_prompts: Option<PathBuf>,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Render each prompt with the model's chat template (see the `rsd-chat` crate).
    pub chat_template: bool,
    /// The chat template to use instead of the model's (implies `chat_template`).
    pub chat_template_file: Option<PathBuf>,
    /// How items are scored: by the model's generation, or by teacher forcing.
    pub scoring: Scoring,
}

/// How `rsd-eval run` scores an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Scoring {
    /// Greedy generation, scored by the task's RULER metric.
    #[default]
    Generate,
    /// Teacher forcing, no generation: every value the context offers (the needles' values) is
    /// scored as the prompt's continuation `" VALUE"` in one prompt pass plus one batched pass
    /// over the candidates; the item scores 1 when the expected value ranks first. Its
    /// log-probability, rank and whether greedy decoding would produce it are recorded too.
    TeacherForced,
}

impl Scoring {
    /// The name run.json records.
    pub fn name(self) -> &'static str {
        match self {
            Scoring::Generate => "generate",
            Scoring::TeacherForced => "teacher-forced",
        }
    }
}

fn is_even(g: &DepthGrid) -> bool {
    *g == DepthGrid::Even
}

fn is_generate(s: &Scoring) -> bool {
    *s == Scoring::Generate
}

/// The settings that define a run's items and outputs: a resumed run must match them all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSettings {
    /// The model directory, absolute.
    pub model: String,
    /// SHA-256 of its tokenizer.json.
    pub tokenizer_sha256: String,
    /// Task names.
    pub tasks: Vec<String>,
    /// Context lengths.
    pub lengths: Vec<usize>,
    /// Number of depths.
    pub depths: usize,
    /// RULER's drawn depths instead of the even grid; absent for the even grid (so older runs
    /// resume unchanged).
    #[serde(default, skip_serializing_if = "is_even")]
    pub depth_grid: DepthGrid,
    /// Samples per cell.
    pub samples: usize,
    /// Seed.
    pub seed: u64,
    /// Tokens generated (null: per-task defaults).
    pub max_new_tokens: Option<usize>,
    /// Model dtype.
    pub dtype: String,
    /// rope_scaling applied at evaluation (an HF dict), if any.
    pub rope_scaling: Option<Value>,
    /// rope_theta applied at evaluation, if any.
    pub rope_theta: Option<f64>,
    /// Haystack directory.
    pub haystack: String,
    /// SHA-256 of the haystack's words.
    pub haystack_sha256: String,
    /// The chat template the prompts were rendered with (null: plain prompts).
    #[serde(default)]
    pub chat_template: Option<ChatSetting>,
    /// The QA files read (qa_1, qa_2), each with its SHA-256.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub qa_data: Vec<QaSetting>,
    /// How items were scored; absent for generation (so runs made before teacher forcing
    /// existed resume unchanged).
    #[serde(default, skip_serializing_if = "is_generate")]
    pub scoring: Scoring,
}

/// A QA file a run read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QaSetting {
    /// The file.
    pub file: String,
    /// SHA-256 of its bytes.
    pub sha256: String,
}

/// Which chat template a run used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatSetting {
    /// Where it came from (a file, or the key of tokenizer_config.json).
    pub source: String,
    /// SHA-256 of its text.
    pub sha256: String,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq)]
pub struct RunReport {
    /// Items in the run.
    pub total: usize,
    /// Items already in results.jsonl.
    pub skipped: usize,
    /// Items generated now.
    pub done: usize,
    /// Mean score over all items, if any.
    pub overall: Option<f64>,
}

/// SHA-256 of the regular file `path`, read in blocks (a FIFO is refused, not waited on).
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut file = safe_fs::open_regular(path).map_err(|e| EvalError::Input(e.to_string()))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io_err(path))?;
        if n == 0 {
            return Ok(hex(&hash.finalize()));
        }
        hash.update(&buf[..n]);
    }
}

/// The item keys of a run, in the order they are generated.
pub fn plan(opts: &RunOptions) -> Vec<(Task, usize, Option<f64>, usize)> {
    let mut out = Vec::new();
    for &task in &opts.tasks {
        for &length in &opts.lengths {
            if task.has_depth() && opts.depth_grid == DepthGrid::Ruler {
                for s in 0..opts.samples {
                    let d = ruler_depth(opts.seed, task, length, s);
                    out.push((task, length, Some(d), s));
                }
                continue;
            }
            let ds: Vec<Option<f64>> = if task.has_depth() {
                depths(opts.depths).into_iter().map(Some).collect()
            } else {
                vec![None]
            };
            for d in ds {
                for s in 0..opts.samples {
                    out.push((task, length, d, s));
                }
            }
        }
    }
    out
}

/// Checks the plain values (no I/O).
fn check_options(opts: &RunOptions) -> Result<()> {
    let bad = |m: &str| Err(EvalError::Input(m.to_string()));
    if opts.tasks.is_empty() {
        return bad("no tasks: pass --tasks niah_single_1,…");
    }
    if opts.lengths.is_empty() || opts.lengths.contains(&0) {
        return bad("--lengths: give one or more positive token counts, e.g. 1024,4096");
    }
    if opts.samples == 0 || opts.depths == 0 || opts.batch_size == 0 {
        return bad("--samples, --depths and --batch-size must be at least 1");
    }
    if opts.model.is_none() && opts.dump_prompts.is_none() {
        return bad(
            "no model: pass --model DIR (or --dump-prompts FILE.jsonl to only write the prompts)",
        );
    }
    if opts.model.is_some() && opts.out.is_none() {
        return bad("no run directory: pass --out RUN/");
    }
    if opts.scoring == Scoring::TeacherForced {
        let multi: Vec<&str> = opts
            .tasks
            .iter()
            .filter(|t| !t.has_single_answer())
            .map(|t| t.name())
            .collect();
        if !multi.is_empty() {
            return Err(EvalError::Input(format!(
                "--scoring teacher-forced ranks one expected value among the context's values; \
                 {} ask for several answers (use the generate scoring for them)",
                multi.join(", ")
            )));
        }
    }
    if opts.model.is_none() && opts.tokenizer.is_none() {
        return bad("--dump-prompts without --model needs --tokenizer tokenizer.json (prompt lengths are counted in its tokens)");
    }
    Ok(())
}

/// The files a model directory needs, before any is read.
pub(crate) fn check_model_files(dir: &Path) -> Result<()> {
    if !dir.is_dir() {
        return Err(EvalError::Input(format!(
            "--model {}: no such directory",
            dir.display()
        )));
    }
    for f in ["config.json", "tokenizer.json"] {
        if !dir.join(f).is_file() {
            return Err(EvalError::Input(format!(
                "{}: no {f} (a model directory holds config.json, *.safetensors and tokenizer.json)",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Checks a model directory before anything is loaded: files present, tokenizer vocabulary within
/// the embedding, lengths within the trained window unless RoPE is rescaled.
fn check_model(dir: &Path, tok: &TextTokenizer, opts: &RunOptions) -> Result<ModelConfig> {
    let cfg = ModelConfig::from_dir(dir)?;
    rsd_model::checkpoint::safetensors_files(dir)?;
    let vocab = tok.vocab_size();
    if vocab as i64 > cfg.vocab_size {
        return Err(EvalError::Input(format!(
            "{}: tokenizer.json has {vocab} tokens but the model's embedding has {} rows: the tokenizer does not belong to this model",
            dir.display(),
            cfg.vocab_size
        )));
    }
    let max = cfg.max_position_embeddings;
    let scaled = opts.rope_scaling.is_some() || cfg.rope_scaling != RopeScaling::None;
    if let Some(&l) = opts.lengths.iter().find(|&&l| l as i64 > max) {
        if !scaled {
            return Err(EvalError::Input(format!(
                "length {l} is beyond the model's max_position_embeddings {max}; to evaluate beyond the trained window pass --rope-scaling (e.g. yarn:{})",
                (l as f64 / max as f64).ceil()
            )));
        }
    }
    Ok(cfg)
}

/// The QA sets the run's tasks read, from `--qa-dir`.
fn load_qa(opts: &RunOptions) -> Result<QaData> {
    let mut qa = QaData::default();
    for source in opts.tasks.iter().filter_map(|t| t.qa_source()) {
        let Some(dir) = &opts.qa_dir else {
            return Err(TaskError::NoQaData {
                task: opts
                    .tasks
                    .iter()
                    .find(|t| t.qa_source() == Some(source))
                    .map_or("", |t| t.name())
                    .into(),
                file: source.file_name().into(),
                url: source.url().into(),
            }
            .into());
        };
        let set = QaSet::read(source, dir).map_err(TaskError::from)?;
        match source {
            QaSource::Squad => qa.squad = Some(set),
            QaSource::HotpotQa => qa.hotpotqa = Some(set),
        }
    }
    Ok(qa)
}

/// A haystack of shards is decoded with the evaluated tokenizer: shards of another tokenizer
/// would decode to other text (mojibake), so they are refused as `rsd-train` refuses them,
/// unless `allow_tokenizer_mismatch` (then a warning).
fn check_haystack_tokenizer(dir: &Path, tok_path: &Path, opts: &RunOptions) -> Result<()> {
    use rsd_shard::tokenizer_match::{self, ModelTokenizer};
    let shard_err = |e: rsd_shard::ShardError| EvalError::Input(format!("haystack {e}"));
    let bytes = safe_fs::read_regular(tok_path, safe_fs::MAX_METADATA_BYTES, "tokenizer.json")
        .map_err(|e| EvalError::Input(e.to_string()))?;
    let model = match &opts.model {
        Some(m) => ModelTokenizer::of_config(&m.join("config.json")).map_err(shard_err)?,
        None => ModelTokenizer {
            config: tok_path.to_path_buf(),
            vocab: None,
            tokenizer: None,
        },
    };
    let model = ModelTokenizer {
        tokenizer: Some((
            tok_path.to_path_buf(),
            rsd_common::digest::sha256_hex(&bytes),
        )),
        ..model
    };
    let problems = tokenizer_match::mismatches(dir, &model).map_err(shard_err)?;
    crate::refuse_other_tokenizer(problems, opts.allow_tokenizer_mismatch, "decode it anyway")
        .map_err(|e| EvalError::Input(format!("--haystack {e}")))
}

/// The chat template asked for, if any: `--chat-template-file`, else the one of the model's
/// directory (or the tokenizer's, without a model).
fn load_chat_template(opts: &RunOptions, tok_path: &Path) -> Result<Option<ChatTemplate>> {
    if !opts.chat_template && opts.chat_template_file.is_none() {
        return Ok(None);
    }
    let dir = match &opts.model {
        Some(m) => m.clone(),
        None => match tok_path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        },
    };
    // Absolute paths: the template's source is a setting in run.json, which a resume from another
    // working directory must match.
    let abs = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let dir = abs(&dir);
    Ok(Some(match &opts.chat_template_file {
        Some(f) => ChatTemplate::from_file_with_tokens(&abs(f), &dir)?,
        None => ChatTemplate::from_dir(&dir)?,
    }))
}

/// An item of the plan: task, length, depth (for tasks with one), sample.
type PlanKey = (Task, usize, Option<f64>, usize);

/// Runs the evaluation (or only writes the prompts). See the module docs.
pub fn run(opts: &RunOptions) -> Result<RunReport> {
    check_options(opts)?;
    let tok_path = match (&opts.model, &opts.tokenizer) {
        (Some(m), _) => m.join("tokenizer.json"),
        (None, Some(t)) => t.clone(),
        (None, None) => unreachable!("check_options requires one"),
    };
    if let Some(m) = &opts.model {
        check_model_files(m)?;
    }
    let tok = TextTokenizer::from_file(&tok_path)?;
    let cfg = match &opts.model {
        Some(m) => Some(check_model(m, &tok, opts)?),
        None => None,
    };
    let haystack = load_haystack(opts, &tok_path, &tok)?;
    let chat = load_chat_template(opts, &tok_path)?;
    let qa = load_qa(opts)?;
    let mut generator = Generator::new(&tok, &haystack, opts.seed).with_qa(&qa);
    if let Some(c) = &chat {
        generator = generator.with_chat_template(c);
    }
    let mut plan = plan(opts);
    let too_short = drop_too_short(&mut plan, &generator, opts)?;

    if opts.progress && opts.model.is_some() {
        eprintln!("rsd-eval: {}", precision_line(&plan));
    }

    if let Some(path) = &opts.dump_prompts {
        dump_prompts(path, &generator, &plan, opts, chat.as_ref())?;
        if opts.model.is_none() {
            return Ok(RunReport {
                total: plan.len(),
                skipped: 0,
                done: 0,
                overall: None,
            });
        }
    }
    let (Some(model_dir), Some(cfg), Some(out)) = (&opts.model, cfg, &opts.out) else {
        unreachable!("check_options requires --out with --model");
    };

    let rope_scaling = opts
        .rope_scaling
        .as_ref()
        .map(|s| s.to_dict(cfg.max_position_embeddings));
    let settings = settings_of(
        opts,
        model_dir,
        &tok_path,
        &haystack,
        chat.as_ref(),
        &qa,
        rope_scaling.clone(),
    )?;
    // An unusable device fails here, before run.json exists: a run.json left by a run that
    // never started would hold the next run to the failed one's settings.
    let options = opts.runtime.options()?;
    write_run_json(out, settings, opts)?;

    let results_path = out.join("results.jsonl");
    let finished = done_keys(&results_path)?;
    let pending: Vec<PlanKey> = plan
        .iter()
        .filter(|(t, l, d, s)| !finished.contains(&item_key(t.name(), *l, *d, *s)))
        .copied()
        .collect();
    let mut results = Results::open(&results_path)?;
    let skipped = plan.len() - pending.len();

    let mut done = 0;
    if !pending.is_empty() {
        let model = load_model(model_dir, options, opts.rope_theta, rope_scaling)?;
        let scorer = Scorer {
            model: &model,
            tok: &tok,
            eos: gen::eos_token_ids(model_dir)?,
            opts,
        };
        let progress = RunProgress::new(opts.progress, plan.len(), skipped);
        done = score_pending(&scorer, &generator, &pending, &mut results, progress)?;
    }
    let all = read_results(&results.path)?;
    if opts.scoring == Scoring::Generate && (done > 0 || !out.join("ruler").is_dir()) {
        write_ruler_predictions(out, &plan, &all, &generator, opts)?;
    }
    let summary = write_summary(out, &all, too_short, opts)?;
    Ok(RunReport {
        total: plan.len(),
        skipped,
        done,
        overall: summary.overall,
    })
}

/// The model, loaded, with the run's RoPE base and scaling.
pub(crate) fn load_model(
    dir: &Path,
    options: rsd_model::ModelOptions,
    rope_theta: Option<f64>,
    rope_scaling: Option<Value>,
) -> Result<Model> {
    let mut model = Model::load(dir, options)?;
    if let Some(theta) = rope_theta {
        model.set_rope_theta(theta)?;
    }
    if let Some(v) = rope_scaling {
        model.set_rope_scaling(v)?;
    }
    Ok(model)
}

/// Writes summary.json and summary.md from every result: the (task, length)s skipped as too
/// short listed, and a note where the bundled books stood in for RULER's essays.
fn write_summary(
    out: &Path,
    all: &[ItemResult],
    too_short: Vec<Skipped>,
    opts: &RunOptions,
) -> Result<Summary> {
    let mut summary = Summary::of(all, &opts.tasks);
    summary.skipped = too_short;
    if opts.haystack.is_none() && opts.tasks.iter().any(|t| t.uses_haystack_text()) {
        summary.haystack_note = Some(BUNDLED_HAYSTACK_NOTE.to_string());
    }
    summary.write(out)?;
    Ok(summary)
}

/// The haystack: `--haystack`, else the bundled books; a directory of shards must have been
/// made with the evaluated tokenizer (see [`check_haystack_tokenizer`]).
fn load_haystack(opts: &RunOptions, tok_path: &Path, tok: &TextTokenizer) -> Result<Haystack> {
    let hay_dir = match &opts.haystack {
        Some(dir) => dir.clone(),
        None => Haystack::bundled_dir()?,
    };
    if hay_dir.join(rsd_shard::MANIFEST_FILE).is_file() {
        check_haystack_tokenizer(&hay_dir, tok_path, opts)?;
    }
    Ok(Haystack::from_path(&hay_dir, tok)?)
}

/// A (task, length) too short for the task's smallest instance is taken out of `plan`, with a
/// line saying why (and in the summary); when nothing is left, that is the error. Before
/// anything is written or loaded.
fn drop_too_short(
    plan: &mut Vec<PlanKey>,
    generator: &Generator<'_>,
    opts: &RunOptions,
) -> Result<Vec<Skipped>> {
    let mut checked = HashSet::new();
    let mut too_short: Vec<Skipped> = Vec::new();
    for &(t, l, d, s) in plan.iter() {
        if checked.insert((t, l)) {
            match generator.item(t, l, d, s, opts.max_new_tokens) {
                Ok(_) => {}
                Err(e @ TaskError::TooShort { .. }) => too_short.push(Skipped {
                    task: t.name().to_string(),
                    length: l,
                    reason: e.to_string(),
                }),
                Err(e) => return Err(e.into()),
            }
        }
    }
    plan.retain(|(t, l, _, _)| {
        !too_short
            .iter()
            .any(|k| k.task == t.name() && k.length == *l)
    });
    if plan.is_empty() {
        let reasons: Vec<&str> = too_short.iter().map(|k| k.reason.as_str()).collect();
        return Err(EvalError::Input(reasons.join("\n")));
    }
    for k in &too_short {
        eprintln!("rsd-eval: skipped: {}", k.reason);
    }
    Ok(too_short)
}

/// The settings run.json records for this run (`rope_scaling` as an HF dict).
fn settings_of(
    opts: &RunOptions,
    model_dir: &Path,
    tok_path: &Path,
    haystack: &Haystack,
    chat: Option<&ChatTemplate>,
    qa: &QaData,
    rope_scaling: Option<Value>,
) -> Result<RunSettings> {
    let model_abs = std::fs::canonicalize(model_dir).map_err(io_err(model_dir))?;
    Ok(RunSettings {
        model: model_abs.display().to_string(),
        tokenizer_sha256: sha256_file(tok_path)?,
        tasks: opts.tasks.iter().map(|t| t.name().to_string()).collect(),
        lengths: opts.lengths.clone(),
        depths: opts.depths,
        depth_grid: opts.depth_grid,
        samples: opts.samples,
        seed: opts.seed,
        max_new_tokens: opts.max_new_tokens,
        dtype: opts.runtime.dtype.clone(),
        rope_scaling,
        rope_theta: opts.rope_theta,
        // The bundled books by name, not by where this checkout lies: run.json is compared on
        // resume, and the words' sha256 is what identifies them.
        haystack: match &opts.haystack {
            Some(_) => haystack.source().to_string(),
            None => BUNDLED_HAYSTACK_NAME.to_string(),
        },
        haystack_sha256: haystack.sha256().to_string(),
        chat_template: chat.map(|c| ChatSetting {
            source: c.source_name().to_string(),
            sha256: c.sha256().to_string(),
        }),
        qa_data: [&qa.squad, &qa.hotpotqa]
            .into_iter()
            .flatten()
            .map(|set| QaSetting {
                file: set.path.display().to_string(),
                sha256: set.sha256.clone(),
            })
            .collect(),
        scoring: opts.scoring,
    })
}

/// Creates the run directory and writes its run.json, after refusing one whose settings differ.
fn write_run_json(out: &Path, settings: RunSettings, opts: &RunOptions) -> Result<()> {
    std::fs::create_dir_all(out).map_err(io_err(out))?;
    let mut now = serde_json::to_value(&settings).map_err(|e| EvalError::Json {
        path: out.join("run.json"),
        reason: e.to_string(),
    })?;
    // Not a setting (generation is batch-invariant): recorded, never compared.
    now["batch_size"] = opts.batch_size.into();
    if let Some(model) = &opts.model {
        now["model_provenance"] = model_provenance(model)?;
    }
    settle_run_json(out, &now, &opts.runtime.device)
}

/// An appendable JSON-lines results file (results.jsonl, longbench.jsonl): each record is
/// written whole and flushed, so that a killed run keeps every finished one.
pub(crate) struct Results {
    file: File,
    path: PathBuf,
}

impl Results {
    /// Opens `path` for appending (a torn last line is cut off).
    pub(crate) fn open(path: &Path) -> Result<Results> {
        Ok(Results {
            file: open_for_append(path)?,
            path: path.to_path_buf(),
        })
    }

    /// Appends one record and flushes it.
    pub(crate) fn append(&mut self, record: &impl Serialize) -> Result<()> {
        let line = serde_json::to_string(record).map_err(|e| EvalError::Json {
            path: self.path.clone(),
            reason: e.to_string(),
        })?;
        writeln!(self.file, "{line}")
            .and_then(|_| self.file.flush())
            .map_err(io_err(&self.path))
    }
}

/// The keys of the items the results.jsonl at `path` holds (none without the file).
pub(crate) fn done_keys(path: &Path) -> Result<HashSet<ItemKey>> {
    Ok(if path.is_file() {
        read_results(path)?.iter().map(ItemResult::key).collect()
    } else {
        HashSet::new()
    })
}

/// The progress of the items: a bar on a terminal; without one the bar draws nothing, so
/// lines instead, every 30 s.
struct RunProgress {
    bar: ProgressBar,
    lines: Option<ProgressLines>,
    skipped: usize,
}

impl RunProgress {
    fn new(show: bool, total: usize, skipped: usize) -> Self {
        RunProgress {
            bar: progress_bar(show, total as u64, skipped as u64),
            lines: (show && !std::io::stderr().is_terminal()).then(|| {
                ProgressLines::new(
                    "items",
                    total as u64,
                    skipped as u64,
                    Duration::from_secs(30),
                )
            }),
            skipped,
        }
    }

    /// Prints a line when one is due, `done` items scored by this run.
    fn report(&mut self, done: usize) {
        if let Some(line) = self
            .lines
            .as_mut()
            .and_then(|p| p.update((self.skipped + done) as u64))
        {
            eprintln!("rsd-eval: {line}");
        }
    }
}

/// What scores a batch of items: the loaded model, its tokenizer and end-of-sequence tokens.
struct Scorer<'a> {
    model: &'a Model,
    tok: &'a TextTokenizer,
    eos: Vec<i64>,
    opts: &'a RunOptions,
}

impl Scorer<'_> {
    /// The results of one batch's items, by the run's scoring.
    fn score(&self, items: &[Item]) -> Result<Vec<ItemResult>> {
        let batch_size = self.opts.batch_size;
        match self.opts.scoring {
            Scoring::Generate => {
                let gopts = GenerateOptions {
                    max_new_tokens: items[0].max_new_tokens,
                    eos: self.eos.clone(),
                    batch_size,
                    ..Default::default()
                };
                let prompts: Vec<Vec<i64>> = items.iter().map(|it| it.ids.clone()).collect();
                let gens = gen::generate(self.model, &prompts, &gopts, Some(self.tok))?;
                Ok(items
                    .iter()
                    .zip(gens)
                    .map(|(item, g)| {
                        let output = g.text.unwrap_or_default();
                        ItemResult {
                            score: score(item, &output),
                            output,
                            ..result_of(item)
                        }
                    })
                    .collect())
            }
            Scoring::TeacherForced => items
                .iter()
                .map(|item| teacher_forced(self.model, self.tok, item, batch_size))
                .collect(),
        }
    }
}

/// Scores `pending` batch by batch, each result appended to results.jsonl as its batch
/// finishes; returns how many were scored.
fn score_pending(
    scorer: &Scorer<'_>,
    generator: &Generator<'_>,
    pending: &[PlanKey],
    results: &mut Results,
    mut progress: RunProgress,
) -> Result<usize> {
    let opts = scorer.opts;
    let mut done = 0;
    progress.report(0);
    // Batches never mix (task, length): their prompts have about the same length and the
    // same number of new tokens.
    let mut i = 0;
    while i < pending.len() {
        let (t0, l0, _, _) = pending[i];
        let mut j = i;
        while j < pending.len()
            && j - i < opts.batch_size
            && pending[j].0 == t0
            && pending[j].1 == l0
        {
            j += 1;
        }
        let items: Vec<Item> = pending[i..j]
            .iter()
            .map(|&(t, l, d, s)| generator.item(t, l, d, s, opts.max_new_tokens))
            .collect::<Result<_, TaskError>>()?;
        for r in scorer.score(&items)? {
            results.append(&r)?;
            done += 1;
            progress.bar.inc(1);
        }
        progress.report(done);
        i = j;
    }
    progress.bar.finish_and_clear();
    Ok(done)
}

/// The standard error a score in [0, 1] averaged over n items can have at most: 0.5 / √n, in
/// points (× 100).
pub fn max_standard_error(n: usize) -> f64 {
    50.0 / (n.max(1) as f64).sqrt()
}

/// What the plan's cells can resolve: items per (task, length, depth) cell and per (task,
/// length), with the largest standard error of their mean scores.
fn precision_line(plan: &[(Task, usize, Option<f64>, usize)]) -> String {
    let mut cell: BTreeMap<(&str, usize, Option<u64>), usize> = BTreeMap::new();
    let mut task: BTreeMap<(&str, usize), usize> = BTreeMap::new();
    for &(t, l, d, _) in plan {
        *cell.entry((t.name(), l, d.map(f64::to_bits))).or_default() += 1;
        *task.entry((t.name(), l)).or_default() += 1;
    }
    let fewest = |m: Vec<usize>| m.into_iter().min().unwrap_or(0);
    let (c, t) = (
        fewest(cell.into_values().collect()),
        fewest(task.into_values().collect()),
    );
    format!(
        "{} items; the smallest (task, length, depth) cell has {c}: its score's standard error is \
         at most {:.1} points; a (task, length) has at least {t}: at most {:.1} points \
         (more --samples narrow both)",
        plan.len(),
        max_standard_error(c),
        max_standard_error(t)
    )
}

/// Writes RUN/ruler/LENGTH/TASK.jsonl, RULER's prediction files, for every scored item of the
/// plan (prompts regenerated: results.jsonl does not keep them).
fn write_ruler_predictions(
    out: &Path,
    plan: &[(Task, usize, Option<f64>, usize)],
    results: &[ItemResult],
    generator: &Generator<'_>,
    opts: &RunOptions,
) -> Result<()> {
    let by_key: std::collections::HashMap<_, &ItemResult> =
        results.iter().map(|r| (r.key(), r)).collect();
    let mut preds: BTreeMap<(String, usize), Vec<crate::ruler::Prediction>> = BTreeMap::new();
    let mut index: std::collections::HashMap<(Task, usize), usize> = Default::default();
    for &(t, l, d, s) in plan {
        let i = index.entry((t, l)).or_default();
        if let Some(r) = by_key.get(&item_key(t.name(), l, d, s)) {
            let item = generator.item(t, l, d, s, opts.max_new_tokens)?;
            preds
                .entry((t.name().to_string(), l))
                .or_default()
                .push(crate::ruler::Prediction::of(&item, r, *i));
        }
        *i += 1;
    }
    crate::ruler::write_predictions(&out.join("ruler"), &preds)
}

pub(crate) fn progress_bar(show: bool, total: u64, done: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} items, {elapsed} elapsed, ETA {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_position(done);
    bar.reset_eta();
    bar
}

/// Opens results.jsonl for appending, first cutting a torn last line (a run killed mid-write).
/// The file is opened with `O_NOFOLLOW` and only as a regular file ([`safe_fs::open_append`]): a
/// link planted at `path` is refused, never written through. Only the file's tail is read, to
/// find its last newline, so a large (or sparse) file costs no memory.
pub(crate) fn open_for_append(path: &Path) -> Result<File> {
    let fs_err = |e: safe_fs::FsError| EvalError::Input(e.to_string());
    let f = safe_fs::open_append(path).map_err(fs_err)?;
    let len = f.metadata().map_err(io_err(path))?.len();
    if len == 0 {
        return Ok(f);
    }
    // The same file, to read (open_append's handle only writes). It must be the very file
    // opened for appending: were a link swapped in meanwhile, this would open its target.
    let reader = safe_fs::open_regular(path).map_err(fs_err)?;
    let (a, b) = (
        f.metadata().map_err(io_err(path))?,
        reader.metadata().map_err(io_err(path))?,
    );
    if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
        return Err(EvalError::Input(format!(
            "{}: replaced while it was opened; not appending to it",
            path.display()
        )));
    }
    if let Some(keep) = torn_tail(&reader, len).map_err(io_err(path))? {
        f.set_len(keep).map_err(io_err(path))?;
    }
    Ok(f)
}

/// Where the file's torn last line (bytes after its last newline) starts, reading backwards from
/// its end `len` in blocks; `None` when it ends with a newline.
fn torn_tail(file: &File, len: u64) -> std::io::Result<Option<u64>> {
    const BLOCK: u64 = 64 << 10;
    let mut buf = vec![0u8; BLOCK as usize];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let block = &mut buf[..(end - start) as usize];
        file.read_exact_at(block, start)?;
        if end == len && block.last() == Some(&b'\n') {
            return Ok(None);
        }
        if let Some(p) = block.iter().rposition(|&b| b == b'\n') {
            return Ok(Some(start + p as u64 + 1));
        }
        end = start;
    }
    Ok(Some(0))
}

/// An item's record before it is scored.
fn result_of(item: &Item) -> ItemResult {
    ItemResult {
        task: item.task.name().to_string(),
        length: item.length,
        depth: item.depth,
        sample: item.sample,
        expected: item.expected.clone(),
        output: String::new(),
        score: 0.0,
        prompt_tokens: item.ids.len(),
        logprob: None,
        rank: None,
        candidates: None,
        greedy: None,
        score_norm: None,
    }
}

/// Scores `item` by teacher forcing (see [`Scoring::TeacherForced`]): its candidates, each as
/// the continuation `" VALUE"` (tokenized alone, without special tokens), after the prompt.
fn teacher_forced(
    model: &Model,
    tok: &TextTokenizer,
    item: &Item,
    batch_size: usize,
) -> Result<ItemResult> {
    let expected = item.expected.first().ok_or_else(|| {
        EvalError::Input(format!(
            "{}: an item without an expected value",
            item.task.name()
        ))
    })?;
    let gold = item
        .candidates
        .iter()
        .position(|c| c == expected)
        .ok_or_else(|| {
            EvalError::Input(format!(
                "{}: the expected value is not among the item's candidates",
                item.task.name()
            ))
        })?;
    let continuations = item
        .candidates
        .iter()
        .map(|c| tok.encode(&format!(" {c}"), false))
        .collect::<Result<Vec<_>, _>>()?;
    let scores = gen::score_continuations(
        model,
        &item.ids,
        &continuations,
        batch_size,
        gen::DEFAULT_PREFILL_CHUNK,
    )?;
    let (rank, best) = rank_first(&scores, gold);
    Ok(ItemResult {
        output: item.candidates[best].clone(),
        score: if rank == 1 { 1.0 } else { 0.0 },
        logprob: Some(scores[gold].logprob),
        rank: Some(rank),
        candidates: Some(item.candidates.len()),
        greedy: Some(scores[gold].greedy),
        score_norm: None,
        ..result_of(item)
    })
}

/// The rank (1 = first) of candidate `gold` by log-probability, a tie ranking above it, and the
/// index of the best-scoring candidate.
pub(crate) fn rank_first(scores: &[gen::ContinuationScore], gold: usize) -> (usize, usize) {
    let mine = scores[gold].logprob;
    let above = scores
        .iter()
        .enumerate()
        .filter(|&(j, s)| j != gold && s.logprob >= mine)
        .count();
    let best = scores
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.logprob.total_cmp(&b.1.logprob))
        .map(|(j, _)| j)
        .unwrap_or(gold);
    (above + 1, best)
}

/// What run.json holds beside the settings: free to change between resumed runs.
const NOT_SETTINGS: [&str; 4] = ["batch_size", "device", "created_by", "model_provenance"];

/// The largest training record (`rsd_training.json`) read from a model directory.
const MAX_TRAINING_RECORD_BYTES: u64 = 1 << 20;

/// What run.json records of the model evaluated, beside its path: the sha256 of its weights
/// (of each `*.safetensors` file's digest, in name order), the RoPE base and scaling its
/// `config.json` holds, and the training record rsd-train saves with a model
/// (`rsd_training.json`: seed, steps, objective), when there is one. Recorded, not compared on
/// resume (the model's path is).
pub(crate) fn model_provenance(dir: &Path) -> Result<Value> {
    let weights = rsd_common::digest::model_weights(dir).map_err(io_err(dir))?;
    let read_json = |name: &str, limit: u64| -> Result<Option<Value>> {
        let path = dir.join(name);
        if !path.exists() {
            return Ok(None);
        }
        let text = safe_fs::read_text(&path, limit, "model metadata")
            .map_err(|e| EvalError::Input(e.to_string()))?;
        serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| EvalError::Json {
                path: path.clone(),
                reason: crate::lines::json_message(&e),
            })
    };
    let config = read_json("config.json", safe_fs::MAX_METADATA_BYTES)?.unwrap_or(Value::Null);
    Ok(serde_json::json!({
        "weights_sha256": weights.sha256,
        "weight_files": weights.files,
        "rope_theta": config.get("rope_theta"),
        "rope_scaling": config.get("rope_scaling"),
        "training": read_json("rsd_training.json", MAX_TRAINING_RECORD_BYTES)?,
    }))
}

/// Holds a run directory to `settings`: a `run.json` already in `out` must hold the same
/// settings (else the error names the first difference); then `run.json` is written anew with
/// the settings, the `device` of this run and the program's version.
pub(crate) fn settle_run_json(out: &Path, settings: &Value, device: &str) -> Result<()> {
    let run_json = out.join("run.json");
    let json_err = |e: serde_json::Error| EvalError::Json {
        path: run_json.clone(),
        reason: e.to_string(),
    };
    if run_json.is_file() {
        let text = rsd_common::safe_fs::read_text(&run_json, 64 << 20, "run.json")
            .map_err(|e| EvalError::Input(e.to_string()))?;
        let old: Value = serde_json::from_str(&text).map_err(|e| EvalError::Json {
            path: run_json.clone(),
            reason: crate::lines::json_message(&e),
        })?;
        if !old.is_object() {
            return Err(EvalError::Json {
                path: run_json.clone(),
                reason: "not a JSON object of settings".into(),
            });
        }
        compare_fields(out, &old, settings)?;
    }
    let mut file = settings.clone();
    if let Value::Object(m) = &mut file {
        m.insert("device".into(), device.into());
        m.insert(
            "created_by".into(),
            format!("rsd-eval {}", env!("CARGO_PKG_VERSION")).into(),
        );
    }
    let json = serde_json::to_string_pretty(&file).map_err(json_err)?;
    rsd_common::safe_fs::write_file_atomic(&run_json, format!("{json}\n").as_bytes())
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", run_json.display())))
}

/// Refuses a run directory whose run.json (`old`) differs from `now` in any setting either side
/// holds, naming the first that does. A setting at its default is left out of run.json (so
/// older runs resume unchanged): absent on both sides is equal, absent on one side is not.
pub(crate) fn compare_fields(dir: &Path, old: &Value, now: &Value) -> Result<()> {
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let mut names = keys(now);
    names.extend(keys(old));
    names.retain(|k| !NOT_SETTINGS.contains(&k.as_str()));
    // Values from the file may be long: cut to a readable length.
    let shown = |v: Option<&Value>| match v {
        None => "absent (the default)".to_string(),
        Some(v) => rsd_common::printable::shortened(&v.to_string()).into_owned(),
    };
    for name in names {
        let (was, is) = (old.get(&name), now.get(&name));
        if was.unwrap_or(&Value::Null) != is.unwrap_or(&Value::Null) {
            return Err(EvalError::Changed {
                dir: dir.to_path_buf(),
                setting: rsd_common::printable::shortened(&name).into_owned(),
                was: shown(was),
                now: shown(is),
            });
        }
    }
    Ok(())
}

/// One line of `--dump-prompts`.
#[derive(Debug, Serialize, Deserialize)]
pub struct DumpedPrompt {
    /// Task name.
    pub task: String,
    /// Length asked for.
    pub length: usize,
    /// Needle depth.
    pub depth: Option<f64>,
    /// Sample index.
    pub sample: usize,
    /// The prompt text (ends with the answer prefix); with a chat template, the rendered text.
    pub prompt: String,
    /// The chat template the prompt was rendered with (null: a plain prompt).
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Its tokens in the model's tokenizer.
    pub prompt_tokens: usize,
    /// Tokens to generate.
    pub max_new_tokens: usize,
    /// What a correct answer contains.
    pub expected: Vec<String>,
    /// For the ordinal tasks: the other values of the key (must not come first).
    pub distractors: Vec<String>,
    /// Every value the context offers as an answer (what teacher-forced scoring ranks).
    #[serde(default)]
    pub candidates: Vec<String>,
    /// The prompt's token ids exactly as rsd feeds them (special tokens included): an engine
    /// given these adds no second BOS.
    #[serde(default)]
    pub prompt_token_ids: Vec<i64>,
    /// The prompt, a space and the expected answers joined by ", ": the item as a training
    /// document, for `rsd-data pack` (whose default JSONL field is `text`).
    pub text: String,
}

fn dump_prompts(
    path: &Path,
    generator: &Generator<'_>,
    plan: &[(Task, usize, Option<f64>, usize)],
    opts: &RunOptions,
    chat: Option<&ChatTemplate>,
) -> Result<()> {
    // Written under a temporary name and renamed into place: a link planted at `path` is
    // replaced, its target never written.
    let file = safe_fs::AtomicFile::create(path).map_err(|e| EvalError::Input(e.to_string()))?;
    let mut w = BufWriter::new(file);
    for &(t, l, d, s) in plan {
        let it = generator.item(t, l, d, s, opts.max_new_tokens)?;
        let line = DumpedPrompt {
            task: t.name().into(),
            length: l,
            depth: it.depth,
            sample: s,
            prompt_tokens: it.ids.len(),
            max_new_tokens: it.max_new_tokens,
            text: format!("{} {}", it.prompt, it.expected.join(", ")),
            expected: it.expected,
            distractors: it.distractors,
            candidates: it.candidates,
            prompt_token_ids: it.ids,
            prompt: it.prompt,
            chat_template: chat.map(|c| c.source_name().to_string()),
        };
        let json = serde_json::to_string(&line).map_err(|e| EvalError::Json {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        writeln!(w, "{json}").map_err(io_err(path))?;
    }
    let file = w.into_inner().map_err(|e| EvalError::Io {
        path: path.to_path_buf(),
        source: e.into_error(),
    })?;
    file.commit()
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))
}

/// Writes `bytes` to `path` atomically ([`safe_fs::write_file_atomic`]): a link planted at
/// `path` is replaced, its target never written.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    safe_fs::write_file_atomic(path, bytes)
        .map_err(|e| EvalError::Input(format!("writing {}: {e}", path.display())))
}

/// A mean score over some items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cell {
    /// Task name (absent in per-length rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<String>,
    /// Length.
    pub length: usize,
    /// Depth (per-depth rows only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth: Option<f64>,
    /// Mean score in [0, 1].
    pub mean: f64,
    /// Items averaged.
    pub n: usize,
}

/// `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Mean over every item.
    pub overall: Option<f64>,
    /// Items scored.
    pub items: usize,
    /// Mean per length over the tasks (each task weighing the same, as RULER averages); `n`
    /// counts the items.
    pub by_length: Vec<Cell>,
    /// Mean per task × length.
    pub by_task_length: Vec<Cell>,
    /// Mean per task × length × depth (needle tasks).
    pub by_task_length_depth: Vec<Cell>,
    /// RULER's aggregation per length: task scores × 100 to two decimals, their mean, and the
    /// 13-task average where all 13 ran.
    #[serde(default)]
    pub ruler: Vec<crate::ruler::LengthScores>,
    /// (task, length) pairs not run: the length is too short for the task.
    #[serde(default)]
    pub skipped: Vec<Skipped>,
    /// Multiple-choice runs: lm-eval's `acc_norm` per task × length.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acc_norm: Vec<Cell>,
    /// Where the text differs from RULER's: the bundled books instead of its essays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub haystack_note: Option<String>,
}

/// Mean `score_norm` per task × length, over the results that have one.
fn norm_cells(results: &[ItemResult]) -> Vec<Cell> {
    let mut m: BTreeMap<(String, usize), (f64, usize)> = BTreeMap::new();
    for r in results {
        if let Some(x) = r.score_norm {
            let e = m.entry((r.task.clone(), r.length)).or_default();
            e.0 += x;
            e.1 += 1;
        }
    }
    m.into_iter()
        .map(|((task, length), (sum, n))| Cell {
            task: Some(task),
            length,
            depth: None,
            mean: sum / n as f64,
            n,
        })
        .collect()
}

/// A (task, length) a run skipped, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Skipped {
    /// Task name.
    pub task: String,
    /// Length asked for.
    pub length: usize,
    /// Why (the length is too short for the task's bare prompt and answer).
    pub reason: String,
}

impl Summary {
    /// Means of `results`, tasks in `order` (then any others by name). `overall` is the mean
    /// over lengths of the per-length means over tasks.
    pub fn of(results: &[ItemResult], order: &[Task]) -> Summary {
        let rank = |name: &str| {
            order
                .iter()
                .position(|t| t.name() == name)
                .unwrap_or(usize::MAX)
        };
        type K = (usize, String, usize, Option<u64>);
        let mut tl: BTreeMap<K, (f64, usize)> = BTreeMap::new();
        let mut tld: BTreeMap<K, (f64, usize)> = BTreeMap::new();
        let mut len: BTreeMap<usize, usize> = BTreeMap::new();
        let add = |m: &mut (f64, usize), s: f64| {
            m.0 += s;
            m.1 += 1;
        };
        for r in results {
            let k = (rank(&r.task), r.task.clone(), r.length, None);
            add(tl.entry(k).or_default(), r.score);
            if let Some(d) = r.depth {
                // Depths are in [0, 1], so their bit patterns sort as the numbers do.
                let k = (rank(&r.task), r.task.clone(), r.length, Some(d.to_bits()));
                add(tld.entry(k).or_default(), r.score);
            }
            *len.entry(r.length).or_default() += 1;
        }
        // Per length, each task's mean weighs the same.
        let mut task_means: BTreeMap<usize, (f64, usize)> = BTreeMap::new();
        for ((_, _, length, _), (sum, n)) in &tl {
            add(task_means.entry(*length).or_default(), sum / *n as f64);
        }
        let cells = |m: BTreeMap<K, (f64, usize)>| {
            m.into_iter()
                .map(|((_, task, length, d), (sum, n))| Cell {
                    task: Some(task),
                    length,
                    depth: d.map(f64::from_bits),
                    mean: sum / n as f64,
                    n,
                })
                .collect()
        };
        let by_length: Vec<Cell> = len
            .into_iter()
            .map(|(length, n)| {
                let (sum, tasks) = task_means[&length];
                Cell {
                    task: None,
                    length,
                    depth: None,
                    mean: sum / tasks as f64,
                    n,
                }
            })
            .collect();
        let overall = (!by_length.is_empty())
            .then(|| by_length.iter().map(|c| c.mean).sum::<f64>() / by_length.len() as f64);
        Summary {
            overall,
            items: results.len(),
            by_length,
            ruler: crate::ruler::aggregate(results),
            by_task_length: cells(tl),
            by_task_length_depth: cells(tld),
            skipped: Vec::new(),
            acc_norm: norm_cells(results),
            haystack_note: None,
        }
    }

    /// Writes `summary.json` and `summary.md` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let path = dir.join("summary.json");
        let json = serde_json::to_string_pretty(self).map_err(|e| EvalError::Json {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        write_atomic(&path, format!("{json}\n").as_bytes())?;
        write_atomic(&dir.join("summary.md"), self.markdown().as_bytes())
    }

    /// The tables of `summary.md` (scores in percent, as RULER reports them).
    pub fn markdown(&self) -> String {
        let pct = |x: f64| format!("{:.1}", 100.0 * x);
        let mut s = String::from("# rsd-eval run: summary\n\n");
        match self.overall {
            Some(o) => s.push_str(&format!(
                "Overall: **{}** (mean score in percent: per length the mean over tasks, then \
                 over lengths; {} items)\n\n",
                pct(o),
                self.items
            )),
            None => s.push_str("No items scored yet.\n\n"),
        }
        if let Some(note) = &self.haystack_note {
            s.push_str(&format!("{note}\n\n"));
        }
        s.push_str(
            "A mean over n items has a standard error of at most 50/√n points (n is in the \
             tables: 10 items ±15.8, 100 items ±5.0).\n\n",
        );
        let lengths: Vec<usize> = self.by_length.iter().map(|c| c.length).collect();
        let mut tasks: Vec<String> = Vec::new();
        let mut seen = HashSet::new();
        for c in &self.by_task_length {
            if let Some(t) = &c.task {
                if seen.insert(t.as_str()) {
                    tasks.push(t.clone());
                }
            }
        }
        s.push_str("## Task × length\n\n| task |");
        for l in &lengths {
            s.push_str(&format!(" {l} |"));
        }
        s.push_str("\n|---|");
        s.push_str(&"---:|".repeat(lengths.len()));
        s.push('\n');
        // Each cell looked up, not searched for: the table costs its cells.
        let by_cell: std::collections::HashMap<(&str, usize), &Cell> = self
            .by_task_length
            .iter()
            .filter_map(|c| Some(((c.task.as_deref()?, c.length), c)))
            .collect();
        for t in &tasks {
            s.push_str(&format!("| {t} |"));
            for l in &lengths {
                let c = by_cell.get(&(t.as_str(), *l));
                s.push_str(&match c {
                    Some(c) => format!(" {} |", pct(c.mean)),
                    None => " |".into(),
                });
            }
            s.push('\n');
        }
        s.push_str("| **all (mean over tasks)** |");
        for c in &self.by_length {
            s.push_str(&format!(" **{}** |", pct(c.mean)));
        }
        s.push_str("\n\n");
        for k in &self.skipped {
            s.push_str(&format!("Not run: {}\n\n", k.reason));
        }
        if !self.acc_norm.is_empty() {
            s.push_str("## acc_norm (log-probability per character, lm-evaluation-harness's)\n\n| task | length | acc_norm | n |\n|---|---:|---:|---:|\n");
            for c in &self.acc_norm {
                s.push_str(&format!(
                    "| {} | {} | {} | {} |\n",
                    c.task.as_deref().unwrap_or(""),
                    c.length,
                    pct(c.mean),
                    c.n
                ));
            }
            s.push('\n');
        }
        s.push_str(&crate::ruler::markdown(&self.ruler));
        s.push_str("\n## Task × length × depth\n\n| task | length | depth | score | n |\n|---|---:|---:|---:|---:|\n");
        for c in &self.by_task_length_depth {
            s.push_str(&format!(
                "| {} | {} | {:.2} | {} | {} |\n",
                c.task.as_deref().unwrap_or(""),
                c.length,
                c.depth.unwrap_or(0.0),
                pct(c.mean),
                c.n
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::fs::symlink;

    fn record(sample: usize) -> ItemResult {
        crate::plot::tests::item(1024, Some(0.5), sample, 1.0)
    }

    #[test]
    fn appending_refuses_a_planted_link_and_leaves_its_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious.txt");
        std::fs::write(&target, "keep me").unwrap();
        let results = dir.path().join("results.jsonl");
        symlink(&target, &results).unwrap();
        let e = Results::open(&results).err().unwrap().to_string();
        assert!(
            e.contains("results.jsonl: a symbolic link, not a regular file; rsd appends only to a regular file"),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn appending_cuts_a_torn_last_line_reading_only_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("results.jsonl");
        let whole = format!("{}\n", serde_json::to_string(&record(0)).unwrap());
        // A torn line longer than one block of the backwards scan.
        std::fs::write(
            &path,
            format!("{whole}{{\"task\": \"{}", "x".repeat(200 << 10)),
        )
        .unwrap();
        let mut r = Results::open(&path).unwrap();
        r.append(&record(1)).unwrap();
        assert_eq!(read_results(&path).unwrap(), vec![record(0), record(1)]);
        // A file that ends with its newline is left whole.
        let mut r = Results::open(&path).unwrap();
        r.append(&record(2)).unwrap();
        assert_eq!(read_results(&path).unwrap().len(), 3);
    }

    #[test]
    fn summaries_and_dumps_replace_a_planted_link_without_writing_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("precious.txt");
        std::fs::write(&target, "keep me").unwrap();
        for name in ["summary.md", "summary.json"] {
            let _ = std::fs::remove_file(dir.path().join(name));
            symlink(&target, dir.path().join(name)).unwrap();
        }
        Summary::of(&[record(0)], &[]).write(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me");
        for name in ["summary.md", "summary.json"] {
            let meta = std::fs::symlink_metadata(dir.path().join(name)).unwrap();
            assert!(meta.file_type().is_file(), "{name} is still a link");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// A run.json of random or damaged bytes: an error naming it, or settings compared and
        /// written; never a panic.
        #[test]
        fn random_run_json_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200), at in 0usize..100, byte in any::<u8>()) {
            let dir = tempfile::tempdir().unwrap();
            let now = serde_json::json!({"model": "/m", "lengths": [1024, 2048], "seed": 0});
            std::fs::write(dir.path().join("run.json"), &bytes).unwrap();
            if let Err(e) = settle_run_json(dir.path(), &now, "cpu") {
                prop_assert!(e.to_string().contains("run.json") || e.to_string().contains(&*dir.path().to_string_lossy()));
            }
            let mut good = serde_json::to_string(&now).unwrap().into_bytes();
            let n = good.len();
            good[at % n] = byte;
            std::fs::write(dir.path().join("run.json"), &good).unwrap();
            let _ = settle_run_json(dir.path(), &now, "cpu");
        }
    }
}
