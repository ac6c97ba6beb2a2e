//! `rsd-train`: train with RoPE-perturbed self-distillation, or probe one batch.
//!
//! ```text
//! rsd-train --config configs/tiny-cpu.toml [--shards DIR] [--init CFG | --model DIR] --out runs/x
//!           [--any-config-key VALUE …] [--resume [CKPT_DIR]]
//! rsd-train probe --model DIR|--init CFG --tokens T.npy [--objective rsd] [--perturb skip]
//!           [--split 5,9 --skip 100,3] [--kl reverse] [--lambda 1] [--dtype fp32|fp64]
//! ```
//! The binary only turns arguments into calls of the `rsd_train` library (docs/TRAIN.md).
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use tch::{Device, Kind, Tensor};

use rsd_model::{Model, ModelConfig, ModelOptions};
use rsd_train::config::{ConfigOverrides, TrainConfig};
use rsd_train::perturb::{perturb_row, PerturbKind, Perturbation, Scope};
use rsd_train::step::{
    grad_norm, prefix_reuse_floor, reference_loss, step_micro, zero_grads, KlDirection, LongCe,
    LossNormalizers, MicroBatch, Objective, StepOptions, Sums,
};
use rsd_train::train::Trainer;

#[derive(Parser)]
#[command(
    name = "rsd-train",
    version,
    about = "RoPE-perturbed self-distillation trainer"
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
}

#[derive(Args, Clone)]
struct TrainArgs {
    /// TOML config (flat keys; see configs/). Flags override its keys.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Resume: a checkpoint directory, or no value for the newest under <out>/checkpoints.
    #[arg(long, num_args = 0..=1, default_missing_value = "")]
    resume: Option<String>,
    /// Print the resolved config and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    overrides: ConfigOverrides,
}

#[derive(Args)]
struct ProbeArgs {
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
    #[arg(long, value_enum, default_value_t = Objective::Rsd)]
    objective: Objective,
    #[arg(long, value_enum, default_value_t = PerturbKind::Skip)]
    perturb: PerturbKind,
    #[arg(long, value_enum, default_value_t = KlDirection::Reverse)]
    kl: KlDirection,
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
    /// LongCE reweighting of the CLM term with this short-context window (0 = off).
    #[arg(long, default_value_t = 0)]
    long_ce_window: i64,
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

fn list<T: std::str::FromStr + Clone>(
    s: &Option<String>,
    what: &str,
    b: usize,
) -> Result<Option<Vec<T>>> {
    let Some(s) = s else { return Ok(None) };
    let v: Vec<T> = s
        .split(',')
        .map(|x| x.trim().parse::<T>())
        .collect::<std::result::Result<_, _>>()
        .map_err(|_| anyhow::anyhow!("--{what} {s:?}: expected a comma-separated list"))?;
    match v.len() {
        1 => Ok(Some(vec![v.into_iter().next().expect("one"); b])),
        n if n == b => Ok(Some(v)),
        n => bail!("--{what}: {n} values for {b} samples (give 1 or {b})"),
    }
}

fn probe(a: ProbeArgs) -> Result<()> {
    if a.threads > 0 {
        tch::set_num_threads(a.threads);
    }
    let kind = match a.dtype.as_str() {
        "fp32" | "float32" => Kind::Float,
        "fp64" | "float64" => Kind::Double,
        d => bail!("--dtype {d:?}: fp32 or fp64"),
    };
    let options = ModelOptions {
        device: Device::Cpu,
        kind,
    };
    let model = match (&a.model, &a.init) {
        (Some(dir), None) => Model::load(dir, options)?,
        (None, Some(p)) => {
            let v: serde_json::Value = serde_json::from_str(
                &std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
            )?;
            Model::random(ModelConfig::from_hf_json(v)?, options, a.init_seed)?
        }
        _ => bail!("give exactly one of --model DIR or --init CONFIG"),
    };
    let t =
        Tensor::read_npy(&a.tokens).with_context(|| format!("reading {}", a.tokens.display()))?;
    let [b, l] = t.size()[..] else {
        bail!("--tokens must be [B, L], got {:?}", t.size())
    };
    let t = t.to_kind(Kind::Int64);
    let rows: Vec<Vec<i64>> = (0..b)
        .map(|r| Vec::<i64>::try_from(t.get(r)).map_err(anyhow::Error::from))
        .collect::<Result<_>>()?;
    let labels: Vec<Vec<i64>> = rows
        .iter()
        .map(|r| r[1..].iter().copied().chain([-100]).collect())
        .collect();
    let docs: Option<Vec<Vec<i64>>> = match &a.docs {
        None => None,
        Some(s) => {
            let mut d: Vec<Vec<i64>> = s
                .split(';')
                .map(|r| r.split(',').map(|x| x.trim().parse::<i64>()).collect())
                .collect::<std::result::Result<_, _>>()
                .context("--docs: expected \"0,5,12;0,3,12\"")?;
            if d.len() == 1 {
                d = vec![d[0].clone(); b as usize];
            }
            Some(d)
        }
    };
    let positions: Vec<Vec<i64>> = match &docs {
        None => (0..b).map(|_| (0..l).collect()).collect(),
        Some(d) => d
            .iter()
            .map(|cu| cu.windows(2).flat_map(|w| 0..w[1] - w[0]).collect())
            .collect(),
    };
    let mb = MicroBatch::from_rows(&rows, &labels, positions.clone(), docs.clone(), Device::Cpu)?;
    let bu = b as usize;
    let perts: Vec<Perturbation> = match a.perturb {
        _ if !a.objective.needs_perturbed() => vec![Perturbation::None; bu],
        PerturbKind::Skip => {
            let s = list::<i64>(&a.split, "split", bu)?.context("--split is required for skip")?;
            let y = list::<i64>(&a.skip, "skip", bu)?.context("--skip is required for skip")?;
            s.into_iter()
                .zip(y)
                .map(|(split, skip)| Perturbation::Skip { split, skip })
                .collect()
        }
        PerturbKind::Cyclic => list::<i64>(&a.shift, "shift", bu)?
            .context("--shift is required for cyclic")?
            .into_iter()
            .map(|shift| Perturbation::Cyclic { shift })
            .collect(),
        PerturbKind::Dilation => list::<f64>(&a.factor, "factor", bu)?
            .context("--factor is required for dilation")?
            .into_iter()
            .map(|factor| Perturbation::Dilation { factor })
            .collect(),
        PerturbKind::ChunkPermute => {
            let o = list::<usize>(&a.order, "order", 1)?;
            let order: Vec<usize> = a
                .order
                .as_deref()
                .context("--order is required for chunk-permute")?
                .split(',')
                .map(|x| x.trim().parse())
                .collect::<std::result::Result<_, _>>()?;
            drop(o);
            vec![Perturbation::ChunkPermute { order }; bu]
        }
    };
    let views: Vec<_> = (0..bu)
        .map(|r| {
            perturb_row(
                &positions[r],
                docs.as_ref().map(|d| d[r].as_slice()),
                Scope::Sequence,
                &perts[r..=r],
            )
        })
        .collect();
    let opts = StepOptions {
        objective: a.objective,
        kl: a.kl,
        lambda: a.lambda,
        prefix_reuse: !a.no_prefix_reuse,
        loss_chunk: a.loss_chunk,
        checkpoint_layers: a.checkpoint_layers,
        long_ce: (a.long_ce_window > 0).then_some(LongCe {
            window: a.long_ce_window,
            gamma: a.long_ce_gamma,
        }),
    };
    let norm = LossNormalizers {
        label_tokens: mb.label_tokens as f64,
        samples: b as f64,
    };
    let needs = a.objective.needs_perturbed().then_some(views.as_slice());
    let run_once = || -> Result<(f64, f64)> {
        if a.reference {
            let (total, c, s) = reference_loss(&model, &mb, needs, &opts, norm)?;
            total.f_backward()?;
            return Ok((c, s));
        }
        let mut sums = Sums::new(Device::Cpu);
        step_micro(&model, &mb, needs, &opts, norm, &mut sums)?;
        let (c, k, cp) = sums.values(norm);
        Ok((
            c,
            if a.objective == Objective::TwoViewClm {
                cp
            } else {
                k
            },
        ))
    };
    let mut step_seconds = Vec::new();
    let mut clm_second = (0.0, 0.0);
    for _ in 0..a.repeat {
        zero_grads(&model);
        let t0 = std::time::Instant::now();
        clm_second = run_once()?;
        step_seconds.push(t0.elapsed().as_secs_f64());
    }
    let (clm, second) = clm_second;
    let secs = step_seconds.iter().copied().fold(f64::INFINITY, f64::min);
    let gn = grad_norm(&model)?;
    if let Some(p) = &a.grads_out {
        let g: Vec<(String, Tensor)> = model
            .named_parameters()
            .into_iter()
            .filter(|(_, t)| t.grad().defined())
            .map(|(n, t)| (n, t.grad().to_kind(Kind::Float)))
            .collect();
        Tensor::write_safetensors(&g, p)?;
    }
    let kl = if a.objective == Objective::Rsd {
        second
    } else {
        0.0
    };
    let out = serde_json::json!({
        "objective": a.objective, "perturb": a.perturb, "kl_direction": a.kl, "lambda": a.lambda,
        "clm": clm, "kl": kl, "clm_pert": if a.objective == Objective::TwoViewClm { second } else { 0.0 },
        "loss": clm + a.lambda * second * (a.objective.needs_perturbed() && a.objective != Objective::Pose) as u8 as f64,
        "grad_norm": gn, "label_tokens": mb.label_tokens, "samples": b,
        "rows": views.iter().zip(&perts).map(|(v, p)| serde_json::json!({
            "perturbation": p, "kl_rows": v.kl_rows, "shared_prefix": v.shared_prefix,
        })).collect::<Vec<_>>(),
        "dtype": a.dtype, "seconds": secs, "step_seconds": step_seconds,
        "flop_floor_rsd_over_standard": prefix_reuse_floor(model.config(), mb.len()), "peak_rss": rsd_common::mem::Memory::now().peak_rss,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

fn train(a: TrainArgs) -> Result<()> {
    let cfg = TrainConfig::resolve(a.config.as_deref(), a.overrides)?;
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    let out = PathBuf::from(&cfg.out);
    let resume: Option<PathBuf> = match a.resume.as_deref() {
        None => None,
        Some("") => match rsd_train::checkpoint::list(&out).pop() {
            Some((_, p)) => Some(p),
            None => bail!(
                "--resume: no checkpoint under {}",
                out.join("checkpoints").display()
            ),
        },
        Some(p) => Some(PathBuf::from(p)),
    };
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
    eprintln!(
        "rsd-train: {} params, seq_len {}, {} micro-batch(es) of {} row(s) per step, objective {:?}, out {}",
        trainer.model().config().num_parameters(),
        trainer.seq_len(),
        trainer.accum(),
        cfg.micro_batch,
        cfg.objective,
        out.display()
    );
    if cfg.objective == Objective::Rsd {
        eprintln!(
            "rsd-train: FLOP floor of the rsd skip step with prefix reuse: {:.2}× a standard step \
             (s uniform; `rsd-train probe --repeat 3` measures the real ratio)",
            prefix_reuse_floor(trainer.model().config(), trainer.seq_len() as i64)
        );
    }
    let summary = trainer.run(stop.clone())?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    eprintln!(
        "done: {} steps, loss {} -> {}; checkpoint {}; model {}; metrics {}",
        summary.steps,
        summary.first_loss.map_or("-".into(), |l| format!("{l:.4}")),
        summary.last_loss.map_or("-".into(), |l| format!("{l:.4}")),
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

/// Keeps libtorch's large CPU buffers (logit chunks, activations) on the heap between steps.
///
/// glibc serves every allocation above 32 MiB with a fresh `mmap` and returns it on free, so each
/// step re-faults and re-zeroes every large tensor: measured here as ~10–25% of a CPU step.
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

fn main() {
    keep_large_allocations_on_heap();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Some(Cmd::Probe(p)) => probe(*p),
        Some(Cmd::Train(t)) => train(*t),
        None => train(cli.train),
    };
    if let Err(e) = r {
        eprintln!("rsd-train: error: {e:#}");
        std::process::exit(1);
    }
}
