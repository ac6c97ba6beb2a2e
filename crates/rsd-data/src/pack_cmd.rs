//! `rsd-data pack`: its flags, the request they make, and what it prints while and after it runs.
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use rsd_common::mem::{mib, Memory};
use rsd_common::printable::{printable, printable_text};
use rsd_data::pack::{self, Event, Mode, PackReport, PackRequest, PackSettings, Progress, Tail};
use rsd_data::source::Format;
use rsd_data::tokenizer::{id_or_none, Delimiter};

use crate::{default_workers, parse_size, INTERRUPTED};

#[derive(Args)]
pub struct PackArgs {
    /// A source: a directory or file path, or `prolong/<subset>` (book, repo, or any ProLong subset
    /// name) resolved under --data-root. Repeat for several; they are read in the order given.
    /// Formats are detected from names and index files: a directory of .txt/.md (one document per
    /// file), a directory of code repositories (one document per repository), .jsonl[.zst],
    /// .parquet, .arrow or a `datasets.save_to_disk` directory, MosaicML MDS (already tokenized).
    #[arg(long = "src", required = true, value_name = "PATH|prolong/SUBSET")]
    sources: Vec<String>,
    /// Output directory (created; must be empty, an interrupted pack to resume, or --force).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Packing length in tokens (at least 1).
    #[arg(long = "len", default_value_t = 65536, value_parser = parse_len, allow_negative_numbers = true)]
    seq_len: usize,
    /// `fixed`: contiguous windows of exactly --len tokens; `mixed`: whole documents best-fit into
    /// samples of at most --len tokens (documents longer than --len are split), for document-masked
    /// training. Default: fixed; mixed with --chat (the only mode it takes).
    #[arg(long, value_enum)]
    mode: Option<Mode>,
    /// The records are conversations for SFT: `{"messages": [{"role", "content"}, …]}` in JSONL,
    /// Parquet or Arrow. Each is rendered with the model's chat template (the --tokenizer
    /// directory's chat_template.jinja or tokenizer_config.json, or --chat-template-file), tokenized
    /// whole, and packed whole (--mode mixed) with a loss mask saying which tokens are trained on
    /// (--train-on). Without --tokenizer: the bundled Qwen3 tokenizer and its template.
    /// Conversations with an unknown role, without an assistant turn, that the
    /// template refuses, or longer than --len stop the pack, or with --skip-bad are skipped and
    /// counted by cause.
    #[arg(long)]
    chat: bool,
    /// With --chat: which tokens are training targets. `assistant`: every assistant turn, with the
    /// tokens that end it (<|im_end|>, <|eot_id|>); `last-assistant`: the last one only; `all`:
    /// the whole rendered conversation.
    #[arg(long, value_enum, default_value_t = TrainOnArg::Assistant, requires = "chat")]
    train_on: TrainOnArg,
    /// With --chat: a Jinja chat template file to use instead of the tokenizer directory's (its
    /// special tokens still come from the directory's tokenizer_config.json).
    #[arg(long, value_name = "FILE.jinja", requires = "chat")]
    chat_template_file: Option<PathBuf>,
    /// Fixed mode: one window per source sample (an MDS sample, or a document of a text source):
    /// its first --len tokens, the rest dropped and counted (`truncated_tokens`). The paper's Qwen
    /// data: ProLong's 512K samples truncated to 256K (--len 262144 --truncate).
    #[arg(long)]
    truncate: bool,
    /// The tokenizer.json (or a directory holding one) whose ids the shards will hold. Default:
    /// for MDS-only sources the source tokenizer (a repack, ids kept), else the bundled Qwen3
    /// tokenizer. MDS ids of another tokenizer are decoded with --source-tokenizer and re-encoded
    /// with this one, document by document (e.g. ProLong's Llama-3 ids for a Qwen3 model).
    #[arg(long, value_name = "FILE")]
    tokenizer: Option<String>,
    /// The tokenizer.json MDS sources were tokenized with. Default: the Llama-3 tokenizer that
    /// scripts/setup.sh fetches (ProLong's ids).
    #[arg(long, value_name = "FILE")]
    source_tokenizer: Option<String>,
    /// Token put before each document: `auto` (the tokenizer's template, e.g. Llama-3's
    /// <|begin_of_text|>), `none`, a token string or an id.
    #[arg(long, default_value = "auto")]
    bos: String,
    /// Token put after each document: `auto` (<|end_of_text|>, <|endoftext|>, </s>… as the tokenizer has), `none`, a token or an id.
    #[arg(long, default_value = "auto")]
    eos: String,
    /// Force the format of every --src instead of detecting it.
    #[arg(long, value_enum)]
    format: Option<Format>,
    /// JSONL field, or Parquet/Arrow column, that holds the text (default `text`; `messages` with
    /// --chat).
    #[arg(long)]
    text_field: Option<String>,
    /// Where `prolong/<subset>` is looked up (the folder holding prolong-data-64K / -512K).
    /// Default: $RSD_DATA_ROOT, else ./datasets.
    #[arg(long, value_name = "DIR")]
    data_root: Option<PathBuf>,
    /// The last partial window in fixed mode: drop it, keep it as a shorter sample, or pad it.
    #[arg(long, value_enum, default_value_t = Tail::Drop)]
    tail: Tail,
    /// Id used by --tail pad (default: the EOS id).
    #[arg(long)]
    pad_id: Option<u32>,
    /// Skip documents with fewer tokens than this (BOS/EOS included).
    #[arg(long, default_value_t = 1)]
    min_doc_tokens: usize,
    /// Target size of each .bin file, e.g. 1GiB, 256MiB, or bytes.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    shard_size: u64,
    /// Open samples kept by the mixed-mode best-fit packer (memory: this × --len × 4 bytes).
    #[arg(long, default_value_t = 64)]
    max_open_bins: usize,
    /// Tokenizer threads (the output is identical for any value).
    #[arg(long, default_value_t = default_workers())]
    workers: usize,
    /// Input files read at once, each by its own thread; documents still come out in file order,
    /// so the output is identical for any value. One thread reads (and decompresses) text for
    /// several tokenizer threads (docs/DATA.md): the default is one per 4 cores.
    #[arg(long, default_value_t = default_read_threads())]
    read_threads: usize,
    /// Skip bad input instead of stopping at the first: bad records (malformed JSON lines,
    /// invalid UTF-8, missing or null text fields, bad MDS samples) and the unreadable rest of
    /// broken files (truncated or corrupt .zst, Parquet, Arrow or MDS shards, files not in the
    /// format their name says, dangling links, files the OS will not read). What is readable is
    /// kept, e.g. the lines of a .zst before the damage. Counted per file and cause, listed at the
    /// end and recorded in the manifest (totals.bad_inputs). Errors that are not about one input
    /// (the output, the tokenizer, a full disk) still stop the pack.
    #[arg(long)]
    skip_bad: bool,
    /// The most bytes one document may have: a JSONL line, a text file, a code repository, a
    /// Parquet/Arrow text value, an MDS document's token ids. A larger one is a bad record (an
    /// error naming the file and line, or skipped and counted with --skip-bad), read through
    /// without being held in memory where the format allows (JSONL lines, zstd included). The
    /// default, 256MiB, is far above any real document. Takes 64MiB, 1GiB, or bytes.
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    max_doc_bytes: u64,
    /// The most bytes of documents one JSONL (zstd), Parquet or Arrow file may decode to per
    /// byte it stores, plus 16 MiB whatever its size. Real corpora expand 3 to 30 times; a
    /// crafted file (a zstd or Parquet bomb, values repeated from one page or dictionary) can
    /// expand millions of times and cost time and disk without end. A file that goes past it is
    /// a bad file naming it and the bound (skipped with --skip-bad, its earlier documents kept).
    #[arg(long, default_value_t = rsd_data::source::DEFAULT_MAX_EXPANSION,
        value_parser = clap::value_parser!(u64).range(1..))]
    max_expansion: u64,
    /// Start over: overwrite a complete output, or discard an interrupted one (its journal is not
    /// read, so a damaged one is no obstacle; links in --out are removed, never followed).
    #[arg(long)]
    force: bool,
    /// Progress display: a bar on a terminal, plain lines otherwise.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    progress: ProgressMode,
    /// Seconds between plain progress lines (0.1 to 86400).
    #[arg(long, default_value_t = 10.0, value_parser = interval_seconds)]
    progress_interval: f64,
}

/// `--progress-interval`: a finite number of seconds from 0.1 to a day.
fn interval_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (0.1..=86_400.0).contains(&v) => Ok(v),
        _ => Err(format!("expected seconds from 0.1 to 86400, got '{s}'")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ProgressMode {
    Auto,
    Bar,
    Lines,
    None,
}

fn default_read_threads() -> usize {
    (default_workers() / 4).clamp(1, 16)
}

/// `--train-on` (clap's side of [`rsd_chat::TrainOn`]).
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum TrainOnArg {
    Assistant,
    LastAssistant,
    All,
}

impl From<TrainOnArg> for rsd_chat::TrainOn {
    fn from(a: TrainOnArg) -> Self {
        match a {
            TrainOnArg::Assistant => rsd_chat::TrainOn::Assistant,
            TrainOnArg::LastAssistant => rsd_chat::TrainOn::LastAssistant,
            TrainOnArg::All => rsd_chat::TrainOn::All,
        }
    }
}

/// `--len`: a whole number of tokens, at least 1.
fn parse_len(s: &str) -> std::result::Result<usize, String> {
    match s.trim().parse::<i128>() {
        Ok(n) if n >= 1 => usize::try_from(n)
            .map_err(|_| format!("{n} tokens is more than this machine can address")),
        Ok(n) => Err(format!(
            "{n} is not a packing length: --len is the number of tokens per sample, at least 1"
        )),
        Err(_) => Err(format!(
            "\"{s}\" is not a number of tokens: --len takes a whole number, at least 1 (e.g. 8192)"
        )),
    }
}

pub fn pack(a: PackArgs) -> Result<()> {
    let request = PackRequest {
        sources: a.sources,
        format: a.format,
        data_root: a.data_root,
        tokenizer: a.tokenizer,
        source_tokenizer: a.source_tokenizer,
        bos: Delimiter::parse(&a.bos),
        eos: Delimiter::parse(&a.eos),
        text_field: a
            .text_field
            .unwrap_or_else(|| if a.chat { "messages" } else { "text" }.to_string()),
        read_threads: a.read_threads,
        max_doc_bytes: a.max_doc_bytes,
        max_expansion: a.max_expansion,
        chat: a.chat.then(|| pack::ChatRequest {
            template: a.chat_template_file.clone(),
            train_on: a.train_on.into(),
        }),
        settings: PackSettings {
            out: a.out,
            seq_len: a.seq_len,
            mode: a
                .mode
                .unwrap_or(if a.chat { Mode::Mixed } else { Mode::Fixed }),
            truncate: a.truncate,
            tail: a.tail,
            pad_id: a.pad_id,
            min_doc_tokens: a.min_doc_tokens,
            shard_bytes: a.shard_size,
            max_open: a.max_open_bins,
            skip_bad: a.skip_bad,
            force: a.force,
            workers: a.workers,
            batch_bytes: pack::DEFAULT_BATCH_BYTES,
            command: std::env::args().collect(),
        },
    };
    let mut display = ProgressDisplay::new(a.progress, a.progress_interval);
    let result = pack::run(&request, &INTERRUPTED, &mut |event| match event {
        Event::Llama3Tokenizer(path) => eprintln!(
            "tokenizer: MDS sources hold Llama-3 ids (ProLong); using {}",
            printable(&path.display().to_string())
        ),
        Event::Start(inputs, settings) => {
            print_pack_start(inputs, settings);
            display.start(inputs.sources.iter().map(|s| s.bytes).sum());
        }
        Event::Progress(p) => display.update(p),
    });
    display.finish();
    print_pack_report(&request.settings.out, &result?);
    Ok(())
}

fn print_pack_start(inputs: &pack::Inputs, settings: &PackSettings) {
    let tok = &inputs.tokenizer;
    if let Some(reason) = &tok.fallback_reason {
        eprintln!("warning: the fast encoder cannot use {} ({}); using tokenizers 0.22 instead (slower, same ids)", printable(tok.name()), printable(reason));
    }
    eprintln!(
        "packing {} source(s) with {} (vocab {}, BOS {}, EOS {}) into {} [{} mode, length {}, {} workers, read threads: {}]",
        inputs.sources.len(),
        printable(tok.name()),
        tok.vocab_size(),
        id_or_none(tok.bos()),
        id_or_none(tok.eos()),
        settings.out.display(),
        if settings.mode == Mode::Fixed { "fixed" } else { "mixed" },
        settings.seq_len,
        settings.workers,
        inputs.read.read_threads
    );
    if let Some(source) = &inputs.retokenize {
        eprintln!(
            "re-tokenizing MDS ids: each document decoded with {} (vocab {}), encoded with {}",
            printable(source.tokenizer.name()),
            source.tokenizer.vocab_size(),
            printable(tok.name())
        );
    }
    for s in &inputs.sources {
        eprintln!(
            "  {} → {} [{}], {} input(s), {:.1} MB",
            printable(&s.spec),
            printable(&s.path.display().to_string()),
            s.format.name(),
            s.inputs.len(),
            s.bytes as f64 / 1e6
        );
        // Warnings name files found in the sources and quote their contents.
        for w in s.warnings.iter().take(WARNINGS_SHOWN) {
            eprintln!("warning: {}", printable_text(w));
        }
        if s.warnings.len() > WARNINGS_SHOWN {
            eprintln!(
                "warning: … and {} more like these under {}",
                s.warnings.len() - WARNINGS_SHOWN,
                printable(&s.path.display().to_string())
            );
        }
    }
}

/// The pack's progress on stderr: a bar, plain lines every `interval`, or nothing.
struct ProgressDisplay {
    mode: ProgressMode,
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
    start: Instant,
    interval: Duration,
    last_line: Instant,
}

impl ProgressDisplay {
    fn new(mode: ProgressMode, interval_seconds: f64) -> ProgressDisplay {
        ProgressDisplay {
            mode,
            bar: None,
            lines: false,
            start: Instant::now(),
            interval: Duration::from_secs_f64(interval_seconds.max(0.1)),
            last_line: Instant::now(),
        }
    }

    /// The pack starts, over `total_bytes` of input.
    fn start(&mut self, total_bytes: u64) {
        let show_bar = match self.mode {
            ProgressMode::Auto => std::io::stderr().is_terminal(),
            ProgressMode::Bar => true,
            _ => false,
        };
        self.lines =
            self.mode == ProgressMode::Lines || (self.mode == ProgressMode::Auto && !show_bar);
        self.bar = show_bar.then(|| {
            let bar = indicatif::ProgressBar::new(total_bytes.max(1));
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ETA {eta} {msg}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        });
        self.start = Instant::now();
        self.last_line = Instant::now();
    }

    fn update(&mut self, p: Progress) {
        let secs = self.start.elapsed().as_secs_f64().max(1e-9);
        let (docs_s, toks_s) = (p.documents as f64 / secs, p.tokens as f64 / secs);
        if let Some(bar) = &self.bar {
            bar.set_length(p.total_bytes.max(1));
            bar.set_position(p.bytes);
            bar.set_message(format!(
                "{:.0} docs/s {:.2} M tok/s, {} shards",
                docs_s,
                toks_s / 1e6,
                p.shards
            ));
        } else if self.lines && self.last_line.elapsed() >= self.interval {
            self.last_line = Instant::now();
            let pct = if p.total_bytes > 0 {
                100.0 * p.bytes as f64 / p.total_bytes as f64
            } else {
                0.0
            };
            let eta = if p.bytes > 0 {
                secs * (p.total_bytes.saturating_sub(p.bytes)) as f64 / p.bytes as f64
            } else {
                0.0
            };
            eprintln!(
                "[{:>7.1}s] {pct:5.1}% of input, {} docs ({docs_s:.0}/s), {} tokens ({:.2} M/s), {} shards, ETA {eta:.0}s",
                secs, p.documents, p.tokens, toks_s / 1e6, p.shards
            );
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

fn print_pack_report(out: &Path, report: &PackReport) {
    let m = &report.manifest;
    let t = &m.totals;
    let slots = (t.samples * m.seq_len).max(1) as f64;
    let input_bytes: u64 = m.sources.iter().map(|s| s.bytes).sum();
    println!(
        "wrote {}: {} shards, {} samples, {} tokens ({})",
        out.display(),
        m.shards.len(),
        t.samples,
        t.tokens,
        m.dtype.name()
    );
    println!(
        "  documents  {} packed, {} skipped; {} pieces",
        t.documents, t.skipped_documents, t.pieces
    );
    println!(
        "  waste      {:.2}% padding, {:.2}% unused slots, {} tokens dropped with the tail",
        100.0 * t.padding_tokens as f64 / slots,
        100.0 * t.unused_slots as f64 / slots,
        t.dropped_tokens
    );
    println!(
        "  time       {:.2}s: {:.2} M tokens/s, {:.1} MB/s of input{}; peak RSS {:.0} MiB",
        report.seconds,
        t.tokens as f64 / report.seconds / 1e6,
        input_bytes as f64 / report.seconds / 1e6,
        if report.resumed_shards > 0 {
            format!(" (resumed after {} shards)", report.resumed_shards)
        } else {
            String::new()
        },
        mib(Memory::now().peak_rss)
    );
    let cpu = report.cpu;
    println!(
        "  cpu        tokenize {:.3}s, read {:.3}s, pack+write {:.3}s: tokenizing is {:.0}% of the CPU time",
        cpu.tokenize,
        cpu.read,
        cpu.write,
        100.0 * cpu.tokenize / (cpu.tokenize + cpu.read + cpu.write).max(1e-9)
    );
    if t.truncated_tokens > 0 {
        println!(
            "  truncated  {} tokens dropped after the first window of each source sample (--truncate)",
            t.truncated_tokens
        );
    }
    print_bad_inputs(&t.bad_inputs);
}

/// Warnings printed per source when its inputs are listed.
const WARNINGS_SHOWN: usize = 20;

/// Bad input lines printed at the end of a pack; the manifest lists all of them.
const BAD_INPUTS_SHOWN: usize = 50;

/// What `--skip-bad` skipped: totals per cause, then each file and cause with its first error.
fn print_bad_inputs(bad: &[rsd_shard::BadInput]) {
    if bad.is_empty() {
        return;
    }
    let mut by_cause: Vec<(&str, u64)> = vec![];
    for b in bad {
        match by_cause.iter_mut().find(|(c, _)| *c == b.cause) {
            Some((_, n)) => *n += b.count,
            None => by_cause.push((&b.cause, b.count)),
        }
    }
    // Causes and first errors quote the bad input: escape its control characters.
    let causes: Vec<String> = by_cause
        .iter()
        .map(|(c, n)| format!("{n} {}", printable(c)))
        .collect();
    let mut files: Vec<&str> = bad.iter().map(|b| b.path.as_str()).collect();
    files.sort_unstable();
    files.dedup();
    println!(
        "  bad input  skipped with --skip-bad in {} file(s): {}",
        files.len(),
        causes.join(", ")
    );
    for b in bad.iter().take(BAD_INPUTS_SHOWN) {
        println!(
            "    {} ×{}: {}",
            printable(&b.cause),
            b.count,
            printable_text(&b.first)
        );
    }
    if bad.len() > BAD_INPUTS_SHOWN {
        println!(
            "    … and {} more (all of them are in index.json, totals.bad_inputs)",
            bad.len() - BAD_INPUTS_SHOWN
        );
    }
}
