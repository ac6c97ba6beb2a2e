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

use crate::source::escaped_path;

use memmap2::Mmap;
use rsd_common::safe_fs::{confined_file, open_regular, read_regular, NamedBy, MAX_METADATA_BYTES};
use rsd_shard::{ShardInfo, ShardSetWriter, Totals};
use serde::{Deserialize, Serialize};

use super::{Inputs, PackSettings};
use crate::error::{Cause, DataError, Result};
use crate::packer::{PackedSample, PackerCounts};

const JOURNAL: &str = "pack.journal.json";
const JOURNAL_TOKENS: &str = "pack.journal.bin";
const JOURNAL_VERSION: u32 = 1;
/// The largest counter a journal may hold: far beyond any corpus (2^56 tokens), far enough below
/// 2^64 that the counts a resumed run adds to it cannot overflow.
const MAX_COUNT: u64 = 1 << 56;

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
            // Paths as text, escaped where they are not UTF-8 (which JSON cannot hold); a UTF-8
            // path is the string it always was here, so older journals still match.
            (
                s.spec.clone(),
                escaped_path(&s.path),
                s.format.name(),
                s.inputs.iter().map(|p| escaped_path(p)).collect::<Vec<_>>(),
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
    if inputs.read.max_expansion != crate::source::DEFAULT_MAX_EXPANSION {
        key["max_expansion"] = inputs.read.max_expansion.into();
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

/// Remove the journal (once the manifest is written, or to start over): whatever is at its names
/// (a damaged file, a link, which is removed and not followed, a FIFO), except a directory.
pub(super) fn remove(out: &Path) -> Result<()> {
    for name in [JOURNAL, JOURNAL_TOKENS] {
        let p = out.join(name);
        match std::fs::symlink_metadata(&p) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(DataError::io(&p, e)),
            Ok(meta) if meta.is_dir() => {
                return Err(DataError::Config(format!(
                    "{} is a directory, not a resume journal; remove it yourself",
                    p.display()
                )))
            }
            Ok(_) => std::fs::remove_file(&p).map_err(|e| DataError::io(&p, e))?,
        }
    }
    Ok(())
}

/// Whether anything (a file, a link, even a dangling one) is at `path`.
fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// An error about field `field` of the journal `path`.
fn journal_error(path: &Path, field: &str, what: String) -> DataError {
    DataError::bad_file(
        path,
        Cause::Corrupt,
        format!("field {field}: {what}; pass --force to start over"),
    )
}

/// Refuses anything at `path`, a file pack keeps in `--out`, but a regular file (or nothing): a
/// link there is never read or written through, whatever it points at, so no file outside
/// `--out` is taken for pack's own or has its content shown.
fn own_file(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DataError::io(path, e)),
        Ok(meta) if meta.file_type().is_file() => Ok(()),
        Ok(meta) => {
            let what = if meta.file_type().is_symlink() {
                match std::fs::read_link(path) {
                    Ok(to) => format!(
                        "a symbolic link (to {})",
                        rsd_common::printable::shortened(&to.to_string_lossy())
                    ),
                    Err(_) => "a symbolic link".to_string(),
                }
            } else if meta.is_dir() {
                "a directory".to_string()
            } else {
                "not a regular file".to_string()
            };
            Err(DataError::Config(format!(
                "{}: {what} where rsd-data pack keeps a file of its own; not read or written \
                 through; pass --force to start over (links are removed, not followed)",
                path.display()
            )))
        }
    }
}

/// The journal `path` as JSON, not yet checked. serde's messages quote the values they trip on,
/// so only where and what kind of fault is said, never the journal's content.
fn parse(path: &Path) -> Result<Journal> {
    own_file(path)?;
    let text = read_regular(path, MAX_METADATA_BYTES, "resume journal")?;
    serde_json::from_slice(&text).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Data => "not a resume journal's fields and types",
            serde_json::error::Category::Eof => "cut off",
            _ => "not valid JSON",
        };
        DataError::bad_file(
            path,
            Cause::Corrupt,
            format!(
                "unreadable resume journal ({what}, at line {} column {}); pass --force to \
                 start over",
                e.line(),
                e.column()
            ),
        )
    })
}

/// The journal's counters, which a resumed run adds to: none above [`MAX_COUNT`].
fn check_counters(j: &Journal, path: &Path) -> Result<()> {
    let t = &j.totals;
    let p = &j.packer;
    let counters = [
        ("consumed", j.consumed),
        ("totals.samples", t.samples),
        ("totals.tokens", t.tokens),
        ("totals.documents", t.documents),
        ("totals.pieces", t.pieces),
        ("totals.padding_tokens", t.padding_tokens),
        ("totals.unused_slots", t.unused_slots),
        ("totals.dropped_tokens", t.dropped_tokens),
        ("totals.truncated_tokens", t.truncated_tokens),
        ("totals.skipped_documents", t.skipped_documents),
        ("packer.padding_tokens", p.padding_tokens),
        ("packer.dropped_tokens", p.dropped_tokens),
        ("packer.truncated_tokens", p.truncated_tokens),
    ];
    if let Some((field, n)) = counters.iter().find(|(_, n)| *n > MAX_COUNT) {
        return Err(journal_error(
            path,
            field,
            format!("{n} is more than any pack counts (2^56)"),
        ));
    }
    if let Some((k, b)) = t
        .bad_inputs
        .iter()
        .enumerate()
        .find(|(_, b)| b.count > MAX_COUNT)
    {
        let field = format!("totals.bad_inputs[{k}].count");
        return Err(journal_error(
            path,
            &field,
            format!("{} is more than any pack counts (2^56)", b.count),
        ));
    }
    Ok(())
}

/// Check what a journal (from a file anyone may have edited) says against what a pack with
/// `settings` can have written, before anything it says is allocated, opened or added to: shard
/// names that are the writer's own (`shard-00000`, … in order: never a path), counters that
/// cannot overflow, saved samples no longer than `--len`, no more open samples than the packer
/// keeps, and saved tokens within what one document can leave unstored (`max_doc_tokens`, plus
/// the packer's open samples). Returns the size the token file must have.
fn check(
    j: &Journal,
    path: &Path,
    out: &Path,
    settings: &PackSettings,
    max_doc_bytes: u64,
) -> Result<u64> {
    for (k, s) in j.shards.iter().enumerate() {
        let field = format!("shards[{k}].prefix");
        rsd_common::safe_fs::check_name(out, &s.prefix, &NamedBy::new(path, &field))?;
        let want = ShardSetWriter::prefix(k);
        if s.prefix != want {
            return Err(journal_error(
                path,
                &field,
                format!(
                    "\"{}\" is not the name pack gives shard {k} (\"{want}\")",
                    rsd_common::printable::shortened(&s.prefix)
                ),
            ));
        }
    }
    check_counters(j, path)?;
    let max_open = settings.max_open.max(1);
    if j.open.len() > max_open {
        return Err(journal_error(
            path,
            "open",
            format!(
                "{} open samples, the packer keeps at most {max_open} (--max-open-bins)",
                j.open.len()
            ),
        ));
    }
    let seq_len = settings.seq_len as u64;
    let mut tokens = [0u64; 2];
    for (t, (list, name)) in [(&j.queued, "queued"), (&j.open, "open")]
        .into_iter()
        .enumerate()
    {
        for (k, pieces) in list.iter().enumerate() {
            let n: u64 = pieces.iter().map(|&p| u64::from(p)).sum();
            if n > seq_len {
                return Err(journal_error(
                    path,
                    &format!("{name}[{k}]"),
                    format!("a saved sample of {n} tokens, longer than --len ({seq_len})"),
                ));
            }
            tokens[t] = tokens[t].saturating_add(n);
        }
    }
    // A shard closes while the samples of one document are being stored: what is left unstored
    // is at most that document's tokens (a token covers at least a byte of text or of token ids;
    // twice that, for tokenizers that add tokens, and BOS/EOS) plus the packer's open samples.
    let max_doc_tokens = max_doc_bytes.saturating_mul(2).saturating_add(2);
    let allowed = max_doc_tokens.saturating_add((max_open as u64 + 2).saturating_mul(seq_len));
    if tokens[0] > allowed {
        return Err(journal_error(
            path,
            "queued",
            format!(
                "saved samples of {} tokens, more than a pack with --len {seq_len} and \
                 --max-doc-bytes {max_doc_bytes} leaves unstored ({allowed})",
                tokens[0]
            ),
        ));
    }
    // Saturated sums make a size no file has, which `read_samples` then reports.
    Ok(tokens[0]
        .saturating_add(tokens[1])
        .saturating_mul(if j.masked { 5 } else { 4 }))
}

/// The samples saved in `out`'s token file for journal `journal`, which [`check`] found to need
/// `need` bytes: the file's size is compared with that before anything is read.
fn read_samples(out: &Path, journal: Journal, need: u64) -> Result<Resume> {
    let tpath = out.join(JOURNAL_TOKENS);
    own_file(&tpath)?;
    let file = open_regular(&tpath)?;
    let len = file.metadata().map_err(|e| DataError::io(&tpath, e))?.len();
    if len != need {
        return Err(DataError::bad_file(
            &tpath,
            Cause::Corrupt,
            format!("{len} bytes, the journal needs {need}; pass --force to start over"),
        ));
    }
    // Read no more than the journal accounts for (the size may change after the check).
    let bytes = read_regular(&tpath, need, "resume journal's token file")?;
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
                // `check` summed these without overflow and the file holds all of them.
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

/// Check that the shards a journal lists are intact: each file confined to `out` (a name that
/// leads out through a link is refused), of the size the journal records, within what a shard of
/// these settings can be, and with the recorded checksum (hashed from a map, not read into memory).
fn check_shards(
    out: &Path,
    journal: &Path,
    shards: &[ShardInfo],
    settings: &PackSettings,
) -> Result<()> {
    // A shard is closed once its .bin reaches --shard-size, so it exceeds it by less than a sample;
    // its .idx holds at most 20 bytes per token (a piece's size and pointer, a sample's start).
    let max_bin = settings
        .shard_bytes
        .saturating_add(4 * settings.seq_len as u64);
    let max_idx = max_bin
        .saturating_add(1)
        .saturating_mul(20)
        .saturating_add(64);
    for (k, s) in shards.iter().enumerate() {
        let mut files = vec![
            (s.prefix.clone(), "bin", s.bin_bytes, &s.bin_xxh3, max_bin),
            (s.prefix.clone(), "idx", s.idx_bytes, &s.idx_xxh3, max_idx),
        ];
        if let Some(m) = &s.loss_mask {
            let prefix = rsd_shard::mask_prefix(&s.prefix);
            files.push((prefix.clone(), "bin", m.bin_bytes, &m.bin_xxh3, max_bin));
            files.push((prefix, "idx", m.idx_bytes, &m.idx_xxh3, max_idx));
        }
        for (prefix, ext, len, sum, max) in files {
            let field = format!("shards[{k}].{ext}_bytes");
            if len > max {
                return Err(journal_error(
                    journal,
                    &field,
                    format!("{len} bytes, more than a shard of --shard-size {} and --len {} can have ({max})",
                        settings.shard_bytes, settings.seq_len),
                ));
            }
            let named_by = NamedBy::new(journal, format!("shards[{k}].prefix"));
            // The prefix is pack's own name for shard k (checked above): a link there is
            // refused as one, wherever it leads.
            own_file(&out.join(format!("{prefix}.{ext}")))?;
            let path = confined_file(out, &format!("{prefix}.{ext}"), &named_by)?;
            let changed = || {
                DataError::bad_file(
                    &path,
                    Cause::Corrupt,
                    "a completed shard changed since it was written; pass --force to start over",
                )
            };
            let file = open_regular(&path)?;
            let size = file.metadata().map_err(|e| DataError::io(&path, e))?.len();
            if size != len {
                return Err(changed());
            }
            let got = if len == 0 {
                rsd_shard::checksum(&[])
            } else {
                // SAFETY: a read-only map of a file of ours that nothing writes while we hash it.
                let map = unsafe { Mmap::map(&file) }.map_err(|e| DataError::io(&path, e))?;
                rsd_shard::checksum(&map)
            };
            if &format!("{got:016x}") != sum {
                return Err(changed());
            }
        }
    }
    Ok(())
}

/// The interrupted pack in `settings.out` (whose journal is there), checked: made with the same
/// settings (`fp`), a journal that passes [`check`], intact shards, and its saved samples.
fn load(settings: &PackSettings, fp: &str, max_doc_bytes: u64) -> Result<Resume> {
    let out = &settings.out;
    let journal = out.join(JOURNAL);
    let j = parse(&journal)?;
    if j.version != JOURNAL_VERSION || j.fingerprint != fp {
        return Err(DataError::Config(format!(
            "{} holds an interrupted pack made with different settings (sources, tokenizer or packing options); \
             rerun with the same settings to resume it, or pass --force to discard it",
            out.display()
        )));
    }
    let need = check(&j, &journal, out, settings, max_doc_bytes)?;
    check_shards(out, &journal, &j.shards, settings)?;
    read_samples(out, j, need)
}

/// Decide what to do with `--out`: start fresh (`None`), or resume from its journal. With
/// `--force` an interrupted pack is cleared without reading its journal, so a damaged one does
/// not stand in the way of starting over.
pub(super) fn prepare_output(
    settings: &PackSettings,
    fp: &str,
    max_doc_bytes: u64,
) -> Result<Option<Resume>> {
    let out = &settings.out;
    std::fs::create_dir_all(out).map_err(|e| DataError::io(out, e))?;
    let manifest = out.join(rsd_shard::MANIFEST_FILE);
    let journal = out.join(JOURNAL);
    if !settings.force {
        own_file(&manifest)?;
    }
    if present(&manifest) {
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
    if present(&journal) {
        if settings.force {
            remove(out)?;
            remove_our_files(out, &[])?;
            return Ok(None);
        }
        let resume = load(settings, fp, max_doc_bytes)?;
        remove_our_files(out, &resume.0.shards)?;
        return Ok(Some(resume));
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

#[cfg(test)]
mod tests {
    //! The journal parser against damaged and random journals: an error or a resume whose every
    //! saved sample fits the settings, never a panic or an allocation the files do not back.
    use super::*;
    use crate::packer::{Mode, Tail};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    const FP: &str = "fingerprint";

    fn settings(out: &Path) -> PackSettings {
        PackSettings {
            out: out.to_path_buf(),
            seq_len: 8,
            mode: Mode::Mixed,
            truncate: false,
            tail: Tail::Keep,
            pad_id: None,
            min_doc_tokens: 1,
            shard_bytes: 64,
            max_open: 2,
            skip_bad: false,
            force: false,
            workers: 1,
            batch_bytes: 1 << 20,
            command: vec![],
        }
    }

    fn sample(n: usize, masked: bool) -> PackedSample {
        PackedSample {
            tokens: (0..n as u32).collect(),
            pieces: vec![n as u32],
            mask: if masked { vec![1; n] } else { vec![] },
        }
    }

    /// A valid journal with two queued and one open sample: its JSON, after writing both files.
    fn valid(out: &Path, masked: bool) -> Value {
        let mut j = Journal::new(FP.into());
        let queued = [sample(8, masked), sample(3, masked)];
        write(out, &mut j, &queued, &[sample(5, masked)]).unwrap();
        serde_json::from_slice(&std::fs::read(out.join(JOURNAL)).unwrap()).unwrap()
    }

    /// What resuming answers, checked: every saved sample within the settings.
    fn resume_checked(out: &Path) -> std::result::Result<(), TestCaseError> {
        let s = settings(out);
        if let Ok((j, queued, open)) = load(&s, FP, 64) {
            prop_assert!(open.len() <= s.max_open);
            for x in queued.iter().chain(&open) {
                prop_assert!(x.tokens.len() <= s.seq_len);
                prop_assert_eq!(
                    x.tokens.len() as u64,
                    x.pieces.iter().map(|&p| u64::from(p)).sum::<u64>()
                );
                prop_assert!(x.mask.is_empty() || x.mask.len() == x.tokens.len());
            }
            prop_assert!(j.totals.tokens <= MAX_COUNT);
        }
        Ok(())
    }

    #[test]
    fn a_valid_journal_resumes_its_samples() {
        let tmp = tempfile::tempdir().unwrap();
        for masked in [false, true] {
            valid(tmp.path(), masked);
            let (_, queued, open) = load(&settings(tmp.path()), FP, 64).unwrap();
            assert_eq!(queued, [sample(8, masked), sample(3, masked)]);
            assert_eq!(open, [sample(5, masked)]);
        }
    }

    /// Any JSON value at a field of a valid journal.
    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            any::<u64>().prop_map(|n| json!(n)),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u32>().prop_map(|n| json!([[n]])),
            proptest::collection::vec(proptest::collection::vec(any::<u32>(), 0..4), 0..4)
                .prop_map(|v| json!(v)),
            "[a-z./-]{0,12}".prop_map(|s| json!(s)),
            Just(json!(null)),
        ]
    }

    const FIELDS: &[&str] = &[
        "version",
        "consumed",
        "queued",
        "open",
        "masked",
        "totals.tokens",
        "totals.samples",
        "packer.padding_tokens",
        "shards",
    ];

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// Random bytes as the journal.
        #[test]
        fn random_journal_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let tmp = tempfile::tempdir().unwrap();
            valid(tmp.path(), false);
            std::fs::write(tmp.path().join(JOURNAL), &bytes).unwrap();
            resume_checked(tmp.path())?;
        }

        /// A valid journal with one field set to any value, and a token file cut or extended.
        #[test]
        fn damaged_journals_never_panic(
            masked in any::<bool>(),
            field in 0..FIELDS.len(),
            v in value(),
            resize in proptest::option::of(0u64..200),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let mut j = valid(tmp.path(), masked);
            let mut at = &mut j;
            let path: Vec<&str> = FIELDS[field].split('.').collect();
            for key in &path[..path.len() - 1] {
                at = &mut at[*key];
            }
            at[path[path.len() - 1]] = v;
            std::fs::write(tmp.path().join(JOURNAL), j.to_string()).unwrap();
            if let Some(len) = resize {
                let f = std::fs::OpenOptions::new()
                    .write(true)
                    .open(tmp.path().join(JOURNAL_TOKENS))
                    .unwrap();
                f.set_len(len).unwrap();
            }
            resume_checked(tmp.path())?;
        }
    }
}
