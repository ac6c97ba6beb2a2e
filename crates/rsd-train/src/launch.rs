//! `rsd-train --nproc N …`: runs N copies of this binary as the ranks of one data-parallel run on
//! this machine, as `torchrun --nproc-per-node N` would: torchrun's variables for each rank, a
//! free port for rank 0's store, each rank's stderr lines prefixed `[rank K] `, Ctrl-C and
//! SIGTERM passed on, and the first rank that fails named and the others stopped.
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use rsd_dist::Rendezvous;

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
    let mut children: Vec<Option<Child>> = Vec::with_capacity(nproc);
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
                stop_all(&mut children);
                return Err(e).with_context(|| format!("starting rank {rank}"));
            }
        };
        if let Some(err) = child.stderr.take() {
            pipes.push(thread::spawn(move || prefix_lines(rank, err)));
        }
        children.push(Some(child));
    }
    let mut failed: Option<(usize, ExitStatus)> = None;
    let mut interrupted = false;
    while children.iter().any(Option::is_some) {
        let sig = SIGNAL.swap(0, Ordering::SeqCst);
        if sig != 0 {
            interrupted = true;
            for c in children.iter().flatten() {
                // SAFETY: kill(2) on a child we started and have not reaped.
                unsafe { libc::kill(c.id() as libc::pid_t, sig) };
            }
        }
        for rank in 0..nproc {
            let Some(c) = children[rank].as_mut() else {
                continue;
            };
            let Some(status) = c.try_wait().context("waiting for the ranks")? else {
                continue;
            };
            children[rank] = None;
            // An interrupted rank exits 130 after its checkpoint; that is not a failure.
            let ok = status.success() || (interrupted && status.code() == Some(130));
            if !ok && failed.is_none() {
                failed = Some((rank, status));
                stop_all(&mut children);
            }
        }
        thread::sleep(Duration::from_millis(20));
    }
    for p in pipes {
        let _ = p.join();
    }
    if let Some((rank, status)) = failed {
        eprintln!(
            "rsd-train: error: rank {rank} of {nproc} failed ({status}); stopped the other ranks"
        );
        return Ok(status.code().filter(|&c| c != 0).unwrap_or(1));
    }
    Ok(if interrupted { 130 } else { 0 })
}

/// Kills every rank still running (after one failed, the others would wait for it until their
/// collectives time out).
fn stop_all(children: &mut [Option<Child>]) {
    for c in children.iter_mut().flatten() {
        let _ = c.kill();
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
