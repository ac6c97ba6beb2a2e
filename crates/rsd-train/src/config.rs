//! The training config: one flat TOML table, every key also a command-line flag.
//!
//! The key list is written once (the `config!` macro below) and generates the resolved
//! [`TrainConfig`] (all keys, with defaults) and [`ConfigOverrides`] (all keys optional), which is
//! both what a TOML file deserializes into and a `clap::Args` block (`loss_chunk` ↔
//! `--loss-chunk`). Resolution: defaults ← `--config FILE` ← command-line flags. Unknown keys in a
//! file are refused (a typo must not silently train something else). The resolved config is
//! written into every checkpoint (`config.toml`).
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::perturb::{KlNorm, PerturbKind, Scope};
use crate::step::{KlDirection, Objective};
use crate::{Error, Result};

macro_rules! config {
    // How a key is spelled in a TOML file and on the command line: as its own type, or as the
    // `as` type, which `apply` resolves (so a bad value is a config error naming the key).
    (@spelled $ty:ty) => { $ty };
    (@spelled $ty:ty, $spelled:ty) => { $spelled };
    (@resolve $name:ident, $v:expr) => { $v };
    (@resolve $name:ident, $v:expr, $spelled:ty) => {
        FromSpelled::from_spelled($v).map_err(|why| {
            Error::Input(format!("config key {}: {why}", stringify!($name)))
        })?
    };
    // A key marked `flag` is a switch on the command line: `--key` alone means true.
    (@true $flag:ident) => { "true" };
    ($( $(#[$meta:meta])* $name:ident : $ty:ty $(as $spelled:ty)? = $default:expr $(, $flag:ident)?; )*) => {
        /// The resolved training config (see the module docs; `docs/TRAIN.md` lists every key).
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct TrainConfig {
            $( $(#[$meta])* pub $name: $ty, )*
        }

        impl Default for TrainConfig {
            fn default() -> Self {
                TrainConfig { $( $name: $default, )* }
            }
        }

        impl TrainConfig {
            /// Every key, in the order of this list.
            pub const KEYS: &'static [&'static str] = &[$( stringify!($name), )*];
        }

        /// Every key optional: a TOML file, or the command line.
        #[derive(Debug, Clone, Default, Deserialize, clap::Args)]
        #[serde(deny_unknown_fields)]
        pub struct ConfigOverrides {
            $(
                $(#[$meta])*
                #[arg(long)]
                $( #[arg(num_args = 0..=1, default_missing_value = config!(@true $flag))] )?
                pub $name: Option<config!(@spelled $ty $(, $spelled)?)>,
            )*
        }

        impl ConfigOverrides {
            /// Sets the keys present here.
            pub fn apply(self, c: &mut TrainConfig) -> Result<()> {
                $( if let Some(v) = self.$name { c.$name = config!(@resolve $name, v $(, $spelled)?); } )*
                Ok(())
            }

            /// Whether `key` is set here.
            pub fn has(&self, key: &str) -> bool {
                match key {
                    $( stringify!($name) => self.$name.is_some(), )*
                    _ => false,
                }
            }
        }
    };
}

config! {
    // --- data and model
    /// Shard directories, comma-separated (rsd-data pack output).
    shards: String = String::new();
    /// Mixture weights for the shard directories, comma-separated (empty = equal).
    weights: String = String::new();
    /// Hugging Face model directory to start from.
    #[serde(default, deserialize_with = "optional", skip_serializing_if = "Option::is_none")]
    model: Option<String> as String = None;
    /// Or: a model config.json to initialise randomly (tiny models, tests).
    #[serde(default, deserialize_with = "optional", skip_serializing_if = "Option::is_none")]
    init: Option<String> as String = None;
    /// Seed of the random init.
    init_seed: i64 = 0;
    /// Train even when the shards' tokenizer (manifest sha256, vocab size) is not the model's
    /// (its tokenizer.json; its vocab_size). Off: such a run is refused before anything is written.
    #[serde(default)]
    allow_tokenizer_mismatch: bool = false, flag;
    /// Run directory (checkpoints, metrics.jsonl, final model).
    out: String = String::new();
    /// cpu, cuda, cuda:N.
    device: String = "cpu".into();
    /// Parameter dtype: fp32 or bf16 (bf16 keeps fp32 master weights and optimizer state); fp64
    /// for exactness tests.
    dtype: String = "fp32".into();
    /// New RoPE base (ABF) applied before training; absent (or 0) = keep the model's.
    #[serde(default, deserialize_with = "optional", skip_serializing_if = "Option::is_none")]
    rope_theta: Option<f64> as f64 = None;
    /// max_position_embeddings written into the saved config; absent (or 0) = keep.
    #[serde(default, deserialize_with = "optional", skip_serializing_if = "Option::is_none")]
    max_position_embeddings: Option<i64> as i64 = None;
    /// libtorch intra-op threads, 0 = libtorch's default.
    threads: i64 = 0;
    // --- objective
    /// standard | rsd | pose | two-view-clm.
    objective: Objective = Objective::Rsd;
    /// skip | cyclic | dilation | chunk-permute, or a control view (objective rsd): nope (no
    /// RoPE) | attn-noise (noisy attention scores) | dropout (attention-probability dropout).
    perturb: PerturbKind = PerturbKind::Skip;
    /// Document masking (ProLong's recipe): attention stays inside each document of a row and
    /// the first token of a document is not predicted, for fixed and mixed shards alike (the
    /// shards record the boundaries). Off: rows attend across documents, every token predicted.
    #[serde(default = "on")]
    doc_mask: bool = true;
    /// sequence (the paper) | document (a split inside each document of document-masked rows).
    perturb_scope: Scope = Scope::Sequence;
    /// reverse = KL(p_pert ‖ sg(p_std)) (the paper) | forward.
    kl: KlDirection = KlDirection::Reverse;
    /// λ, the weight of the KL (or of the perturbed CLM for two-view-clm).
    lambda: f64 = 1.0;
    /// rows = 1/|R_b|, the rows that can differ (the paper's 1/(L−s); 1/u for cyclic) | length =
    /// 1/L_b, the sample's real tokens (1/L for cyclic).
    #[serde(default)]
    kl_norm: KlNorm = KlNorm::Rows;
    /// Y: skips are drawn from 1..=Y; 0 = the sequence length.
    skip_range: i64 = 0;
    /// Fixed "s,y" for the ablation; empty = sampled per sample.
    fixed_split: String = String::new();
    /// Chunks for chunk-permute.
    chunks: usize = 8;
    /// σ of the attn-noise view: N(0, σ²) added to its attention scores before the softmax.
    #[serde(default = "default_attn_noise_sigma")]
    attn_noise_sigma: f64 = default_attn_noise_sigma();
    /// Rate of the dropout view's attention-probability dropout (both passes), in [0, 1).
    #[serde(default = "default_attn_dropout")]
    attn_dropout: f64 = default_attn_dropout();
    /// Reuse the standard pass's prefix K/V for the perturbed view (exact; off = naive two passes).
    prefix_reuse: bool = true;
    /// Rows per loss chunk (logits of at most this many rows exist at once).
    loss_chunk: i64 = 1024;
    /// Per-layer activation checkpointing.
    checkpoint_layers: bool = false, flag;
    /// LongCE: weight each standard-view CLM token by min(exp(log p_long − log p_short), γ). The
    /// reference length: each reweighted token's short context holds `long_ce_window` to
    /// `long_ce_window + long_ce_stride − 1` tokens (the paper: 4096); 0 = off (plain CE).
    long_ce_window: i64 = 0;
    /// LongCE: how far the short-context windows slide (the paper: 1024). `long_ce_window = 1`
    /// with `long_ce_stride = K` is the earlier non-overlapping K-token windows.
    #[serde(default = "paper_long_ce_stride")]
    long_ce_stride: i64 = crate::step::LongCe::PAPER_STRIDE;
    /// LongCE cap γ on a token's weight.
    long_ce_gamma: f64 = 5.0;
    // --- optimisation
    /// Optimizer steps.
    steps: u64 = 100;
    /// Passes over the data instead of `steps` (0 = use `steps`): steps = ⌈epochs × rows ÷ rows
    /// per step⌉, rows being every dataset's packed samples and rows per step `micro_batch` ×
    /// the step's micro-batches (all ranks). One epoch of SFT data is `epochs = 1`.
    #[serde(default)]
    epochs: f64 = 0.0;
    /// Peak learning rate.
    lr: f64 = 1e-5;
    /// Final learning rate / peak (cosine floor).
    min_lr_ratio: f64 = 0.1;
    /// Warmup as a fraction of the steps.
    warmup_ratio: f64 = 0.1;
    /// AdamW β1.
    beta1: f64 = 0.9;
    /// AdamW β2.
    beta2: f64 = 0.95;
    /// AdamW ε.
    eps: f64 = 1e-8;
    /// Decoupled weight decay (matrices only).
    weight_decay: f64 = 0.1;
    /// Gradient clipping by global norm, 0 = off.
    clip: f64 = 1.0;
    /// Rows per micro-batch.
    micro_batch: usize = 1;
    /// Global batch in tokens per optimizer step (gradient accumulation); 0 = one micro-batch.
    tokens_per_step: u64 = 0;
    /// Seed for data order and perturbations.
    seed: u64 = 0;
    /// stop | skip: what a NaN/inf loss or gradient does.
    on_nonfinite: OnNonFinite as String = OnNonFinite::Stop;
    /// Stop after this many consecutive skipped steps.
    max_skips: u64 = 10;
    // --- checkpoints and logging
    /// Checkpoint every N steps (and at the end), 0 = only at the end.
    save_every: u64 = 0;
    /// Also checkpoint when this many minutes have passed since the last checkpoint (or the
    /// start), decided together at a step boundary so that every rank saves the same step;
    /// 0 = off. For long steps (Qwen3-4B at 256K: ~16 min a step) where `save_every` steps are
    /// hours apart. Fractions are allowed (0.5 = 30 s).
    #[serde(default)]
    save_every_minutes: f64 = 0.0;
    /// Seconds kept in hand before the job's end time (under SLURM, read from the job record):
    /// the run stops with a checkpoint at the first step boundary where the time left is less
    /// than its longest recent step, plus its last checkpoint's writing time, plus this margin,
    /// so that a time limit never ends it between checkpoints. 0 = stop only on a signal.
    #[serde(default = "default_end_margin_s")]
    end_margin_s: u64 = default_end_margin_s();
    /// Checkpoints kept (the newest).
    keep: usize = 2;
    /// Stop (with a checkpoint) after this step, as if interrupted; 0 = run to `steps`.
    stop_at: u64 = 0;
    /// Show a progress bar (off when stderr is not a terminal).
    progress: bool = true;
    /// Time each step's phases on the device that runs them (CUDA events; clock readings on
    /// the CPU): data, forward, attention, loss, backward, optimizer. Logged as `phases` in
    /// metrics.jsonl, with a table of medians at the end; the step itself is unchanged.
    #[serde(default)]
    profile: bool = false, flag;
    /// Write a checkpoint and the final model when the run ends. Off for benchmarks and trials:
    /// only `save_every`'s checkpoints are written, and nothing at the end.
    #[serde(default = "on")]
    save_at_end: bool = true;
    /// Loader assembling threads.
    loader_workers: usize = 1;
    /// Every N steps, evaluate on the held-out slice (`heldout_shards`) without a graph: the
    /// standard view's CLM and the view gap (the KL between the standard view and the run's
    /// perturbed view), logged as `heldout_clm` and `view_gap`; 0 = off.
    #[serde(default)]
    heldout_every: u64 = 0;
    /// Shard directory of the held-out data (not trained on); required with `heldout_every`.
    #[serde(default)]
    heldout_shards: String = String::new();
    /// Loader batches (of `micro_batch` rows) in the held-out slice: its first ones, the same
    /// every time.
    #[serde(default = "default_heldout_batches")]
    heldout_batches: usize = default_heldout_batches();
    // --- data parallel (several processes: `--nproc N`, torchrun)
    /// Data-parallel ranks; 0 = all the processes of the run (WORLD_SIZE). Set, it must equal
    /// them; `--dp N` without `--nproc` or torchrun starts N local ranks.
    dp: usize = 0;
    /// Context-parallel degree: ranks sharing one sequence (dp × cp = processes).
    cp: usize = 1;
    /// Let a context-parallel group span several hosts (its per-layer K/V gathers then cross the
    /// network); by default a group spread over hosts is refused at start, naming its ranks.
    #[serde(default)]
    cp_across_nodes: bool = false, flag;
    /// Shard the fp32 master weights, AdamW moments and summed gradients over the data-parallel
    /// ranks (ZeRO-2 style): 12 bytes per parameter become 12/N per rank, for the same update.
    shard_optimizer: bool = false, flag;
    /// Seconds a rank waits for the others (rendezvous, each collective) before failing.
    dist_timeout: u64 = 300;
    /// Seconds a rank waits for the others in a checkpoint's phases (while rank 0 writes and
    /// hashes the model) before failing; 0 = sized from the bytes rank 0 writes: 10 minutes plus
    /// 20 s a GB (50 MB/s), at least `dist_timeout`. NCCL's watchdog is created with the longer of
    /// the two timeouts; the step's collectives keep `dist_timeout`.
    #[serde(default)]
    checkpoint_timeout: u64 = 0;
    /// Seconds a rank may go without a sign of life (a heartbeat its failure watch leaves in the
    /// rendezvous store each second) before every rank stops, naming it: how soon a rank killed
    /// outright (the OOM killer), frozen, or on a lost node is found while the others wait for it
    /// in a collective (which would otherwise wait `dist_timeout`).
    #[serde(default = "default_dist_liveness")]
    dist_liveness: u64 = default_dist_liveness();
    /// Largest gradient all-reduce bucket, MiB (fp32).
    grad_bucket_mb: usize = 25;
    /// With `shard_optimizer`: a bucket's gradient reduce-scatter runs while the backward
    /// computes the next layer's gradients (per layer with `checkpoint_layers`, else after the
    /// backward, one bucket ahead). The same sums; one more bucket's gradient is live.
    overlap_grad_reduce: bool = true;
    /// With `shard_optimizer`: when the gradient is summed over the ranks. micro-batch (a
    /// reduce-scatter after each micro-batch's backward; no rank holds the whole gradient) |
    /// step (each rank sums its micro-batches into a whole-model fp32 buffer, 4 bytes per
    /// parameter, then one reduce-scatter per step: 1/m of the traffic for m local micro-batches).
    #[serde(default)]
    grad_reduce: GradReduce = GradReduce::MicroBatch;
}

/// When the sharded optimizer sums the gradient over the ranks (config key `grad_reduce`): the
/// trade between memory and traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum GradReduce {
    /// A reduce-scatter of every bucket after each micro-batch's backward, the gradient freed at
    /// once: no rank holds the whole gradient, and the payload is the padded gradient (fp32) ×
    /// the local micro-batches.
    #[default]
    MicroBatch,
    /// Each rank adds its micro-batches' gradients into a whole-model fp32 buffer, then one
    /// reduce-scatter per bucket and step: the payload of one micro-batch, for 4 bytes per
    /// parameter more on every rank.
    Step,
}

/// Serde default of keys that default to on (the resolved config's `bool`; in a file's
/// overrides an absent key reads as the same default).
/// The default of `long_ce_stride` for configs written before it existed.
fn paper_long_ce_stride<T: From<i64>>() -> T {
    crate::step::LongCe::PAPER_STRIDE.into()
}

fn on<T: From<bool>>() -> T {
    T::from(true)
}

/// `end_margin_s` when the key is absent (configs written before it existed): a minute, for a
/// slow shared filesystem's stalls and the job record's one-second resolution.
fn default_end_margin_s<T: From<u64>>() -> T {
    T::from(60)
}

/// `dist_liveness` when the key is absent (configs written before it existed).
fn default_dist_liveness<T: From<u64>>() -> T {
    T::from(60)
}

/// Held-out loader batches when the key is absent (configs written before the key existed).
fn default_heldout_batches<T: From<usize>>() -> T {
    T::from(2)
}

/// The attn-noise view's default σ (as [`on`], for the resolved config and a file's overrides).
fn default_attn_noise_sigma<T: From<f64>>() -> T {
    T::from(1.0)
}

/// The dropout view's default rate (a common attention-dropout rate).
fn default_attn_dropout<T: From<f64>>() -> T {
    T::from(0.1)
}

/// What a NaN/inf loss or gradient norm does to a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNonFinite {
    /// Exit with an error; the last good checkpoint stays.
    #[default]
    Stop,
    /// Drop the update (at most `max_skips` in a row).
    Skip,
}

impl std::str::FromStr for OnNonFinite {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "stop" => Ok(OnNonFinite::Stop),
            "skip" => Ok(OnNonFinite::Skip),
            _ => Err(format!("\"{s}\": expected stop or skip")),
        }
    }
}

/// A key's resolved value from how a file or flag spells it (see `config!`).
trait FromSpelled<S>: Sized {
    fn from_spelled(s: S) -> std::result::Result<Self, String>;
}

impl FromSpelled<String> for OnNonFinite {
    fn from_spelled(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl<T: Optional> FromSpelled<T> for Option<T> {
    fn from_spelled(s: T) -> std::result::Result<Self, String> {
        Ok(s.present())
    }
}

/// The value of an optional key. Configs (and checkpoints) written before these keys were
/// optional spell "absent" as `""` or `0`; both still mean absent.
trait Optional: Sized {
    fn present(self) -> Option<Self>;
}

impl Optional for String {
    fn present(self) -> Option<Self> {
        (!self.is_empty()).then_some(self)
    }
}

impl Optional for f64 {
    fn present(self) -> Option<Self> {
        (self > 0.0).then_some(self)
    }
}

impl Optional for i64 {
    fn present(self) -> Option<Self> {
        (self > 0).then_some(self)
    }
}

/// Deserializes an optional key, reading the old spellings of "absent" as `None`.
fn optional<'de, D, T>(d: D) -> std::result::Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Optional,
{
    Ok(Option::<T>::deserialize(d)?.and_then(Optional::present))
}

/// What a command says about its config: the `--config` file's keys and the command line's
/// flags, before they are laid over a base (the defaults, or a resumed checkpoint's config).
#[derive(Debug, Clone, Default)]
pub struct Stated {
    file: Option<(std::path::PathBuf, ConfigOverrides)>,
    cli: ConfigOverrides,
}

impl Stated {
    /// Reads `file` (TOML, optional; unknown keys refused) beside the command line's `cli`.
    pub fn read(file: Option<&Path>, cli: ConfigOverrides) -> Result<Self> {
        let file = match file {
            Some(path) => {
                let bytes =
                    rsd_common::safe_fs::read_regular(path, MAX_CONFIG_BYTES, "training config")?;
                let text = String::from_utf8(bytes).map_err(|e| {
                    Error::Input(format!("{}: not UTF-8 text: {e}", path.display()))
                })?;
                let o: ConfigOverrides = toml::from_str(&text).map_err(|e| {
                    let e = rsd_common::printable::shortened_lines(&e.to_string());
                    Error::Input(format!("{}: {e}", path.display()))
                })?;
                Some((path.to_path_buf(), o))
            }
            None => None,
        };
        Ok(Stated { file, cli })
    }

    /// Whether the file or the command line sets `key`.
    pub fn has(&self, key: &str) -> bool {
        self.cli.has(key) || self.file.as_ref().is_some_and(|(_, o)| o.has(key))
    }

    /// Where `key`'s value comes from: `--key` or the config file (`None`: not stated).
    pub fn source(&self, key: &str) -> Option<String> {
        if self.cli.has(key) {
            return Some(format!("--{}", key.replace('_', "-")));
        }
        match &self.file {
            Some((path, o)) if o.has(key) => Some(path.display().to_string()),
            _ => None,
        }
    }

    /// `out` as stated (the command line's, else the file's).
    pub fn out(&self) -> Option<String> {
        let file = self.file.as_ref().and_then(|(_, o)| o.out.clone());
        self.cli.out.clone().or(file)
    }

    /// `base` with the stated keys set, the file's first, then the command line's; not checked.
    /// A model source stated (`model` or `init`, in the file or on the command line) replaces
    /// the other one of the lower layers, so `--model DIR` over a config that sets `init` needs
    /// no `--init ""`.
    pub fn over(self, mut base: TrainConfig) -> Result<TrainConfig> {
        let names_model = |o: &ConfigOverrides| o.model.is_some() || o.init.is_some();
        if let Some((_, file)) = self.file {
            if names_model(&file) {
                (base.model, base.init) = (None, None);
            }
            file.apply(&mut base)?;
        }
        if names_model(&self.cli) {
            (base.model, base.init) = (None, None);
        }
        self.cli.apply(&mut base)?;
        for path in [&mut base.shards, &mut base.heldout_shards, &mut base.out] {
            *path = expand_home(path);
        }
        for path in [&mut base.model, &mut base.init].into_iter().flatten() {
            *path = expand_home(path);
        }
        Ok(base)
    }

    /// The defaults with the stated keys set, checked.
    pub fn resolve(self) -> Result<TrainConfig> {
        let c = self.over(TrainConfig::default())?;
        c.check()?;
        Ok(c)
    }
}

/// Largest config file read (a config is a few KB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// `~/x` as `$HOME/x` in each comma-separated path, as a shell would expand it (configs are
/// shared between users, so they name `~/.cache/…`); other paths as they are.
fn expand_home(paths: &str) -> String {
    let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
        return paths.to_string();
    };
    let home = home.to_string_lossy();
    paths
        .split(',')
        .map(|p| match p.trim_start().strip_prefix("~/") {
            Some(rest) => format!("{}/{rest}", home.trim_end_matches('/')),
            None if p.trim() == "~" => home.to_string(),
            None => p.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl TrainConfig {
    /// Defaults ← `file` (TOML, optional) ← `cli`, checked.
    pub fn resolve(file: Option<&Path>, cli: ConfigOverrides) -> Result<Self> {
        Stated::read(file, cli)?.resolve()
    }

    /// Refuses inconsistent values with a message naming the key.
    pub fn check(&self) -> Result<()> {
        let bad = |k: &str, why: &str| Err(Error::Input(format!("config key {k}: {why}")));
        if self.model.is_some() == self.init.is_some() {
            return bad(
                "model/init",
                "give exactly one of --model DIR or --init CONFIG",
            );
        }
        if !(self.epochs.is_finite() && self.epochs >= 0.0) {
            return bad(
                "epochs",
                "passes over the data: a number ≥ 0 (0 = train `steps` steps)",
            );
        }
        if let Some(init) = self.init.as_deref().filter(|i| Path::new(i).is_dir()) {
            return Err(Error::Input(format!(
                "init {init}: a directory; init is a model config.json to initialise randomly, \
                 to start from a checkpoint's weights give --model {init}"
            )));
        }
        if self.steps == 0 {
            return bad("steps", "must be ≥ 1");
        }
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return bad("lr", "must be a finite number > 0");
        }
        self.check_ranges()?;
        if self.micro_batch == 0 {
            return bad("micro_batch", "must be ≥ 1");
        }
        if self.dist_timeout == 0 {
            return bad("dist_timeout", "must be ≥ 1 second");
        }
        if self.cp == 0 {
            return bad("cp", "must be ≥ 1 (1 = no context parallelism)");
        }
        if self.grad_bucket_mb == 0 {
            return bad("grad_bucket_mb", "must be ≥ 1");
        }
        if self.loss_chunk <= 0 {
            return bad("loss_chunk", "must be ≥ 1");
        }
        if !(0.0..=1.0).contains(&self.warmup_ratio) || !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return bad("warmup_ratio/min_lr_ratio", "must lie in [0, 1]");
        }
        self.fixed_split()?;
        // Out-of-range values are refused whatever the view, so a typo never waits for a switch.
        crate::step::SecondView::of(PerturbKind::AttnNoise, self.attn_noise_sigma, 0.0)
            .check()
            .and(crate::step::SecondView::of(PerturbKind::Dropout, 0.0, self.attn_dropout).check())
            .map_err(|e| Error::Input(format!("config key {e}")))?;
        if self.perturb.is_control() {
            if self.objective.loss() != Objective::Rsd {
                return bad(
                    "perturb",
                    &format!(
                        "{} is a control view compared with the standard view by the KL: it \
                         needs objective = \"rsd\" (got \"{}\")",
                        self.perturb, self.objective
                    ),
                );
            }
            if self.cp > 1 {
                return bad(
                    "cp",
                    &format!(
                        "{}: perturb = \"{}\" is not supported under context parallelism (set \
                         cp = 1)",
                        self.cp, self.perturb
                    ),
                );
            }
            if self.perturb == PerturbKind::Dropout && self.long_ce_window > 0 {
                return bad(
                    "long_ce_window",
                    &format!(
                        "{}: LongCE is not supported with perturb = \"dropout\" (the CLM term \
                         is a dropout pass; set long_ce_window = 0)",
                        self.long_ce_window
                    ),
                );
            }
        }
        Ok(())
    }

    /// The numeric keys whose out-of-range values would not fail but compute nonsense (a β of 1
    /// divides by zero in AdamW's bias correction, a NaN λ poisons every step, a timeout of 2^64
    /// seconds overflows the milliseconds c10d takes), each with the range it must lie in.
    fn check_ranges(&self) -> Result<()> {
        // (key, value, lowest, highest, whether the highest is excluded, the range in words)
        let max = f64::MAX;
        let reals = [
            (
                "save_every_minutes",
                self.save_every_minutes,
                0.0,
                7.0 * 24.0 * 60.0,
                false,
                "minutes in [0, 10080] (0 = off)",
            ),
            (
                "lambda",
                self.lambda,
                0.0,
                max,
                false,
                "a finite number ≥ 0",
            ),
            ("beta1", self.beta1, 0.0, 1.0, true, "AdamW's β, in [0, 1)"),
            ("beta2", self.beta2, 0.0, 1.0, true, "AdamW's β, in [0, 1)"),
            (
                "eps",
                self.eps,
                f64::MIN_POSITIVE,
                max,
                false,
                "a finite number > 0",
            ),
            (
                "weight_decay",
                self.weight_decay,
                0.0,
                1e3,
                false,
                "in [0, 1000]",
            ),
            ("clip", self.clip, 0.0, max, false, "a norm ≥ 0 (0 = off)"),
            (
                "long_ce_gamma",
                self.long_ce_gamma,
                0.0,
                max,
                false,
                "a finite number ≥ 0",
            ),
            // Absent: keep the model's (0 too).
            (
                "rope_theta",
                self.rope_theta.unwrap_or(0.0),
                0.0,
                1e12,
                false,
                "a RoPE base in (0, 1e12] (0 = keep)",
            ),
        ];
        for (key, v, lo, hi, hi_open, what) in reals {
            let inside = v.is_finite() && v >= lo && if hi_open { v < hi } else { v <= hi };
            if !inside {
                return Err(Error::Input(format!(
                    "config key {key}: {v}; must be {what}"
                )));
            }
        }
        self.check_counts()
    }

    /// The integer keys' bounds (see [`TrainConfig::check_ranges`]).
    fn check_counts(&self) -> Result<()> {
        let week = 7 * 24 * 3600;
        // Every count the trainer derives sizes from (micro-batches per step, rows, buffers,
        // loops), bounded far above any real run so that nothing derived from them overflows or
        // asks for an allocation no machine has: tokens_per_step = 2^62 made 3.6e16
        // micro-batches, then an abort. The paper's runs take 2^22–2^23 tokens per step.
        let counts: [(&str, u64, u64, u64); 22] = [
            ("tokens_per_step", self.tokens_per_step, 0, 1 << 40),
            ("micro_batch", self.micro_batch as u64, 1, 1 << 20),
            ("steps", self.steps, 1, 1 << 40),
            ("stop_at", self.stop_at, 0, 1 << 40),
            ("save_every", self.save_every, 0, 1 << 40),
            ("heldout_every", self.heldout_every, 0, 1 << 40),
            ("heldout_batches", self.heldout_batches as u64, 0, 1 << 20),
            ("max_skips", self.max_skips, 0, 1 << 40),
            ("loader_workers", self.loader_workers as u64, 0, 1 << 10),
            ("dp", self.dp as u64, 0, 1 << 20),
            ("cp", self.cp as u64, 1, 1 << 20),
            ("loss_chunk", self.loss_chunk.max(0) as u64, 1, 1 << 30),
            (
                "long_ce_window",
                self.long_ce_window.max(0) as u64,
                0,
                1 << 40,
            ),
            ("dist_timeout", self.dist_timeout, 1, week),
            ("dist_liveness", self.dist_liveness, 3, week),
            ("end_margin_s", self.end_margin_s, 0, week),
            ("checkpoint_timeout", self.checkpoint_timeout, 0, week),
            ("grad_bucket_mb", self.grad_bucket_mb as u64, 1, 1 << 20),
            ("chunks", self.chunks as u64, 1, 1 << 20),
            ("threads", self.threads.max(0) as u64, 0, 1 << 16),
            (
                "max_position_embeddings",
                self.max_position_embeddings.unwrap_or(0).max(0) as u64,
                0,
                1 << 40,
            ),
            ("keep", self.keep as u64, 1, 1 << 20),
        ];
        for (key, v, lo, hi) in counts {
            if v < lo || v > hi {
                return Err(Error::Input(format!(
                    "config key {key}: {v}; must lie in [{lo}, {hi}]"
                )));
            }
        }
        for (key, v) in [
            ("threads", self.threads),
            ("skip_range", self.skip_range),
            (
                "max_position_embeddings",
                self.max_position_embeddings.unwrap_or(0),
            ),
        ] {
            if v < 0 {
                return Err(Error::Input(format!("config key {key}: {v}; must be ≥ 0")));
            }
        }
        if self.heldout_every > 0 && self.cp > 1 {
            // Each rank would evaluate whole rows of the slice alone (a 256K row on one GPU),
            // while the rest of the world waits for it under the collective timeout.
            return Err(Error::Input(format!(
                "config key heldout_every = {} with cp = {}: held-out evaluation does not split \
                 rows over a context-parallel group, so one rank would hold whole rows while the \
                 others wait; set heldout_every = 0 and evaluate the checkpoints with rsd-eval \
                 (ppl, view-gap) instead, or train with cp = 1",
                self.heldout_every, self.cp
            )));
        }
        if self.heldout_every > 0 && self.heldout_batches == 0 {
            return Err(Error::Input(
                "config key heldout_batches: 0 with heldout_every set; must be ≥ 1".into(),
            ));
        }
        Ok(())
    }

    /// `long_ce_window` / `long_ce_stride` / `long_ce_gamma` checked: `None` when LongCE is off.
    pub fn long_ce(&self) -> Result<Option<crate::step::LongCe>> {
        match self.long_ce_window {
            0 => Ok(None),
            w if w < 0 => Err(Error::Input(format!(
                "long_ce_window {w}: expected 0 (off) or a window of ≥ 1 tokens"
            ))),
            w => {
                if !matches!(self.objective.loss(), Objective::Standard | Objective::Rsd) {
                    return Err(Error::Input(format!(
                        "long_ce_window: LongCE reweights the standard-view CLM term, which \
                         objective {} does not have (use standard or rsd)",
                        self.objective
                    )));
                }
                crate::step::LongCe::new(w, self.long_ce_stride, self.long_ce_gamma).map(Some)
            }
        }
    }

    /// `fixed_split` parsed.
    pub fn fixed_split(&self) -> Result<Option<(i64, i64)>> {
        if self.fixed_split.trim().is_empty() {
            return Ok(None);
        }
        let v: Vec<i64> = self
            .fixed_split
            .split(',')
            .map(|x| x.trim().parse())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                Error::Input(format!(
                    "fixed_split \"{}\": expected \"s,y\"",
                    self.fixed_split
                ))
            })?;
        match v[..] {
            [s, y] if s >= 0 && y >= 1 => Ok(Some((s, y))),
            _ => Err(Error::Input(format!(
                "fixed_split \"{}\": expected \"s,y\" with s ≥ 0, y ≥ 1",
                self.fixed_split
            ))),
        }
    }

    /// As TOML.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }

    /// As a TOML table, key by key (absent optional keys are missing).
    pub fn to_toml_table(&self) -> toml::Table {
        match toml::Value::try_from(self) {
            Ok(toml::Value::Table(t)) => t,
            _ => toml::Table::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_then_cli_and_unknown_keys_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "init = \"x.json\"\nlr = 0.001\nobjective = \"pose\"\nsteps = 7\n",
        )
        .unwrap();
        let cli = ConfigOverrides {
            steps: Some(9),
            ..Default::default()
        };
        let c = TrainConfig::resolve(Some(&p), cli).unwrap();
        assert_eq!((c.lr, c.steps, c.objective), (0.001, 9, Objective::Pose));
        // Round trip through the checkpoint's TOML.
        let back: TrainConfig = toml::from_str(&c.to_toml()).unwrap();
        assert_eq!(back, c);
        std::fs::write(&p, "init = \"x\"\nlearning_rate = 1\n").unwrap();
        let e = TrainConfig::resolve(Some(&p), ConfigOverrides::default()).unwrap_err();
        assert!(e.to_string().contains("learning_rate"), "{e}");
    }

    #[test]
    fn optional_keys_are_absent_and_read_the_old_spellings() {
        let c = TrainConfig {
            init: Some("x.json".into()),
            ..TrainConfig::default()
        };
        let text = c.to_toml();
        for key in ["model", "rope_theta", "max_position_embeddings"] {
            assert!(!text.contains(key), "{key} written while absent:\n{text}");
        }
        // A checkpoint's config.toml from before these keys were optional.
        let old = format!("{text}model = \"\"\nrope_theta = 0.0\nmax_position_embeddings = 0\n");
        assert_eq!(toml::from_str::<TrainConfig>(&old).unwrap(), c);
        let set = format!("{text}rope_theta = 5e5\nmax_position_embeddings = 4096\n");
        let back: TrainConfig = toml::from_str(&set).unwrap();
        assert_eq!(
            (back.rope_theta, back.max_position_embeddings),
            (Some(5e5), Some(4096))
        );
        // On the command line, an empty value still means absent.
        let cli = ConfigOverrides {
            model: Some(String::new()),
            init: Some("y.json".into()),
            rope_theta: Some(0.0),
            ..Default::default()
        };
        let c = TrainConfig::resolve(None, cli).unwrap();
        assert_eq!(
            (c.model, c.init, c.rope_theta),
            (None, Some("y.json".into()), None)
        );
    }

    /// Values that parse but would compute nonsense are refused, naming the key and the range.
    #[test]
    fn out_of_range_numbers_are_refused_naming_key_and_range() {
        let ok = TrainConfig {
            init: Some("x.json".into()),
            ..TrainConfig::default()
        };
        ok.check().expect("the defaults are in range");
        let cases: Vec<(TrainConfig, &str)> = vec![
            (
                TrainConfig {
                    lr: f64::INFINITY,
                    ..ok.clone()
                },
                "lr",
            ),
            (
                TrainConfig {
                    lambda: f64::NAN,
                    ..ok.clone()
                },
                "lambda",
            ),
            (
                TrainConfig {
                    beta2: 1.0,
                    ..ok.clone()
                },
                "beta2",
            ),
            (
                TrainConfig {
                    eps: 0.0,
                    ..ok.clone()
                },
                "eps",
            ),
            (
                TrainConfig {
                    clip: -1.0,
                    ..ok.clone()
                },
                "clip",
            ),
            (
                TrainConfig {
                    rope_theta: Some(f64::INFINITY),
                    ..ok.clone()
                },
                "rope_theta",
            ),
            (
                TrainConfig {
                    dist_timeout: u64::MAX,
                    ..ok.clone()
                },
                "dist_timeout",
            ),
            (
                TrainConfig {
                    grad_bucket_mb: usize::MAX,
                    ..ok.clone()
                },
                "grad_bucket_mb",
            ),
            (
                TrainConfig {
                    keep: 0,
                    ..ok.clone()
                },
                "keep",
            ),
            (
                TrainConfig {
                    skip_range: -3,
                    ..ok.clone()
                },
                "skip_range",
            ),
            (
                TrainConfig {
                    heldout_every: 5,
                    heldout_batches: 0,
                    ..ok.clone()
                },
                "heldout_batches",
            ),
        ];
        for (c, key) in cases {
            let e = c.check().expect_err(key).to_string();
            assert!(e.contains(&format!("config key {key}")), "{key}: {e}");
        }
    }

    /// A config whose bad line is 300 KB long is an error of a few lines naming the file, not an
    /// echo of the line.
    #[test]
    fn a_long_bad_line_is_cut_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, format!("steps = 3\nseed = \"{}\n", "9".repeat(300_000))).unwrap();
        let e = Stated::read(Some(&p), ConfigOverrides::default())
            .map(|_| ())
            .expect_err("bad toml")
            .to_string();
        assert!(
            e.len() < 2000 && e.contains("c.toml") && e.contains("more characters"),
            "{e}"
        );
    }

    /// Every shipped config loads with the trainer's own loader, names the paper section it
    /// follows in one line, and the paper runs have the paper's numbers.
    #[test]
    fn shipped_configs_load_and_match_the_paper() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
        let mut loaded = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().and_then(|e| e.to_str()) != Some("toml") {
                continue;
            }
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            let c = TrainConfig::resolve(Some(&path), ConfigOverrides::default())
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let text = std::fs::read_to_string(&path).unwrap();
            let paper: Vec<&str> = text.lines().filter(|l| l.starts_with("# Paper:")).collect();
            assert_eq!(paper.len(), 1, "{name}: one `# Paper:` line");
            if name.starts_with("llama3") || name.starts_with("qwen3") {
                assert!(paper[0].contains('§'), "{name}: {}", paper[0]);
            }
            loaded.insert(name, c);
        }
        let llama = &loaded["llama3-8b-64k"];
        assert_eq!((llama.steps, llama.tokens_per_step), (1000, 4 << 20));
        assert_eq!(
            llama.shards, "data/prolong-64k/book",
            "the paper's Llama data: book only"
        );
        let mix = &loaded["llama3-8b-64k-bookrepo"];
        assert_eq!(mix.shards.split(',').count(), 2);
        let qwen = &loaded["qwen3-4b-256k"];
        assert_eq!((qwen.steps, qwen.tokens_per_step), (1000, 8 << 20));
        assert_eq!(qwen.max_position_embeddings, Some(262_144));
        let standard = &loaded["llama3-8b-64k-standard"];
        assert_eq!(standard.objective, Objective::Standard);
        assert_eq!(
            standard.steps * 10,
            llama.steps * 16,
            "compute-matched: 1.6× the steps"
        );
        // Apart from the objective, its steps, its run directory and its layout (one view fits
        // without context parallelism), it is the RSD run.
        let same = TrainConfig {
            objective: llama.objective,
            steps: llama.steps,
            out: llama.out.clone(),
            dp: llama.dp,
            cp: llama.cp,
            ..standard.clone()
        };
        assert_eq!(&same, llama);
    }

    #[test]
    fn long_ce_stride_defaults_to_the_papers_and_is_checked() {
        let c = TrainConfig {
            long_ce_window: 4096,
            ..TrainConfig::default()
        };
        // A checkpoint's config written before the key existed reads the paper's stride.
        let old: String = c
            .to_toml()
            .lines()
            .filter(|l| !l.starts_with("long_ce_stride"))
            .map(|l| format!("{l}\n"))
            .collect();
        let back: TrainConfig = toml::from_str(&old).unwrap();
        assert_eq!(back.long_ce_stride, 1024);
        let lc = back.long_ce().unwrap().unwrap();
        assert_eq!((lc.window, lc.stride, lc.gamma), (4096, 1024, 5.0));
        let bad = |stride: i64| TrainConfig {
            long_ce_stride: stride,
            ..c.clone()
        };
        for stride in [0, -4] {
            let e = bad(stride).long_ce().unwrap_err().to_string();
            assert!(e.contains("long_ce_stride"), "{e}");
        }
        // Larger than the reference length: the earlier non-overlapping windows (R = 1).
        assert!(TrainConfig {
            long_ce_window: 1,
            ..bad(64)
        }
        .long_ce()
        .unwrap()
        .is_some());
    }

    #[test]
    fn allow_tokenizer_mismatch_is_a_switch() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            o: ConfigOverrides,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["x"], args].concat())
                .unwrap()
                .o
                .allow_tokenizer_mismatch
        };
        assert_eq!(parse(&["--allow-tokenizer-mismatch"]), Some(true));
        assert_eq!(parse(&["--allow-tokenizer-mismatch", "false"]), Some(false));
        assert_eq!(parse(&[]), None);
    }

    #[test]
    fn control_views_refuse_bad_values_and_incompatible_options() {
        let cli = |o: ConfigOverrides| {
            TrainConfig::resolve(
                None,
                ConfigOverrides {
                    init: Some("x.json".into()),
                    ..o
                },
            )
        };
        let c = cli(ConfigOverrides {
            perturb: Some(PerturbKind::AttnNoise),
            attn_noise_sigma: Some(0.5),
            ..Default::default()
        })
        .unwrap();
        assert_eq!((c.attn_noise_sigma, c.attn_dropout), (0.5, 0.1));
        assert!(c.to_toml().contains("perturb = \"attn-noise\""));
        let err = |o: ConfigOverrides| cli(o).unwrap_err().to_string();
        let e = err(ConfigOverrides {
            attn_noise_sigma: Some(-0.5),
            ..Default::default()
        });
        assert!(e.contains("attn_noise_sigma -0.5"), "{e}");
        let e = err(ConfigOverrides {
            attn_dropout: Some(1.0),
            ..Default::default()
        });
        assert!(e.contains("attn_dropout 1"), "{e}");
        let e = err(ConfigOverrides {
            perturb: Some(PerturbKind::Nope),
            cp: Some(2),
            ..Default::default()
        });
        assert!(e.contains("config key cp: 2") && e.contains("nope"), "{e}");
        let e = err(ConfigOverrides {
            perturb: Some(PerturbKind::Dropout),
            objective: Some(Objective::Pose),
            ..Default::default()
        });
        assert!(
            e.contains("config key perturb") && e.contains("pose"),
            "{e}"
        );
        // A config written before these keys existed loads with their defaults.
        let old = TrainConfig {
            init: Some("x.json".into()),
            ..TrainConfig::default()
        }
        .to_toml()
        .lines()
        .filter(|l| !l.starts_with("attn_"))
        .collect::<Vec<_>>()
        .join("\n");
        let back: TrainConfig = toml::from_str(&old).unwrap();
        assert_eq!((back.attn_noise_sigma, back.attn_dropout), (1.0, 0.1));
    }

    #[test]
    fn on_nonfinite_is_typed_and_a_bad_value_names_the_key() {
        let cli = |v: &str| ConfigOverrides {
            init: Some("x.json".into()),
            on_nonfinite: Some(v.into()),
            ..Default::default()
        };
        let c = TrainConfig::resolve(None, cli("skip")).unwrap();
        assert_eq!(c.on_nonfinite, OnNonFinite::Skip);
        assert!(c.to_toml().contains("on_nonfinite = \"skip\""));
        let e = TrainConfig::resolve(None, cli("maybe")).unwrap_err();
        assert!(e.to_string().contains("on_nonfinite"), "{e}");
    }
}
