//! The per-thread cache of medium runs: large blocks of 1 to [`RUN_PAGES`] pages (up to 64 KiB; since
//! the medium slab classes, 16–64 KiB, or smaller ones asked with an alignment above 4 KiB) that the
//! thread freed recently, kept to serve its next requests of the same page count without the heap's
//! lock.
//!
//! Why: requests just above the slab classes otherwise take the one heap lock twice per block, and a
//! free run that goes back to the heap dirty is purged and faulted in again when the heap's dirty
//! bytes run over the threshold. On the suite's producer/consumer ring (`benches/suite/rptest.c`:
//! three quarters 4–16 KiB, half freed by another thread, before those sizes became slab classes)
//! that was 530k purges and 11 s of system time for 1.2 M blocks.
//!
//! Bounds: [`SLOTS`] runs per page count and [`RUN_BYTES`] in all per thread; a free that finds its
//! bin full, or the bytes at their bound, goes to the heap. A cached run stays *allocated* in the
//! heap's view (its pages count in `os_bytes`, resident), marked [`heap::RUN_CACHED`] in its head's
//! page entry so that freeing it again is caught as a double free. The statistics count a cached run
//! in `run_cache_bytes`.
//!
//! Never while a load phase is open anywhere (loads keep their own policy: nothing waits resident
//! beyond the live bytes), nor under a memory budget (a cached run would count against it), nor in
//! the hardened mode (`EDGEPOOL_SECURE`: a freed run must be purged and sealed). Emptied:
//! at thread exit (abandonment), and by `trim()`, a phase's end and `set_limit`, which flush the
//! calling thread's cache at once and every other thread's at its next use of it (an epoch).

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{bump, Cache};
use crate::heap;
use crate::os::PAGE;
use crate::phase_state;

/// Largest run, in pages, that a thread caches.
pub const RUN_PAGES: usize = 16;
/// Runs cached per page count.
pub const SLOTS: usize = 32;
/// Bytes a thread's run cache holds at most.
pub const RUN_BYTES: usize = 1 << 20;

/// Bumped to make every thread flush its run cache at its next use of it.
static EPOCH: AtomicUsize = AtomicUsize::new(0);

/// A thread's run cache (a field of its [`Cache`], touched only by the owner).
///
/// Invariants: `slot[k][..n[k]]` are distinct live runs of exactly `k + 1` pages, not handed out,
/// each with its head marked [`heap::RUN_CACHED`]; `bytes` is the sum of their sizes, at most
/// [`RUN_BYTES`]; `epoch` is the [`EPOCH`] value at the last flush (or creation); `hits` counts the
/// runs handed out and `puts` the runs kept. `bytes`, `hits` and `puts` are atomics that only the
/// owner writes (a load and a store), so that the statistics sum them over the caches ([`cached`])
/// where process-wide counters took a locked add per run (`large_allocs` and `large_frees` count
/// a hit and a put through them).
///
/// Layout: `slot` last (`repr(C)`), so that [`Runs::init_at`] writes only the front; left to Rust,
/// the counters went after the table, onto the cache's last page, which every thread then made
/// resident.
#[repr(C)]
pub struct Runs {
    bytes: AtomicUsize,
    hits: AtomicU64,
    puts: AtomicU64,
    epoch: usize,
    n: [u8; RUN_PAGES],
    slot: [[*mut u8; SLOTS]; RUN_PAGES],
}

impl Runs {
    pub const fn new() -> Runs {
        Runs {
            bytes: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            puts: AtomicU64::new(0),
            epoch: 0,
            n: [0; RUN_PAGES],
            slot: [[core::ptr::null_mut(); SLOTS]; RUN_PAGES],
        }
    }

    /// Makes the cache at `r` empty without writing `slot` (only `slot[k][..n[k]]` is ever read).
    ///
    /// # Safety
    /// - `r` is writable and nothing else uses it.
    pub unsafe fn init_at(r: *mut Runs) {
        // SAFETY: field projections of memory we may write (contract).
        unsafe {
            (&raw mut (*r).bytes).write(AtomicUsize::new(0));
            (&raw mut (*r).hits).write(AtomicU64::new(0));
            (&raw mut (*r).puts).write(AtomicU64::new(0));
            (&raw mut (*r).epoch).write(0);
            (&raw mut (*r).n).write([0; RUN_PAGES]);
        }
    }
}

/// Whether run caching is on now: no load phase open, no budget, not the hardened mode.
#[inline]
fn enabled() -> bool {
    !phase_state::any_active() && !heap::budgeted() && !heap::secure()
}

/// The calling thread's run cache, flushed first if the epoch moved; null if caching is off, or if
/// the thread has no cache and `create` is false. With `create` (a free, which may keep the run), a
/// thread that has made no small allocation gets its cache here: without one it could keep no run,
/// and a thread that allocates only medium blocks took every one from the heap under its lock (a C
/// loop of 32-64 KiB malloc/free pairs: 165-234 ns a pair, against 12 with a cache).
fn my_runs(create: bool) -> *mut Runs {
    if !enabled() || super::life::exiting() {
        return core::ptr::null_mut();
    }
    let c = if create { super::current() } else { super::mine() };
    if c.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: our own live cache (owner); `runs` is only touched by its owner.
    unsafe {
        let r = &raw mut (*c).runs;
        let now = EPOCH.load(Ordering::Acquire);
        if (*r).epoch != now {
            flush_runs(r);
            (*r).epoch = now;
        }
        r
    }
}

/// A cached run of exactly `pages` pages from the calling thread's cache, or null.
pub fn take(pages: usize) -> *mut u8 {
    if pages == 0 || pages > RUN_PAGES {
        return core::ptr::null_mut();
    }
    let r = my_runs(false);
    if r.is_null() {
        return r.cast();
    }
    // SAFETY: our own run cache (owner); `pages - 1 < RUN_PAGES`; a popped entry is a cached run
    // (invariant), whose head entry we own.
    unsafe {
        let k = pages - 1;
        let n = (*r).n[k] as usize;
        if n == 0 {
            return core::ptr::null_mut();
        }
        let p = (*r).slot[k][n - 1];
        (*r).n[k] -= 1;
        set_bytes(r, bytes(r) - pages * PAGE);
        heap::set_run_state(p, heap::RUN_LIVE);
        bump(&(*r).hits);
        p
    }
}

/// Keeps the freed run `p` of `pages` pages in the calling thread's cache. Returns false (and keeps
/// nothing) when caching is off or the bin or the byte bound is full: then the caller frees it to the
/// heap.
///
/// # Safety
/// - `p` is the head of a live large block of `pages` pages, allocated outside a load phase, that the
///   caller gives up.
pub unsafe fn put(p: *mut u8, pages: usize) -> bool {
    if pages == 0 || pages > RUN_PAGES {
        return false;
    }
    let r = my_runs(true);
    if r.is_null() {
        return false;
    }
    // SAFETY: our own run cache (owner); `pages - 1 < RUN_PAGES`; `p` is ours to keep (contract).
    unsafe {
        let k = pages - 1;
        let n = (*r).n[k] as usize;
        if n == SLOTS || bytes(r) + pages * PAGE > RUN_BYTES {
            return false;
        }
        heap::set_run_state(p, heap::RUN_CACHED);
        (*r).slot[k][n] = p;
        (*r).n[k] += 1;
        set_bytes(r, bytes(r) + pages * PAGE);
        bump(&(*r).puts);
    }
    true
}

/// Frees every run of `r` to the heap.
///
/// # Safety
/// - owner: `r` is the run cache of a cache the calling thread owns.
unsafe fn flush_runs(r: *mut Runs) {
    // SAFETY: owner; every listed entry is a cached run (invariant), handed back once and unlisted.
    unsafe {
        if bytes(r) == 0 {
            return;
        }
        set_bytes(r, 0);
        for k in 0..RUN_PAGES {
            for i in 0..(*r).n[k] as usize {
                let p = (*r).slot[k][i];
                heap::set_run_state(p, heap::RUN_LIVE);
                heap::free_block(p);
            }
            (*r).n[k] = 0;
        }
    }
}

/// Frees every run of `cache` to the heap (its thread is leaving it).
///
/// # Safety
/// - owner: the calling thread owns `cache`.
pub unsafe fn flush(cache: *mut Cache) {
    // SAFETY: forwarded contract.
    unsafe { flush_runs(&raw mut (*cache).runs) }
}

/// Makes every thread's run cache empty: the calling thread's at once, the others' at their next use
/// of it. For `trim()`, a phase's end and a new budget.
pub fn flush_all() {
    EPOCH.fetch_add(1, Ordering::AcqRel);
    let c = super::mine();
    if !c.is_null() && !super::life::exiting() {
        // SAFETY: our own live cache.
        unsafe { flush(c) };
    }
}

/// Bytes in the calling thread's run cache (tests).
pub fn mine_bytes() -> usize {
    let c = super::mine();
    if c.is_null() {
        return 0;
    }
    // SAFETY: our own live cache; read by its owner.
    unsafe { bytes(&raw mut (*c).runs) }
}

/// The bytes held in `r` (its `bytes`).
///
/// # Safety
/// - `r` is the run cache of a live cache (any thread may read).
unsafe fn bytes(r: *mut Runs) -> usize {
    // SAFETY: a live cache's field (contract), an atomic.
    unsafe { (*r).bytes.load(Ordering::Relaxed) }
}

/// Sets `r`'s `bytes`.
///
/// # Safety
/// - owner: `r` is the run cache of a cache the calling thread owns.
unsafe fn set_bytes(r: *mut Runs, v: usize) {
    // SAFETY: owner (contract): the only writer.
    unsafe { (*r).bytes.store(v, Ordering::Relaxed) }
}

/// The bytes, hits and puts of `cache`'s run cache, for the statistics (any thread).
///
/// # Safety
/// - `cache` is a live cache.
pub(super) unsafe fn cached(cache: *mut Cache) -> (usize, u64, u64) {
    // SAFETY: a live cache (contract); only atomics are read.
    unsafe {
        let r = &raw mut (*cache).runs;
        (bytes(r), (*r).hits.load(Ordering::Relaxed), (*r).puts.load(Ordering::Relaxed))
    }
}
