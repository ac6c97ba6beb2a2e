//! Tokenizer identity between the shards and the model, and the tokenizer a saved model carries.
//!
//! Ids are only meaningful with the tokenizer that made them: ProLong's Llama-3 ids all lie below
//! Qwen3's vocabulary size, so feeding them to Qwen3 fails nowhere and trains on garbage. Before
//! anything is written, [`check`] compares every shard directory's manifest (`tokenizer.sha256`,
//! `tokenizer.vocab_size`) with the model: its `tokenizer.json` when the model directory has one,
//! and its `vocab_size` always (a random `init` model has no tokenizer, so only the sizes can be
//! compared). `allow_tokenizer_mismatch` turns a refusal into a warning.
//!
//! [`tokenizer_files`] picks the directory whose tokenizer files every saved model directory gets:
//! the starting model's, or, for an `init` model, the shards' `tokenizer.json` (which
//! `rsd-data pack` copies into each shard directory) with a `tokenizer_config.json` written here,
//! so `AutoTokenizer.from_pretrained` loads a trained model directory.
use std::fs;
use std::path::{Path, PathBuf};

use rsd_common::safe_fs::{self, FsError, NamedBy};
use rsd_shard::{Manifest, TokenizerInfo, MANIFEST_FILE, TOKENIZER_FILE};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::config::TrainConfig;
use crate::{io_err, Error, Result};

/// Where a run's tokenizer files are kept when they come from the shards (`init` runs).
pub const RUN_TOKENIZER_DIR: &str = "tokenizer";

/// The model side of the comparison.
struct ModelSide {
    /// The model's `config.json` (or the `init` config).
    config: PathBuf,
    /// Its `vocab_size`, if it names one.
    vocab: Option<u64>,
    /// The model directory's `tokenizer.json` and its sha256, if it has one.
    tokenizer: Option<(PathBuf, String)>,
}

/// One shard directory's tokenizer as its manifest records it.
struct ShardSide {
    dir: PathBuf,
    info: TokenizerInfo,
}

impl ShardSide {
    fn manifest_path(&self) -> PathBuf {
        self.dir.join(MANIFEST_FILE)
    }

    /// The `tokenizer.json` these ids were made with, if one is at hand: the copy in the shard
    /// directory, else the file the manifest's `tokenizer.name` names, whichever has the recorded
    /// sha256. The manifest may come from anyone, so its name is looked for only inside the shard
    /// directory (a plain relative name, no link out, a regular file): a name that leaves it is
    /// not opened, and the second value says why (for the caller's warning or error). A name
    /// that is simply not there (a hub name, a path on the packing machine) is no note.
    fn tokenizer_file(&self) -> (Option<PathBuf>, Option<String>) {
        let matches = |p: &Path| {
            p.is_file()
                && safe_fs::read_regular(p, safe_fs::MAX_METADATA_BYTES, "tokenizer.json")
                    .is_ok_and(|bytes| sha256(&bytes) == self.info.sha256)
        };
        let own = self.dir.join(TOKENIZER_FILE);
        if matches(&own) {
            return (Some(own), None);
        }
        let named_by = NamedBy::new(self.manifest_path(), "tokenizer.name");
        match safe_fs::confined_file(&self.dir, &self.info.name, &named_by) {
            Ok(path) if matches(&path) => (Some(path), None),
            Ok(_) => (None, None),
            Err(FsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                (None, None)
            }
            Err(e) => (None, Some(format!("not looked for: {e}"))),
        }
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn shard_dirs(cfg: &TrainConfig) -> Vec<PathBuf> {
    cfg.shards
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect()
}

fn read_json(path: &Path) -> Result<Value> {
    let text = fs::read_to_string(path).map_err(io_err(path))?;
    serde_json::from_str(&text).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

fn model_side(cfg: &TrainConfig) -> Result<ModelSide> {
    let (config, dir) = match (&cfg.model, &cfg.init) {
        (Some(dir), _) => (Path::new(dir).join("config.json"), Some(Path::new(dir))),
        (None, Some(init)) => (PathBuf::from(init), None),
        (None, None) => {
            return Err(Error::Input(
                "config key model/init: give exactly one of --model DIR or --init CONFIG".into(),
            ))
        }
    };
    let vocab = read_json(&config)?
        .get("vocab_size")
        .and_then(Value::as_u64);
    let tokenizer = match dir.map(|d| d.join(TOKENIZER_FILE)) {
        Some(p) if p.is_file() => {
            let bytes = fs::read(&p).map_err(io_err(&p))?;
            Some((p, sha256(&bytes)))
        }
        _ => None,
    };
    Ok(ModelSide {
        config,
        vocab,
        tokenizer,
    })
}

/// Two tokenizer files with the same content: equal bytes, or the same JSON written differently
/// (key order, whitespace), as copies of one tokenizer from different places often are.
fn same_tokenizer(a: &Path, b: &Path) -> bool {
    match (read_json(a), read_json(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Refuses shards whose tokenizer is not the model's (see the module docs); returns the warnings
/// to print when `allow_tokenizer_mismatch` lets a mismatch through. Reads only: nothing is
/// written before this passes. (Shard directories of different tokenizers are refused by the
/// loader, whatever this allows.)
pub fn check(cfg: &TrainConfig) -> Result<Vec<String>> {
    let model = model_side(cfg)?;
    let mut problems = Vec::new();
    for dir in shard_dirs(cfg) {
        let manifest = Manifest::read(&dir).map_err(rsd_loader::LoaderError::from)?;
        let shard = ShardSide {
            dir,
            info: manifest.tokenizer,
        };
        if let Some(vocab) = model.vocab {
            if shard.info.vocab_size > vocab {
                problems.push(format!(
                    "{}: tokenizer.vocab_size is {} ({}) but {}: vocab_size is {vocab}: the shards' \
                     ids can index past the model's embedding",
                    shard.manifest_path().display(),
                    shard.info.vocab_size,
                    shard.info.name,
                    model.config.display()
                ));
            }
        }
        if let Some((file, sha)) = &model.tokenizer {
            let (ours, note) = shard.tokenizer_file();
            let same =
                *sha == shard.info.sha256 || ours.is_some_and(|ours| same_tokenizer(&ours, file));
            if !same {
                let note = note.map(|n| format!(" ({n})")).unwrap_or_default();
                problems.push(format!(
                    "{}: tokenizer.sha256 is {} ({}, vocab {}) but {} has sha256 {}: the shards \
                     hold another tokenizer's ids; repack them for this model (rsd-data pack \
                     --tokenizer {} re-tokenizes MDS sources){note}",
                    shard.manifest_path().display(),
                    shard.info.sha256,
                    shard.info.name,
                    shard.info.vocab_size,
                    file.display(),
                    sha,
                    file.display()
                ));
            }
        }
    }
    if problems.is_empty() {
        return Ok(problems);
    }
    if cfg.allow_tokenizer_mismatch {
        return Ok(problems
            .into_iter()
            .map(|p| format!("{p} (allowed by allow_tokenizer_mismatch)"))
            .collect());
    }
    Err(Error::Input(format!(
        "{}\n(pass --allow-tokenizer-mismatch, config key allow_tokenizer_mismatch, to train anyway)",
        problems.join("\n")
    )))
}

/// The directory whose tokenizer files every saved model directory gets (see the module docs),
/// and a warning when there is none. For an `init` run the files are written into
/// `<out>/tokenizer`.
pub fn tokenizer_files(cfg: &TrainConfig, out: &Path) -> Result<(Option<PathBuf>, Option<String>)> {
    if let Some(dir) = &cfg.model {
        let dir = PathBuf::from(dir);
        if rsd_model::checkpoint::TOKENIZER_FILES
            .iter()
            .any(|f| dir.join(f).is_file())
        {
            return Ok((Some(dir), None));
        }
    }
    let dirs = shard_dirs(cfg);
    let mut notes = Vec::new();
    for dir in &dirs {
        let Ok(manifest) = Manifest::read(dir) else {
            continue;
        };
        let shard = ShardSide {
            dir: dir.clone(),
            info: manifest.tokenizer,
        };
        match shard.tokenizer_file() {
            (Some(file), _) => {
                let target = out.join(RUN_TOKENIZER_DIR);
                write_tokenizer_dir(&file, &shard.info, &target)?;
                return Ok((Some(target), None));
            }
            (None, Some(note)) => notes.push(note),
            (None, None) => {}
        }
    }
    let from = if cfg.model.is_some() {
        "the model directory has no tokenizer files and "
    } else {
        ""
    };
    Ok((
        None,
        Some(format!(
            "the saved model will have no tokenizer: {from}no shard directory ({}) holds the \
             tokenizer.json its manifest records (packed by an older rsd-data?); copy it into the \
             model directory yourself{}",
            dirs.iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            notes.iter().map(|n| format!(" ({n})")).collect::<String>()
        )),
    ))
}

/// `tokenizer.json` and a `tokenizer_config.json` naming its BOS/EOS, into `dir`.
fn write_tokenizer_dir(file: &Path, info: &TokenizerInfo, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let json = read_json(file)?;
    let token = |id: Option<u32>| -> Value {
        let content = id.and_then(|id| {
            json.get("added_tokens")?
                .as_array()?
                .iter()
                .find(|t| t.get("id").and_then(Value::as_u64) == Some(id as u64))?
                .get("content")
                .cloned()
        });
        content.unwrap_or(Value::Null)
    };
    let config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token(info.bos_id),
        "eos_token": token(info.eos_id),
        "clean_up_tokenization_spaces": false,
    });
    let text = serde_json::to_string_pretty(&config).map_err(|e| Error::Input(e.to_string()))?;
    // Written under unique names and renamed: data-parallel ranks may do this at the same time.
    let put = |name: &str, bytes: &[u8]| -> Result<()> {
        let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
        let to = dir.join(name);
        fs::rename(&tmp, &to).map_err(io_err(&to))
    };
    put(TOKENIZER_FILE, &fs::read(file).map_err(io_err(file))?)?;
    put("tokenizer_config.json", text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

    const TOKENIZER: &[u8] = br#"{"model": {"type": "BPE"}, "added_tokens": []}"#;

    fn shard(dir: &Path, name: &str) -> ShardSide {
        ShardSide {
            dir: dir.to_path_buf(),
            info: TokenizerInfo {
                name: name.to_string(),
                sha256: sha256(TOKENIZER),
                vocab_size: 10,
                bos_id: None,
                eos_id: None,
            },
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
            let (file, note) = shard(&dir, name).tokenizer_file();
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
        assert_eq!(shard(&dir, "org/model").tokenizer_file(), (None, None));
        fs::write(dir.join("tok.json"), TOKENIZER).unwrap();
        assert_eq!(
            shard(&dir, "tok.json").tokenizer_file(),
            (Some(dir.join("tok.json")), None)
        );
    }

    #[test]
    fn a_fifo_named_by_the_manifest_is_refused_not_waited_on() {
        let tmp = tempfile::tempdir().unwrap();
        let fifo = tmp.path().join("tok.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let side = shard(tmp.path(), "tok.json");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(side.tokenizer_file());
        });
        let (file, note) = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("no answer in time: the read blocked");
        assert_eq!(file, None);
        assert!(note.is_some_and(|n| n.contains("FIFO")));
    }
}
