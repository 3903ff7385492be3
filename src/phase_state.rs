//! The load-phase flags that lower layers read: whether a phase is open (the heap keeps less memory
//! waiting while one is), which row set a new thread cache starts in, the C API's open phase and the
//! start-up trigger. Only atomics: the phase logic itself lives in `phase`, above the caches.

use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use crate::size_class::NCLASSES;

/// Which of a thread cache's three row sets serves its small allocations, as the offset of the set's
/// first row (see `cache::Cache::row_base`).
#[repr(usize)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowSet {
    /// Run phase: the rows every thread uses outside load phases.
    Run = 0,
    /// Load phase, segregated slabs of their own.
    Load = NCLASSES,
    /// Load phase in arena mode: rows that stay empty, so that every allocation reaches the slow path,
    /// which bumps it out of the thread's arena chunk.
    Arena = 2 * NCLASSES,
}

/// Number of row sets.
pub const NSETS: usize = 3;

/// Depth of process-wide phases (0: none open).
static PROCESS_DEPTH: AtomicUsize = AtomicUsize::new(0);
/// Row set of the open process-wide phase.
static PROCESS_ROWS: AtomicUsize = AtomicUsize::new(RowSet::Load as usize);
/// Thread load phases open anywhere in the process (outermost guards only).
static THREAD_PHASES: AtomicUsize = AtomicUsize::new(0);

/// Whether any load phase (process-wide or of some thread) is open.
#[inline]
pub fn any_active() -> bool {
    PROCESS_DEPTH.load(Ordering::Relaxed) > 0 || THREAD_PHASES.load(Ordering::Relaxed) > 0
}

/// Whether a process-wide load phase is open.
#[inline]
pub fn process_active() -> bool {
    PROCESS_DEPTH.load(Ordering::Relaxed) > 0
}

/// The row base a cache starts in, or returns to when its thread's own phase ends: the process-wide
/// phase's row set, or the run rows.
pub fn process_row_base() -> usize {
    if process_active() {
        PROCESS_ROWS.load(Ordering::Relaxed)
    } else {
        RowSet::Run as usize
    }
}

/// Opens (nests) a process-wide phase. Returns `true` for the outermost, which sets the row set.
/// Serialised by `sync::PHASE_CONTROL` (or called before any thread cache exists).
pub fn process_enter(rows: RowSet) -> bool {
    let first = PROCESS_DEPTH.fetch_add(1, Ordering::Relaxed) == 0;
    if first {
        PROCESS_ROWS.store(rows as usize, Ordering::Relaxed);
    }
    first
}

/// Depth of process-wide phases.
pub fn process_depth() -> usize {
    PROCESS_DEPTH.load(Ordering::Relaxed)
}

/// Closes one level of the process-wide phase (serialised by `sync::PHASE_CONTROL`).
pub fn process_leave() {
    PROCESS_DEPTH.fetch_sub(1, Ordering::Relaxed);
}

/// A thread's outermost load-phase guard opened (`true`) or closed (`false`).
pub fn thread_phase(open: bool) {
    if open {
        THREAD_PHASES.fetch_add(1, Ordering::Relaxed);
    } else {
        THREAD_PHASES.fetch_sub(1, Ordering::Relaxed);
    }
}

// ---------------------------------------------------------------------------------------------------
// The C API's phase: how many `edgepool_load_begin` calls are open, and the figures taken when the
// outermost began (serialised by `sync::PHASE_C`).

/// Figures taken when a phase begins, for its report.
#[derive(Clone, Copy, Debug, Default)]
pub struct Start {
    pub t_ns: u64,
    pub os_bytes: usize,
    pub large_allocs: u64,
    pub arena_allocs: u64,
    /// The process's page faults so far.
    pub faults: u64,
    /// The allocator's calls into the OS's memory map so far ([`crate::os::os_calls`]).
    pub os_calls: u64,
}

static C_OPEN: AtomicUsize = AtomicUsize::new(0);
static C_START: [AtomicU64; 6] = [const { AtomicU64::new(0) }; 6];

/// Counts one more open C phase; the outermost records `start`.
pub fn c_open(start: Start) {
    if C_OPEN.fetch_add(1, Ordering::Relaxed) == 0 {
        C_START[0].store(start.t_ns, Ordering::Relaxed);
        C_START[1].store(start.os_bytes as u64, Ordering::Relaxed);
        C_START[2].store(start.large_allocs, Ordering::Relaxed);
        C_START[3].store(start.arena_allocs, Ordering::Relaxed);
        C_START[4].store(start.faults, Ordering::Relaxed);
        C_START[5].store(start.os_calls, Ordering::Relaxed);
    }
}

/// Closes the innermost open C phase and returns the start figures, or `None` if none is open.
pub fn c_close() -> Option<Start> {
    if C_OPEN.load(Ordering::Relaxed) == 0 {
        return None;
    }
    C_OPEN.fetch_sub(1, Ordering::Relaxed);
    Some(Start {
        t_ns: C_START[0].load(Ordering::Relaxed),
        os_bytes: C_START[1].load(Ordering::Relaxed) as usize,
        large_allocs: C_START[2].load(Ordering::Relaxed),
        arena_allocs: C_START[3].load(Ordering::Relaxed),
        faults: C_START[4].load(Ordering::Relaxed),
        os_calls: C_START[5].load(Ordering::Relaxed),
    })
}

// ---------------------------------------------------------------------------------------------------
// The start-up trigger (`EDGEPOOL_LOAD_PHASE=1`): the phase it opened ends on `SIGUSR2` or at a
// deadline, noticed by the allocation slow path.

static TRIGGER_ARMED: AtomicBool = AtomicBool::new(false);
static TRIGGER_FIRED: AtomicBool = AtomicBool::new(false);
static TRIGGER_DEADLINE: AtomicU64 = AtomicU64::new(u64::MAX);

extern "C" fn on_sigusr2(_: libc::c_int) {
    TRIGGER_FIRED.store(true, Ordering::Relaxed);
}

/// Arms the trigger: `SIGUSR2` fires it, and so does the clock after `deadline_ns` (`u64::MAX`: never).
pub fn arm_trigger(deadline_ns: u64) {
    TRIGGER_DEADLINE.store(deadline_ns, Ordering::Relaxed);
    crate::os::on_signal(libc::SIGUSR2, on_sigusr2);
    TRIGGER_ARMED.store(true, Ordering::Release);
}

/// Whether the trigger is armed (one relaxed load: for slow paths).
#[inline]
pub fn trigger_armed() -> bool {
    TRIGGER_ARMED.load(Ordering::Relaxed)
}

/// Disarms the trigger if it has fired; returns `true` to exactly one caller, which ends the phase.
pub fn take_fired_trigger() -> bool {
    let due = TRIGGER_FIRED.load(Ordering::Relaxed) || crate::os::now_ns() >= TRIGGER_DEADLINE.load(Ordering::Relaxed);
    due && TRIGGER_ARMED.swap(false, Ordering::AcqRel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_phases_nest_and_keep_the_outermost_start() {
        assert!(c_close().is_none());
        c_open(Start { t_ns: 5, os_bytes: 7, ..Start::default() });
        c_open(Start { t_ns: 9, os_bytes: 1, ..Start::default() });
        assert_eq!(c_close().map(|s| (s.t_ns, s.os_bytes)), Some((5, 7)));
        assert_eq!(c_close().map(|s| (s.t_ns, s.os_bytes)), Some((5, 7)));
        assert!(c_close().is_none());
    }

    #[test]
    fn row_sets_are_row_offsets() {
        assert_eq!(RowSet::Run as usize, 0);
        assert_eq!(RowSet::Load as usize, NCLASSES);
        assert_eq!(RowSet::Arena as usize, (NSETS - 1) * NCLASSES);
    }
}
