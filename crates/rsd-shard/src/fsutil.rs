//! File helpers of the shard format, on top of `rsd_common::safe_fs` (the one place that opens
//! files named by data and writes files atomically): the shard files a manifest names, confined
//! to its directory.

use std::path::{Path, PathBuf};

use rsd_common::safe_fs::{self, NamedBy};

use crate::error::Result;
use crate::manifest::{mask_prefix, ShardInfo, MANIFEST_FILE};

/// The `.bin` and `.idx` of the manifest's shard `k` (`info`) inside `dir`: its prefix must be a
/// plain relative name that stays inside `dir`, and both files regular files; else the error
/// names the manifest and the field `shards[k].prefix`.
pub(crate) fn shard_files(dir: &Path, k: usize, info: &ShardInfo) -> Result<(PathBuf, PathBuf)> {
    pair(dir, k, info, &info.prefix)
}

/// The loss-mask `.bin` and `.idx` of the manifest's shard `k` (`<prefix>-mask.*`), confined to
/// `dir` as [`shard_files`] confines the token pair.
pub(crate) fn mask_files(dir: &Path, k: usize, info: &ShardInfo) -> Result<(PathBuf, PathBuf)> {
    pair(dir, k, info, &mask_prefix(&info.prefix))
}

/// `<name>.bin` and `<name>.idx` inside `dir`, for shard `k` (`info`).
fn pair(dir: &Path, k: usize, info: &ShardInfo, name: &str) -> Result<(PathBuf, PathBuf)> {
    let named_by = NamedBy::new(dir.join(MANIFEST_FILE), format!("shards[{k}].prefix"));
    // The prefix itself first, so a refused prefix is reported as written.
    safe_fs::check_name(dir, &info.prefix, &named_by)?;
    let bin = safe_fs::confined_file(dir, &format!("{name}.bin"), &named_by)?;
    let idx = safe_fs::confined_file(dir, &format!("{name}.idx"), &named_by)?;
    Ok((bin, idx))
}
