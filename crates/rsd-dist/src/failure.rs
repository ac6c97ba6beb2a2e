//! One rank's failure, told to every other rank within about a second.
//!
//! A rank whose error ends its run while the others wait in a collective (a libtorch error or an
//! out-of-memory inside its forward, say) would leave them there until the collective's timeout:
//! NCCL does not tell a peer that a rank stopped issuing collectives, and a rank that is still
//! alive (tearing down, or holding its connections) closes no socket that Gloo would notice. So
//! a failing rank announces its error in the rendezvous store, and every rank runs a
//! [`FailureWatch`] that polls the store, over a connection of its own (the main thread's may be
//! blocked in a store wait, as NCCL's first communicator makes it), and hands another rank's
//! announcement to a callback, which ends the process.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::env::Rendezvous;
use crate::error::{DistError, Result};
use crate::store::Store;

/// The key a failing rank sets (under [`PREFIX`]).
const KEY: &str = "failed";
/// The count of ranks that have read another rank's failure.
const SEEN: &str = "seen";
/// Where the watch's keys live in the store.
const PREFIX: &str = "rsd/failure/";
/// Poll steps are cut this short so that stopping the watch does not wait a whole poll.
const SLICE: Duration = Duration::from_millis(50);

/// A failure another rank announced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The world rank that failed.
    pub rank: usize,
    /// Its error, as it printed it.
    pub message: String,
}

impl Failure {
    fn encode(&self) -> Vec<u8> {
        format!("{}\n{}", self.rank, self.message).into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Failure> {
        let text = String::from_utf8_lossy(bytes);
        let (rank, message) = text.split_once('\n')?;
        Some(Failure {
            rank: rank.parse().ok()?,
            message: message.to_owned(),
        })
    }
}

/// What this rank uses to announce its own failure; cheap to clone (a panic hook may hold one).
#[derive(Clone)]
pub struct Announcer {
    store: Arc<Store>,
    rank: usize,
    stopping: Arc<AtomicBool>,
    /// `Some(how long at most)` when this rank's process hosts the store, which must outlive
    /// the announcement until the others have read it.
    linger: Option<Duration>,
    world_size: usize,
}

impl Announcer {
    /// Tells every rank that this one failed with `message`, and that this rank is stopping on
    /// its own (its watch no longer acts on other ranks' failures: this rank's own error is the
    /// one it should print). Best effort: a store that cannot be reached is reported, nothing
    /// more can be done about it.
    pub fn announce(&self, message: &str) -> Result<()> {
        self.stopping.store(true, Ordering::SeqCst);
        let failure = Failure {
            rank: self.rank,
            message: message.to_owned(),
        };
        self.store.set(KEY, &failure.encode())?;
        // The store goes with this process: wait until every other rank has read the failure
        // (or the time they need to, for ranks stopping on their own, which do not count).
        if let Some(linger) = self.linger {
            let end = Instant::now() + linger;
            while Instant::now() < end
                && self
                    .store
                    .add(SEEN, 0)
                    .is_ok_and(|seen| seen + 1 < self.world_size as i64)
            {
                std::thread::sleep(SLICE);
            }
        }
        Ok(())
    }
}

/// Polls the store for another rank's failure on a thread of its own; see the module's
/// documentation. Dropping it stops the polling (without waiting for the thread).
pub struct FailureWatch {
    announcer: Announcer,
    done: Arc<AtomicBool>,
}

impl FailureWatch {
    /// Connects to the store `rdzv` names (as a client: rank 0's process group hosts it, so this
    /// starts after the world group exists) and polls it every `poll`. When another rank
    /// announces a failure, the watch waits `grace` for this rank to stop on its own (its error
    /// may reach it through a collective too, and its own message says more), then calls
    /// `on_failure` once and stops. A store that can no longer be reached (rank 0 has finished
    /// and closed it) ends the watch quietly; so that this does not hide a failure of rank 0,
    /// whose process hosts the store, rank 0's announcement waits (at most two polls and a
    /// second) until the others have read it.
    pub fn start(
        rdzv: &Rendezvous,
        timeout: Duration,
        poll: Duration,
        grace: Duration,
        on_failure: impl FnOnce(Failure) + Send + 'static,
    ) -> Result<FailureWatch> {
        let store = Store::tcp(
            &rdzv.master_addr,
            rdzv.master_port,
            false,
            rdzv.world_size,
            rdzv.rank,
            timeout,
        )
        .map_err(|message| DistError::Store {
            op: "connect",
            key: format!("{}:{}", rdzv.master_addr, rdzv.master_port),
            rank: rdzv.rank,
            message,
        })?;
        let prefix = match rdzv.agent_store {
            Some(attempt) => format!("/worker/attempt_{attempt}/{PREFIX}"),
            None => PREFIX.to_owned(),
        };
        let store = Arc::new(store.prefixed(&prefix)?);
        let hosts_store = rdzv.rank == 0 && rdzv.agent_store.is_none();
        let announcer = Announcer {
            store: store.clone(),
            rank: rdzv.rank,
            stopping: Arc::new(AtomicBool::new(false)),
            linger: hosts_store.then_some(2 * poll + Duration::from_secs(1)),
            world_size: rdzv.world_size,
        };
        let done = Arc::new(AtomicBool::new(false));
        let watch = Watching {
            store,
            rank: rdzv.rank,
            stopping: announcer.stopping.clone(),
            done: done.clone(),
            poll,
            grace,
        };
        // Detached: it ends at its next slice once `done` is set, or with the process.
        std::thread::Builder::new()
            .name("rsd-failure-watch".into())
            .spawn(move || {
                if let Some(failure) = watch.wait_for_failure() {
                    on_failure(failure);
                }
            })
            .map_err(|e| DistError::Store {
                op: "watch",
                key: KEY.into(),
                rank: rdzv.rank,
                message: format!("starting the watch thread: {e}"),
            })?;
        Ok(FailureWatch { announcer, done })
    }

    /// The handle this rank announces its own failure with.
    pub fn announcer(&self) -> Announcer {
        self.announcer.clone()
    }
}

impl Drop for FailureWatch {
    fn drop(&mut self) {
        // Not joined: on an error path the store may be gone, and a store call blocks until its
        // timeout; the thread ends at its next slice, or with the process.
        self.done.store(true, Ordering::SeqCst);
    }
}

/// Ends this process at once with `code`, from any thread, after flushing stdout and stderr.
/// Exit handlers are not run: they would tear down process groups the main thread may be
/// blocked in (a watch's callback runs while it is), which can hang or abort.
pub fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit ends the process without touching Rust or C++ state.
    unsafe { libc::_exit(code) }
}

/// The watch thread's state.
struct Watching {
    store: Arc<Store>,
    rank: usize,
    stopping: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    poll: Duration,
    grace: Duration,
}

impl Watching {
    /// Another rank's failure, once announced and not followed within the grace by this rank
    /// stopping on its own; `None` when the watch ends first.
    fn wait_for_failure(&self) -> Option<Failure> {
        loop {
            if !self.sleep(self.poll) {
                return None;
            }
            // An unreachable store: rank 0 finished (or died, which its peers learn otherwise).
            if !self.store.check(KEY).ok()? {
                continue;
            }
            let failure = Failure::decode(&self.store.get(KEY, self.poll).ok()?)?;
            if failure.rank == self.rank {
                continue;
            }
            let _ = self.store.add(SEEN, 1);
            if !self.sleep(self.grace) || self.stopping.load(Ordering::SeqCst) {
                return None;
            }
            return Some(failure);
        }
    }

    /// Sleeps `d` in slices; false when the watch was stopped meanwhile.
    fn sleep(&self, d: Duration) -> bool {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if self.done.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(SLICE.min(end.saturating_duration_since(Instant::now())));
        }
        !self.done.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_survives_its_encoding_with_newlines_in_the_message() {
        let f = Failure {
            rank: 17,
            message: "out of memory\nwhile allocating 2 GiB".into(),
        };
        assert_eq!(Failure::decode(&f.encode()), Some(f));
        assert_eq!(Failure::decode(b"x\nmessage"), None);
        assert_eq!(Failure::decode(b"no newline"), None);
    }
}
