//! The loader's saved state: small, versioned, and independent of DP/CP sizes.

use std::path::Path;

use rsd_common::printable::shortened;
use rsd_common::safe_fs::read_regular;
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
        self.check_against(cfg, datasets)
            .map_err(LoaderError::Resume)
    }

    /// As [`LoaderState::position_for`], for a state read from `path`: errors name the file.
    pub(crate) fn position_from_file(
        &self,
        path: &Path,
        cfg: &LoaderConfig,
        datasets: &[OpenDataset],
    ) -> Result<Position> {
        self.check_against(cfg, datasets)
            .map_err(|what| LoaderError::ResumeFrom {
                path: path.to_path_buf(),
                what,
            })
    }

    /// What is wrong with the state on its own, naming the field: counters that no stream can
    /// reach. A state may come from a file anyone could have edited, and its counters feed the
    /// planner's arithmetic, so they are checked here (with checked sums) rather than trusted.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.version != STATE_VERSION {
            return Err(format!(
                "field version: state version {} but this build reads version {STATE_VERSION}",
                self.version
            ));
        }
        if self.drawn.len() != self.datasets.len() {
            return Err(format!(
                "field drawn: {} draw counts for {} sources",
                self.drawn.len(),
                self.datasets.len()
            ));
        }
        for (k, d) in self.datasets.iter().enumerate() {
            // `open_all` refuses empty datasets, and normalised weights lie in (0, 1].
            if d.samples == 0 {
                return Err(format!(
                    "field sources[{k}].samples: 0, but a source with no samples cannot be streamed"
                ));
            }
            if !(d.weight.is_finite() && d.weight > 0.0 && d.weight <= 1.0 + 1e-9) {
                return Err(format!(
                    "field sources[{k}].weight: {} is not a normalised weight (0 < w ≤ 1)",
                    d.weight
                ));
            }
        }
        let mut sum = 0u64;
        for (k, &d) in self.drawn.iter().enumerate() {
            sum = sum.checked_add(d).ok_or_else(|| {
                format!("field drawn[{k}]: the draw counts add up to more than 2^64")
            })?;
        }
        if sum != self.cursor {
            let drawn: Vec<String> = self.drawn.iter().map(u64::to_string).collect();
            return Err(format!(
                "field cursor: corrupt state: draws [{}] do not add up to cursor {}",
                drawn.join(", "),
                self.cursor
            ));
        }
        // Every step draws at least one sample (a step that draws none ends the stream).
        if self.step > self.cursor {
            return Err(format!(
                "field step: {} steps but only {} samples drawn (cursor); every step draws at \
                 least one",
                self.step, self.cursor
            ));
        }
        Ok(())
    }

    /// [`LoaderState::check`], then the checks against this config and data: the same seed,
    /// start epoch, shuffle, sources and weights, draw counts that the mixture's weights can
    /// produce, and epochs that fit in a u64.
    fn check_against(
        &self,
        cfg: &LoaderConfig,
        datasets: &[OpenDataset],
    ) -> std::result::Result<Position, String> {
        self.check()?;
        if self.seed != cfg.seed || self.epoch != cfg.epoch || self.shuffle != cfg.shuffle {
            return Err(format!(
                "the state is for seed {} epoch {} shuffle {}, the config says seed {} epoch {} shuffle {}",
                self.seed, self.epoch, self.shuffle, cfg.seed, cfg.epoch, cfg.shuffle
            ));
        }
        if self.datasets.len() != datasets.len() {
            return Err(format!(
                "the state has {} sources, the config {}",
                self.datasets.len(),
                datasets.len()
            ));
        }
        for (k, (saved, now)) in self.datasets.iter().zip(datasets).enumerate() {
            if saved.samples != now.samples {
                return Err(format!(
                    "source {k} ({}) had {} samples when saved, {} now has {}",
                    shortened(&saved.dir),
                    saved.samples,
                    now.set.dir().display(),
                    now.samples
                ));
            }
            if (saved.weight - now.weight).abs() > 1e-9 {
                return Err(format!(
                    "source {k} ({}) had weight {}, now {}",
                    shortened(&saved.dir),
                    saved.weight,
                    now.weight
                ));
            }
        }
        let cursor = self.cursor as f64;
        // Slack for the round-robin's lag behind a source's share (at most about one draw;
        // 1.2 measured over random mixtures of up to 12 sources) and for rounding.
        let slack = datasets.len() as f64 + 1.0 + cursor * 1e-12;
        for (k, (&drawn, now)) in self.drawn.iter().zip(datasets).enumerate() {
            // The planner draws from the source furthest behind its share, so every count
            // stays within a draw or so of `weight · cursor`: anything else was edited.
            let share = now.weight * cursor;
            if (drawn as f64 - share).abs() > slack {
                return Err(format!(
                    "field drawn[{k}]: {drawn} draws from source {k}, but weight {} over {} draws \
                     gives about {share:.0}: the state was not written by this mixture",
                    now.weight, self.cursor
                ));
            }
            // The epoch the next draw of this source falls in must be a u64.
            if cfg.epoch.checked_add(drawn / now.samples).is_none() {
                return Err(format!(
                    "field drawn[{k}]: {drawn} draws of {} samples from start epoch {} is an \
                     epoch beyond 2^64",
                    now.samples, cfg.epoch
                ));
            }
        }
        Ok(Position {
            step: self.step,
            cursor: self.cursor,
            drawn: self.drawn.clone(),
        })
    }

    /// The most bytes a state file may have: a state is a few hundred bytes per source, so this
    /// allows tens of thousands of sources and no more memory than that.
    pub const MAX_FILE_BYTES: u64 = 16 << 20;

    /// Read a state saved as JSON: a regular file of at most [`LoaderState::MAX_FILE_BYTES`],
    /// whose counters pass [`LoaderState::check`]. Errors name the file (and the field).
    pub fn read(path: &Path) -> Result<LoaderState> {
        let bytes = read_regular(path, Self::MAX_FILE_BYTES, "loader state")?;
        let state: LoaderState = serde_json::from_slice(&bytes).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            // serde_json quotes the offending value, which a hostile file makes any length.
            what: format!(
                "not a loader state (line {} column {}): {}",
                e.line(),
                e.column(),
                shortened(&e.to_string())
            ),
        })?;
        state.check().map_err(|what| LoaderError::File {
            path: path.to_path_buf(),
            what,
        })?;
        Ok(state)
    }

    /// Write the state as JSON (atomically: temporary file, then rename).
    pub fn write(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        rsd_common::safe_fs::write_file_atomic(path, text.as_bytes())?;
        Ok(())
    }
}
