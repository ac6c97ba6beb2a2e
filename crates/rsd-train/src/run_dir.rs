//! The run directory (`out`): what a run writes there, so that a new run never mixes its
//! metrics and checkpoints with an earlier run's (checkpoints are pruned by step number: an
//! earlier run's later steps would make a new run delete the checkpoint it just wrote), and a
//! resumed run's log holds every step once.
use std::fs;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// The file in the run directory whose `flock` a running run's rank 0 holds ([`RunLock`]).
pub const LOCK_FILE: &str = ".rsd-train.lock";

/// How long a run waits for a lock that an earlier start of the same SLURM job holds: a job
/// requeued after its node failed can start before the shared filesystem has released the dead
/// node's lock (NFSv4 releases a lost client's locks when its lease ends, 90 s by default).
pub const SAME_JOB_WAIT: Duration = Duration::from_secs(120);

/// Who holds a run directory: what [`RunLock`] writes into [`LOCK_FILE`], for the error a
/// second run gets.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Holder {
    /// The process id.
    pub pid: u32,
    /// The host name.
    pub host: String,
    /// `SLURM_JOB_ID`, under SLURM.
    pub slurm_job: Option<String>,
    /// `SLURM_RESTART_COUNT` under SLURM (0 for a job's first start; a requeued job counts up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm_restart: Option<u32>,
    /// When it took the lock, as `YYYY-MM-DD HH:MM:SS UTC`.
    pub since: String,
}

impl Holder {
    /// This process, now.
    pub fn this_process() -> Holder {
        Holder {
            pid: std::process::id(),
            host: host_name(),
            slurm_job: std::env::var("SLURM_JOB_ID")
                .ok()
                .map(|j| j.trim().to_string())
                .filter(|j| !j.is_empty()),
            slurm_restart: std::env::var("SLURM_JOB_ID").ok().map(|_| {
                let count = std::env::var("SLURM_RESTART_COUNT").unwrap_or_default();
                count.trim().parse().unwrap_or(0)
            }),
            since: utc_now(),
        }
    }

    /// Whether `self` is a later start of the job that `earlier` is a start of: SLURM restarts
    /// a requeued job only once every process of its earlier start has ended, so a lock such a
    /// start still holds is stale (a lost node's, on a shared filesystem).
    fn restarts(&self, earlier: &Holder) -> bool {
        self.slurm_job.is_some()
            && self.slurm_job == earlier.slurm_job
            && matches!((self.slurm_restart, earlier.slurm_restart), (Some(a), Some(b)) if a > b)
    }

    /// `pid 123 on host gpu01, SLURM job 77, since 2024-05-01 12:00:00 UTC`.
    pub fn describe(&self) -> String {
        let job = self
            .slurm_job
            .as_ref()
            .map_or(String::new(), |j| match self.slurm_restart {
                Some(n) if n > 0 => format!(", SLURM job {j} (restart {n})"),
                _ => format!(", SLURM job {j}"),
            });
        format!(
            "pid {} on host {}{job}, since {}",
            self.pid, self.host, self.since
        )
    }
}

/// An exclusive hold on a run directory for the life of the run, so that a second job started
/// into the same `--out` (a resubmission while the first still runs, two users' jobs) is refused
/// instead of mixing its checkpoints and log with the first's. A non-blocking `flock` on
/// `<out>/.rsd-train.lock`, which names the holder; the kernel releases it when the guard drops
/// or the process ends in any way (kill -9 included), so a lock is never stale on a live
/// filesystem. On a shared filesystem `flock` reaches every client where the filesystem
/// supports it (Linux NFS maps it to NFS locks; Lustre needs its `flock` mount option); where it
/// does not, the run goes on unlocked after a warning.
#[derive(Debug)]
pub struct RunLock {
    path: PathBuf,
    /// Open while held: closing it releases the lock.
    _file: fs::File,
    /// The run directory, when this lock created it: a run refused before writing anything
    /// leaves nothing behind (the directory is removed again if the lock file is all it holds).
    created: Option<PathBuf>,
}

impl Drop for RunLock {
    fn drop(&mut self) {
        let Some(dir) = &self.created else { return };
        let only_the_lock = fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .flatten()
                .all(|e| e.file_name().to_str() == Some(LOCK_FILE))
        });
        if only_the_lock {
            let _ = fs::remove_file(&self.path);
            let _ = fs::remove_dir(dir);
        }
    }
}

impl RunLock {
    /// Locks `out` (created if needed) for this process, waiting up to [`SAME_JOB_WAIT`] for an
    /// earlier start of the same SLURM job; any other holder is refused at once.
    pub fn acquire(out: &Path) -> Result<RunLock> {
        Self::acquire_as(out, &Holder::this_process(), SAME_JOB_WAIT)
    }

    /// [`acquire`](Self::acquire) on the process that writes the run (`rank0`: rank 0, or a
    /// single process); `None` on the other ranks, which write nothing there themselves.
    pub fn for_rank0(out: &Path, rank0: bool) -> Result<Option<RunLock>> {
        rank0.then(|| Self::acquire(out)).transpose()
    }

    /// Locks `out` as `me`; a holder of `me`'s SLURM job is waited for up to `same_job_wait`.
    pub fn acquire_as(out: &Path, me: &Holder, same_job_wait: Duration) -> Result<RunLock> {
        let created = (!out.exists()).then(|| out.to_path_buf());
        fs::create_dir_all(out).map_err(io_err(out))?;
        let path = out.join(LOCK_FILE);
        // Never through a link planted at the name; the file is only ever rewritten in place.
        let mut file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io_err(&path))?;
        let deadline = Instant::now() + same_job_wait;
        loop {
            // SAFETY: flock on a descriptor this function owns; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc == 0 {
                break;
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EWOULDBLOCK) => {}
                Some(libc::EINTR) => continue,
                Some(libc::ENOLCK | libc::ENOSYS | libc::EOPNOTSUPP) => {
                    eprintln!(
                        "warning: cannot lock {} ({e}): this filesystem does not support flock, \
                         so nothing stops a second job from writing into {} while this run does",
                        path.display(),
                        out.display()
                    );
                    return Ok(RunLock {
                        path,
                        _file: file,
                        created,
                    });
                }
                _ => return Err(io_err(&path)(e)),
            }
            let holder = read_holder(&mut file);
            if let Some(h) = holder.as_ref().filter(|h| me.restarts(h)) {
                eprintln!(
                    "rsd-train: warning: {} is still locked by an earlier start of this SLURM job \
                     ({}); SLURM restarted the job, so that start has ended: taking the lock over",
                    out.display(),
                    h.describe()
                );
                file = take_over(&path)?;
                break;
            }
            let same_job = me.slurm_job.is_some()
                && holder.as_ref().and_then(|h| h.slurm_job.as_ref()) == me.slurm_job.as_ref();
            if same_job && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            let who = holder.map_or_else(
                || "which has not yet written who it is".to_string(),
                |h| h.describe(),
            );
            let waited = if same_job {
                format!(
                    "; it is this SLURM job's, still held {} s after this start (an earlier start \
                     of the job still running?)",
                    same_job_wait.as_secs()
                )
            } else {
                String::new()
            };
            return Err(Error::Input(format!(
                "{} is in use by another rsd-train run ({who}{waited}): two jobs writing one run \
                 directory would mix their checkpoints; wait for it to end, or choose another \
                 --out. If that run has ended (a lock on a shared filesystem can outlive a lost \
                 node), clear the lock with `rm {}` and run the same command again",
                out.display(),
                path.display()
            )));
        }
        let text = serde_json::to_string(me)
            .map_err(|e| Error::Input(format!("{}: {e}", path.display())))?;
        file.set_len(0).map_err(io_err(&path))?;
        file.seek(SeekFrom::Start(0)).map_err(io_err(&path))?;
        file.write_all(format!("{text}\n").as_bytes())
            .map_err(io_err(&path))?;
        Ok(RunLock {
            path,
            _file: file,
            created,
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes the temporary directories (`.step-N.tmp-<pid>`) that writers killed mid-checkpoint
/// left under `out/checkpoints` (a preempted job), and the old copies (`.step-N.old-<pid>`) a
/// writer killed while replacing a checkpoint of the same step left. Only the holder of the run
/// directory's lock may call it (`_held` is the proof): no other run writes there, so every
/// temporary but this process's own is stale, whichever host wrote it. A process id says
/// nothing here: the writer may have run on another node, where the same id is another process.
/// They are never taken for checkpoints ([`crate::checkpoint::list`] ignores them), but each holds up to a
/// checkpoint's size of disk. Returns the directories removed.
pub fn remove_stale_temporaries(out: &Path, _held: &RunLock) -> Vec<PathBuf> {
    let mine = |pid: &str| pid.parse::<u32>().is_ok_and(|p| p == std::process::id());
    let mut removed = Vec::new();
    if !crate::checkpoint::own_checkpoints_dir(out) {
        return removed;
    }
    for e in fs::read_dir(out.join("checkpoints"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(".step-")
            .and_then(|n| n.split_once(".tmp-").or_else(|| n.split_once(".old-")))
            .map(|(_, pid)| pid.to_string())
        else {
            continue;
        };
        if !mine(&pid) && fs::remove_dir_all(e.path()).is_ok() {
            removed.push(e.path());
        }
    }
    removed.sort();
    removed
}

/// A fresh lock file at `path`, locked, in place of a stale one that a lost process still holds
/// (a lock belongs to the file, not its name): made under a name of its own, locked, then
/// renamed over `path`.
fn take_over(path: &Path) -> Result<fs::File> {
    let fresh = path.with_extension(format!("lock.new-{}", std::process::id()));
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&fresh)
        .map_err(io_err(&fresh))?;
    // SAFETY: flock on a descriptor this function owns; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let renamed = match rc {
        0 => fs::rename(&fresh, path).map_err(io_err(path)),
        _ => Err(io_err(&fresh)(std::io::Error::last_os_error())),
    };
    if let Err(e) = renamed {
        let _ = fs::remove_file(&fresh);
        return Err(e);
    }
    Ok(file)
}

/// The holder a lock file names, if it can be read (the holder may not have written it yet).
fn read_holder(file: &mut fs::File) -> Option<Holder> {
    file.seek(SeekFrom::Start(0)).ok()?;
    let mut text = String::new();
    // A holder record is ~150 bytes; a damaged file is not read whole.
    file.take(4096).read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// This machine's host name (`?` if the system will not say).
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "?".to_string();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Now as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Seconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS UTC` (proleptic Gregorian calendar;
/// H. Hinnant's days-to-civil algorithm).
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
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

    fn holder(pid: u32, job: Option<&str>) -> Holder {
        Holder {
            pid,
            host: "gpu01".into(),
            slurm_job: job.map(str::to_string),
            slurm_restart: job.map(|_| 0),
            since: "2024-05-01 12:00:00 UTC".into(),
        }
    }

    #[test]
    fn a_second_lock_on_one_run_directory_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("runs/x");
        // flock locks belong to open file descriptions: a second open and flock conflicts
        // even in the same process, as it would from another job.
        let first = RunLock::acquire_as(&out, &holder(123, Some("77")), Duration::ZERO).unwrap();
        assert_eq!(first.path(), out.join(LOCK_FILE));
        let t0 = Instant::now();
        let e = RunLock::acquire_as(&out, &holder(456, None), Duration::from_secs(60))
            .unwrap_err()
            .to_string();
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "another job is refused at once"
        );
        assert_eq!(
            e,
            format!(
                "{} is in use by another rsd-train run (pid 123 on host gpu01, SLURM job 77, \
                 since 2024-05-01 12:00:00 UTC): two jobs writing one run directory would mix \
                 their checkpoints; wait for it to end, or choose another --out. If that run has \
                 ended (a lock on a shared filesystem can outlive a lost node), clear the lock \
                 with `rm {}` and run the same command again",
                out.display(),
                out.join(LOCK_FILE).display()
            )
        );
        // Released when the guard drops: the next run takes it and names itself.
        drop(first);
        let second = RunLock::acquire_as(&out, &holder(456, None), Duration::ZERO).unwrap();
        let text = fs::read_to_string(second.path()).unwrap();
        assert_eq!(
            serde_json::from_str::<Holder>(text.trim()).unwrap(),
            holder(456, None)
        );
        // Ranks other than 0 take no lock.
        assert!(RunLock::for_rank0(&out, false).unwrap().is_none());
    }

    #[test]
    fn an_earlier_start_of_the_same_slurm_job_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let first = RunLock::acquire_as(out, &holder(1, Some("77")), Duration::ZERO).unwrap();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(700));
            drop(first);
        });
        let me = holder(2, Some("77"));
        let lock = RunLock::acquire_as(out, &me, Duration::from_secs(30)).unwrap();
        release.join().unwrap();
        drop(lock);
        // Still held when the wait ends: refused, saying it was this job's.
        let _held = RunLock::acquire_as(out, &holder(1, Some("77")), Duration::ZERO).unwrap();
        let e = RunLock::acquire_as(out, &me, Duration::from_millis(600))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURM job 77") && e.contains("this SLURM job's"),
            "{e}"
        );
    }

    #[test]
    fn a_restarted_slurm_job_takes_its_earlier_starts_lock_over() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        // The earlier start's lock, still held (as a lost node's lock on NFS stays held).
        let earlier = RunLock::acquire_as(out, &holder(1, Some("77")), Duration::ZERO).unwrap();
        let restarted = Holder {
            slurm_restart: Some(1),
            ..holder(2, Some("77"))
        };
        let t0 = Instant::now();
        let lock = RunLock::acquire_as(out, &restarted, Duration::from_secs(60)).unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "taken over without the wait"
        );
        let text = fs::read_to_string(lock.path()).unwrap();
        assert_eq!(
            serde_json::from_str::<Holder>(text.trim()).unwrap(),
            restarted
        );
        // The lock now held is the new one: a third process is refused, naming the restart.
        let e = RunLock::acquire_as(out, &holder(3, None), Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SLURM job 77 (restart 1)") && e.contains("rm "),
            "{e}"
        );
        // Only the job's later starts take over: another job, or the same start, does not.
        drop(lock);
        let _held = RunLock::acquire_as(out, &restarted, Duration::ZERO).unwrap();
        let other = Holder {
            slurm_restart: Some(5),
            ..holder(4, Some("78"))
        };
        assert!(RunLock::acquire_as(out, &other, Duration::ZERO).is_err());
        assert!(RunLock::acquire_as(out, &restarted, Duration::ZERO).is_err());
        drop(earlier);
        assert_eq!(
            fs::read_dir(out).unwrap().count(),
            1,
            "no new-lock file left behind"
        );
    }

    #[test]
    fn unfinished_temporary_directories_are_no_checkpoints_and_get_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ck = dir.path().join("checkpoints");
        // Another process's (on this host or another: the lock holder removes them all), and
        // this process's own.
        let dead = ck.join(".step-00000009.tmp-1");
        let dead_old = ck.join(".step-00000008.old-4294967290");
        let lock = RunLock::acquire(dir.path()).expect("lock");
        let mine = ck.join(format!(".step-00000010.tmp-{}", std::process::id()));
        for d in [&dead, &dead_old, &mine, &ck.join("step-00000002")] {
            fs::create_dir_all(d).expect("mkdir");
        }
        assert_eq!(
            crate::checkpoint::list(dir.path()),
            vec![(2, ck.join("step-00000002"))]
        );
        assert_eq!(
            remove_stale_temporaries(dir.path(), &lock),
            vec![dead_old.clone(), dead.clone()]
        );
        assert!(!dead.exists() && !dead_old.exists() && mine.exists());
    }

    #[test]
    fn a_link_at_the_lock_files_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        fs::write(&target, "keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(LOCK_FILE)).unwrap();
        let e = RunLock::acquire_as(dir.path(), &holder(1, None), Duration::ZERO)
            .unwrap_err()
            .to_string();
        assert!(e.contains(LOCK_FILE), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
    }

    #[test]
    fn times_are_written_in_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_714_564_800 + 3661), "2024-05-01 13:01:01 UTC");
        assert!(Holder::this_process().describe().contains(" UTC"));
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
