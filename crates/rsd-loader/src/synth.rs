//! Synthetic shard directories for tests and benchmarks: real files in the real format, with token
//! ids computed from (sample, position), so billion-token datasets are written without a tokenizer.

use std::path::Path;

use rsd_common::rng::mix;
use rsd_shard::{
    Manifest, PackMode, ShardSetWriter, TokenDtype, TokenizerInfo, Totals, FORMAT_NAME,
    FORMAT_VERSION,
};

use crate::error::Result;

/// What to write.
#[derive(Debug, Clone)]
pub struct SynthSpec {
    /// Number of samples.
    pub samples: u64,
    /// Packing length.
    pub seq_len: u32,
    /// `false`: every sample has `seq_len` tokens in one piece per ~`seq_len/doc_len` documents
    /// (`fixed`); `true`: samples of `seq_len/2..=seq_len` tokens with 1–4 pieces (`mixed`).
    pub mixed: bool,
    /// Vocabulary size (≤ 65,536 gives uint16 storage).
    pub vocab: u64,
    /// Target `.bin` size per shard.
    pub shard_bytes: u64,
    /// Varies the content.
    pub seed: u64,
    /// Tokenizer name recorded in the manifest (mixing requires equal names' sha256).
    pub tokenizer: String,
    /// Write a loss mask beside the tokens ([`target`] says which are marked), as chat data has.
    pub loss_mask: bool,
}

impl Default for SynthSpec {
    fn default() -> Self {
        SynthSpec {
            samples: 100,
            seq_len: 256,
            mixed: false,
            vocab: 50_000,
            shard_bytes: 1 << 30,
            seed: 0,
            tokenizer: "synthetic".into(),
            loss_mask: false,
        }
    }
}

/// The token at position `j` of sample `s` (global index in the directory).
pub fn token(spec: &SynthSpec, s: u64, j: u64) -> u32 {
    (mix(spec.seed ^ s.wrapping_mul(0x9E37)).wrapping_add(j) % spec.vocab) as u32
}

/// The loss mask of position `j` of sample `s` when the spec has one: runs of targets and
/// non-targets a few tokens long, as chat turns are.
pub fn target(spec: &SynthSpec, s: u64, j: u64) -> bool {
    !mix(spec.seed ^ s.wrapping_mul(0x51) ^ (j / 3)).is_multiple_of(3)
}

/// Length and pieces of sample `s`.
pub fn shape(spec: &SynthSpec, s: u64) -> (u32, Vec<u32>) {
    let h = mix(spec.seed.wrapping_add(s).wrapping_mul(31).wrapping_add(7));
    let len = if spec.mixed {
        let half = (spec.seq_len / 2).max(1);
        spec.seq_len - (h % half as u64) as u32
    } else {
        spec.seq_len
    };
    let n_pieces = (1 + (h >> 20) % 4).min(len as u64) as u32;
    let mut pieces = vec![len / n_pieces; n_pieces as usize];
    pieces[0] += len % n_pieces;
    (len, pieces)
}

/// Write `spec` into `dir` (created) with a manifest; returns the manifest.
pub fn write(dir: &Path, spec: &SynthSpec) -> Result<Manifest> {
    std::fs::create_dir_all(dir).map_err(|e| rsd_shard::ShardError::Io {
        path: dir.to_path_buf(),
        source: e,
    })?;
    let dtype = TokenDtype::for_vocab(spec.vocab);
    let mut writer = ShardSetWriter::new(dir, dtype, spec.shard_bytes, 0);
    if spec.loss_mask {
        writer = writer.with_loss_mask();
    }
    let mut mask = Vec::new();
    let mut trained_tokens = 0u64;
    let mut shards = Vec::new();
    let mut totals = Totals::default();
    let mut buf = Vec::with_capacity(spec.seq_len as usize);
    for s in 0..spec.samples {
        let (len, pieces) = shape(spec, s);
        let base = mix(spec.seed ^ s.wrapping_mul(0x9E37));
        buf.clear();
        buf.extend((0..len as u64).map(|j| (base.wrapping_add(j) % spec.vocab) as u32));
        totals.tokens += len as u64;
        totals.pieces += pieces.len() as u64;
        totals.documents += pieces.len() as u64;
        totals.samples += 1;
        let added = if spec.loss_mask {
            mask.clear();
            mask.extend((0..len as u64).map(|j| u8::from(target(spec, s, j))));
            trained_tokens += mask.iter().map(|&m| m as u64).sum::<u64>();
            writer.add_masked_sample(&buf, &pieces, &mask)?
        } else {
            writer.add_sample(&buf, &pieces)?
        };
        if let Some(info) = added {
            shards.push(info);
        }
    }
    if let Some(info) = writer.close_current()? {
        shards.push(info);
    }
    totals.unused_slots = totals.samples * spec.seq_len as u64 - totals.tokens;
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        tokenizer: TokenizerInfo {
            name: spec.tokenizer.clone(),
            sha256: format!("synthetic-{}", spec.tokenizer),
            vocab_size: spec.vocab,
            bos_id: None,
            eos_id: None,
        },
        source_tokenizer: None,
        dtype,
        seq_len: spec.seq_len as u64,
        mode: if spec.mixed {
            PackMode::Mixed
        } else {
            PackMode::Fixed
        },
        pad_id: None,
        shards,
        totals,
        sources: Vec::new(),
        loss_mask: spec.loss_mask.then(|| rsd_shard::LossMaskInfo {
            train_on: "synthetic".into(),
            chat_template: "synthetic".into(),
            chat_template_sha256: String::new(),
            trained_tokens,
        }),
        command: vec!["rsd_loader::synth::write".into()],
        created_by: format!("rsd-loader {}", env!("CARGO_PKG_VERSION")),
    };
    manifest.write(dir)?;
    Ok(manifest)
}
