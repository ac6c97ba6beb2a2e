//! The signals that stop a run at a step boundary with a checkpoint.
//!
//! A cluster stops a job with SIGTERM (`scancel`, a time limit, preemption; SIGKILL follows after
//! the cluster's KillWait) or warns it ahead of its time limit with the signal `--signal` names
//! (SIGUSR1 by convention); a terminal sends SIGINT. Each sets the run's stop flag: every rank
//! finishes its step, the ranks agree on the step to stop at (the trainer's decision at each step
//! boundary takes any rank's flag as everyone's), rank 0 writes a checkpoint and every rank exits
//! with [`EXIT_STOPPED`] (130 after Ctrl-C, as shells expect).
//!
//! Repeated SIGTERMs and SIGUSR1s are one request: SLURM sends a step's tasks SIGTERM twice at
//! the time limit (SIGCONT between), and a run that exited on the second would lose its
//! checkpoint. Only a deliberate second interrupt, SIGINT while already stopping (Ctrl-C twice),
//! exits at once without a checkpoint.
//!
//! The signals are read on a thread of their own (signal-hook), so the handler may print and end
//! the process, which a C signal handler may not.
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// The exit status of a run stopped by SIGTERM or SIGUSR1 once its checkpoint is written
/// (`EX_TEMPFAIL`: run the same command with `--resume auto` to continue).
pub const EXIT_STOPPED: i32 = 75;

/// The exit status of a run stopped by Ctrl-C once its checkpoint is written.
pub const EXIT_INTERRUPTED: i32 = 130;

/// The stop flag the trainer reads at each step boundary, and the signal that set it.
pub struct Stop {
    flag: Arc<AtomicBool>,
    signal: Arc<AtomicI32>,
}

impl Stop {
    /// The flag [`rsd_train::train::Trainer::run`] watches.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }

    /// The exit status for a run that stopped early because of a signal; `None` when no signal
    /// came.
    pub fn exit_status(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            SIGINT => Some(EXIT_INTERRUPTED),
            _ => Some(EXIT_STOPPED),
        }
    }
}

/// The name a user knows a signal by.
fn name(sig: i32) -> &'static str {
    match sig {
        SIGINT => "SIGINT (Ctrl-C)",
        SIGTERM => "SIGTERM",
        SIGUSR1 => "SIGUSR1",
        _ => "a signal",
    }
}

/// From now on SIGTERM, SIGUSR1 and SIGINT set the stop flag; a SIGINT while already stopping
/// ends the process at once with 130. Installed first thing, so that a signal during the lock
/// wait or the run directory's preparation stops the run rather than killing the process.
pub fn install() -> Result<Stop> {
    let stop = Stop {
        flag: Arc::new(AtomicBool::new(false)),
        signal: Arc::new(AtomicI32::new(0)),
    };
    let mut signals =
        Signals::new([SIGTERM, SIGUSR1, SIGINT]).context("installing the signal handlers")?;
    let (flag, signal) = (stop.flag.clone(), stop.signal.clone());
    std::thread::Builder::new()
        .name("rsd-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if !flag.swap(true, Ordering::SeqCst) {
                    signal.store(sig, Ordering::SeqCst);
                    eprintln!(
                        "rsd-train: {} received: every rank finishes its step and stops at the \
                         same step, rank 0 writes a checkpoint, exit status {} (a second Ctrl-C \
                         exits at once without one)",
                        name(sig),
                        if sig == SIGINT {
                            EXIT_INTERRUPTED
                        } else {
                            EXIT_STOPPED
                        }
                    );
                } else if sig == SIGINT {
                    eprintln!(
                        "rsd-train: second interrupt (SIGINT): exiting now without a checkpoint"
                    );
                    rsd_dist::exit_now(128 + sig);
                } else {
                    eprintln!(
                        "rsd-train: {} received again: already stopping at the next step \
                         boundary with a checkpoint",
                        name(sig)
                    );
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(stop)
}
