//! A local launcher: runs N copies of a program as the ranks of one run on this machine, as
//! `torchrun --nproc-per-node N` would: torchrun's variables for each rank, a free port for rank
//! 0's store, each rank's stderr lines prefixed `[rank K] `, Ctrl-C, SIGTERM and SIGUSR1 passed on, and
//! the first rank that fails named and the others stopped. `rsd-train --nproc N` is this.
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::env::Rendezvous;
use crate::error::{DistError, Result};

/// How long a rank whose collective failed waits to be named, for the rank that caused it.
const PEER_GRACE: Duration = Duration::from_secs(2);
/// How long the other ranks get, after one failed, to stop on their own before they are
/// killed: they hear of the failure through a collective or the store within seconds, and what
/// they print on the way out (a rank 0 that failed too, with its own reason) is worth keeping.
const STOP_GRACE: Duration = Duration::from_secs(6);

/// The last SIGINT/SIGTERM/SIGUSR1 received and not yet passed on (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

/// What to launch.
#[derive(Clone, Debug)]
pub struct Launch {
    /// The program every rank runs.
    pub program: PathBuf,
    /// Its arguments (without the launcher's own `--nproc`).
    pub args: Vec<OsString>,
    /// Ranks to run (at least 1).
    pub nproc: usize,
    /// The exit status with which a rank says that a collective failed, usually because another
    /// rank failed first: the launcher then waits briefly to name that other rank instead.
    pub collective_failed_exit: Option<i32>,
    /// The exit status with which a rank says that a signal passed on to it stopped it cleanly
    /// (rsd-train: 75 after SIGTERM or SIGUSR1, with a checkpoint written): not a failure.
    pub stopped_exit: Option<i32>,
}

/// How a launch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every rank exited 0.
    Done,
    /// A signal (Ctrl-C, SIGTERM, SIGUSR1) was passed on and the ranks ended by it.
    Interrupted {
        /// The signal.
        signal: i32,
        /// Rank 0's exit status (its code; 128 + signal when a signal ended it).
        code: i32,
    },
    /// The ranks stopped on a signal they received themselves (not through this launcher: a
    /// cluster signals every task), rank 0 with [`Launch::stopped_exit`].
    Stopped {
        /// Rank 0's exit status.
        code: i32,
    },
    /// This rank failed first; the others were stopped.
    RankFailed {
        /// The rank.
        rank: usize,
        /// Its exit status (code, or 128 + signal).
        status: ExitStatus,
    },
}

impl Outcome {
    /// The exit status for the launching process: 0, rank 0's after a signal was passed on
    /// (rsd-train: 130 after Ctrl-C, 75 after SIGTERM or SIGUSR1 once its checkpoint is written,
    /// 128 + the signal after a second one), or the failed rank's (at least 1).
    pub fn exit_code(&self) -> i32 {
        match *self {
            Outcome::Done => 0,
            Outcome::Interrupted { code, .. } | Outcome::Stopped { code } => code,
            Outcome::RankFailed { status, .. } => status.code().filter(|&c| c != 0).unwrap_or(1),
        }
    }
}

fn launch_err(message: String) -> DistError {
    DistError::Launch { message }
}

/// A port on 127.0.0.1 nobody listens on now (the OS picks it), for rank 0's store.
pub fn free_local_port() -> std::io::Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
}

/// Runs the ranks and waits for them.
pub fn run(launch: &Launch) -> Result<Outcome> {
    let nproc = launch.nproc;
    if nproc == 0 {
        return Err(launch_err(
            "--nproc 0: give the number of ranks to run (≥ 1)".into(),
        ));
    }
    if std::env::var_os("WORLD_SIZE").is_some() {
        return Err(launch_err(
            "--nproc inside a launched run (WORLD_SIZE is set): let torchrun or srun start the \
             ranks, or use --nproc alone"
                .into(),
        ));
    }
    let port = free_local_port()
        .map_err(|e| launch_err(format!("finding a free port for the ranks: {e}")))?;
    catch_signals();
    // One waiter thread per rank reports its exit at once, so the first rank to fail is the one
    // named (the others then fail too, seeing its connections close).
    let (exits, exited) = mpsc::channel();
    let Started { pids, pipes } = spawn_ranks(launch, port, exits)?;
    let Ended {
        failed,
        forwarded,
        rank0,
    } = wait_for_ranks(launch, pids, exited)?;
    for p in pipes {
        let _ = p.join();
    }
    Ok(match (failed, forwarded) {
        (Some((rank, status)), _) => Outcome::RankFailed { rank, status },
        (None, Some(signal)) => Outcome::Interrupted {
            signal,
            code: rank0
                .and_then(|s| s.code().or(s.signal().map(|k| 128 + k)))
                .unwrap_or(128 + signal),
        },
        (None, None) => match rank0.and_then(|s| s.code()) {
            Some(code) if Some(code) == launch.stopped_exit => Outcome::Stopped { code },
            _ => Outcome::Done,
        },
    })
}

/// From now on SIGINT, SIGTERM and SIGUSR1 are recorded in [`SIGNAL`], to be passed on to the
/// ranks.
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
}

/// A rank's exit as its waiter thread reports it.
type Exit = (usize, std::io::Result<ExitStatus>);

/// The ranks started.
struct Started {
    /// Their process ids (`None` once a rank's exit is reported).
    pids: Vec<Option<libc::pid_t>>,
    /// The threads copying their stderr.
    pipes: Vec<thread::JoinHandle<()>>,
}

/// Starts every rank, each with a thread copying its stderr and one sending its exit to
/// `exits` (dropped here: the receiver disconnects once every waiter has sent). A rank that
/// cannot start is an error, the ranks already started killed.
fn spawn_ranks(launch: &Launch, port: u16, exits: mpsc::Sender<Exit>) -> Result<Started> {
    let nproc = launch.nproc;
    let mut pids: Vec<Option<libc::pid_t>> = Vec::with_capacity(nproc);
    let mut pipes = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let spawned = Command::new(&launch.program)
            .args(&launch.args)
            .envs(Rendezvous::local(port, rank, nproc).to_env())
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            // Their own process group: a terminal's Ctrl-C reaches them once, through us.
            .process_group(0)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                signal_all(&pids, libc::SIGKILL);
                return Err(launch_err(format!(
                    "starting rank {rank} ({}): {e}",
                    launch.program.display()
                )));
            }
        };
        if let Some(err) = child.stderr.take() {
            pipes.push(thread::spawn(move || prefix_lines(rank, err)));
        }
        pids.push(Some(child.id() as libc::pid_t));
        let exits = exits.clone();
        thread::spawn(move || {
            let _ = exits.send((rank, child.wait()));
        });
    }
    Ok(Started { pids, pipes })
}

/// How the ranks ended.
struct Ended {
    /// The rank that failed first, and its status.
    failed: Option<(usize, ExitStatus)>,
    /// The last signal passed on.
    forwarded: Option<libc::c_int>,
    /// Rank 0's exit status.
    rank0: Option<ExitStatus>,
}

/// Waits for every rank in `pids` to exit, passing signals on; the first rank to fail gets the
/// others killed, [`STOP_GRACE`] later unless they have stopped by then.
fn wait_for_ranks(
    launch: &Launch,
    mut pids: Vec<Option<libc::pid_t>>,
    exited: mpsc::Receiver<Exit>,
) -> Result<Ended> {
    let mut failed: Option<(usize, ExitStatus)> = None;
    // A rank whose collective failed usually only saw another rank fail (its connections close
    // before that rank's process is gone): wait briefly for the rank that failed first.
    let mut lost_peer: Option<(usize, ExitStatus, Instant)> = None;
    // The last signal passed on, if any.
    let mut forwarded: Option<libc::c_int> = None;
    let mut rank0 = None;
    // When the ranks still running are killed (a rank failed).
    let mut kill_at: Option<Instant> = None;
    while pids.iter().any(Option::is_some) {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            forwarded = Some(sig);
            signal_all(&pids, sig);
        }
        if failed.is_none() {
            if let Some((rank, status, at)) = lost_peer {
                if at.elapsed() > PEER_GRACE {
                    failed = Some((rank, status));
                    signal_all(&pids, libc::SIGKILL);
                }
            }
        }
        if kill_at.is_some_and(|t| Instant::now() >= t) {
            signal_all(&pids, libc::SIGKILL);
            kill_at = None;
        }
        let (rank, status) = match exited.recv_timeout(Duration::from_millis(20)) {
            Ok(exit) => exit,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        pids[rank] = None;
        let status = status.map_err(|e| launch_err(format!("waiting for rank {rank}: {e}")))?;
        if rank == 0 {
            rank0 = Some(status);
        }
        // A rank stopped by a signal exits `stopped_exit` after its checkpoint (whoever sent the
        // signal), and one passed on by us 130 (Ctrl-C), 128 + the signal after a second one, or
        // ends by it: not failures.
        let stopped = |code: i32| code == 130 || forwarded.is_some_and(|f| code == 128 + f);
        let ok = status.success()
            || (status.code().is_some() && status.code() == launch.stopped_exit)
            || (forwarded.is_some() && status.code().is_some_and(stopped))
            || (forwarded.is_some() && status.signal() == forwarded);
        if ok || failed.is_some() {
            continue;
        }
        if launch.collective_failed_exit.is_some() && status.code() == launch.collective_failed_exit
        {
            lost_peer.get_or_insert((rank, status, Instant::now()));
        } else {
            failed = Some((rank, status));
            // The others learn of it within seconds (a collective, the store) and stop with
            // their own message; one still running then (waiting in a collective for this rank
            // until its timeout) is killed.
            kill_at = Some(Instant::now() + STOP_GRACE);
        }
    }
    let failed = failed.or(lost_peer.map(|(rank, status, _)| (rank, status)));
    Ok(Ended {
        failed,
        forwarded,
        rank0,
    })
}

/// Sends `sig` to every rank still running.
fn signal_all(pids: &[Option<libc::pid_t>], sig: libc::c_int) {
    for &pid in pids.iter().flatten() {
        // SAFETY: kill(2) on a child we started whose exit has not been reported yet.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Copies a rank's stderr to ours, each line prefixed `[rank K] `.
fn prefix_lines(rank: usize, from: impl std::io::Read) {
    let mut reader = BufReader::new(from);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                let mut err = std::io::stderr().lock();
                let _ = write!(err, "[rank {rank}] {}", text.trim_end_matches('\n'));
                let _ = writeln!(err);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_run_with_their_variables_and_a_failure_is_named() {
        let sh = |script: &str, nproc| Launch {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            nproc,
            collective_failed_exit: Some(3),
            stopped_exit: Some(75),
        };
        let ok = run(&sh("test \"$WORLD_SIZE\" = 3 && test \"$RANK\" -lt 3", 3)).unwrap();
        assert_eq!(ok, Outcome::Done);
        let failed = run(&sh("test \"$RANK\" != 1 || exit 7; sleep 5", 2)).unwrap();
        match failed {
            Outcome::RankFailed { rank, status } => {
                assert_eq!((rank, status.code()), (1, Some(7)));
                assert_eq!(failed.exit_code(), 7);
            }
            other => panic!("{other:?}"),
        }
        let err = run(&sh("true", 0)).unwrap_err().to_string();
        assert!(err.contains("--nproc 0"), "{err}");
    }
}
