//! The raw lock, and every lock of the allocator in one place, in one order.
//!
//! [`RawLock`] is a three-state futex mutex (Drepper, "Futexes are tricky"): 0 unlocked, 1 locked,
//! 2 locked with waiters. It never allocates (unlike `parking_lot`, whose parking table is
//! heap-allocated and would re-enter the allocator) and spins briefly before sleeping.
//!
//! # The lock order
//! The allocator has exactly the locks below, and a thread that holds several took them in this order
//! (outermost first). Debug builds check it on every acquisition (a per-thread mask of held ranks) and
//! abort with the two names when it is broken. [`fork_prepare`] takes them all in this order before
//! `fork`, so no child inherits a held lock; [`fork_parent`] releases them and [`fork_child`] resets
//! them. `init` registers these three once, with `pthread_atfork`.
//!
//! | rank | lock | guards | taken by |
//! |---|---|---|---|
//! | 0 | [`PHASE_C`] | the C API's phase (`edgepool_load_begin/end`, the start-up trigger) | `phase` |
//! | 1 | [`PHASE_CONTROL`] | process-wide phase begin and end | `phase` |
//! | 2 | [`CACHE_KEY`] | creation of the thread-exit key | `cache::life` |
//! | 3 | [`CACHE_EXIT`] | the cache shared by exiting threads (allocations from late TLS destructors) | `cache::life` |
//! | 4 | [`CACHE_POOL`] | the pool of abandoned thread caches | `cache::life` |
//! | 5 | [`HEAP`] | the buddy heap, its purge state and budget | `heap` |
//! | 6 | [`DIRECT`] | the table of direct mappings | `direct` |
//!
//! A function that needs the heap's figures while it works on a direct mapping therefore takes
//! [`HEAP`] first (or drops [`DIRECT`] before it asks).
//!
//! Two exclusions that are not locks: a slab's `COLLECTING` and `PURGING` bits (`slab::Shared`).
//! The thread that scans for idle caches (`cache::remote`, one at a time) holds `PURGING` on one slab
//! at a time and takes no lock meanwhile; an owner that finds it set waits for it (spinning, then
//! yielding), holding whatever locks its caller holds, which the scan never needs. So neither can
//! deadlock against the locks above. [`fork_prepare`] first waits for a scan in flight and stops new
//! ones ([`scan_begin`]), so no child inherits a `PURGING` bit or a cache's taken queue.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::os;
use crate::stats::{self, COUNTERS};

/// A futex lock with a fixed place in the lock order.
pub struct RawLock {
    /// 0 = unlocked, 1 = locked without waiters, 2 = locked, maybe with waiters.
    state: AtomicU32,
    /// Place in the lock order (see the module documentation); ranks are distinct. Read by the
    /// debug-build order check and the tests.
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    rank: u32,
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    name: &'static str,
}

pub static PHASE_C: RawLock = RawLock::new(0, "phase C API");
pub static PHASE_CONTROL: RawLock = RawLock::new(1, "phase control");
pub static CACHE_KEY: RawLock = RawLock::new(2, "cache key");
pub static CACHE_EXIT: RawLock = RawLock::new(3, "exit cache");
pub static CACHE_POOL: RawLock = RawLock::new(4, "cache pool");
pub static HEAP: RawLock = RawLock::new(5, "heap");
pub static DIRECT: RawLock = RawLock::new(6, "direct table");

/// Every lock, in the order they are taken.
static ORDER: [&RawLock; 7] = [&PHASE_C, &PHASE_CONTROL, &CACHE_KEY, &CACHE_EXIT, &CACHE_POOL, &HEAP, &DIRECT];

#[cfg(debug_assertions)]
std::thread_local! {
    /// Debug builds: bit `r` is set while this thread holds the lock of rank `r`. A `const`
    /// initialiser and no destructor, so it never registers one (which would allocate).
    static HELD: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

impl RawLock {
    const fn new(rank: u32, name: &'static str) -> Self {
        RawLock { state: AtomicU32::new(0), rank, name }
    }

    /// Debug builds: aborts if the calling thread holds this lock or one that comes after it.
    #[inline]
    fn note_acquire(&self) {
        #[cfg(debug_assertions)]
        HELD.with(|h| {
            let held = h.get();
            if let Some(later) = out_of_order(held, self.rank) {
                let later = ORDER[later as usize];
                let mut m = os::MsgBuf::new();
                m.str("lock order broken: taking '").str(self.name).str("' while holding '").str(later.name);
                m.str("'");
                os::fatal(m.as_bytes());
            }
            h.set(held | 1 << self.rank);
        });
    }

    #[inline]
    fn note_release(&self) {
        #[cfg(debug_assertions)]
        HELD.with(|h| h.set(h.get() & !(1 << self.rank)));
    }

    #[inline]
    pub fn lock(&self) {
        self.note_acquire();
        if self.state.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_slow();
        }
    }

    /// The lock was taken: spin briefly, then sleep on the futex. Counts the contended acquisition
    /// and the time it waited (`lock_contended`, `lock_wait_ns`; only here, never on the fast path).
    #[cold]
    fn lock_slow(&self) {
        let t0 = os::now_ns();
        'wait: {
            for _ in 0..100 {
                if self.state.load(Ordering::Relaxed) == 0
                    && self.state.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
                {
                    break 'wait;
                }
                os::spin_hint();
            }
            while self.state.swap(2, Ordering::Acquire) != 0 {
                os::futex_wait(&self.state, 2);
            }
        }
        stats::add(&COUNTERS.lock_contended, 1);
        stats::add(&COUNTERS.lock_wait_ns, os::now_ns().saturating_sub(t0) as usize);
    }

    #[inline]
    pub fn unlock(&self) {
        self.note_release();
        if self.state.swap(0, Ordering::Release) == 2 {
            os::futex_wake(&self.state);
        }
    }

    /// Forces the lock to the unlocked state. Only for a `fork` child, where the thread that held it
    /// no longer exists (or is the forking thread, which took it in [`fork_prepare`]).
    fn reset(&self) {
        self.note_release();
        self.state.store(0, Ordering::Relaxed);
    }
}

/// With the ranks in the mask `held` held, taking a lock of rank `rank` breaks the order if a lock of
/// that rank or a later one is held: returns the rank of the latest such lock.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
fn out_of_order(held: u32, rank: u32) -> Option<u32> {
    let later = held >> rank << rank;
    (later != 0).then(|| 31 - later.leading_zeros())
}

/// The scan for idle caches (`cache::remote::maybe_scan`): bit 0 while one runs (at most one at a
/// time), [`SCAN_FORKING`] while a `fork` is prepared. Not a lock: a thread that finds it taken skips
/// its scan.
static SCAN: AtomicU32 = AtomicU32::new(0);
/// [`SCAN`] bit: a `fork` is being prepared; no scan starts.
const SCAN_FORKING: u32 = 1 << 31;

/// Starts the scan for idle caches if no other runs and no `fork` is being prepared. `true`: the
/// caller runs it and calls [`scan_end`] when done.
pub fn scan_begin() -> bool {
    SCAN.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).is_ok()
}

/// Ends the scan that [`scan_begin`] started.
pub fn scan_end() {
    SCAN.fetch_and(!1, Ordering::Release);
}

/// The `pthread_atfork` prepare handler: waits for the scan for idle caches in flight and stops new
/// ones (a scan holds a slab's `PURGING` bit and a cache's remote queue, which no thread would give
/// back in the child; its thread holds no lock, so it ends), then takes every lock, in the order.
pub extern "C" fn fork_prepare() {
    SCAN.fetch_or(SCAN_FORKING, Ordering::Acquire);
    while SCAN.load(Ordering::Acquire) & !SCAN_FORKING != 0 {
        os::yield_now();
    }
    for l in ORDER {
        l.lock();
    }
}

/// The parent's handler: releases every lock, in reverse order, and lets scans start again.
pub extern "C" fn fork_parent() {
    for l in ORDER.iter().rev() {
        l.unlock();
    }
    SCAN.fetch_and(!SCAN_FORKING, Ordering::Release);
}

/// The child's handler: only the forking thread exists, and it holds every lock; reset them all.
///
/// The other threads' caches may have been in the middle of a lock-free fast path at the fork, so they
/// are left as they are (their memory stays reserved; frees into their slabs queue up harmlessly)
/// rather than adopted in a possibly torn state.
pub extern "C" fn fork_child() {
    for l in ORDER.iter().rev() {
        l.reset();
    }
    SCAN.store(0, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taking_an_earlier_lock_while_holding_a_later_one_is_out_of_order() {
        // Holding the heap (4), taking the direct table (5): in order.
        assert_eq!(out_of_order(1 << HEAP.rank, DIRECT.rank), None);
        // Holding the direct table, taking the heap: the inversion of issue 9.
        assert_eq!(out_of_order(1 << DIRECT.rank, HEAP.rank), Some(DIRECT.rank));
        // Taking a lock already held.
        assert_eq!(out_of_order(1 << HEAP.rank, HEAP.rank), Some(HEAP.rank));
        assert_eq!(
            out_of_order((1 << PHASE_C.rank) | (1 << CACHE_POOL.rank), PHASE_CONTROL.rank),
            Some(CACHE_POOL.rank)
        );
        assert_eq!(out_of_order(0, PHASE_C.rank), None);
    }

    #[test]
    fn a_contended_acquisition_is_counted_with_its_wait() {
        static L: RawLock = RawLock::new(31, "test");
        let before = COUNTERS.snapshot();
        L.lock();
        let t = std::thread::spawn(|| {
            L.lock();
            L.unlock();
        });
        std::thread::sleep(std::time::Duration::from_millis(30));
        L.unlock();
        t.join().unwrap();
        let after = COUNTERS.snapshot();
        assert!(after.lock_contended > before.lock_contended);
        assert!(after.lock_wait_ns - before.lock_wait_ns >= 20_000_000, "{before:?} {after:?}");
    }

    #[test]
    fn order_lists_the_locks_by_rank() {
        for (i, l) in ORDER.iter().enumerate() {
            assert_eq!(l.rank, i as u32, "{}", l.name);
        }
    }

    #[test]
    fn locks_taken_in_order_and_released_in_any_order() {
        CACHE_POOL.lock();
        DIRECT.lock();
        CACHE_POOL.unlock();
        DIRECT.unlock();
        fork_prepare();
        fork_parent();
        #[cfg(debug_assertions)]
        assert_eq!(HELD.with(|h| h.get()), 0);
    }
}
