//! The rendezvous key-value store: c10d's TCPStore (rank 0 hosts it, every rank is a client), as
//! torch.distributed uses it. Process groups meet in it; callers may share small values in it.
use std::ffi::c_int;
use std::ptr::NonNull;
use std::time::Duration;

use crate::error::{DistError, Result};
use crate::ffi;

/// A handle to a c10d store (a TCPStore, or a prefixed view of one). Thread-safe, like c10d's.
pub struct Store {
    raw: NonNull<ffi::RawStore>,
    /// This process's world rank, for error messages.
    rank: usize,
}

// SAFETY: c10d stores serialise their operations internally (TCPStore holds a lock per call), and
// the handle is only freed in Drop.
unsafe impl Send for Store {}
// SAFETY: as above.
unsafe impl Sync for Store {}

impl Store {
    /// Connects to (or, with `is_server`, hosts) the TCPStore at `host:port`, retrying the
    /// connection for up to `timeout`, which is also the default wait of later calls. Returns
    /// c10d's message on failure; callers classify it (see `ProcessGroup::new`).
    pub(crate) fn tcp(
        host: &str,
        port: u16,
        is_server: bool,
        world_size: usize,
        rank: usize,
        timeout: Duration,
    ) -> std::result::Result<Store, String> {
        let host = ffi::cstring(host)?;
        let world = i64::try_from(world_size).unwrap_or(i64::MAX);
        let mut raw = std::ptr::null_mut();
        // SAFETY: `host` outlives the call; on success the shim hands us a new handle.
        ffi::call(|err, len| unsafe {
            ffi::rsd_store_tcp(
                host.as_ptr(),
                port,
                c_int::from(is_server),
                world,
                ffi::millis(timeout),
                &mut raw,
                err,
                len,
            )
        })?;
        let raw = NonNull::new(raw).ok_or("the shim returned no store")?;
        Ok(Store { raw, rank })
    }

    pub(crate) fn raw(&self) -> *const ffi::RawStore {
        self.raw.as_ptr()
    }

    fn error(&self, op: &'static str, key: &str, message: String) -> DistError {
        DistError::Store {
            op,
            key: key.to_owned(),
            rank: self.rank,
            message,
        }
    }

    fn key(&self, op: &'static str, key: &str) -> Result<std::ffi::CString> {
        ffi::cstring(key).map_err(|m| self.error(op, key, m))
    }

    /// A view of this store in which every key is prefixed by `prefix` (c10d's PrefixStore).
    pub fn prefixed(&self, prefix: &str) -> Result<Store> {
        let c = self.key("prefix", prefix)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: both pointers are live for the call; on success we own the new handle.
        ffi::call(|err, len| unsafe {
            ffi::rsd_store_prefix(self.raw(), c.as_ptr(), &mut raw, err, len)
        })
        .map_err(|m| self.error("prefix", prefix, m))?;
        let raw = NonNull::new(raw)
            .ok_or_else(|| self.error("prefix", prefix, "the shim returned no store".into()))?;
        Ok(Store {
            raw,
            rank: self.rank,
        })
    }

    /// Sets `key` to `value`.
    pub fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let c = self.key("set", key)?;
        // SAFETY: all pointers are live for the call.
        ffi::call(|err, len| unsafe {
            ffi::rsd_store_set(
                self.raw(),
                c.as_ptr(),
                value.as_ptr(),
                value.len(),
                err,
                len,
            )
        })
        .map_err(|m| self.error("set", key, m))
    }

    /// Waits up to `timeout` for `key` to be set, then returns its value.
    pub fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        let c = self.key("get", key)?;
        let mut data: *mut u8 = std::ptr::null_mut();
        let mut n = 0usize;
        // SAFETY: all pointers are live for the call; on success `data` holds `n` bytes that we
        // copy and free below.
        ffi::call(|err, len| unsafe {
            ffi::rsd_store_get(
                self.raw(),
                c.as_ptr(),
                ffi::millis(timeout),
                &mut data,
                &mut n,
                err,
                len,
            )
        })
        .map_err(|m| self.error("get", key, m))?;
        if data.is_null() {
            return Err(self.error("get", key, "the shim returned no buffer".into()));
        }
        // SAFETY: see above; the buffer is freed exactly once, by the shim's own deallocator.
        let value = unsafe {
            let v = std::slice::from_raw_parts(data, n).to_vec();
            ffi::rsd_bytes_free(data);
            v
        };
        Ok(value)
    }

    /// Adds `delta` to the integer at `key` (0 if unset) and returns the new value; `add(key, 0)`
    /// reads a counter.
    pub fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let c = self.key("add", key)?;
        let mut out = 0i64;
        // SAFETY: all pointers are live for the call.
        ffi::call(|err, len| unsafe {
            ffi::rsd_store_add(self.raw(), c.as_ptr(), delta, &mut out, err, len)
        })
        .map_err(|m| self.error("add", key, m))?;
        Ok(out)
    }

    /// Whether `key` is set (does not wait).
    pub fn check(&self, key: &str) -> Result<bool> {
        let c = self.key("check", key)?;
        let mut out: c_int = 0;
        // SAFETY: all pointers are live for the call.
        ffi::call(|err, len| unsafe {
            ffi::rsd_store_check(self.raw(), c.as_ptr(), &mut out, err, len)
        })
        .map_err(|m| self.error("check", key, m))?;
        Ok(out != 0)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("rank", &self.rank)
            .finish_non_exhaustive()
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the handle came from the shim and is freed once.
        unsafe { ffi::rsd_store_free(self.raw.as_ptr()) }
    }
}
