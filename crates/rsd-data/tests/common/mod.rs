//! What both test files of the `rsd-data` binary need to spell its command lines.

use std::path::Path;

pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `pack --len LEN --src SRC --out OUT` and then `extra`: the command most tests start from.
pub fn pack_args<'a>(
    len: &'a str,
    src: &'a Path,
    out: &'a Path,
    extra: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["pack", "--len", len, "--src", p(src), "--out", p(out)];
    args.extend_from_slice(extra);
    args
}
