use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::dtype::TokenDtype;
use crate::error::{Result, ShardError};
use rsd_common::safe_fs::{read_regular, FsError, MAX_METADATA_BYTES};

/// Name of the manifest inside a shard directory. It is written last: its presence means the
/// directory is complete.
pub const MANIFEST_FILE: &str = "index.json";
/// The `tokenizer.json` whose ids the shards hold, copied into the shard directory (before the
/// manifest) so a model trained from the shards can be saved with its tokenizer. Directories
/// packed before this existed have none.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The `format` field of every manifest.
pub const FORMAT_NAME: &str = "rsd-shards";
/// The manifest version this crate writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// `index.json`: what a shard directory holds and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`FORMAT_VERSION`] when written.
    pub version: u32,
    /// The tokenizer whose ids the shards hold.
    pub tokenizer: TokenizerInfo,
    /// Set when pre-tokenized sources (MDS) were re-tokenized: the tokenizer their ids were
    /// decoded with (`tokenizer` is the one they were encoded with). Absent for a repack, whose
    /// ids are the sources' own and whose `tokenizer` is therefore the source tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_tokenizer: Option<TokenizerInfo>,
    /// Token dtype of every `.bin`.
    pub dtype: TokenDtype,
    /// The packing length: every sample has exactly this many tokens in `fixed` mode, at most this
    /// many in `mixed` mode.
    pub seq_len: u64,
    /// How documents became samples (see docs/FORMAT.md).
    pub mode: PackMode,
    /// Id used for tail padding, if any sample is padded.
    pub pad_id: Option<u32>,
    /// The shards, in order.
    pub shards: Vec<ShardInfo>,
    /// Counts over the whole directory.
    pub totals: Totals,
    /// Where the documents came from.
    pub sources: Vec<SourceInfo>,
    /// Set when every shard carries a loss mask (chat data packed for SFT): only tokens marked 1
    /// are training targets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_mask: Option<LossMaskInfo>,
    /// The exact command line that wrote this directory.
    pub command: Vec<String>,
    /// Program and version that wrote it.
    pub created_by: String,
}

/// How documents became samples: the manifest's `mode`, and `rsd-data pack --mode` (the `clap`
/// feature makes it a command-line value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum PackMode {
    /// Contiguous windows of exactly `--len` tokens over the document stream.
    Fixed,
    /// Whole documents packed into samples of at most `--len` tokens (for document-masked training).
    Mixed,
}

impl PackMode {
    /// The name used in the manifest and in messages.
    pub fn name(self) -> &'static str {
        match self {
            PackMode::Fixed => "fixed",
            PackMode::Mixed => "mixed",
        }
    }
}

impl std::fmt::Display for PackMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The tokenizer, identified by content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenizerInfo {
    /// A human name (file name or bundled name).
    pub name: String,
    /// sha256 of the tokenizer.json bytes.
    pub sha256: String,
    /// Number of ids (largest id + 1).
    pub vocab_size: u64,
    /// Id put before each document, if any.
    pub bos_id: Option<u32>,
    /// Id put after each document, if any.
    pub eos_id: Option<u32>,
}

/// One `.bin`/`.idx` pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// File prefix inside the directory: `<prefix>.bin`, `<prefix>.idx`.
    pub prefix: String,
    /// Packed samples (Megatron documents).
    pub samples: u64,
    /// Document pieces (Megatron sequences).
    pub pieces: u64,
    /// Tokens in the `.bin`.
    pub tokens: u64,
    /// Size of the `.bin` in bytes.
    pub bin_bytes: u64,
    /// Size of the `.idx` in bytes.
    pub idx_bytes: u64,
    /// xxh3-64 of the `.bin`, 16 hex digits.
    pub bin_xxh3: String,
    /// xxh3-64 of the `.idx`, 16 hex digits.
    pub idx_xxh3: String,
    /// The shard's loss mask, `<prefix>-mask.bin`/`.idx`, when the directory has one
    /// ([`Manifest::loss_mask`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_mask: Option<MaskFiles>,
}

/// The file prefix of shard `prefix`'s loss mask: `<prefix>-mask.bin`/`.idx`.
pub fn mask_prefix(prefix: &str) -> String {
    format!("{prefix}-mask")
}

/// The loss-mask pair of one shard: a Megatron `.bin`/`.idx` of uint8, one byte per token (1 =
/// the token is a training target), indexed exactly as the token pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaskFiles {
    /// Size of `<prefix>-mask.bin` (= the shard's token count).
    pub bin_bytes: u64,
    /// Size of `<prefix>-mask.idx`.
    pub idx_bytes: u64,
    /// xxh3-64 of `<prefix>-mask.bin`, 16 hex digits.
    pub bin_xxh3: String,
    /// xxh3-64 of `<prefix>-mask.idx`, 16 hex digits.
    pub idx_xxh3: String,
    /// Tokens marked 1 (training targets).
    pub trained_tokens: u64,
}

/// What a directory's loss masks mean: which tokens of each chat were marked as targets, and
/// with which template the chats were rendered (`rsd-data pack --chat`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossMaskInfo {
    /// `assistant`, `last-assistant` or `all`.
    pub train_on: String,
    /// Where the chat template came from.
    pub chat_template: String,
    /// SHA-256 of the template's text.
    pub chat_template_sha256: String,
    /// Tokens marked as targets over the directory.
    pub trained_tokens: u64,
}

/// Counts over the whole directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    /// Packed samples.
    pub samples: u64,
    /// Tokens stored, padding included.
    pub tokens: u64,
    /// Source documents that went into the shards.
    pub documents: u64,
    /// Document pieces (a document split across samples counts once per sample).
    pub pieces: u64,
    /// Padding tokens stored (tail padding in `fixed` mode).
    pub padding_tokens: u64,
    /// Slots left empty in `mixed` mode: `samples × seq_len − tokens`.
    pub unused_slots: u64,
    /// Tokens read but not stored (a dropped tail).
    pub dropped_tokens: u64,
    /// Tokens read but not stored because `--truncate` keeps only the first window of each
    /// source sample.
    #[serde(default)]
    pub truncated_tokens: u64,
    /// Documents skipped (empty, shorter than the minimum, or bad input with `--skip-bad`).
    pub skipped_documents: u64,
    /// What `--skip-bad` skipped: one entry per input file and cause, in reading order. Empty
    /// without `--skip-bad` and in manifests written before it was recorded.
    #[serde(default)]
    pub bad_inputs: Vec<BadInput>,
}

/// Bad input of one cause in one file, skipped with `rsd-data pack --skip-bad`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadInput {
    /// The input file (or repository or MDS directory).
    pub path: String,
    /// Why: `unreadable`, `truncated`, `corrupt`, `wrong-format`, `schema` or `bad-record`.
    pub cause: String,
    /// Skipped items: bad records (lines, rows, samples), or 1 for the rest of a file that could
    /// not be read on.
    pub count: u64,
    /// The first of these errors, as it would have been reported without `--skip-bad`.
    pub first: String,
}

/// One `--src` as given and what was read from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The source as the user wrote it.
    pub spec: String,
    /// The resolved path.
    pub path: String,
    /// Detected or forced format.
    pub format: String,
    /// Files read.
    pub files: u64,
    /// Documents read (before filtering).
    pub documents: u64,
    /// Input bytes of document text or token data.
    pub bytes: u64,
}

impl Manifest {
    /// Read and check `dir/index.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        let path = dir.join(MANIFEST_FILE);
        // A regular file of bounded size: a FIFO or a device in its place is refused, not read.
        let bytes = read_regular(&path, MAX_METADATA_BYTES, "manifest").map_err(|e| match e {
            FsError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                ShardError::Manifest {
                    path: path.clone(),
                    what: "no manifest: this is not a finished shard directory (an interrupted \
                           `rsd-data pack` leaves none; run it again to resume)"
                        .into(),
                }
            }
            other => other.into(),
        })?;
        Manifest::parse(&bytes, &path)
    }

    /// Decode and check the bytes of a manifest (`path` names it in errors): valid JSON of the
    /// schema, the right format name and version. Says nothing about the files it names; the
    /// reader and [`crate::verify`] check those.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<Manifest> {
        let path = path.to_path_buf();
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| ShardError::Manifest {
                path: path.clone(),
                what: format!(
                    "not a valid rsd manifest at line {} column {}: {e}",
                    e.line(),
                    e.column()
                ),
            })?;
        if manifest.format != FORMAT_NAME {
            return Err(ShardError::Manifest {
                path,
                what: format!(
                    "format is \"{}\", expected \"{FORMAT_NAME}\"",
                    manifest.format
                ),
            });
        }
        if manifest.version != FORMAT_VERSION {
            return Err(ShardError::Manifest {
                path,
                what: format!(
                    "manifest version {} but this build reads version {FORMAT_VERSION}; use a matching rsd",
                    manifest.version
                ),
            });
        }
        Ok(manifest)
    }

    /// Write `dir/index.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let mut text = serde_json::to_string_pretty(self)
            .map_err(|e| ShardError::Invalid(format!("cannot serialize manifest: {e}")))?;
        text.push('\n');
        rsd_common::safe_fs::write_file_atomic(&dir.join(MANIFEST_FILE), text.as_bytes())?;
        Ok(())
    }
}
