//! Run checkpoints: atomic directories, the newest `keep` kept.
//!
//! ```text
//! <out>/checkpoints/step-00000040/
//!     model/                 HF directory (config.json + safetensors), loadable by transformers
//!     optimizer.safetensors  AdamW moments (+ fp32 master weights for bf16 models), replicated runs
//!     optimizer-RRRRR-of-NNNNN.safetensors   rank R's blocks of the state, sharded runs
//!     state.json             step, tokens, loader state, RNG key, schedule, counters (versioned)
//!     config.toml            the resolved training config
//!     manifest.json          written last: every file with its size and sha256, the world
//!                            (world, dp, cp) and the optimizer's layout (buckets, bucket_elems)
//! ```
//!
//! Everything is written into `.step-N.tmp-<pid>` (rank 0's pid; every rank of a sharded run
//! writes its own optimizer file there, on a filesystem all ranks share) and renamed into place
//! only when complete: each rank fsyncs its file, a barrier, then rank 0 writes the manifest,
//! fsyncs the tree and renames. So a `step-*` directory is always whole: a crash of any rank, or
//! a non-finite step, never leaves a half-written or bad checkpoint in place of the last good
//! one. Older checkpoints are removed only after the new one is in place. A failed write (a full
//! disk) removes its temporary directory and leaves the checkpoints as they were.
//!
//! Before a resume, [`validate`] checks a directory without loading a tensor: the manifest
//! present, every file it lists there with its size, every safetensors file exactly as long as
//! its header says, `state.json` of this step with the seed and data of the checkpoint's
//! `config.toml` (the run's config, which a resume restores: [`crate::resume`]). `--resume auto` takes the
//! newest checkpoint that passes ([`auto_resume`]). The checksums are verified when the files are
//! read ([`verify_checksums`], each rank a share of the files).
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tch::Tensor;

use rsd_common::hex;
use rsd_loader::LoaderState;
use rsd_model::{Model, SaveOptions};

use crate::config::TrainConfig;
use crate::optim::Schedule;
use crate::{io_err, Error, Result};

/// The file a checkpoint is complete with.
pub const MANIFEST: &str = "manifest.json";

/// Version of [`Manifest`].
pub const MANIFEST_VERSION: u32 = 1;

/// What a checkpoint holds and how it was laid out, written last (by rank 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_VERSION`].
    pub version: u32,
    /// Processes of the run that wrote it.
    pub world: usize,
    /// Its data-parallel ranks.
    pub dp: usize,
    /// Its context-parallel ranks per sequence.
    pub cp: usize,
    /// How the optimizer state is stored.
    pub optimizer: OptimizerLayout,
    /// Every file of the checkpoint but the manifest, relative to its directory.
    pub files: Vec<FileEntry>,
}

/// How a checkpoint stores the optimizer state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum OptimizerLayout {
    /// One `optimizer.safetensors`, every parameter's state by name (`m.<name>`, …).
    Replicated,
    /// One file per rank with its blocks of every bucket ([`crate::sharded`]).
    Sharded(ShardLayout),
}

/// The bucket layout of a sharded optimizer state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardLayout {
    /// The largest bucket asked for (`grad_bucket_mb` in fp32 elements).
    pub bucket_elems: usize,
    /// Ranks the buckets are split over (one file each).
    pub ranks: usize,
    /// `F32` or `F64`.
    pub state_dtype: String,
    /// Whether fp32 master weights are saved (bf16/fp16 models).
    pub master: bool,
    /// The buckets in order; file `r` holds elements `r·block .. (r+1)·block` of each.
    pub buckets: Vec<SavedBucket>,
}

/// One bucket of a [`ShardLayout`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedBucket {
    /// Elements per rank.
    pub block: i64,
    /// Its parameters, laid out flat in this order.
    pub params: Vec<SavedParam>,
}

/// A parameter of a [`SavedBucket`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedParam {
    /// HF name.
    pub name: String,
    /// Shape.
    pub shape: Vec<i64>,
}

/// A file of a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Path relative to the checkpoint directory.
    pub path: String,
    /// Length in bytes.
    pub bytes: u64,
    /// sha256, hex.
    pub sha256: String,
}

/// Length and sha256 (hex) of a file, read in 1 MiB pieces.
pub fn file_digest(path: &Path) -> Result<(u64, [u8; 32])> {
    rsd_common::digest::sha256_file(path).map_err(io_err(path))
}

/// The deepest a checkpoint's tree goes (rsd writes two levels: `model/…`).
const MAX_TREE_DEPTH: usize = 8;

/// The most entries a checkpoint's tree may hold (rsd writes a few dozen).
const MAX_TREE_ENTRIES: usize = 100_000;

/// The relative names of every file under checkpoint `dir`, sorted. A checkpoint rsd writes
/// holds only directories and regular files, so anything else met on the way (a symbolic link,
/// which could lead out of the checkpoint or back into it, a FIFO, a device) is an error naming
/// it, and no link is followed; a tree deeper or larger than any checkpoint is refused too.
pub fn files_under(dir: &Path) -> Result<Vec<String>> {
    fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<String>) -> Result<()> {
        let bad = |path: PathBuf, reason: String| Error::Checkpoint { path, reason };
        if depth > MAX_TREE_DEPTH {
            return Err(bad(
                dir.to_path_buf(),
                format!("directories nested deeper than {MAX_TREE_DEPTH}; not a checkpoint"),
            ));
        }
        for e in fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let p = e.path();
            // The entry's own type: a link is reported as a link, never followed.
            let t = e.file_type().map_err(io_err(&p))?;
            if t.is_dir() {
                walk(root, &p, depth + 1, out)?;
            } else if t.is_file() {
                let rel = p.strip_prefix(root).unwrap_or(&p);
                out.push(rel.to_string_lossy().into_owned());
            } else {
                let what = if t.is_symlink() {
                    "a symbolic link"
                } else {
                    "not a regular file"
                };
                return Err(bad(
                    p,
                    format!("{what}; a checkpoint holds only regular files and directories"),
                ));
            }
            if out.len() > MAX_TREE_ENTRIES {
                return Err(bad(
                    root.to_path_buf(),
                    format!("more than {MAX_TREE_ENTRIES} files; not a checkpoint"),
                ));
            }
        }
        Ok(())
    }
    let mut files = Vec::new();
    walk(dir, dir, 0, &mut files)?;
    files.sort();
    Ok(files)
}

/// [`FileEntry`]s of every file under `dir` (recursively) but those in `skip` and the manifest.
pub fn entries_under(dir: &Path, skip: &[String]) -> Result<Vec<FileEntry>> {
    let mut out = Vec::new();
    for name in files_under(dir)? {
        if name == MANIFEST || skip.contains(&name) {
            continue;
        }
        let (bytes, digest) = file_digest(&dir.join(&name))?;
        out.push(FileEntry {
            path: name,
            bytes,
            sha256: hex(&digest),
        });
    }
    Ok(out)
}

/// Reads `manifest.json` of a checkpoint directory.
pub fn read_manifest(dir: &Path) -> Result<Manifest> {
    let p = dir.join(MANIFEST);
    if !p.exists() {
        return Err(Error::Checkpoint {
            path: p,
            reason: "missing: not a complete checkpoint".into(),
        });
    }
    let text = read_text(&p)?;
    let m: Manifest = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    if m.version != MANIFEST_VERSION {
        return Err(Error::Checkpoint {
            path: p,
            reason: format!(
                "manifest version {} (this build reads {MANIFEST_VERSION})",
                m.version
            ),
        });
    }
    check_manifest(dir, &m).map_err(|reason| Error::Checkpoint { path: p, reason })?;
    Ok(m)
}

/// What a manifest must hold before anything is sized or opened from it: file names that stay in
/// the checkpoint, digests that are digests, and an optimizer layout whose counts the listed
/// files can back (a layout is read into memory per rank and per bucket).
fn check_manifest(dir: &Path, m: &Manifest) -> std::result::Result<(), String> {
    // A file listed twice is verified twice by one rank or split between two, and counts twice
    // toward what a layout can back.
    let mut seen: std::collections::HashMap<&str, usize> = Default::default();
    for (i, f) in m.files.iter().enumerate() {
        if let Some(first) = seen.insert(f.path.as_str(), i) {
            return Err(format!(
                "fields files[{first}].path and files[{i}].path: both name \"{}\"; a manifest \
                 lists each file once",
                rsd_common::printable::shortened(&f.path)
            ));
        }
    }
    for (i, f) in m.files.iter().enumerate() {
        rsd_common::safe_fs::check_relative_name(&f.path).map_err(|why| {
            format!(
                "field files[{i}].path: the name \"{}\" {why}; only a relative path inside {} \
                 is accepted",
                rsd_common::printable::shortened(&f.path),
                dir.display()
            )
        })?;
        if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "field files[{i}].sha256: \"{}\" is not a sha256 (64 hex digits)",
                rsd_common::printable::shortened(&f.sha256)
            ));
        }
    }
    if m.world == 0 || m.dp == 0 || m.cp == 0 || m.dp.checked_mul(m.cp) != Some(m.world) {
        return Err(format!(
            "fields world/dp/cp: world {} is not dp {} × cp {}",
            m.world, m.dp, m.cp
        ));
    }
    if let OptimizerLayout::Sharded(l) = &m.optimizer {
        check_shard_layout(l, m.files.len())?;
    }
    Ok(())
}

/// The most elements one saved parameter or bucket may have (2^40: far above any model's).
const MAX_SAVED_ELEMS: i64 = 1 << 40;

fn check_shard_layout(l: &ShardLayout, files: usize) -> std::result::Result<(), String> {
    if l.ranks == 0 || l.ranks > files {
        return Err(format!(
            "field optimizer.ranks: {} ranks, but the manifest lists {files} files (one per \
             rank at least)",
            l.ranks
        ));
    }
    for (j, b) in l.buckets.iter().enumerate() {
        let capacity = b.block.checked_mul(l.ranks as i64);
        if b.block < 1 || capacity.is_none_or(|c| c > MAX_SAVED_ELEMS) {
            return Err(format!(
                "field optimizer.buckets[{j}].block: {} elements per rank over {} ranks, \
                 expected 1 to {MAX_SAVED_ELEMS} in all",
                b.block, l.ranks
            ));
        }
        let mut used = 0i64;
        for (k, p) in b.params.iter().enumerate() {
            let numel = p
                .shape
                .iter()
                .try_fold(1i64, |n, &d| (d >= 0).then(|| n.checked_mul(d)).flatten());
            used = match numel.and_then(|n| used.checked_add(n)) {
                Some(u) if capacity.is_some_and(|c| u <= c) => u,
                _ => {
                    return Err(format!(
                        "field optimizer.buckets[{j}].params[{k}].shape: {:?} does not fit the \
                         bucket's {} elements",
                        p.shape,
                        capacity.unwrap_or(0)
                    ))
                }
            };
        }
    }
    Ok(())
}

/// The file entry `i` of `manifest` names in checkpoint `dir`: a regular file that stays inside
/// the checkpoint (no `..`, no absolute path, no link out), or an error naming the field.
pub fn manifest_file(dir: &Path, i: usize, entry: &FileEntry) -> Result<PathBuf> {
    let named_by =
        rsd_common::safe_fs::NamedBy::new(dir.join(MANIFEST), format!("files[{i}].path"));
    Ok(rsd_common::safe_fs::confined_file(
        dir,
        &entry.path,
        &named_by,
    )?)
}

/// Verifies the sha256 of the manifest's files `i` with `i % ranks == rank` (each rank of a
/// resuming run reads a share; one process reads all), naming the file that differs.
pub fn verify_checksums(dir: &Path, manifest: &Manifest, rank: usize, ranks: usize) -> Result<()> {
    for (i, f) in manifest.files.iter().enumerate() {
        if i % ranks.max(1) != rank {
            continue;
        }
        let p = manifest_file(dir, i, f)?;
        // The length first: a file of another size is damaged without reading it through.
        let len = fs::metadata(&p).map_err(io_err(&p))?.len();
        if len != f.bytes {
            return Err(Error::Checkpoint {
                reason: format!("{len} bytes, {MANIFEST} lists {}", f.bytes),
                path: p,
            });
        }
        let (bytes, digest) = file_digest(&p)?;
        if bytes != f.bytes || hex(&digest) != f.sha256 {
            return Err(Error::Checkpoint {
                path: p,
                reason: format!(
                    "{bytes} bytes with sha256 {}, the manifest lists {} bytes with sha256 {} \
                     (the file changed after it was written)",
                    hex(&digest),
                    f.bytes,
                    f.sha256
                ),
            });
        }
    }
    Ok(())
}

/// What one rank of a run of `ranks` processes verifies of the checkpoint in `dir` before
/// resuming it with `--resume auto`: its share of the manifest's files by sha256
/// ([`verify_checksums`]) and, when the checkpoint's optimizer is sharded over as many ranks,
/// the optimizer shard it will load itself.
pub fn verify_for_rank(dir: &Path, rank: usize, ranks: usize) -> Result<()> {
    let manifest = read_manifest(dir)?;
    verify_checksums(dir, &manifest, rank, ranks)?;
    let own = shard_file_name(rank, ranks);
    let listed = manifest
        .files
        .iter()
        .enumerate()
        .find(|(_, f)| f.path == own);
    if let Some((i, _)) = listed.filter(|(i, _)| i % ranks.max(1) != rank) {
        let only = Manifest {
            files: vec![manifest.files[i].clone()],
            ..manifest.clone()
        };
        verify_checksums(dir, &only, 0, 1)?;
    }
    Ok(())
}

/// Version of [`TrainState`].
pub const STATE_VERSION: u32 = 1;

/// Everything besides tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    /// [`STATE_VERSION`].
    pub version: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// Tokens consumed so far.
    pub tokens: u64,
    /// The loader's position after the last batch used.
    pub loader: LoaderState,
    /// RNG: perturbations of step k are drawn from a generator keyed by (seed, k, row), so the
    /// seed is the whole state.
    pub rng_seed: u64,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// Steps skipped for non-finite values so far.
    pub skipped: u64,
    /// Wall time spent so far, seconds.
    pub elapsed_s: f64,
}

/// The file rank `rank` of `ranks` writes its optimizer blocks to.
pub fn shard_file_name(rank: usize, ranks: usize) -> String {
    format!("optimizer-{rank:05}-of-{ranks:05}.safetensors")
}

/// How long a rank may wait for the others in a checkpoint's phases: `checkpoint_timeout`, or
/// (0) sized from what rank 0 writes and hashes ([`rank0_bytes`]) at 50 MB/s plus 10 minutes;
/// never below `dist_timeout`. Unknown bytes (an unreadable model config): an hour.
pub fn save_timeout(cfg: &TrainConfig, dp: usize) -> std::time::Duration {
    let step = std::time::Duration::from_secs(cfg.dist_timeout);
    if cfg.checkpoint_timeout > 0 {
        return std::time::Duration::from_secs(cfg.checkpoint_timeout).max(step);
    }
    let Some(bytes) = rank0_bytes(cfg, dp) else {
        return std::time::Duration::from_secs(3600).max(step);
    };
    std::time::Duration::from_secs_f64(600.0 + bytes / 50e6).max(step)
}

/// The bytes rank 0 writes in a checkpoint: the model in its dtype and the optimizer state (its
/// 1/`dp` share when sharded). The parameter count comes from the model's config.json (`model`
/// or `init`); `None` when it cannot be read.
pub fn rank0_bytes(cfg: &TrainConfig, dp: usize) -> Option<f64> {
    let config = match (&cfg.model, &cfg.init) {
        (Some(dir), _) => Path::new(dir).join("config.json"),
        (None, Some(init)) => PathBuf::from(init),
        (None, None) => PathBuf::new(),
    };
    let params = rsd_model::ModelConfig::from_file(&config)
        .ok()?
        .num_parameters();
    let (weight, state) = match cfg.dtype.as_str() {
        "bf16" | "bfloat16" | "fp16" | "float16" | "f16" => (2.0, 12.0),
        "fp64" | "float64" | "f64" => (8.0, 16.0),
        _ => (4.0, 8.0),
    };
    let share = if cfg.shard_optimizer {
        dp.max(1) as f64
    } else {
        1.0
    };
    Some(params.max(0) as f64 * (weight + state / share))
}

/// The checkpoint directory of `step` under `out`.
pub fn dir_for(out: &Path, step: u64) -> PathBuf {
    out.join("checkpoints").join(format!("step-{step:08}"))
}

/// Complete checkpoints under `out`, oldest first.
pub fn list(out: &Path) -> Vec<(u64, PathBuf)> {
    if !own_checkpoints_dir(out) {
        return Vec::new();
    }
    let mut v: Vec<(u64, PathBuf)> = fs::read_dir(out.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            // A link planted among the checkpoints is not one (it could lead anywhere).
            if !e.file_type().ok()?.is_dir() {
                return None;
            }
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    v.sort();
    v
}

/// Whether `out/checkpoints` is a real directory (not a link planted in its place): only then
/// are checkpoints looked for, or stale temporaries removed, there.
pub(crate) fn own_checkpoints_dir(out: &Path) -> bool {
    fs::symlink_metadata(out.join("checkpoints")).is_ok_and(|m| m.file_type().is_dir())
}

/// Refuses a run whose `checkpoints` is anything but a directory of its own (a link planted
/// there, a file): checked before a resume looks for checkpoints, so the run stops naming it.
pub fn check_checkpoints_dir(out: &Path) -> Result<()> {
    let dir = out.join("checkpoints");
    match fs::symlink_metadata(&dir) {
        Err(_) => Ok(()),
        Ok(_) => Ok(rsd_common::safe_fs::create_own_dir(&dir)?),
    }
}

/// The temporary directory a checkpoint of `step` is written into, `pid` being the writing
/// process's (rank 0's in a multi-process run).
pub fn temp_dir_for(out: &Path, step: u64, pid: u32) -> PathBuf {
    out.join("checkpoints")
        .join(format!(".step-{step:08}.tmp-{pid}"))
}

/// Creates an empty temporary directory `tmp` (removing a leftover of the same name).
pub fn create_temp(tmp: &Path) -> Result<()> {
    // `checkpoints/` is the run's own: a link planted there would take the checkpoints, and
    // the pruning of old ones, to wherever it points.
    if let Some(parent) = tmp.parent() {
        rsd_common::safe_fs::create_own_dir(parent)?;
    }
    if tmp.exists() {
        fs::remove_dir_all(tmp).map_err(io_err(tmp))?;
    }
    fs::create_dir_all(tmp).map_err(io_err(tmp))
}

/// Removes a temporary directory when dropped, unless it was renamed away (or disarmed): a failed
/// checkpoint write (a full disk) leaves nothing behind.
pub struct RemoveOnDrop(pub Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            if p.exists() {
                let _ = fs::remove_dir_all(p);
            }
        }
    }
}

/// Writes what rank 0 writes into a checkpoint's temporary directory: the model (with the
/// tokenizer files of `tokenizer`, if given), the optimizer state of a replicated run (`None`
/// for a sharded one, whose ranks write their own files), `state.json` and `config.toml`.
pub fn write_main(
    tmp: &Path,
    model: &Model,
    optimizer: Option<&[(String, Tensor)]>,
    state: &TrainState,
    cfg: &TrainConfig,
    tokenizer: Option<&Path>,
) -> Result<()> {
    let model_opts = SaveOptions {
        tokenizer_from: tokenizer.map(Path::to_path_buf),
        ..SaveOptions::default()
    };
    model.save(&tmp.join("model"), &model_opts)?;
    write_training_record(&tmp.join("model"), cfg, state.step)?;
    if let Some(named) = optimizer {
        Tensor::write_safetensors(named, tmp.join("optimizer.safetensors"))?;
    }
    let json = serde_json::to_string_pretty(state).map_err(|e| Error::Input(e.to_string()))?;
    let sp = tmp.join("state.json");
    fs::write(&sp, json).map_err(io_err(&sp))?;
    let cp = tmp.join("config.toml");
    fs::write(&cp, cfg.to_toml()).map_err(io_err(&cp))?;
    fault::disk_full(tmp)?;
    fault::slow_save();
    Ok(())
}

/// The file a model rsd-train saves carries its training record in: evaluations copy it into
/// their `run.json`, so a result says which run, seed and step it came from.
pub const TRAINING_RECORD: &str = "rsd_training.json";

/// The largest training record read back from the model a run started from.
const MAX_TRAINING_RECORD_BYTES: u64 = 1 << 20;

/// Writes `model_dir/rsd_training.json`: the seed, the steps taken, the objective and what the
/// run started from, as `cfg` and `steps` say: the initialisation seed of a model drawn from
/// scratch, or the training record of the model it started from (`started_from`, and so on back
/// to the first run: an adapted model names its base's seeds) and the sha256 of that model's
/// weights as rsd-eval computes it (`started_from_weights_sha256`).
pub fn write_training_record(model_dir: &Path, cfg: &TrainConfig, steps: u64) -> Result<()> {
    let start = cfg.model.as_deref().filter(|m| !m.is_empty());
    let record = serde_json::json!({
        "created_by": format!("rsd-train {}", env!("CARGO_PKG_VERSION")),
        "seed": cfg.seed,
        "init_seed": start.is_none().then_some(cfg.init_seed),
        "started_from": start.map_or(serde_json::Value::Null, |m| {
            parent_record(&Path::new(m).join(TRAINING_RECORD))
        }),
        // The path alone names the start only while nothing moves or retrains it there.
        "started_from_weights_sha256": start.map_or(Ok(serde_json::Value::Null), |m| {
            rsd_common::digest::model_weights(Path::new(m))
                .map(|w| serde_json::Value::String(w.sha256))
                .map_err(io_err(Path::new(m)))
        })?,
        "steps": steps,
        "objective": cfg.objective.to_string(),
        "perturb": cfg.perturb.to_string(),
        "lambda": cfg.lambda,
        "lr": cfg.lr,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "model": cfg.model,
        "init": cfg.init,
        "shards": cfg.shards,
    });
    let text = serde_json::to_string_pretty(&record).map_err(|e| Error::Input(e.to_string()))?;
    Ok(rsd_common::safe_fs::write_file_atomic(
        &model_dir.join(TRAINING_RECORD),
        format!("{text}\n").as_bytes(),
    )?)
}

/// The training record at `path` (of the model a run started from), or null when there is none
/// or it cannot be read as one (a model from elsewhere; a record too large or too deeply nested).
fn parent_record(path: &Path) -> serde_json::Value {
    rsd_common::safe_fs::read_text(path, MAX_TRAINING_RECORD_BYTES, "training record")
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Rank 0, after every rank's files are in `tmp`: writes the manifest (`manifest`'s `files`
/// completed with rank 0's own files, hashed here), fsyncs the tree, renames it to step
/// `step`'s directory and prunes to the newest `keep`.
pub fn publish(
    out: &Path,
    tmp: &Path,
    step: u64,
    mut manifest: Manifest,
    keep: usize,
) -> Result<PathBuf> {
    let known: Vec<String> = manifest.files.iter().map(|f| f.path.clone()).collect();
    manifest.files.extend(entries_under(tmp, &known)?);
    manifest.files.sort_by(|a, b| a.path.cmp(&b.path));
    fault::die_at("manifest", step, 0);
    let mp = tmp.join(MANIFEST);
    let json = serde_json::to_string_pretty(&manifest).map_err(|e| Error::Input(e.to_string()))?;
    fs::write(&mp, json).map_err(io_err(&mp))?;
    rsd_common::safe_fs::fsync_tree(tmp)?;
    fault::die_at("rename", step, 0);
    let target = dir_for(out, step);
    rsd_common::safe_fs::replace_dir(tmp, &target)?;
    fault::die_at("published", step, 0);
    let all = list(out);
    if all.len() > keep.max(1) {
        for (_, p) in &all[..all.len() - keep.max(1)] {
            fs::remove_dir_all(p).map_err(io_err(p))?;
        }
    }
    Ok(target)
}

/// Writes a one-process checkpoint (replicated optimizer state) atomically and prunes to the
/// newest `keep`; its model directory gets the tokenizer files of `tokenizer`, if given.
pub fn save(
    out: &Path,
    model: &Model,
    optimizer: &[(String, Tensor)],
    state: &TrainState,
    cfg: &TrainConfig,
    keep: usize,
    tokenizer: Option<&Path>,
) -> Result<PathBuf> {
    let tmp = temp_dir_for(out, state.step, std::process::id());
    create_temp(&tmp)?;
    let mut cleanup = RemoveOnDrop(Some(tmp.clone()));
    write_main(&tmp, model, Some(optimizer), state, cfg, tokenizer)?;
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        world: 1,
        dp: 1,
        cp: 1,
        optimizer: OptimizerLayout::Replicated,
        files: Vec::new(),
    };
    let target = publish(out, &tmp, state.step, manifest, keep)?;
    cleanup.0 = None;
    Ok(target)
}

/// The most bytes a checkpoint's `state.json` or `config.toml` may have (real ones hold a few
/// KB; the loader state grows by a few numbers per dataset).
const MAX_CHECKPOINT_TEXT: u64 = 64 << 20;

/// A small text file of a checkpoint: a regular file, bounded, UTF-8.
fn read_text(p: &Path) -> Result<String> {
    let bytes = rsd_common::safe_fs::read_regular(p, MAX_CHECKPOINT_TEXT, "checkpoint text file")
        .map_err(|e| Error::Input(format!("checkpoint {e}")))?;
    String::from_utf8(bytes).map_err(|e| Error::Checkpoint {
        path: p.to_path_buf(),
        reason: format!("not UTF-8 text: {e}"),
    })
}

/// Reads `state.json` of a checkpoint directory, with its counters checked (a state whose
/// counters contradict each other is damaged or forged, and would wrap later).
pub fn read_state(dir: &Path) -> Result<TrainState> {
    let p = dir.join("state.json");
    let text = read_text(&p)?;
    let st: TrainState = serde_json::from_str(&text).map_err(|e| Error::Checkpoint {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    let bad = |reason: String| {
        Err(Error::Checkpoint {
            path: p.clone(),
            reason,
        })
    };
    if st.version != STATE_VERSION {
        return bad(format!(
            "state version {} (this build reads {STATE_VERSION})",
            st.version
        ));
    }
    if st.skipped > st.step {
        return bad(format!(
            "field skipped: {} skipped steps of {} steps",
            st.skipped, st.step
        ));
    }
    if !(st.elapsed_s.is_finite() && st.elapsed_s >= 0.0) {
        return bad(format!(
            "field elapsed_s: {}, expected a number of seconds ≥ 0",
            st.elapsed_s
        ));
    }
    Ok(st)
}

/// Reads the run's config (`config.toml`) of a checkpoint directory.
pub fn read_config(dir: &Path) -> Result<TrainConfig> {
    let p = dir.join("config.toml");
    if !p.exists() {
        return Err(Error::Checkpoint {
            path: p,
            reason: "missing (the run's config)".into(),
        });
    }
    let text = read_text(&p)?;
    toml::from_str(&text).map_err(|e| Error::Checkpoint {
        path: p,
        reason: format!(
            "not a training config: {}",
            rsd_common::printable::shortened_lines(&e.to_string())
        ),
    })
}

/// Checks that the safetensors file at `path` is whole: its header parses and the file is exactly
/// as long as the header's tensors need (a truncated write fails this).
pub fn check_safetensors(path: &Path) -> Result<()> {
    let bad = |reason: String| Error::Checkpoint {
        path: path.to_path_buf(),
        reason,
    };
    let mut f =
        rsd_common::safe_fs::open_regular(path).map_err(|e| bad(format!("cannot open: {e}")))?;
    let len = f.metadata().map_err(io_err(path))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| bad(format!("truncated: {len} bytes, no safetensors header")))?;
    let n = u64::from_le_bytes(n);
    if n > len.saturating_sub(8) || n > 100 << 20 {
        return Err(bad(format!(
            "truncated: {len} bytes, the header alone claims {n}"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(io_err(path))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("unreadable safetensors header: {e}")))?;
    let mut end = 0u64;
    for (name, t) in &header {
        if name == "__metadata__" {
            continue;
        }
        let e = t
            .get("data_offsets")
            .and_then(|o| o.get(1))
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| bad(format!("tensor {name} has no data_offsets")))?;
        end = end.max(e);
    }
    let expected = 8 + n + end;
    if len != expected {
        return Err(bad(format!(
            "{} bytes, the header describes {expected}{}",
            len,
            if len < expected { " (truncated)" } else { "" }
        )));
    }
    Ok(())
}

/// A checkpoint that passed [`validate`]: its state and its run's config.
#[derive(Debug, Clone)]
pub struct Valid {
    /// `state.json`.
    pub state: TrainState,
    /// `config.toml`: the config of the run that wrote it.
    pub config: TrainConfig,
}

/// Checks that checkpoint `dir` is complete and consistent, without loading a tensor, and
/// returns its state and config. The error names the file at fault: no manifest (an unfinished
/// checkpoint), a file of another length than the manifest lists, a safetensors file shorter (or
/// longer) than its header says, a missing model or optimizer file, a `state.json` that is not
/// this step's or has another seed or data than the checkpoint's `config.toml` (a file copied
/// from another run). Whether the command may resume it as it stands is [`crate::resume`]'s.
pub fn validate(dir: &Path) -> Result<Valid> {
    let bad = |path: PathBuf, reason: String| Error::Checkpoint { path, reason };
    if !dir.is_dir() {
        return Err(bad(dir.to_path_buf(), "no such directory".into()));
    }
    // What the directory holds first: nothing below is opened through a planted link.
    let manifest = read_manifest(dir)?;
    check_tree(dir, &manifest)?;
    let st = read_state(dir)?;
    let sp = dir.join("state.json");
    let named_step = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse::<u64>().ok());
    if let Some(k) = named_step.filter(|&k| k != st.step) {
        return Err(bad(
            sp,
            format!("holds step {}, the directory is step {k}", st.step),
        ));
    }
    let cfg = read_config(dir)?;
    if st.rng_seed != cfg.seed || st.loader.seed != cfg.seed {
        return Err(bad(
            sp,
            format!(
                "seed {} (another run's state?), the checkpoint's config.toml has seed {}",
                st.rng_seed, cfg.seed
            ),
        ));
    }
    let datasets = cfg
        .shards
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .count();
    if st.loader.datasets.len() != datasets {
        return Err(bad(
            sp,
            format!(
                "the loader state has {} dataset(s), the checkpoint's config.toml {datasets}",
                st.loader.datasets.len()
            ),
        ));
    }
    let model = dir.join("model");
    let mc = model.join("config.json");
    rsd_model::ModelConfig::from_file(&mc)?;
    let is_weights = |f: &&FileEntry| f.path.ends_with(".safetensors");
    if !manifest
        .files
        .iter()
        .filter(is_weights)
        .any(|f| f.path.starts_with("model/"))
    {
        return Err(bad(model, "no .safetensors weights".into()));
    }
    let optimizer_files: Vec<String> = match &manifest.optimizer {
        OptimizerLayout::Replicated => vec!["optimizer.safetensors".into()],
        OptimizerLayout::Sharded(l) => (0..l.ranks).map(|r| shard_file_name(r, l.ranks)).collect(),
    };
    for name in &optimizer_files {
        if !manifest.files.iter().any(|f| &f.path == name) || !dir.join(name).is_file() {
            return Err(bad(dir.join(name), "missing (the optimizer state)".into()));
        }
    }
    for (i, f) in manifest.files.iter().enumerate() {
        let p = dir.join(&f.path);
        if !p.exists() {
            return Err(bad(p, format!("missing (listed in {MANIFEST})")));
        }
        let p = manifest_file(dir, i, f)?;
        // A damaged weight file is named as such before its length is compared.
        if is_weights(&f) {
            check_safetensors(&p)?;
        }
        let len = fs::metadata(&p).map_err(io_err(&p))?.len();
        if len != f.bytes {
            return Err(bad(p, format!("{len} bytes, {MANIFEST} lists {}", f.bytes)));
        }
    }
    Ok(Valid {
        state: st,
        config: cfg,
    })
}

/// Checks that checkpoint `dir` holds exactly the files its manifest lists: the tree walked
/// without following a link ([`files_under`]), every listed file there, and nothing else (a file
/// added after the checkpoint was written would be read unverified: a weight map, a tokenizer).
fn check_tree(dir: &Path, manifest: &Manifest) -> Result<()> {
    let present = files_under(dir)?;
    let listed: std::collections::BTreeSet<&str> =
        manifest.files.iter().map(|f| f.path.as_str()).collect();
    if let Some(extra) = present
        .iter()
        .find(|p| p.as_str() != MANIFEST && !listed.contains(p.as_str()))
    {
        return Err(Error::Checkpoint {
            path: dir.join(extra),
            reason: format!(
                "not listed in {MANIFEST}: added after the checkpoint was written (remove it)"
            ),
        });
    }
    Ok(())
}

/// What `--resume auto` found under a run directory.
#[derive(Debug, Default)]
pub struct AutoResume {
    /// The newest checkpoint that passed [`validate`], and what it holds; `None`: start fresh.
    pub chosen: Option<(PathBuf, Valid)>,
    /// Newer checkpoints that failed it, newest first, with why.
    pub skipped: Vec<(PathBuf, Error)>,
}

/// The newest checkpoint under `out` that [`validate`] accepts, and those skipped on the way.
pub fn auto_resume(out: &Path) -> AutoResume {
    let mut found = AutoResume::default();
    for (_, dir) in list(out).into_iter().rev() {
        match validate(&dir) {
            Ok(valid) => {
                found.chosen = Some((dir, valid));
                break;
            }
            Err(e) => found.skipped.push((dir, e)),
        }
    }
    found
}

/// Test hooks, compiled only with the `fault-injection` feature (tests/test_train_faults.py).
mod fault {
    use std::path::Path;

    use crate::Result;

    /// `RSD_TRAIN_FAULT_DISK_FULL_AT=[STEP:]FILE` (FILE a path inside the checkpoint, e.g.
    /// `optimizer.safetensors` or `model/model.safetensors`): the disk fills up while FILE of
    /// step STEP's checkpoint (of every checkpoint without `STEP:`) is written; the file is cut
    /// to half its length and the write fails with ENOSPC.
    #[cfg(feature = "fault-injection")]
    pub fn disk_full(tmp: &Path) -> Result<()> {
        let Ok(spec) = std::env::var("RSD_TRAIN_FAULT_DISK_FULL_AT") else {
            return Ok(());
        };
        let (step, name) = match spec.split_once(':') {
            Some((s, n)) => (s.parse::<u64>().ok(), n.to_string()),
            None => (None, spec),
        };
        // The temporary directory is `.step-NNNNNNNN.tmp-PID`.
        let this = tmp
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix(".step-"))
            .and_then(|n| n.split('.').next())
            .and_then(|n| n.parse::<u64>().ok());
        if step.is_some() && step != this {
            return Ok(());
        }
        let p = tmp.join(name);
        let len = std::fs::metadata(&p).map(|m| m.len()).unwrap_or(0);
        if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&p) {
            let _ = f.set_len(len / 2);
        }
        Err(crate::Error::Io {
            path: p,
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        })
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn disk_full(_tmp: &Path) -> Result<()> {
        Ok(())
    }

    /// `RSD_TRAIN_FAULT_SLOW_SAVE_S=N`: rank 0 takes N more seconds to write each checkpoint's
    /// model and state, as a large model on a slow filesystem does. `RSD_TRAIN_FAULT_SAVE_WAITS_FOR
    /// =PATH`: it takes until PATH exists (a test's event, however fast the machine).
    #[cfg(feature = "fault-injection")]
    pub fn slow_save() {
        if let Some(s) = std::env::var("RSD_TRAIN_FAULT_SLOW_SAVE_S")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
        {
            std::thread::sleep(std::time::Duration::from_secs_f64(s.max(0.0)));
        }
        if let Some(path) = std::env::var_os("RSD_TRAIN_FAULT_SAVE_WAITS_FOR") {
            while !Path::new(&path).exists() {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn slow_save() {}

    /// `RSD_TRAIN_FAULT_DIE_AT=STEP:RANK:POINT`: rank RANK kills itself (SIGKILL, as `kill -9`)
    /// at POINT of step STEP's checkpoint: `shard` (its optimizer file written, before the
    /// barrier), `main` (rank 0: model and state written, before the barrier), `manifest` (rank
    /// 0: before the manifest), `rename` (rank 0: manifest written and fsynced, before the
    /// rename), `published` (rank 0: renamed, before pruning and the last barrier), `after` (at
    /// the last barrier).
    #[cfg(feature = "fault-injection")]
    pub fn die_at(point: &str, step: u64, rank: usize) {
        let Ok(spec) = std::env::var("RSD_TRAIN_FAULT_DIE_AT") else {
            return;
        };
        let want: Vec<&str> = spec.split(':').collect();
        if want.as_slice() == [step.to_string().as_str(), rank.to_string().as_str(), point] {
            eprintln!("fault injection: rank {rank} killed at {point} of step {step}'s checkpoint");
            // SAFETY: signals this process; nothing after it runs.
            unsafe {
                libc::kill(libc::getpid(), libc::SIGKILL);
            }
        }
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn die_at(_point: &str, _step: u64, _rank: usize) {}
}

/// The fault hook of checkpoint writing (`RSD_TRAIN_FAULT_DIE_AT`), for the trainer's ranks.
pub(crate) fn die_at(point: &str, step: u64, rank: usize) {
    fault::die_at(point, step, rank);
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_checkpoints_wait_is_sized_from_what_rank_0_writes() {
        use std::time::Duration;
        let llama = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../configs/model/llama3-8b.json"
        );
        let cfg = |dtype: &str, shard: bool, explicit: u64| TrainConfig {
            init: Some(llama.into()),
            dtype: dtype.into(),
            shard_optimizer: shard,
            checkpoint_timeout: explicit,
            ..TrainConfig::default()
        };
        let params = rsd_model::ModelConfig::from_file(Path::new(llama))
            .unwrap()
            .num_parameters() as f64;
        // bf16, replicated: 2 + 12 bytes a parameter at 50 MB/s, plus 10 minutes.
        let want = 600.0 + params * 14.0 / 50e6;
        let got = save_timeout(&cfg("bf16", false, 0), 8).as_secs_f64();
        assert!((got - want).abs() < 1.0, "{got} vs {want}");
        // Sharded over 8 ranks: rank 0 writes an eighth of the state.
        let got = save_timeout(&cfg("bf16", true, 0), 8).as_secs_f64();
        let want = 600.0 + params * (2.0 + 12.0 / 8.0) / 50e6;
        assert!((got - want).abs() < 1.0, "{got} vs {want}");
        // Stated: taken as given, never below the step's timeout (dist_timeout, 300 s).
        assert_eq!(
            save_timeout(&cfg("bf16", false, 4000), 1),
            Duration::from_secs(4000)
        );
        assert_eq!(
            save_timeout(&cfg("bf16", false, 8), 1),
            Duration::from_secs(300)
        );
        // No readable config: an hour.
        let none = TrainConfig {
            init: Some("/nonexistent.json".into()),
            ..TrainConfig::default()
        };
        assert_eq!(save_timeout(&none, 1), Duration::from_secs(3600));
    }

    use super::*;
    use rsd_loader::synth::{self, SynthSpec};
    use rsd_loader::Loader;
    use rsd_model::{ModelConfig, ModelOptions};

    use crate::optim::AdamWConfig;

    /// A run directory with complete checkpoints of steps 1, 2 and 3 of a tiny model.
    fn run_with_checkpoints(root: &Path) -> (PathBuf, TrainConfig) {
        let shards = root.join("shards");
        synth::write(
            &shards,
            &SynthSpec {
                samples: 8,
                seq_len: 16,
                vocab: 64,
                ..SynthSpec::default()
            },
        )
        .expect("shards");
        let cfg = TrainConfig {
            shards: shards.display().to_string(),
            ..TrainConfig::default()
        };
        let config = serde_json::json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 64,
            "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1});
        let model = Model::random(
            ModelConfig::from_hf_json(config).expect("config"),
            ModelOptions::default(),
            0,
        )
        .expect("model");
        let opt = crate::optim::AdamW::new(
            &model,
            AdamWConfig {
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.0,
            },
        )
        .expect("optimizer");
        let loader = Loader::new(
            crate::data::loader_config(&cfg, rsd_loader::Parallel::default()).expect("cfg"),
        )
        .expect("loader");
        let out = root.join("run");
        for step in 1..=3 {
            let state = TrainState {
                version: STATE_VERSION,
                step,
                tokens: 0,
                loader: loader.state(),
                rng_seed: cfg.seed,
                schedule: Schedule {
                    lr: 1e-3,
                    warmup: 0,
                    total: 10,
                    min_ratio: 0.1,
                },
                skipped: 0,
                elapsed_s: 0.0,
            };
            save(&out, &model, &opt.state_tensors(), &state, &cfg, 3, None).expect("save");
        }
        (out, cfg)
    }

    /// Rewrites checkpoint `dir`'s manifest through `edit`.
    fn edit_manifest(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
        let p = dir.join(MANIFEST);
        let mut m: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(&p).expect("read")).expect("json");
        edit(&mut m);
        fs::write(&p, m.to_string()).expect("write");
    }

    #[test]
    fn a_manifest_listing_one_file_twice_is_refused_naming_both_entries() {
        let root = tempfile::tempdir().expect("tempdir");
        let (out, _) = run_with_checkpoints(root.path());
        let three = dir_for(&out, 3);
        edit_manifest(&three, |m| {
            let first = m["files"][0].clone();
            m["files"].as_array_mut().expect("files").push(first);
        });
        let e = read_manifest(&three).expect_err("twice").to_string();
        assert!(
            e.contains("fields files[0].path and files[") && e.contains("lists each file once"),
            "{e}"
        );
    }

    #[test]
    fn a_manifest_names_no_file_outside_its_checkpoint() {
        let root = tempfile::tempdir().expect("tempdir");
        let (out, _) = run_with_checkpoints(root.path());
        let three = dir_for(&out, 3);
        fs::write(root.path().join("outside"), b"secret").expect("write");
        for (name, why) in [
            ("../../../outside", "has a `..` component"),
            ("/dev/zero", "absolute"),
        ] {
            edit_manifest(&three, |m| m["files"][0]["path"] = name.into());
            let e = validate(&three).expect_err(name).to_string();
            assert!(e.contains("field files[0].path") && e.contains(why), "{e}");
            let m = read_manifest(&three);
            assert!(m.is_err(), "{name}");
        }
        // Resolved through a link, a name that looks inside leads out: refused when the
        // checksums are verified too.
        let two = dir_for(&out, 2);
        let manifest = read_manifest(&two).expect("manifest");
        let first = two.join(&manifest.files[0].path);
        fs::remove_file(&first).expect("remove");
        std::os::unix::fs::symlink(root.path().join("outside"), &first).expect("link");
        let e = verify_checksums(&two, &manifest, 0, 1)
            .expect_err("link out")
            .to_string();
        assert!(e.contains("outside the directory"), "{e}");
        let e = validate(&two).expect_err("link in the tree").to_string();
        assert!(e.contains("a symbolic link"), "{e}");
    }

    #[test]
    fn links_fifos_and_extra_files_in_a_checkpoint_are_refused_without_following_them() {
        let root = tempfile::tempdir().expect("tempdir");
        let (out, _) = run_with_checkpoints(root.path());
        let [one, two, three] = [1, 2, 3].map(|k| dir_for(&out, k));
        // A loop (model/a → model) and a link to the root would make a walk that follows
        // links exponential or endless.
        std::os::unix::fs::symlink(".", three.join("model").join("a")).expect("link");
        std::os::unix::fs::symlink("/", three.join("root")).expect("link");
        let e = validate(&three).expect_err("links").to_string();
        assert!(e.contains("a symbolic link"), "{e}");
        // A FIFO named like weights would block whoever opens it.
        let fifo = two.join("model").join("extra.safetensors");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = validate(&two).expect_err("fifo").to_string();
        assert!(e.contains("not a regular file"), "{e}");
        // A file added after the manifest was written would be read unverified.
        fs::write(one.join("model").join("model.safetensors.index.json"), "{}").expect("write");
        let e = validate(&one).expect_err("extra file").to_string();
        assert!(e.contains("not listed in manifest.json"), "{e}");
        // A link among the checkpoints is not one.
        std::os::unix::fs::symlink(&one, out.join("checkpoints").join("step-00000009"))
            .expect("link");
        assert!(list(&out).iter().all(|(k, _)| *k != 9));
    }

    #[test]
    fn a_sharded_layout_is_checked_before_anything_is_sized_from_it() {
        let root = tempfile::tempdir().expect("tempdir");
        let (out, _) = run_with_checkpoints(root.path());
        let three = dir_for(&out, 3);
        let layout =
            |ranks: serde_json::Value, block: serde_json::Value, shape: serde_json::Value| {
                serde_json::json!({"kind": "sharded", "bucket_elems": 4, "ranks": ranks,
                "state_dtype": "F32", "master": false,
                "buckets": [{"block": block, "params": [{"name": "w", "shape": shape}]}]})
            };
        let cases = [
            (
                layout(
                    10_000_000_000_000u64.into(),
                    4.into(),
                    serde_json::json!([4]),
                ),
                "optimizer.ranks",
            ),
            (
                layout(1.into(), 0.into(), serde_json::json!([0])),
                "buckets[0].block",
            ),
            (
                layout(1.into(), (1i64 << 62).into(), serde_json::json!([1])),
                "buckets[0].block",
            ),
            (
                layout(1.into(), 4.into(), serde_json::json!([3, 2])),
                "params[0].shape",
            ),
            (
                layout(1.into(), 4.into(), serde_json::json!([-1, -4])),
                "params[0].shape",
            ),
            (
                layout(
                    1.into(),
                    4.into(),
                    serde_json::json!([1i64 << 40, 1i64 << 40]),
                ),
                "params[0].shape",
            ),
        ];
        for (optimizer, field) in cases {
            edit_manifest(&three, |m| m["optimizer"] = optimizer.clone());
            let e = read_manifest(&three).expect_err(field).to_string();
            assert!(e.contains(field), "{e}");
        }
        edit_manifest(&three, |m| {
            m["optimizer"] = serde_json::json!({"kind": "replicated"});
            m["world"] = 4.into();
        });
        let e = read_manifest(&three).expect_err("world").to_string();
        assert!(e.contains("world 4 is not dp 1 × cp 1"), "{e}");
    }

    fn truncate(p: &Path) {
        let len = fs::metadata(p).expect("file").len();
        fs::OpenOptions::new()
            .write(true)
            .open(p)
            .and_then(|f| f.set_len(len - 1))
            .expect("truncate");
    }

    #[test]
    fn validate_names_the_damaged_file_and_auto_resume_falls_back() {
        let root = tempfile::tempdir().expect("tempdir");
        let (out, cfg) = run_with_checkpoints(root.path());
        let [one, two, three] = [1, 2, 3].map(|k| dir_for(&out, k));
        for d in [&one, &two, &three] {
            validate(d).expect("a complete checkpoint");
        }
        let auto = auto_resume(&out);
        assert_eq!(
            auto.chosen.map(|(d, v)| (d, v.state.step)),
            Some((three.clone(), 3))
        );

        truncate(&three.join("model").join("model.safetensors"));
        fs::remove_file(two.join("optimizer.safetensors")).expect("remove");
        let e = validate(&three).expect_err("truncated weights").to_string();
        assert!(
            e.contains("model.safetensors") && e.contains("truncated"),
            "{e}"
        );
        let e = validate(&two).expect_err("no optimizer").to_string();
        assert!(e.contains("optimizer.safetensors: missing"), "{e}");

        let auto = auto_resume(&out);
        assert_eq!(auto.chosen.map(|(d, _)| d), Some(one.clone()));
        let skipped: Vec<_> = auto.skipped.iter().map(|(d, _)| d.clone()).collect();
        assert_eq!(skipped, vec![three, two]);

        // Another run's state: a different seed than its config.toml's, or another step than
        // the directory's; impossible counters.
        let other = TrainConfig {
            seed: 5,
            ..cfg.clone()
        };
        let config = one.join("config.toml");
        let saved = fs::read(&config).expect("read");
        fs::write(&config, other.to_toml()).expect("write");
        let e = validate(&one).expect_err("seed").to_string();
        assert!(
            e.contains("state.json") && e.contains("seed 0") && e.contains("has seed 5"),
            "{e}"
        );
        fs::write(&config, saved).expect("write");
        assert_eq!(validate(&one).expect("restored").config, cfg);
        fs::copy(one.join("state.json"), dir_for(&out, 3).join("state.json")).expect("copy");
        let e = validate(&dir_for(&out, 3)).expect_err("step").to_string();
        assert!(e.contains("holds step 1, the directory is step 3"), "{e}");
        let state = one.join("state.json");
        let text = fs::read_to_string(&state).expect("read");
        fs::write(&state, text.replace("\"skipped\": 0", "\"skipped\": 9")).expect("write");
        let e = validate(&one).expect_err("skipped").to_string();
        assert!(
            e.contains("field skipped: 9 skipped steps of 1 steps"),
            "{e}"
        );
    }

    #[test]
    fn check_safetensors_accepts_whole_files_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("t.safetensors");
        let t = tch::Tensor::from_slice(&[1f32, 2.0, 3.0]);
        tch::Tensor::write_safetensors(&[("t", &t)], &p).expect("write");
        check_safetensors(&p).expect("whole");
        truncate(&p);
        let e = check_safetensors(&p).expect_err("cut").to_string();
        assert!(e.contains("(truncated)"), "{e}");
        fs::write(&p, b"abc").expect("write");
        let e = check_safetensors(&p).expect_err("tiny").to_string();
        assert!(e.contains("no safetensors header"), "{e}");
    }

    mod state_properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// A checkpoint's state.json with any counters, or damaged anywhere: an error naming
            /// state.json, or a state whose counters agree (never a panic, nothing that wraps
            /// when the run subtracts the skipped steps).
            #[test]
            fn any_state_json_is_an_error_or_consistent(
                step in any::<u64>(),
                skipped in any::<u64>(),
                tokens in any::<u64>(),
                elapsed in prop_oneof![any::<f64>(), Just(f64::NAN), Just(-1.0)],
                edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            ) {
                let dir = tempfile::tempdir().expect("tempdir");
                let state = serde_json::json!({
                    "version": STATE_VERSION, "step": step, "tokens": tokens, "rng_seed": 0,
                    "skipped": skipped, "elapsed_s": elapsed,
                    "schedule": {"lr": 1e-3, "warmup": 0, "total": 10, "min_ratio": 0.1},
                    "loader": {"version": 1, "seed": 0, "epoch": 0, "shuffle": true, "step": 0,
                               "cursor": 0, "drawn": [0], "sources": [
                                   {"dir": "d", "samples": 4, "weight": 1.0}]},
                });
                let mut bytes = serde_json::to_vec(&state).expect("json");
                for (at, b) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
                fs::write(dir.path().join("state.json"), &bytes).expect("write");
                match read_state(dir.path()) {
                    Ok(st) => prop_assert!(
                        st.skipped <= st.step && st.elapsed_s.is_finite() && st.elapsed_s >= 0.0
                    ),
                    Err(e) => prop_assert!(e.to_string().contains("state.json"), "{e}"),
                }
            }

            /// A manifest with any names, counts and shapes, or damaged anywhere: an error
            /// naming manifest.json, or a manifest whose names stay inside the checkpoint and
            /// whose layout the sizing code can use without overflow (never a panic).
            #[test]
            fn any_manifest_is_an_error_or_usable(
                path in prop_oneof![
                    Just("model/model.safetensors".to_string()), Just("../x".to_string()),
                    Just("/dev/zero".to_string()), "[a-z./]{0,12}"],
                world in 0usize..5,
                ranks in prop_oneof![0usize..4, Just(usize::MAX), Just(10_000_000_000_000)],
                block in prop_oneof![-2i64..10, Just(i64::MAX), Just(1 << 40)],
                shape in proptest::collection::vec(prop_oneof![-2i64..6, Just(i64::MAX)], 0..4),
                edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
            ) {
                let dir = tempfile::tempdir().expect("tempdir");
                let manifest = serde_json::json!({
                    "version": MANIFEST_VERSION, "world": world, "dp": world, "cp": 1,
                    "optimizer": {"kind": "sharded", "bucket_elems": 4, "ranks": ranks,
                        "state_dtype": "F32", "master": false,
                        "buckets": [{"block": block, "params": [{"name": "w", "shape": shape}]}]},
                    "files": [{"path": path, "bytes": 1, "sha256": "0".repeat(64)},
                              {"path": "b", "bytes": 1, "sha256": "0".repeat(64)}],
                });
                let mut bytes = serde_json::to_vec(&manifest).expect("json");
                for (at, b) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
                fs::write(dir.path().join(MANIFEST), &bytes).expect("write");
                match read_manifest(dir.path()) {
                    Ok(m) => {
                        for f in &m.files {
                            prop_assert!(rsd_common::safe_fs::check_relative_name(&f.path).is_ok());
                        }
                        if let OptimizerLayout::Sharded(l) = &m.optimizer {
                            prop_assert!(l.ranks >= 1 && l.ranks <= m.files.len());
                            for b in &l.buckets {
                                prop_assert!(b.block.checked_mul(l.ranks as i64).is_some());
                            }
                        }
                    }
                    Err(e) => prop_assert!(e.to_string().contains("manifest.json"), "{e}"),
                }
            }
        }
    }
}
