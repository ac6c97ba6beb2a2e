//! When the scheduler will end the job this run belongs to, so that the run stops with a
//! checkpoint before then instead of being killed between two checkpoints.
//!
//! At its time limit SLURM sends a step's tasks SIGTERM and, KillWait later (30 s by default),
//! SIGKILL: too little to finish a long step and write a large checkpoint. So rank 0 reads the
//! job's end time and, at every step boundary, stops the run (every rank at the same step, with a
//! checkpoint, exit 75 so the job script requeues it) once the time left is less than its longest
//! recent step plus its last checkpoint's writing time plus a margin (`end_margin_s`). Nothing
//! for the user to compute; `--signal=USR1@LEAD` in the job script stays a second guard.
//!
//! Where the end time comes from: `SLURM_JOB_END_TIME` (seconds since the epoch) where SLURM
//! sets it (23.02 and later), else the job record through `squeue -h -j JOB -o %L` (the time
//! left, so no time zone enters), read at the start and every [`REFRESH`] on a thread of its
//! own, so that a limit changed with `scontrol update` is followed and a slow controller never
//! holds a step. Outside SLURM there is no end time.
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the job record is read again.
pub const REFRESH: Duration = Duration::from_secs(300);

/// The job's end time as far as it is known.
pub struct JobEnd {
    /// Seconds since the epoch; 0 while unknown (not read yet, or the job has no limit).
    end: Arc<AtomicU64>,
    /// Where it comes from, for messages: `SLURM_JOB_END_TIME`, `squeue (SLURM job 77)`.
    pub source: String,
}

/// Seconds since the epoch, now.
fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl JobEnd {
    /// The end time of the SLURM job this process runs in (`SLURM_JOB_ID`), or `None` outside
    /// SLURM. A job record that cannot be read is said once on stderr; the run then stops on
    /// signals only.
    pub fn of_slurm_job() -> Option<JobEnd> {
        let job = std::env::var("SLURM_JOB_ID")
            .ok()
            .filter(|j| !j.trim().is_empty())?;
        if let Ok(text) = std::env::var("SLURM_JOB_END_TIME") {
            return match text.trim().parse::<u64>() {
                Ok(end) => Some(JobEnd {
                    end: Arc::new(AtomicU64::new(end)),
                    source: "SLURM_JOB_END_TIME".into(),
                }),
                Err(_) => {
                    eprintln!(
                        "rsd-train: warning: SLURM_JOB_END_TIME={text} is not a time (seconds \
                         since the epoch); the run stops before the time limit only on a signal"
                    );
                    None
                }
            };
        }
        let job_id = job.trim().to_string();
        // The first reading here, before the first step: a run whose job is already near its end
        // must see it at its first step boundary, not after a thread happened to run.
        let end = Arc::new(AtomicU64::new(0));
        let mut warned = !read_into(&end, &job_id, false);
        let written = end.clone();
        let thread_job = job_id.clone();
        let spawned = std::thread::Builder::new()
            .name("rsd-job-end".into())
            .spawn(move || loop {
                std::thread::sleep(REFRESH);
                warned |= !read_into(&written, &thread_job, warned);
            });
        spawned.ok().map(|_| JobEnd {
            end,
            source: format!("squeue, SLURM job {job_id}"),
        })
    }

    /// An end time given directly (seconds since the epoch), for tests.
    pub fn at(end: u64, source: &str) -> JobEnd {
        JobEnd {
            end: Arc::new(AtomicU64::new(end)),
            source: source.into(),
        }
    }

    /// Seconds until the job's end; `None` while unknown or unlimited.
    pub fn seconds_left(&self) -> Option<f64> {
        match self.end.load(Ordering::SeqCst) {
            0 => None,
            end => Some(end as f64 - now_s()),
        }
    }
}

/// Reads the job's time left into `end` (seconds since the epoch; 0: no limit); false when it
/// could not be read, said on stderr unless `warned` already.
fn read_into(end: &AtomicU64, job_id: &str, warned: bool) -> bool {
    match time_left_of(job_id) {
        Ok(left) => {
            end.store(left.map_or(0, |l| now_s() as u64 + l), Ordering::SeqCst);
            true
        }
        Err(e) => {
            if !warned {
                eprintln!(
                    "rsd-train: warning: cannot read SLURM job {job_id}'s time left ({e}); the \
                     run stops before the time limit only on a signal (the job script's \
                     --signal); tried again every {} s",
                    REFRESH.as_secs()
                );
            }
            false
        }
    }
}

/// The time left of a SLURM job from `squeue -h -j JOB -o %L`: seconds, or `None` for a job
/// without a limit.
fn time_left_of(job: &str) -> Result<Option<u64>, String> {
    let out = Command::new("squeue")
        .args(["-h", "-j", job, "-o", "%L"])
        .output()
        .map_err(|e| format!("squeue: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "squeue exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_time_left(String::from_utf8_lossy(&out.stdout).trim())
}

/// squeue's time left (`%L`): `[days-]hours:minutes:seconds` with leading fields left out
/// (`5:03`, `1:00:00`, `2-04:00:00`), `UNLIMITED` / `NOT_LIMITED` for none; `None` for those.
pub fn parse_time_left(text: &str) -> Result<Option<u64>, String> {
    if matches!(text, "UNLIMITED" | "NOT_LIMITED" | "INVALID") {
        return Ok(None);
    }
    let bad = || format!("squeue printed {text:?} as the time left; expected [D-]H:MM:SS");
    let (days, clock) = match text.split_once('-') {
        Some((d, rest)) => (d.parse::<u64>().map_err(|_| bad())?, rest),
        None => (0, text),
    };
    let fields: Vec<u64> = clock
        .split(':')
        .map(|f| f.parse::<u64>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let secs = match fields.as_slice() {
        [s] => *s,
        [m, s] => m * 60 + s,
        [h, m, s] => h * 3600 + m * 60 + s,
        _ => return Err(bad()),
    };
    Ok(Some(days * 86_400 + secs))
}

/// Whether a run with `left_s` seconds before its job's end must stop now: what the next step
/// and the checkpoint after it take, and the margin, no longer fit.
pub fn must_stop(left_s: f64, step_s: f64, save_s: f64, margin_s: f64) -> bool {
    left_s < step_s + save_s + margin_s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn squeues_time_left_is_read_in_every_form_it_takes() {
        assert_eq!(parse_time_left("0:45"), Ok(Some(45)));
        assert_eq!(parse_time_left("5:03"), Ok(Some(303)));
        assert_eq!(parse_time_left("1:00:00"), Ok(Some(3600)));
        assert_eq!(
            parse_time_left("2-04:00:01"),
            Ok(Some(2 * 86_400 + 4 * 3600 + 1))
        );
        assert_eq!(parse_time_left("UNLIMITED"), Ok(None));
        assert_eq!(parse_time_left("NOT_LIMITED"), Ok(None));
        for bad in ["", "1:2:3:4", "x:00", "-1:00", "1-"] {
            let e = parse_time_left(bad).unwrap_err();
            assert!(e.contains("[D-]H:MM:SS"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_run_stops_when_a_step_a_checkpoint_and_the_margin_no_longer_fit() {
        assert!(!must_stop(100.0, 10.0, 20.0, 60.0));
        assert!(must_stop(89.0, 10.0, 20.0, 60.0));
        let end = JobEnd::at(now_s() as u64 + 1000, "test");
        let left = end.seconds_left().unwrap();
        assert!((998.0..=1000.0).contains(&left), "{left}");
        assert_eq!(JobEnd::at(0, "none").seconds_left(), None);
    }
}
