//! The run directory (`out`): what a run writes there, so that a new run never mixes its
//! metrics and checkpoints with an earlier run's (checkpoints are pruned by step number: an
//! earlier run's later steps would make a new run delete the checkpoint it just wrote), and a
//! resumed run's log holds every step once.
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use crate::{io_err, Error, Result};

/// What a run writes into its directory, besides the tokenizer copy it rewrites every time.
const RUN_OUTPUTS: [&str; 4] = ["metrics.jsonl", "checkpoints", "model", "summary.json"];

/// The outputs of an earlier run present in `out` (an empty `checkpoints/` does not count).
pub fn earlier_run(out: &Path) -> Vec<PathBuf> {
    RUN_OUTPUTS
        .iter()
        .map(|name| out.join(name))
        .filter(|p| match fs::symlink_metadata(p) {
            Ok(m) if m.is_dir() => fs::read_dir(p).is_ok_and(|mut d| d.next().is_some()),
            Ok(_) => true,
            Err(_) => false,
        })
        .collect()
}

/// Removes an earlier run's outputs from `out` (`--overwrite`); nothing else there is touched.
pub fn remove_earlier_run(out: &Path) -> Result<()> {
    for p in earlier_run(out) {
        let meta = fs::symlink_metadata(&p).map_err(io_err(&p))?;
        if meta.is_dir() {
            fs::remove_dir_all(&p).map_err(io_err(&p))?;
        } else {
            fs::remove_file(&p).map_err(io_err(&p))?;
        }
    }
    Ok(())
}

/// The run directory a checkpoint belongs to (`<run>/checkpoints/step-N` → `<run>`), if it lies
/// in one.
pub fn run_of_checkpoint(checkpoint: &Path) -> Option<PathBuf> {
    let parent = checkpoint.parent()?;
    (parent.file_name()? == "checkpoints").then(|| parent.parent().map(Path::to_path_buf))?
}

/// Whether `a` and `b` name the same directory (both must exist to compare equal).
pub fn same_dir(a: &Path, b: &Path) -> bool {
    match (fs::canonicalize(a), fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The longest line `metrics.jsonl` may have (a record is a few hundred bytes; a profiled one a
/// few KB).
const MAX_METRICS_LINE: u64 = 1 << 20;

/// Drops the lines of `out/metrics.jsonl` logged after `step` (a run resumed from a checkpoint
/// of `step` logs the later steps again). Written through a temporary file and a rename; lines
/// that are not a JSON object with a `step` stop the rewrite with an error naming the line.
pub fn keep_metrics_through(out: &Path, step: u64) -> Result<()> {
    let path = out.join("metrics.jsonl");
    // A link planted at the log's name is refused, neither read through nor rewritten.
    if !rsd_common::safe_fs::own_regular_file(&path)? {
        return Ok(());
    }
    let file = rsd_common::safe_fs::open_regular(&path)?;
    let mut reader = BufReader::new(file);
    let mut kept = Vec::new();
    let mut dropped = 0usize;
    let mut bytes = Vec::new();
    for i in 0.. {
        bytes.clear();
        // A line is read no further than a record can be long: a damaged log (a line of
        // gigabytes) is an error, not an allocation.
        let n = (&mut reader)
            .take(MAX_METRICS_LINE + 1)
            .read_until(b'\n', &mut bytes)
            .map_err(io_err(&path))?;
        if n == 0 {
            break;
        }
        if bytes.len() as u64 > MAX_METRICS_LINE {
            return Err(Error::Input(format!(
                "{} line {}: longer than {MAX_METRICS_LINE} bytes, not a metrics record",
                path.display(),
                i + 1
            )));
        }
        let Ok(line) = String::from_utf8(std::mem::take(&mut bytes)) else {
            return Err(Error::Input(format!(
                "{} line {}: not UTF-8 text, not a metrics record",
                path.display(),
                i + 1
            )));
        };
        let line = line.trim_end_matches(['\n', '\r']).to_string();
        if line.trim().is_empty() {
            continue;
        }
        let logged = serde_json::from_str::<serde_json::Value>(&line)
            .ok()
            .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64))
            .ok_or_else(|| {
                Error::Input(format!(
                    "{} line {}: not a metrics record with a \"step\"",
                    path.display(),
                    i + 1
                ))
            })?;
        if logged <= step {
            kept.push(line);
        } else {
            dropped += 1;
        }
    }
    if dropped == 0 {
        return Ok(());
    }
    let text: String = kept.iter().map(|line| format!("{line}\n")).collect();
    Ok(rsd_common::safe_fs::write_file_atomic(
        &path,
        text.as_bytes(),
    )?)
}

/// Keeps runs apart: a new run (or one branched from another run's checkpoint) never writes
/// into a directory that holds an earlier run, unless `overwrite` removes it first; a run
/// continued from its own checkpoint keeps its log up to that checkpoint's step. `resume_arg` is
/// `--resume`'s value, `resumed` the checkpoint it found. Every rank checks, rank 0 (`rank0`)
/// alone removes or rewrites (the others take the same branch either way).
pub fn prepare(
    out: &Path,
    resumed: Option<&Path>,
    resume_arg: Option<&str>,
    overwrite: bool,
    rank0: bool,
) -> Result<()> {
    let continuing =
        resumed.is_some_and(|ck| run_of_checkpoint(ck).is_some_and(|run| same_dir(&run, out)));
    if let (true, Some(ck)) = (continuing, resumed) {
        if rank0 {
            let step = crate::checkpoint::read_state(ck)?.step;
            keep_metrics_through(out, step)?;
        }
        return Ok(());
    }
    let earlier = earlier_run(out);
    if earlier.is_empty() {
        return Ok(());
    }
    // `--resume auto` that found no checkpoint: the same job restarted before its first one,
    // which left only a partial log.
    let restarted =
        resume_arg == Some("auto") && resumed.is_none() && earlier == [out.join("metrics.jsonl")];
    if overwrite || restarted {
        if rank0 {
            remove_earlier_run(out)?;
        }
        return Ok(());
    }
    let names: Vec<String> = earlier
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    Err(Error::Input(format!(
        "{} already holds a run ({}): continue it with --resume auto, start a new run there \
         with --overwrite (removes those), or choose another --out",
        out.display(),
        names.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any log, damaged or not: trimmed to the records of steps ≤ k, in order, or an error
        /// naming metrics.jsonl and a line; never a panic.
        #[test]
        fn any_metrics_log_is_trimmed_or_refused_naming_the_line(
            steps in proptest::collection::vec(0u64..8, 0..12),
            k in 0u64..8,
            edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut bytes: Vec<u8> = steps
                .iter()
                .flat_map(|s| format!("{{\"step\": {s}, \"loss\": 1.5}}\n").into_bytes())
                .collect();
            for (at, b) in &edits {
                if !bytes.is_empty() {
                    let i = at.index(bytes.len());
                    bytes[i] = *b;
                }
            }
            let path = dir.path().join("metrics.jsonl");
            fs::write(&path, &bytes).unwrap();
            match keep_metrics_through(dir.path(), k) {
                Ok(()) => {
                    let text = fs::read_to_string(&path).unwrap_or_default();
                    for line in text.lines().filter(|l| !l.trim().is_empty()) {
                        let v: serde_json::Value = serde_json::from_str(line).unwrap();
                        let step = v["step"].as_u64().unwrap();
                        // Untouched when nothing is dropped, else only steps ≤ k remain.
                        prop_assert!(step <= k || text.as_bytes() == bytes.as_slice());
                    }
                }
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(e.contains("metrics.jsonl line "), "{}", e);
                }
            }
        }
    }

    #[test]
    fn a_line_of_gigabytes_is_refused_without_being_held() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let f = fs::File::create(&path).unwrap();
        // Sparse: 8 GB claimed, none of it in memory unless read whole.
        f.set_len(8 << 30).unwrap();
        let e = keep_metrics_through(dir.path(), 1).unwrap_err().to_string();
        assert!(e.contains("line 1: longer than 1048576 bytes"), "{e}");
    }

    #[test]
    fn an_earlier_run_is_found_and_removed_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        assert!(earlier_run(out).is_empty());
        fs::create_dir(out.join("checkpoints")).unwrap();
        fs::create_dir(out.join("tokenizer")).unwrap();
        fs::write(out.join("notes.txt"), "mine").unwrap();
        assert!(
            earlier_run(out).is_empty(),
            "an empty checkpoints/ is no run"
        );
        fs::create_dir(out.join("checkpoints/step-00000002")).unwrap();
        fs::write(out.join("metrics.jsonl"), "{\"step\":1}\n").unwrap();
        assert_eq!(
            earlier_run(out),
            vec![out.join("metrics.jsonl"), out.join("checkpoints")]
        );
        remove_earlier_run(out).unwrap();
        assert!(earlier_run(out).is_empty());
        assert_eq!(fs::read_to_string(out.join("notes.txt")).unwrap(), "mine");
        assert!(out.join("tokenizer").is_dir());
    }

    #[test]
    fn a_resumed_log_keeps_the_steps_up_to_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let lines: String = (1..=5).map(|s| format!("{{\"step\":{s}}}\n")).collect();
        fs::write(out.join("metrics.jsonl"), &lines).unwrap();
        keep_metrics_through(out, 3).unwrap();
        assert_eq!(
            fs::read_to_string(out.join("metrics.jsonl")).unwrap(),
            "{\"step\":1}\n{\"step\":2}\n{\"step\":3}\n"
        );
        fs::write(out.join("metrics.jsonl"), "{\"step\":1}\nnot json\n").unwrap();
        let e = keep_metrics_through(out, 0).unwrap_err().to_string();
        assert!(e.contains("metrics.jsonl line 2"), "{e}");
        keep_metrics_through(&out.join("absent"), 1).unwrap();
    }

    #[test]
    fn a_checkpoint_names_its_run() {
        assert_eq!(
            run_of_checkpoint(Path::new("/r/run/checkpoints/step-00000004")),
            Some(PathBuf::from("/r/run"))
        );
        assert_eq!(run_of_checkpoint(Path::new("/r/elsewhere/step-4")), None);
    }
}
