//! Run checkpoints: atomic directories, the newest `keep` kept.
//!
//! ```text
//! <out>/checkpoints/step-00000040/
//!     model/                 HF directory (config.json + safetensors), loadable by transformers
//!     optimizer.safetensors  AdamW moments (+ fp32 master weights for bf16 models)
//!     state.json             step, tokens, loader state, RNG key, schedule, counters (versioned)
//!     config.toml            the resolved training config
//! ```
//!
//! Everything is written into `.step-N.tmp-<pid>` next to the target and renamed into place only
//! when complete (after an fsync of every file), so a `step-*` directory is always whole: a crash
//! or a non-finite step never leaves a half-written or bad checkpoint in place of the last good one.
//! Older checkpoints are removed only after the new one is in place.
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use rsd_loader::LoaderState;
use rsd_model::{Model, SaveOptions};

use crate::config::TrainConfig;
use crate::optim::{AdamW, Schedule};
use crate::{io_err, Error, Result};

/// Version of [`TrainState`].
pub const STATE_VERSION: u32 = 1;

/// Everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// Tokens consumed so far.
    pub tokens: u64,
    /// The loader's position after the last batch used.
    pub loader: LoaderState,
    /// RNG: perturbations of step k are drawn from a generator keyed by (seed, k, row), so the
    /// seed is the whole state.
    pub rng_seed: u64,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// Steps skipped for non-finite values so far.
    pub skipped: u64,
    /// Wall time spent so far, seconds.
    pub elapsed_s: f64,
}

/// The checkpoint directory of `step` under `out`.
pub fn dir_for(out: &Path, step: u64) -> PathBuf {
    out.join("checkpoints").join(format!("step-{step:08}"))
}

/// Complete checkpoints under `out`, oldest first.
pub fn list(out: &Path) -> Vec<(u64, PathBuf)> {
    let mut v: Vec<(u64, PathBuf)> = fs::read_dir(out.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    v.sort();
    v
}

fn fsync_tree(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir).map_err(io_err(dir))? {
        let p = e.map_err(io_err(dir))?.path();
        if p.is_dir() {
            fsync_tree(&p)?;
        } else {
            fs::File::open(&p)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&p))?;
        }
    }
    Ok(())
}

/// Writes a checkpoint atomically and prunes to the newest `keep`; its model directory gets the
/// tokenizer files of `tokenizer` (a directory), if given.
pub fn save(
    out: &Path,
    model: &Model,
    opt: &AdamW,
    state: &TrainState,
    cfg: &TrainConfig,
    keep: usize,
    tokenizer: Option<&Path>,
) -> Result<PathBuf> {
    let target = dir_for(out, state.step);
    let parent = target.parent().unwrap_or(out).to_path_buf();
    fs::create_dir_all(&parent).map_err(io_err(&parent))?;
    let tmp = parent.join(format!(
        ".step-{:08}.tmp-{}",
        state.step,
        std::process::id()
    ));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
    }
    fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
    let model_opts = SaveOptions {
        tokenizer_from: tokenizer.map(Path::to_path_buf),
        ..SaveOptions::default()
    };
    model.save(&tmp.join("model"), &model_opts)?;
    opt.save(&tmp.join("optimizer.safetensors"))?;
    let json = serde_json::to_string_pretty(state).map_err(|e| Error::Input(e.to_string()))?;
    let sp = tmp.join("state.json");
    fs::write(&sp, json).map_err(io_err(&sp))?;
    let cp = tmp.join("config.toml");
    fs::write(&cp, cfg.to_toml()).map_err(io_err(&cp))?;
    fsync_tree(&tmp)?;
    if target.exists() {
        fs::remove_dir_all(&target).map_err(io_err(&target))?;
    }
    fs::rename(&tmp, &target).map_err(io_err(&target))?;
    if let Ok(d) = fs::File::open(&parent) {
        let _ = d.sync_all();
    }
    let all = list(out);
    if all.len() > keep.max(1) {
        for (_, p) in &all[..all.len() - keep.max(1)] {
            fs::remove_dir_all(p).map_err(io_err(p))?;
        }
    }
    Ok(target)
}

/// Reads `state.json` of a checkpoint directory.
pub fn read_state(dir: &Path) -> Result<TrainState> {
    let p = dir.join("state.json");
    let text = fs::read_to_string(&p).map_err(io_err(&p))?;
    let st: TrainState = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    if st.version != STATE_VERSION {
        return Err(Error::Checkpoint {
            path: p,
            reason: format!(
                "state version {} (this build reads {STATE_VERSION})",
                st.version
            ),
        });
    }
    Ok(st)
}
