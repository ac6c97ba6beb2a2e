//! Fault injection for the crash-safety tests, compiled in only with the `fault-injection` cargo
//! feature (off by default): a production build reads no environment variable here and has no
//! abort in its write loop.
//!
//! With the feature, `RSD_PACK_CRASH_AFTER_SHARDS=N` makes a pack abort (no cleanup at all, as a
//! crash or a kill would) once N shards are finished and the next one has been started, leaving a
//! partial shard for the resume to deal with.

/// The faults to inject into one pack (none without the feature).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Faults {
    #[cfg(feature = "fault-injection")]
    crash_after_shards: Option<usize>,
}

impl Faults {
    /// The faults the environment asks for.
    pub(super) fn from_env() -> Faults {
        Faults {
            #[cfg(feature = "fault-injection")]
            crash_after_shards: std::env::var("RSD_PACK_CRASH_AFTER_SHARDS")
                .ok()
                .and_then(|v| v.parse().ok()),
        }
    }

    /// Called before each sample is added: `finished_shards` are complete and `in_open_shard`
    /// samples are already in the shard being written.
    #[inline]
    pub(super) fn before_sample(&self, finished_shards: usize, in_open_shard: usize) {
        #[cfg(feature = "fault-injection")]
        if self
            .crash_after_shards
            .is_some_and(|n| finished_shards >= n && in_open_shard > 0)
        {
            std::process::abort();
        }
        #[cfg(not(feature = "fault-injection"))]
        let _ = (finished_shards, in_open_shard);
    }
}
