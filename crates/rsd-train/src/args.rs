//! `rsd-train`'s flags for training and for `probe` (the memory command's are in
//! memory_cmd.rs). Every config key is a flag too: `ConfigOverrides`, generated from the config.
use std::path::PathBuf;

use clap::Args;

use rsd_train::config::ConfigOverrides;
use rsd_train::perturb::{KlNorm, PerturbKind};
use rsd_train::step::{KlDirection, LongCe, Objective};

/// `--nproc`: how many ranks the run has, every command of rsd-train reading it the same way.
#[derive(Args, Clone)]
pub struct RanksArgs {
    /// Ranks of the run. Training and `probe` start them on this machine as N copies of the
    /// command (as torchrun would): data-parallel ranks for training (tokens_per_step stays the
    /// global batch), context-parallel ones for `probe --cp N`. The memory plan is per rank of N
    /// (default dp × cp, or WORLD_SIZE).
    #[arg(long, value_name = "N")]
    pub nproc: Option<usize>,
}

#[derive(Args, Clone)]
pub struct TrainArgs {
    /// TOML config (flat keys; see configs/). Flags override its keys.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Resume: a checkpoint directory; no value: the newest under <out>/checkpoints (an error if
    /// there is none or it is damaged); `auto`: the newest complete one, skipping damaged ones
    /// with a warning, or a fresh start when there is none (for jobs that are restarted with the
    /// same command line).
    /// A resumed run keeps the checkpoint's config (its config.toml): keys the command does not
    /// give keep the run's values.
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "DIR|auto")]
    pub resume: Option<String>,
    /// With --resume: the config keys this command may change from the checkpoint's run
    /// (comma-separated, e.g. `steps,lr`). A changed key that alters what the run computes
    /// (objective, lambda, data, model, layout, schedule, out) is refused unless named here;
    /// operational keys (progress, profile, save_at_end, threads, loader_workers, save_every,
    /// save_every_minutes, end_margin_s, keep, stop_at, dist_timeout, dist_liveness,
    /// checkpoint_timeout, heldout_*, device) change freely; the seed never changes. Every
    /// change is printed.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "KEY,...",
        requires = "resume"
    )]
    pub allow_change: Vec<String>,
    /// Start a new run in an --out that holds an earlier run: removes its metrics.jsonl,
    /// checkpoints/, model/ and summary.json first. Without it such an --out is refused (continue
    /// the earlier run with --resume auto instead).
    #[arg(long)]
    pub overwrite: bool,
    /// Print the resolved config and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print the per-GPU memory the config needs on --nproc N GPUs (or dp × cp, or WORLD_SIZE)
    /// and exit: an alias of `rsd-train memory` (which also measures it, --measure). An optional
    /// config.json gives the architecture when the model directory is not there yet.
    #[arg(long, value_name = "ARCH_JSON", num_args = 0..=1, default_missing_value = "")]
    pub print_memory_plan: Option<String>,
    /// GPU memory for --print-memory-plan and for the check that a CUDA run fits, GiB.
    #[arg(long, default_value_t = 80, value_name = "GIB")]
    pub gpu_gib: u64,
    /// --nproc.
    #[command(flatten)]
    pub ranks: RanksArgs,
    #[command(flatten)]
    pub overrides: ConfigOverrides,
}

#[derive(Args)]
pub struct ProbeArgs {
    /// Context-parallel ranks: split every row over N processes (zigzag), as training with
    /// `cp = N` does; run with `--nproc N` or under torchrun. The JSON is the whole batch's.
    #[arg(long, default_value_t = 1)]
    pub cp: usize,
    /// --nproc.
    #[command(flatten)]
    pub ranks: RanksArgs,
    /// HF model directory.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Or a config.json to initialise randomly.
    #[arg(long)]
    pub init: Option<PathBuf>,
    /// Seed of the random init.
    #[arg(long, default_value_t = 0)]
    pub init_seed: i64,
    /// Token ids, int .npy [B, L]; labels are the next tokens (last row position ignored).
    #[arg(long)]
    pub tokens: PathBuf,
    /// Document boundaries per row: "0,5,12;0,3,12" (document-masked attention, positions restart).
    #[arg(long = "docs")]
    pub doc_bounds: Option<String>,
    /// With --docs: the first token of each document is not predicted, as training with
    /// `doc_mask` (ProLong's collator).
    #[arg(long)]
    pub mask_doc_starts: bool,
    /// A loss mask, int .npy [B, L] (1 = the token is a training target, as chat shards carry
    /// it): the token before an unmarked one has no label (objectives sft and sft-rsd).
    #[arg(long, value_name = "M.npy")]
    pub loss_mask: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Objective::Rsd)]
    pub objective: Objective,
    /// The second view: a position perturbation, or a control view (nope, attn-noise, dropout;
    /// with objective rsd).
    #[arg(long, value_enum, default_value_t = PerturbKind::Skip)]
    pub perturb: PerturbKind,
    #[arg(long, value_enum, default_value_t = KlDirection::Reverse)]
    pub kl: KlDirection,
    /// The KL's per-sample normaliser: rows (1/|R_b|, the paper's) or length (1/L_b).
    #[arg(long, value_enum, default_value_t = KlNorm::Rows)]
    pub kl_norm: KlNorm,
    /// Real tokens per row, one value or one per sample: the rest of the row is padding (no
    /// labels, no KL rows, no perturbation), as the pack's `--tail pad` rows in training.
    #[arg(long)]
    pub real_len: Option<String>,
    #[arg(long, default_value_t = 1.0)]
    pub lambda: f64,
    /// Skip split s, one value or one per sample (comma-separated).
    #[arg(long)]
    pub split: Option<String>,
    /// Skip length y, one value or one per sample.
    #[arg(long)]
    pub skip: Option<String>,
    /// Cyclic shift u, one value or one per sample.
    #[arg(long)]
    pub shift: Option<String>,
    /// Dilation factor a, one value or one per sample.
    #[arg(long)]
    pub factor: Option<String>,
    /// Chunk-permute order, e.g. "2,0,1" (same for every sample).
    #[arg(long)]
    pub order: Option<String>,
    /// σ of the attn-noise view (noise N(0, σ²) on its attention scores).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub attn_noise_sigma: f64,
    /// Rate of the dropout view's attention-probability dropout (both passes), in [0, 1).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    pub attn_dropout: f64,
    /// Seed of the control views' draws (row r draws as row r of step 0 of a run with this seed).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the control views' draws (attention noise, dropout masks) to this .safetensors
    /// file: `layers.{i}.{standard|perturbed}.{score_noise|keep}`, [rows, heads, L, L].
    #[arg(long)]
    pub dump: Option<PathBuf>,
    /// fp32 or fp64.
    #[arg(long, default_value = "fp32")]
    pub dtype: String,
    /// Rows per loss chunk.
    #[arg(long, default_value_t = 1024)]
    pub loss_chunk: i64,
    /// Naive two full passes instead of prefix reuse.
    #[arg(long)]
    pub no_prefix_reuse: bool,
    /// Per-layer activation checkpointing.
    #[arg(long)]
    pub checkpoint_layers: bool,
    /// LongCE reweighting of the CLM term: the reference length, the fewest tokens of short
    /// context a reweighted token has (0 = off; the paper: 4096).
    #[arg(long, default_value_t = 0)]
    pub long_ce_window: i64,
    /// LongCE: how far the short-context windows slide (the paper: 1024; window 1 with stride K
    /// is the earlier non-overlapping K-token windows).
    #[arg(long, default_value_t = LongCe::PAPER_STRIDE)]
    pub long_ce_stride: i64,
    /// LongCE cap γ.
    #[arg(long, default_value_t = 5.0)]
    pub long_ce_gamma: f64,
    /// Use the slow full-logits reference instead of the training step.
    #[arg(long)]
    pub reference: bool,
    /// Also write every parameter gradient to this .safetensors file.
    #[arg(long)]
    pub grads_out: Option<PathBuf>,
    /// libtorch threads (0 = default).
    #[arg(long, default_value_t = 0)]
    pub threads: i32,
    /// Run the step this many times (gradients zeroed between runs) and report the fastest as
    /// `seconds` (all in `step_seconds`); the first run pays one-off allocation and warm-up costs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
}
