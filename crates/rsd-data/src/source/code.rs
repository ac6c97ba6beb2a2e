//! A directory of code repositories: each top-level subdirectory is one repository and becomes one
//! document — its files in byte order of their paths, each behind a header line with its path, as
//! ProLong concatenates The Stack by repository. Version-control, vendored, build-output and binary
//! files are skipped, so a document is the code people wrote.

use std::path::Path;
use std::sync::Arc;

use rsd_common::safe_fs::read_regular;

use super::{Content, RawDoc, ResolvedSource};
use crate::error::{DataError, Result};

/// Extensions that mark a directory as code when detecting formats.
pub(super) const CODE_EXTENSIONS: &[&str] = &[
    "rs", "py", "go", "c", "h", "cc", "cpp", "hpp", "java", "js", "ts", "rb", "php", "cs", "swift",
    "kt", "scala", "sh", "toml",
];

/// Directories that hold other people's code or generated files.
const SKIP_DIRS: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    "node_modules",
    "vendor",
    "third_party",
    "third-party",
    "target",
    "build",
    "dist",
    "__pycache__",
    ".venv",
    "venv",
    ".tox",
    ".idea",
    ".vscode",
    ".mypy_cache",
    ".pytest_cache",
];
/// Generated files that are text but not code anyone wrote.
const SKIP_FILES: &[&str] = &[
    "Cargo.lock",
    "package-lock.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "poetry.lock",
    "go.sum",
];
/// Files larger than this are almost always data or generated code.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// The header line before each file inside a repository document.
pub fn file_header(relative_path: &str) -> String {
    format!("--- {relative_path} ---\n")
}

pub(super) fn resolve(mut source: ResolvedSource) -> Result<ResolvedSource> {
    let mut entries: Vec<std::fs::DirEntry> = std::fs::read_dir(&source.path)
        .map_err(|e| DataError::io(&source.path, e))?
        .flatten()
        .collect();
    entries.sort_by_key(|e| e.path());
    // Detection may have listed the links already; the repository walk lists them all.
    source.warnings.clear();
    let mut repos = vec![];
    for e in entries {
        let Ok(kind) = e.file_type() else { continue };
        if kind.is_symlink() {
            source.warnings.push(link_warning(&e.path()));
        } else if kind.is_dir() && !SKIP_DIRS.contains(&e.file_name().to_string_lossy().as_ref()) {
            repos.push(e.path());
        }
    }
    if repos.is_empty() {
        return Err(DataError::Config(format!(
            "--src {}: --format code wants a directory whose subdirectories are repositories; {} has none",
            source.spec,
            source.path.display()
        )));
    }
    source.format = super::Format::Code;
    source.bytes = 0;
    let root = std::fs::canonicalize(&source.path).map_err(|e| DataError::io(&source.path, e))?;
    for repo in &repos {
        source.bytes += walk_repo(&root, &source.path, repo, &mut source.warnings)?;
    }
    source.inputs = repos;
    Ok(source)
}

fn link_warning(link: &Path) -> String {
    format!(
        "{}: a link to a directory; not followed (its files would be read twice)",
        link.display()
    )
}

/// The bytes of a repository's files (for progress), with a warning for each link to a
/// directory, which is not followed (so no file is packed twice and a loop of links cannot trap
/// the walk). A link to a file is followed if it stays under `given` (canonical path `root`),
/// and refused naming it and its target if not ([`super::link_target`]).
fn walk_repo(root: &Path, given: &Path, repo: &Path, warnings: &mut Vec<String>) -> Result<u64> {
    let mut bytes = 0;
    let walker = walkdir::WalkDir::new(repo)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| !skipped_dir(e));
    for entry in walker.flatten() {
        if entry.path_is_symlink() && entry.depth() > 0 {
            let link = entry.path().display();
            let Some(target) = super::link_target(root, given, entry.path())? else {
                warnings.push(format!(
                    "{link}: a link that leads nowhere (dangling, or a loop); not followed"
                ));
                continue;
            };
            match std::fs::metadata(&target) {
                Ok(m) if m.is_dir() => warnings.push(link_warning(entry.path())),
                Ok(_) if in_repo(repo, &target) => warnings.push(format!(
                    "{link}: a link to a file of the same repository; read once, under its own name"
                )),
                Ok(m) => bytes += if m.is_file() { m.len() } else { 0 },
                Err(_) => {}
            }
        } else if let Ok(m) = entry.metadata() {
            bytes += if m.is_file() { m.len() } else { 0 };
        }
    }
    Ok(bytes)
}

/// Whether `target` (canonical) lies in the repository `repo`: such a link's file is read under
/// its own name, so a repository's text holds each of its files once.
fn in_repo(repo: &Path, target: &Path) -> bool {
    std::fs::canonicalize(repo).is_ok_and(|r| target.starts_with(r))
}

fn skipped_dir(entry: &walkdir::DirEntry) -> bool {
    entry.depth() > 0
        && entry.file_type().is_dir()
        && SKIP_DIRS.contains(&entry.file_name().to_string_lossy().as_ref())
}

/// Text of a file if it is source code: valid UTF-8, no NUL bytes, not huge, not minified.
fn code_text(path: &Path, len: u64) -> Option<String> {
    // The skipped names are ASCII, so a name that is not UTF-8 is matched on its lossy form
    // (never one of them) and its file read like any other.
    let name = path.file_name()?.to_string_lossy();
    if len > MAX_FILE_BYTES
        || len == 0
        || SKIP_FILES.contains(&name.as_ref())
        || name.ends_with(".min.js")
    {
        return None;
    }
    // Bounded even if the file grew since it was measured.
    let bytes = read_regular(path, MAX_FILE_BYTES, "source file").ok()?;
    if bytes.iter().take(8192).any(|&b| b == 0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// A repository as one document; one whose text grows past `max_doc_bytes` is a bad record.
pub(super) fn read_repo(repo: &Path, max_doc_bytes: u64) -> Result<RawDoc> {
    let mut doc = String::new();
    let mut bytes = 0u64;
    let walker = walkdir::WalkDir::new(repo)
        .sort_by_file_name()
        .into_iter()
        .filter_entry(|e| !skipped_dir(e));
    for entry in walker {
        let entry = entry.map_err(|e| DataError::Io {
            path: e
                .path()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| repo.to_path_buf()),
            source: e
                .into_io_error()
                .unwrap_or_else(|| std::io::Error::other("walk failed")),
        })?;
        let len = if entry.path_is_symlink() {
            // Checked again here, not only when the repository was listed: the directory may
            // have changed since.
            let given = repo.parent().unwrap_or(repo);
            let root = std::fs::canonicalize(given).map_err(|e| DataError::io(given, e))?;
            match super::link_target(&root, given, entry.path())? {
                Some(t) if in_repo(repo, &t) => continue,
                Some(t) => match std::fs::metadata(t) {
                    Ok(m) if m.is_file() => m.len(),
                    _ => continue,
                },
                None => continue,
            }
        } else if entry.file_type().is_file() {
            entry.metadata().map(|m| m.len()).unwrap_or(0)
        } else {
            continue;
        };
        bytes += len;
        let Some(text) = code_text(entry.path(), len) else {
            continue;
        };
        let rel = entry.path().strip_prefix(repo).unwrap_or(entry.path());
        doc.push_str(&file_header(&super::escaped_path(rel)));
        doc.push_str(&text);
        if !text.ends_with('\n') {
            doc.push('\n');
        }
        if doc.len() as u64 > max_doc_bytes {
            return Err(DataError::bad_record(
                repo,
                format!("file {}", rel.display()),
                format!(
                    "the repository's text grows past --max-doc-bytes ({max_doc_bytes} bytes) here"
                ),
            ));
        }
    }
    Ok(RawDoc {
        path: Arc::from(repo),
        location: String::new(),
        bytes,
        content: Content::Text(doc),
    })
}
