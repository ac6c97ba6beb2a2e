//! Opening the mixture: every source's shard set, checked against the first one.

use std::path::{Path, PathBuf};

use rsd_shard::{ShardSet, VerifyOptions};

use crate::error::{LoaderError, Result};

/// One shard directory and its mixture weight (weights are normalised over all sources).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Source {
    /// A shard directory written by `rsd-data pack`.
    pub dir: PathBuf,
    /// Relative share of the stream (any positive number).
    pub weight: f64,
}

impl Source {
    /// A source with a weight.
    pub fn new(dir: impl Into<PathBuf>, weight: f64) -> Source {
        Source {
            dir: dir.into(),
            weight,
        }
    }
}

/// An opened source.
pub(crate) struct OpenSource {
    pub set: ShardSet,
    /// Normalised weight (all sum to 1).
    pub weight: f64,
    pub samples: u64,
    pub mixed: bool,
    pub pad_id: i32,
    /// Tail padding (`--tail pad`, fixed mode): the last sample ends with this many pad tokens,
    /// which get no labels.
    pub tail_padding: u64,
}

/// Open every source, optionally verify it, and refuse mixtures whose manifests disagree.
pub(crate) fn open_all(sources: &[Source], verify: bool) -> Result<Vec<OpenSource>> {
    if sources.is_empty() {
        return Err(LoaderError::Config(
            "no sources: give at least one shard directory".into(),
        ));
    }
    let total: f64 = sources.iter().map(|s| s.weight).sum();
    for s in sources {
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err(LoaderError::Config(format!(
                "{}: weight {} must be a positive number",
                s.dir.display(),
                s.weight
            )));
        }
    }
    let mut out: Vec<OpenSource> = Vec::with_capacity(sources.len());
    for s in sources {
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
        out.push(OpenSource {
            weight: s.weight / total,
            samples: set.num_samples(),
            mixed: m.mode == "mixed",
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

/// A pipeline file: named sources with weights.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Pipeline {
    /// A human name.
    #[serde(default)]
    pub name: String,
    /// The sources; relative directories are resolved by the caller.
    pub sources: Vec<Source>,
}

impl Pipeline {
    /// Read a JSON pipeline file, resolving relative source dirs against `root`.
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
        for s in &mut p.sources {
            if s.dir.is_relative() {
                s.dir = root.join(&s.dir);
            }
        }
        Ok(p)
    }
}
