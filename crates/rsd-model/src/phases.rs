//! The phase clock: where a training step's time goes, measured on the device that runs it.
//!
//! A phase is a named span of work. Phases nest: a span opened while another is open is recorded
//! under its path (`forward/attention forward`), so the attention's forward inside the forward
//! pass and inside the backward's recomputation are told apart. On CUDA each span is a pair of
//! timing events recorded on the current stream (no host synchronisation: the step runs as it
//! does unprofiled); [`take`] waits for the device once, at the end of the step, and returns the
//! time per path. On the CPU a span is two clock readings.
//!
//! The clock is off until [`enable`] turns it on; [`Phase::begin`] then costs one mutex and one
//! event record (microseconds), and nothing while it is off. The C++ attention function opens
//! its own spans (`attention forward`, `attention backward`) through the same clock
//! (`csrc/phase_clock.cpp`).
use std::ffi::{c_char, c_int, c_void, CStr, CString};

use tch::Device;

use crate::error::{ModelError, Result};

mod shim {
    use std::ffi::{c_char, c_int, c_void};

    extern "C" {
        pub fn rsd_phase_enable(device: c_int, err: *mut c_char, err_len: usize) -> c_int;
        pub fn rsd_phase_enabled() -> c_int;
        pub fn rsd_phase_begin(name: *const c_char);
        pub fn rsd_phase_end();
        pub fn rsd_phase_take(
            ctx: *mut c_void,
            each: extern "C" fn(*mut c_void, *const c_char, f64, u64),
            err: *mut c_char,
            err_len: usize,
        ) -> c_int;
    }
}

/// One phase's total over the spans recorded under its path.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseTime {
    /// The path: the names of the enclosing phases and its own, joined by `/`.
    pub path: String,
    /// Seconds, summed over its spans.
    pub seconds: f64,
    /// How many spans were recorded under this path.
    pub count: u64,
}

fn message(err: &[u8]) -> String {
    let end = err.iter().position(|&c| c == 0).unwrap_or(err.len());
    String::from_utf8_lossy(&err[..end]).into_owned()
}

/// Turns the clock on for `device` (dropping anything recorded before).
pub fn enable(device: Device) -> Result<()> {
    let index = match device {
        Device::Cuda(n) => n as c_int,
        _ => -1,
    };
    let mut err = vec![0u8; 1024];
    // SAFETY: `err` is a writable buffer of the stated length.
    let rc = unsafe { shim::rsd_phase_enable(index, err.as_mut_ptr().cast(), err.len()) };
    if rc != 0 {
        return Err(ModelError::Input(format!(
            "phase clock on {device:?}: {}",
            message(&err)
        )));
    }
    Ok(())
}

/// Whether the clock is on.
pub fn enabled() -> bool {
    // SAFETY: no arguments; reads a flag under the clock's mutex.
    unsafe { shim::rsd_phase_enabled() != 0 }
}

/// An open span; it closes when dropped. Spans close in the reverse order of opening (a guard
/// dropped at the end of the scope that opened it does that).
#[must_use = "the phase ends when this guard is dropped"]
pub struct Phase(());

impl Phase {
    /// Opens the span `name` (no `/` in it: that joins the path) under whatever is open now.
    pub fn begin(name: &str) -> Phase {
        if enabled() {
            let name = CString::new(name.replace('\0', "")).unwrap_or_default();
            // SAFETY: a valid NUL-terminated string for the duration of the call (copied there).
            unsafe { shim::rsd_phase_begin(name.as_ptr()) };
        }
        Phase(())
    }
}

impl Drop for Phase {
    fn drop(&mut self) {
        // SAFETY: closes the innermost open span; does nothing when the clock is off or none is
        // open.
        unsafe { shim::rsd_phase_end() }
    }
}

/// Runs `f` inside the span `name`.
pub fn timed<T>(name: &str, f: impl FnOnce() -> T) -> T {
    let _span = Phase::begin(name);
    f()
}

extern "C" fn collect(ctx: *mut c_void, name: *const c_char, ms: f64, count: u64) {
    // SAFETY: `ctx` is the `Vec<PhaseTime>` that `take` passes for the duration of the call, and
    // `name` a NUL-terminated string the clock owns for the duration of this callback.
    let (out, name) = unsafe { (&mut *ctx.cast::<Vec<PhaseTime>>(), CStr::from_ptr(name)) };
    out.push(PhaseTime {
        path: name.to_string_lossy().into_owned(),
        seconds: ms / 1e3,
        count,
    });
}

/// Waits for the device, returns the time of every path recorded since the last call (in order
/// of first appearance) and starts afresh. An error when a span is still open.
pub fn take() -> Result<Vec<PhaseTime>> {
    let mut out: Vec<PhaseTime> = Vec::new();
    let mut err = vec![0u8; 1024];
    // SAFETY: `out` outlives the call and is only touched by `collect` during it; `err` is a
    // writable buffer of the stated length.
    let rc = unsafe {
        shim::rsd_phase_take(
            (&mut out as *mut Vec<PhaseTime>).cast(),
            collect,
            err.as_mut_ptr().cast(),
            err.len(),
        )
    };
    if rc != 0 {
        return Err(ModelError::Input(format!("phase clock: {}", message(&err))));
    }
    Ok(out)
}
