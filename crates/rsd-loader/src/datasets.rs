//! Opening the mixture: every dataset's shard set, checked against the first one.

use std::path::{Path, PathBuf};

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
    /// Read a JSON pipeline file, resolving relative dataset dirs against `root`.
    pub fn read(path: &Path, root: &Path) -> Result<Pipeline> {
        let text = std::fs::read_to_string(path).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            what: e.to_string(),
        })?;
        let mut p: Pipeline = serde_json::from_str(&text).map_err(|e| LoaderError::File {
            path: path.to_path_buf(),
            what: format!(
                "not a pipeline file (line {} column {}): {e}",
                e.line(),
                e.column()
            ),
        })?;
        for s in &mut p.datasets {
            if s.dir.is_relative() {
                s.dir = root.join(&s.dir);
            }
        }
        Ok(p)
    }
}
