//! `rsd-train`: train with RoPE-perturbed self-distillation, or probe one batch.
//!
//! ```text
//! rsd-train --config configs/tiny-cpu.toml [--shards DIR] [--init CFG | --model DIR] --out runs/x
//!           [--any-config-key VALUE …] [--resume [CKPT_DIR|auto]] [--nproc N]
//! rsd-train probe --model DIR|--init CFG --tokens T.npy [--objective rsd] [--perturb skip]
//!           [--split 5,9 --skip 100,3] [--kl reverse] [--lambda 1] [--dtype fp32|fp64]
//! rsd-train probe … --perturb nope|attn-noise|dropout [--attn-noise-sigma 1] [--attn-dropout 0.1]
//!           [--seed 0] [--dump DRAWS.safetensors]
//! ```
//! The binary only turns arguments into calls of the `rsd_train` library (docs/TRAIN.md).
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use rsd_train::checkpoint::Valid;
use rsd_train::config::{ConfigOverrides, Stated, TrainConfig};
use rsd_train::perturb::{KlNorm, PerturbKind};
use rsd_train::probe::{PerturbParams, ProbeModel, ProbeRequest};
use rsd_train::step::{
    prefix_reuse_floor, KlDirection, LongCe, Objective, SecondView, StepOptions,
};
use rsd_train::train::Trainer;

mod launch;
mod memory_cmd;

/// Exit status of a rank whose collective failed, usually because another rank failed first (the
/// launcher then names that one).
const EXIT_COLLECTIVE_FAILED: i32 = 3;

/// The exit status for an error: [`EXIT_COLLECTIVE_FAILED`] or 1.
fn exit_status(e: &anyhow::Error) -> i32 {
    match e.downcast_ref::<rsd_train::Error>() {
        Some(rsd_train::Error::Dist(rsd_dist::DistError::Collective { .. })) => {
            EXIT_COLLECTIVE_FAILED
        }
        _ => 1,
    }
}

#[derive(Parser)]
#[command(
    name = "rsd-train",
    version,
    about = "RoPE-perturbed self-distillation trainer",
    after_help = "Environment: RSD_BACKTRACE=1 prints libtorch's full error text (with its C++ \
                  backtrace); by default an error is one line. On clusters, restart jobs with the \
                  same command line and --resume auto (docs/TRAIN.md)."
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    train: TrainArgs,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train (the default when no subcommand is given).
    Train(Box<TrainArgs>),
    /// Loss terms and gradient norm of one batch, as JSON; nothing is updated.
    Probe(Box<ProbeArgs>),
    /// The memory plan per rank by category (weights, gradients, optimizer state, saved
    /// activations, transient, communication, update; the CUDA runtime apart); with --measure,
    /// the same run here (the config's GPU, else this CPU) with libtorch's allocator counted, and
    /// plan/measured per category. `--print-memory-plan` is an alias of the plan alone.
    Memory(Box<memory_cmd::MemoryArgs>),
}

#[derive(Args, Clone)]
struct TrainArgs {
    /// TOML config (flat keys; see configs/). Flags override its keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Resume: a checkpoint directory; no value: the newest under <out>/checkpoints (an error if
    /// there is none or it is damaged); `auto`: the newest complete one, skipping damaged ones
    /// with a warning, or a fresh start when there is none (for jobs that are restarted with the
    /// same command line).
    /// A resumed run keeps the checkpoint's config (its config.toml): keys the command does not
    /// give keep the run's values.
    #[arg(long, num_args = 0..=1, default_missing_value = "", value_name = "DIR|auto")]
    resume: Option<String>,
    /// With --resume: the config keys this command may change from the checkpoint's run
    /// (comma-separated, e.g. `steps,lr`). A changed key that alters what the run computes
    /// (objective, lambda, data, model, layout, schedule, out) is refused unless named here;
    /// operational keys (progress, threads, loader_workers, save_every, keep, stop_at,
    /// dist_timeout, heldout_*, device) change freely; the seed never changes. Every change is
    /// printed.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "KEY,...",
        requires = "resume"
    )]
    allow_change: Vec<String>,
    /// Start a new run in an --out that holds an earlier run: removes its metrics.jsonl,
    /// checkpoints/, model/ and summary.json first. Without it such an --out is refused (continue
    /// the earlier run with --resume auto instead).
    #[arg(long)]
    overwrite: bool,
    /// Print the resolved config and exit.
    #[arg(long)]
    print_config: bool,
    /// Print the per-GPU memory the config needs on --nproc N GPUs (or dp × cp, or WORLD_SIZE)
    /// and exit: an alias of `rsd-train memory` (which also measures it, --measure). An optional
    /// config.json gives the architecture when the model directory is not there yet.
    #[arg(long, value_name = "ARCH_JSON", num_args = 0..=1, default_missing_value = "")]
    print_memory_plan: Option<String>,
    /// GPU memory for --print-memory-plan and for the check that a CUDA run fits, GiB.
    #[arg(long, default_value_t = 80, value_name = "GIB")]
    gpu_gib: u64,
    /// Run N data-parallel ranks on this machine (N copies of this command, as torchrun would);
    /// tokens_per_step stays the global batch.
    #[arg(long)]
    nproc: Option<usize>,
    #[command(flatten)]
    overrides: ConfigOverrides,
}

#[derive(Args)]
struct ProbeArgs {
    /// Context-parallel ranks: split every row over N processes (zigzag), as training with
    /// `cp = N` does; run with `--nproc N` or under torchrun. The JSON is the whole batch's.
    #[arg(long, default_value_t = 1)]
    cp: usize,
    /// Run N local processes (as torchrun would), for `--cp N`.
    #[arg(long)]
    nproc: Option<usize>,
    /// HF model directory.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Or a config.json to initialise randomly.
    #[arg(long)]
    init: Option<PathBuf>,
    /// Seed of the random init.
    #[arg(long, default_value_t = 0)]
    init_seed: i64,
    /// Token ids, int .npy [B, L]; labels are the next tokens (last row position ignored).
    #[arg(long)]
    tokens: PathBuf,
    /// Document boundaries per row: "0,5,12;0,3,12" (document-masked attention, positions restart).
    #[arg(long)]
    docs: Option<String>,
    /// With --docs: the first token of each document is not predicted, as training with
    /// `doc_mask` (ProLong's collator).
    #[arg(long)]
    mask_doc_starts: bool,
    /// A loss mask, int .npy [B, L] (1 = the token is a training target, as chat shards carry
    /// it): the token before an unmarked one has no label (objectives sft and sft-rsd).
    #[arg(long, value_name = "M.npy")]
    loss_mask: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Objective::Rsd)]
    objective: Objective,
    /// The second view: a position perturbation, or a control view (nope, attn-noise, dropout;
    /// with objective rsd).
    #[arg(long, value_enum, default_value_t = PerturbKind::Skip)]
    perturb: PerturbKind,
    #[arg(long, value_enum, default_value_t = KlDirection::Reverse)]
    kl: KlDirection,
    /// The KL's per-sample normaliser: rows (1/|R_b|, the paper's) or length (1/L_b).
    #[arg(long, value_enum, default_value_t = KlNorm::Rows)]
    kl_norm: KlNorm,
    /// Real tokens per row, one value or one per sample: the rest of the row is padding (no
    /// labels, no KL rows, no perturbation), as the pack's `--tail pad` rows in training.
    #[arg(long)]
    real_len: Option<String>,
    #[arg(long, default_value_t = 1.0)]
    lambda: f64,
    /// Skip split s, one value or one per sample (comma-separated).
    #[arg(long)]
    split: Option<String>,
    /// Skip length y, one value or one per sample.
    #[arg(long)]
    skip: Option<String>,
    /// Cyclic shift u, one value or one per sample.
    #[arg(long)]
    shift: Option<String>,
    /// Dilation factor a, one value or one per sample.
    #[arg(long)]
    factor: Option<String>,
    /// Chunk-permute order, e.g. "2,0,1" (same for every sample).
    #[arg(long)]
    order: Option<String>,
    /// σ of the attn-noise view (noise N(0, σ²) on its attention scores).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    attn_noise_sigma: f64,
    /// Rate of the dropout view's attention-probability dropout (both passes), in [0, 1).
    #[arg(long, default_value_t = 0.1, allow_negative_numbers = true)]
    attn_dropout: f64,
    /// Seed of the control views' draws (row r draws as row r of step 0 of a run with this seed).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Also write the control views' draws (attention noise, dropout masks) to this .safetensors
    /// file: `layers.{i}.{standard|perturbed}.{score_noise|keep}`, [rows, heads, L, L].
    #[arg(long)]
    dump: Option<PathBuf>,
    /// fp32 or fp64.
    #[arg(long, default_value = "fp32")]
    dtype: String,
    /// Rows per loss chunk.
    #[arg(long, default_value_t = 1024)]
    loss_chunk: i64,
    /// Naive two full passes instead of prefix reuse.
    #[arg(long)]
    no_prefix_reuse: bool,
    /// Per-layer activation checkpointing.
    #[arg(long)]
    checkpoint_layers: bool,
    /// LongCE reweighting of the CLM term: the reference length, the fewest tokens of short
    /// context a reweighted token has (0 = off; the paper: 4096).
    #[arg(long, default_value_t = 0)]
    long_ce_window: i64,
    /// LongCE: how far the short-context windows slide (the paper: 1024; window 1 with stride K
    /// is the earlier non-overlapping K-token windows).
    #[arg(long, default_value_t = LongCe::PAPER_STRIDE)]
    long_ce_stride: i64,
    /// LongCE cap γ.
    #[arg(long, default_value_t = 5.0)]
    long_ce_gamma: f64,
    /// Use the slow full-logits reference instead of the training step.
    #[arg(long)]
    reference: bool,
    /// Also write every parameter gradient to this .safetensors file.
    #[arg(long)]
    grads_out: Option<PathBuf>,
    /// libtorch threads (0 = default).
    #[arg(long, default_value_t = 0)]
    threads: i32,
    /// Run the step this many times (gradients zeroed between runs) and report the fastest as
    /// `seconds` (all in `step_seconds`); the first run pays one-off allocation and warm-up costs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
}

/// A comma-separated list of values (`--split 5,9`); `None` when the flag is absent.
fn list<T: std::str::FromStr>(s: &Option<String>, flag: &str) -> Result<Option<Vec<T>>> {
    let Some(s) = s else { return Ok(None) };
    let v = s
        .split(',')
        .map(|x| x.trim().parse::<T>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--{flag} \"{s}\": expected a comma-separated list"))?;
    Ok(Some(v))
}

/// The dp × cp layout the config asks for (dp 0: whatever the world size leaves).
fn mesh_shape(cfg: &TrainConfig) -> rsd_dist::MeshShape {
    rsd_dist::MeshShape {
        dp: cfg.dp,
        cp: cfg.cp.max(1),
    }
}

fn probe(a: ProbeArgs) -> Result<()> {
    if let Some(n) = a.nproc {
        rsd_dist::layout(
            n,
            rsd_dist::MeshShape {
                dp: 1,
                cp: a.cp.max(1),
            },
        )?;
        match launch::run(n)? {
            0 => return Ok(()),
            code => std::process::exit(code),
        }
    }
    // Phase 1: plain values, no I/O.
    if a.threads > 0 {
        tch::set_num_threads(a.threads);
    }
    let model = match (a.model, a.init) {
        (Some(dir), None) => ProbeModel::Dir(dir),
        (None, Some(config)) => ProbeModel::Init {
            config,
            seed: a.init_seed,
        },
        _ => bail!("give exactly one of --model DIR or --init CONFIG"),
    };
    let params = PerturbParams {
        split: list(&a.split, "split")?,
        skip: list(&a.skip, "skip")?,
        shift: list(&a.shift, "shift")?,
        factor: list(&a.factor, "factor")?,
        order: list(&a.order, "order")?,
    };
    let request = ProbeRequest {
        model,
        tokens: a.tokens,
        docs: a.docs,
        perturb: a.perturb,
        kl_norm: a.kl_norm,
        real_len: list(&a.real_len, "real-len")?,
        mask_doc_starts: a.mask_doc_starts,
        loss_mask: a.loss_mask,
        params,
        dtype: a.dtype,
        step: StepOptions {
            objective: a.objective.loss(),
            kl: a.kl,
            lambda: a.lambda,
            prefix_reuse: !a.no_prefix_reuse,
            loss_chunk: a.loss_chunk,
            checkpoint_layers: a.checkpoint_layers,
            long_ce: match a.long_ce_window {
                0 => None,
                w => Some(LongCe::new(w, a.long_ce_stride, a.long_ce_gamma)?),
            },
            view: SecondView::of(a.perturb, a.attn_noise_sigma, a.attn_dropout),
        },
        reference: a.reference,
        grads_out: a.grads_out,
        repeat: a.repeat,
        cp: a.cp,
        seed: a.seed,
        dump: a.dump,
    };
    // Phase 2: the library does the work.
    let report = rsd_train::probe::run(&request)?;
    if std::env::var("RANK").is_ok_and(|r| r != "0") {
        // One report per run: rank 0's (every rank holds the same values).
        return Ok(());
    }
    // Through a JSON value, so the keys print sorted as they always have.
    println!(
        "{}",
        serde_json::to_string_pretty(&serde_json::to_value(&report)?)?
    );
    Ok(())
}

/// The objective as the config and the command line write it (`rsd`, `two-view-clm`, …).
fn objective_name(objective: Objective) -> String {
    serde_json::to_value(objective)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Whether this process prints start-up notes (rank 0, or not data-parallel).
fn is_rank0() -> bool {
    std::env::var("RANK").map_or(true, |r| r.trim() == "0")
}

/// What a run is: its config, the checkpoint it resumes (if any), and the notes to print about
/// how both were found.
struct Run {
    cfg: TrainConfig,
    resume: Option<PathBuf>,
    notes: Vec<String>,
}

/// The run the command asks for: a fresh one (defaults ← `--config` ← flags), or a resumed one
/// (the checkpoint's config ← the changes the command states, see `rsd_train::resume`).
fn resolve_run(a: &TrainArgs) -> Result<Run> {
    let stated = Stated::read(a.config.as_deref(), a.overrides.clone())?;
    let mut notes = Vec::new();
    let found = match a.resume.as_deref() {
        None => None,
        Some(arg) => find_checkpoint(arg, &stated, &mut notes)?,
    };
    let Some((dir, valid)) = found else {
        return Ok(Run {
            cfg: stated.resolve()?,
            resume: None,
            notes,
        });
    };
    let step = valid.state.step;
    let resumed = rsd_train::resume::config(&dir, valid.config, stated, &a.allow_change)?;
    notes.push(format!(
        "rsd-train: {}resuming from {} (step {step} of {}) with the run's config ({}){}",
        if a.resume.as_deref() == Some("auto") {
            "--resume auto: "
        } else {
            ""
        },
        dir.display(),
        resumed.config.steps,
        dir.join("config.toml").display(),
        if resumed.changes.is_empty() {
            ", unchanged"
        } else {
            ", changed:"
        }
    ));
    for c in &resumed.changes {
        notes.push(format!("rsd-train:   {c}"));
    }
    Ok(Run {
        cfg: resumed.config,
        resume: Some(dir),
        notes,
    })
}

/// The checkpoint `--resume` names, checked with `checkpoint::validate` (the error names the
/// damaged file): `""` the newest checkpoint, `auto` the newest that is complete (or a fresh
/// start, `None`, when there is none), anything else a directory.
fn find_checkpoint(
    arg: &str,
    stated: &Stated,
    notes: &mut Vec<String>,
) -> Result<Option<(PathBuf, Valid)>> {
    use rsd_train::checkpoint;
    let out = || match stated.out() {
        Some(out) => Ok(PathBuf::from(out)),
        None => Err(anyhow::anyhow!(
            "--resume{}: which run? give its directory with --out DIR (or `out` in --config), \
             or name a checkpoint: --resume DIR/checkpoints/step-N",
            if arg.is_empty() { "" } else { " auto" }
        )),
    };
    let dir = match arg {
        "auto" => {
            let out = out()?;
            if is_rank0() {
                // Left by a writer killed mid-checkpoint (a preempted job); only rank 0 writes.
                for dir in checkpoint::remove_stale_temporaries(&out) {
                    notes.push(format!(
                        "rsd-train: removed unfinished checkpoint {}",
                        dir.display()
                    ));
                }
            }
            let found = checkpoint::auto_resume(&out);
            for (dir, why) in &found.skipped {
                notes.push(format!(
                    "rsd-train: warning: skipping damaged checkpoint {}: {}",
                    dir.display(),
                    rsd_common::report::for_user_from_env(&why.to_string())
                ));
            }
            return match found.chosen {
                Some(chosen) => Ok(Some(chosen)),
                // Damaged checkpoints and nothing to fall back to: starting over would discard
                // the run's progress without anyone looking at why.
                None if !found.skipped.is_empty() => {
                    for n in notes.iter() {
                        eprintln!("{n}");
                    }
                    bail!(
                        "--resume auto: no complete checkpoint under {} ({} damaged, see the \
                         warnings); remove them to start over, or resume one with --resume DIR",
                        out.join("checkpoints").display(),
                        found.skipped.len()
                    )
                }
                None => {
                    notes.push(format!(
                        "rsd-train: --resume auto: no checkpoint under {}; starting fresh",
                        out.join("checkpoints").display()
                    ));
                    Ok(None)
                }
            };
        }
        "" => {
            let out = out()?;
            match checkpoint::list(&out).pop() {
                Some((_, p)) => p,
                None => bail!(
                    "--resume: no checkpoint under {} (--resume auto starts fresh instead)",
                    out.join("checkpoints").display()
                ),
            }
        }
        p => PathBuf::from(p),
    };
    let valid = checkpoint::validate(&dir)?;
    Ok(Some((dir, valid)))
}

/// Keeps runs apart: a new run (or one branched from another run's checkpoint) never writes
/// into a directory that holds an earlier run, unless `--overwrite` removes it first; a run
/// continued from its own checkpoint keeps its log up to that checkpoint's step. Every rank
/// checks, rank 0 alone removes or rewrites (the others take the same branch either way).
fn prepare_run_dir(
    out: &Path,
    resume: Option<&Path>,
    resume_arg: Option<&str>,
    overwrite: bool,
) -> Result<()> {
    use rsd_train::{checkpoint, run_dir};
    let continuing = resume.is_some_and(|ck| {
        run_dir::run_of_checkpoint(ck).is_some_and(|run| run_dir::same_dir(&run, out))
    });
    if let (true, Some(ck)) = (continuing, resume) {
        if is_rank0() {
            let step = checkpoint::read_state(ck)?.step;
            run_dir::keep_metrics_through(out, step)?;
        }
        return Ok(());
    }
    let earlier = run_dir::earlier_run(out);
    if earlier.is_empty() {
        return Ok(());
    }
    // `--resume auto` that found no checkpoint: the same job restarted before its first one,
    // which left only a partial log.
    let restarted =
        resume_arg == Some("auto") && resume.is_none() && earlier == [out.join("metrics.jsonl")];
    if overwrite || restarted {
        if is_rank0() {
            run_dir::remove_earlier_run(out)?;
        }
        return Ok(());
    }
    let names: Vec<String> = earlier
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    bail!(
        "{} already holds a run ({}): continue it with --resume auto, start a new run there \
         with --overwrite (removes those), or choose another --out",
        out.display(),
        names.join(", ")
    )
}

/// A hint for errors whose cause is a full disk: what was kept, and how to go on.
fn disk_full_hint(e: &anyhow::Error, out: &Path) -> Option<String> {
    let full = e.chain().any(|c| {
        let io = match c.downcast_ref::<rsd_train::Error>() {
            Some(rsd_train::Error::Io { source, .. }) => Some(source),
            _ => c.downcast_ref::<std::io::Error>(),
        };
        // libtorch's and the safetensors crate's writers report the OS error only as text.
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
            || c.to_string().contains("No space left on device")
    });
    if !full {
        return None;
    }
    let kept = rsd_train::checkpoint::list(out)
        .pop()
        .map_or("none yet".to_string(), |(_, p)| p.display().to_string());
    Some(format!(
        "the disk is full; the unfinished checkpoint was removed and the last complete one is \
         {kept}: free space, then run the same command with --resume auto"
    ))
}

/// A loss for the final line: the number, or `n/a` when no step ran.
fn loss_str(loss: Option<f64>) -> String {
    loss.map_or_else(|| "n/a".to_string(), |l| format!("{l:.4}"))
}

/// Set for the ranks `--nproc` starts: the launching process has printed how the run was
/// resolved, so they do not print it again.
const NOTES_SHOWN: &str = "RSD_TRAIN_NOTES_SHOWN";

fn train(a: TrainArgs) -> Result<()> {
    let Run { cfg, resume, notes } = resolve_run(&a)?;
    if a.print_config {
        for n in &notes {
            eprintln!("{n}");
        }
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    if let Some(arch) = &a.print_memory_plan {
        let arch = (!arch.is_empty()).then(|| PathBuf::from(arch));
        return memory_cmd::print_plan(&cfg, arch.as_deref(), a.nproc, a.gpu_gib);
    }
    // A CUDA run whose plan does not fit its GPUs stops here, naming the change that fits.
    memory_cmd::refuse_if_too_big(&cfg, a.nproc, a.gpu_gib)?;
    // `--dp N` / `--cp N` alone (no launcher around this process) start the ranks themselves.
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    let shape = mesh_shape(&cfg);
    let nproc = match a.nproc {
        // Every process is one rank of the dp × cp mesh: refuse a count that does not fit
        // before starting any (the error names --nproc, --dp and --cp).
        Some(n) => {
            rsd_dist::layout(n, shape)?;
            Some(n)
        }
        None if !launched => rsd_dist::MeshShape {
            dp: shape.dp.max(1),
            ..shape
        }
        .processes()
        .filter(|&w| w > 1),
        None => None,
    };
    if is_rank0() && std::env::var_os(NOTES_SHOWN).is_none() {
        for n in &notes {
            eprintln!("{n}");
        }
    }
    if let Some(n) = nproc {
        // SAFETY (set_var): no other thread runs yet; the ranks inherit the environment.
        std::env::set_var(NOTES_SHOWN, "1");
        match launch::run(n)? {
            0 => return Ok(()),
            code => std::process::exit(code),
        }
    }
    let out = PathBuf::from(&cfg.out);
    prepare_run_dir(&out, resume.as_deref(), a.resume.as_deref(), a.overwrite)?;
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || {
            if stop.swap(true, Ordering::SeqCst) {
                eprintln!("second interrupt: exiting without a checkpoint");
                std::process::exit(130);
            }
            eprintln!(
                "interrupt: finishing this step, writing a checkpoint (Ctrl-C again to abandon)"
            );
        })
        .context("installing the Ctrl-C handler")?;
    }
    let mut trainer = Trainer::new(cfg.clone(), resume.as_deref())?;
    let main = trainer.is_main();
    if main && trainer.ranks() > 1 {
        eprintln!(
            "rsd-train: {} data-parallel ranks, {} micro-batch(es) each per step",
            trainer.ranks(),
            trainer.accum() / trainer.ranks()
        );
    }
    if main && trainer.cp_size() > 1 {
        eprintln!(
            "rsd-train: context parallelism over {} ranks: each holds 2 of every sequence's {} \
             chunks (zigzag), K/V gathered per layer; with prefix reuse the perturbed suffix is \
             re-sharded zigzag over the ranks",
            trainer.cp_size(),
            2 * trainer.cp_size()
        );
    }
    if main {
        eprintln!(
        "rsd-train: {} params, seq_len {}, {} micro-batch(es) of {} row(s) per step, objective {}, out {}",
        trainer.model().config().num_parameters(),
        trainer.seq_len(),
        trainer.accum(),
        cfg.micro_batch,
        objective_name(cfg.objective),
        out.display()
        );
    }
    if main && cfg.objective.loss() == Objective::Rsd {
        eprintln!(
            "rsd-train: FLOP floor of the rsd skip step with prefix reuse: {:.2}× a standard step \
             (s uniform; `python benches/train_bench.py --config CONFIG.json --len L` measures the real \
             ratio)",
            prefix_reuse_floor(trainer.model().config(), trainer.seq_len() as i64)
        );
    }
    let summary = trainer.run(stop.clone()).map_err(|e| {
        let e = anyhow::Error::from(e);
        match disk_full_hint(&e, &out) {
            Some(hint) => e.context(hint),
            None => e,
        }
    })?;
    if !main {
        if stop.load(Ordering::SeqCst) {
            std::process::exit(130);
        }
        return Ok(());
    }
    println!("{}", serde_json::to_string_pretty(&summary)?);
    eprintln!(
        "done: {} steps, loss {} -> {} (means over the first and last {} step{}); checkpoint {}; \
         model {}; metrics {}",
        summary.steps,
        loss_str(summary.first_loss_mean),
        loss_str(summary.last_loss_mean),
        summary.loss_window,
        if summary.loss_window == 1 { "" } else { "s" },
        summary
            .checkpoint
            .as_deref()
            .map_or("-".into(), |p: &Path| p.display().to_string()),
        summary
            .final_model
            .as_deref()
            .map_or("(interrupted)".into(), |p: &Path| p.display().to_string()),
        summary.metrics.display()
    );
    if stop.load(Ordering::SeqCst) {
        std::process::exit(130);
    }
    Ok(())
}

/// The command line, with each config key's default in its help: the keys are optional flags
/// (a flag left out keeps the config file's value), so clap has no default of its own to show.
fn command() -> clap::Command {
    let defaults = TrainConfig::default().to_toml_table();
    let with_defaults = |mut cmd: clap::Command| {
        for key in TrainConfig::KEYS {
            let Some(value) = defaults.get(*key).filter(|v| v.as_str() != Some("")) else {
                continue;
            };
            cmd = cmd.mut_arg(*key, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [default: {value}]"))
            });
        }
        cmd
    };
    let cmd = with_defaults(Cli::command());
    cmd.mut_subcommand("train", with_defaults)
        .mut_subcommand("memory", with_defaults)
}

/// Keeps libtorch's large CPU buffers (logit chunks, activations) on the heap between steps.
///
/// glibc serves every allocation above 32 MiB with a fresh `mmap` and returns it on free, so each
/// step re-faults and re-zeroes every large tensor, a sizeable share of a CPU step
/// (docs/BENCHMARKS.md, "rsd-train").
/// Serving them from the heap and not trimming it makes later steps reuse the pages. No effect
/// on CUDA memory (libtorch's caching allocator already reuses it).
fn keep_large_allocations_on_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// The CUDA caching allocator's setting rsd-train runs with when `PYTORCH_CUDA_ALLOC_CONF` is not
/// set (`None`: leave what is set, an empty value included, which is torch's default).
///
/// With expandable segments the allocator grows mapped segments instead of keeping a pool of
/// fixed-size blocks per phase. On an H200, Llama-3-8B's widths (4 layers, rsd, bf16) at 32K
/// tokens reserved 55.0 GiB with torch's default and 49.2 GiB with expandable segments, for the
/// same 47.9 GiB of live tensors at the peak (docs/GPU.md): the default exceeded the memory plan.
fn default_cuda_alloc_conf(current: Option<&std::ffi::OsStr>) -> Option<&'static str> {
    current.is_none().then_some("expandable_segments:True")
}

fn main() {
    keep_large_allocations_on_heap();
    if let Some(conf) =
        default_cuda_alloc_conf(std::env::var_os("PYTORCH_CUDA_ALLOC_CONF").as_deref())
    {
        // Read by the allocator when CUDA first initialises, later in this process (and by the
        // ranks `--nproc` launches, which inherit it). No other thread exists yet.
        std::env::set_var("PYTORCH_CUDA_ALLOC_CONF", conf);
    }
    let cli = Cli::from_arg_matches(&command().get_matches()).unwrap_or_else(|e| e.exit());
    let r = match cli.cmd {
        Some(Cmd::Probe(p)) => probe(*p),
        Some(Cmd::Memory(m)) => memory_cmd::run(*m),
        Some(Cmd::Train(t)) => train(*t),
        None => train(cli.train),
    };
    if let Err(e) = r {
        // Each cause once (library errors quote their source), libtorch's C++ backtrace only on
        // request (RSD_BACKTRACE=1).
        eprintln!(
            "rsd-train: error: {}",
            rsd_common::report::one_line(e.chain().map(|c| c.to_string()))
        );
        std::process::exit(exit_status(&e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expandable_segments_are_the_default_and_a_set_value_is_kept() {
        assert_eq!(
            default_cuda_alloc_conf(None),
            Some("expandable_segments:True")
        );
        assert_eq!(default_cuda_alloc_conf(Some("".as_ref())), None);
        assert_eq!(
            default_cuda_alloc_conf(Some("max_split_size_mb:512".as_ref())),
            None
        );
    }

    #[test]
    fn disk_full_is_recognised_through_typed_and_text_only_errors() {
        let out = Path::new("/nonexistent-rsd-train-out");
        let typed = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::StorageFull))
            .context("writing a checkpoint");
        let text = anyhow::anyhow!(
            "safetensors error x/optimizer.safetensors: IoError(Os {{ code: 28, kind: StorageFull, \
             message: \"No space left on device\" }})"
        );
        let other = anyhow::anyhow!("permission denied");
        for e in [typed, text] {
            let hint = disk_full_hint(&e, out).expect("a disk-full hint");
            assert!(
                hint.contains("none yet") && hint.contains("--resume auto"),
                "{hint}"
            );
        }
        assert!(disk_full_hint(&other, out).is_none());
    }
}
