//! Opening the mixture: every dataset's shard set, checked against the first one.

use std::path::{Path, PathBuf};

use rsd_common::safe_fs::read_regular;
use rsd_shard::{PackMode, ShardSet, VerifyOptions};

use crate::error::{LoaderError, Result};
use crate::pages::PageRelease;

/// One entry of the mixture: a shard directory and its weight (weights are normalised over all
/// datasets).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Dataset {
    /// A shard directory written by `rsd-data pack`.
    pub dir: PathBuf,
    /// Relative share of the stream (any positive number).
    pub weight: f64,
}

impl Dataset {
    /// A dataset with a weight.
    pub fn new(dir: impl Into<PathBuf>, weight: f64) -> Dataset {
        Dataset {
            dir: dir.into(),
            weight,
        }
    }
}

/// An opened dataset.
pub(crate) struct OpenDataset {
    pub set: ShardSet,
    /// What has been released of `set`'s mapped pages (`ReadMethod::Map`).
    pub pages: PageRelease,
    /// Normalised weight (all sum to 1).
    pub weight: f64,
    pub samples: u64,
    pub mixed: bool,
    pub pad_id: i32,
    /// Tail padding (`--tail pad`, fixed mode): the last sample ends with this many pad tokens,
    /// which get no labels.
    pub tail_padding: u64,
}

/// The longest directory name a pipeline may give (Linux's PATH_MAX).
const MAX_DIR_BYTES: usize = 4096;

/// Open every dataset, optionally verify it, and refuse mixtures whose manifests disagree.
pub(crate) fn open_all(datasets: &[Dataset], verify: bool) -> Result<Vec<OpenDataset>> {
    if datasets.is_empty() {
        return Err(LoaderError::Config(
            "no sources: give at least one shard directory".into(),
        ));
    }
    let total: f64 = datasets.iter().map(|s| s.weight).sum();
    for s in datasets {
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err(LoaderError::Config(format!(
                "{}: weight {} must be a positive number",
                s.dir.display(),
                s.weight
            )));
        }
    }
    // Weights are normalised by their sum: an infinite sum would make every weight 0.
    if !total.is_finite() {
        return Err(LoaderError::Config(
            "the weights add up to more than a float can hold".into(),
        ));
    }
    let mut out: Vec<OpenDataset> = Vec::with_capacity(datasets.len());
    for s in datasets {
        if verify {
            rsd_shard::verify(
                &s.dir,
                VerifyOptions {
                    checksums: true,
                    token_range: false,
                },
            )?;
        }
        let set = ShardSet::open(&s.dir)?;
        if let Some(first) = out.first() {
            check_compatible(&first.set, &set)?;
        }
        let m = set.manifest();
        if set.num_samples() == 0 {
            return Err(LoaderError::Config(format!(
                "{}: the shard directory holds no samples",
                s.dir.display()
            )));
        }
        let pad = m.pad_id.or(m.tokenizer.eos_id).unwrap_or(0);
        out.push(OpenDataset {
            pages: PageRelease::new(&set),
            weight: s.weight / total,
            samples: set.num_samples(),
            mixed: m.mode == PackMode::Mixed,
            pad_id: i32::try_from(pad).unwrap_or(0),
            tail_padding: m.totals.padding_tokens,
            set,
        });
    }
    Ok(out)
}

fn check_compatible(a: &ShardSet, b: &ShardSet) -> Result<()> {
    let (ma, mb) = (a.manifest(), b.manifest());
    let what = if ma.tokenizer.sha256 != mb.tokenizer.sha256 {
        Some(format!(
            "different tokenizers: {} (sha256 {}) vs {} (sha256 {})",
            ma.tokenizer.name, ma.tokenizer.sha256, mb.tokenizer.name, mb.tokenizer.sha256
        ))
    } else if ma.tokenizer.vocab_size != mb.tokenizer.vocab_size {
        Some(format!(
            "vocabulary sizes {} vs {}",
            ma.tokenizer.vocab_size, mb.tokenizer.vocab_size
        ))
    } else if ma.dtype != mb.dtype {
        Some(format!(
            "token dtypes {} vs {}",
            ma.dtype.name(),
            mb.dtype.name()
        ))
    } else if ma.seq_len != mb.seq_len {
        Some(format!("packing lengths {} vs {}", ma.seq_len, mb.seq_len))
    } else {
        None
    };
    match what {
        Some(what) => Err(LoaderError::Mismatch {
            a: a.dir().to_path_buf(),
            b: b.dir().to_path_buf(),
            what,
        }),
        None => Ok(()),
    }
}

/// Sample `global` of a set: (shard, index in shard).
pub(crate) fn locate(set: &ShardSet, global: u64) -> Result<(usize, usize)> {
    Ok(set.locate(global)?)
}

/// A pipeline file (`pipelines/*.json`): a named mixture of datasets.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Pipeline {
    /// A human name.
    #[serde(default)]
    pub name: String,
    /// The datasets and their weights (`sources` in files written before the rename).
    #[serde(alias = "sources")]
    pub datasets: Vec<Dataset>,
}

impl Pipeline {
    /// The most bytes a pipeline file may have: an entry is a directory and a weight, so this
    /// allows tens of thousands of datasets and no more memory than that.
    pub const MAX_FILE_BYTES: u64 = 16 << 20;

    /// Read a JSON pipeline file, resolving relative dataset dirs against `root`. The file must
    /// be a regular file of at most [`Pipeline::MAX_FILE_BYTES`]; its weights must be positive
    /// numbers with a finite sum. Errors name the file, and the field where there is one.
    ///
    /// The directories a pipeline names are opened as written (the user chose the pipeline, as
    /// they would choose directories on the command line); the shard files inside each are
    /// confined to it by `rsd-shard`.
    pub fn read(path: &Path, root: &Path) -> Result<Pipeline> {
        let bytes = read_regular(path, Self::MAX_FILE_BYTES, "pipeline file")?;
        let file_error = |what: String| LoaderError::File {
            path: path.to_path_buf(),
            what,
        };
        let mut p: Pipeline = serde_json::from_slice(&bytes).map_err(|e| {
            // serde_json quotes the offending value, which a hostile file makes any length.
            file_error(format!(
                "not a pipeline file (line {} column {}): {}",
                e.line(),
                e.column(),
                rsd_common::printable::shortened(&e.to_string())
            ))
        })?;
        if p.datasets.is_empty() {
            return Err(file_error(
                "field datasets: no datasets: name at least one shard directory".into(),
            ));
        }
        let mut total = 0.0f64;
        for (k, s) in p.datasets.iter().enumerate() {
            if s.dir.as_os_str().is_empty() {
                return Err(file_error(format!(
                    "field datasets[{k}].dir: empty, expected a shard directory"
                )));
            }
            // Longer than any path the system opens (PATH_MAX): refused here, where the error can
            // quote it cut short, not by the open, whose error would quote all of it.
            let dir = s.dir.to_string_lossy();
            if dir.len() > MAX_DIR_BYTES {
                return Err(file_error(format!(
                    "field datasets[{k}].dir: \"{}\" is {} bytes, longer than a path can be \
                     ({MAX_DIR_BYTES})",
                    rsd_common::printable::shortened(&dir),
                    dir.len()
                )));
            }
            if !(s.weight.is_finite() && s.weight > 0.0) {
                return Err(file_error(format!(
                    "field datasets[{k}].weight: {} must be a positive number",
                    s.weight
                )));
            }
            total += s.weight;
        }
        // Weights are normalised by their sum: an infinite sum would make every weight 0.
        if !total.is_finite() {
            return Err(file_error(
                "field datasets: the weights add up to more than a float can hold".into(),
            ));
        }
        for s in &mut p.datasets {
            if s.dir.is_relative() {
                s.dir = root.join(&s.dir);
            }
        }
        Ok(p)
    }
}
