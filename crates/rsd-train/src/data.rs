//! Loader batches → micro-batches on the device.
//!
//! The loader (`rsd-loader`, docs/LOADER.md) hands out flat varlen arrays; the step wants `[B, L]`
//! tensors plus host-side positions and document boundaries. Consecutive rows of equal length form
//! one micro-batch (fixed-mode shards: the whole batch); mixed-mode rows of different lengths
//! become separate micro-batches. With `doc_mask` (the default; ProLong's recipe) the shards'
//! document boundaries are passed on, for fixed and mixed shards alike: attention is
//! document-masked and the first token of each document is not predicted (the loader's
//! `mask_doc_boundaries`). Without it rows attend across documents, as plain packed pretraining.
use rsd_loader::{Batch, Batching, Dataset, Loader, LoaderConfig, Parallel, Positions};

use crate::config::TrainConfig;
use crate::step::{MicroBatch, Objective};
use crate::{Error, Result};

/// The loader config a training config implies for this rank's data- and context-parallel
/// coordinates.
pub fn loader_config(cfg: &TrainConfig, parallel: Parallel) -> Result<LoaderConfig> {
    let dirs: Vec<&str> = cfg
        .shards
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    if dirs.is_empty() {
        return Err(Error::Input(
            "config key shards: no shard directory given".into(),
        ));
    }
    let weights: Vec<f64> = if cfg.weights.trim().is_empty() {
        vec![1.0 / dirs.len() as f64; dirs.len()]
    } else {
        cfg.weights
            .split(',')
            .map(|w| w.trim().parse::<f64>())
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| {
                Error::Input(format!(
                    "config key weights: \"{}\": expected comma-separated numbers",
                    cfg.weights
                ))
            })?
    };
    if weights.len() != dirs.len() {
        return Err(Error::Input(format!(
            "config key weights: {} weights for {} shard directories",
            weights.len(),
            dirs.len()
        )));
    }
    Ok(LoaderConfig {
        datasets: dirs
            .iter()
            .zip(&weights)
            .map(|(d, &w)| Dataset::new(*d, w))
            .collect(),
        seed: cfg.seed,
        batching: Batching::Samples(cfg.micro_batch),
        // Fixed shards keep row positions with document masking, as ProLong (RoPE is relative:
        // within a document they equal per-document positions up to a constant); mixed shards
        // restart them per document. Without document masking positions run along the row.
        positions: if cfg.doc_mask {
            Positions::Auto
        } else {
            Positions::Row
        },
        mask_doc_boundaries: Some(cfg.doc_mask),
        workers: cfg.loader_workers,
        prefetch: 2 * cfg.loader_workers.max(1),
        parallel,
        ..LoaderConfig::default()
    })
}

/// Guards the model's embedding against the data: fails when a dataset's tokenizer has more ids
/// than the model's vocabulary (shards of another tokenizer), then makes `loader` fail any batch
/// holding an id outside it (a damaged shard), naming shard, sample and token. An id beyond the
/// embedding would otherwise stop the run inside libtorch ("index out of range in self"), or on a
/// GPU as a device-side assert that leaves the CUDA context unusable. A model vocabulary larger
/// than the tokenizer's is normal (padded embeddings).
pub fn guard_vocabulary(loader: &mut Loader, model_vocab: i64) -> Result<()> {
    let model_vocab = u64::try_from(model_vocab).unwrap_or(0);
    for (k, ds) in loader.config().datasets.iter().enumerate() {
        let Some(m) = loader.manifest(k) else {
            continue;
        };
        if m.tokenizer.vocab_size > model_vocab {
            return Err(Error::Input(format!(
                "{}: the shards' tokenizer {} has {} ids, more than the model's vocabulary of \
                 {model_vocab}: these shards were packed for another model (pack them with this \
                 model's tokenizer.json)",
                ds.dir.display(),
                m.tokenizer.name,
                m.tokenizer.vocab_size
            )));
        }
    }
    loader.reject_ids_outside(model_vocab);
    Ok(())
}

/// The SFT objectives train on the tokens the shards' loss mask marks: every dataset must have
/// one (chat data packed with `rsd-data pack --chat`), or the run would train on prompts and
/// system messages as well. Other objectives take masked shards as they are (the mask applies).
pub fn check_loss_mask(loader: &Loader, objective: Objective) -> Result<()> {
    if !objective.needs_loss_mask() {
        return Ok(());
    }
    for (k, ds) in loader.config().datasets.iter().enumerate() {
        if loader.manifest(k).is_some_and(|m| m.loss_mask.is_none()) {
            return Err(Error::Input(format!(
                "objective {objective} trains on the assistant tokens of chat data, and {} has no \
                 loss mask: pack conversations with `rsd-data pack --chat` (or train it with \
                 objective standard)",
                ds.dir.display()
            )));
        }
    }
    Ok(())
}

/// Splits a loader batch into micro-batches of equal-length rows, each with the index of its
/// first row in the batch.
///
/// With `doc_mask` the rows' document boundaries go with them (document-masked attention). With
/// context parallelism (`context_parallel`) each row holds this rank's chunks, and the document
/// boundaries given are the whole row's (what the attention of the chunks needs).
pub fn micro_batches(
    batch: &Batch,
    doc_mask: bool,
    context_parallel: bool,
    device: tch::Device,
) -> Result<Vec<(usize, MicroBatch)>> {
    let ro = &batch.row_offsets;
    if ro.len() < 2 || *ro.last().unwrap_or(&0) as usize != batch.tokens.len() {
        return Err(Error::Input(format!(
            "loader batch at step {} has inconsistent row offsets",
            batch.step
        )));
    }
    let mut out = Vec::new();
    let mut r = 0;
    let rows = ro.len() - 1;
    while r < rows {
        let len = ro[r + 1] - ro[r];
        let mut e = r + 1;
        while e < rows && ro[e + 1] - ro[e] == len {
            e += 1;
        }
        let mut toks = Vec::new();
        let mut labels = Vec::new();
        let mut pos = Vec::new();
        let mut doc_bounds = Vec::new();
        let mut real = Vec::new();
        for k in r..e {
            let (a, b) = (ro[k] as usize, ro[k + 1] as usize);
            // Document offsets are in whole-row coordinates.
            let fro = &batch.full_row_offsets;
            let (da, db) = if context_parallel && fro.len() == ro.len() {
                (fro[k] as usize, fro[k + 1] as usize)
            } else {
                (a, b)
            };
            let widen = |v: &[i32]| v.iter().map(|&x| x as i64).collect::<Vec<i64>>();
            toks.push(widen(&batch.tokens[a..b]));
            labels.push(widen(&batch.labels[a..b]));
            pos.push(widen(&batch.position_ids[a..b]));
            let mut d: Vec<i64> = batch
                .doc_offsets
                .iter()
                .filter(|&&o| o as usize >= da && o as usize <= db)
                .map(|&o| o as i64 - da as i64)
                .collect();
            if d.first() != Some(&0) {
                d.insert(0, 0);
            }
            if d.last() != Some(&((db - da) as i64)) {
                d.push((db - da) as i64);
            }
            doc_bounds.push(d);
            // Whole-row coordinates: the pack's tail padding ends the stored row, CP padding
            // follows it.
            real.push(batch.row_meta.get(k).map_or((db - da) as i64, |m| {
                i64::from(m.len) - i64::from(m.tail_pad)
            }));
        }
        out.push((
            r,
            MicroBatch::from_rows(&toks, &labels, pos, doc_mask.then_some(doc_bounds), device)?
                .with_real_len(real)?,
        ));
        r = e;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsd_loader::synth::{self, SynthSpec};

    /// Fixed shards of 8 samples of 16 tokens from a 1,000-id vocabulary.
    fn synth_shards() -> (tempfile::TempDir, SynthSpec) {
        let dir = tempfile::tempdir().expect("tempdir");
        let spec = SynthSpec {
            samples: 8,
            seq_len: 16,
            vocab: 1000,
            ..SynthSpec::default()
        };
        synth::write(dir.path(), &spec).expect("shards");
        (dir, spec)
    }

    #[test]
    fn guard_vocabulary_refuses_a_larger_tokenizer_and_checks_every_batch() {
        let (dir, _) = synth_shards();
        let cfg = TrainConfig {
            shards: dir.path().display().to_string(),
            ..TrainConfig::default()
        };
        let open =
            || Loader::new(loader_config(&cfg, Parallel::default()).expect("cfg")).expect("open");
        let e = guard_vocabulary(&mut open(), 999).expect_err("larger tokenizer");
        assert!(e
            .to_string()
            .contains("has 1000 ids, more than the model's vocabulary of 999"));
        // A padded embedding is fine, and every id passes the per-batch check.
        let mut loader = open();
        guard_vocabulary(&mut loader, 1024).expect("padded vocabulary");
        // The trainer's stream is endless: two epochs' worth.
        let batches: Vec<_> = loader
            .take(16)
            .collect::<std::result::Result<_, _>>()
            .expect("batches");
        assert_eq!(batches.len(), 16);
    }

    /// Fixed shards record their documents: with `doc_mask` (the default) the micro-batch
    /// carries them, the token before each document start has no label and positions run along
    /// the row (ProLong); with `doc_mask = false` none of it.
    #[test]
    fn fixed_shards_are_document_masked_unless_turned_off() {
        let (dir, spec) = synth_shards();
        let ignore = i64::from(rsd_loader::IGNORE_INDEX);
        for doc_mask in [true, false] {
            let cfg = TrainConfig {
                shards: dir.path().display().to_string(),
                micro_batch: 8,
                doc_mask,
                ..TrainConfig::default()
            };
            let mut loader =
                Loader::new(loader_config(&cfg, Parallel::default()).expect("cfg")).expect("open");
            let batch = loader.next().expect("a batch").expect("batch");
            let mbs = micro_batches(&batch, cfg.doc_mask, false, tch::Device::Cpu).expect("mbs");
            assert_eq!(mbs.len(), 1);
            let mb = &mbs[0].1;
            assert_eq!(mb.real_len, vec![16; 8]);
            let labels = Vec::<Vec<i64>>::try_from(&mb.labels).expect("labels");
            let mut boundaries = 0;
            for (r, s) in batch.samples.iter().enumerate() {
                let (_, pieces) = synth::shape(&spec, s.global);
                let mut cu = vec![0i64];
                for p in pieces {
                    cu.push(cu[cu.len() - 1] + i64::from(p));
                }
                assert_eq!(mb.positions[r], (0..16).collect::<Vec<i64>>());
                for &start in &cu[1..cu.len() - 1] {
                    boundaries += 1;
                    let masked = labels[r][start as usize - 1] == ignore;
                    assert_eq!(masked, doc_mask, "row {r}, document start {start}");
                }
                match &mb.doc_bounds {
                    Some(d) => assert_eq!(d[r], cu),
                    None => assert!(!doc_mask),
                }
            }
            assert!(
                boundaries > 0,
                "the synthetic samples hold several documents"
            );
        }
    }
}
