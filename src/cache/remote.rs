//! Frees from other threads. A thread that frees a slot of a slab it does not own sets the slot's bit
//! in the slab's remote bitmap (one atomic OR; a bit already set is a double free); the first since
//! the owner last collected also sets `QUEUED` and pushes the slab onto its owner's remote queue, so
//! the owner finds it in its slow path even if it never touches that slab again (memory freed by a
//! consumer thread comes back). Only the owner takes the remote bits into its bitmap, a word at a
//! time, without reading the slots.

use core::sync::atomic::{AtomicU64, Ordering};

use super::{cache_of, life, refile, release_bits, row_of, Cache};
use crate::os;
use crate::size_class::NCLASSES;
use crate::slab::{self, Slab, QUEUED};
use crate::stats::{self, COUNTERS};

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
            let q = &(*cache_of((*slab).owner)).remote;
            let mut head = q.load(Ordering::Relaxed);
            loop {
                (*slab).shared.remote_next.store(head, Ordering::Relaxed);
                match q.compare_exchange_weak(head, slab, Ordering::Release, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(h) => head = h,
                }
            }
        }
        // The slab is not touched after this: once queued, its owner may give it back.
        count_remote_free(class, queue);
    }
}

/// Slots freed by threads without a cache of their own (exiting threads), per class.
pub(super) static ORPHAN_FREES: [AtomicU64; NCLASSES] = [const { AtomicU64::new(0) }; NCLASSES];

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
            let summary = (*s).shared.remote.swap(0, Ordering::Acquire) & !QUEUED;
            apply(cache, s, summary);
            refile(s);
            s = next;
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
    if remote.load(Ordering::Relaxed) & !QUEUED == 0 {
        return 0;
    }
    let old = remote.fetch_and(QUEUED, Ordering::Acquire);
    // SAFETY: owner; the summary was taken with acquire ordering.
    unsafe { apply(cache, slab, old & !QUEUED) }
}

/// Whether slot `idx` of `slab` was freed by another thread and not taken back yet.
///
/// # Safety
/// - `slab` is live and `idx < nslots`.
pub(super) unsafe fn is_remote_freed(slab: *mut Slab, idx: usize) -> bool {
    // SAFETY: w < nwords; atomic words.
    unsafe { (*Slab::remote_bits(slab).add(idx >> 6)).load(Ordering::Acquire) & (1u64 << (idx & 63)) != 0 }
}
