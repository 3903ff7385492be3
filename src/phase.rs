//! Load and run phases.
//!
//! While a load phase is active, small allocations come from each cache's *load rows*: slabs of their
//! own, never shared with run-phase objects. When the phase ends, each cache's load slabs are
//! settled (`cache::settle`). Empty ones go back to the heap; in the others, every page
//! with no live slot is purged. They then join the run rows, whose allocations reuse their free slots.
//! Finally every free heap page is purged. Survivors are never moved or reset: they stay valid and can
//! be freed later from any thread.
//!
//! Large blocks (buddy) need no segregation for memory: they are page-granular, and a freed one is
//! purged whole, so a dead large temporary never pins a page that a survivor uses.
//!
//! Forms:
//! - [`load_phase`]: the calling thread's phase (guards nest);
//! - [`load_phase_process`]: every thread's (runtimes that load on several threads, and the C API);
//! - `EDGEPOOL_LOAD_PHASE=1`: the process phase opened at start-up, for binaries that cannot be
//!   changed; it ends on `SIGUSR2`, after `EDGEPOOL_LOAD_SECONDS`, or through `edgepool_load_end()`,
//!   whichever comes first.
//!
//! Nothing here runs on the allocation fast path; the allocation slow paths (a small block's, and
//! every large block's) poll the start-up trigger ([`poll_trigger`], one relaxed load) and the
//! caches' own `settle_pending` flags. The flags that lower layers read live in `phase_state`; the
//! cache side of a phase (switching row sets, settling) in `cache::settle`; this module holds the
//! guards, the reports and the C API's phase. Locks: `sync::PHASE_C`, then `sync::PHASE_CONTROL`.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::arena;
use crate::cache::{self, settle, Cache, LoadEnd};
use crate::heap;
use crate::options;
use crate::phase_state::{self, RowSet, Start};
use crate::stats::COUNTERS;
use crate::sync;

/// What a load phase did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseReport {
    /// Allocations made during the phase (small ones through the load rows, plus large blocks).
    pub allocations: u64,
    /// The highest memory edgepool held from the OS during the phase.
    pub peak_bytes: usize,
    /// Bytes of load-phase allocations still live at the end (small survivors at their class size;
    /// large blocks still live).
    pub survivor_bytes: usize,
    /// Bytes handed back to the OS by the phase's end: the resident pages of load slabs that hold
    /// only free slots, and every free heap page (a freed block counts whole). Purges made while the
    /// phase ran are not in it, so it never exceeds `peak_bytes`.
    pub released_bytes: usize,
    /// Memory edgepool held from the OS when the phase began, and right after it ended.
    pub os_bytes_before: usize,
    pub os_bytes_after: usize,
    pub duration: Duration,
    /// Page faults the process took during the phase (minor and major, every thread's).
    pub page_faults: u64,
    /// edgepool's calls into the OS's memory map (`mmap`, `munmap`, `madvise`, `mprotect`, `mremap`)
    /// from the phase's start to its report, the purges of its end included.
    pub os_calls: u64,
    /// Caches of other threads whose load rows will be settled at their thread's next slow path.
    pub deferred_caches: usize,
}

/// How a load phase keeps load-time allocations apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PhaseMode {
    /// Small allocations come from slabs of their own; at the end, free slots of slabs that keep
    /// survivors are reused by the run phase, and their free pages are purged.
    #[default]
    Segregated,
    /// Small allocations are bumped out of 1 MiB chunks; a chunk goes back to the OS once everything in
    /// it is dead. Faster to allocate; survivors pin whole chunks.
    Arena,
}

impl PhaseMode {
    fn rows(self) -> RowSet {
        match self {
            PhaseMode::Segregated => RowSet::Load,
            PhaseMode::Arena => RowSet::Arena,
        }
    }
}

/// Live bytes of large blocks allocated during load phases.
pub(crate) static LOAD_LARGE_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Large allocations made during load phases (cumulative).
pub(crate) static LOAD_LARGE_ALLOCS: AtomicU64 = AtomicU64::new(0);

fn snapshot() -> Start {
    let os_bytes = heap::reset_peak();
    Start {
        t_ns: crate::os::now_ns(),
        os_bytes,
        large_allocs: LOAD_LARGE_ALLOCS.load(Ordering::Relaxed),
        arena_allocs: arena::ALLOCS.load(Ordering::Relaxed),
        faults: crate::os::page_faults(),
        os_calls: crate::os::os_calls(),
    }
}

/// The report of a phase that began at `start` and whose end began when the purge counter read
/// `end_purged` (before its slabs were settled).
fn finish_report(start: Start, end_purged: usize, small: LoadEnd, deferred: usize) -> PhaseReport {
    let peak = heap::peak();
    cache::runs::flush_all();
    cache::collect_abandoned();
    heap::trim();
    PhaseReport {
        allocations: small.allocations + LOAD_LARGE_ALLOCS.load(Ordering::Relaxed) - start.large_allocs
            + arena::ALLOCS.load(Ordering::Relaxed)
            - start.arena_allocs,
        peak_bytes: peak,
        survivor_bytes: small.survivor_bytes
            + LOAD_LARGE_LIVE.load(Ordering::Relaxed)
            + arena::LIVE_BYTES.load(Ordering::Relaxed),
        released_bytes: COUNTERS.purged_bytes.load(Ordering::Relaxed).saturating_sub(end_purged),
        os_bytes_before: start.os_bytes,
        os_bytes_after: heap::stats().os_bytes,
        duration: Duration::from_nanos(crate::os::now_ns() - start.t_ns),
        page_faults: crate::os::page_faults().saturating_sub(start.faults),
        os_calls: crate::os::os_calls().saturating_sub(start.os_calls),
        deferred_caches: deferred,
    }
}

enum Kind {
    /// The calling thread's phase, begun on the thread owning this cache.
    Thread(*mut Cache),
    Process,
}

/// An active load phase; it ends when dropped or [`LoadPhase::finish`]ed.
#[must_use = "the load phase ends when the guard is dropped"]
pub struct LoadPhase {
    kind: Kind,
    start: Start,
    done: bool,
}

// SAFETY: the guard may be dropped on another thread; ending then only touches atomics of the cache
// it names (the cache's owner settles its rows itself).
unsafe impl Send for LoadPhase {}

/// Starts a load phase for the calling thread (segregated slabs). Guards nest: the phase ends with the
/// outermost.
pub fn load_phase() -> LoadPhase {
    load_phase_with(PhaseMode::default())
}

/// Starts a load phase for the calling thread in the given mode. A nested guard keeps the mode of the
/// outermost one.
pub fn load_phase_with(mode: PhaseMode) -> LoadPhase {
    let c = cache::current();
    let start = snapshot();
    if !c.is_null() {
        // SAFETY: our own live cache (owner).
        unsafe { settle::thread_enter(c, mode.rows()) };
    }
    LoadPhase { kind: Kind::Thread(c), start, done: false }
}

/// Starts a load phase for every thread of the process (threads that start during it join it).
pub fn load_phase_process() -> LoadPhase {
    load_phase_process_with(PhaseMode::default())
}

/// Starts a process-wide load phase in the given mode (a nested one keeps the outermost's mode).
pub fn load_phase_process_with(mode: PhaseMode) -> LoadPhase {
    LoadPhase { kind: Kind::Process, start: process_begin(mode), done: false }
}

impl LoadPhase {
    /// Ends the phase and returns what it did.
    pub fn finish(mut self) -> PhaseReport {
        self.end()
    }

    fn end(&mut self) -> PhaseReport {
        self.done = true;
        let r = match self.kind {
            Kind::Thread(c) => thread_end(c, self.start),
            Kind::Process => process_end(self.start),
        };
        tracing::info!(
            target: "edgepool::phase",
            allocations = r.allocations,
            peak_bytes = r.peak_bytes,
            survivor_bytes = r.survivor_bytes,
            released_bytes = r.released_bytes,
            os_bytes_before = r.os_bytes_before,
            os_bytes_after = r.os_bytes_after,
            duration_us = r.duration.as_micros() as u64,
            "load phase ended"
        );
        r
    }
}

impl Drop for LoadPhase {
    fn drop(&mut self) {
        if !self.done {
            self.end();
        }
    }
}

fn thread_end(c: *mut Cache, start: Start) -> PhaseReport {
    let end_purged = COUNTERS.purged_bytes.load(Ordering::Relaxed);
    if c.is_null() {
        return finish_report(start, end_purged, LoadEnd::default(), 0);
    }
    // SAFETY: caches are never freed, and `c` had `thread_enter` when this guard was made.
    let (small, deferred) = match unsafe { settle::thread_leave(c) } {
        settle::ThreadLeave::Open => (LoadEnd::default(), 0),
        settle::ThreadLeave::Settled(done) => (done, 0),
        settle::ThreadLeave::Deferred => (LoadEnd::default(), 1),
    };
    finish_report(start, end_purged, small, deferred)
}

fn process_begin(mode: PhaseMode) -> Start {
    sync::PHASE_CONTROL.lock();
    if phase_state::process_enter(mode.rows()) {
        settle::switch_all(mode.rows());
    }
    sync::PHASE_CONTROL.unlock();
    snapshot()
}

fn process_end(start: Start) -> PhaseReport {
    let end_purged = COUNTERS.purged_bytes.load(Ordering::Relaxed);
    sync::PHASE_CONTROL.lock();
    let (small, deferred) = if phase_state::process_depth() == 1 {
        phase_state::process_leave();
        settle::end_process_phase()
    } else {
        phase_state::process_leave();
        (LoadEnd::default(), 0)
    };
    sync::PHASE_CONTROL.unlock();
    finish_report(start, end_purged, small, deferred)
}

// ---------------------------------------------------------------------------------------------------
// The C API's phase (one process-wide phase opened by edgepool_load_begin or EDGEPOOL_LOAD_PHASE).

/// The mode of C-API and start-up phases: `EDGEPOOL_LOAD_ARENA=1` picks the arena.
fn c_mode() -> PhaseMode {
    if heap::options().get(options::LOAD_ARENA) != 0 {
        PhaseMode::Arena
    } else {
        PhaseMode::Segregated
    }
}

/// `edgepool_load_begin()`: opens (or nests) the process-wide load phase.
pub fn c_begin() {
    sync::PHASE_C.lock();
    let s = process_begin(c_mode());
    phase_state::c_open(s);
    sync::PHASE_C.unlock();
}

/// `edgepool_load_end()`: closes the innermost phase opened by [`c_begin`]; `None` if none is open.
pub fn c_end() -> Option<PhaseReport> {
    sync::PHASE_C.lock();
    let r = phase_state::c_close().map(process_end);
    sync::PHASE_C.unlock();
    r
}

/// Polled on allocation slow paths: ends the start-up phase (`EDGEPOOL_LOAD_PHASE=1`) once its
/// trigger fired (`SIGUSR2`, or `EDGEPOOL_LOAD_SECONDS` passed). One relaxed load when not armed.
#[inline]
pub(crate) fn poll_trigger() {
    if phase_state::trigger_armed() {
        poll_trigger_slow();
    }
}

#[cold]
fn poll_trigger_slow() {
    if phase_state::take_fired_trigger() {
        if let Some(r) = c_end() {
            if heap::options().get(options::VERBOSE) != 0 {
                print_report(&r);
            }
        }
    }
}

/// Writes a report on stderr without allocating.
pub fn print_report(r: &PhaseReport) {
    let mut m = crate::os::MsgBuf::new();
    m.str("edgepool: load phase ended: ").num(r.allocations).str(" allocations, peak ").num(r.peak_bytes as u64);
    m.str(" B, survivors ").num(r.survivor_bytes as u64).str(" B, released ").num(r.released_bytes as u64);
    m.str(" B, os ").num(r.os_bytes_before as u64).str(" -> ").num(r.os_bytes_after as u64);
    m.str(" B, ").num(r.page_faults).str(" page faults, ").num(r.os_calls).str(" OS calls, ");
    m.num(r.duration.as_micros() as u64).str(" us\n");
    crate::os::write_stderr(m.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_class::class_of;

    /// A small block from the calling thread's cache (the routing layer is above this one).
    fn alloc(size: usize) -> *mut u8 {
        let c = class_of(size);
        cache::alloc_fast(c).map_or_else(|| cache::alloc_slow(c), |p| p.as_ptr())
    }

    /// # Safety
    /// - `p` is a live block from [`alloc`] (a slab slot), freed once.
    unsafe fn free(p: *mut u8) {
        // SAFETY: forwarded; a slab slot lies inside the heap's region, and its slab's header is the
        // table entry of its 64 KiB block.
        unsafe { cache::free_small(p, crate::heap::slab_of(p)) }
    }

    // Unit tests share the process with other tests running at the same time, so these use only thread
    // phases (a process-wide phase would switch every other test's thread too).

    #[test]
    fn a_thread_phase_segregates_counts_and_settles() {
        std::thread::spawn(|| {
            let before = alloc(64);
            assert!(!cache::current_is_load());
            let g = load_phase();
            assert!(cache::current_is_load());
            assert!(phase_state::any_active());
            let inner = load_phase();
            let mut keep = vec![];
            for i in 0..5000usize {
                let p = alloc(48 + i % 100);
                assert!(!p.is_null());
                if i % 10 == 0 {
                    keep.push(p);
                } else {
                    // SAFETY: a live block of ours, freed once.
                    unsafe { free(p) };
                }
            }
            let r = inner.finish();
            assert_eq!(r.allocations, 0, "an inner guard settles nothing");
            assert!(cache::current_is_load(), "the outer guard is still open");
            let r = g.finish();
            assert!(!cache::current_is_load());
            assert!(r.allocations >= 5000, "{r:?}");
            assert!(r.survivor_bytes >= 500 * 48, "{r:?}");
            assert_eq!(r.deferred_caches, 0);
            cache::check_mine().unwrap();
            // Survivors stay valid and can be freed after the phase.
            for p in keep.into_iter().chain([before]) {
                // SAFETY: live blocks of ours, freed once.
                unsafe {
                    p.write_bytes(1, 48);
                    free(p);
                }
            }
            cache::check_mine().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_guard_dropped_on_another_thread_defers_settling_to_the_owner() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let owner = std::thread::spawn(move || {
            let g = load_phase();
            let p = alloc(32);
            tx.send(g).unwrap();
            done_rx.recv().unwrap();
            // The owner's next slow path settles; its allocations are run-phase ones again.
            assert!(!cache::current_is_load());
            let q = alloc(4000);
            cache::check_mine().unwrap();
            // SAFETY: live blocks of ours, freed once.
            unsafe {
                free(q);
                free(p);
            }
        });
        let g = rx.recv().unwrap();
        let r = g.finish();
        assert_eq!(r.deferred_caches, 1);
        done_tx.send(()).unwrap();
        owner.join().unwrap();
    }
}
