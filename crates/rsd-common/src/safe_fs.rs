//! Files named by data, and files written for others to read.
//!
//! Every file rsd reads may have been written by a stranger: a shard manifest, an MDS
//! `index.json`, a `datasets` `state.json`. Three rules keep such files from steering rsd:
//!
//! * **A name read from a data file stays inside its directory.** [`confined_file`] accepts only a
//!   plain relative name (no absolute path, no `..`, no NUL, no Windows prefix or backslash),
//!   resolves it, and refuses it if a link leads out of the directory. The error names the data
//!   file and the field the name came from.
//! * **Only regular files are read.** A FIFO would block the read forever, a device such as
//!   `/dev/zero` never ends, a directory is not data: [`open_regular`] checks the metadata
//!   *before* opening (so a FIFO is never opened), opens without blocking, and checks again.
//! * **Writes are atomic and never follow a planted name.** [`AtomicFile`] writes `<name>.tmp`
//!   created with `O_CREAT | O_EXCL` (which refuses any existing name, a symbolic link included),
//!   then fsyncs, renames over `<name>` and fsyncs the directory. A stale temporary that is a
//!   regular file is ours from an interrupted run and is removed first; anything else in its place
//!   (a link, a FIFO, a directory) is refused.
//!
//! The module lives in the lowest crate because every crate that reads data files needs it: the
//! shard reader and verifier (`rsd-shard`), the corpus sources (`rsd-data`), and the model side
//! (checkpoint weight maps), which depends on this crate only.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

/// Where a file name came from: the data file that holds it and the field inside that file
/// (`shards[3].prefix`, `shards[0].raw_data.basename`), for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedBy {
    /// The data file (a manifest, an index) that holds the name.
    pub file: PathBuf,
    /// The field of that file, in a JSON-path-like notation.
    pub field: String,
}

impl NamedBy {
    /// The name in `field` of `file`.
    pub fn new(file: impl Into<PathBuf>, field: impl Into<String>) -> NamedBy {
        NamedBy {
            file: file.into(),
            field: field.into(),
        }
    }
}

impl std::fmt::Display for NamedBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}, field {}", self.file.display(), self.field)
    }
}

/// A name read from a data file that is refused: where it came from, what it is, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedName {
    /// The data file and field that hold the name.
    pub named_by: NamedBy,
    /// The name as found.
    pub name: String,
    /// The directory it must stay in.
    pub dir: PathBuf,
    /// What is wrong with it.
    pub why: String,
}

impl std::fmt::Display for RefusedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: field {}: the name {:?} {}; only a file name or a relative path inside {} is accepted",
            self.named_by.file.display(),
            self.named_by.field,
            self.name,
            self.why,
            self.dir.display()
        )
    }
}

/// What can go wrong opening a file named by data, or writing a file atomically. Large details
/// are boxed so that the error stays small in every `Result` that carries it.
#[derive(Debug, thiserror::Error)]
pub enum FsError {
    /// A name read from a data file is not a plain relative path inside the data's directory.
    #[error("{0}")]
    UnsafeName(Box<RefusedName>),
    /// A file that is read as data is not a regular file.
    #[error("{}: {kind}, not a regular file{}; rsd reads data only from regular files", path.display(), named_by_suffix(named_by))]
    NotRegularFile {
        /// The file.
        path: PathBuf,
        /// What it is instead (`a FIFO`, `a directory`, …).
        kind: &'static str,
        /// Where its name came from, if a data file named it.
        named_by: Option<Box<NamedBy>>,
    },
    /// A file is larger than it may be.
    #[error("{}: more than {limit} bytes, the most a {what} may have", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The limit in bytes.
        limit: u64,
        /// What the file was read as (`manifest`, `tokenizer.json`, …).
        what: &'static str,
    },
    /// Something other than a stale temporary file of ours sits at a temporary name.
    #[error("{}: {kind} where rsd writes its temporary file; not writing through it (remove it if it is yours)", path.display())]
    TemporaryInTheWay {
        /// The temporary name.
        path: PathBuf,
        /// What is there (`a symbolic link`, `a directory`, …).
        kind: &'static str,
    },
    /// A file rsd appends to (a run's log) is not a regular file: a planted link is not written
    /// through, and a FIFO would block.
    #[error("{}: {kind}, not a regular file; rsd appends only to a regular file and writes through no link (remove it if it is yours)", path.display())]
    NotAppendable {
        /// The file.
        path: PathBuf,
        /// What is there (`a symbolic link`, `a FIFO (named pipe)`, …).
        kind: &'static str,
    },
    /// A directory rsd keeps inside a run (its checkpoints, its plots) is not a directory: a
    /// link planted there would carry every write, and every pruning, elsewhere.
    #[error("{}: {kind} where rsd keeps a directory of its own; not writing through it (remove it if it is yours)", path.display())]
    NotOwnDirectory {
        /// The directory's name.
        path: PathBuf,
        /// What is there (`a symbolic link`, `a regular file`, …).
        kind: &'static str,
    },
    /// A symbolic link in an input directory leads out of it (see [`input_link_target`]).
    #[error("{}: a symbolic link to {}, outside {}; rsd follows a link in an input directory only to a file inside the directory given (or, in a Hugging Face cache's snapshots/<revision>, to the blobs/ of the same repository)", link.display(), target.display(), given.display())]
    LinkOutside {
        /// The link.
        link: PathBuf,
        /// Where it leads (canonical).
        target: PathBuf,
        /// The input directory it must stay in, as given.
        given: PathBuf,
    },
    /// An operating-system error on a file.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

fn named_by_suffix(named_by: &Option<Box<NamedBy>>) -> String {
    match named_by {
        Some(n) => format!(" (named by {n})"),
        None => String::new(),
    }
}

impl FsError {
    /// The file the error is about: the data file holding a refused name, else the file itself.
    pub fn path(&self) -> &Path {
        match self {
            FsError::UnsafeName(refused) => &refused.named_by.file,
            FsError::NotRegularFile { path, .. }
            | FsError::TooLarge { path, .. }
            | FsError::TemporaryInTheWay { path, .. }
            | FsError::NotAppendable { path, .. }
            | FsError::NotOwnDirectory { path, .. }
            | FsError::Io { path, .. } => path,
            FsError::LinkOutside { link, .. } => link,
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> FsError + '_ {
    move |source| FsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, FsError>;

/// Why `name` is not a plain relative path, or `Ok` when it is one: not empty, no NUL byte, not
/// absolute, no `..` component, no Windows drive or UNC prefix and no backslash (a Windows
/// separator: such a name means something else on another system). Pure: looks at no file.
pub fn check_relative_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.is_empty() {
        return Err("is empty");
    }
    if name.contains('\0') {
        return Err("contains a NUL byte");
    }
    if name.contains('\\') {
        return Err("contains a backslash (a Windows path separator)");
    }
    let bytes = name.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        return Err("starts with a Windows drive prefix");
    }
    for component in Path::new(name).components() {
        match component {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err("has a `..` component"),
            Component::RootDir | Component::Prefix(_) => return Err("is an absolute path"),
        }
    }
    Ok(())
}

fn refused(dir: &Path, name: &str, named_by: &NamedBy, why: String) -> FsError {
    FsError::UnsafeName(Box::new(RefusedName {
        named_by: named_by.clone(),
        name: name.to_string(),
        dir: dir.to_path_buf(),
        why,
    }))
}

/// [`check_relative_name`] as an error naming the data file and field `named_by` and the
/// directory `dir` the name must stay in.
pub fn check_name(dir: &Path, name: &str, named_by: &NamedBy) -> Result<()> {
    check_relative_name(name).map_err(|why| refused(dir, name, named_by, why.to_string()))
}

/// What a file is, in words, for messages.
fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a regular file"
    }
}

fn require_regular(path: &Path, meta: &Metadata, named_by: Option<&NamedBy>) -> Result<()> {
    if meta.file_type().is_file() {
        return Ok(());
    }
    Err(FsError::NotRegularFile {
        path: path.to_path_buf(),
        kind: kind_of(meta),
        named_by: named_by.map(|n| Box::new(n.clone())),
    })
}

/// `dir/name` for a `name` read from a data file, after checking that it is a plain relative
/// name ([`check_relative_name`]), that it resolves (links followed) to a place inside `dir`
/// (links followed too), and that it is a regular file. The path returned is `dir/name` as
/// written, for messages; open it with [`open_regular`].
///
/// The check is made when called: someone who can change `dir` while rsd reads it can still swap
/// a file for a link in between. That is outside what rsd defends against (see docs/UNTRUSTED.md).
pub fn confined_file(dir: &Path, name: &str, named_by: &NamedBy) -> Result<PathBuf> {
    check_name(dir, name, named_by)?;
    let path = dir.join(name);
    let real_dir = dir.canonicalize().map_err(io_error(dir))?;
    let real = path.canonicalize().map_err(io_error(&path))?;
    if !real.starts_with(&real_dir) {
        return Err(refused(
            dir,
            name,
            named_by,
            format!(
                "leads through a link to {}, outside the directory",
                real.display()
            ),
        ));
    }
    let meta = std::fs::metadata(&real).map_err(io_error(&path))?;
    require_regular(&path, &meta, Some(named_by))?;
    Ok(path)
}

/// Like [`confined_file`], for a name whose file may be missing: the name's syntax is always
/// checked, and the file, if anything is there (a link included), is checked as
/// [`confined_file`] does. A missing file is returned unchecked beyond its name, so that opening
/// it later reports it missing in the usual way (one missing shard of many is then one bad input,
/// not a bad index).
pub fn confined_name(dir: &Path, name: &str, named_by: &NamedBy) -> Result<PathBuf> {
    check_name(dir, name, named_by)?;
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(path),
        _ => confined_file(dir, name, named_by),
    }
}

/// The one rule for symbolic links inside an input directory (a corpus, a haystack): a link is
/// followed only while what it leads to stays under the directory `given`, whose canonical path
/// is `root`. One layout is allowed besides: a Hugging Face cache's snapshot, whose every name
/// links into the same repository's `blobs/`. Returns where `link` leads, `None` when that cannot
/// be resolved (dangling, a loop: reading it reports the OS error), and
/// [`FsError::LinkOutside`] naming the link and its target otherwise: a directory of data
/// someone shared must not make rsd read `~/.ssh` or another corpus. The error never quotes what
/// the target holds.
pub fn input_link_target(root: &Path, given: &Path, link: &Path) -> Result<Option<PathBuf>> {
    let Ok(target) = std::fs::canonicalize(link) else {
        return Ok(None);
    };
    if target.starts_with(root) || hf_cache_blobs(root).is_some_and(|b| target.starts_with(b)) {
        return Ok(Some(target));
    }
    Err(FsError::LinkOutside {
        link: link.to_path_buf(),
        target,
        given: given.to_path_buf(),
    })
}

/// The blob store a Hugging Face cache's snapshot links into, when `root` (canonical) is a
/// snapshot or a directory inside one: `<repo>/snapshots/<revision>/…` → `<repo>/blobs`, where
/// the hub client keeps each file once and links every revision's name to it. Only that
/// repository's own blobs: a snapshot's link elsewhere is refused like any other.
fn hf_cache_blobs(root: &Path) -> Option<PathBuf> {
    let snapshot = root.ancestors().find(|a| {
        a.parent().and_then(Path::file_name) == Some(std::ffi::OsStr::new("snapshots"))
    })?;
    let repo = snapshot.parent()?.parent()?;
    Some(repo.join("blobs"))
}

/// Open `path` for reading if it is a regular file (links followed): the metadata is checked
/// before opening, so a FIFO is refused instead of blocking the open forever; the file is opened
/// non-blocking and checked again, in case it was replaced in between.
pub fn open_regular(path: &Path) -> Result<File> {
    let meta = std::fs::metadata(path).map_err(io_error(path))?;
    require_regular(path, &meta, None)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_error(path))?;
    let meta = file.metadata().map_err(io_error(path))?;
    require_regular(path, &meta, None)?;
    Ok(file)
}

/// Open `path` to append to it (created if absent) without writing through a link planted at
/// `path` (`O_NOFOLLOW`: refused) and only if it is a regular file (a FIFO is refused, not waited
/// on: `O_NONBLOCK`).
pub fn open_append(path: &Path) -> Result<File> {
    let not_appendable = |meta: &Metadata| FsError::NotAppendable {
        path: path.to_path_buf(),
        kind: kind_of(meta),
    };
    own_regular_file(path)?;
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(io_error(path))?;
    let meta = file.metadata().map_err(io_error(path))?;
    if !meta.file_type().is_file() {
        return Err(not_appendable(&meta));
    }
    Ok(file)
}

/// Whether a file rsd keeps and rewrites (a run's log) is there: `Ok(false)` when nothing is at
/// `path`, `Ok(true)` for a regular file, and [`FsError::NotAppendable`] for anything else, a
/// link (not followed), a FIFO or a directory.
pub fn own_regular_file(path: &Path) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(path)(e)),
        Ok(meta) if meta.file_type().is_file() => Ok(true),
        Ok(meta) => Err(FsError::NotAppendable {
            path: path.to_path_buf(),
            kind: kind_of(&meta),
        }),
    }
}

/// Makes sure `path` is a directory of rsd's own, creating it (and its parents) if absent: an
/// existing directory is kept; a symbolic link (even to a directory), a file or a FIFO there is
/// [`FsError::NotOwnDirectory`], never followed. For the directories rsd keeps inside a run or an
/// output directory it was given (`checkpoints/`, `plots/`); the directory given on the command
/// line itself is the user's choice and may be a link.
pub fn create_own_dir(path: &Path) -> Result<()> {
    let check = |meta: &Metadata| match meta.file_type().is_dir() {
        true => Ok(()),
        false => Err(FsError::NotOwnDirectory {
            path: path.to_path_buf(),
            kind: kind_of(meta),
        }),
    };
    match std::fs::symlink_metadata(path) {
        Ok(meta) => check(&meta),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(io_error(parent))?;
            }
            match std::fs::create_dir(path) {
                Ok(()) => Ok(()),
                // Another rank or process made it in between: check what is there now.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    check(&std::fs::symlink_metadata(path).map_err(io_error(path))?)
                }
                Err(e) => Err(io_error(path)(e)),
            }
        }
        Err(e) => Err(io_error(path)(e)),
    }
}

/// The most bytes a metadata file (a manifest, an index, a `tokenizer.json`) may have: far above
/// any real one (the largest tokenizers are tens of MB), far below what would exhaust memory.
pub const MAX_METADATA_BYTES: u64 = 1 << 30;

/// The most [`read_regular`] reserves before reading: beyond it the buffer grows with the data.
const INITIAL_READ_RESERVE: u64 = 64 << 20;

/// The whole of the regular file `path`, refused if it is larger than `limit` bytes (`what`
/// names what it is read as, for the message). The limit bounds the read itself, so a file that
/// grows while it is read cannot exceed it either.
pub fn read_regular(path: &Path, limit: u64, what: &'static str) -> Result<Vec<u8>> {
    let file = open_regular(path)?;
    let len = file.metadata().map_err(io_error(path))?.len();
    let too_large = || FsError::TooLarge {
        path: path.to_path_buf(),
        limit,
        what,
    };
    if len > limit {
        return Err(too_large());
    }
    // Reserve no more than a modest amount up front: a sparse file may claim gigabytes it does not
    // hold, and what is read grows the buffer only as bytes actually arrive.
    let mut bytes = Vec::with_capacity(len.min(INITIAL_READ_RESERVE) as usize);
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io_error(path))?;
    if bytes.len() as u64 > limit {
        return Err(too_large());
    }
    Ok(bytes)
}

/// The regular file `path` as UTF-8 text, refused if larger than `limit` bytes (see
/// [`read_regular`]).
pub fn read_text(path: &Path, limit: u64, what: &'static str) -> Result<String> {
    let bytes = read_regular(path, limit, what)?;
    String::from_utf8(bytes).map_err(|e| FsError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ),
    })
}

/// The temporary name [`AtomicFile`] writes `dest` under: `<dest>.tmp`.
pub fn temporary_name(dest: &Path) -> PathBuf {
    let mut name = dest.as_os_str().to_owned();
    name.push(".tmp");
    PathBuf::from(name)
}

/// Clear the way for a new temporary file at `tmp`: a regular file there is a stale temporary of
/// ours (an interrupted run) and is removed — `remove_file` removes the name, never what a link
/// points to; anything else is refused.
fn remove_stale_temporary(tmp: &Path) -> Result<()> {
    match std::fs::symlink_metadata(tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(tmp)(e)),
        Ok(meta) if meta.file_type().is_file() => std::fs::remove_file(tmp).map_err(io_error(tmp)),
        Ok(meta) => Err(FsError::TemporaryInTheWay {
            path: tmp.to_path_buf(),
            kind: kind_of(&meta),
        }),
    }
}

/// A file written under a temporary name and renamed into place by [`AtomicFile::commit`]:
/// readers see the old file or the new one, never a torn one. Dropped uncommitted, it removes
/// its temporary file.
#[derive(Debug)]
pub struct AtomicFile {
    dest: PathBuf,
    tmp: PathBuf,
    file: File,
    committed: bool,
}

impl AtomicFile {
    /// Start writing `dest`: create `<dest>.tmp` new (never opening an existing name, so a
    /// planted link is not followed), after removing a stale temporary of ours.
    pub fn create(dest: &Path) -> Result<AtomicFile> {
        AtomicFile::create_under(dest, temporary_name(dest))
    }

    /// Start writing `dest` under the temporary name `tmp` (see [`AtomicFile::create`]).
    fn create_under(dest: &Path, tmp: PathBuf) -> Result<AtomicFile> {
        remove_stale_temporary(&tmp)?;
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(io_error(&tmp))?;
        Ok(AtomicFile {
            dest: dest.to_path_buf(),
            tmp,
            file,
            committed: false,
        })
    }

    /// The temporary file being written.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The temporary name.
    pub fn temporary_path(&self) -> &Path {
        &self.tmp
    }

    /// The final name.
    pub fn path(&self) -> &Path {
        &self.dest
    }

    /// fsync the file, rename it over the final name, fsync the directory.
    pub fn commit(mut self) -> Result<()> {
        self.file.flush().map_err(io_error(&self.tmp))?;
        self.file.sync_all().map_err(io_error(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.dest).map_err(io_error(&self.dest))?;
        self.committed = true;
        match self.dest.parent() {
            Some(dir) => fsync_dir(dir),
            None => Ok(()),
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.file.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Write `bytes` to `dest` atomically ([`AtomicFile`]).
pub fn write_file_atomic(dest: &Path, bytes: &[u8]) -> Result<()> {
    let mut file = AtomicFile::create(dest)?;
    file.write_all(bytes).map_err(io_error(&file.tmp))?;
    file.commit()
}

/// Write `dest` atomically with a writer that opens the file by name itself (libtorch's npy and
/// safetensors writers): `write` is given the temporary name, already created empty with
/// `O_EXCL` (so it is ours, not a planted link), and the file is committed only if it succeeds.
pub fn write_atomic_by_path<E: From<FsError>>(
    dest: &Path,
    write: impl FnOnce(&Path) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let file = AtomicFile::create(dest)?;
    write(file.temporary_path())?;
    // The writer may have replaced the file rather than written into it: only a regular file
    // that is still there is committed.
    let meta = std::fs::symlink_metadata(file.temporary_path()).map_err(io_error(&file.tmp))?;
    require_regular(&file.tmp, &meta, None)?;
    let synced = File::open(file.temporary_path()).and_then(|f| f.sync_all());
    synced.map_err(io_error(&file.tmp))?;
    Ok(file.commit()?)
}

/// Write `bytes` to `dest` atomically when several processes may write the same file at the same
/// time (every data-parallel rank saving a model's tokenizer): each writes under a temporary name
/// of its own, `<dest>.tmp-<pid>-<n>`, and renames it into place, so readers see one whole copy.
pub fn write_file_atomic_shared(dest: &Path, bytes: &[u8]) -> Result<()> {
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = temporary_name(dest).into_os_string();
    tmp.push(format!("-{}-{n}", std::process::id()));
    let mut file = AtomicFile::create_under(dest, PathBuf::from(tmp))?;
    file.write_all(bytes).map_err(io_error(&file.tmp))?;
    file.commit()
}

/// fsync a directory so that renames inside it survive a crash.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let handle = File::open(dir).map_err(io_error(dir))?;
    handle.sync_all().map_err(io_error(dir))
}

/// fsync every file under `dir` (recursively), then `dir` itself.
pub fn fsync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_error(dir))? {
        let path = entry.map_err(io_error(dir))?.path();
        if path.is_dir() {
            fsync_tree(&path)?;
        } else {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_error(&path))?;
        }
    }
    fsync_dir(dir)
}

/// Publishes the directory `tmp`, written completely, as `dest` (in the same parent directory):
/// every file under it fsynced ([`fsync_tree`]), then [`replace_dir`].
pub fn publish_dir(tmp: &Path, dest: &Path) -> Result<()> {
    fsync_tree(tmp)?;
    replace_dir(tmp, dest)
}

/// Renames the directory `tmp`, already durable, to `dest` and fsyncs the parent. An existing
/// `dest` is moved aside first (`.<name>.old-<pid>`) and removed after, so a reader sees the old
/// directory or the new one, each whole; a crash leaves at most `tmp` or the old copy behind,
/// under a hidden name.
pub fn replace_dir(tmp: &Path, dest: &Path) -> Result<()> {
    let parent = dest.parent().unwrap_or(Path::new("."));
    if dest.exists() {
        let name = dest.file_name().unwrap_or_default().to_string_lossy();
        let old = parent.join(format!(".{name}.old-{}", std::process::id()));
        std::fs::rename(dest, &old).map_err(io_error(dest))?;
        std::fs::rename(tmp, dest).map_err(io_error(dest))?;
        std::fs::remove_dir_all(&old).map_err(io_error(&old))?;
    } else {
        std::fs::rename(tmp, dest).map_err(io_error(dest))?;
    }
    fsync_dir(parent)
}

#[cfg(test)]
mod tests {
    #[test]
    fn own_directories_are_made_or_kept_and_a_planted_link_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let own = dir.path().join("run").join("checkpoints");
        super::create_own_dir(&own).unwrap();
        assert!(own.is_dir());
        super::create_own_dir(&own).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let planted = dir.path().join("run").join("plots");
        std::os::unix::fs::symlink(&elsewhere, &planted).unwrap();
        let e = super::create_own_dir(&planted).unwrap_err().to_string();
        assert!(
            e.contains("a symbolic link where rsd keeps a directory of its own"),
            "{e}"
        );
    }

    use super::*;

    #[test]
    fn appending_refuses_links_and_fifos_and_appends_to_regular_files() {
        let d = std::env::temp_dir().join(format!("rsd-append-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let log = d.join("metrics.jsonl");
        open_append(&log).unwrap().write_all(b"a\n").unwrap();
        open_append(&log).unwrap().write_all(b"b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "a\nb\n");
        // A link planted at the name is refused, and what it points to is untouched.
        let outside = d.join("outside");
        std::fs::write(&outside, "keep").unwrap();
        let planted = d.join("planted.jsonl");
        std::os::unix::fs::symlink(&outside, &planted).unwrap();
        let err = open_append(&planted).unwrap_err().to_string();
        assert!(
            err.contains("a symbolic link") && err.contains("planted.jsonl"),
            "{err}"
        );
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep");
        // A FIFO is refused at once, not waited on.
        let fifo = d.join("fifo.jsonl");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = open_append(&fifo).unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
    use std::os::unix::fs::symlink;

    fn named() -> NamedBy {
        NamedBy::new("/data/index.json", "shards[0].prefix")
    }

    #[test]
    fn plain_relative_names_pass_and_everything_else_is_refused() {
        for ok in ["shard-00000", "a/b.bin", "./a", "a/./b", "x..y", "..x"] {
            assert_eq!(check_relative_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "..",
            "../x",
            "a/../../x",
            "/etc/passwd",
            "//x",
            "a\0b",
            "C:\\x",
            "c:x",
            "\\\\server\\share",
            "a\\..\\b",
        ] {
            assert!(check_relative_name(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn confined_file_refuses_traversal_absolute_names_and_links_out() {
        let td = tempfile::tempdir().unwrap();
        let tmp = td.path().to_path_buf();
        let dir = tmp.join("data");
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        std::fs::write(dir.join("sub/in.bin"), b"in").unwrap();
        std::fs::write(tmp.join("outside.bin"), b"secret").unwrap();
        symlink(tmp.join("outside.bin"), dir.join("link-out.bin")).unwrap();
        symlink(dir.join("sub/in.bin"), dir.join("link-in.bin")).unwrap();
        assert_eq!(
            confined_file(&dir, "sub/in.bin", &named()).unwrap(),
            dir.join("sub/in.bin")
        );
        assert!(confined_file(&dir, "link-in.bin", &named()).is_ok());
        let outside = tmp.join("outside.bin");
        for name in ["../outside.bin", outside.to_str().unwrap(), "link-out.bin"] {
            let err = confined_file(&dir, name, &named()).unwrap_err();
            let text = err.to_string();
            assert!(matches!(err, FsError::UnsafeName(_)), "{text}");
            assert!(
                text.contains("/data/index.json") && text.contains("shards[0].prefix"),
                "{text}"
            );
        }
        let err = confined_file(&dir, "sub", &named()).unwrap_err();
        assert!(err.to_string().contains("a directory"), "{err}");
    }

    #[test]
    fn a_fifo_is_refused_before_it_is_opened() {
        let td = tempfile::tempdir().unwrap();
        let tmp = td.path().to_path_buf();
        let fifo = tmp.join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Would block forever if opened for reading with no writer.
        let err = open_regular(&fifo).unwrap_err();
        assert!(err.to_string().contains("FIFO"), "{err}");
        let err = read_regular(&fifo, 10, "test file").unwrap_err();
        assert!(matches!(err, FsError::NotRegularFile { .. }), "{err}");
    }

    #[test]
    fn read_regular_stops_at_its_limit() {
        let td = tempfile::tempdir().unwrap();
        let tmp = td.path().to_path_buf();
        let f = tmp.join("big");
        std::fs::write(&f, vec![b'x'; 100]).unwrap();
        assert_eq!(read_regular(&f, 100, "test file").unwrap().len(), 100);
        let err = read_regular(&f, 99, "test file").unwrap_err();
        assert!(matches!(err, FsError::TooLarge { limit: 99, .. }), "{err}");
    }

    #[test]
    fn shared_atomic_writes_from_many_threads_leave_one_whole_copy_and_no_temporary() {
        let td = tempfile::tempdir().unwrap();
        let dest = td.path().join("tokenizer.json");
        let big: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..5 {
                        write_file_atomic_shared(&dest, &big).unwrap();
                        assert_eq!(std::fs::read(&dest).unwrap(), big);
                    }
                });
            }
        });
        let names: Vec<_> = std::fs::read_dir(td.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["tokenizer.json"]);
    }

    #[test]
    fn atomic_write_never_follows_a_planted_link_and_replaces_a_stale_temporary() {
        let td = tempfile::tempdir().unwrap();
        let tmp = td.path().to_path_buf();
        let victim = tmp.join("victim");
        std::fs::write(&victim, b"keep me").unwrap();
        let dest = tmp.join("out.json");
        symlink(&victim, temporary_name(&dest)).unwrap();
        let err = write_file_atomic(&dest, b"new").unwrap_err();
        assert!(matches!(err, FsError::TemporaryInTheWay { .. }), "{err}");
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert!(!dest.exists());

        // A stale regular temporary (an interrupted run) is replaced.
        std::fs::remove_file(temporary_name(&dest)).unwrap();
        std::fs::write(temporary_name(&dest), b"stale").unwrap();
        write_file_atomic(&dest, b"new").unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"new");
        assert!(!temporary_name(&dest).exists());

        // A link at the final name is replaced by the rename, its target untouched.
        let dest2 = tmp.join("linked.json");
        symlink(&victim, &dest2).unwrap();
        write_file_atomic(&dest2, b"other").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep me");
        assert_eq!(std::fs::read(&dest2).unwrap(), b"other");
        assert!(!std::fs::symlink_metadata(&dest2)
            .unwrap()
            .file_type()
            .is_symlink());
    }

    #[test]
    fn an_uncommitted_atomic_file_leaves_nothing() {
        let td = tempfile::tempdir().unwrap();
        let tmp = td.path().to_path_buf();
        let dest = tmp.join("x.bin");
        {
            let mut f = AtomicFile::create(&dest).unwrap();
            f.write_all(b"partial").unwrap();
            assert!(temporary_name(&dest).exists());
        }
        assert!(!temporary_name(&dest).exists() && !dest.exists());
    }

    #[test]
    fn published_directories_replace_the_old_one_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dest = tmp.path().join("model");
        for (round, text) in ["first", "second"].into_iter().enumerate() {
            let staging = tmp.path().join(format!(".model.tmp-{round}"));
            std::fs::create_dir_all(staging.join("sub")).unwrap();
            std::fs::write(staging.join("sub/weights"), text).unwrap();
            publish_dir(&staging, &dest).unwrap();
            assert!(!staging.exists());
            assert_eq!(
                std::fs::read_to_string(dest.join("sub/weights")).unwrap(),
                text
            );
        }
        // Nothing else is left beside it: no staging copy, no old copy.
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["model"]);
    }
}
