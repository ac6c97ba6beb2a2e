//! The C ABI of `csrc/dist.cpp` and `csrc/nccl.cpp`. Every fallible function returns 0, or 1
//! with c10d's message in the caller's buffer; [`call`] turns that into a `Result`.
use std::ffi::{c_char, c_int};
use torch_sys::C_tensor;

/// Opaque `RsdStore` (a c10d Store).
#[repr(C)]
pub struct RawStore {
    _private: [u8; 0],
}

/// Opaque `RsdGroup` (a c10d Backend).
#[repr(C)]
pub struct RawGroup {
    _private: [u8; 0],
}

/// Opaque `RsdPending` (a collective in flight).
#[repr(C)]
pub struct RawPending {
    _private: [u8; 0],
}

extern "C" {
    pub fn rsd_store_tcp(
        host: *const c_char,
        port: u16,
        is_server: c_int,
        world_size: i64,
        timeout_ms: i64,
        out: *mut *mut RawStore,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_store_prefix(
        s: *const RawStore,
        prefix: *const c_char,
        out: *mut *mut RawStore,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_store_free(s: *mut RawStore);
    pub fn rsd_store_set(
        s: *const RawStore,
        key: *const c_char,
        data: *const u8,
        len: usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_store_get(
        s: *const RawStore,
        key: *const c_char,
        timeout_ms: i64,
        data: *mut *mut u8,
        len: *mut usize,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_bytes_free(data: *mut u8);
    pub fn rsd_store_add(
        s: *const RawStore,
        key: *const c_char,
        delta: i64,
        out: *mut i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_store_check(
        s: *const RawStore,
        key: *const c_char,
        out: *mut c_int,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;

    pub fn rsd_group_gloo(
        s: *const RawStore,
        prefix: *const c_char,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        out: *mut *mut RawGroup,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    #[cfg(feature = "nccl")]
    #[allow(clippy::too_many_arguments)]
    pub fn rsd_group_nccl(
        s: *const RawStore,
        prefix: *const c_char,
        rank: c_int,
        size: c_int,
        timeout_ms: i64,
        device: c_int,
        out: *mut *mut RawGroup,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_group_free(g: *mut RawGroup);
    pub fn rsd_group_backward_stats(
        g: *const RawGroup,
        calls: *mut i64,
        bytes: *mut i64,
        nanos: *mut i64,
    );

    pub fn rsd_all_reduce(
        g: *const RawGroup,
        t: *mut C_tensor,
        op: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_all_gather(
        g: *const RawGroup,
        t: *const C_tensor,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_reduce_scatter(
        g: *const RawGroup,
        t: *const C_tensor,
        op: c_int,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_reduce_scatter_start(
        g: *const RawGroup,
        t: *const C_tensor,
        op: c_int,
        timeout_ms: i64,
        out: *mut *mut RawPending,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_pending_wait(
        p: *mut RawPending,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_pending_free(p: *mut RawPending);
    pub fn rsd_broadcast(
        g: *const RawGroup,
        t: *mut C_tensor,
        root: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_all_to_all(
        g: *const RawGroup,
        t: *const C_tensor,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_send(
        g: *const RawGroup,
        t: *const C_tensor,
        dst: c_int,
        tag: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_recv(
        g: *const RawGroup,
        t: *mut C_tensor,
        src: c_int,
        tag: c_int,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_barrier(
        g: *const RawGroup,
        timeout_ms: i64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_all_gather_autograd(
        g: *const RawGroup,
        t: *const C_tensor,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_reduce_scatter_autograd(
        g: *const RawGroup,
        t: *const C_tensor,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
    pub fn rsd_all_to_all_autograd(
        g: *const RawGroup,
        t: *const C_tensor,
        timeout_ms: i64,
        out: *mut *mut C_tensor,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// Room for c10d's messages, which name keys, shapes and peers' addresses.
const ERR_LEN: usize = 4096;

/// Runs one shim call with an error buffer: `Err(message)` when it returned non-zero.
pub fn call(f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<(), String> {
    let mut err = vec![0u8; ERR_LEN];
    if f(err.as_mut_ptr().cast(), err.len()) == 0 {
        return Ok(());
    }
    let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
    let message = String::from_utf8_lossy(&err[..end]).trim().to_owned();
    Err(if message.is_empty() {
        "unknown error".to_owned()
    } else {
        message
    })
}

/// A C string for a key or host; interior NULs cannot come from our own formatting, and a user's
/// string with one is refused with the message returned here.
pub fn cstring(s: &str) -> Result<std::ffi::CString, String> {
    std::ffi::CString::new(s).map_err(|_| format!("'{s}' contains a NUL byte"))
}

/// Milliseconds for c10d, at least 1 (0 would mean "no wait" in some calls and "forever" in others).
pub fn millis(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}
