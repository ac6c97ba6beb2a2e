//! `rsd-train --nproc N …`: runs N copies of this binary as the ranks of one data-parallel run on
//! this machine, as `torchrun --nproc-per-node N` would: torchrun's variables for each rank, a
//! free port for rank 0's store, each rank's stderr lines prefixed `[rank K] `, Ctrl-C and
//! SIGTERM passed on, and the first rank that fails named and the others stopped.
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rsd_dist::Rendezvous;

/// How long a rank whose collective failed waits to be named, for the rank that caused it.
const PEER_GRACE: Duration = Duration::from_secs(2);

/// The last SIGINT/SIGTERM received and not yet passed on (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
}

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

/// A port nobody listens on now (the OS picks it), for rank 0's store.
fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("finding a free port for the ranks")?;
    Ok(l.local_addr()?.port())
}

/// Runs `nproc` ranks and waits for them; the exit status for this process.
pub fn run(nproc: usize) -> Result<i32> {
    if nproc == 0 {
        bail!("--nproc 0: give the number of ranks to run (≥ 1)");
    }
    if std::env::var_os("WORLD_SIZE").is_some() {
        bail!(
            "--nproc inside a launched run (WORLD_SIZE is set): let torchrun or srun start the \
             ranks, or use --nproc alone"
        );
    }
    let exe = std::env::current_exe().context("locating the rsd-train binary")?;
    let args = rank_args();
    let port = free_port()?;
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
        libc::signal(
            libc::SIGTERM,
            on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
    // One waiter thread per rank reports its exit at once, so the first rank to fail is the one
    // named (the others then fail too, seeing its connections close).
    let (exits, exited) = mpsc::channel();
    let mut pids: Vec<Option<libc::pid_t>> = Vec::with_capacity(nproc);
    let mut pipes = Vec::with_capacity(nproc);
    for rank in 0..nproc {
        let spawned = Command::new(&exe)
            .args(&args)
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
                return Err(e).with_context(|| format!("starting rank {rank}"));
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
    drop(exits);
    let mut failed: Option<(usize, ExitStatus)> = None;
    // A rank whose collective failed usually only saw another rank fail (its connections close
    // before that rank's process is gone): wait briefly for the rank that failed first.
    let mut lost_peer: Option<(usize, ExitStatus, Instant)> = None;
    // The last signal passed on, if any.
    let mut forwarded: Option<libc::c_int> = None;
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
        let (rank, status) = match exited.recv_timeout(Duration::from_millis(20)) {
            Ok(exit) => exit,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        pids[rank] = None;
        let status = status.with_context(|| format!("waiting for rank {rank}"))?;
        // An interrupted rank exits 130 after its checkpoint, and SIGTERM ends it: not failures.
        let ok = status.success()
            || (forwarded.is_some() && status.code() == Some(130))
            || (forwarded.is_some() && status.signal() == forwarded);
        if ok || failed.is_some() {
            continue;
        }
        if status.code() == Some(crate::EXIT_COLLECTIVE_FAILED) {
            lost_peer.get_or_insert((rank, status, Instant::now()));
        } else {
            failed = Some((rank, status));
            // The others would wait for it until their collectives time out.
            signal_all(&pids, libc::SIGKILL);
        }
    }
    let failed = failed.or(lost_peer.map(|(rank, status, _)| (rank, status)));
    for p in pipes {
        let _ = p.join();
    }
    if let Some((rank, status)) = failed {
        eprintln!(
            "rsd-train: error: rank {rank} of {nproc} failed ({status}); stopped the other ranks"
        );
        return Ok(status.code().filter(|&c| c != 0).unwrap_or(1));
    }
    Ok(match forwarded {
        Some(sig) if sig == libc::SIGTERM => 128 + sig,
        Some(_) => 130,
        None => 0,
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
