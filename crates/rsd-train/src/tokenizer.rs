//! Tokenizer identity between the shards and the model, and the tokenizer a saved model carries.
//!
//! Ids are only meaningful with the tokenizer that made them: ProLong's Llama-3 ids all lie below
//! Qwen3's vocabulary size, so feeding them to Qwen3 fails nowhere and trains on garbage. Before
//! anything is written, [`check`] compares every training and held-out shard directory's manifest
//! (`tokenizer.sha256`, `tokenizer.vocab_size`) with the model ([`rsd_shard::tokenizer_match`],
//! the check `rsd-eval` makes too): its `tokenizer.json` when the model directory has one, and
//! its `vocab_size` always (a random `init` model has no tokenizer, so only the sizes can be
//! compared). `allow_tokenizer_mismatch` turns a refusal into a warning.
//!
//! [`tokenizer_files`] picks the directory whose tokenizer files every saved model directory gets:
//! the starting model's, or, for an `init` model, the shards' `tokenizer.json` (which
//! `rsd-data pack` copies into each shard directory) with a `tokenizer_config.json` written here,
//! so `AutoTokenizer.from_pretrained` loads a trained model directory.
use std::path::{Path, PathBuf};

use rsd_common::safe_fs;
use rsd_shard::tokenizer_match::{self, ModelTokenizer};
use rsd_shard::{Manifest, TokenizerInfo, TOKENIZER_FILE};
use serde_json::Value;

use crate::config::TrainConfig;
use crate::{Error, Result};

/// Where a run's tokenizer files are kept when they come from the shards (`init` runs).
pub const RUN_TOKENIZER_DIR: &str = "tokenizer";

/// The shard directories of `list` (comma-separated).
fn dirs_of(list: &str) -> Vec<PathBuf> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
        .collect()
}

fn shard_dirs(cfg: &TrainConfig) -> Vec<PathBuf> {
    dirs_of(&cfg.shards)
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        rsd_common::safe_fs::read_text(path, rsd_common::safe_fs::MAX_METADATA_BYTES, "JSON")?;
    serde_json::from_str(&text).map_err(|e| Error::Input(format!("{}: {e}", path.display())))
}

/// Refuses training and held-out shards whose tokenizer is not the model's (see the module
/// docs); returns the warnings to print when `allow_tokenizer_mismatch` lets a mismatch through.
/// Reads only: nothing is written before this passes. (Shard directories of different tokenizers
/// are refused by the loader, whatever this allows.)
pub fn check(cfg: &TrainConfig) -> Result<Vec<String>> {
    let model = match (&cfg.model, &cfg.init) {
        (Some(dir), _) => ModelTokenizer::of_dir(Path::new(dir)),
        (None, Some(init)) => ModelTokenizer::of_config(Path::new(init)),
        (None, None) => {
            return Err(Error::Input(
                "config key model/init: give exactly one of --model DIR or --init CONFIG".into(),
            ))
        }
    }
    .map_err(rsd_loader::LoaderError::from)?;
    let mut problems = Vec::new();
    for dir in shard_dirs(cfg).iter().chain(&dirs_of(&cfg.heldout_shards)) {
        problems.extend(
            tokenizer_match::mismatches(dir, &model).map_err(rsd_loader::LoaderError::from)?,
        );
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
        match tokenizer_match::tokenizer_file(dir, &manifest.tokenizer) {
            (Some(file), _) => {
                let target = out.join(RUN_TOKENIZER_DIR);
                write_tokenizer_dir(&file, &manifest.tokenizer, &target)?;
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
    safe_fs::create_own_dir(dir)?;
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
    // Data-parallel ranks may do this at the same time: each under a temporary name of its own.
    let put = |name: &str, bytes: &[u8]| -> Result<()> {
        Ok(safe_fs::write_file_atomic_shared(&dir.join(name), bytes)?)
    };
    let bytes = safe_fs::read_regular(file, safe_fs::MAX_METADATA_BYTES, "tokenizer.json")?;
    put(TOKENIZER_FILE, &bytes)?;
    put("tokenizer_config.json", text.as_bytes())
}
