//! The cache side of load phases: switching a cache's row set, and *settling* its load rows when a
//! phase ends — every free slot goes back to its slab, empty load slabs go back to the heap, the free
//! pages of the others are purged, and the others join the run rows, whose allocations reuse their
//! free slots. A cache is settled by its owner: at once when the phase ends on its own thread, else at
//! its thread's next slow path (`settle_pending`: a small allocation's refill, or any large
//! allocation, `cache::settle_if_pending`), or by whoever takes it out of the pool.

use core::sync::atomic::Ordering;

use super::{
    checkin, empty_slab, end_arena, flush_stack, life, list_head, list_push, list_remove, remote, row, row_tag,
    set_row_set, Cache, ClassState,
};
use crate::heap;
use crate::os;
use crate::phase_state::{self, RowSet};
use crate::size_class::{CLASS_SIZES, NCLASSES, SLAB_SIZE};
use crate::slab::{Slab, SlabState};
use crate::stats::{self, COUNTERS};

/// What ending a cache's load rows did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadEnd {
    /// Slots handed out by the load rows since they were last ended.
    pub allocations: u64,
    /// Bytes of load-phase slots still live (survivors), slots counted at their class size.
    pub survivor_bytes: usize,
    /// Resident bytes returned to the OS: whole slabs given back to the heap are counted by the heap's
    /// purge; this counts the free pages purged inside slabs that keep survivors.
    pub purged_bytes: usize,
    /// Load slabs given back to the heap whole.
    pub slabs_released: usize,
}

/// Ends the load phase of `cache`'s load rows (owner only): returns every free slot to its slab, gives
/// empty load slabs back to the heap, purges the free pages inside the others, and moves them to the
/// run rows, whose allocations reuse their free slots from now on.
///
/// # Safety
/// - `cache` is owned by the calling thread (or taken out of the pool by it).
unsafe fn end_load_rows(cache: *mut Cache) -> LoadEnd {
    let mut r = LoadEnd::default();
    // SAFETY: owner; rows (reached through `row`, indices < ROWS) and slabs of this cache.
    unsafe {
        for class in 0..NCLASSES {
            let lrow = row(cache, RowSet::Load as usize + class);
            let rrow = row(cache, RowSet::Run as usize + class);
            flush_stack(cache, lrow);
            checkin(lrow);
            let count = (*lrow).count.load(Ordering::Relaxed);
            r.allocations += count - (*cache).load_mark[class];
            (*cache).load_mark[class] = count;
            let cur = (*lrow).current;
            // Written only if it was set: a row that was never used is left unwritten (its page may
            // never have been touched, see `Cache::init_at`).
            if cur != empty_slab() {
                (*lrow).current = empty_slab();
                end_slab(cache, cur, rrow, class, &mut r);
            }
            for state in [SlabState::Partial, SlabState::Full] {
                loop {
                    let s = *list_head(lrow, state);
                    if s.is_null() {
                        break;
                    }
                    list_remove(lrow, s);
                    end_slab(cache, s, rrow, class, &mut r);
                }
            }
        }
        // The next phase's first sweep waits for its own frees.
        (*cache).sweep_at = load_freed(cache) + SWEEP_MIN;
    }
    r
}

/// One load slab at the end of its phase.
///
/// # Safety
/// - `s` is a live slab of `cache` on no list; `rrow` is the run row of its class.
unsafe fn end_slab(cache: *mut Cache, s: *mut Slab, rrow: *mut ClassState, class: usize, r: &mut LoadEnd) {
    // SAFETY: owner.
    unsafe {
        remote::collect(cache, s);
        let used = ((*s).nslots - (*s).free_count) as usize;
        r.survivor_bytes += used * (*s).size as usize;
        if used == 0 && (*s).shared.remote.load(Ordering::Acquire) == 0 {
            super::count_left(cache, class, true);
            r.slabs_released += 1;
            Slab::disown(s);
            heap::free_block((*s).data);
            return;
        }
        r.purged_bytes += purge_free_pages(s);
        (*s).row = row_tag(RowSet::Run as usize + class);
        list_push(rrow, s, if (*s).free_count > 0 { SlabState::Partial } else { SlabState::Full });
    }
}

/// Bytes of slots that the owner freed in its load rows since they were made (each slot at its class
/// size): the clock that `Cache::sweep_at` is read against.
///
/// # Safety
/// - owner.
unsafe fn load_freed(cache: *mut Cache) -> usize {
    let mut bytes = 0;
    for (class, &size) in CLASS_SIZES.iter().enumerate() {
        // SAFETY: owner; a row of this cache (index < ROWS); `frees` is an atomic it alone writes.
        let f = unsafe { (*row(cache, RowSet::Load as usize + class)).frees.load(Ordering::Relaxed) };
        bytes += f as usize * size;
    }
    bytes
}

/// Least bytes of load-row slots freed between two sweeps ([`sweep_if_due`]).
pub(super) const SWEEP_MIN: usize = 1 << 20;

/// Inside a load phase, before the calling thread takes a large block: if it freed at least
/// [`SWEEP_MIN`] bytes of small load-phase objects since the last sweep (and at least a sixteenth of
/// its load slabs' bytes then), purges the pages of its load slabs on which every slot is free, as a
/// phase's end does. A loader that frees its parse temporaries and then allocates optimisation
/// scratch otherwise holds every page the temporaries touched until the phase ends — the survivors
/// among them (one in twenty in the suite's `model_load`) keep their slabs, not their pages. Returns
/// the bytes purged.
pub fn sweep_if_due() -> usize {
    let cache = life::mine();
    if cache.is_null() {
        return 0;
    }
    // SAFETY: our own live cache (owner).
    unsafe {
        let freed = load_freed(cache);
        if freed < (*cache).sweep_at {
            return 0;
        }
        // The sweep frees nothing itself (flushing the stacks moves slots already counted as freed),
        // so the clock still reads `freed` after it.
        let (purged, slabs) = sweep_load_rows(cache);
        (*cache).sweep_at = freed + SWEEP_MIN.max(slabs * SLAB_SIZE / 16);
        purged
    }
}

/// Purges the free pages of the load slabs of `cache` but the rows' current ones (which the next
/// allocations of their class take slots from). Returns the bytes purged and the slabs seen.
///
/// # Safety
/// - owner.
unsafe fn sweep_load_rows(cache: *mut Cache) -> (usize, usize) {
    let (mut purged, mut slabs) = (0, 0);
    // SAFETY: owner; rows (indices < ROWS) and slabs of this cache. Each row's stacked slots go back
    // to their bitmaps first (the flush may re-file slabs; the lists are walked after it, and nothing
    // below changes them); words are checked out only of current slabs, which are left out. So a set
    // bit of a listed slab is a free slot. Remote frees are left on their lists: their bits are
    // clear, so they only keep their pages.
    unsafe {
        for class in 0..NCLASSES {
            let lrow = row(cache, RowSet::Load as usize + class);
            flush_stack(cache, lrow);
            for state in [SlabState::Partial, SlabState::Full] {
                let mut s = *list_head(lrow, state);
                while !s.is_null() {
                    purged += purge_free_pages(s);
                    slabs += 1;
                    s = (*s).next;
                }
            }
        }
    }
    (purged, slabs)
}

/// Purges the pages of a slab on which every slot is free, counting only pages that were resident.
/// Free slots hold no allocator data (the header and bitmap are out of band) beyond their freed mark,
/// so a purged page simply reads as zero when its slots are handed out again.
///
/// # Safety
/// - `s` is a live slab owned by the caller with no word checked out and no stacked slot, so that a
///   set bit is a free slot. (Slots in its remote bitmap, not taken back yet, have their bits clear: they
///   only keep their pages.)
unsafe fn purge_free_pages(s: *mut Slab) -> usize {
    // SAFETY: header fields and bitmap of a live slab owned by the caller; i < nslots <= 64 * nwords.
    unsafe {
        let bits = Slab::bits(s);
        purge_pages_where(s, |i| *bits.add(i >> 6) & (1u64 << (i & 63)) != 0)
    }
}

/// Purges the resident pages of slab `s` on which every slot `i` has `dead(i)` (holds no data that
/// anyone reads again before writing it), in runs of whole pages, and counts them in the statistics.
/// Returns the bytes purged.
///
/// # Safety
/// - `s` is a live slab whose slots with `dead(i)` stay dead until this returns.
pub(super) unsafe fn purge_pages_where(s: *mut Slab, dead: impl Fn(usize) -> bool) -> usize {
    const PAGES: usize = SLAB_SIZE / os::PAGE;
    let mut resident = [0u8; PAGES];
    // SAFETY: `data`, `size` and `nslots` are fixed for the slab's life.
    let (base, size, nslots) = unsafe { ((*s).data, (*s).size as usize, (*s).nslots as usize) };
    if !os::resident_pages(base, SLAB_SIZE, &mut resident) {
        return 0;
    }
    let mut purged = 0;
    let mut run_start = usize::MAX;
    // The loop runs one past the last page to flush the final run of purgeable pages.
    #[allow(clippy::needless_range_loop)]
    for page in 0..=PAGES {
        let purge_this = page < PAGES && {
            let ps = page * os::PAGE;
            let pe = ps + os::PAGE;
            let lo = ps / size;
            let hi = nslots.min(pe.div_ceil(size));
            lo < hi && resident[page] & 1 != 0 && (lo..hi).all(&dead)
        };
        if purge_this {
            if run_start == usize::MAX {
                run_start = page;
            }
        } else if run_start != usize::MAX {
            let len = (page - run_start) * os::PAGE;
            // SAFETY: whole pages of this slab whose slots are all dead (contract).
            if unsafe { os::purge(base.add(run_start * os::PAGE), len) } {
                purged += len;
            }
            run_start = usize::MAX;
        }
    }
    if purged > 0 {
        stats::add(&COUNTERS.purges, 1);
        stats::add(&COUNTERS.purged_bytes, purged);
    }
    purged
}

impl LoadEnd {
    /// Adds what another cache's settling did.
    pub fn add(&mut self, b: LoadEnd) {
        self.allocations += b.allocations;
        self.survivor_bytes += b.survivor_bytes;
        self.purged_bytes += b.purged_bytes;
        self.slabs_released += b.slabs_released;
    }
}

/// Settles a cache's load rows and retires its arena chunk.
///
/// # Safety
/// - owner: `c` is owned by the calling thread (or taken out of the pool by it).
unsafe fn settle(c: *mut Cache) -> LoadEnd {
    // SAFETY: forwarded.
    unsafe {
        end_arena(c);
        end_load_rows(c)
    }
}

/// Called by a cache's owner at its slow paths (a small allocation's refill, any large allocation):
/// settles its load rows if `settle_pending` is set, for one atomic load when it is not.
///
/// # Safety
/// - owner.
#[inline]
pub(super) unsafe fn settle_pending(c: *mut Cache) {
    // SAFETY: owner.
    unsafe {
        if (*c).settle_pending.load(Ordering::Acquire)
            && (*c).settle_pending.swap(false, Ordering::Acquire)
            && (*c).depth.load(Ordering::Relaxed) == 0
            && !phase_state::process_active()
        {
            settle(c);
        }
    }
}

/// A cache adopted by a new thread starts in the phase the process is in, with no thread guard.
///
/// # Safety
/// - `c` was just taken from the pool by the calling thread (owner).
pub(super) unsafe fn on_adopt(c: *mut Cache) {
    // SAFETY: owner.
    unsafe {
        if (*c).depth.swap(0, Ordering::Relaxed) > 0 {
            phase_state::thread_phase(false);
        }
        if phase_state::process_active() {
            set_row_set(c, phase_state::process_row_base());
        } else {
            set_row_set(c, RowSet::Run as usize);
            (*c).settle_pending.store(false, Ordering::Relaxed);
            settle(c);
        }
    }
}

/// Opens a load-phase guard on `c`, the calling thread's cache: the outermost switches its row set.
///
/// # Safety
/// - owner.
pub unsafe fn thread_enter(c: *mut Cache, rows: RowSet) {
    // SAFETY: owner; atomics.
    unsafe {
        if (*c).depth.fetch_add(1, Ordering::Relaxed) == 0 {
            phase_state::thread_phase(true);
            set_row_set(c, rows as usize);
        }
    }
}

/// What closing a thread's load-phase guard did.
pub enum ThreadLeave {
    /// An inner guard, or the process-wide phase is still open: nothing to settle.
    Open,
    /// The outermost guard, on the cache's own thread: its load rows were settled.
    Settled(LoadEnd),
    /// The outermost guard, dropped on another thread: the owner settles at its next slow path.
    Deferred,
}

/// Closes a load-phase guard opened by [`thread_enter`] on `c`, from any thread.
///
/// # Safety
/// - `c` is a live cache (caches are never freed) on which [`thread_enter`] was called.
pub unsafe fn thread_leave(c: *mut Cache) -> ThreadLeave {
    // SAFETY: only atomics of a live cache are touched unless `c` is the caller's own (owner).
    unsafe {
        let last = (*c).depth.fetch_sub(1, Ordering::Relaxed) == 1;
        if last {
            phase_state::thread_phase(false);
        }
        if !last || phase_state::process_active() {
            return ThreadLeave::Open;
        }
        set_row_set(c, RowSet::Run as usize);
        if c == life::mine() {
            ThreadLeave::Settled(settle(c))
        } else {
            (*c).settle_pending.store(true, Ordering::Release);
            ThreadLeave::Deferred
        }
    }
}

/// Switches every cache to row set `rows` (the outermost process-wide phase begins). Serialised by
/// `sync::PHASE_CONTROL`.
pub fn switch_all(rows: RowSet) {
    life::for_each_cache(|c| {
        // SAFETY: caches are never freed; `rows_now` is atomic.
        unsafe { set_row_set(c, rows as usize) };
    });
}

/// Ends the process-wide phase for every cache without a thread guard of its own: they return to
/// the run rows; the caller's own cache and the pooled ones are settled now, the others at their
/// threads' next slow paths. Returns what was settled and how many caches were deferred. Serialised
/// by `sync::PHASE_CONTROL`; call it after the process depth dropped to 0.
pub fn end_process_phase() -> (LoadEnd, usize) {
    let me = life::mine();
    life::for_each_cache(|c| {
        // SAFETY: caches are never freed; these fields are atomics.
        unsafe {
            if (*c).depth.load(Ordering::Relaxed) == 0 {
                set_row_set(c, RowSet::Run as usize);
                if c != me {
                    (*c).settle_pending.store(true, Ordering::Release);
                }
            }
        }
    });
    let mut done = LoadEnd::default();
    // SAFETY: `me` is ours (owner); pooled caches are exclusively ours inside with_pooled_caches.
    unsafe {
        if !me.is_null() && (*me).depth.load(Ordering::Relaxed) == 0 {
            done.add(settle(me));
        }
        life::with_pooled_caches(|c| {
            if (*c).settle_pending.swap(false, Ordering::Acquire) {
                done.add(settle(c));
            }
        });
    }
    let mut deferred = 0;
    life::for_each_cache(|c| {
        // SAFETY: atomic flag of a live cache.
        if c != me && unsafe { (*c).settle_pending.load(Ordering::Relaxed) } {
            deferred += 1;
        }
    });
    (done, deferred)
}
