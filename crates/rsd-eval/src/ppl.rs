//! `rsd-eval ppl`: perplexity by position on held-out shards, and the **view gap** — how far the
//! model's predictions move when positions are perturbed as RSD's skip view perturbs them.
//!
//! Rows are the first `batches × batch_size` samples of a fixed-mode shard directory, in order
//! (the padded last sample of `--tail pad` is skipped), each `L = seq_len` tokens at positions
//! `0..L`. For logit row `i` (the prediction of token `i+1` from tokens `0..=i`):
//!
//! * `nll_i = −log p_std(x_{i+1} | x_≤i)` for `i < L−1`; a bucket's `nll` is the mean over its
//!   (row, i) pairs and its `ppl = exp(nll)`.
//! * The perturbed view of a row draws `s ~ U{0..L−1}` and `y ~ U{1..Y}` (`Y = --max-skip`,
//!   default `L`; the distribution of `rsd-train`'s skip sampler) from a generator keyed by
//!   (`--seed`, the sample's index in the directory), and feeds the same tokens at positions
//!   `i` for `i < s`, `i + y` for `i ≥ s`. Rows `i < s` see identical relative offsets in both views
//!   and are identical, so the gap is taken over rows `i ≥ s` only (the last row included):
//!   `gap_i = KL(p_std(·|x_≤i) ‖ p_pert(·|x_≤i)) = Σ_v p_std(v) (log p_std(v) − log p_pert(v))`,
//!   and a bucket's `view_gap` is its mean over the (row, i ≥ s) pairs that fall in it.
//!
//! Buckets split `0..L` into `K` ranges `[⌊kL/K⌋, ⌊(k+1)L/K⌋)` by the logit row `i`. Log-softmax
//! and the sums run on the device in fp32 (fp64 with `--dtype fp64`), the bucket means in fp64 on
//! the host.
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::{Device, Kind, Tensor};

use rsd_common::rng::SplitMix64;
use rsd_loader::RowRules;
use rsd_model::cli::{DeviceArgs, ModelDirArgs};
use rsd_model::{ForwardArgs, Model, ModelError, ModelOptions};
use rsd_shard::{PackMode, ShardSet};
use rsd_train::perturb::{KlNorm, PerturbKind, Perturbation, Sampler, Scope};
use rsd_train::step::kl_rows_of;

use crate::error::{io_err, EvalError};
use crate::figure::{Figure, FigureError, Lines, Series};

trait TorchContext<T> {
    fn ctx(self, context: &'static str) -> Result<T, EvalError>;
}

impl<T> TorchContext<T> for Result<T, tch::TchError> {
    fn ctx(self, context: &'static str) -> Result<T, EvalError> {
        self.map_err(|source| EvalError::Torch { context, source })
    }
}

/// Which second view the gap is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum ViewKind {
    /// RSD's skip view: positions from a random split `s` on shifted by a random skip `y`.
    Skip,
    /// No second view: perplexity only.
    None,
}

impl ViewKind {
    /// The name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ViewKind::Skip => "skip",
            ViewKind::None => "none",
        }
    }
}

/// Arguments of `rsd-eval ppl`.
#[derive(Debug, Clone, clap::Args)]
pub struct PplArgs {
    /// --model.
    #[command(flatten)]
    pub checkpoint: ModelDirArgs,
    /// Held-out shard directory (fixed mode); rows are its first samples, in order.
    #[arg(long)]
    pub shards: PathBuf,
    /// Batches to evaluate (fewer if the shards run out).
    #[arg(long, default_value_t = 8)]
    pub batches: usize,
    /// Rows per batch.
    #[arg(long, default_value_t = 1)]
    pub batch_size: usize,
    /// Position buckets K: logit row i falls in bucket ⌊i·K/L⌋.
    #[arg(long, default_value_t = 8)]
    pub buckets: usize,
    /// The second view of the view gap (`none`: perplexity only).
    #[arg(long, value_enum, default_value_t = ViewKind::Skip)]
    pub perturb: ViewKind,
    /// Largest skip Y: y ~ U{1..Y} (default: the row length, as rsd-train's default).
    #[arg(long)]
    pub max_skip: Option<i64>,
    /// Seed of the per-row (s, y) draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// --device, --dtype.
    #[command(flatten)]
    pub runtime: DeviceArgs,
    /// Directory for ppl.json and plots/ (created if needed).
    #[arg(long, default_value = ".")]
    pub out: PathBuf,
    /// Evaluate shards whose manifest records another tokenizer than the model's anyway (a
    /// warning instead of the error).
    #[arg(long)]
    pub allow_tokenizer_mismatch: bool,
}

/// One position bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// First logit row.
    pub start: usize,
    /// One past the last logit row.
    pub end: usize,
    /// (row, position) pairs with a label.
    pub tokens: u64,
    /// Mean negative log-likelihood, nats; `null` if no pair has a label.
    pub nll: Option<f64>,
    /// `exp(nll)`.
    pub ppl: Option<f64>,
    /// (row, position) pairs at or after their row's split.
    pub gap_rows: u64,
    /// Mean KL(standard ‖ perturbed), nats; `null` without a view or rows after a split.
    pub view_gap: Option<f64>,
}

impl Bucket {
    /// The middle position, where figures place the bucket.
    pub fn middle(&self) -> f64 {
        (self.start + self.end.saturating_sub(1)) as f64 / 2.0
    }
}

/// One evaluated row and its perturbed view.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RowView {
    /// Index of the sample in the shard directory.
    pub sample: u64,
    /// Split s (absent without a view).
    pub split: Option<i64>,
    /// Skip y (absent without a view).
    pub skip: Option<i64>,
}

/// `ppl.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PplReport {
    /// The checkpoint.
    pub model: PathBuf,
    /// The shard directory.
    pub shards: PathBuf,
    /// Row length L.
    pub seq_len: usize,
    /// Rows evaluated.
    pub rows: usize,
    /// Rows per batch.
    pub batch_size: usize,
    /// The second view.
    pub perturb: ViewKind,
    /// Y.
    pub max_skip: Option<i64>,
    /// Seed of the draws.
    pub seed: u64,
    /// Mean NLL over every labelled (row, position) pair.
    pub nll: f64,
    /// `exp(nll)`.
    pub ppl: f64,
    /// Mean KL over every (row, i ≥ s) pair.
    pub view_gap: Option<f64>,
    /// Per position bucket.
    pub buckets: Vec<Bucket>,
    /// Per row: which sample, and its (s, y).
    pub views: Vec<RowView>,
}

/// The most position buckets a `ppl.json` read back may hold (one point of a figure each).
pub const MAX_BUCKETS: usize = 1 << 16;

impl PplReport {
    /// Why this report (read back from a `ppl.json`) cannot be plotted: the field and what is
    /// wrong with its value; `None` when every value is in its range.
    pub fn invalid_field(&self) -> Option<(String, String)> {
        let field = |name: &str, message: String| Some((name.to_string(), message));
        if !(2..=MAX_SEQ_LEN).contains(&self.seq_len) {
            return field(
                "seq_len",
                format!("{} is not a row length in 2..={MAX_SEQ_LEN}", self.seq_len),
            );
        }
        if self.buckets.is_empty() || self.buckets.len() > MAX_BUCKETS.min(self.seq_len) {
            return field(
                "buckets",
                format!(
                    "{} buckets; rows of {} tokens make 1 to {} of them",
                    self.buckets.len(),
                    self.seq_len,
                    MAX_BUCKETS.min(self.seq_len)
                ),
            );
        }
        if !self.nll.is_finite() || !self.ppl.is_finite() || self.ppl <= 0.0 {
            return field(
                "nll",
                format!(
                    "nll {} and ppl {} must be finite numbers, ppl positive",
                    self.nll, self.ppl
                ),
            );
        }
        if let Some(g) = self.view_gap.filter(|g| !g.is_finite()) {
            return field("view_gap", format!("{g} is not a finite number"));
        }
        for (k, b) in self.buckets.iter().enumerate() {
            let at = |name: &str, message: String| Some((format!("buckets[{k}].{name}"), message));
            if b.start >= b.end || b.end > self.seq_len {
                return at(
                    "end",
                    format!(
                        "positions {}..{} are not a non-empty range inside 0..{}",
                        b.start, b.end, self.seq_len
                    ),
                );
            }
            for (name, v) in [("nll", b.nll), ("ppl", b.ppl), ("view_gap", b.view_gap)] {
                if let Some(v) = v.filter(|v| !v.is_finite()) {
                    return at(name, format!("{v} is not a finite number"));
                }
            }
        }
        None
    }
}

/// The (s, y) of sample `sample`'s skip view of a row of `len ≥ 2` tokens: `rsd-train`'s skip
/// sampler, drawing from a generator keyed by (`seed`, `sample`).
pub fn skip_view(seed: u64, sample: u64, len: i64, max_skip: Option<i64>) -> (i64, i64) {
    let sampler = Sampler {
        kind: PerturbKind::Skip,
        scope: Scope::Sequence,
        skip_range: max_skip,
        fixed_split: None,
        chunks: 1,
        kl_norm: KlNorm::Rows,
    };
    match sampler.sample(&mut SplitMix64::keyed(&[seed, sample]), len) {
        Perturbation::Skip { split, skip } => (split, skip),
        // A row of one token has nothing to perturb; ppl refuses rows that short.
        _ => (0, 0),
    }
}

/// The positions of the skip view `(s, y)` of a row, as training perturbs the standard ones
/// `std_pos`: `i` for `i < s`, `i + y` for `i ≥ s`.
fn skip_positions(std_pos: &[i64], (split, skip): (i64, i64)) -> Vec<i64> {
    let offsets = Perturbation::Skip { split, skip }.offsets(std_pos.len() as i64);
    std_pos.iter().zip(offsets).map(|(p, d)| p + d).collect()
}

/// Sums of one bucket, accumulated over batches.
#[derive(Debug, Clone, Copy, Default)]
struct Sums {
    nll: f64,
    tokens: u64,
    kl: f64,
    gap_rows: u64,
}

/// Logit rows computed at once: bounds the `[B, rows, vocab]` fp32 logits of long rows.
const ROW_CHUNK: i64 = 512;

fn host(t: &Tensor, context: &'static str) -> Result<Vec<f64>, EvalError> {
    let flat = t
        .f_to_kind(Kind::Double)
        .and_then(|t| t.f_to_device(Device::Cpu))
        .and_then(|t| t.f_reshape([-1]))
        .ctx(context)?;
    Vec::<f64>::try_from(&flat).ctx(context)
}

fn log_probs(model: &Model, hidden: &Tensor) -> Result<Tensor, EvalError> {
    let logits = model
        .logits(hidden)
        .map_err(|source| EvalError::ModelContext {
            context: "lm_head".into(),
            source,
        })?;
    logits
        .f_log_softmax(-1, rsd_model::accum_kind(logits.kind()))
        .ctx("log-softmax")
}

/// Per-(row, position) NLL `[B, L−1]` and, with a view, KL `[B, L]`, for one batch.
fn batch_terms(
    model: &Model,
    tokens: &Tensor,
    views: &[(i64, i64)],
    with_view: bool,
) -> Result<(Vec<f64>, Option<Vec<f64>>), EvalError> {
    let size = tokens.size();
    let (b, l) = (size[0], size[1]);
    let device = tokens.device();
    // A fixed-mode row is one document: positions `0..L`, as the training row's rules give them.
    let row = RowRules::default().positions(l as usize);
    let std_pos: Vec<i64> = (0..b).flat_map(|_| row.iter().copied()).collect();
    let std_pos = Tensor::from_slice(&std_pos).view([b, l]).to_device(device);
    let forward = |pos: &Tensor, what: &str| {
        model
            .forward(&ForwardArgs::new(tokens, pos))
            .map(|o| o.hidden)
            .map_err(|source| EvalError::ModelContext {
                context: format!("forward pass ({what} view)"),
                source,
            })
    };
    let hidden = forward(&std_pos, "standard")?;
    let pert_hidden = if with_view {
        let pos: Vec<i64> = views
            .iter()
            .flat_map(|&v| skip_positions(&row, v))
            .collect();
        let pos = Tensor::from_slice(&pos).view([b, l]).to_device(device);
        Some(forward(&pos, "perturbed")?)
    } else {
        None
    };
    let mut nll = vec![0.0; (b * (l - 1)) as usize];
    let mut kl = pert_hidden.as_ref().map(|_| vec![0.0; (b * l) as usize]);
    let mut c0 = 0;
    while c0 < l {
        let n = ROW_CHUNK.min(l - c0);
        let lp = log_probs(model, &hidden.f_narrow(1, c0, n).ctx("chunk")?)?;
        // Rows with a label: all but the row's last.
        let labelled = n.min(l - 1 - c0);
        if labelled > 0 {
            let targets = tokens
                .f_narrow(1, c0 + 1, labelled)
                .and_then(|t| t.f_unsqueeze(-1))
                .ctx("targets")?;
            let picked = lp
                .f_narrow(1, 0, labelled)
                .and_then(|t| t.f_gather(2, &targets, false))
                .ctx("gather")?;
            let got = host(&picked.f_neg().ctx("nll")?, "nll")?;
            for r in 0..b {
                for j in 0..labelled {
                    nll[(r * (l - 1) + c0 + j) as usize] = got[(r * labelled + j) as usize];
                }
            }
        }
        if let (Some(ph), Some(kl)) = (&pert_hidden, kl.as_mut()) {
            let lq = log_probs(model, &ph.f_narrow(1, c0, n).ctx("chunk")?)?;
            let terms = lp
                .f_exp()
                .and_then(|p| kl_rows_of(&p, &lp, &lq, lp.kind()))
                .ctx("KL")?;
            let got = host(&terms, "KL")?;
            for r in 0..b {
                for j in 0..n {
                    kl[(r * l + c0 + j) as usize] = got[(r * n + j) as usize];
                }
            }
        }
        c0 += n;
    }
    Ok((nll, kl))
}

/// The shards' ids must be the model's tokenizer's: another tokenizer's ids give a perplexity of
/// nothing in particular. Refused as `rsd-train` refuses them, unless
/// `--allow-tokenizer-mismatch` (then a warning).
fn check_tokenizer(args: &PplArgs) -> Result<(), EvalError> {
    use rsd_shard::tokenizer_match::{mismatches, ModelTokenizer};
    let problems = mismatches(
        &args.shards,
        &ModelTokenizer::of_dir(&args.checkpoint.model)?,
    )?;
    crate::refuse_other_tokenizer(problems, args.allow_tokenizer_mismatch, "evaluate anyway")
        .map_err(EvalError::Input)
}

fn model_err(context: &str) -> impl FnOnce(ModelError) -> EvalError {
    let context = context.to_string();
    move |source| EvalError::ModelContext { context, source }
}

/// The run's device and dtype, once the counts and `--max-skip` are known to be usable.
fn check_args(args: &PplArgs) -> Result<ModelOptions, EvalError> {
    let options = args
        .runtime
        .options()
        .map_err(model_err("--device/--dtype"))?;
    if args.batches == 0 || args.batch_size == 0 || args.buckets == 0 {
        return Err(EvalError::Input(
            "--batches, --batch-size and --buckets must be at least 1".into(),
        ));
    }
    if args.max_skip.is_some_and(|y| y < 1) {
        return Err(EvalError::Input("--max-skip must be at least 1".into()));
    }
    Ok(options)
}

/// Opens the shards (fixed mode, the model's tokenizer) and returns them with the row length
/// `L` and the number of rows to evaluate (whole batches of usable samples).
fn open_rows(args: &PplArgs) -> Result<(ShardSet, usize, u64), EvalError> {
    let set = ShardSet::open(&args.shards)?;
    check_tokenizer(args)?;
    let manifest = set.manifest();
    if manifest.mode != PackMode::Fixed {
        return Err(EvalError::Input(format!(
            "{}: {} shards; ppl reads fixed-mode shards (every row seq_len tokens, positions 0..L)",
            args.shards.display(),
            manifest.mode.name()
        )));
    }
    let l = usize::try_from(manifest.seq_len).unwrap_or(usize::MAX);
    if l > MAX_SEQ_LEN {
        return Err(EvalError::Input(format!(
            "{}: the manifest's seq_len {l} is more than the {MAX_SEQ_LEN} tokens a row rsd-eval \
             ppl evaluates may have",
            args.shards.display()
        )));
    }
    if l < 2 || args.buckets > l {
        return Err(EvalError::Input(format!(
            "{}: rows of {l} tokens cannot make {} position buckets",
            args.shards.display(),
            args.buckets
        )));
    }
    // `--tail pad` padded the last sample only; its padding would count as text.
    let usable = set.num_samples() - u64::from(manifest.pad_id.is_some()).min(set.num_samples());
    // The manifest's seq_len is believed only once the data holds a row of that length: buffers
    // of batch_size × seq_len are allocated from it.
    if set.num_samples() > 0 {
        let first = set.sample(0)?.tokens.len();
        if first != l {
            return Err(EvalError::Input(format!(
                "{}: sample 0 has {first} tokens, the manifest's seq_len is {l}",
                args.shards.display()
            )));
        }
    }
    let batch_tokens = args
        .batch_size
        .checked_mul(l)
        .filter(|&n| n <= MAX_BATCH_TOKENS);
    if batch_tokens.is_none() {
        return Err(EvalError::Input(format!(
            "--batch-size {} rows of {l} tokens is more than the {MAX_BATCH_TOKENS} tokens a \
             batch may have",
            args.batch_size
        )));
    }
    let wanted = (args.batches as u64).saturating_mul(args.batch_size as u64);
    let rows = wanted.min(usable - usable % args.batch_size as u64);
    if rows == 0 {
        return Err(EvalError::Input(format!(
            "{}: {usable} usable samples, fewer than one batch of {}",
            args.shards.display(),
            args.batch_size
        )));
    }
    Ok((set, l, rows))
}

/// The longest row `rsd-eval ppl` evaluates, in tokens (2^24, far beyond any model's window): a
/// manifest declaring more is refused before any buffer is sized from it.
pub const MAX_SEQ_LEN: usize = 1 << 24;

/// The most tokens one batch may hold (`--batch-size` × seq_len): its per-position buffers are
/// allocated up front.
pub const MAX_BATCH_TOKENS: usize = 1 << 26;

/// Adds one batch's per-position NLL `[B, L−1]` and KL `[B, L]` to the buckets' sums: every
/// labelled pair for the NLL, the pairs `i ≥ s` of each row for the view gap.
fn accumulate(sums: &mut [Sums], l: usize, views: &[(i64, i64)], nll: &[f64], kl: Option<&[f64]>) {
    let k = sums.len();
    let bucket_of = |i: usize| i * k / l;
    for (r, &(s, _)) in views.iter().enumerate() {
        for i in 0..l - 1 {
            let b = &mut sums[bucket_of(i)];
            b.nll += nll[r * (l - 1) + i];
            b.tokens += 1;
        }
        if let Some(kl) = kl {
            // Training's KL rows for s ≥ 1; a split at 0 shifts the whole row (no row can
            // differ, training skips it) but is still measured here, as documented.
            for i in s as usize..l {
                let b = &mut sums[bucket_of(i)];
                b.kl += kl[r * l + i];
                b.gap_rows += 1;
            }
        }
    }
}

/// The buckets' means, and the means over every bucket (`nll`, `view_gap`).
fn bucket_means(sums: &[Sums], l: usize) -> (Vec<Bucket>, f64, Option<f64>) {
    let k = sums.len();
    let buckets = sums
        .iter()
        .enumerate()
        .map(|(j, s)| {
            let nll = (s.tokens > 0).then(|| s.nll / s.tokens as f64);
            Bucket {
                start: j * l / k,
                end: (j + 1) * l / k,
                tokens: s.tokens,
                nll,
                ppl: nll.map(f64::exp),
                gap_rows: s.gap_rows,
                view_gap: (s.gap_rows > 0).then(|| s.kl / s.gap_rows as f64),
            }
        })
        .collect();
    let total = |f: fn(&Sums) -> (f64, u64)| {
        let (v, n) = sums
            .iter()
            .map(f)
            .fold((0.0, 0), |(a, m), (v, n)| (a + v, m + n));
        (n > 0).then(|| v / n as f64)
    };
    let nll = total(|s| (s.nll, s.tokens)).unwrap_or(f64::NAN);
    (buckets, nll, total(|s| (s.kl, s.gap_rows)))
}

/// Evaluates `args` and returns the report (nothing written).
pub fn evaluate(args: &PplArgs) -> Result<PplReport, EvalError> {
    // Phase 1: plain values, no I/O.
    let options = check_args(args)?;
    // Phase 2: read and build.
    let (set, l, rows) = open_rows(args)?;
    let model = Model::load(&args.checkpoint.model, options).map_err(model_err(&format!(
        "loading {}",
        args.checkpoint.model.display()
    )))?;
    let with_view = args.perturb == ViewKind::Skip;
    let _guard = tch::no_grad_guard();
    let mut sums = vec![Sums::default(); args.buckets];
    let mut views = Vec::with_capacity(rows as usize);
    let mut ids = Vec::with_capacity(args.batch_size * l);
    // A line every 30 s with the time left: at long lengths a batch takes minutes.
    let mut progress = rsd_common::progress::ProgressLines::new(
        "rows",
        rows,
        0,
        std::time::Duration::from_secs(30),
    );
    for first in (0..rows).step_by(args.batch_size) {
        ids.clear();
        let mut batch_views = Vec::with_capacity(args.batch_size);
        for g in first..first + args.batch_size as u64 {
            let sample = set.sample(g)?;
            if sample.tokens.len() != l {
                return Err(EvalError::Input(format!(
                    "{}: sample {g} has {} tokens, the manifest's seq_len is {l}",
                    args.shards.display(),
                    sample.tokens.len()
                )));
            }
            ids.extend(sample.tokens.to_vec().into_iter().map(i64::from));
            let (s, y) = skip_view(args.seed, g, l as i64, args.max_skip);
            batch_views.push((s, y));
            views.push(RowView {
                sample: g,
                split: with_view.then_some(s),
                skip: with_view.then_some(y),
            });
        }
        let tokens = Tensor::from_slice(&ids)
            .view([args.batch_size as i64, l as i64])
            .to_device(options.device);
        let (nll, kl) = batch_terms(&model, &tokens, &batch_views, with_view)?;
        accumulate(&mut sums, l, &batch_views, &nll, kl.as_deref());
        let done = first + args.batch_size as u64;
        if done < rows {
            if let Some(line) = progress.update(done) {
                eprintln!("rsd-eval ppl: {line}");
            }
        }
    }
    let (buckets, nll, view_gap) = bucket_means(&sums, l);
    Ok(PplReport {
        model: args.checkpoint.model.clone(),
        shards: args.shards.clone(),
        seq_len: l,
        rows: rows as usize,
        batch_size: args.batch_size,
        perturb: args.perturb,
        max_skip: args.max_skip,
        seed: args.seed,
        nll,
        ppl: nll.exp(),
        view_gap,
        buckets,
        views,
    })
}

/// Writes `dir/ppl.json` and the figures in `dir/plots/`.
pub fn write(report: &PplReport, dir: &Path) -> Result<Vec<PathBuf>, EvalError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let path = dir.join("ppl.json");
    let text = serde_json::to_string_pretty(report)
        .map_err(|e| EvalError::Input(format!("serializing ppl.json: {e}")))?;
    rsd_common::safe_fs::write_file_atomic(&path, (text + "\n").as_bytes())
        .map_err(|e| EvalError::Input(e.to_string()))?;
    let mut out = vec![path];
    let plots = dir.join("plots");
    rsd_common::safe_fs::create_own_dir(&plots).map_err(|e| EvalError::Input(e.to_string()))?;
    out.extend(write_ppl_figures(report, &plots)?);
    Ok(out)
}

/// `rsd-eval ppl`: evaluates, writes, and returns a table for the user.
pub fn command(args: &PplArgs) -> Result<String, EvalError> {
    let report = evaluate(args)?;
    let written = write(&report, &args.out)?;
    let mut s = format!(
        "{} rows of {} tokens: ppl {:.4} (nll {:.5})",
        report.rows, report.seq_len, report.ppl, report.nll
    );
    if let Some(g) = report.view_gap {
        s += &format!(", view gap {g:.5} nats");
    }
    s += "\npositions      ppl      view gap\n";
    for b in &report.buckets {
        let num = |v: Option<f64>| v.map_or("–".into(), |v| format!("{v:.5}"));
        s += &format!(
            "{:>5}..{:<6} {:>10} {:>10}\n",
            b.start,
            b.end,
            num(b.ppl),
            num(b.view_gap)
        );
    }
    let names: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    s += &format!("wrote {}", names.join(", "));
    Ok(s)
}

/// Perplexity by position bucket (x = the bucket's middle position).
pub fn ppl_by_position(report: &PplReport) -> Lines {
    Lines {
        title: "Perplexity by position".into(),
        x_label: "position (middle of the bucket)".into(),
        y_label: "perplexity".into(),
        y_range: None,
        series: vec![Series {
            name: "standard view".into(),
            x: report.buckets.iter().map(|b| b.middle()).collect(),
            y: report.buckets.iter().map(|b| b.ppl).collect(),
        }],
    }
}

/// Mean KL(standard ‖ perturbed) by position bucket (x = the bucket's middle position); the y
/// axis starts at 0, where the views agree.
pub fn view_gap_by_position(report: &PplReport) -> Lines {
    let top = report
        .buckets
        .iter()
        .filter_map(|b| b.view_gap)
        .filter(|g| g.is_finite())
        .fold(0.0f64, f64::max);
    Lines {
        title: "View gap by position".into(),
        x_label: "position (middle of the bucket)".into(),
        y_label: "mean KL(standard || perturbed), nats".into(),
        y_range: (top > 0.0).then_some((0.0, 1.05 * top)),
        series: vec![Series {
            name: format!("{} view", report.perturb.name()),
            x: report.buckets.iter().map(|b| b.middle()).collect(),
            y: report.buckets.iter().map(|b| b.view_gap).collect(),
        }],
    }
}

/// Writes the two figures of a `ppl.json` into `dir`; returns the files written.
pub fn write_ppl_figures(report: &PplReport, dir: &Path) -> Result<Vec<PathBuf>, FigureError> {
    let mut out = Figure::Lines(ppl_by_position(report)).write(dir, "ppl_by_position")?;
    if report.buckets.iter().any(|b| b.view_gap.is_some()) {
        out.extend(Figure::Lines(view_gap_by_position(report)).write(dir, "view_gap_by_position")?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skip_views_are_keyed_by_sample_and_in_range() {
        let views: Vec<(i64, i64)> = (0..200).map(|g| skip_view(7, g, 16, None)).collect();
        assert!(views
            .iter()
            .all(|&(s, y)| (0..16).contains(&s) && (1..=16).contains(&y)));
        // Every split occurs: s ~ U{0..L−1}, not only the interior.
        let splits: std::collections::BTreeSet<i64> = views.iter().map(|v| v.0).collect();
        assert_eq!(splits.len(), 16);
        assert_eq!(skip_view(7, 3, 16, None), views[3]);
        assert_ne!(skip_view(8, 3, 16, None), views[3]);
        assert!((0..100).all(|g| skip_view(1, g, 16, Some(2)).1 <= 2));
    }

    #[test]
    fn bucket_middle_is_the_middle_row() {
        let b = Bucket {
            start: 0,
            end: 12,
            tokens: 0,
            nll: None,
            ppl: None,
            gap_rows: 0,
            view_gap: None,
        };
        assert_eq!(b.middle(), 5.5);
    }
}
