//! Whether a shard directory's ids were made with a model's tokenizer.
//!
//! Ids mean something only with the tokenizer that made them: ProLong's Llama-3 ids all lie
//! below Qwen3's vocabulary size, so feeding them to Qwen3 fails nowhere and trains (or
//! evaluates) on garbage. Every tool where shards meet a model — training, held-out
//! evaluation, perplexity, a haystack decoded from shards — asks [`mismatches`] first: the
//! manifest's `tokenizer.sha256` and `tokenizer.vocab_size` against the model's
//! `tokenizer.json` (when it has one; equal bytes, or the same JSON written differently) and its
//! `config.json` `vocab_size` (always; a randomly initialised model has no tokenizer).
use std::path::{Path, PathBuf};

use rsd_common::digest::sha256_hex;
use rsd_common::safe_fs::{self, FsError, NamedBy};
use serde_json::Value;

use crate::{Manifest, Result, ShardError, TokenizerInfo, MANIFEST_FILE, TOKENIZER_FILE};

/// The model side of the comparison.
#[derive(Debug, Clone)]
pub struct ModelTokenizer {
    /// The model's `config.json` (or the config a random model is initialised from).
    pub config: PathBuf,
    /// Its `vocab_size`, if it names one.
    pub vocab: Option<u64>,
    /// The model directory's `tokenizer.json` and its sha256, if it has one.
    pub tokenizer: Option<(PathBuf, String)>,
}

impl ModelTokenizer {
    /// A model directory: its `config.json`'s `vocab_size` and its `tokenizer.json`, if any.
    pub fn of_dir(dir: &Path) -> Result<ModelTokenizer> {
        let mut side = ModelTokenizer::of_config(&dir.join("config.json"))?;
        let file = dir.join(TOKENIZER_FILE);
        if file.is_file() {
            let bytes = safe_fs::read_regular(&file, safe_fs::MAX_METADATA_BYTES, "tokenizer")?;
            side.tokenizer = Some((file, sha256_hex(&bytes)));
        }
        Ok(side)
    }

    /// A model `config.json` alone (a model initialised randomly): only the sizes compare.
    pub fn of_config(config: &Path) -> Result<ModelTokenizer> {
        let vocab = read_json(config)?.get("vocab_size").and_then(Value::as_u64);
        Ok(ModelTokenizer {
            config: config.to_path_buf(),
            vocab,
            tokenizer: None,
        })
    }
}

/// What is wrong with using the shards in `dir` with `model`, one line per problem, each naming
/// the manifest and the model file; empty when they agree.
pub fn mismatches(dir: &Path, model: &ModelTokenizer) -> Result<Vec<String>> {
    let info = Manifest::read(dir)?.tokenizer;
    let manifest = dir.join(MANIFEST_FILE);
    let mut problems = Vec::new();
    if let Some(vocab) = model.vocab.filter(|&v| info.vocab_size > v) {
        problems.push(format!(
            "{}: tokenizer.vocab_size is {} ({}) but {}: vocab_size is {vocab}: the shards' ids \
             can index past the model's embedding",
            manifest.display(),
            info.vocab_size,
            info.name,
            model.config.display()
        ));
    }
    if let Some((file, sha)) = &model.tokenizer {
        let (ours, note) = tokenizer_file(dir, &info);
        let same = *sha == info.sha256 || ours.is_some_and(|ours| same_json(&ours, file));
        if !same {
            let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
            problems.push(format!(
                "{}: tokenizer.sha256 is {} ({}, vocab {}) but {} has sha256 {sha}: the shards \
                 hold another tokenizer's ids; repack them for this model (rsd-data pack \
                 --tokenizer {}){note}",
                manifest.display(),
                info.sha256,
                info.name,
                info.vocab_size,
                file.display(),
                file.display()
            ));
        }
    }
    Ok(problems)
}

/// The `tokenizer.json` the shards in `dir` were made with, if one is at hand: the copy in the
/// shard directory, else the file the manifest's `tokenizer.name` names, whichever has the
/// recorded sha256. The manifest may come from anyone, so its name is looked for only inside the
/// shard directory (a plain relative name, no link out, a regular file): a name that leaves it
/// is not opened, and the second value says why (for the caller's warning or error). A name that
/// is simply not there (a hub name, a path on the packing machine) is no note.
pub fn tokenizer_file(dir: &Path, info: &TokenizerInfo) -> (Option<PathBuf>, Option<String>) {
    let matches = |p: &Path| {
        p.is_file()
            && safe_fs::read_regular(p, safe_fs::MAX_METADATA_BYTES, "tokenizer")
                .is_ok_and(|bytes| sha256_hex(&bytes) == info.sha256)
    };
    // The copy rsd-data writes is a regular file; a link there is followed only inside the
    // directory (rsd's rule for links in input directories), so that a shard directory cannot
    // make rsd-train copy a file from elsewhere into its run.
    let own = dir.join(TOKENIZER_FILE);
    let note = std::fs::canonicalize(dir).ok().and_then(|root| {
        let refused = safe_fs::input_link_target(&root, dir, &own).err();
        refused.map(|e| format!("not copied: {e}"))
    });
    if note.is_none() && matches(&own) {
        return (Some(own), None);
    }
    let named_by = NamedBy::new(dir.join(MANIFEST_FILE), "tokenizer.name");
    match safe_fs::confined_file(dir, &info.name, &named_by) {
        Ok(path) if matches(&path) => (Some(path), None),
        Ok(_) => (None, note),
        Err(FsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            (None, note)
        }
        Err(e) => (None, Some(format!("not looked for: {e}"))),
    }
}

/// A JSON file (bounded, regular), parsed.
fn read_json(path: &Path) -> Result<Value> {
    let bytes = safe_fs::read_regular(path, safe_fs::MAX_METADATA_BYTES, "JSON file")?;
    serde_json::from_slice(&bytes).map_err(|e| ShardError::Manifest {
        path: path.to_path_buf(),
        what: format!("not JSON: {e}"),
    })
}

/// Two tokenizer files with the same content: equal bytes, or the same JSON written differently
/// (key order, whitespace), as copies of one tokenizer from different places often are.
fn same_json(a: &Path, b: &Path) -> bool {
    match (read_json(a), read_json(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::sync::mpsc;
    use std::time::Duration;

    const TOKENIZER: &[u8] = br#"{"model": {"type": "BPE"}, "added_tokens": []}"#;

    fn info(name: &str) -> TokenizerInfo {
        TokenizerInfo {
            name: name.to_string(),
            sha256: sha256_hex(TOKENIZER),
            vocab_size: 10,
            bos_id: None,
            eos_id: None,
        }
    }

    #[test]
    fn the_manifest_tokenizer_name_is_looked_for_only_inside_the_shard_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shards");
        fs::create_dir(&dir).unwrap();
        // The right tokenizer, outside the shard directory: following the name would find it.
        let outside = tmp.path().join("tok.json");
        fs::write(&outside, TOKENIZER).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link.json")).unwrap();
        let absolute = outside.display().to_string();
        for name in ["../tok.json", absolute.as_str(), "link.json"] {
            let (file, note) = tokenizer_file(&dir, &info(name));
            assert_eq!(file, None, "{name}");
            let note = note.expect("a refused name is noted");
            assert!(
                note.contains(&dir.join(MANIFEST_FILE).display().to_string())
                    && note.contains("tokenizer.name")
                    && note.contains(name),
                "{note}"
            );
        }
        assert_eq!(fs::read(&outside).unwrap(), TOKENIZER, "outside untouched");
        // A name that is simply absent (a hub name) is no note; one inside is used.
        assert_eq!(tokenizer_file(&dir, &info("org/model")), (None, None));
        fs::write(dir.join("tok.json"), TOKENIZER).unwrap();
        assert_eq!(
            tokenizer_file(&dir, &info("tok.json")),
            (Some(dir.join("tok.json")), None)
        );
    }

    /// The shard directory's own `tokenizer.json` (what rsd-train copies into its run) as a link
    /// out of the directory is not used, and the note says why; a link inside is used.
    #[test]
    fn the_shard_directorys_tokenizer_json_as_a_link_out_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("shards");
        fs::create_dir(&dir).unwrap();
        let outside = tmp.path().join("elsewhere.json");
        fs::write(&outside, TOKENIZER).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join(TOKENIZER_FILE)).unwrap();
        let (file, note) = tokenizer_file(&dir, &info("org/model"));
        assert_eq!(file, None);
        let note = note.expect("the refused link is noted");
        assert!(
            note.contains("a symbolic link to")
                && note.contains("elsewhere.json")
                && note.contains("outside"),
            "{note}"
        );
        fs::remove_file(dir.join(TOKENIZER_FILE)).unwrap();
        fs::write(dir.join("kept.json"), TOKENIZER).unwrap();
        std::os::unix::fs::symlink(dir.join("kept.json"), dir.join(TOKENIZER_FILE)).unwrap();
        assert_eq!(
            tokenizer_file(&dir, &info("org/model")),
            (Some(dir.join(TOKENIZER_FILE)), None)
        );
    }

    #[test]
    fn a_fifo_named_by_the_manifest_is_refused_not_waited_on() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("tok.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let dir = tmp.path().to_path_buf();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(tokenizer_file(&dir, &info("tok.json")));
        });
        let (file, note) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("no answer in time: the read blocked");
        assert_eq!(file, None);
        assert!(note.is_some_and(|n| n.contains("FIFO")));
    }
}
