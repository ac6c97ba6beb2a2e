//! `rsd-train --nproc N …`: runs N copies of this binary as the ranks of one run on this machine
//! ([`rsd_dist::launch`], as `torchrun --nproc-per-node N` would), and names the rank that failed.
use std::ffi::OsString;

use anyhow::{Context, Result};
use rsd_dist::launch::{Launch, Outcome};

/// This process's arguments without `--nproc N` / `--nproc=N`: what each rank runs.
fn rank_args() -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        if a == "--nproc" {
            args.next();
        } else if !a.to_string_lossy().starts_with("--nproc=") {
            out.push(a);
        }
    }
    out
}

/// Runs `nproc` ranks and waits for them; the exit status for this process.
pub fn run(nproc: usize) -> Result<i32> {
    let program = std::env::current_exe().context("locating the rsd-train binary")?;
    let outcome = rsd_dist::launch::run(&Launch {
        program,
        args: rank_args(),
        nproc,
        collective_failed_exit: Some(crate::EXIT_COLLECTIVE_FAILED),
        stopped_exit: Some(crate::signals::EXIT_STOPPED),
    })?;
    if let Outcome::RankFailed { rank, status } = outcome {
        eprintln!(
            "rsd-train: error: rank {rank} of {nproc} failed ({status}); stopped the other ranks"
        );
    }
    Ok(outcome.exit_code())
}
