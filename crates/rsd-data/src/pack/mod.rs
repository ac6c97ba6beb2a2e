//! `rsd-data pack` as one library call: [`run`] resolves the sources and the tokenizer, runs the
//! three stages (read → tokenize → pack and write, in `stages`), keeps the resume journal after
//! every shard (`journal`), and writes the manifest last.
//!
//! The output bytes depend only on the inputs and the [`PackSettings`] that enter the journal's
//! fingerprint, never on the thread counts. An interrupted run (Ctrl-C, a crash, a full disk)
//! leaves its completed shards and a journal; rerunning the same request resumes it and produces
//! the bytes an uninterrupted run would have (docs/FORMAT.md).

mod fault;
mod journal;
mod stages;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use crossbeam_channel::bounded;
use rsd_shard::{Manifest, TokenDtype, TokenizerInfo};

use crate::chat::ChatSetup;
use crate::error::{DataError, Result};
use crate::packer::Packer;
pub use crate::packer::{Mode, Tail};
use crate::paths;
use crate::source::{self, Format, ReadOptions, ResolvedSource};
use crate::tokenizer::{Delimiter, SourceDecoder, Tokenizer, BUNDLED_NAME};
use journal::Journal;
use stages::{DocBatch, Tokenized, WriteStart};

/// Input bytes per batch handed to the tokenizer threads: large enough that a batch's hand-offs
/// cost nothing next to tokenizing it, small enough that the batches in flight stay tens of MB.
pub const DEFAULT_BATCH_BYTES: usize = 4 << 20;

/// A pack as the user asks for it: plain values, nothing resolved or opened yet.
#[derive(Debug, Clone)]
pub struct PackRequest {
    /// The sources in reading order: paths, or `prolong/<subset>` looked up under `data_root`.
    pub sources: Vec<String>,
    /// Force this format for every source instead of detecting it.
    pub format: Option<Format>,
    /// Where `prolong/<subset>` is looked up; `None`: see [`paths::data_root`].
    pub data_root: Option<PathBuf>,
    /// A `tokenizer.json` (or a directory holding one) for the shards' ids; `None`: the source
    /// tokenizer when every source is MDS (a repack), else the bundled Qwen3 tokenizer.
    pub tokenizer: Option<String>,
    /// The tokenizer MDS sources' ids were made with; `None`: the Llama-3 tokenizer (ProLong's).
    /// When it differs from `tokenizer`, MDS documents are decoded with it and re-encoded.
    pub source_tokenizer: Option<String>,
    /// Token put before each document.
    pub bos: Delimiter,
    /// Token put after each document.
    pub eos: Delimiter,
    /// JSONL field, or Parquet/Arrow column, holding the text.
    pub text_field: String,
    /// Input files read at once (at least 1), each by its own thread.
    pub read_threads: usize,
    /// The most bytes one document may have; a larger one is a bad record
    /// ([`source::DEFAULT_MAX_DOC_BYTES`]).
    pub max_doc_bytes: u64,
    /// Decoded bytes per stored byte one input file may yield
    /// ([`source::DEFAULT_MAX_EXPANSION`], [`source::expansion_limit`]).
    pub max_expansion: u64,
    /// Records are conversations to pack for SFT (`--chat`), with a loss mask per token.
    pub chat: Option<ChatRequest>,
    /// How the documents are packed and written.
    pub settings: PackSettings,
}

/// `rsd-data pack --chat`: where the chat template comes from and which tokens are trained on.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    /// A Jinja file; `None`: the template of the tokenizer's directory (`chat_template.jinja`, or
    /// `chat_template` in its `tokenizer_config.json`).
    pub template: Option<PathBuf>,
    /// Which tokens are training targets.
    pub train_on: rsd_chat::TrainOn,
}

/// Everything besides the inputs that a pack is told: packing, output, threads.
#[derive(Debug, Clone)]
pub struct PackSettings {
    /// Output directory.
    pub out: PathBuf,
    /// Packing length in tokens.
    pub seq_len: usize,
    /// `fixed` or `mixed`.
    pub mode: Mode,
    /// `fixed` mode: keep only the first window of each source sample (see [`Packer::truncating`]).
    pub truncate: bool,
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
    /// Input bytes per batch handed to the tokenizer threads ([`DEFAULT_BATCH_BYTES`]).
    pub batch_bytes: usize,
    /// The command line, for the manifest.
    pub command: Vec<String>,
}

/// The resolved inputs of a pack: the sources with their files, how they are read, the tokenizer.
pub struct Inputs {
    /// Resolved sources, in order.
    pub sources: Vec<ResolvedSource>,
    /// How sources are read.
    pub read: ReadOptions,
    /// The loaded tokenizer with its BOS and EOS.
    pub tokenizer: Tokenizer,
    /// Set when MDS ids are re-tokenized: the tokenizer they were made with, to decode them.
    pub retokenize: Option<SourceDecoder>,
    /// Set for chat data (`--chat`): the template and mask rule.
    pub chat: Option<ChatSetup>,
}

/// What [`run`] tells its caller while it works, in this order.
pub enum Event<'a> {
    /// MDS sources and no --source-tokenizer: their ids are taken to be Llama-3's, from this file.
    Llama3Tokenizer(&'a Path),
    /// The inputs are resolved and the tokenizer loaded; nothing is written yet.
    Start(&'a Inputs, &'a PackSettings),
    /// Progress, a few times a second and once at the end (from the writer thread).
    Progress(Progress),
}

/// Progress numbers.
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
pub struct PackReport {
    /// The manifest written.
    pub manifest: Manifest,
    /// Wall time in seconds, from the start of the stages (sources and tokenizer already loaded).
    pub seconds: f64,
    /// Shards reused from an interrupted run.
    pub resumed_shards: usize,
    /// CPU seconds spent by each stage.
    pub cpu: StageCpu,
}

/// CPU seconds per stage: what the run cost besides tokenizing, independent of how busy
/// the machine was (wall-clock rates on a shared machine move a lot more than these).
#[derive(Debug, Clone, Copy, Default)]
pub struct StageCpu {
    /// The reader thread and the read threads: file reads, decompression, splitting into documents.
    pub read: f64,
    /// The tokenizer threads: decoding records (JSON, UTF-8) and tokenizing.
    pub tokenize: f64,
    /// The writer thread: packing, checksums, writes, fsyncs, the resume journal.
    pub write: f64,
}

/// Run a pack: resolve the request's sources and tokenizer, pack, write the manifest. `interrupted`
/// is polled between batches (the completed shards are kept for a resume); `on_event` hears about
/// the tokenizer choice, the start, and progress.
pub fn run(
    request: &PackRequest,
    interrupted: &AtomicBool,
    on_event: &mut (dyn FnMut(Event<'_>) + Send),
) -> Result<PackReport> {
    let inputs = resolve(request, on_event)?;
    on_event(Event::Start(&inputs, &request.settings));
    pack(&inputs, &request.settings, interrupted, &mut |p| {
        on_event(Event::Progress(p))
    })
}

/// The request's sources, read options and tokenizer.
fn resolve(request: &PackRequest, on_event: &mut dyn FnMut(Event<'_>)) -> Result<Inputs> {
    let root = paths::data_root(request.data_root.as_deref(), paths::CORPORA_DEFAULT);
    let sources = request
        .sources
        .iter()
        .map(|s| source::resolve(s, request.format, &root, request.settings.seq_len as u64))
        .collect::<Result<Vec<_>>>()?;
    let (tokenizer, retokenize) = choose_tokenizers(request, &sources, on_event)?;
    let chat = request
        .chat
        .as_ref()
        .map(|c| chat_setup(request, c))
        .transpose()?;
    Ok(Inputs {
        sources,
        read: ReadOptions {
            text_field: request.text_field.clone(),
            read_threads: request.read_threads.max(1),
            max_doc_bytes: request.max_doc_bytes,
            chat: chat.is_some(),
            max_expansion: request.max_expansion,
        },
        tokenizer,
        retokenize,
        chat,
    })
}

/// The chat template (from `--chat-template`, else the tokenizer's directory) and mask rule.
fn chat_setup(request: &PackRequest, chat: &ChatRequest) -> Result<ChatSetup> {
    if request.settings.mode != Mode::Mixed {
        return Err(DataError::Config(format!(
            "--chat packs whole conversations into rows (--mode mixed); --mode {} would cut them",
            request.settings.mode
        )));
    }
    let bundled = match request.tokenizer.as_deref() {
        None => true,
        Some(spec) => spec == BUNDLED_NAME || spec == "bundled",
    };
    let template = if bundled {
        let config: serde_json::Value =
            serde_json::from_str(crate::tokenizer::BUNDLED_QWEN3_CONFIG).map_err(|e| {
                DataError::Config(format!("the bundled Qwen3 tokenizer_config.json: {e}"))
            })?;
        rsd_chat::ChatTemplate::from_config(
            &config,
            "the bundled Qwen3 tokenizer_config.json",
            chat.template.as_deref(),
        )
    } else {
        // The template sits beside the tokenizer: --tokenizer names a directory or a file in one.
        let spec = Path::new(request.tokenizer.as_deref().unwrap_or_default());
        let dir = if spec.is_dir() {
            spec.to_path_buf()
        } else {
            spec.parent().map(Path::to_path_buf).unwrap_or_default()
        };
        match &chat.template {
            Some(file) => rsd_chat::ChatTemplate::from_file_with_tokens(file, &dir),
            None => rsd_chat::ChatTemplate::from_dir(&dir),
        }
    }
    .map_err(|e| DataError::Config(e.to_string()))?;
    Ok(ChatSetup {
        template,
        train_on: chat.train_on,
        max_tokens: request.settings.seq_len,
    })
}

/// The shards' tokenizer, and the source tokenizer to decode MDS ids with when it differs.
///
/// MDS sources hold ids of the source tokenizer (`--source-tokenizer`, default Llama-3, as
/// ProLong's are). Without `--tokenizer` an all-MDS pack keeps them (a repack, recorded with the
/// source tokenizer); with a different `--tokenizer` every MDS document is decoded and re-encoded.
/// Text sources are encoded with `--tokenizer` (default the bundled Qwen3).
fn choose_tokenizers(
    request: &PackRequest,
    sources: &[ResolvedSource],
    on_event: &mut dyn FnMut(Event<'_>),
) -> Result<(Tokenizer, Option<SourceDecoder>)> {
    let any_mds = sources.iter().any(|s| s.format == Format::Mds);
    let all_mds = !sources.is_empty() && sources.iter().all(|s| s.format == Format::Mds);
    if !any_mds {
        if request.source_tokenizer.is_some() {
            return Err(DataError::Config(
                "--source-tokenizer names the tokenizer of pre-tokenized (MDS) sources, and no \
                 --src is MDS: use --tokenizer for text sources"
                    .into(),
            ));
        }
        let spec = request.tokenizer.as_deref().unwrap_or(BUNDLED_NAME);
        return Ok((Tokenizer::load(spec, &request.bos, &request.eos)?, None));
    }
    let source_spec = match &request.source_tokenizer {
        Some(t) => t.clone(),
        None => {
            let llama3 = paths::llama3_tokenizer();
            if !llama3.is_file() {
                return Err(DataError::Config(format!(
                    "MDS sources are already tokenized, and their ids are taken to be Llama-3's \
                     (ProLong's) unless --source-tokenizer names the tokenizer they were made with. \
                     {} is missing: run scripts/setup.sh to fetch it, or pass --source-tokenizer FILE",
                    llama3.display()
                )));
            }
            on_event(Event::Llama3Tokenizer(&llama3));
            llama3.display().to_string()
        }
    };
    let source = Tokenizer::load(&source_spec, &request.bos, &request.eos)?;
    let target = match &request.tokenizer {
        None if all_mds => return Ok((source, None)),
        None => Tokenizer::load(BUNDLED_NAME, &request.bos, &request.eos)?,
        Some(spec) => Tokenizer::load(spec, &request.bos, &request.eos)?,
    };
    if target.sha256() == source.sha256() {
        return Ok((target, None));
    }
    Ok((target, Some(SourceDecoder::new(source)?)))
}

/// Writes one of the pack's own files atomically; its errors are output errors, which
/// `--skip-bad` never counts as bad inputs.
fn write_output(path: &Path, bytes: &[u8]) -> Result<()> {
    rsd_common::safe_fs::write_file_atomic(path, bytes).map_err(DataError::OutputFile)
}

/// Pack resolved inputs: check the output directory (fresh, resume or refuse), run the stages,
/// write the manifest, remove the journal.
fn pack(
    inputs: &Inputs,
    settings: &PackSettings,
    interrupted: &AtomicBool,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<PackReport> {
    let start = Instant::now();
    let tok = &inputs.tokenizer;
    if settings.seq_len == 0 {
        return Err(DataError::Config(
            "--len is 0: it is the number of tokens per sample, at least 1".into(),
        ));
    }
    if settings.truncate && settings.mode != Mode::Fixed {
        return Err(DataError::Config(format!(
            "--truncate keeps the first --len tokens of each source sample as one fixed-length \
             window; it does not apply to --mode {}",
            settings.mode
        )));
    }
    let dtype = TokenDtype::for_vocab(tok.vocab_size());
    let pad_id = match (settings.tail, settings.pad_id.or(tok.eos())) {
        (Tail::Pad, None) => {
            return Err(DataError::Config(
                "--tail pad needs --pad-id (the tokenizer has no EOS to default to)".into(),
            ))
        }
        (_, p) => p,
    };
    let fp = journal::fingerprint(inputs, settings);
    let resume = journal::prepare_output(settings, &fp, inputs.read.max_doc_bytes)?;
    let resumed_shards = resume.as_ref().map_or(0, |(j, _, _)| j.shards.len());

    let mut write_start = WriteStart {
        packer: Packer::new(
            settings.mode,
            settings.seq_len,
            settings.tail,
            pad_id.unwrap_or(0),
            settings.max_open,
        )
        .truncating(settings.truncate),
        journal: Journal::new(fp),
        queued: vec![],
        total_bytes: inputs.sources.iter().map(|s| s.bytes).sum(),
        dtype,
        loss_mask: inputs.chat.is_some(),
    };
    if let Some((j, queued, open)) = resume {
        write_start.packer.restore(open, j.packer);
        write_start.queued = queued;
        write_start.journal = j;
    }
    let (journal, source_info, cpu) =
        run_stages(inputs, settings, write_start, interrupted, on_progress)?;
    if interrupted.load(Ordering::Relaxed) {
        return Err(DataError::Interrupted);
    }
    let journal = journal?;
    if journal.shards.is_empty() {
        let bad = &journal.totals.bad_inputs;
        let bad = match bad.first() {
            Some(first) => format!(
                "; --skip-bad skipped bad input in {} place(s), the first: {}",
                bad.len(),
                first.first
            ),
            None => String::new(),
        };
        return Err(DataError::Config(format!(
            "nothing to write: {} documents read, {} skipped, {} tokens dropped with the tail (shorter than --len {}?){bad}",
            journal.totals.documents + journal.totals.skipped_documents,
            journal.totals.skipped_documents,
            journal.packer.dropped_tokens,
            settings.seq_len
        )));
    }
    let manifest = manifest(inputs, settings, dtype, pad_id, &journal, source_info);
    // The tokenizer goes in before the manifest, which marks the directory complete.
    write_output(
        &settings.out.join(rsd_shard::TOKENIZER_FILE),
        tok.json_bytes(),
    )?;
    manifest.write(&settings.out)?;
    journal::remove(&settings.out)?;
    Ok(PackReport {
        manifest,
        seconds: start.elapsed().as_secs_f64(),
        resumed_shards,
        cpu,
    })
}

/// Run the three stages to the end: the writer's final journal (or its error), the per-source
/// counts, and the CPU time of each stage.
fn run_stages(
    inputs: &Inputs,
    settings: &PackSettings,
    write_start: WriteStart,
    interrupted: &AtomicBool,
    on_progress: &mut (dyn FnMut(Progress) + Send),
) -> Result<(Result<Journal>, Vec<rsd_shard::SourceInfo>, StageCpu)> {
    let skip = write_start.journal.consumed;
    let stop = AtomicBool::new(false);
    let (doc_tx, doc_rx) = bounded::<DocBatch>(stages::READ_QUEUE_BATCHES);
    let (tok_tx, tok_rx) = bounded::<Vec<Tokenized>>(stages::WRITE_QUEUE_BATCHES);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(settings.workers.max(1))
        .build()
        .map_err(|e| {
            DataError::Config(format!(
                "cannot start {} worker threads: {e}",
                settings.workers
            ))
        })?;
    std::thread::scope(|scope| {
        let stop = &stop;
        let reader = scope.spawn(move || {
            stages::read(
                &inputs.sources,
                &inputs.read,
                skip,
                settings.skip_bad,
                settings.batch_bytes,
                doc_tx,
                stop,
            )
        });
        let writer = scope.spawn(move || {
            stages::write(
                settings,
                write_start,
                tok_rx,
                interrupted,
                stop,
                on_progress,
            )
        });
        stages::tokenize(
            &pool,
            stages::Encoders {
                tok: &inputs.tokenizer,
                retokenize: inputs.retokenize.as_ref(),
                chat: inputs.chat.as_ref(),
            },
            doc_rx,
            tok_tx,
            interrupted,
            stop,
        );
        let (journal, write_cpu) = writer
            .join()
            .map_err(|_| DataError::Config("the writer thread panicked".into()))?;
        let (source_info, read_cpu) = reader
            .join()
            .map_err(|_| DataError::Config("the reader thread panicked".into()))?;
        // Every pool thread's CPU time, including the spinning before it sleeps: all of it is
        // the tokenize stage's cost.
        let cpu = StageCpu {
            read: read_cpu,
            tokenize: pool
                .broadcast(|_| stages::thread_cpu_seconds())
                .iter()
                .sum(),
            write: write_cpu,
        };
        Ok((journal, source_info, cpu))
    })
}

/// The manifest of a finished pack.
fn manifest(
    inputs: &Inputs,
    settings: &PackSettings,
    dtype: TokenDtype,
    pad_id: Option<u32>,
    journal: &Journal,
    sources: Vec<rsd_shard::SourceInfo>,
) -> Manifest {
    let mut totals = journal.totals.clone();
    totals.padding_tokens = journal.packer.padding_tokens;
    totals.dropped_tokens = journal.packer.dropped_tokens;
    totals.truncated_tokens = journal.packer.truncated_tokens;
    Manifest {
        format: rsd_shard::FORMAT_NAME.into(),
        version: rsd_shard::FORMAT_VERSION,
        tokenizer: tokenizer_info(&inputs.tokenizer),
        source_tokenizer: inputs
            .retokenize
            .as_ref()
            .map(|d| tokenizer_info(&d.tokenizer)),
        dtype,
        seq_len: settings.seq_len as u64,
        mode: settings.mode,
        pad_id: (totals.padding_tokens > 0).then_some(pad_id).flatten(),
        shards: journal.shards.clone(),
        totals,
        sources,
        loss_mask: inputs.chat.as_ref().map(|c| rsd_shard::LossMaskInfo {
            train_on: c.train_on.name().to_string(),
            chat_template: c.template.source_name().to_string(),
            chat_template_sha256: c.template.sha256().to_string(),
            trained_tokens: journal
                .shards
                .iter()
                .filter_map(|s| s.loss_mask.as_ref())
                .map(|m| m.trained_tokens)
                .sum(),
        }),
        command: settings.command.clone(),
        created_by: format!("rsd-data {}", env!("CARGO_PKG_VERSION")),
    }
}

/// A tokenizer as the manifest records it.
fn tokenizer_info(tok: &Tokenizer) -> TokenizerInfo {
    TokenizerInfo {
        name: tok.name().to_string(),
        sha256: tok.sha256().to_string(),
        vocab_size: tok.vocab_size(),
        bos_id: tok.bos(),
        eos_id: tok.eos(),
    }
}
