//! The three stages of a pack, each on its own thread(s), joined by bounded channels:
//!
//! ```text
//! read (one thread) ──batches of documents──► tokenize (rayon pool, order kept) ──► pack + write (one thread)
//! ```
//!
//! The reader cuts the document stream into batches at fixed input sizes and the batches are
//! tokenized and forwarded in order, so the output bytes depend only on the inputs and options,
//! never on `--workers`. Memory is bounded by the channel depths and the batches being tokenized
//! (≤ [`READ_QUEUE_BATCHES`] + [`TOKENIZE_IN_FLIGHT`] + [`WRITE_QUEUE_BATCHES`]) × the batch size,
//! plus the open samples of the packer, plus the largest single document.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use rayon::prelude::*;
use rsd_shard::{BadInput, ShardSetWriter, SourceInfo, TokenDtype};

use super::fault::Faults;
use super::journal::{self, Journal};
use super::{PackSettings, Progress};
use crate::chat::ChatSetup;
use crate::error::{Cause, DataError, Result};
use crate::packer::{PackedSample, Packer};
use crate::source::{Content, DocumentStream, RawDoc, ReadOptions, ResolvedSource};
use crate::tokenizer::{SourceDecoder, Tokenizer};

/// Batches of documents queued between the reader and the tokenizer pool: enough to keep the pool
/// fed while the reader waits on a slow file, few enough to keep memory at a few batches.
pub(super) const READ_QUEUE_BATCHES: usize = 4;
/// Batches tokenized at once: threads that finish a batch early start the next one instead of
/// waiting for its slowest (longest) document; more would only hold more batches in memory.
pub(super) const TOKENIZE_IN_FLIGHT: usize = 3;
/// Tokenized batches queued for the writer: packing and writing are much faster than tokenizing,
/// so two absorb a shard's fsync without stalling the pool.
pub(super) const WRITE_QUEUE_BATCHES: usize = 2;
/// Documents in one batch at most, whatever their size: a corpus of tiny documents still gets
/// batches the pool splits cheaply and the writer sees often.
const BATCH_MAX_DOCS: usize = 4096;
/// How often the writer reports progress: often enough for a live bar, rarely enough to cost nothing.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// A document batch as the reader sends it.
pub(super) type DocBatch = Vec<Result<RawDoc>>;

/// A tokenized stream item: the document, or the record's error.
pub(super) type Tokenized = Result<TokenizedDoc>;

/// One tokenized document.
pub(super) struct TokenizedDoc {
    /// The ids; `None` for an empty document.
    ids: Option<Vec<u32>>,
    /// Input bytes it accounts for.
    bytes: u64,
    /// The first document of a source sample (always, for text sources).
    sample_start: bool,
    /// Chat data: 1 for each id that is a training target.
    mask: Option<Vec<u8>>,
}

/// CPU time this thread has used, in seconds.
pub(super) fn thread_cpu_seconds() -> f64 {
    crate::source::thread_cpu_nanos() as f64 * 1e-9
}

/// Stage 1 (its own thread): read the documents in order, skip the first `skip` stream items (a
/// resumed run consumed them), and send batches of about `batch_bytes`. Stops at a fatal error
/// (sent as the last item: any error, or with `skip_bad` one that is not about a single input),
/// when `stop` is set, or when the tokenizer stage hangs up. Returns the per-source counts and the
/// CPU seconds of reading (this thread and the read threads).
pub(super) fn read(
    sources: &[ResolvedSource],
    options: &ReadOptions,
    skip: u64,
    skip_bad: bool,
    batch_bytes: usize,
    tx: Sender<DocBatch>,
    stop: &AtomicBool,
) -> (Vec<SourceInfo>, f64) {
    let mut stream = DocumentStream::new(sources.to_vec(), options.clone());
    let mut batch = vec![];
    let mut bytes = 0usize;
    let mut index = 0u64;
    for item in stream.by_ref() {
        index += 1;
        if index <= skip {
            continue; // consumed by the run this one resumes
        }
        if stop.load(Ordering::Relaxed) {
            batch.clear();
            break;
        }
        let fatal = matches!(&item, Err(e) if !(skip_bad && e.is_skippable()));
        bytes += item.as_ref().map_or(0, |d| d.bytes as usize);
        batch.push(item);
        if bytes >= batch_bytes || batch.len() >= BATCH_MAX_DOCS || fatal {
            if fatal || tx.send(std::mem::take(&mut batch)).is_err() {
                break;
            }
            bytes = 0;
        }
    }
    if !batch.is_empty() {
        let _ = tx.send(batch);
    }
    // The read threads' CPU (several input files read at once) counts as reading too.
    let cpu = stream.read_threads_cpu_seconds() + thread_cpu_seconds();
    (std::mem::take(&mut stream.info), cpu)
}

/// How documents become ids: the shards' tokenizer, the decoder of MDS ids made with another one,
/// and for chat data the template and mask rule.
#[derive(Clone, Copy)]
pub(super) struct Encoders<'a> {
    pub(super) tok: &'a Tokenizer,
    pub(super) retokenize: Option<&'a SourceDecoder>,
    pub(super) chat: Option<&'a ChatSetup>,
}

/// Stage 2 (the calling thread, driving `pool`): tokenize batches, up to [`TOKENIZE_IN_FLIGHT`] at
/// once, and forward the results strictly in submission order. On return the stage is over:
/// `stop` is set and both channels are closed, which ends the other two stages.
pub(super) fn tokenize(
    pool: &rayon::ThreadPool,
    enc: Encoders<'_>,
    rx: Receiver<DocBatch>,
    tx: Sender<Vec<Tokenized>>,
    interrupted: &AtomicBool,
    stop: &AtomicBool,
) {
    pool.in_place_scope(|scope| {
        let mut pending = VecDeque::new();
        let forward = |done: Receiver<Vec<Tokenized>>| -> bool {
            match done.recv() {
                Ok(tokenized) => tx.send(tokenized).is_ok(),
                Err(_) => false,
            }
        };
        for batch in rx.iter() {
            if interrupted.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
                break;
            }
            let (done_tx, done_rx) = bounded::<Vec<Tokenized>>(1);
            scope.spawn(move |_| {
                let tokenized: Vec<Tokenized> = batch
                    .into_par_iter()
                    .map_init(Vec::new, |scratch, doc| match enc.chat {
                        Some(chat) => tokenize_chat(doc, enc.tok, chat, scratch),
                        None => tokenize_document(doc, enc.tok, enc.retokenize, scratch),
                    })
                    .collect();
                let _ = done_tx.send(tokenized);
            });
            pending.push_back(done_rx);
            if pending.len() >= TOKENIZE_IN_FLIGHT {
                if let Some(done) = pending.pop_front() {
                    if !forward(done) {
                        return;
                    }
                }
            }
        }
        while let Some(done) = pending.pop_front() {
            if interrupted.load(Ordering::Relaxed) || !forward(done) {
                return;
            }
        }
    });
    stop.store(true, Ordering::Relaxed);
    drop(tx);
    drop(rx);
}

/// One document's ids: BOS and EOS added to text; pre-tokenized ids checked against the
/// vocabulary of their tokenizer, and decoded and re-encoded when `retokenize` is set.
fn tokenize_document(
    doc: Result<RawDoc>,
    tok: &Tokenizer,
    retokenize: Option<&SourceDecoder>,
    scratch: &mut Vec<tokenizers::pipeline::PipelineToken>,
) -> Tokenized {
    let RawDoc {
        path,
        location,
        content,
        bytes,
    } = doc?;
    let mut encode = |text: &str| -> Result<Option<Vec<u32>>> {
        if text.is_empty() {
            return Ok(None);
        }
        tok.encode_document(text, scratch).map(Some).map_err(|e| {
            DataError::bad_record(&*path, &location, format!("the tokenizer failed: {e}"))
        })
    };
    let mut sample_start = true;
    let ids = match content {
        Content::Text(text) => encode(&text)?,
        // Decoded here, on the tokenizer threads (see `Content::JsonLine`).
        Content::JsonLine(line) => encode(&line.decode()?)?,
        Content::Tokens {
            ids,
            first_in_sample,
        } => {
            sample_start = first_in_sample;
            match retokenize {
                None => {
                    let tokenizer = (tok.name(), tok.vocab_size());
                    check_vocabulary(&ids, &tokenizer, &path, &location)?;
                    (!ids.is_empty()).then_some(ids)
                }
                Some(source) => {
                    let tokenizer = (source.tokenizer.name(), source.tokenizer.vocab_size());
                    check_vocabulary(&ids, &tokenizer, &path, &location)?;
                    let text = source.decode(&ids).map_err(|e| {
                        DataError::bad_record(
                            &*path,
                            &location,
                            format!("decoding with the source tokenizer failed: {e}"),
                        )
                    })?;
                    encode(&text)?
                }
            }
        }
    };
    Ok(TokenizedDoc {
        ids,
        bytes,
        sample_start,
        mask: None,
    })
}

/// One conversation's ids and loss mask (`pack --chat`): the record's messages rendered with the
/// chat template and tokenized whole.
fn tokenize_chat(
    doc: Result<RawDoc>,
    tok: &Tokenizer,
    chat: &ChatSetup,
    scratch: &mut Vec<tokenizers::pipeline::PipelineToken>,
) -> Tokenized {
    let RawDoc {
        path,
        location,
        content,
        bytes,
    } = doc?;
    let messages = match content {
        Content::JsonLine(line) => {
            crate::chat::parse_messages(line.decode_value()?, &path, &location)?
        }
        Content::Text(text) => crate::chat::parse_messages_text(&text, &path, &location)?,
        Content::Tokens { .. } => {
            return Err(DataError::bad_record(
                &*path,
                &location,
                "--chat reads conversations (messages), and this source holds token ids (MDS)",
            ))
        }
    };
    let (ids, mask) =
        crate::chat::tokenize_conversation(&messages, chat, tok, scratch, &path, &location)?;
    Ok(TokenizedDoc {
        ids: Some(ids),
        bytes,
        sample_start: true,
        mask: Some(mask),
    })
}

/// Pre-tokenized ids must be ids of the tokenizer they are said to be made with.
fn check_vocabulary(ids: &[u32], tok: &(&str, u64), path: &Path, location: &str) -> Result<()> {
    let &(name, vocab) = tok;
    // max() vectorises; the search for the position runs only on failure.
    let out_of_vocab = ids.iter().copied().max().is_some_and(|m| m as u64 >= vocab);
    if let Some(pos) = out_of_vocab
        .then(|| ids.iter().position(|&t| t as u64 >= vocab))
        .flatten()
    {
        return Err(DataError::BadRecord {
            path: path.to_path_buf(),
            location: format!("{location}, token {pos}"),
            what: format!(
                "id {} is outside the vocabulary of {name} (0..{vocab}); pre-tokenized data needs the tokenizer it was made with (--source-tokenizer)",
                ids[pos]
            ),
        });
    }
    Ok(())
}

/// What the writer stage starts from: a fresh packer and journal, or those of a resumed run.
pub(super) struct WriteStart {
    /// The packer (open samples restored on a resume).
    pub(super) packer: Packer,
    /// The journal so far (empty on a fresh run).
    pub(super) journal: Journal,
    /// Samples a resumed run had finished but not yet stored: they are written first.
    pub(super) queued: Vec<PackedSample>,
    /// Total input bytes, for progress.
    pub(super) total_bytes: u64,
    /// The token width of the shards.
    pub(super) dtype: TokenDtype,
    /// Samples carry a loss mask (chat data).
    pub(super) loss_mask: bool,
}

/// Stage 3 (its own thread): pack the tokenized documents and write shards, in order, saving the
/// journal after every shard. On an error it sets `stop` so the other stages end early. Returns the
/// final journal (shards, totals, packer counts) and this thread's CPU seconds.
pub(super) fn write(
    settings: &PackSettings,
    start: WriteStart,
    rx: Receiver<Vec<Tokenized>>,
    interrupted: &AtomicBool,
    stop: &AtomicBool,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> (Result<Journal>, f64) {
    let result = write_all(settings, start, rx, interrupted, on_progress);
    if result.is_err() {
        stop.store(true, Ordering::Relaxed);
    }
    (result, thread_cpu_seconds())
}

fn write_all(
    settings: &PackSettings,
    start: WriteStart,
    rx: Receiver<Vec<Tokenized>>,
    interrupted: &AtomicBool,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<Journal> {
    let skip = start.journal.consumed;
    let bad = BadInputs::new(&start.journal.totals.bad_inputs);
    let mut w = Writer {
        settings,
        shards: {
            let w = ShardSetWriter::new(
                &settings.out,
                start.dtype,
                settings.shard_bytes,
                start.journal.shards.len(),
            );
            if start.loss_mask {
                w.with_loss_mask()
            } else {
                w
            }
        },
        journal: start.journal,
        packer: start.packer,
        in_open_shard: 0,
        faults: Faults::from_env(),
        bad,
        loss_mask: start.loss_mask,
    };
    let mut ready = start.queued;
    let mut progress = Progress {
        total_bytes: start.total_bytes,
        resumed_documents: skip,
        ..Default::default()
    };
    w.update(&mut progress);
    let mut last_report = Instant::now();
    let mut consumed = skip;
    w.write_ready(&mut ready, consumed)?;
    for batch in rx.iter() {
        for item in batch {
            consumed += 1;
            w.take(item, &mut ready, &mut progress)?;
            w.write_ready(&mut ready, consumed)?;
            w.update(&mut progress);
        }
        if last_report.elapsed() >= PROGRESS_INTERVAL {
            on_progress(progress);
            last_report = Instant::now();
        }
    }
    if interrupted.load(Ordering::Relaxed) {
        return Err(DataError::Interrupted);
    }
    w.packer.finish(&mut ready);
    w.write_ready(&mut ready, consumed)?;
    if let Some(info) = w.shards.close_current()? {
        w.journal.shards.push(info);
    }
    w.journal.packer = w.packer.counts;
    w.update(&mut progress);
    on_progress(progress);
    Ok(w.journal)
}

/// The writer stage's state.
struct Writer<'a> {
    settings: &'a PackSettings,
    shards: ShardSetWriter,
    journal: Journal,
    packer: Packer,
    /// Samples already in the shard being written.
    in_open_shard: usize,
    faults: Faults,
    bad: BadInputs,
    loss_mask: bool,
}

/// Finds the skip record's entry for a (file, cause), so that a file with a million bad lines is
/// one entry with its count.
struct BadInputs {
    index: HashMap<(String, &'static str), usize>,
}

impl BadInputs {
    /// The index of `list`: empty on a fresh run, the interrupted run's entries on a resume.
    fn new(list: &[BadInput]) -> BadInputs {
        let index = list
            .iter()
            .enumerate()
            .filter_map(|(k, b)| {
                let cause = Cause::ALL.into_iter().find(|c| c.name() == b.cause)?;
                Some(((b.path.clone(), cause.name()), k))
            })
            .collect();
        BadInputs { index }
    }

    /// Count the skipped input error `e` in `list` (the manifest's `bad_inputs`).
    fn record(&mut self, list: &mut Vec<BadInput>, e: &DataError) {
        let Some((path, cause)) = e.bad_input() else {
            return;
        };
        // Recorded in the manifest as text: escaped where the path is not UTF-8.
        let key = (crate::source::escaped_path(path), cause.name());
        match self.index.get(&key) {
            Some(&k) => list[k].count += 1,
            None => {
                list.push(BadInput {
                    path: key.0.clone(),
                    cause: cause.name().to_string(),
                    count: 1,
                    first: e.to_string(),
                });
                self.index.insert(key, list.len() - 1);
            }
        }
    }
}

impl Writer<'_> {
    /// Account one tokenized stream item: pack a document, or count a skipped one.
    fn take(
        &mut self,
        item: Tokenized,
        ready: &mut Vec<PackedSample>,
        progress: &mut Progress,
    ) -> Result<()> {
        let totals = &mut self.journal.totals;
        match item {
            Ok(TokenizedDoc {
                ids,
                bytes,
                sample_start,
                mask,
            }) => {
                progress.bytes += bytes;
                progress.documents += 1;
                if sample_start {
                    self.packer.start_sample(ready);
                }
                match ids {
                    Some(ids) if ids.len() >= self.settings.min_doc_tokens.max(1) => {
                        totals.documents += 1;
                        self.packer.push(&ids, mask.as_deref(), ready);
                    }
                    _ => totals.skipped_documents += 1,
                }
            }
            Err(e) if e.is_skippable() && self.settings.skip_bad => {
                totals.skipped_documents += 1;
                self.bad.record(&mut totals.bad_inputs, &e);
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// Write the finished samples in `ready` (emptying it). After each finished shard, save the
    /// journal: `consumed` stream items handled, and what is not yet in a shard (the rest of
    /// `ready` and the packer's open samples).
    fn write_ready(&mut self, ready: &mut Vec<PackedSample>, consumed: u64) -> Result<()> {
        for k in 0..ready.len() {
            let s = &ready[k];
            let totals = &mut self.journal.totals;
            totals.samples += 1;
            totals.tokens += s.tokens.len() as u64;
            totals.pieces += s.pieces.len() as u64;
            totals.unused_slots += (self.settings.seq_len - s.tokens.len()) as u64;
            self.faults
                .before_sample(self.journal.shards.len(), self.in_open_shard);
            self.in_open_shard += 1;
            let added = if self.loss_mask {
                self.shards
                    .add_masked_sample(&s.tokens, &s.pieces, &s.mask)?
            } else {
                self.shards.add_sample(&s.tokens, &s.pieces)?
            };
            if let Some(info) = added {
                self.in_open_shard = 0;
                self.journal.shards.push(info);
                self.journal.consumed = consumed;
                self.journal.packer = self.packer.counts;
                journal::write(
                    &self.settings.out,
                    &mut self.journal,
                    &ready[k + 1..],
                    self.packer.open_samples(),
                )?;
            }
        }
        ready.clear();
        Ok(())
    }

    /// Copy the written tokens and finished shards into `progress`.
    fn update(&self, progress: &mut Progress) {
        progress.tokens = self.journal.totals.tokens;
        progress.shards = self.journal.shards.len() as u64;
    }
}
