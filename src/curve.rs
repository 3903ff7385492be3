//! The memory curve: a CSV of memory over time, written by a thread of its own that never allocates.
//!
//! `EDGEPOOL_CURVE=PATH` starts it at the first allocation slow path after start-up (a small
//! block's, or any large block's: from `global`, outside every lock); [`start`] starts it from Rust.
//! Every `EDGEPOOL_CURVE_MS` milliseconds (5 by default) the sampler appends one line:
//!
//! ```text
//! t_ms,rss_bytes,in_use_bytes,os_bytes,available_bytes,phase
//! ```
//!
//! - `t_ms`: milliseconds since the curve started;
//! - `rss_bytes`: the process's resident set (`/proc/self/statm`, `os::rss_bytes`);
//! - `in_use_bytes`: bytes in allocated heap blocks (slabs whole) and direct mappings;
//! - `os_bytes`: bytes edgepool holds from the OS (what the budget caps: in use, plus free memory not
//!   yet purged);
//! - `available_bytes`: the system's `MemAvailable` (`/proc/meminfo`);
//! - `phase`: 1 while a load phase is open anywhere in the process, else 0.
//!
//! The sampler is a raw `pthread` (no Rust thread machinery): it reads files into stack buffers and
//! writes each line with one `write(2)`; its only lock is the heap's, taken to read the heap's
//! figures. `scripts/plot-curve.py` draws the file. A `fork` child has no sampler.

use core::ffi::c_void;
use core::sync::atomic::{AtomicI32, AtomicU64, AtomicU8, Ordering};

use crate::heap;
use crate::options;
use crate::os;
use crate::phase_state;

/// No curve asked for yet (the environment not read).
const UNCHECKED: u8 = 0;
/// No sampler runs.
const IDLE: u8 = 1;
/// A sampler runs.
const RUNNING: u8 = 2;
/// The sampler was asked to stop.
const STOPPING: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(UNCHECKED);
static FD: AtomicI32 = AtomicI32::new(-1);
static INTERVAL_NS: AtomicU64 = AtomicU64::new(5_000_000);
static T0: AtomicU64 = AtomicU64::new(0);

const HEADER: &[u8] = b"t_ms,rss_bytes,in_use_bytes,os_bytes,available_bytes,phase\n";

/// Starts the curve of `EDGEPOOL_CURVE`, once, if it is set. Cheap when it is not (one load).
#[inline]
pub(crate) fn poll() {
    if STATE.load(Ordering::Relaxed) == UNCHECKED {
        poll_slow();
    }
}

#[cold]
fn poll_slow() {
    if !heap::is_ready() || STATE.compare_exchange(UNCHECKED, IDLE, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return;
    }
    let opts = heap::options();
    if opts.get(options::CURVE) == 0 {
        return;
    }
    os::with_option(b"CURVE", |path| {
        if let Err(why) = start_path(path, opts.get(options::CURVE_MS).saturating_mul(1_000_000)) {
            let mut m = os::MsgBuf::new();
            m.str("edgepool: EDGEPOOL_CURVE: ").str(why).str("\n");
            os::write_stderr(m.as_bytes());
        }
    });
}

/// Starts writing the memory curve to `path` (created or truncated), one sample every `interval`
/// (at least 1 ms). Fails when a curve is already being written, or the file cannot be created.
pub fn start(path: &str, interval: core::time::Duration) -> Result<(), &'static str> {
    heap::ensure_init();
    // The environment's curve, if any, is started (or given up) first.
    poll();
    let _ = STATE.compare_exchange(UNCHECKED, IDLE, Ordering::AcqRel, Ordering::Relaxed);
    start_path(path.as_bytes(), (interval.as_nanos() as u64).max(1_000_000))
}

fn start_path(path: &[u8], interval_ns: u64) -> Result<(), &'static str> {
    if STATE.compare_exchange(IDLE, RUNNING, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return Err("a memory curve is already being written");
    }
    let Some(fd) = os::open_write(path) else {
        STATE.store(IDLE, Ordering::Release);
        return Err("cannot create the file");
    };
    os::write_fd(fd, HEADER);
    FD.store(fd, Ordering::Relaxed);
    INTERVAL_NS.store(interval_ns.max(1_000_000), Ordering::Relaxed);
    T0.store(os::now_ns(), Ordering::Relaxed);
    // SAFETY: the sampler takes no argument; it reads only statics.
    if !unsafe { os::spawn_detached(sampler, core::ptr::null_mut()) } {
        os::close(fd);
        STATE.store(IDLE, Ordering::Release);
        return Err("cannot start the sampling thread");
    }
    Ok(())
}

/// Stops the curve: the sampler writes one last sample, closes the file and exits before this
/// returns. Returns whether a curve was being written.
pub fn stop() -> bool {
    if STATE.compare_exchange(RUNNING, STOPPING, Ordering::AcqRel, Ordering::Relaxed).is_err() {
        return false;
    }
    while STATE.load(Ordering::Acquire) == STOPPING {
        os::sleep_ns(200_000);
    }
    true
}

extern "C" fn sampler(_: *mut c_void) -> *mut c_void {
    let fd = FD.load(Ordering::Relaxed);
    loop {
        let stopping = STATE.load(Ordering::Acquire) == STOPPING;
        sample(fd);
        if stopping {
            os::close(fd);
            STATE.store(IDLE, Ordering::Release);
            return core::ptr::null_mut();
        }
        os::sleep_ns(INTERVAL_NS.load(Ordering::Relaxed));
    }
}

/// Writes one line of the curve to `fd`.
fn sample(fd: i32) {
    let rss = os::rss_bytes() as u64;
    let mut buf = [0u8; 4096];
    let n = os::read_small_file(c"/proc/meminfo", &mut buf);
    let avail = meminfo(&buf[..n], b"MemAvailable:").unwrap_or(0).saturating_mul(1024);
    let s = heap::stats();
    let in_use = s.in_use_bytes;
    let t_ms = (os::now_ns() - T0.load(Ordering::Relaxed)) / 1_000_000;
    let mut m = os::MsgBuf::new();
    m.num(t_ms).str(",").num(rss).str(",").num(in_use as u64).str(",").num(s.os_bytes as u64).str(",");
    m.num(avail).str(",").num(u64::from(phase_state::any_active())).str("\n");
    os::write_fd(fd, m.as_bytes());
}

/// The number after `key` in `/proc/meminfo`'s text (kB).
fn meminfo(text: &[u8], key: &[u8]) -> Option<u64> {
    let at = text.windows(key.len()).position(|w| w == key)?;
    let rest = &text[at + key.len()..];
    let end = rest.iter().position(|&c| c == b'k' || c == b'\n').unwrap_or(rest.len());
    options::parse_u64(&rest[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_text_is_parsed() {
        let mi = b"MemTotal:       24000000 kB\nMemFree:         100 kB\nMemAvailable:   20000000 kB\n";
        assert_eq!(meminfo(mi, b"MemAvailable:"), Some(20_000_000));
        assert_eq!(meminfo(mi, b"SwapTotal:"), None);
    }
}
