//! `pack`: read → tokenize (rayon) → pack → write, with a resume journal.
//!
//! Three stages joined by bounded channels:
//!
//! ```text
//! reader thread ──batches of documents──► tokenize (rayon, order kept) ──► packer + shard writer thread
//! ```
//!
//! Batches are cut by the reader at fixed input sizes and tokenized in order, so the output bytes
//! depend only on the inputs and options, never on `--workers`. Memory is bounded by the channel
//! depths and the batches being tokenized (≤ 9) × the batch size, plus the open samples of the packer, plus the largest single document.
//!
//! After each shard is renamed into place the writer saves a journal (`pack.journal.json` and the
//! open samples in `pack.journal.bin`): how many documents were consumed and what was still being
//! packed. A rerun with the same settings checks the completed shards, skips the consumed documents
//! without tokenizing them, restores the packer and goes on — the result is byte-identical to an
//! uninterrupted run. The manifest is written last, and only then is the journal removed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::bounded;
use rayon::prelude::*;
use rsd_shard::{
    Manifest, ShardInfo, ShardSetWriter, SourceInfo, TokenDtype, TokenizerInfo, Totals,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{DataError, Result};
use crate::pack::{Mode, PackedSample, Packer, PackerCounts, Tail};
use crate::source::{Content, DocumentStream, RawDoc, ReadOptions, ResolvedSource};
use crate::tokenizer::Tokenizer;

/// Everything that decides the bytes of a pack.
#[derive(Debug, Clone)]
pub struct PackConfig {
    /// Resolved sources, in order.
    pub sources: Vec<ResolvedSource>,
    /// How sources are read.
    pub read: ReadOptions,
    /// Output directory.
    pub out: PathBuf,
    /// Packing length in tokens.
    pub seq_len: usize,
    /// `fixed` or `mixed`.
    pub mode: Mode,
    /// Tail rule for `fixed` mode.
    pub tail: Tail,
    /// Pad id for `--tail pad` (defaults to EOS).
    pub pad_id: Option<u32>,
    /// Documents with fewer tokens (BOS/EOS included) are skipped.
    pub min_doc_tokens: usize,
    /// Target size of each `.bin` in bytes.
    pub shard_bytes: u64,
    /// Open bins in `mixed` mode.
    pub max_open: usize,
    /// Skip bad records (counted) instead of stopping.
    pub skip_bad: bool,
    /// Overwrite a complete output, or discard an interrupted one made with other settings.
    pub force: bool,
    /// Tokenizer threads.
    pub workers: usize,
    /// Input bytes per batch handed to the tokenizer threads.
    pub batch_bytes: usize,
    /// The command line, for the manifest.
    pub command: Vec<String>,
}

/// Progress numbers, reported to the caller's callback every few hundred milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Progress {
    /// Input bytes consumed.
    pub bytes: u64,
    /// Total input bytes (0 if unknown).
    pub total_bytes: u64,
    /// Documents consumed.
    pub documents: u64,
    /// Tokens written.
    pub tokens: u64,
    /// Shards finished.
    pub shards: u64,
    /// Documents skipped before this run (a resume).
    pub resumed_documents: u64,
}

/// What a finished pack reports.
#[derive(Debug, Clone)]
pub struct PackSummary {
    /// The manifest written.
    pub manifest: Manifest,
    /// Wall time in seconds.
    pub seconds: f64,
    /// Shards reused from an interrupted run.
    pub resumed_shards: usize,
    /// The first few skipped bad records (with `--skip-bad`).
    pub skipped_examples: Vec<String>,
    /// CPU seconds spent by each stage.
    pub cpu: StageCpu,
}

/// CPU seconds per pipeline stage: what the run cost besides tokenizing, independent of how busy
/// the machine was (wall-clock rates on a shared machine move by ±25%; these move less).
#[derive(Debug, Clone, Copy, Default)]
pub struct StageCpu {
    /// The reader thread and the read threads: file reads, decompression, splitting into documents.
    pub read: f64,
    /// The tokenizer threads: decoding records (JSON, UTF-8) and tokenizing.
    pub tokenize: f64,
    /// The writer thread: packing, checksums, writes, fsyncs, the resume journal.
    pub write: f64,
}

/// CPU time this thread has used, in seconds.
fn thread_cpu_seconds() -> f64 {
    crate::source::thread_cpu_nanos() as f64 * 1e-9
}

const JOURNAL: &str = "pack.journal.json";
const JOURNAL_TOKENS: &str = "pack.journal.bin";
const JOURNAL_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Journal {
    version: u32,
    fingerprint: String,
    shards: Vec<ShardInfo>,
    /// Items (documents and bad records) of the source stream fully handled.
    consumed: u64,
    totals: Totals,
    packer: PackerCounts,
    /// Piece lengths of finished samples not yet in a shard; their tokens open `pack.journal.bin`.
    queued: Vec<Vec<u32>>,
    /// Piece lengths of the packer's open samples; their tokens follow in `pack.journal.bin`.
    open: Vec<Vec<u32>>,
    skipped_examples: Vec<String>,
}

/// A fingerprint of everything that decides the output bytes (not `--workers` or `--force`).
fn fingerprint(cfg: &PackConfig, tok: &Tokenizer) -> String {
    let sources: Vec<_> = cfg
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
    let key = serde_json::json!({
        "sources": sources, "text_field": cfg.read.text_field, "tokenizer": tok.sha256(),
        "bos": tok.bos(), "eos": tok.eos(), "seq_len": cfg.seq_len, "mode": cfg.mode, "tail": cfg.tail,
        "pad_id": cfg.pad_id, "min_doc_tokens": cfg.min_doc_tokens, "shard_bytes": cfg.shard_bytes,
        "max_open": cfg.max_open, "skip_bad": cfg.skip_bad,
    });
    format!("{:x}", Sha256::digest(key.to_string().as_bytes()))
}

fn is_our_file(name: &str) -> bool {
    name == rsd_shard::MANIFEST_FILE
        || name.starts_with("pack.journal")
        || (name.starts_with("shard-")
            && (name.ends_with(".bin") || name.ends_with(".idx") || name.ends_with(".tmp")))
        || name == "index.json.tmp"
}

fn remove_our_files(out: &Path, keep: &[ShardInfo]) -> Result<()> {
    let keep: Vec<String> = keep
        .iter()
        .flat_map(|s| [format!("{}.bin", s.prefix), format!("{}.idx", s.prefix)])
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

fn remove_journal(out: &Path) -> Result<()> {
    for name in [JOURNAL, JOURNAL_TOKENS] {
        let p = out.join(name);
        if p.exists() {
            std::fs::remove_file(&p).map_err(|e| DataError::io(&p, e))?;
        }
    }
    Ok(())
}

/// A journal and its saved samples: (journal, queued, open).
type Resume = (Journal, Vec<PackedSample>, Vec<PackedSample>);

fn read_journal(out: &Path) -> Result<Resume> {
    let path = out.join(JOURNAL);
    let text = std::fs::read_to_string(&path).map_err(|e| DataError::io(&path, e))?;
    let journal: Journal = serde_json::from_str(&text).map_err(|e| {
        DataError::bad_file(
            &path,
            format!("unreadable resume journal ({e}); pass --force to start over"),
        )
    })?;
    let tpath = out.join(JOURNAL_TOKENS);
    let bytes = std::fs::read(&tpath).map_err(|e| DataError::io(&tpath, e))?;
    let need: u64 = journal
        .queued
        .iter()
        .chain(&journal.open)
        .flatten()
        .map(|&p| p as u64 * 4)
        .sum();
    if bytes.len() as u64 != need {
        return Err(DataError::bad_file(
            &tpath,
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
                PackedSample {
                    tokens,
                    pieces: pieces.clone(),
                }
            })
            .collect()
    };
    let queued = take(&journal.queued);
    let open = take(&journal.open);
    Ok((journal, queued, open))
}

fn write_journal(
    out: &Path,
    journal: &mut Journal,
    queued: &[PackedSample],
    open: &[PackedSample],
) -> Result<()> {
    journal.queued = queued.iter().map(|s| s.pieces.clone()).collect();
    journal.open = open.iter().map(|s| s.pieces.clone()).collect();
    let mut bytes = Vec::with_capacity(queued.iter().chain(open).map(|s| s.tokens.len() * 4).sum());
    for s in queued.iter().chain(open) {
        for t in &s.tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
    }
    rsd_shard::write_file_atomic(&out.join(JOURNAL_TOKENS), &bytes)?;
    let text = serde_json::to_string(journal)
        .map_err(|e| DataError::Config(format!("cannot serialize journal: {e}")))?;
    rsd_shard::write_file_atomic(&out.join(JOURNAL), text.as_bytes())?;
    Ok(())
}

/// Check that the shards a journal lists are intact.
fn check_shards(out: &Path, shards: &[ShardInfo]) -> Result<()> {
    for s in shards {
        for (ext, len, sum) in [
            ("bin", s.bin_bytes, &s.bin_xxh3),
            ("idx", s.idx_bytes, &s.idx_xxh3),
        ] {
            let path = out.join(format!("{}.{ext}", s.prefix));
            let bytes = std::fs::read(&path).map_err(|e| DataError::io(&path, e))?;
            let got = format!("{:016x}", rsd_shard::checksum(&bytes));
            if bytes.len() as u64 != len || &got != sum {
                return Err(DataError::bad_file(
                    &path,
                    "a completed shard changed since it was written; pass --force to start over",
                ));
            }
        }
    }
    Ok(())
}

/// Decide what to do with `out`: start fresh, or resume from a journal.
fn prepare_output(cfg: &PackConfig, fp: &str) -> Result<Option<Resume>> {
    let out = &cfg.out;
    std::fs::create_dir_all(out).map_err(|e| DataError::io(out, e))?;
    let manifest = out.join(rsd_shard::MANIFEST_FILE);
    let journal = out.join(JOURNAL);
    if manifest.exists() {
        if !cfg.force {
            return Err(DataError::Config(format!(
                "{} already holds a complete pack (index.json); pass --force to overwrite it, or choose another --out",
                out.display()
            )));
        }
        remove_journal(out)?;
        remove_our_files(out, &[])?;
        return Ok(None);
    }
    if journal.exists() {
        let (j, queued, open) = read_journal(out)?;
        if j.version == JOURNAL_VERSION && j.fingerprint == fp && !cfg.force {
            check_shards(out, &j.shards)?;
            remove_our_files(out, &j.shards)?;
            return Ok(Some((j, queued, open)));
        }
        if !cfg.force {
            return Err(DataError::Config(format!(
                "{} holds an interrupted pack made with different settings (sources, tokenizer or packing options); \
                 rerun with the same settings to resume it, or pass --force to discard it",
                out.display()
            )));
        }
        remove_journal(out)?;
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

/// A tokenized stream item: the ids, `None` for an empty document, or the record's error.
type Tokenized = Result<(Option<Vec<u32>>, u64, String)>;

fn tokenize(
    doc: Result<RawDoc>,
    tok: &Tokenizer,
    scratch: &mut Vec<tokenizers::pipeline::PipelineToken>,
) -> Tokenized {
    let doc = doc?;
    let mut encode = |text: &str| -> Result<Option<Vec<u32>>> {
        if text.is_empty() {
            return Ok(None);
        }
        tok.encode_document(text, scratch)
            .map(Some)
            .map_err(|e| DataError::bad_record(&doc.origin, "tokenize", e.to_string()))
    };
    let ids = match doc.content {
        Content::Text(text) => encode(&text)?,
        // Decoded here, on the tokenizer threads (see `Content::JsonLine`).
        Content::JsonLine(line) => encode(&line.decode()?)?,
        Content::Tokens(ids) => {
            let vocab = tok.vocab_size();
            // max() vectorises; the search for the position runs only on failure.
            let out_of_vocab = ids.iter().copied().max().is_some_and(|m| m as u64 >= vocab);
            if let Some(pos) = out_of_vocab
                .then(|| ids.iter().position(|&t| t as u64 >= vocab))
                .flatten()
            {
                return Err(DataError::BadRecord {
                    path: PathBuf::from(&doc.origin),
                    location: format!("token {pos}"),
                    what: format!(
                        "id {} is outside the tokenizer's vocabulary (0..{vocab}); pre-tokenized data needs the tokenizer it was made with (--tokenizer)",
                        ids[pos]
                    ),
                });
            }
            (!ids.is_empty()).then_some(ids)
        }
    };
    Ok((ids, doc.bytes, doc.origin))
}

/// Run a pack. `interrupted` is polled between batches; `on_progress` is called from the writer
/// thread a few times a second.
pub fn run(
    cfg: &PackConfig,
    tok: &Tokenizer,
    interrupted: &AtomicBool,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<PackSummary> {
    let start = Instant::now();
    if cfg.seq_len == 0 {
        return Err(DataError::Config("--len must be at least 1".into()));
    }
    let dtype = TokenDtype::for_vocab(tok.vocab_size());
    let pad_id = match (cfg.tail, cfg.pad_id.or(tok.eos())) {
        (Tail::Pad, None) => {
            return Err(DataError::Config(
                "--tail pad needs --pad-id (the tokenizer has no EOS to default to)".into(),
            ))
        }
        (_, p) => p,
    };
    let fp = fingerprint(cfg, tok);
    let resume = prepare_output(cfg, &fp)?;
    let resumed_shards = resume.as_ref().map_or(0, |(j, _, _)| j.shards.len());

    let mut packer = Packer::new(
        cfg.mode,
        cfg.seq_len,
        cfg.tail,
        pad_id.unwrap_or(0),
        cfg.max_open,
    );
    let mut journal = Journal {
        version: JOURNAL_VERSION,
        fingerprint: fp,
        shards: vec![],
        consumed: 0,
        totals: Totals::default(),
        packer: PackerCounts::default(),
        queued: vec![],
        open: vec![],
        skipped_examples: vec![],
    };
    let mut queued = vec![];
    if let Some((j, q, open)) = resume {
        packer.restore(open, j.packer);
        queued = q;
        journal = j;
    }
    let skip = journal.consumed;
    // A crash simulator for the crash-safety tests: abort (no cleanup at all) once this many shards
    // are finished and the next one has been started.
    let crash_after: Option<usize> = std::env::var("RSD_PACK_CRASH_AFTER_SHARDS")
        .ok()
        .and_then(|v| v.parse().ok());
    let total_bytes: u64 = cfg.sources.iter().map(|s| s.bytes).sum();

    let stop = Arc::new(AtomicBool::new(false));
    let (doc_tx, doc_rx) = bounded::<Vec<Result<RawDoc>>>(4);
    let (tok_tx, tok_rx) = bounded::<Vec<Tokenized>>(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(cfg.workers.max(1))
        .build()
        .map_err(|e| {
            DataError::Config(format!("cannot start {} worker threads: {e}", cfg.workers))
        })?;

    std::thread::scope(|scope| -> Result<PackSummary> {
        // Stage 1: read documents in order, in batches of about `batch_bytes`.
        let reader_stop = stop.clone();
        let reader = scope.spawn(move || -> (Vec<SourceInfo>, f64) {
            let mut stream = DocumentStream::new(cfg.sources.clone(), cfg.read.clone());
            let mut batch = vec![];
            let mut batch_bytes = 0usize;
            let mut index = 0u64;
            for item in stream.by_ref() {
                index += 1;
                if index <= skip {
                    continue; // consumed by the run this one resumes
                }
                if reader_stop.load(Ordering::Relaxed) {
                    batch.clear();
                    break;
                }
                let fatal = matches!(&item, Err(e) if !e.is_skippable());
                batch_bytes += item.as_ref().map_or(0, |d| d.bytes as usize);
                batch.push(item);
                if batch_bytes >= cfg.batch_bytes || batch.len() >= 4096 || fatal {
                    if fatal || doc_tx.send(std::mem::take(&mut batch)).is_err() {
                        break;
                    }
                    batch_bytes = 0;
                }
            }
            if !batch.is_empty() {
                let _ = doc_tx.send(batch);
            }
            // The read threads' CPU (several input files read at once) counts as reading too.
            let cpu = stream.read_threads_cpu_seconds() + thread_cpu_seconds();
            (std::mem::take(&mut stream.info), cpu)
        });

        // Stage 3: pack and write, in order.
        let writer_stop = stop.clone();
        let writer = scope.spawn(move || -> (Result<(Journal, Vec<ShardInfo>)>, f64) {
            let result = (|| -> Result<(Journal, Vec<ShardInfo>)> {
                let mut shards =
                    ShardSetWriter::new(&cfg.out, dtype, cfg.shard_bytes, journal.shards.len());
                // A resumed run first writes the samples the journal had finished but not yet stored.
                let mut ready: Vec<PackedSample> = queued;
                let mut progress = Progress {
                    total_bytes,
                    resumed_documents: skip,
                    ..Default::default()
                };
                progress.shards = journal.shards.len() as u64;
                progress.tokens = journal.totals.tokens;
                let mut last_report = Instant::now();
                let mut in_open_shard = 0usize;
                let mut write_ready = |ready: &mut Vec<PackedSample>,
                                       journal: &mut Journal,
                                       packer: &Packer,
                                       consumed: u64|
                 -> Result<()> {
                    let n = ready.len();
                    for k in 0..n {
                        let s = &ready[k];
                        journal.totals.samples += 1;
                        journal.totals.tokens += s.tokens.len() as u64;
                        journal.totals.pieces += s.pieces.len() as u64;
                        journal.totals.unused_slots += (cfg.seq_len - s.tokens.len()) as u64;
                        if crash_after
                            .is_some_and(|n| journal.shards.len() >= n && in_open_shard > 0)
                        {
                            std::process::abort();
                        }
                        in_open_shard += 1;
                        if let Some(info) = shards.add_sample(&s.tokens, &s.pieces)? {
                            in_open_shard = 0;
                            journal.shards.push(info);
                            journal.consumed = consumed;
                            journal.packer = packer.counts;
                            // Not yet in a finished shard: the rest of `ready`, and the open bins.
                            write_journal(
                                &cfg.out,
                                journal,
                                &ready[k + 1..],
                                packer.open_samples(),
                            )?;
                        }
                    }
                    ready.clear();
                    Ok(())
                };
                let mut consumed = skip;
                write_ready(&mut ready, &mut journal, &packer, consumed)?;
                for batch in tok_rx.iter() {
                    for item in batch {
                        consumed += 1;
                        match item {
                            Ok((ids, bytes, _origin)) => {
                                progress.bytes += bytes;
                                progress.documents += 1;
                                match ids {
                                    Some(ids) if ids.len() >= cfg.min_doc_tokens.max(1) => {
                                        journal.totals.documents += 1;
                                        packer.push(&ids, &mut ready);
                                    }
                                    _ => journal.totals.skipped_documents += 1,
                                }
                            }
                            Err(e) if e.is_skippable() && cfg.skip_bad => {
                                journal.totals.skipped_documents += 1;
                                if journal.skipped_examples.len() < 5 {
                                    journal.skipped_examples.push(e.to_string());
                                }
                            }
                            Err(e) => return Err(e),
                        }
                        write_ready(&mut ready, &mut journal, &packer, consumed)?;
                        progress.tokens = journal.totals.tokens;
                        progress.shards = journal.shards.len() as u64;
                    }
                    if last_report.elapsed().as_millis() >= 250 {
                        on_progress(progress);
                        last_report = Instant::now();
                    }
                }
                if interrupted.load(Ordering::Relaxed) {
                    return Err(DataError::Interrupted);
                }
                packer.finish(&mut ready);
                write_ready(&mut ready, &mut journal, &packer, consumed)?;
                if let Some(info) = shards.close_current()? {
                    journal.shards.push(info);
                }
                journal.packer = packer.counts;
                progress.tokens = journal.totals.tokens;
                progress.shards = journal.shards.len() as u64;
                on_progress(progress);
                let shards_done = journal.shards.clone();
                Ok((journal, shards_done))
            })();
            if result.is_err() {
                writer_stop.store(true, Ordering::Relaxed);
            }
            (result, thread_cpu_seconds())
        });

        // Stage 2: tokenize batches across the pool. Up to `IN_FLIGHT` batches are tokenized at
        // once, so threads that finish a batch early start the next one instead of waiting for its
        // slowest document; results are forwarded strictly in submission order.
        const IN_FLIGHT: usize = 3;
        pool.in_place_scope(|scope| {
            let mut pending = std::collections::VecDeque::new();
            let forward = |rx: crossbeam_channel::Receiver<Vec<Tokenized>>| -> bool {
                match rx.recv() {
                    Ok(tokenized) => tok_tx.send(tokenized).is_ok(),
                    Err(_) => false,
                }
            };
            for batch in doc_rx.iter() {
                if interrupted.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                    break;
                }
                let (done_tx, done_rx) = bounded::<Vec<Tokenized>>(1);
                scope.spawn(move |_| {
                    let tokenized: Vec<Tokenized> = batch
                        .into_par_iter()
                        .map_init(Vec::new, |scratch, doc| tokenize(doc, tok, scratch))
                        .collect();
                    let _ = done_tx.send(tokenized);
                });
                pending.push_back(done_rx);
                if pending.len() >= IN_FLIGHT {
                    if let Some(rx) = pending.pop_front() {
                        if !forward(rx) {
                            return;
                        }
                    }
                }
            }
            while let Some(rx) = pending.pop_front() {
                if interrupted.load(Ordering::Relaxed) || !forward(rx) {
                    return;
                }
            }
        });
        stop.store(true, Ordering::Relaxed);
        drop(tok_tx);
        drop(doc_rx);
        let (writer_result, write_cpu) = writer
            .join()
            .map_err(|_| DataError::Config("the writer thread panicked".into()))?;
        let (source_info, read_cpu) = reader
            .join()
            .map_err(|_| DataError::Config("the reader thread panicked".into()))?;
        // Every pool thread's CPU time, including the spinning before it sleeps: all of it is
        // the tokenize stage's cost.
        let cpu = StageCpu {
            read: read_cpu,
            tokenize: pool.broadcast(|_| thread_cpu_seconds()).iter().sum(),
            write: write_cpu,
        };
        if interrupted.load(Ordering::Relaxed) {
            return Err(DataError::Interrupted);
        }
        let (journal, shards) = writer_result?;
        if shards.is_empty() {
            return Err(DataError::Config(format!(
                "nothing to write: {} documents read, {} skipped, {} tokens dropped with the tail (shorter than --len {}?)",
                journal.totals.documents + journal.totals.skipped_documents,
                journal.totals.skipped_documents,
                journal.packer.dropped_tokens,
                cfg.seq_len
            )));
        }
        let mut totals = journal.totals.clone();
        totals.padding_tokens = journal.packer.padding_tokens;
        totals.dropped_tokens = journal.packer.dropped_tokens;
        let manifest = Manifest {
            format: rsd_shard::FORMAT_NAME.into(),
            version: rsd_shard::FORMAT_VERSION,
            tokenizer: TokenizerInfo {
                name: tok.name().to_string(),
                sha256: tok.sha256().to_string(),
                vocab_size: tok.vocab_size(),
                bos_id: tok.bos(),
                eos_id: tok.eos(),
            },
            dtype,
            seq_len: cfg.seq_len as u64,
            mode: cfg.mode,
            pad_id: (totals.padding_tokens > 0).then_some(pad_id).flatten(),
            shards,
            totals,
            sources: source_info,
            command: cfg.command.clone(),
            created_by: format!("rsd-data {}", env!("CARGO_PKG_VERSION")),
        };
        manifest.write(&cfg.out)?;
        remove_journal(&cfg.out)?;
        Ok(PackSummary {
            manifest,
            seconds: start.elapsed().as_secs_f64(),
            resumed_shards,
            skipped_examples: journal.skipped_examples,
            cpu,
        })
    })
}
