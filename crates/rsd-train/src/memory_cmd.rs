//! `rsd-train memory`: the memory plan per rank, and with `--measure` the same run on this
//! machine with libtorch's allocator counted, CPU or CUDA (`rsd_train::memory_measure`).
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use rsd_train::config::{ConfigOverrides, TrainConfig};
use rsd_train::memory_measure::{self as measure, Measured};
use rsd_train::memory_plan::{self, Category, MemoryPlan, PlanInput};
use rsd_train::memory_run;
use rsd_train::step::prefix_reuse_floor;

use crate::args::RanksArgs;

#[derive(Args, Clone)]
pub struct MemoryArgs {
    /// TOML config (flat keys; see configs/). Flags override its keys (--dp, --cp,
    /// --shard-optimizer, --checkpoint-layers, --max-position-embeddings, …).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The architecture, a config.json, when the config's model directory is not there yet
    /// (configs/model/ has Llama-3-8B's and Qwen3-4B's).
    #[arg(long, value_name = "CONFIG_JSON")]
    arch: Option<PathBuf>,
    /// --nproc.
    #[command(flatten)]
    ranks: RanksArgs,
    /// Memory of one GPU, GiB.
    #[arg(long, default_value_t = 80, value_name = "GIB")]
    gpu_gib: u64,
    /// Also run the config here (dp × cp local processes, synthetic data, the model randomly
    /// initialised) for one warm-up step and STEPS measured ones, and compare the plan with what
    /// libtorch's allocator counted, per category. On the config's CUDA device where there is
    /// one (`--device cuda`: the caching allocator's counts, and its peak reserve against the
    /// plan's total), else on this CPU over Gloo (small models).
    #[arg(long, value_name = "STEPS")]
    measure: Option<u64>,
    /// Print JSON (plan, measured, plan/measured per category) instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    overrides: ConfigOverrides,
}

/// The ranks of the run: `--nproc`, else dp × cp, else WORLD_SIZE, else cp.
fn world_of(cfg: &TrainConfig, nproc: Option<usize>) -> Result<u64> {
    Ok(match (nproc, cfg.dp, std::env::var("WORLD_SIZE").ok()) {
        (Some(n), _, _) => n,
        (None, dp, _) if dp > 0 => dp * cfg.cp.max(1),
        (None, _, Some(w)) => w.parse().context("WORLD_SIZE is not a number")?,
        _ => cfg.cp.max(1),
    } as u64)
}

/// `rsd-train --print-memory-plan [ARCH]`: the plan alone, as text.
pub fn print_plan(
    cfg: &TrainConfig,
    arch: Option<&Path>,
    nproc: Option<usize>,
    gpu_gib: u64,
) -> Result<()> {
    let input = memory_plan::input_for(cfg, arch, world_of(cfg, nproc)?, gpu_gib << 30)?;
    let plan = memory_plan::plan(&input);
    print!("{}", describe(cfg, &input, &plan));
    Ok(())
}

/// Refuses a CUDA training run whose plan does not fit its GPUs, naming the smallest change
/// that does. CPU runs are not checked (their memory is the machine's).
pub fn refuse_if_too_big(cfg: &TrainConfig, nproc: Option<usize>, gpu_gib: u64) -> Result<()> {
    if !cfg.device.starts_with("cuda") {
        return Ok(());
    }
    let input = memory_plan::input_for(cfg, None, world_of(cfg, nproc)?, gpu_gib << 30)?;
    let plan = memory_plan::plan(&input);
    if !plan.fits() {
        return Err(memory_plan::not_fitting(&input, &plan).into());
    }
    Ok(())
}

/// The plan as text, with the run's settings and the compute note.
fn describe(cfg: &TrainConfig, input: &PlanInput, plan: &MemoryPlan) -> String {
    let mut s = plan.to_string();
    s += &format!(
        "  (seq_len {}, micro_batch {}, dtype {}, objective {}, loss_chunk {}, grad_bucket_mb {})\n",
        input.seq_len,
        input.micro_batch,
        cfg.dtype,
        input.objective,
        input.loss_chunk,
        cfg.grad_bucket_mb
    );
    if input.objective.needs_perturbed() {
        let floor = prefix_reuse_floor(&input.model, input.seq_len as i64);
        s += &format!(
            "  compute: with prefix reuse the rsd step's FLOP floor is {floor:.2}× a standard \
             step (two whole views: 2×)\n"
        );
    }
    if !plan.fits() {
        s += &format!("  {}\n", memory_plan::not_fitting(input, plan));
    }
    s
}

/// Plan, measured and their ratio per category (`--json`).
#[derive(Serialize)]
struct Report {
    plan: MemoryPlan,
    #[serde(skip_serializing_if = "Option::is_none")]
    measured: Option<Measured>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ranks: Option<Vec<Measured>>,
    /// plan / measured per category, `peak` (the plan's peak without the runtime over the measured
    /// one) and on CUDA `peak_reserved` (the plan's total over the allocator's peak reserve).
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<serde_json::Map<String, serde_json::Value>>,
    seq_len: u64,
    dtype: String,
    objective: String,
}

/// The measured bytes of a category (the runtime has none on CPU).
fn measured_of(m: &Measured, c: Category) -> Option<u64> {
    Some(match c {
        Category::Weights => m.weights,
        Category::Gradients => m.gradients,
        Category::OptimizerState => m.optimizer_state,
        Category::SavedActivations => m.saved_activations,
        Category::Transient => m.transient,
        Category::Communication => m.communication,
        Category::OptimizerUpdate => m.optimizer_update,
        // Neither is measured: the held-out evaluation runs outside the measured step's marks,
        // and the runtime is not the allocator's.
        Category::Evaluation | Category::Runtime => return None,
    })
}

fn ratio(plan: u64, measured: u64) -> Option<f64> {
    (measured > 0).then(|| plan as f64 / measured as f64)
}

/// `rsd-train memory`.
pub fn run(a: MemoryArgs) -> Result<()> {
    let rank_dir = std::env::var_os(memory_run::DIR_ENV).filter(|_| a.measure.is_some());
    let launched = std::env::var_os("WORLD_SIZE").is_some();
    // Resolving the config and planning make no tensor: a rank of a measurement still counts
    // from its first tensor on.
    let cfg = TrainConfig::resolve(a.config.as_deref(), a.overrides.clone())?;
    let world = world_of(&cfg, a.ranks.nproc)?;
    let input = memory_plan::input_for(&cfg, a.arch.as_deref(), world, a.gpu_gib << 30)?;
    let plan = memory_plan::plan(&input);
    if let (Some(dir), true) = (&rank_dir, launched) {
        // One rank of a measurement the parent launched: run, leave the result, say nothing.
        let arch = memory_plan::arch_file(&cfg, a.arch.as_deref())?;
        let steps = a.measure.unwrap_or(1);
        let mcfg = measure_cfg(&cfg, &arch, &input, steps, Path::new(dir));
        start_counting(&mcfg)?;
        memory_run::run_rank(mcfg, Path::new(dir))?;
        return Ok(());
    }
    let mut report = Report {
        plan: plan.clone(),
        measured: None,
        ranks: None,
        ratio: None,
        seq_len: input.seq_len,
        dtype: cfg.dtype.clone(),
        objective: input.objective.to_string(),
    };
    if let Some(steps) = a.measure {
        if cfg.device.starts_with("cuda") && memory_run::measure_device(&cfg.device) == "cpu" {
            eprintln!("note: libtorch sees no CUDA device here: measuring on this CPU");
        }
        let ranks = measure_run(&cfg, &a, &input, world, steps)?;
        let worst = measure::worst(&ranks);
        let mut r = serde_json::Map::new();
        for c in Category::ALL {
            if let Some(m) = measured_of(&worst, c) {
                let v = ratio(plan.category(c), m).map_or(serde_json::Value::Null, |x| x.into());
                r.insert(c.name().into(), v);
            }
        }
        let peak = ratio(plan.peak_cpu, worst.peak).map_or(serde_json::Value::Null, |x| x.into());
        r.insert("peak".into(), peak);
        if worst.peak_reserved > 0 {
            let v = ratio(plan.total, worst.peak_reserved)
                .map_or(serde_json::Value::Null, |x| x.into());
            r.insert("peak_reserved".into(), v);
        }
        report.measured = Some(worst);
        report.ranks = Some(ranks);
        report.ratio = Some(r);
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", describe(&cfg, &input, &plan));
        if let Some(m) = &report.measured {
            print!("{}", table(&plan, m));
        }
    }
    if !plan.fits() {
        return Err(memory_plan::not_fitting(&input, &plan).into());
    }
    Ok(())
}

/// The plan against the measurement, per category and at the peak.
fn table(plan: &MemoryPlan, m: &Measured) -> String {
    let mib = |b: u64| format!("{:.2}", b as f64 / (1u64 << 20) as f64);
    let on_cpu = m.peak_reserved == 0;
    let place = if on_cpu {
        "this CPU".to_string()
    } else {
        m.device.clone()
    };
    let mut s = format!(
        "measured on {place} (largest rank), MiB:\n  {:<18} {:>10} {:>10} {:>7}\n",
        "category", "plan", "measured", "ratio"
    );
    let mut row = |name: &str, p: u64, mm: u64| {
        let r = ratio(p, mm).map_or("-".to_string(), |x| format!("{x:.3}"));
        s += &format!("  {:<18} {:>10} {:>10} {:>7}\n", name, mib(p), mib(mm), r);
    };
    for c in Category::ALL {
        if let Some(mm) = measured_of(m, c) {
            row(c.name(), plan.category(c), mm);
        }
    }
    row("peak", plan.peak_cpu, m.peak);
    if on_cpu {
        s += &format!(
            "  (peak resident set {} MiB: tensors plus what libtorch allocates outside its CPU \
             allocator, the binary and the loader)\n",
            mib(m.peak_rss)
        );
    } else {
        row("peak reserved", plan.total, m.peak_reserved);
        s += "  (peak reserved: the caching allocator's tensors and cache, against the plan's \
              total; the CUDA context and the libraries' workspaces come on top of it)\n";
    }
    s
}

/// The measurement's training config: the plan's layout over synthetic shards.
fn measure_cfg(
    cfg: &TrainConfig,
    arch: &Path,
    input: &PlanInput,
    steps: u64,
    dir: &Path,
) -> TrainConfig {
    let mut m = memory_run::measure_config(cfg, arch, input.seq_len, input.dp as usize, steps, dir);
    m.dp = input.dp as usize;
    m.cp = input.cp as usize;
    m
}

/// Starts counting the memory of the device this rank of `mcfg` trains on.
fn start_counting(mcfg: &TrainConfig) -> Result<()> {
    let device = rsd_train::train::rank_device(mcfg)?;
    if !measure::start(device) {
        bail!("the memory of {device:?} cannot be counted here (libtorch's allocator for it)");
    }
    Ok(())
}

/// Runs the measurement: in this process (one rank) or as `world` local ranks over Gloo.
fn measure_run(
    cfg: &TrainConfig,
    a: &MemoryArgs,
    input: &PlanInput,
    world: u64,
    steps: u64,
) -> Result<Vec<Measured>> {
    if steps == 0 {
        bail!("--measure 0: give the number of measured steps (≥ 1)");
    }
    let arch = memory_plan::arch_file(cfg, a.arch.as_deref())?;
    let dir = std::env::temp_dir().join(format!("rsd-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = (|| -> Result<Vec<Measured>> {
        let rows = (1 + steps) * input.dp * input.micro_batch + input.micro_batch;
        memory_run::write_shards(&dir, input.seq_len, rows, input.model.vocab_size as u64)?;
        if world == 1 {
            let mcfg = measure_cfg(cfg, &arch, input, steps, &dir);
            start_counting(&mcfg)?;
            return Ok(vec![memory_run::run_rank(mcfg, &dir)?]);
        }
        // The ranks run this same command line and find the data through the environment.
        std::env::set_var(memory_run::DIR_ENV, &dir);
        match crate::launch::run(world as usize)? {
            0 => {}
            code => bail!("the measurement's ranks failed (exit status {code})"),
        }
        Ok(memory_run::read_ranks(&dir, world as usize)?)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
