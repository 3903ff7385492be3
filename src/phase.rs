//! Load and run phases.
//!
//! While a load phase is active, small allocations come from each cache's *load rows*: slabs of their
//! own, never shared with run-phase objects. When the phase ends, each cache's load slabs are
//! settled ([`crate::cache::end_load_rows`]). Empty ones go back to the heap; in the others, every page
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
//! Nothing here runs on the allocation fast path; the slow path only polls two flags.

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::cache::{self, Cache};
use crate::heap;
use crate::options;
use crate::size_class::NCLASSES;
use crate::stats::COUNTERS;
use crate::sync::RawLock;

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
    /// Resident bytes handed back to the OS when the phase ended.
    pub released_bytes: usize,
    /// Memory edgepool held from the OS when the phase began, and right after it ended.
    pub os_bytes_before: usize,
    pub os_bytes_after: usize,
    pub duration: Duration,
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
    fn rows(self) -> usize {
        match self {
            PhaseMode::Segregated => NCLASSES,
            PhaseMode::Arena => cache::ARENA_ROWS,
        }
    }
}

/// Depth of process-wide phases.
static GLOBAL_DEPTH: AtomicUsize = AtomicUsize::new(0);
/// Row set of the open process-wide phase.
static GLOBAL_ROWS: AtomicUsize = AtomicUsize::new(NCLASSES);

/// The row set a new cache starts with: the process-wide phase's, or the run rows.
pub fn global_rows() -> usize {
    if global_active() {
        GLOBAL_ROWS.load(Ordering::Relaxed)
    } else {
        0
    }
}
/// Serialises process-wide begin/end (never taken on an allocation path).
static CONTROL: RawLock = RawLock::new();
/// Live bytes of large blocks allocated during load phases.
pub(crate) static LOAD_LARGE_LIVE: AtomicUsize = AtomicUsize::new(0);
/// Large allocations made during load phases (cumulative).
pub(crate) static LOAD_LARGE_ALLOCS: AtomicU64 = AtomicU64::new(0);

/// Thread load phases open anywhere in the process (outermost guards only).
static THREAD_PHASES: AtomicUsize = AtomicUsize::new(0);

/// Whether any load phase (process-wide or of some thread) is open.
#[inline]
pub fn any_active() -> bool {
    GLOBAL_DEPTH.load(Ordering::Relaxed) > 0 || THREAD_PHASES.load(Ordering::Relaxed) > 0
}

/// Whether a process-wide load phase is active.
#[inline]
pub fn global_active() -> bool {
    GLOBAL_DEPTH.load(Ordering::Relaxed) > 0
}

/// Whether the calling thread allocates in the load phase (for tagging large blocks).
#[inline]
pub fn current_is_load() -> bool {
    let c = cache::mine();
    if c.is_null() {
        return global_active();
    }
    // SAFETY: our own live cache.
    unsafe { (*c).active.load(Ordering::Relaxed) != 0 }
}

/// The figures taken when a phase begins.
#[derive(Clone, Copy, Debug)]
struct Start {
    t_ns: u64,
    os_bytes: usize,
    large_allocs: u64,
    purged: usize,
    arena_allocs: u64,
}

fn snapshot() -> Start {
    let os_bytes = heap::reset_peak();
    Start {
        t_ns: crate::os::now_ns(),
        os_bytes,
        large_allocs: LOAD_LARGE_ALLOCS.load(Ordering::Relaxed),
        purged: COUNTERS.purged_bytes.load(Ordering::Relaxed),
        arena_allocs: crate::arena::ALLOCS.load(Ordering::Relaxed),
    }
}

fn finish_report(start: Start, small: cache::LoadEnd, deferred: usize) -> PhaseReport {
    let peak = heap::peak();
    crate::trim();
    let mut s = crate::Stats::default();
    heap::fill_stats(&mut s);
    PhaseReport {
        allocations: small.allocations + LOAD_LARGE_ALLOCS.load(Ordering::Relaxed) - start.large_allocs
            + crate::arena::ALLOCS.load(Ordering::Relaxed)
            - start.arena_allocs,
        peak_bytes: peak,
        survivor_bytes: small.survivor_bytes
            + LOAD_LARGE_LIVE.load(Ordering::Relaxed)
            + crate::arena::LIVE_BYTES.load(Ordering::Relaxed),
        released_bytes: COUNTERS.purged_bytes.load(Ordering::Relaxed) - start.purged,
        os_bytes_before: start.os_bytes,
        os_bytes_after: s.os_bytes,
        duration: Duration::from_nanos(crate::os::now_ns() - start.t_ns),
        deferred_caches: deferred,
    }
}

fn add(a: &mut cache::LoadEnd, b: cache::LoadEnd) {
    a.allocations += b.allocations;
    a.survivor_bytes += b.survivor_bytes;
    a.purged_bytes += b.purged_bytes;
    a.slabs_released += b.slabs_released;
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
        // SAFETY: our own live cache.
        unsafe {
            if (*c).depth.fetch_add(1, Ordering::Relaxed) == 0 {
                THREAD_PHASES.fetch_add(1, Ordering::Relaxed);
                (*c).active.store(mode.rows(), Ordering::Relaxed);
            }
        }
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
    if c.is_null() {
        return finish_report(start, cache::LoadEnd::default(), 0);
    }
    // SAFETY: caches are never freed; depth/active/end_pending are atomics.
    let last = unsafe { (*c).depth.fetch_sub(1, Ordering::Relaxed) == 1 };
    if last {
        THREAD_PHASES.fetch_sub(1, Ordering::Relaxed);
    }
    let mut small = cache::LoadEnd::default();
    let mut deferred = 0;
    if last && !global_active() {
        // SAFETY: as above.
        unsafe { (*c).active.store(0, Ordering::Relaxed) };
        if c == cache::mine() {
            // SAFETY: the calling thread owns `c`.
            small = unsafe { end_cache(c) };
        } else {
            // Dropped on another thread: the owner settles its rows at its next slow path.
            // SAFETY: atomic flag.
            unsafe { (*c).end_pending.store(true, Ordering::Release) };
            deferred = 1;
        }
    }
    finish_report(start, small, deferred)
}

/// Settles a cache's load rows and retires its arena chunk.
///
/// # Safety
/// - `c` is owned by the calling thread (or taken out of the pool by it).
unsafe fn end_cache(c: *mut Cache) -> cache::LoadEnd {
    // SAFETY: forwarded.
    unsafe {
        cache::end_arena(c);
        cache::end_load_rows(c)
    }
}

fn process_begin(mode: PhaseMode) -> Start {
    CONTROL.lock();
    if GLOBAL_DEPTH.fetch_add(1, Ordering::Relaxed) == 0 {
        GLOBAL_ROWS.store(mode.rows(), Ordering::Relaxed);
        cache::for_each_cache(|c| {
            // SAFETY: caches are never freed; `active` is atomic.
            unsafe { (*c).active.store(mode.rows(), Ordering::Relaxed) };
        });
    }
    CONTROL.unlock();
    snapshot()
}

fn process_end(start: Start) -> PhaseReport {
    CONTROL.lock();
    let last = GLOBAL_DEPTH.load(Ordering::Relaxed) == 1;
    let mut small = cache::LoadEnd::default();
    let mut deferred = 0;
    if last {
        let me = cache::mine();
        cache::for_each_cache(|c| {
            // SAFETY: caches are never freed; these fields are atomics.
            unsafe {
                if (*c).depth.load(Ordering::Relaxed) == 0 {
                    (*c).active.store(0, Ordering::Relaxed);
                    if c != me {
                        (*c).end_pending.store(true, Ordering::Release);
                    }
                }
            }
        });
        GLOBAL_DEPTH.store(0, Ordering::Relaxed);
        // SAFETY: `me` is ours; pooled caches are exclusively ours inside with_pooled_caches.
        unsafe {
            if !me.is_null() && (*me).depth.load(Ordering::Relaxed) == 0 {
                add(&mut small, end_cache(me));
            }
            cache::with_pooled_caches(|c| {
                if (*c).end_pending.swap(false, Ordering::Acquire) {
                    add(&mut small, end_cache(c));
                }
            });
        }
        cache::for_each_cache(|c| {
            // SAFETY: atomic flag.
            if c != me && unsafe { (*c).end_pending.load(Ordering::Relaxed) } {
                deferred += 1;
            }
        });
    } else {
        GLOBAL_DEPTH.fetch_sub(1, Ordering::Relaxed);
    }
    CONTROL.unlock();
    finish_report(start, small, deferred)
}

/// Called by a cache's owner at its slow path when `end_pending` is set.
///
/// # Safety
/// - `c` is owned by the calling thread.
pub(crate) unsafe fn end_pending(c: *mut Cache) {
    // SAFETY: owner only.
    unsafe {
        if (*c).end_pending.swap(false, Ordering::Acquire) && (*c).depth.load(Ordering::Relaxed) == 0 && !global_active() {
            end_cache(c);
        }
    }
}

/// A cache adopted by a new thread starts in the phase the process is in, with no thread guard.
///
/// # Safety
/// - `c` was just taken from the pool by the calling thread.
pub(crate) unsafe fn on_adopt(c: *mut Cache) {
    // SAFETY: exclusively ours.
    unsafe {
        if (*c).depth.swap(0, Ordering::Relaxed) > 0 {
            THREAD_PHASES.fetch_sub(1, Ordering::Relaxed);
        }
        if global_active() {
            (*c).active.store(global_rows(), Ordering::Relaxed);
        } else {
            (*c).active.store(0, Ordering::Relaxed);
            (*c).end_pending.store(false, Ordering::Relaxed);
            end_cache(c);
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// The C API's phase (one process-wide phase opened by edgepool_load_begin or EDGEPOOL_LOAD_PHASE).

static C_LOCK: RawLock = RawLock::new();
static C_OPEN: AtomicUsize = AtomicUsize::new(0);
static C_START: [AtomicU64; 5] =
    [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

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
    C_LOCK.lock();
    let s = process_begin(c_mode());
    if C_OPEN.fetch_add(1, Ordering::Relaxed) == 0 {
        C_START[0].store(s.t_ns, Ordering::Relaxed);
        C_START[1].store(s.os_bytes as u64, Ordering::Relaxed);
        C_START[2].store(s.large_allocs, Ordering::Relaxed);
        C_START[3].store(s.purged as u64, Ordering::Relaxed);
        C_START[4].store(s.arena_allocs, Ordering::Relaxed);
    }
    C_LOCK.unlock();
}

/// `edgepool_load_end()`: closes the innermost phase opened by [`c_begin`]; `None` if none is open.
pub fn c_end() -> Option<PhaseReport> {
    C_LOCK.lock();
    if C_OPEN.load(Ordering::Relaxed) == 0 {
        C_LOCK.unlock();
        return None;
    }
    let start = Start {
        t_ns: C_START[0].load(Ordering::Relaxed),
        os_bytes: C_START[1].load(Ordering::Relaxed) as usize,
        large_allocs: C_START[2].load(Ordering::Relaxed),
        purged: C_START[3].load(Ordering::Relaxed) as usize,
        arena_allocs: C_START[4].load(Ordering::Relaxed),
    };
    C_OPEN.fetch_sub(1, Ordering::Relaxed);
    let r = process_end(start);
    C_LOCK.unlock();
    Some(r)
}

// The start-up trigger.
static TRIGGER_ARMED: AtomicBool = AtomicBool::new(false);
static TRIGGER_FIRED: AtomicBool = AtomicBool::new(false);
static TRIGGER_DEADLINE: AtomicU64 = AtomicU64::new(u64::MAX);

extern "C" fn on_sigusr2(_: libc::c_int) {
    TRIGGER_FIRED.store(true, Ordering::Relaxed);
}

/// Opens the start-up phase if `EDGEPOOL_LOAD_PHASE` asks for it (called once after initialisation).
pub(crate) fn startup(o: &options::Values) {
    if o.get(options::LOAD_PHASE) == 0 {
        return;
    }
    let secs = o.get(options::LOAD_SECONDS);
    if secs > 0 {
        TRIGGER_DEADLINE.store(crate::os::now_ns().saturating_add(secs.saturating_mul(1_000_000_000)), Ordering::Relaxed);
    }
    // SAFETY: a plain sigaction with an async-signal-safe handler (one atomic store).
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigusr2 as extern "C" fn(libc::c_int) as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGUSR2, &sa, core::ptr::null_mut());
    }
    c_begin();
    TRIGGER_ARMED.store(true, Ordering::Release);
}

/// Polled on allocation slow paths: ends the start-up phase once its trigger fired.
#[inline]
pub(crate) fn poll_trigger() {
    if !TRIGGER_ARMED.load(Ordering::Relaxed) {
        return;
    }
    poll_trigger_slow();
}

#[cold]
fn poll_trigger_slow() {
    let due = TRIGGER_FIRED.load(Ordering::Relaxed) || crate::os::now_ns() >= TRIGGER_DEADLINE.load(Ordering::Relaxed);
    if due && TRIGGER_ARMED.swap(false, Ordering::AcqRel) {
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
    m.str(" B, ").num(r.duration.as_micros() as u64).str(" us\n");
    crate::os::write_stderr(m.as_bytes());
}
