//! Running a memory measurement (`rsd-train memory --measure`): the config it runs, its synthetic
//! shards, one rank's run with the phase marks of [`crate::memory_measure`] on, and the ranks'
//! results read back.
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use crate::config::TrainConfig;
use crate::memory_measure::{categorize, marks, marks_device, Measured};
use crate::{Error, Result};

/// Where a measurement's ranks find its data and leave their results (the environment variable
/// the parent sets before launching the ranks).
pub const DIR_ENV: &str = "RSD_MEMORY_MEASURE_DIR";

/// The config a measurement runs: `cfg` on its CUDA device (on the CPU where the config names
/// none, or libtorch sees no CUDA device) over synthetic shards of its sequence length in
/// `dir`, randomly initialised from `arch`, `1 + steps` optimizer steps of one micro-batch per
/// rank, every perturbed view at its largest (split after the first token), nothing saved.
pub fn measure_config(
    cfg: &TrainConfig,
    arch: &Path,
    seq_len: u64,
    dp: usize,
    steps: u64,
    dir: &Path,
) -> TrainConfig {
    TrainConfig {
        shards: dir.join("shards").display().to_string(),
        weights: String::new(),
        model: None,
        init: Some(arch.display().to_string()),
        out: dir.join("run").display().to_string(),
        device: measure_device(&cfg.device),
        allow_tokenizer_mismatch: true,
        steps: 1 + steps,
        save_every: 0,
        stop_at: 0,
        progress: false,
        heldout_every: 0,
        tokens_per_step: dp as u64 * cfg.micro_batch as u64 * seq_len,
        // A skip after the first token: the perturbed view computes every row but the first,
        // the largest it gets (a split at 0 shifts every position: no shared prefix at all).
        fixed_split: if cfg.fixed_split.trim().is_empty() {
            "1,1".into()
        } else {
            cfg.fixed_split.clone()
        },
        ..cfg.clone()
    }
}

/// The device a measurement of a config with `device` runs on: that CUDA device where libtorch
/// sees CUDA, the CPU otherwise.
pub fn measure_device(device: &str) -> String {
    if device.starts_with("cuda") && tch::Cuda::is_available() {
        device.to_string()
    } else {
        "cpu".into()
    }
}

/// Writes the synthetic shards a measurement trains on: enough `seq_len`-token rows for every
/// step, tokens below `vocab`.
pub fn write_shards(dir: &Path, seq_len: u64, rows: u64, vocab: u64) -> Result<()> {
    let spec = rsd_loader::synth::SynthSpec {
        samples: rows.max(1),
        seq_len: seq_len as u32,
        mixed: false,
        vocab: vocab.clamp(2, 65_536),
        ..Default::default()
    };
    rsd_loader::synth::write(&dir.join("shards"), &spec)?;
    Ok(())
}

/// Runs this rank's steps of `cfg` (a [`measure_config`]) with the marks on, and writes what it
/// measured to `dir/rank-K.json`. The counting allocator must be installed
/// ([`crate::memory_measure::start`]) before.
pub fn run_rank(cfg: TrainConfig, dir: &Path) -> Result<Measured> {
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let rank = std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    {
        let mut trainer = crate::train::Trainer::new(cfg, crate::train::Start::default())?;
        trainer.run(stop)?;
    }
    let marks = marks();
    let mut m = categorize(&marks).ok_or_else(|| {
        Error::Input(format!(
            "memory measurement: the run left {} marks, not a model, an optimizer and two steps",
            marks.len()
        ))
    })?;
    m.rank = rank;
    m.device = marks_device();
    m.peak_rss = rsd_common::mem::Memory::now().peak_rss;
    let file = rank_file(dir, rank);
    let text = serde_json::to_string(&m).map_err(|e| Error::Input(e.to_string()))?;
    rsd_common::safe_fs::write_file_atomic(&file, text.as_bytes())?;
    Ok(m)
}

fn rank_file(dir: &Path, rank: usize) -> PathBuf {
    dir.join(format!("rank-{rank}.json"))
}

/// Every rank's measurement, rank order.
pub fn read_ranks(dir: &Path, world: usize) -> Result<Vec<Measured>> {
    (0..world)
        .map(|r| {
            let file = rank_file(dir, r);
            let text = rsd_common::safe_fs::read_text(&file, 64 << 20, "memory measurement")?;
            serde_json::from_str(&text)
                .map_err(|e| Error::Input(format!("{}: {e}", file.display())))
        })
        .collect()
}
