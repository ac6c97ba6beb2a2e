//! One rank's failure, told to every other rank within seconds.
//!
//! A rank whose error ends its run while the others wait in a collective (a libtorch error or an
//! out-of-memory inside its forward, say) would leave them there until the collective's timeout:
//! NCCL does not tell a peer that a rank stopped issuing collectives, and a rank that is still
//! alive (tearing down, or holding its connections) closes no socket that Gloo would notice. So
//! a failing rank announces its error in the rendezvous store, and every rank runs a
//! [`FailureWatch`] that polls the store, over a connection of its own (the main thread's may be
//! blocked in a store wait, as NCCL's first communicator makes it), and hands another rank's
//! announcement to a callback, which ends the process.
//!
//! A rank that cannot announce anything (killed by the kernel's OOM killer, frozen, or on a lost
//! node) is found by its silence: every watch beats a counter of its own in the store each poll;
//! rank 0's watch reads every other rank's, the others read rank 0's, and a counter that stands
//! still for the liveness period, of a rank that has not left, is announced as that rank's
//! failure. Rank 0's process hosts the store, so its own death shows as a store that no longer
//! answers; for that to mean a failure, rank 0 keeps the store up at the end of a run until every
//! rank has left ([`FailureWatch::leave`]).
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::env::Rendezvous;
use crate::error::{DistError, Result};
use crate::store::Store;

/// The key a failing rank sets (under [`PREFIX`]).
const KEY: &str = "failed";
/// The count of ranks that have read another rank's failure.
const SEEN: &str = "seen";
/// Rank R's heartbeat: a counter its watch adds 1 to each poll (`alive/R`).
const ALIVE: &str = "alive/";
/// Set by rank R when its run ended and it stops watching (`left/R`).
const LEFT: &str = "left/";
/// Where the watch's keys live in the store.
const PREFIX: &str = "rsd/failure/";
/// Poll steps are cut this short so that stopping the watch does not wait a whole poll.
const SLICE: Duration = Duration::from_millis(50);

/// How often a watch polls, how long it gives this rank's own error to stop it first, and how
/// long a rank may stay silent before it counts as lost.
#[derive(Clone, Copy, Debug)]
pub struct WatchTimes {
    /// Between two looks at the store (and two heartbeats).
    pub poll: Duration,
    /// From hearing of another rank's failure to acting on it.
    pub grace: Duration,
    /// A rank whose heartbeat stands still this long (or a store that takes this long to answer)
    /// has failed. Also how long the watch tries to connect to the store.
    pub liveness: Duration,
}

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
        self.tell(&failure, self.world_size - 1)
    }

    /// Sets `failure` in the store for every rank to read. When this process hosts the store,
    /// which goes with it, waits (at most `linger`) until `readers` ranks have read it; ranks
    /// stopping on their own do not count, hence the bound.
    fn tell(&self, failure: &Failure, readers: usize) -> Result<()> {
        self.store.set(KEY, &failure.encode())?;
        if let Some(linger) = self.linger {
            let end = Instant::now() + linger;
            while Instant::now() < end
                && self
                    .store
                    .add(SEEN, 0)
                    .is_ok_and(|seen| seen < readers as i64)
            {
                std::thread::sleep(SLICE);
            }
        }
        Ok(())
    }

    fn hosts_store(&self) -> bool {
        self.linger.is_some()
    }
}

fn alive_key(rank: usize) -> String {
    format!("{ALIVE}{rank}")
}

fn left_key(rank: usize) -> String {
    format!("{LEFT}{rank}")
}

/// Polls the store for another rank's failure or silence on a thread of its own; see the
/// module's documentation. Dropping it stops the polling (without waiting for the thread); a run
/// that ends normally calls [`FailureWatch::leave`] instead.
pub struct FailureWatch {
    announcer: Announcer,
    done: Arc<AtomicBool>,
    times: WatchTimes,
}

impl FailureWatch {
    /// Connects to the store `rdzv` names (as a client: rank 0's process group hosts it, so this
    /// starts after the world group exists) and polls it every `times.poll`. When another rank
    /// announces a failure, or falls silent for `times.liveness` (module documentation), the
    /// watch waits `times.grace` for this rank to stop on its own (its error may reach it
    /// through a collective too, and its own message says more), then calls `on_failure` once
    /// and stops. So that rank 0's failure is not lost with the store its process hosts, rank
    /// 0's announcement waits (at most two polls and a second) until the others have read it.
    pub fn start(
        rdzv: &Rendezvous,
        times: WatchTimes,
        on_failure: impl FnOnce(Failure) + Send + 'static,
    ) -> Result<FailureWatch> {
        let address = format!("{}:{}", rdzv.master_addr, rdzv.master_port);
        // Connecting waits at most the liveness period. Calls need not return at all (c10d's
        // client reads its answers without a timeout): see the deadline thread below.
        let store = Store::tcp(
            &rdzv.master_addr,
            rdzv.master_port,
            false,
            rdzv.world_size,
            rdzv.rank,
            times.liveness,
        )
        .map_err(|message| DistError::Store {
            op: "connect",
            key: address.clone(),
            rank: rdzv.rank,
            message,
        })?;
        let prefix = match rdzv.agent_store {
            Some(attempt) => format!("/worker/attempt_{attempt}/{PREFIX}"),
            None => PREFIX.to_owned(),
        };
        let store = Arc::new(store.prefixed(&prefix)?);
        // The first beat before this returns: a rank is watched from its first beat, and one
        // that fails any time after its watch started must be seen to stop.
        store.add(&alive_key(rdzv.rank), 1)?;
        let hosts_store = rdzv.rank == 0 && rdzv.agent_store.is_none();
        let announcer = Announcer {
            store: store.clone(),
            rank: rdzv.rank,
            stopping: Arc::new(AtomicBool::new(false)),
            linger: hosts_store.then_some(2 * times.poll + Duration::from_secs(1)),
            world_size: rdzv.world_size,
        };
        let done = Arc::new(AtomicBool::new(false));
        let watched = match rdzv.rank {
            0 => (1..rdzv.world_size).collect(),
            _ => vec![0],
        };
        let store_host = rdzv.agent_store.is_none().then_some(address);
        let answered = Arc::new(Answered::now());
        let watch = Watching {
            announcer: announcer.clone(),
            store_host: store_host.clone(),
            done: done.clone(),
            times,
            heartbeats: watched.into_iter().map(Heartbeat::new).collect(),
            answered: answered.clone(),
        };
        let on_failure = OnFailure::new(on_failure);
        // Detached: it ends at its next slice once `done` is set, or with the process.
        spawn(rdzv.rank, "rsd-failure-watch", {
            let on_failure = on_failure.clone();
            move || {
                if let Some(failure) = watch.wait_for_failure() {
                    on_failure.call(failure);
                }
            }
        })?;
        // A store call on a frozen host never returns (c10d's client reads without a timeout):
        // a second thread notices that the watch stopped hearing from the store.
        if let (Some(address), true) = (store_host, rdzv.rank != 0) {
            let deadline = Deadline {
                address,
                answered,
                stopping: announcer.stopping.clone(),
                done: done.clone(),
                times,
            };
            spawn(rdzv.rank, "rsd-store-deadline", move || {
                if let Some(failure) = deadline.wait_for_silence() {
                    on_failure.call(failure);
                }
            })?;
        }
        Ok(FailureWatch {
            announcer,
            done,
            times,
        })
    }

    /// The handle this rank announces its own failure with.
    pub fn announcer(&self) -> Announcer {
        self.announcer.clone()
    }

    /// This rank's run ended (it makes no more collectives): stops watching and says so in the
    /// store, so that its silence from now on is not taken for a failure. Rank 0, whose process
    /// hosts the store, then waits until every other rank has left too, or has been silent for
    /// the liveness period (dead after its last collective: nothing is left to tell it), so that
    /// the store does not vanish under a rank still finishing its run. Best effort: a store that
    /// cannot be reached here can no longer matter to anyone.
    pub fn leave(self) {
        // Stopped first: rank 0 may close the store as soon as it reads the key below.
        self.done.store(true, Ordering::SeqCst);
        let store = &self.announcer.store;
        if store.set(&left_key(self.announcer.rank), b"1").is_err() || !self.announcer.hosts_store()
        {
            return;
        }
        let mut others: Vec<Heartbeat> =
            (1..self.announcer.world_size).map(Heartbeat::new).collect();
        while !others.is_empty() {
            let now = Instant::now();
            let mut still = Vec::with_capacity(others.len());
            for mut h in others {
                match (
                    store.check(&left_key(h.rank)),
                    store.add(&alive_key(h.rank), 0),
                ) {
                    // A rank that never beat never started its watch: nothing to wait for.
                    (Ok(false), Ok(beats))
                        if beats > 0 && !h.silent(beats, now, self.times.liveness) =>
                    {
                        still.push(h)
                    }
                    _ => {}
                }
            }
            others = still;
            if !others.is_empty() {
                std::thread::sleep(self.times.poll);
            }
        }
    }
}

impl Drop for FailureWatch {
    fn drop(&mut self) {
        // Not joined: on an error path the store may be gone or frozen, and a store call on a
        // frozen host never returns; the thread ends at its next slice, or with the process.
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

/// Starts a detached thread named `name`.
fn spawn(rank: usize, name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(drop)
        .map_err(|e| DistError::Store {
            op: "watch",
            key: KEY.into(),
            rank,
            message: format!("starting the {name} thread: {e}"),
        })
}

/// The failure callback, called at most once by whichever thread finds a failure first.
#[derive(Clone)]
struct OnFailure(Arc<Mutex<Option<FailureCallback>>>);

type FailureCallback = Box<dyn FnOnce(Failure) + Send>;

impl OnFailure {
    fn new(f: impl FnOnce(Failure) + Send + 'static) -> Self {
        OnFailure(Arc::new(Mutex::new(Some(Box::new(f)))))
    }

    fn call(&self, failure: Failure) {
        let f = self.0.lock().map(|mut f| f.take()).unwrap_or(None);
        if let Some(f) = f {
            f(failure);
        }
    }
}

/// When the watch last heard from the store: milliseconds since `base`.
struct Answered {
    base: Instant,
    millis: AtomicU64,
}

impl Answered {
    fn now() -> Self {
        Answered {
            base: Instant::now(),
            millis: AtomicU64::new(0),
        }
    }

    fn mark(&self) {
        let ms = self
            .base
            .elapsed()
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX);
        self.millis.store(ms, Ordering::SeqCst);
    }

    fn since(&self) -> Duration {
        self.base
            .elapsed()
            .saturating_sub(Duration::from_millis(self.millis.load(Ordering::SeqCst)))
    }
}

/// The second thread of a rank other than 0 whose store rank 0's process hosts: rank 0 counts as
/// lost when the watch has not heard from the store for the liveness period.
struct Deadline {
    address: String,
    answered: Arc<Answered>,
    stopping: Arc<AtomicBool>,
    done: Arc<AtomicBool>,
    times: WatchTimes,
}

impl Deadline {
    fn wait_for_silence(&self) -> Option<Failure> {
        let mut woke = Instant::now();
        loop {
            if !sleep(&self.done, self.times.poll) {
                return None;
            }
            let now = Instant::now();
            // This process was suspended with the rest of the job: the store's silence over
            // that time was this rank's own.
            if was_suspended(now.duration_since(woke), &self.times) {
                self.answered.mark();
            }
            woke = now;
            // A whole poll more than the period: the watch itself sleeps a poll between calls.
            if self.answered.since() < self.times.liveness + self.times.poll {
                continue;
            }
            if !sleep(&self.done, self.times.grace) || self.stopping.load(Ordering::SeqCst) {
                return None;
            }
            return Some(Failure {
                rank: 0,
                message: format!(
                    "stopped answering: the rendezvous store its process hosts ({}) did not \
                     answer for {} s (its process is frozen, or its node was lost)",
                    self.address,
                    self.times.liveness.as_secs_f64()
                ),
            });
        }
    }
}

/// Sleeps `d` in slices; false when `done` was set meanwhile.
fn sleep(done: &AtomicBool, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if done.load(Ordering::SeqCst) {
            return false;
        }
        std::thread::sleep(SLICE.min(end.saturating_duration_since(Instant::now())));
    }
    !done.load(Ordering::SeqCst)
}

/// What a watch knows of one other rank's heartbeat.
struct Heartbeat {
    rank: usize,
    /// The counter's last value, and when this watch saw it change.
    beats: i64,
    changed: Instant,
}

impl Heartbeat {
    fn new(rank: usize) -> Self {
        Heartbeat {
            rank,
            beats: 0,
            changed: Instant::now(),
        }
    }

    /// Takes the counter's value read at `now`; whether it has stood still for `liveness`. A
    /// rank that has not beaten yet (still starting) is not silent: it is watched from its
    /// first beat.
    fn silent(&mut self, beats: i64, now: Instant, liveness: Duration) -> bool {
        if beats != self.beats {
            self.beats = beats;
            self.changed = now;
        }
        self.beats > 0 && now.duration_since(self.changed) >= liveness
    }
}

/// The watch thread's state.
struct Watching {
    /// This rank's own: the store connection, rank, world size and stopping flag.
    announcer: Announcer,
    /// `host:port` of the store when rank 0's process hosts it (not torchrun's agent).
    store_host: Option<String>,
    done: Arc<AtomicBool>,
    times: WatchTimes,
    /// The ranks this one watches the heartbeats of: every other rank for rank 0, rank 0 for the
    /// others.
    heartbeats: Vec<Heartbeat>,
    /// Marked after every poll the store answered.
    answered: Arc<Answered>,
}

/// Whether a thread that meant to sleep a poll was away `away`: so long that this process
/// itself was stopped (a whole job suspended with SIGSTOP, `scontrol suspend`) rather than
/// another rank gone quiet. Then every rank's silence over that time is its own too, and the
/// watch starts counting again.
fn was_suspended(away: Duration, times: &WatchTimes) -> bool {
    away > (times.liveness / 2).max(3 * times.poll)
}

/// How long the watch waits after `errors` store calls in a row failed: a poll, doubling with
/// each failure up to a quarter of the liveness period (transient errors of a loaded store host
/// are retried; only a store that fails for the whole liveness period counts as lost).
fn backoff(errors: u32, times: &WatchTimes) -> Duration {
    let doubled = times.poll.saturating_mul(1 << errors.min(6));
    doubled.min((times.liveness / 4).max(times.poll))
}

impl Watching {
    /// Another rank's failure (announced, or its silence), once not followed within the grace by
    /// this rank stopping on its own; `None` when the watch ends first.
    fn wait_for_failure(mut self) -> Option<Failure> {
        let mut woke = Instant::now();
        // Store calls failed in a row, and since when.
        let mut errors: (u32, Option<Instant>) = (0, None);
        loop {
            if !sleep(&self.done, backoff(errors.0, &self.times)) {
                return None;
            }
            let now = Instant::now();
            if was_suspended(now.duration_since(woke), &self.times) {
                self.forget_silence(now);
            }
            woke = now;
            let looked = self.look();
            if looked.is_ok() {
                self.answered.mark();
                errors = (0, None);
            }
            let failure = match looked {
                Ok(None) => continue,
                Ok(Some(failure)) => failure,
                // Left or stopping meanwhile: the store may be gone for a good reason.
                Err(_) if self.done.load(Ordering::SeqCst) => return None,
                Err(e) => {
                    let since = *errors.1.get_or_insert(now);
                    errors.0 += 1;
                    if now.duration_since(since) < self.times.liveness {
                        eprintln!(
                            "rank {}: the rendezvous store did not answer the failure watch \
                             ({e}); retrying",
                            self.announcer.rank
                        );
                        continue;
                    }
                    self.store_lost(&e)?
                }
            };
            if !sleep(&self.done, self.times.grace)
                || self.announcer.stopping.load(Ordering::SeqCst)
            {
                return None;
            }
            return Some(failure);
        }
    }

    /// After this process was suspended: every watched rank's silence so far was this one's
    /// too, so each gets a whole liveness period from `now` to beat again.
    fn forget_silence(&mut self, now: Instant) {
        for h in &mut self.heartbeats {
            h.changed = now;
        }
        self.answered.mark();
    }

    /// One poll: this rank's heartbeat, another rank's announcement, the watched ranks' silence.
    fn look(&mut self) -> Result<Option<Failure>> {
        fault::store_error(self.announcer.rank)?;
        let (store, me) = (&self.announcer.store, self.announcer.rank);
        store.add(&alive_key(me), 1)?;
        if store.check(KEY)? {
            let announced = Failure::decode(&store.get(KEY, self.times.poll)?);
            return Ok(announced.filter(|f| f.rank != me).inspect(|_| {
                let _ = store.add(SEEN, 1);
            }));
        }
        let now = Instant::now();
        for i in 0..self.heartbeats.len() {
            let rank = self.heartbeats[i].rank;
            let beats = store.add(&alive_key(rank), 0)?;
            if !self.heartbeats[i].silent(beats, now, self.times.liveness)
                || store.check(&left_key(rank))?
            {
                continue;
            }
            let failure = Failure {
                rank,
                message: format!(
                    "stopped answering: its heartbeat in the rendezvous store stood still for {} s \
                     (its process was killed, by the kernel's OOM killer say, or is frozen, or its \
                     node was lost)",
                    self.times.liveness.as_secs_f64()
                ),
            };
            // Told to every rank, as its own announcement would have been; the lost rank and
            // this one do not read it.
            let readers = self.announcer.world_size.saturating_sub(2);
            self.announcer.tell(&failure, readers)?;
            return Ok(Some(failure));
        }
        Ok(None)
    }

    /// The failure a store that stopped answering means: rank 0's, when its process hosts the
    /// store (at the end of a run rank 0 keeps it up until every rank has left). torchrun's
    /// agent hosts it otherwise, and the agent itself ends the ranks when it goes.
    fn store_lost(&self, e: &DistError) -> Option<Failure> {
        let address = self.store_host.as_ref()?;
        Some(Failure {
            rank: 0,
            message: format!(
                "stopped answering: the rendezvous store its process hosts ({address}) failed \
                 ({e}); its process was killed, by the kernel's OOM killer say, or is frozen, or \
                 its node was lost"
            ),
        })
    }
}

/// Test hooks, compiled only with the `fault-injection` feature.
mod fault {
    use crate::error::Result;

    /// `RSD_DIST_FAULT_STORE_ERRORS=RANK:N`: the first N polls of rank RANK's failure watch fail
    /// as a store that does not answer would, to show that transient errors are retried.
    #[cfg(feature = "fault-injection")]
    pub fn store_error(rank: usize) -> Result<()> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static FAILED: AtomicU64 = AtomicU64::new(0);
        let Ok(spec) = std::env::var("RSD_DIST_FAULT_STORE_ERRORS") else {
            return Ok(());
        };
        let Some((r, n)) = spec.split_once(':') else {
            return Ok(());
        };
        let (Ok(r), Ok(n)) = (r.parse::<usize>(), n.parse::<u64>()) else {
            return Ok(());
        };
        if r != rank || FAILED.fetch_add(1, Ordering::SeqCst) >= n {
            return Ok(());
        }
        Err(crate::error::DistError::Store {
            op: "check",
            key: "failed".into(),
            rank,
            message: "fault injection: the store did not answer".into(),
        })
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn store_error(_rank: usize) -> Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_absence_is_a_suspension_and_errors_back_off_within_the_period() {
        let times = WatchTimes {
            poll: Duration::from_secs(1),
            grace: Duration::from_secs(3),
            liveness: Duration::from_secs(60),
        };
        assert!(!was_suspended(Duration::from_millis(1200), &times));
        assert!(!was_suspended(Duration::from_secs(20), &times));
        assert!(was_suspended(Duration::from_secs(31), &times));
        let short = WatchTimes {
            liveness: Duration::from_secs(3),
            ..times
        };
        // Never shorter than three polls: a loaded machine delays a poll by a second or two.
        assert!(!was_suspended(Duration::from_millis(2500), &short));
        assert!(was_suspended(Duration::from_secs(4), &short));
        let waits: Vec<u64> = (0..8).map(|e| backoff(e, &times).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 15, 15, 15, 15]);
        assert_eq!(backoff(3, &short), Duration::from_secs(1));
    }

    #[test]
    fn a_heartbeat_is_silent_once_it_stood_still_for_the_period_after_its_first_beat() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let period = s(2);
        let mut h = Heartbeat::new(1);
        assert!(
            !h.silent(0, t0 + s(10), period),
            "a rank that never beat is not watched"
        );
        assert!(!h.silent(3, t0 + s(10), period));
        assert!(!h.silent(3, t0 + s(11), period));
        assert!(h.silent(3, t0 + s(12), period));
        assert!(
            !h.silent(4, t0 + s(13), period),
            "a new beat starts the period again"
        );
        assert!(h.silent(4, t0 + s(15), period));
    }

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
