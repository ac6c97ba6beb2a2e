//! The loader's saved state: small, versioned, and independent of DP/CP sizes.

use serde::{Deserialize, Serialize};

use crate::datasets::OpenDataset;
use crate::error::{LoaderError, Result};
use crate::plan::Position;
use crate::LoaderConfig;

/// The [`LoaderState::version`] this build writes and reads.
pub const STATE_VERSION: u32 = 1;

/// Enough to continue a stream exactly, on any DP/CP layout (see docs/LOADER.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoaderState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Shuffle seed.
    pub seed: u64,
    /// Starting epoch of the stream.
    pub epoch: u64,
    /// Whether samples were shuffled.
    pub shuffle: bool,
    /// Global steps completed.
    pub step: u64,
    /// Samples of the global stream consumed (over all DP ranks).
    pub cursor: u64,
    /// Draws from each dataset since the start of the stream.
    pub drawn: Vec<u64>,
    /// The datasets as they were, to refuse resuming on other data (saved as `sources`).
    #[serde(rename = "sources")]
    pub datasets: Vec<DatasetState>,
}

/// A dataset as recorded in a state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DatasetState {
    /// Directory (informational: data may move).
    pub dir: String,
    /// Samples in the directory (must match).
    pub samples: u64,
    /// Normalised weight (must match).
    pub weight: f64,
}

impl LoaderState {
    pub(crate) fn new(cfg: &LoaderConfig, datasets: &[OpenDataset], pos: &Position) -> LoaderState {
        LoaderState {
            version: STATE_VERSION,
            seed: cfg.seed,
            epoch: cfg.epoch,
            shuffle: cfg.shuffle,
            step: pos.step,
            cursor: pos.cursor,
            drawn: pos.drawn.clone(),
            datasets: datasets
                .iter()
                .map(|s| DatasetState {
                    dir: s.set.dir().display().to_string(),
                    samples: s.samples,
                    weight: s.weight,
                })
                .collect(),
        }
    }

    /// The stream position, after checking that the state belongs to this config and data.
    pub(crate) fn position_for(
        &self,
        cfg: &LoaderConfig,
        datasets: &[OpenDataset],
    ) -> Result<Position> {
        let bad = |s: String| Err(LoaderError::Resume(s));
        if self.version != STATE_VERSION {
            return bad(format!(
                "state version {} but this build reads version {STATE_VERSION}",
                self.version
            ));
        }
        if self.seed != cfg.seed || self.epoch != cfg.epoch || self.shuffle != cfg.shuffle {
            return bad(format!(
                "the state is for seed {} epoch {} shuffle {}, the config says seed {} epoch {} shuffle {}",
                self.seed, self.epoch, self.shuffle, cfg.seed, cfg.epoch, cfg.shuffle
            ));
        }
        if self.datasets.len() != datasets.len() || self.drawn.len() != datasets.len() {
            return bad(format!(
                "the state has {} sources, the config {}",
                self.datasets.len(),
                datasets.len()
            ));
        }
        for (k, (saved, now)) in self.datasets.iter().zip(datasets).enumerate() {
            if saved.samples != now.samples {
                return bad(format!(
                    "source {k} ({}) had {} samples when saved, {} now has {}",
                    saved.dir,
                    saved.samples,
                    now.set.dir().display(),
                    now.samples
                ));
            }
            if (saved.weight - now.weight).abs() > 1e-9 {
                return bad(format!(
                    "source {k} ({}) had weight {}, now {}",
                    saved.dir, saved.weight, now.weight
                ));
            }
        }
        if self.drawn.iter().sum::<u64>() != self.cursor {
            let drawn: Vec<String> = self.drawn.iter().map(u64::to_string).collect();
            return bad(format!(
                "corrupt state: draws [{}] do not add up to cursor {}",
                drawn.join(", "),
                self.cursor
            ));
        }
        Ok(Position {
            step: self.step,
            cursor: self.cursor,
            drawn: self.drawn.clone(),
        })
    }

    /// Read a state saved as JSON.
    pub fn read(path: &std::path::Path) -> Result<LoaderState> {
        let text = std::fs::read_to_string(path).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        serde_json::from_str(&text).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            what: format!("not a loader state: {e}"),
        })
    }

    /// Write the state as JSON (atomically: temporary file, then rename).
    pub fn write(&self, path: &std::path::Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        rsd_shard::write_file_atomic(path, text.as_bytes())?;
        Ok(())
    }
}
