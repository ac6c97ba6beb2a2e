//! Sources: where documents come from. Each `--src` resolves to a format and a sorted list of
//! inputs; [`DocumentStream`] reads them in order, one document at a time, so memory does not grow
//! with the corpus.

mod arrow_ipc;
mod code;
mod jsonl;
mod mds;
mod parquet_file;
mod text;
mod thrift_check;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rsd_shard::SourceInfo;

use crate::error::{Cause, DataError, Result};

pub use mds::MdsDataset;

/// A corpus format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A directory of text files (`.txt`, `.md`, …): one document per file.
    Text,
    /// A directory of code repositories: one document per repository.
    Code,
    /// JSON Lines, optionally zstd-compressed (`.jsonl`, `.jsonl.zst`): one document per line.
    Jsonl,
    /// Parquet files: one document per row of the text column.
    Parquet,
    /// Arrow IPC files or streams (what Hugging Face `datasets` writes with `save_to_disk`).
    Arrow,
    /// MosaicML MDS shards with `input_ids` and `indices` (ProLong's format): already tokenized.
    Mds,
}

impl Format {
    /// The name used on the command line and in manifests.
    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Code => "code",
            Format::Jsonl => "jsonl",
            Format::Parquet => "parquet",
            Format::Arrow => "arrow",
            Format::Mds => "mds",
        }
    }
}

/// What a document holds: text to tokenize, ids that are already tokens (MDS), or a JSON Lines
/// record whose text is not decoded yet.
#[derive(Debug)]
pub enum Content {
    /// Text to tokenize; BOS/EOS are added around it.
    Text(String),
    /// Token ids, stored as they are (they carry their own BOS/EOS), or re-tokenized.
    Tokens {
        /// The ids.
        ids: Vec<u32>,
        /// The first document of its source sample (`rsd-data pack --truncate` keeps one window
        /// per source sample).
        first_in_sample: bool,
    },
    /// One JSONL line, decoded by [`Content::decode`] on the tokenizer threads: decoding JSON in the
    /// single reader thread would cap a many-core pack at what that one thread decodes.
    JsonLine(JsonLine),
}

impl Content {
    /// The content with any deferred record decoded (`Text` or `Tokens`); a malformed record is
    /// the error the reader would have reported, naming file, line and field.
    pub fn decode(self) -> Result<Content> {
        match self {
            Content::JsonLine(line) => line.decode().map(Content::Text),
            done => Ok(done),
        }
    }
}

/// One document and where it came from (for messages).
#[derive(Debug)]
pub struct RawDoc {
    /// The input file (or repository directory).
    pub path: Arc<Path>,
    /// Where in it: `line N`, `row N`, `sample N document M`; empty for a whole file.
    pub location: String,
    /// The document.
    pub content: Content,
    /// Input bytes this document accounts for.
    pub bytes: u64,
}

pub use jsonl::JsonLine;

type DocIter = Box<dyn Iterator<Item = Result<RawDoc>> + Send>;

/// The default of `rsd-data pack --max-doc-bytes`: the most bytes one document may have (a JSONL
/// line, a text file, a repository, a Parquet/Arrow value, an MDS document's token ids). Far above
/// any real document (a 512K-token sample is 2 MiB of ids, a long book a few MB of text), low
/// enough that one hostile record cannot exhaust memory.
pub const DEFAULT_MAX_DOC_BYTES: u64 = 256 << 20;

/// The default of `rsd-data pack --max-expansion`: how many bytes of documents one input file of
/// a format that can expand (JSONL with zstd, Parquet, Arrow IPC) may decode to per byte it
/// stores. Real corpora expand far less: zstd and Parquet's codecs take text down 3 to 30 times,
/// a dictionary shares a value among the rows that repeat it, and a text column whose rows repeat
/// one value a thousand times is not a corpus. A crafted file expands millions of times (a
/// 503-byte `DELTA_BYTE_ARRAY` page of 12,000 one-MiB values, a zstd frame of RLE blocks), which
/// costs time and disk without limit though memory stays bounded.
pub const DEFAULT_MAX_EXPANSION: u64 = 1000;

/// What every input file may decode to whatever its size, on top of `--max-expansion` times its
/// size: a small file's fixed overhead (a Parquet footer, a zstd frame header) makes its ratio
/// say little, and 16 MiB is a few seconds of work.
pub const EXPANSION_FLOOR: u64 = 16 << 20;

/// The most bytes a file of `stored` bytes may decode to, with `--max-expansion ratio`.
pub fn expansion_limit(stored: u64, ratio: u64) -> u64 {
    stored.saturating_mul(ratio).saturating_add(EXPANSION_FLOOR)
}

/// The error of a file that decodes past [`expansion_limit`]: a bad file, so `--skip-bad` skips
/// the rest of it.
pub(crate) fn expansion_error(path: &Path, stored: u64, ratio: u64) -> DataError {
    DataError::bad_file(
        path,
        Cause::Corrupt,
        format!(
            "decodes to more than {} bytes, {ratio} times its {stored} stored bytes + {} MiB, \
             the most rsd-data pack decodes from one file (--max-expansion {ratio}); a \
             decompression bomb or a crafted file; the rest of the file is not read (pass a \
             larger --max-expansion if the data is real)",
            expansion_limit(stored, ratio),
            EXPANSION_FLOOR >> 20
        ),
    )
}

/// Options that shape how sources are read.
#[derive(Debug, Clone)]
pub struct ReadOptions {
    /// JSONL field / parquet or arrow column holding the text.
    pub text_field: String,
    /// Input files read at once, each by its own thread (documents still come out in file order).
    /// 1 reads them one after another on the caller's thread.
    pub read_threads: usize,
    /// Documents larger than this many bytes are bad records ([`DEFAULT_MAX_DOC_BYTES`]).
    pub max_doc_bytes: u64,
    /// Records are conversations (`pack --chat`): a Parquet/Arrow `list<struct<role, content>>`
    /// column is read as the JSON of its messages.
    pub chat: bool,
    /// Decoded bytes per stored byte one JSONL, Parquet or Arrow file may yield
    /// ([`DEFAULT_MAX_EXPANSION`], [`expansion_limit`]).
    pub max_expansion: u64,
}

impl ReadOptions {
    /// Read `text_field`, one file at a time, documents up to [`DEFAULT_MAX_DOC_BYTES`].
    pub fn new(text_field: &str) -> ReadOptions {
        ReadOptions {
            text_field: text_field.to_string(),
            read_threads: 1,
            max_doc_bytes: DEFAULT_MAX_DOC_BYTES,
            chat: false,
            max_expansion: DEFAULT_MAX_EXPANSION,
        }
    }
}

/// A `--src` resolved to a format and its inputs.
#[derive(Debug, Clone)]
pub struct ResolvedSource {
    /// The `--src` as given.
    pub spec: String,
    /// The resolved path.
    pub path: PathBuf,
    /// The format.
    pub format: Format,
    /// Inputs in reading order: files, repository directories, or MDS dataset directories.
    pub inputs: Vec<PathBuf>,
    /// Total size of the input files in bytes (for progress).
    pub bytes: u64,
    /// What was left out while listing the inputs and why (links not followed, files seen twice).
    pub warnings: Vec<String>,
}

const TEXT_EXTENSIONS: &[&str] = &["txt", "md", "markdown", "rst", "tex", "text", "org", "adoc"];

/// The ProLong subsets that have a long-document variant, by their short names.
fn prolong_subset(name: &str) -> &str {
    match name {
        "book" | "books" => "book",
        "repo" | "repos" | "code" | "stack" => "thestackv1_concat_by_repo",
        other => other,
    }
}

/// Resolve `prolong/<subset>` under `data_root`: `prolong-data-64K/<subset>-65536` for lengths up
/// to 64K, `prolong-data-512K/<subset>-524288` beyond, or the subset without a length suffix (the
/// short-document subsets).
fn resolve_prolong(subset: &str, data_root: &Path, seq_len: u64) -> Result<PathBuf> {
    let name = prolong_subset(subset);
    let (root64, root512) = (
        data_root.join("prolong-data-64K"),
        data_root.join("prolong-data-512K"),
    );
    let mut candidates = vec![];
    if seq_len > 65536 {
        candidates.push(root512.join(format!("{name}-524288")));
    }
    candidates.push(root64.join(format!("{name}-65536")));
    candidates.push(root64.join(name));
    candidates.push(data_root.join(name));
    if let Some(found) = candidates.iter().find(|c| c.is_dir()) {
        return Ok(found.clone());
    }
    let tried: Vec<String> = candidates
        .iter()
        .map(|c| format!("  {}", c.display()))
        .collect();
    Err(DataError::Config(format!(
        "prolong/{subset}: no ProLong data found. Looked in:\n{}\n\
         ProLong's data (princeton-nlp/prolong-data-64K and -512K) is laid out as\n  \
         <data-root>/prolong-data-64K/book-65536/procNN-64/{{index.json,shard.NNNNN.mds}}\n  \
         <data-root>/prolong-data-64K/thestackv1_concat_by_repo-65536/…\n  \
         <data-root>/prolong-data-512K/book-524288/…\n\
         Download it there, then pass --data-root (or set RSD_DATA_ROOT) to the folder that holds prolong-data-64K.",
        tried.join("\n")
    )))
}

fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

// File names are matched as bytes: on Linux a name need not be UTF-8, and such a file is an
// input like any other (it is only opened by its path), not one to leave out.
fn has_ext(path: &Path, exts: &[&str]) -> bool {
    use std::os::unix::ffi::OsStrExt;
    path.extension().is_some_and(|e| {
        exts.iter()
            .any(|x| x.as_bytes().eq_ignore_ascii_case(e.as_bytes()))
    })
}

/// A path as text: as it is when it is UTF-8; otherwise every byte that is not part of valid
/// UTF-8 written `\xNN` (and a backslash `\\`, so the bytes can be told back), for the places
/// where a file's name is recorded as text (a code repository's file headers).
pub(crate) fn escaped_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if let Ok(s) = std::str::from_utf8(bytes) {
        return s.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    for chunk in bytes.utf8_chunks() {
        out.push_str(&chunk.valid().replace('\\', "\\\\"));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

fn format_of_file(path: &Path) -> Option<Format> {
    use std::os::unix::ffi::OsStrExt;
    let name = String::from_utf8_lossy(path.file_name()?.as_bytes()).to_ascii_lowercase();
    if name.ends_with(".jsonl")
        || name.ends_with(".jsonl.zst")
        || name.ends_with(".json.zst")
        || name.ends_with(".ndjson")
    {
        Some(Format::Jsonl)
    } else if name.ends_with(".parquet") {
        Some(Format::Parquet)
    } else if name.ends_with(".arrow") || name.ends_with(".feather") || name.ends_with(".ipc") {
        Some(Format::Arrow)
    } else if name.ends_with(".mds") {
        Some(Format::Mds)
    } else if has_ext(path, TEXT_EXTENSIONS) {
        Some(Format::Text)
    } else {
        None
    }
}

/// rsd's one rule for links in an input directory
/// ([`rsd_common::safe_fs::input_link_target`]): where `link`
/// leads, `None` if nowhere (reading it then reports the OS error, which `--skip-bad` skips like
/// any unreadable file), and an error that stops the pack if it leads outside `given`.
pub(super) fn link_target(root: &Path, given: &Path, link: &Path) -> Result<Option<PathBuf>> {
    rsd_common::safe_fs::input_link_target(root, given, link)
        .map_err(|e| DataError::Config(e.to_string()))
}

/// Every file under `dir`, sorted by path (byte order, so it is the same everywhere), and warnings
/// about what was left out. Links to files are followed if they stay inside `dir` (see
/// [`link_target`]; Hugging Face caches link to their blobs); links to directories are not, so no
/// file is read twice and a loop of links cannot trap the walk. A file reached twice (two links,
/// a link and its target, hard links) is listed once, under a name whose format is known if one
/// has (a cache's blob has none, the snapshot's link to it has). A link that leads nowhere
/// (dangling, a loop) stays in the list: reading it reports the OS error, which `--skip-bad`
/// skips like any unreadable file.
fn files_under(dir: &Path) -> Result<(Vec<PathBuf>, Vec<String>)> {
    let (mut files, mut warnings) = (vec![], vec![]);
    let root = std::fs::canonicalize(dir).map_err(|e| DataError::io(dir, e))?;
    let mut seen: std::collections::HashMap<(u64, u64), usize> = Default::default();
    for entry in walkdir::WalkDir::new(dir).sort_by_file_name() {
        let entry = entry.map_err(|e| {
            let path = e
                .path()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| dir.to_path_buf());
            DataError::Io {
                path,
                source: e
                    .into_io_error()
                    .unwrap_or_else(|| std::io::Error::other("walk failed")),
            }
        })?;
        let path = entry.path();
        // The root itself may be a link: walkdir follows it, as it should.
        let meta = if entry.depth() > 0 && entry.path_is_symlink() {
            let Some(target) = link_target(&root, dir, path)? else {
                files.push(entry.into_path());
                continue;
            };
            match std::fs::metadata(&target) {
                Ok(m) if m.is_dir() => {
                    warnings.push(format!(
                        "{}: a link to a directory; not followed (its files would be read twice)",
                        path.display(),
                    ));
                    continue;
                }
                Ok(m) => m,
                Err(_) => {
                    files.push(entry.into_path());
                    continue;
                }
            }
        } else {
            match entry.metadata() {
                Ok(m) => m,
                Err(_) => {
                    files.push(entry.into_path());
                    continue;
                }
            }
        };
        if !meta.is_file() {
            continue;
        }
        if let Some(&k) = seen.get(&file_identity(&meta)) {
            let (kept, dropped) =
                if format_of_file(&files[k]).is_none() && format_of_file(path).is_some() {
                    let dropped = std::mem::replace(&mut files[k], path.to_path_buf());
                    (files[k].clone(), dropped)
                } else {
                    (files[k].clone(), path.to_path_buf())
                };
            warnings.push(format!(
                "{}: the same file as {}; read once",
                dropped.display(),
                kept.display()
            ));
            continue;
        }
        seen.insert(file_identity(&meta), files.len());
        files.push(entry.into_path());
    }
    // A name put in an earlier file's place may sort elsewhere.
    files.sort();
    Ok((files, warnings))
}

/// Which entry of a list of data files (a `datasets` `state.json`, an MDS `index.json`) named each
/// file first: a file listed twice would be read twice. Names are compared as given and, where
/// the file exists, by what they open (another spelling, a link, a hard link); a missing file is
/// the reader's error to report.
#[derive(Default)]
pub(super) struct ListedOnce {
    by_name: std::collections::HashMap<PathBuf, usize>,
    by_file: std::collections::HashMap<(u64, u64), usize>,
}

impl ListedOnce {
    /// The earlier entry that names the same file as entry `k` (`file`), if one does; else `k`
    /// is recorded as naming it.
    pub(super) fn earlier(&mut self, k: usize, file: &Path) -> Option<usize> {
        if let Some(&j) = self.by_name.get(file) {
            return Some(j);
        }
        self.by_name.insert(file.to_path_buf(), k);
        let meta = std::fs::metadata(file).ok()?;
        let first = self.by_file.get(&file_identity(&meta)).copied();
        self.by_file.entry(file_identity(&meta)).or_insert(k);
        first
    }
}

/// What makes two paths the same file: device and inode.
fn file_identity(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (meta.dev(), meta.ino())
}

/// Resolve one `--src`.
pub fn resolve(
    spec: &str,
    forced: Option<Format>,
    data_root: &Path,
    seq_len: u64,
) -> Result<ResolvedSource> {
    let path = match spec.strip_prefix("prolong/") {
        Some(subset) if !Path::new(spec).exists() => resolve_prolong(subset, data_root, seq_len)?,
        _ => PathBuf::from(spec),
    };
    let meta = std::fs::metadata(&path).map_err(|_| {
        DataError::Config(format!("--src {spec}: {} does not exist", path.display()))
    })?;
    // A FIFO, socket or device is refused here: reading one would block or never end.
    if !meta.is_file() && !meta.is_dir() {
        return Err(DataError::Config(format!(
            "--src {spec}: {} is neither a regular file nor a directory (a FIFO, a socket or a \
             device); rsd reads corpora only from regular files",
            path.display()
        )));
    }
    let resolved = ResolvedSource {
        spec: spec.to_string(),
        path: path.clone(),
        format: Format::Text,
        inputs: vec![],
        bytes: 0,
        warnings: vec![],
    };
    if meta.is_file() {
        resolve_file(resolved, forced)
    } else {
        resolve_dir(resolved, forced)
    }
}

/// A single file: its format from its name (or `forced`).
fn resolve_file(mut resolved: ResolvedSource, forced: Option<Format>) -> Result<ResolvedSource> {
    let (spec, path) = (&resolved.spec, resolved.path.clone());
    let format = forced.or_else(|| format_of_file(&path)).ok_or_else(|| {
        DataError::Config(format!(
            "--src {spec}: cannot tell the format of {} from its name; pass --format (text, jsonl, parquet, arrow, mds)",
            path.display()
        ))
    })?;
    if format == Format::Code {
        return Err(DataError::Config(format!(
            "--src {spec}: --format code takes a directory of repositories"
        )));
    }
    if format == Format::Mds {
        let dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
        resolved.inputs = vec![dir];
    } else {
        resolved.inputs = vec![path.clone()];
    }
    resolved.format = format;
    resolved.bytes = file_len(&path);
    Ok(resolved)
}

/// A directory: MDS datasets and `datasets.save_to_disk` output by their index files, code
/// repositories, else the one format of the files under it.
fn resolve_dir(mut resolved: ResolvedSource, forced: Option<Format>) -> Result<ResolvedSource> {
    let path = resolved.path.clone();
    if forced.is_none() || forced == Some(Format::Mds) {
        let mds = mds::find_datasets(&path)?;
        if !mds.is_empty() {
            resolved.format = Format::Mds;
            resolved.bytes = mds.iter().map(|d| mds::dataset_bytes(d)).sum();
            resolved.inputs = mds;
            return Ok(resolved);
        } else if forced == Some(Format::Mds) {
            return Err(DataError::Config(format!(
                "--src {}: no MDS index.json (with a \"shards\" list) under {}",
                resolved.spec,
                path.display()
            )));
        }
    }
    if forced.is_none() || forced == Some(Format::Arrow) {
        if let Some(files) = arrow_ipc::saved_dataset_files(&path)? {
            resolved.format = Format::Arrow;
            resolved.bytes = files.iter().map(|f| file_len(f)).sum();
            resolved.inputs = files;
            return Ok(resolved);
        }
    }
    if forced == Some(Format::Code) {
        return code::resolve(resolved);
    }
    let (files, warnings) = files_under(&path)?;
    resolved.warnings = warnings;
    let format = match forced {
        Some(f) => f,
        None => match detect_format(&resolved.spec, &path, &files)? {
            Some(f) => f,
            None => return code::resolve(resolved),
        },
    };
    resolved.format = format;
    resolved.inputs = files
        .iter()
        .filter(|p| format_of_file(p) == Some(format))
        .cloned()
        .collect();
    if format == Format::Text && resolved.inputs.is_empty() {
        // --format text on files without a text extension: take every non-hidden file.
        resolved.inputs = files.into_iter().filter(|p| !is_hidden(p)).collect();
    }
    if resolved.inputs.is_empty() {
        return Err(DataError::Config(format!(
            "--src {}: no {} files under {}",
            resolved.spec,
            format.name(),
            path.display()
        )));
    }
    resolved.bytes = resolved.inputs.iter().map(|f| file_len(f)).sum();
    Ok(resolved)
}

/// The one format of `files` (everything under the directory `path`); `None` for a directory of
/// code repositories (only subdirectories at the top, no data files but text, if any); an error
/// for none or several.
fn detect_format(spec: &str, path: &Path, files: &[PathBuf]) -> Result<Option<Format>> {
    let found: Vec<Format> = [Format::Jsonl, Format::Parquet, Format::Arrow, Format::Text]
        .into_iter()
        .filter(|f| files.iter().any(|p| format_of_file(p) == Some(*f)))
        .collect();
    let top_level_dirs = std::fs::read_dir(path)
        .map_err(|e| DataError::io(path, e))?
        .flatten()
        .any(|e| e.file_type().is_ok_and(|t| t.is_dir()));
    let top_level_files = std::fs::read_dir(path)
        .map_err(|e| DataError::io(path, e))?
        .flatten()
        .any(|e| {
            e.file_type().is_ok_and(|t| t.is_file())
                && !e.file_name().to_string_lossy().starts_with('.')
        });
    match found.as_slice() {
        [f] if *f != Format::Text || !has_code(files) => Ok(Some(*f)),
        [] | [Format::Text] if top_level_dirs && !top_level_files => Ok(None),
        [] => Err(DataError::Config(format!(
            "--src {spec}: {} holds no files of a known format (.txt/.md, .jsonl[.zst], .parquet, .arrow, MDS); \
             for a directory of code repositories pass --format code",
            path.display()
        ))),
        several => {
            let names: Vec<&str> = several.iter().map(|f| f.name()).collect();
            Err(DataError::Config(format!(
                "--src {spec}: {} mixes formats ({}); pass --format, or give each kind as its own --src",
                path.display(),
                names.join(", ")
            )))
        }
    }
}

fn is_hidden(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    path.file_name()
        .is_some_and(|n| n.as_bytes().starts_with(b"."))
}

fn has_code(files: &[PathBuf]) -> bool {
    files.iter().any(|p| has_ext(p, code::CODE_EXTENSIONS))
}

/// Reads every document of every source, in order, and keeps per-source counts.
pub struct DocumentStream {
    /// Every input in reading order, with its source's index and format.
    inputs: Vec<(usize, PathBuf, Format)>,
    options: ReadOptions,
    /// The input being read (index into `inputs`).
    next_input: usize,
    current: Option<DocIter>,
    /// With several read threads: thread `r` reads inputs `r, r + R, …` into channel `r`.
    pool: Option<ReadPool>,
    /// Documents of the current input already received from the pool.
    buffered: std::collections::VecDeque<Result<RawDoc>>,
    /// Per-source counts, filled in as documents are read.
    pub info: Vec<SourceInfo>,
}

/// What a read thread sends: documents of its current input, in order, then the input's end.
enum ReadMsg {
    Docs(Vec<Result<RawDoc>>),
    InputEnd,
}

struct ReadPool {
    rxs: Vec<crossbeam_channel::Receiver<ReadMsg>>,
    handles: Vec<std::thread::JoinHandle<()>>,
    /// CPU seconds of the finished read threads, in nanoseconds.
    cpu_nanos: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Documents per message from a read thread, and bytes: enough to make the hand-off cheap,
/// small enough that R threads × 2 queued messages stay a few MB.
const READ_MSG_DOCS: usize = 256;
const READ_MSG_BYTES: u64 = 1 << 20;

/// The documents of one input, with every call into its reader guarded (see [`Guarded`]).
fn open_input(path: &Path, format: Format, opts: &ReadOptions) -> Result<DocIter> {
    let opened = guarded(|| open_unguarded(path, format, opts));
    let inner = match opened {
        Ok(result) => result?,
        Err(panic) => return Err(reader_panicked(path, panic.as_ref())),
    };
    // Text files are read as they are and MDS shards are bounded on their own (zstd at 64 times
    // the shard, spans that may cover their ids once), so only these can expand much.
    let expands = matches!(format, Format::Jsonl | Format::Parquet | Format::Arrow);
    let budget = expands.then(|| Budget {
        stored: file_len(path),
        ratio: opts.max_expansion,
        decoded: 0,
    });
    Ok(Box::new(Guarded {
        path: path.to_path_buf(),
        inner: Some(inner),
        budget,
    }))
}

/// What one input may still decode to ([`expansion_limit`]).
struct Budget {
    stored: u64,
    ratio: u64,
    decoded: u64,
}

/// What a document costs against its file's [`Budget`]: its bytes, and one more for the record
/// itself, so that a file of millions of empty or refused records (a run-length encoded column
/// of nulls) is not free.
fn decoded_cost(item: &Result<RawDoc>) -> u64 {
    let bytes = match item {
        Ok(doc) => match &doc.content {
            Content::Text(t) => t.len() as u64,
            Content::Tokens { ids, .. } => (ids.len() as u64).saturating_mul(4),
            Content::JsonLine(line) => line.len() as u64,
        },
        Err(_) => 0,
    };
    bytes.saturating_add(1)
}

thread_local! {
    /// Set while this thread runs a reader under [`guarded`]: a panic there becomes an error
    /// naming the file, so the panic hook stays quiet about it.
    static IN_GUARDED_READER: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `f()`, or the panic it raised. While it runs, a panic is not printed (with a backtrace) by the
/// panic hook: the caller reports it as an error naming the file instead. Every other panic
/// still reaches the previous hook.
fn guarded<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    static QUIET_HOOK: std::sync::Once = std::sync::Once::new();
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !IN_GUARDED_READER.with(std::cell::Cell::get) {
                previous(info);
            }
        }));
    });
    let was = IN_GUARDED_READER.with(|g| g.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    IN_GUARDED_READER.with(|g| g.set(was));
    result
}

/// A reader's panic as the error of its input file: a bad file, which `--skip-bad` skips.
fn reader_panicked(path: &Path, panic: &(dyn std::any::Any + Send)) -> DataError {
    let what = panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into());
    DataError::bad_file(
        path,
        Cause::Corrupt,
        format!(
            "the reader of this file failed on its contents ({}); the rest of the file is not read",
            rsd_common::printable::shortened(&what)
        ),
    )
}

/// The last line of defence around the readers of the formats: the libraries that decode
/// Parquet and Arrow panic on some damaged inputs rsd does not check for itself (rsd checks the
/// ones it knows of first). A panic while reading an input ends that input with an error naming
/// it, instead of ending the reader thread and the run.
struct Guarded {
    path: PathBuf,
    inner: Option<DocIter>,
    /// `None` for the formats that cannot expand.
    budget: Option<Budget>,
}

impl Iterator for Guarded {
    type Item = Result<RawDoc>;
    fn next(&mut self) -> Option<Result<RawDoc>> {
        let inner = self.inner.as_mut()?;
        match guarded(|| inner.next()) {
            Ok(Some(item)) => {
                if let Some(b) = &mut self.budget {
                    b.decoded = b.decoded.saturating_add(decoded_cost(&item));
                    if b.decoded > expansion_limit(b.stored, b.ratio) {
                        self.inner = None;
                        return Some(Err(expansion_error(&self.path, b.stored, b.ratio)));
                    }
                }
                Some(item)
            }
            Ok(None) => None,
            Err(panic) => {
                // The reader may be in any state after a panic: it is not asked again.
                self.inner = None;
                Some(Err(reader_panicked(&self.path, panic.as_ref())))
            }
        }
    }
}

fn open_unguarded(path: &Path, format: Format, opts: &ReadOptions) -> Result<DocIter> {
    let (field, max) = (&opts.text_field, opts.max_doc_bytes);
    match format {
        Format::Text => Ok(Box::new(std::iter::once(text::read(path, max)))),
        Format::Code => Ok(Box::new(std::iter::once(code::read_repo(path, max)))),
        Format::Jsonl => {
            jsonl::open(path, field, max, opts.max_expansion).map(|i| Box::new(i) as DocIter)
        }
        Format::Parquet => parquet_file::open(path, field, max)
            .map(|i| Box::new(i.with_message_lists(opts.chat)) as DocIter),
        Format::Arrow => arrow_ipc::open(path, field, max)
            .map(|i| Box::new(i.with_message_lists(opts.chat)) as DocIter),
        Format::Mds => mds::MdsDataset::open(path).map(|d| Box::new(d.documents(max)) as DocIter),
    }
}

/// CPU time this thread has used, in nanoseconds (0 where the clock is unavailable).
pub(crate) fn thread_cpu_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    } else {
        0
    }
}

impl ReadPool {
    fn start(inputs: &[(usize, PathBuf, Format)], opts: &ReadOptions, threads: usize) -> ReadPool {
        let cpu_nanos = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (mut rxs, mut handles) = (vec![], vec![]);
        for r in 0..threads {
            let (tx, rx) = crossbeam_channel::bounded::<ReadMsg>(2);
            let mine: Vec<(PathBuf, Format)> = inputs
                .iter()
                .skip(r)
                .step_by(threads)
                .map(|(_, p, f)| (p.clone(), *f))
                .collect();
            let (opts, cpu) = (opts.clone(), cpu_nanos.clone());
            handles.push(std::thread::spawn(move || {
                'inputs: for (path, format) in mine {
                    let mut batch = vec![];
                    let mut bytes = 0u64;
                    let docs: DocIter = match open_input(&path, format, &opts) {
                        Ok(it) => it,
                        Err(e) => Box::new(std::iter::once(Err(e))),
                    };
                    for doc in docs {
                        bytes += doc.as_ref().map_or(0, |d| d.bytes);
                        batch.push(doc);
                        if batch.len() >= READ_MSG_DOCS || bytes >= READ_MSG_BYTES {
                            if tx.send(ReadMsg::Docs(std::mem::take(&mut batch))).is_err() {
                                break 'inputs;
                            }
                            bytes = 0;
                        }
                    }
                    if !batch.is_empty() && tx.send(ReadMsg::Docs(batch)).is_err() {
                        break;
                    }
                    if tx.send(ReadMsg::InputEnd).is_err() {
                        break;
                    }
                }
                cpu.fetch_add(thread_cpu_nanos(), std::sync::atomic::Ordering::Relaxed);
            }));
            rxs.push(rx);
        }
        ReadPool {
            rxs,
            handles,
            cpu_nanos,
        }
    }
}

impl Drop for DocumentStream {
    fn drop(&mut self) {
        self.stop_pool();
    }
}

impl DocumentStream {
    /// A stream over `sources`, in the order given.
    pub fn new(sources: Vec<ResolvedSource>, options: ReadOptions) -> DocumentStream {
        let info = sources
            .iter()
            .map(|s| SourceInfo {
                spec: s.spec.clone(),
                path: escaped_path(&s.path),
                format: s.format.name().to_string(),
                files: 0,
                documents: 0,
                bytes: 0,
            })
            .collect();
        let inputs: Vec<(usize, PathBuf, Format)> = sources
            .iter()
            .enumerate()
            .flat_map(|(k, s)| s.inputs.iter().map(move |p| (k, p.clone(), s.format)))
            .collect();
        let threads = options.read_threads.min(inputs.len());
        let pool = (threads > 1).then(|| ReadPool::start(&inputs, &options, threads));
        DocumentStream {
            inputs,
            options,
            next_input: 0,
            current: None,
            pool,
            buffered: Default::default(),
            info,
        }
    }

    /// CPU seconds the read threads used (with `read_threads` > 1; 0 otherwise). Waits for them:
    /// call it once the stream is done or no longer wanted.
    pub fn read_threads_cpu_seconds(&mut self) -> f64 {
        self.stop_pool()
    }

    /// Stop the read threads (they exit at their next hand-off) and wait for them; their CPU seconds.
    fn stop_pool(&mut self) -> f64 {
        let Some(pool) = self.pool.take() else {
            return 0.0;
        };
        drop(pool.rxs);
        for h in pool.handles {
            let _ = h.join();
        }
        pool.cpu_nanos.load(std::sync::atomic::Ordering::Relaxed) as f64 * 1e-9
    }

    /// The next document of input `self.next_input - 1` from the pool, or `None` at its end.
    fn next_from_pool(&mut self) -> Option<Result<RawDoc>> {
        loop {
            if let Some(doc) = self.buffered.pop_front() {
                return Some(doc);
            }
            let pool = self.pool.as_ref()?;
            let input = self.next_input - 1;
            match pool.rxs[input % pool.rxs.len()].recv() {
                Ok(ReadMsg::Docs(docs)) => self.buffered.extend(docs),
                Ok(ReadMsg::InputEnd) => return None,
                Err(_) => {
                    return Some(Err(DataError::Config(format!(
                        "the thread reading {} stopped unexpectedly",
                        self.inputs[input].1.display()
                    ))))
                }
            }
        }
    }
}

impl Iterator for DocumentStream {
    type Item = Result<RawDoc>;
    fn next(&mut self) -> Option<Result<RawDoc>> {
        loop {
            if self.next_input > 0 {
                let item = if self.pool.is_some() {
                    self.next_from_pool()
                } else {
                    self.current.as_mut().and_then(|it| it.next())
                };
                if let Some(item) = item {
                    if let Ok(doc) = &item {
                        let info = &mut self.info[self.inputs[self.next_input - 1].0];
                        info.documents += 1;
                        info.bytes += doc.bytes;
                    }
                    return Some(item);
                }
                self.current = None;
            }
            let (source, path, format) = self.inputs.get(self.next_input)?.clone();
            self.next_input += 1;
            self.info[source].files += 1;
            if self.pool.is_none() {
                match open_input(&path, format, &self.options) {
                    Ok(it) => self.current = Some(it),
                    Err(e) => return Some(Err(e)),
                }
            }
        }
    }
}
