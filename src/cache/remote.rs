//! Frees from other threads. A thread that frees a slot of a slab it does not own sets the slot's bit
//! in the slab's remote bitmap (one atomic OR; a bit already set is a double free); the first since
//! the owner last collected also sets `QUEUED` and pushes the slab onto its owner's remote queue, so
//! the owner finds it in its slow path even if it never touches that slab again (memory freed by a
//! consumer thread comes back). Only the owner takes the remote bits into its bitmap, a word at a
//! time, without reading the slots.
//!
//! An owner that does not run keeps what other threads freed of its slabs resident: a thread that
//! built a structure and went to sleep while workers free it (a loader waiting on the threads it
//! handed a model to; `larson`'s lane threads, each blocked in `pthread_join` while its workers free
//! the blocks it made), or an exited thread's cache, waiting in the pool for a new thread. So now and
//! then ([`maybe_scan`], from the slow path of any thread, at most every [`IDLE_NS`]` / 2`) a thread
//! looks for caches that have not entered their slow path for a while (5 ms at first, see
//! [`IDLE_NS`]) and hold queued remote frees, takes their queue, purges the pages of its slabs on
//! which every slot is such a free ([`purge_freed_pages`]), and puts the queue back. Those slots hold
//! no data (the owner cannot hand them out before it takes them back, which waits while `PURGING` is
//! set), and the pages fault back in, zeroed, when it does. The slabs stay the owner's, on its lists;
//! only their pages go. An owner that runs takes its remote frees back at its next slow path, and is
//! left alone: a producer whose consumers free its blocks, even one that waits a moment for them,
//! reuses the pages (and one that comes back soon after a purge is given twice as long before the
//! next). What an owner took back before it went idle is free in its own bitmaps, which no other
//! thread reads: that stays resident until it runs again.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::{cache_of, life, refile, release_bits, row_of, settle, Cache};
use crate::os;
use crate::size_class::NCLASSES;
use crate::slab::{self, Slab, COLLECTING, PURGING, QUEUED, SUMMARY};
use crate::stats::{self, COUNTERS};
use crate::sync;

/// Frees slot `p` of `slab`, which another thread's cache owns. `extern "C"`: it cannot unwind, so
/// that the free path calls it as its last act (see [`super::free_small`]).
///
/// # Safety
/// - `slab` is a live slab and `p` a live slot of it that the caller gives up.
#[cold]
#[inline(never)]
pub(super) unsafe extern "C" fn free(p: *mut u8, slab: *mut Slab) {
    // SAFETY: the slab is live and `p` is ours to give up (contract); it is validated before its
    // bit is set. The owner cache is never freed, and its `remote` queue is atomic.
    unsafe {
        let idx = Slab::index_of(slab, p);
        // The freed mark, so that an owner's later free of the same slot looks in the remote bitmap.
        // A slot that carries it already was freed before (by its owner or another thread): this
        // thread cannot look into the owner's structures to confirm, but a live block holds the mark
        // only if the program read it out of freed memory (or by a 2^-64 coincidence), so it aborts.
        let mark = p.add(slab::MARK_OFFSET).cast::<u64>();
        if *mark == slab::freed_mark() {
            os::invalid_pointer(p, "free(): double free detected (the block was already freed)");
        }
        *mark = slab::freed_mark();
        let class = (*slab).class as usize;
        let Some(queue) = Slab::push_remote(slab, idx) else {
            os::invalid_pointer(p, "free(): double free detected (the block was already freed)");
        };
        if queue {
            push_queue(cache_of((*slab).owner), slab, slab);
        }
        // The slab is not touched after this: once queued, its owner may give it back.
        count_remote_free(class, queue);
    }
}

/// Slots freed by threads without a cache of their own (exiting threads), per class.
pub(super) static ORPHAN_FREES: [AtomicU64; NCLASSES] = [const { AtomicU64::new(0) }; NCLASSES];

/// Pushes the chain of slabs `first..=last` (linked by `shared.remote_next`) onto `cache`'s remote
/// queue.
///
/// # Safety
/// - `cache` is a live cache; the slabs are its own, alive, with `QUEUED` set, and on no queue.
unsafe fn push_queue(cache: *mut Cache, first: *mut Slab, last: *mut Slab) {
    // SAFETY: caches are never freed and their queue head is atomic; the slabs are alive (contract).
    unsafe {
        let q = &(*cache).remote;
        let mut head = q.load(Ordering::Relaxed);
        loop {
            (*last).shared.remote_next.store(head, Ordering::Relaxed);
            match q.compare_exchange_weak(head, first, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
    }
}

/// Counts a free of a `class` slot by a thread that does not own its slab, and the slab's queueing
/// for its owner if `queued`: in the calling thread's cache (no shared write). A thread that frees
/// before it ever allocated (a consumer) gets its cache here, so that its frees do not all write one
/// shared counter (xmalloc's consumers were 8 % slower with it); only a thread whose cache is gone
/// (exiting) or that cannot get one counts in [`ORPHAN_FREES`] (and `COUNTERS.remote_frees`).
fn count_remote_free(class: usize, queued: bool) {
    let mut me = life::tls_cache();
    if me == super::empty_cache() && !life::exiting() {
        me = life::acquire();
        if me.is_null() {
            me = super::empty_cache();
        }
    }
    if me == super::empty_cache() {
        ORPHAN_FREES[class].fetch_add(1, Ordering::Relaxed);
        if queued {
            stats::add(&COUNTERS.remote_frees, 1);
        }
    } else {
        // SAFETY: our own live cache; `remote_freed` and `counts` are written by their owner only;
        // class < NCLASSES (a slab's class).
        unsafe {
            super::bump(&(*me).remote_freed[class]);
            if queued {
                super::bump(&(*me).counts.queued);
            }
        }
    }
}

/// Applies every queued remote free of `cache`.
///
/// # Safety
/// - owner: `cache` is owned by the calling thread.
pub(super) unsafe fn drain(cache: *mut Cache) {
    // SAFETY: owner; each popped slab is a live slab of this cache with QUEUED set, which keeps it
    // alive until it is cleared here.
    unsafe {
        let mut s = (*cache).remote.swap(core::ptr::null_mut(), Ordering::Acquire);
        while !s.is_null() {
            let next = (*s).shared.remote_next.load(Ordering::Relaxed);
            let summary = begin_taking(&(*s).shared.remote, 0) & SUMMARY;
            apply(cache, s, summary);
            (*s).shared.remote.fetch_and(!COLLECTING, Ordering::Release);
            refile(s);
            s = next;
        }
    }
}

/// Starts taking a slab's remote words back (owner only): waits while another thread purges the
/// slab's pages, then sets `COLLECTING` and clears the summary bits and `QUEUED` unless `keep` says to
/// keep it. Returns the `remote` word it replaced. The caller clears `COLLECTING` once its swaps of the
/// remote words are done.
fn begin_taking(remote: &AtomicUsize, keep: usize) -> usize {
    let mut s = remote.load(Ordering::Relaxed);
    let mut spins = 0u32;
    loop {
        if s & PURGING != 0 {
            // One `madvise` of at most 64 KiB: short, and the purging thread holds no lock.
            spins += 1;
            if spins < 64 {
                os::spin_hint();
            } else {
                os::yield_now();
            }
            s = remote.load(Ordering::Relaxed);
            continue;
        }
        match remote.compare_exchange_weak(s, (s & keep) | COLLECTING, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => return s,
            Err(now) => s = now,
        }
    }
}

/// Takes the remote words that `summary` names (summary bits, `QUEUED` clear) back into `slab`'s
/// bitmap. Returns the number of slots taken.
///
/// # Safety
/// - owner: `cache` is owned by the calling thread and owns `slab`; `summary` was taken from the
///   slab's `remote` with acquire ordering.
unsafe fn apply(cache: *mut Cache, slab: *mut Slab, mut summary: usize) -> u32 {
    let mut n = 0;
    // SAFETY: owner; every summary bit names a word below `nwords`; the remote words are atomic.
    unsafe {
        let row = row_of(cache, slab);
        let remote = Slab::remote_bits(slab);
        while summary != 0 {
            // Summary bit `w + 1` names word `w` (`slab::summary_bit`).
            let w = (summary.trailing_zeros() - 1) as usize;
            summary &= summary - 1;
            // Acquire: the freeing threads' writes to the slots happen before they are handed out.
            let bits = (*remote.add(w)).swap(0, Ordering::Acquire);
            if bits != 0 {
                release_bits(row, slab, w as u32, bits);
                n += bits.count_ones();
            }
        }
    }
    n
}

/// Takes `slab`'s remote bits back while keeping `QUEUED` (owner only, outside the queue). Returns
/// the slots taken.
///
/// # Safety
/// - owner: `cache` is owned by the calling thread and owns `slab`.
pub(super) unsafe fn collect(cache: *mut Cache, slab: *mut Slab) -> u32 {
    // SAFETY: the header is live; `remote` is atomic.
    let remote = unsafe { &(*slab).shared.remote };
    if remote.load(Ordering::Relaxed) & SUMMARY == 0 {
        return 0;
    }
    let old = begin_taking(remote, QUEUED);
    // SAFETY: owner; the summary was taken with acquire ordering.
    let n = unsafe { apply(cache, slab, old & SUMMARY) };
    remote.fetch_and(!COLLECTING, Ordering::Release);
    n
}

/// How long a cache's owner must have stayed out of its slow path before other threads purge the pages
/// its queued remote frees hold (see the module documentation), at first: 5 ms. An owner that comes
/// back to its slow path within four such waits after a purge (a producer that only waited for its
/// consumers) waits twice as long before the next, up to [`IDLE_MAX_NS`].
pub const IDLE_NS: u64 = 5_000_000;
/// The longest wait of [`IDLE_NS`]'s doubling.
pub const IDLE_MAX_NS: u64 = 1_000_000_000;

/// The scan's state of one cache (a field of `Cache`): written and read only by the scan
/// ([`maybe_scan`], one at a time). Atomics only because the cache is shared.
pub struct Idle {
    /// The owner's `counts.refills` when the scan last saw it change, and when that was
    /// ([`os::now_ns`]; 0: not seen yet).
    seen: AtomicU64,
    since: AtomicU64,
    /// How long the owner must stay out of its slow path before a purge (0: [`IDLE_NS`]).
    wait: AtomicU64,
    /// When the scan last purged pages of this cache's slabs (0: not since the owner last ran).
    purged_at: AtomicU64,
}

impl Idle {
    pub const fn new() -> Idle {
        Idle {
            seen: AtomicU64::new(0),
            since: AtomicU64::new(0),
            wait: AtomicU64::new(0),
            purged_at: AtomicU64::new(0),
        }
    }
}

/// When the last scan started ([`os::now_ns`]).
static LAST_SCAN: AtomicU64 = AtomicU64::new(0);

/// Called from the slow path of `me`'s owner now and then: at most every [`IDLE_NS`]` / 2`, and by one
/// thread at a time, purges the pages that idle caches' queued remote frees hold (see the module
/// documentation).
///
/// # Safety
/// - owner: `me` is owned by the calling thread (it is left out: its owner is running).
#[cold]
pub(super) unsafe fn maybe_scan(me: *mut Cache) {
    let now = os::now_ns();
    if now.wrapping_sub(LAST_SCAN.load(Ordering::Relaxed)) < IDLE_NS / 2 {
        return;
    }
    if !sync::scan_begin() {
        return;
    }
    LAST_SCAN.store(now, Ordering::Relaxed);
    life::for_each_cache(|c| {
        if c != me {
            // SAFETY: a live cache (caches are never freed); only its atomics are touched.
            unsafe { scan_cache(c, now) };
        }
    });
    sync::scan_end();
}

/// One cache of [`maybe_scan`]: notes whether its owner entered its slow path since the last scan,
/// and if it has not for [`IDLE_NS`], purges what its queued slabs' remote frees hold.
///
/// # Safety
/// - `c` is a live cache owned by another thread (or by none); the caller runs the one scan.
unsafe fn scan_cache(c: *mut Cache, now: u64) {
    // SAFETY: `refills`, `remote` and the `idle` fields are atomics; `idle` is written only by the
    // scan, which is one at a time.
    unsafe {
        let idle = &(*c).idle;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let wait = match get(&idle.wait) {
            0 => IDLE_NS,
            w => w,
        };
        let refills = (*c).counts.refills.load(Ordering::Relaxed);
        if refills != get(&idle.seen) || get(&idle.since) == 0 {
            let purged_at = get(&idle.purged_at);
            if purged_at != 0 && now.wrapping_sub(purged_at) < 4 * wait {
                // Back soon after a purge: it was waiting, not idle.
                idle.wait.store((2 * wait).min(IDLE_MAX_NS), Ordering::Relaxed);
            }
            idle.purged_at.store(0, Ordering::Relaxed);
            idle.seen.store(refills, Ordering::Relaxed);
            idle.since.store(now, Ordering::Relaxed);
            return;
        }
        if now.wrapping_sub(get(&idle.since)) < wait || (*c).remote.load(Ordering::Relaxed).is_null() {
            return;
        }
        // Take the whole queue: its slabs have `QUEUED` set, which keeps them alive (the owner gives a
        // slab back only once it has drained it from the queue), and off the queue the owner cannot
        // drain them. The owner's own `collect` of a current slab waits while `PURGING` is set.
        let head = (*c).remote.swap(core::ptr::null_mut(), Ordering::Acquire);
        if head.is_null() {
            return;
        }
        let (mut s, mut tail) = (head, head);
        while !s.is_null() {
            let shared = &(*s).shared;
            let r = shared.remote.load(Ordering::Relaxed);
            if r & (PURGING | COLLECTING) == 0
                && shared.remote.compare_exchange(r, r | PURGING, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                if purge_freed_pages(s) > 0 {
                    idle.purged_at.store(now, Ordering::Relaxed);
                }
                shared.remote.fetch_and(!PURGING, Ordering::Release);
            }
            tail = s;
            s = shared.remote_next.load(Ordering::Relaxed);
        }
        // Back onto the queue, in front of what other threads queued meanwhile.
        push_queue(c, head, tail);
    }
}

/// Purges the resident pages of `slab` on which every slot is set in the remote bitmap (freed by
/// another thread, not taken back). Returns the bytes purged.
///
/// # Safety
/// - `slab` is a live slab on which the caller holds `PURGING` (and keeps it alive: `QUEUED`, off the
///   queue): remote bits are only added meanwhile, never taken back, so a slot seen set stays a freed
///   slot that nobody hands out.
unsafe fn purge_freed_pages(slab: *mut Slab) -> usize {
    // SAFETY: fixed fields of a live slab; remote words below `nwords` (slot indices below `nslots`);
    // the caller holds `PURGING`, so slots set in the remote bitmap stay dead (contract).
    unsafe {
        let words = Slab::remote_bits(slab);
        // Cheap first: a slab with no word that could cover a page of freed slots is left alone before
        // `mincore`.
        let per_page = (os::PAGE / (*slab).size as usize).clamp(1, 64) as u32;
        if !(0..(*slab).nwords as usize).any(|w| (*words.add(w)).load(Ordering::Relaxed).count_ones() >= per_page) {
            return 0;
        }
        settle::purge_pages_where(slab, |i| (*words.add(i >> 6)).load(Ordering::Acquire) & (1u64 << (i & 63)) != 0)
    }
}

/// Whether slot `idx` of `slab` was freed by another thread and not taken back yet.
///
/// # Safety
/// - `slab` is live and `idx < nslots`.
pub(super) unsafe fn is_remote_freed(slab: *mut Slab, idx: usize) -> bool {
    // SAFETY: w < nwords; atomic words.
    unsafe { (*Slab::remote_bits(slab).add(idx >> 6)).load(Ordering::Acquire) & (1u64 << (idx & 63)) != 0 }
}
