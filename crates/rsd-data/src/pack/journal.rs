//! The output directory between runs: the resume journal a pack saves after every shard, and what
//! a new run does with what it finds in `--out` (start fresh, resume, or refuse).
//!
//! After each shard is renamed into place the writer saves `pack.journal.json` (how many stream
//! items were consumed, the shards so far, the totals) and `pack.journal.bin` (the tokens of the
//! samples not yet in a shard). A rerun with the same settings checks the completed shards, skips
//! the consumed documents without tokenizing them, restores the packer and goes on: the result is
//! byte-identical to an uninterrupted run. The manifest is written last, and only then is the
//! journal removed.

use std::path::Path;

use rsd_common::safe_fs::{read_regular, FsError, MAX_METADATA_BYTES};
use rsd_shard::{ShardInfo, Totals};
use serde::{Deserialize, Serialize};

use super::{Inputs, PackSettings};
use crate::error::{Cause, DataError, Result};
use crate::packer::{PackedSample, PackerCounts};

const JOURNAL: &str = "pack.journal.json";
const JOURNAL_TOKENS: &str = "pack.journal.bin";
const JOURNAL_VERSION: u32 = 1;

/// What a resumed run needs to go on where the interrupted one stopped.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Journal {
    version: u32,
    fingerprint: String,
    pub(super) shards: Vec<ShardInfo>,
    /// Items (documents and bad records) of the source stream fully handled.
    pub(super) consumed: u64,
    pub(super) totals: Totals,
    pub(super) packer: PackerCounts,
    /// Piece lengths of finished samples not yet in a shard; their tokens open `pack.journal.bin`.
    queued: Vec<Vec<u32>>,
    /// Piece lengths of the packer's open samples; their tokens follow in `pack.journal.bin`.
    open: Vec<Vec<u32>>,
    /// Chat data: each saved sample's tokens are followed by its loss mask, a byte per token.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    masked: bool,
}

impl Journal {
    /// The journal of a run that has written nothing yet.
    pub(super) fn new(fingerprint: String) -> Journal {
        Journal {
            version: JOURNAL_VERSION,
            fingerprint,
            shards: vec![],
            consumed: 0,
            totals: Totals::default(),
            packer: PackerCounts::default(),
            queued: vec![],
            open: vec![],
            masked: false,
        }
    }
}

/// A journal and its saved samples: (journal, queued, open).
pub(super) type Resume = (Journal, Vec<PackedSample>, Vec<PackedSample>);

/// A fingerprint of everything that decides the output bytes (not `--workers` or `--force`).
pub(super) fn fingerprint(inputs: &Inputs, settings: &PackSettings) -> String {
    let tok = &inputs.tokenizer;
    let sources: Vec<_> = inputs
        .sources
        .iter()
        .map(|s| {
            (
                s.spec.clone(),
                s.path.clone(),
                s.format.name(),
                s.inputs.clone(),
            )
        })
        .collect();
    let mut key = serde_json::json!({
        "sources": sources, "text_field": inputs.read.text_field, "tokenizer": tok.sha256(),
        "bos": tok.bos(), "eos": tok.eos(), "seq_len": settings.seq_len, "mode": settings.mode,
        "tail": settings.tail, "pad_id": settings.pad_id, "min_doc_tokens": settings.min_doc_tokens,
        "shard_bytes": settings.shard_bytes, "max_open": settings.max_open, "skip_bad": settings.skip_bad,
    });
    // Added only when used, so the fingerprint of an interrupted pack from before these options
    // existed is unchanged and it still resumes.
    if let Some(source) = &inputs.retokenize {
        key["source_tokenizer"] = source.tokenizer.sha256().into();
    }
    if settings.truncate {
        key["truncate"] = true.into();
    }
    if let Some(chat) = &inputs.chat {
        key["chat"] = serde_json::json!({
            "template": chat.template.sha256(), "train_on": chat.train_on.name(),
        });
    }
    if inputs.read.max_doc_bytes != crate::source::DEFAULT_MAX_DOC_BYTES {
        key["max_doc_bytes"] = inputs.read.max_doc_bytes.into();
    }
    rsd_common::digest::sha256_hex(key.to_string().as_bytes())
}

fn is_our_file(name: &str) -> bool {
    name == rsd_shard::MANIFEST_FILE
        || name == rsd_shard::TOKENIZER_FILE
        || name == format!("{}.tmp", rsd_shard::TOKENIZER_FILE)
        || name.starts_with("pack.journal")
        || (name.starts_with("shard-")
            && (name.ends_with(".bin") || name.ends_with(".idx") || name.ends_with(".tmp")))
        || name == "index.json.tmp"
}

fn remove_our_files(out: &Path, keep: &[ShardInfo]) -> Result<()> {
    let keep: Vec<String> = keep
        .iter()
        .flat_map(|s| {
            let mask = rsd_shard::mask_prefix(&s.prefix);
            [
                format!("{}.bin", s.prefix),
                format!("{}.idx", s.prefix),
                format!("{mask}.bin"),
                format!("{mask}.idx"),
            ]
        })
        .collect();
    for entry in std::fs::read_dir(out)
        .map_err(|e| DataError::io(out, e))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if is_our_file(&name) && !keep.contains(&name) && !name.starts_with("pack.journal") {
            std::fs::remove_file(entry.path()).map_err(|e| DataError::io(entry.path(), e))?;
        }
    }
    Ok(())
}

/// Remove the journal (once the manifest is written, or to start over).
pub(super) fn remove(out: &Path) -> Result<()> {
    for name in [JOURNAL, JOURNAL_TOKENS] {
        let p = out.join(name);
        if p.exists() {
            std::fs::remove_file(&p).map_err(|e| DataError::io(&p, e))?;
        }
    }
    Ok(())
}

fn read(out: &Path) -> Result<Resume> {
    let path = out.join(JOURNAL);
    let text = read_regular(&path, MAX_METADATA_BYTES, "resume journal")?;
    let journal: Journal = serde_json::from_slice(&text).map_err(|e| {
        DataError::bad_file(
            &path,
            Cause::Corrupt,
            format!("unreadable resume journal ({e}); pass --force to start over"),
        )
    })?;
    let tpath = out.join(JOURNAL_TOKENS);
    let need: u64 = journal
        .queued
        .iter()
        .chain(&journal.open)
        .flatten()
        .map(|&p| p as u64 * if journal.masked { 5 } else { 4 })
        .fold(0u64, u64::saturating_add);
    // Read no more than the journal accounts for.
    let bytes = read_regular(&tpath, need, "resume journal's token file").map_err(|e| match e {
        FsError::TooLarge { .. } => DataError::bad_file(
            &tpath,
            Cause::Corrupt,
            format!("more than the {need} bytes the journal needs; pass --force to start over"),
        ),
        other => other.into(),
    })?;
    if bytes.len() as u64 != need {
        return Err(DataError::bad_file(
            &tpath,
            Cause::Corrupt,
            format!(
                "{} bytes, the journal needs {need}; pass --force to start over",
                bytes.len()
            ),
        ));
    }
    let mut at = 0usize;
    let mut take = |list: &[Vec<u32>]| -> Vec<PackedSample> {
        list.iter()
            .map(|pieces| {
                let n: usize = pieces.iter().map(|&p| p as usize).sum();
                let tokens = bytes[at..at + 4 * n]
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                at += 4 * n;
                let mask = if journal.masked {
                    at += n;
                    bytes[at - n..at].to_vec()
                } else {
                    Vec::new()
                };
                PackedSample {
                    tokens,
                    pieces: pieces.clone(),
                    mask,
                }
            })
            .collect()
    };
    let queued = take(&journal.queued);
    let open = take(&journal.open);
    Ok((journal, queued, open))
}

/// Save `journal` with the samples not yet in a finished shard: `queued` (finished samples) and
/// `open` (the packer's open samples).
pub(super) fn write(
    out: &Path,
    journal: &mut Journal,
    queued: &[PackedSample],
    open: &[PackedSample],
) -> Result<()> {
    journal.queued = queued.iter().map(|s| s.pieces.clone()).collect();
    journal.open = open.iter().map(|s| s.pieces.clone()).collect();
    journal.masked = queued.iter().chain(open).any(|s| !s.mask.is_empty());
    let mut bytes = Vec::with_capacity(queued.iter().chain(open).map(|s| s.tokens.len() * 5).sum());
    for s in queued.iter().chain(open) {
        for t in &s.tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        if journal.masked {
            bytes.extend_from_slice(&s.mask);
        }
    }
    super::write_output(&out.join(JOURNAL_TOKENS), &bytes)?;
    let text = serde_json::to_string(journal)
        .map_err(|e| DataError::Config(format!("cannot serialize journal: {e}")))?;
    super::write_output(&out.join(JOURNAL), text.as_bytes())?;
    Ok(())
}

/// Check that the shards a journal lists are intact.
fn check_shards(out: &Path, shards: &[ShardInfo]) -> Result<()> {
    for s in shards {
        let mut files = vec![
            (s.prefix.clone(), "bin", s.bin_bytes, &s.bin_xxh3),
            (s.prefix.clone(), "idx", s.idx_bytes, &s.idx_xxh3),
        ];
        if let Some(m) = &s.loss_mask {
            let prefix = rsd_shard::mask_prefix(&s.prefix);
            files.push((prefix.clone(), "bin", m.bin_bytes, &m.bin_xxh3));
            files.push((prefix, "idx", m.idx_bytes, &m.idx_xxh3));
        }
        for (prefix, ext, len, sum) in files {
            let path = out.join(format!("{prefix}.{ext}"));
            let bytes = read_regular(&path, len, "shard").map_err(|e| match e {
                FsError::TooLarge { .. } => DataError::bad_file(
                    &path,
                    Cause::Corrupt,
                    "a completed shard changed since it was written; pass --force to start over",
                ),
                other => other.into(),
            })?;
            let got = format!("{:016x}", rsd_shard::checksum(&bytes));
            if bytes.len() as u64 != len || &got != sum {
                return Err(DataError::bad_file(
                    &path,
                    Cause::Corrupt,
                    "a completed shard changed since it was written; pass --force to start over",
                ));
            }
        }
    }
    Ok(())
}

/// Decide what to do with `--out`: start fresh (`None`), or resume from its journal.
pub(super) fn prepare_output(settings: &PackSettings, fp: &str) -> Result<Option<Resume>> {
    let out = &settings.out;
    std::fs::create_dir_all(out).map_err(|e| DataError::io(out, e))?;
    let manifest = out.join(rsd_shard::MANIFEST_FILE);
    let journal = out.join(JOURNAL);
    if manifest.exists() {
        if !settings.force {
            return Err(DataError::Config(format!(
                "{} already holds a complete pack (index.json); pass --force to overwrite it, or choose another --out",
                out.display()
            )));
        }
        remove(out)?;
        remove_our_files(out, &[])?;
        return Ok(None);
    }
    if journal.exists() {
        let (j, queued, open) = read(out)?;
        if j.version == JOURNAL_VERSION && j.fingerprint == fp && !settings.force {
            check_shards(out, &j.shards)?;
            remove_our_files(out, &j.shards)?;
            return Ok(Some((j, queued, open)));
        }
        if !settings.force {
            return Err(DataError::Config(format!(
                "{} holds an interrupted pack made with different settings (sources, tokenizer or packing options); \
                 rerun with the same settings to resume it, or pass --force to discard it",
                out.display()
            )));
        }
        remove(out)?;
        remove_our_files(out, &[])?;
        return Ok(None);
    }
    let foreign: Vec<String> = std::fs::read_dir(out)
        .map_err(|e| DataError::io(out, e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !is_our_file(n))
        .collect();
    if !foreign.is_empty() {
        return Err(DataError::Config(format!(
            "{} is not empty and is not an rsd shard directory (it has {}); choose an empty or new --out",
            out.display(),
            foreign.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        )));
    }
    // Leftovers of a run that stopped before its first shard: start over.
    remove_our_files(out, &[])?;
    Ok(None)
}
