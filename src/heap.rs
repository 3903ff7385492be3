//! The global heap: one reserved region of address space, carved into buddy blocks, plus direct OS
//! mappings for requests beyond the largest block.
//!
//! Layout: the region `[base, base + span)` is aligned to the top block size and reserved without
//! access; it is committed (made read-write) one top block at a time as the heap grows, and pages are
//! only faulted in when touched. A side *page map* (one [`PageEntry`] per 4 KiB page, in its own lazily
//! touched mapping) records every block's order and kind, so a pointer's owner is found with one range
//! check and one load, and large blocks stay page aligned at no cost in user memory.
//!
//! Concurrency: the buddy structure, the purge state and the budget are guarded by `sync::HEAP` (see
//! the lock order in `sync`). The region bounds and the page map pointer are published once at
//! initialisation (release) and read lock-free (acquire), see [`Region`]. Direct mappings (beyond the
//! largest block) live in `direct`, which asks the heap for the budget.
//!
//! Large blocks are *runs* of whole pages: a request takes the smallest buddy block that holds it and
//! gives the pages beyond the request straight back as smaller free blocks, so a 40 MiB tensor holds
//! 40 MiB (not 64), and the OS bytes, the budget and the phase report count what is really taken.
//! A run of 16 pages or more of a process that churns goes where the free pages it covers (free
//! blocks that lie end to end) hold the most resident ones, and a smaller one may span free blocks
//! too when no free block with resident pages is large enough (see `Buddy::alloc_run`), so the
//! pages a freed run leaves behind serve the next one.
//!
//! Memory return policy: freed blocks stay resident ("dirty"), and allocation takes blocks with dirty
//! pages before clean ones, so a freed temporary is reused without page faults. Free blocks merge
//! whatever their pages' states (the buddy keeps a bit per page), so `dirty_bytes` is what may be
//! resident (all of a freed block counts, touched or not) and a freed block joins its free
//! neighbours for the next larger request. Dirty memory goes back to the OS, smallest blocks first,
//! in three ways:
//! - *on demand*: when an allocation must take clean memory (which faults new pages in) while the
//!   dirty free bytes exceed the threshold, as much dirty memory is purged first as would take the
//!   heap above its high-water mark since the last `trim()` or phase end (inside a load phase, all
//!   of it), so freed memory waiting for reuse never raises the peak; except that a process whose
//!   purged memory keeps being faulted back in may keep up to `EDGEPOOL_REUSE_SLACK` percent of its
//!   most bytes in use above the mark; a request of 2 MiB or more is also held to its most bytes in
//!   use plus `EDGEPOOL_RETAIN`, where that is lower (see [`Inner::make_room`]);
//! - *by decay*: dirty bytes beyond the threshold that wait `EDGEPOOL_PURGE_DELAY` milliseconds
//!   without being reused (the low-water mark of the dirty bytes over that long, checked on every
//!   heap operation; all of them after a pause that long) are purged; a delay of 0 purges at free;
//! - *at once*: `trim()`, and the end of a load phase, purge everything free.
//!
//! The threshold is `EDGEPOOL_RETAIN`, or `EDGEPOOL_LOAD_RETAIN` while a load phase is open.
//! Outside load phases, a process that churns keeps more: up to `EDGEPOOL_RETAIN_PERCENT` of its
//! bytes in use, as far as it reused more freed memory (and faulted purged memory back in) than the
//! heap grew by since the last `trim()` or phase end (see [`Inner::retain_now`]).
//!
//! Slab blocks: a freed slab block (run time, not secure) waits whole in a small pool for the next
//! slab (see [`Inner::pool`]), without the buddy's merge and split. The pool gives its blocks to the
//! free lists, dirty, before anything else would purge memory or fault fresh pages in, so it holds
//! only what the free lists would hold dirty anyway.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use crate::buddy::{self, Buddy, PageEntry, PageKind, DIRTY, MIN_ORDER, SEALED, USED};
use crate::init;
use crate::options::{self, Values};
use crate::os::{self, PAGE};
use crate::phase_state;
use crate::size_class::{SLAB_META_SHIFT, SLAB_SHIFT};
use crate::slab::Slab;
use crate::stats::{self, Stats, COUNTERS};
use crate::sync;

/// Requests from this size on are held to the high-water mark of the bytes in use when they take
/// fresh pages outside load phases (see [`Inner::make_room`]). Above the largest request of the
/// suite's `mstress` (1 MiB), whose churn needs the share of free memory kept.
const STRICT_REQUEST: usize = 2 << 20;

const UNINIT: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;

/// Region bounds and page map, published once by [`ensure_init`] and read lock-free by every `free`.
/// Before that `span == 0`, so no pointer is "in the heap". One cache line, read-mostly.
///
/// Publication: `base` and `map` are stored first, then `span` with release ordering; every reader
/// loads `span` with acquire ordering first ([`page_kind_off`]), so a reader that sees a non-zero span
/// also sees the `base` and `map` stored before it (an acquire load is a plain load on x86 and arm64
/// with LSE: the fast path pays nothing for it).
#[repr(C, align(64))]
struct Region {
    base: AtomicUsize,
    span: AtomicUsize,
    map: AtomicPtr<PageEntry>,
    /// The slab table (see `init::Started::slabs`).
    slabs: AtomicPtr<u8>,
}

static REGION: Region = Region {
    base: AtomicUsize::new(0),
    span: AtomicUsize::new(0),
    map: AtomicPtr::new(core::ptr::null_mut()),
    slabs: AtomicPtr::new(core::ptr::null_mut()),
};
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Size of the largest buddy block, published by [`ensure_init`] (0 before).
static MAX_BLOCK: AtomicUsize = AtomicUsize::new(0);
/// `EDGEPOOL_LOAD_PREFAULT`, published by [`ensure_init`].
static LOAD_PREFAULT: AtomicBool = AtomicBool::new(false);

/// The heap's state behind its lock.
///
/// Invariants: `buddy` covers the pages `[base, base + frontier * PAGE)` of the region, which are
/// committed except its holes (a lazy region's pieces that something else had mapped);
/// `peak >= os_bytes()` since the last [`reset_peak`]; `over_since` is 0 exactly when the dirty free
/// bytes were within the threshold at the last decay check; otherwise `low_dirty` is the least dirty
/// free bytes seen at a heap operation since `over_since`, and `last_op` the time of the last one.
struct Inner {
    buddy: Buddy,
    opts: Values,
    retain: usize,
    load_retain: usize,
    /// `EDGEPOOL_PURGE_DELAY` in nanoseconds.
    purge_delay: u64,
    /// Start of the decay window: when the dirty free bytes last rose above the threshold, or the
    /// last window closed (0: they are within it).
    over_since: u64,
    /// The least dirty free bytes seen since `over_since` (the part that waited the whole window).
    low_dirty: usize,
    /// Time of the last decay check while over the threshold.
    last_op: u64,
    /// The high-water mark of `os_bytes` (blocks out for purging left out) since the last `trim()`
    /// or load phase's end, or the start: outside load phases, fresh pages below it are taken
    /// without purging ([`Inner::make_room`]).
    run_high: usize,
    /// The high-water mark of [`Inner::in_use`] since the same moments: fresh pages up to
    /// `reuse_slack` percent above it (as far as `refaulted - grown` allows) are taken without
    /// purging either ([`Inner::make_room`]).
    run_in_use_high: usize,
    /// `EDGEPOOL_REUSE_SLACK`, in percent.
    reuse_slack: usize,
    /// `EDGEPOOL_RETAIN_PERCENT`: outside load phases, dirty free bytes up to this share of the
    /// bytes in use stay resident too ([`Inner::retain_now`]).
    retain_percent: usize,
    /// Since the same moments: bytes of clean pages handed out that had been handed out before
    /// (purged, and now faulted back in), and of pages never handed out (the heap growing).
    refaulted: usize,
    /// Since the same moments: bytes of dirty pages handed out again (reused without a fault).
    reused: usize,
    grown: usize,
    limit: usize,
    peak: usize,
    /// Bytes of live large blocks (runs handed out by `alloc_large`, at their pages).
    large_bytes: usize,
    /// The highest [`Inner::in_use`] seen at a [`Inner::note_peak`] (every allocation calls it).
    peak_in_use: usize,
    /// Bytes of the live block that `realloc` moves into the block being allocated
    /// ([`alloc_large_moving`]), 0 otherwise: set and cleared around that allocation, under the lock.
    moving: usize,
    /// Of the allocation under way, the bytes of the old block that [`move_out`] will give back:
    /// its fresh bytes, at most `moving` (0 otherwise). Set before `make_room`, cleared after
    /// `note_peak`.
    move_give: usize,
    /// The region is a lazy window (see `init::start`).
    lazy: bool,
    /// `EDGEPOOL_SECURE`: slabs get a guard page, purged free blocks are made inaccessible.
    secure: bool,
    /// Bytes of dirty blocks taken out of the free lists to be purged outside the lock, not yet put
    /// back ([`PurgeBatch`]).
    in_flight: usize,
    /// A thread is growing the region outside the lock ([`Growth`]): the pages beyond the frontier
    /// are its until it is done.
    growing: bool,
    /// The process that `growing` and `in_flight` belong to (a `fork` child forgets them).
    pid: u32,
    /// Free bytes [`prefault_free`] asked to keep resident: decay and `make_room` keep at least this
    /// much dirty memory (0: none asked).
    warm: usize,
    /// Freed slab blocks kept whole for the next slab: the page indices of the first `pool_n`. A
    /// slab block is taken and freed every few hundred allocations where threads pass medium
    /// blocks around (the suite's `rptest`: 20–60 thousand times a run); through the free lists,
    /// that was a split and a merge each time, about 1 500 instructions a pair under callgrind: 149 M
    /// of the allocator's 340 M instructions in a run (234 M with the pool).
    ///
    /// Invariants: each pooled block is a block of order `SLAB_SHIFT`, below the frontier, that the
    /// buddy counts as allocated and nobody uses; its head page is marked `Meta` and the others
    /// `Interior` (so a pointer into it is not a live slab's), with `load` 0; its pages may be
    /// resident (it counts as dirty free memory in [`Inner::dirty_free`]). `pool_n <= POOL_MAX`.
    /// Empty whenever memory is purged or fresh pages are handed out ([`Inner::pool_flush`]).
    pool: [u32; POOL_MAX],
    pool_n: usize,
}

/// Most slab blocks in the pool (8 MiB).
const POOL_MAX: usize = 128;

/// A growth of the region, planned under the heap's lock ([`Inner::plan_grow`]) and done by the OS
/// without it ([`Growth::run`]): an `mprotect` or `mmap` waits for every page fault and `madvise`
/// in progress in the process, long enough to queue every other thread behind the lock.
///
/// A reserved region grows by `count` top blocks at once: a quarter of what it has, at least one and
/// at most [`MAX_GROW_TOPS`], so that a heap growing to gigabytes calls the OS a few times instead of
/// once per top block (35 `mprotect`s of 64 MiB, ~3 ms each behind the page faults of other
/// threads, for tract loading a 128 MB model in four threads). Committing costs nothing until the
/// pages are touched.
#[derive(Clone, Copy, Debug)]
struct Growth {
    idx: u32,
    order: u32,
    count: u32,
    lazy: bool,
}

/// The first growth of a reserved region (see [`Inner::plan_grow`]).
const FIRST_PIECE: usize = 2 << 20;

/// The order of the next growth at page `idx` (the frontier) of a region whose top order is `top`:
/// a lazy region's pieces ([`init::LAZY_UNIT`], or the top block if smaller); a reserved region's
/// first top block in doubling pieces from [`FIRST_PIECE`] (see [`Inner::plan_grow`]), then top
/// blocks.
fn growth_order(idx: u32, top: u32, lazy: bool) -> u32 {
    if lazy {
        top.min(init::LAZY_UNIT.trailing_zeros())
    } else if idx == 0 {
        top.min(FIRST_PIECE.trailing_zeros())
    } else {
        // The pieces doubled from 0, so `idx` is a power of two until the top block is whole, and
        // a multiple of the top block after.
        top.min(idx.trailing_zeros() + MIN_ORDER)
    }
}

/// Most top blocks one growth commits.
const MAX_GROW_TOPS: u32 = 16;

/// What the OS did with a [`Growth`].
#[derive(Clone, Copy, Debug)]
enum Grown {
    /// This many blocks (top blocks of a reserved region; one piece of a lazy one).
    Done(u32),
    /// A lazy piece something else had mapped.
    Taken,
    Refused,
}

impl Growth {
    /// Commits the block or maps the piece (the heap unlocked).
    fn run(&self) -> Grown {
        let (p, len) = (addr_of(self.idx) as *mut u8, PAGE << (self.order - MIN_ORDER));
        if !self.lazy {
            // Where the OS refuses several blocks at once (a strict overcommit limit), one may pass.
            for n in [self.count, 1] {
                // SAFETY: the range is inside the reservation (`count` was bounded by it), page
                // aligned, beyond the frontier, and claimed by this thread (`growing`): nobody else
                // touches it.
                if unsafe { os::commit(p, len * n as usize) } {
                    return Grown::Done(n);
                }
            }
            return Grown::Refused;
        }
        // SAFETY: the piece is page aligned, inside the window, beyond the frontier and claimed by this
        // thread: nothing of ours is there.
        match unsafe { os::map_at(p, len) } {
            Ok(()) => Grown::Done(1),
            Err(os::MapAt::Taken) => Grown::Taken,
            Err(os::MapAt::Refused) => Grown::Refused,
        }
    }
}

/// Why [`Inner::alloc`] returned without a block.
#[derive(Clone, Copy, Debug)]
enum Miss {
    /// Refused: no memory (counted) or the budget (counted).
    Refused,
    /// Another thread is growing the region or purging blocks outside the lock: try again soon.
    Busy,
    /// The region must grow first: run the growth without the lock, then try again.
    Grow(Growth),
}

/// The buddy heap's state; its lock is `sync::HEAP`.
struct Heap(UnsafeCell<Inner>);

// SAFETY: the state is only accessed while `sync::HEAP` is held (see `with_heap`).
unsafe impl Sync for Heap {}

static HEAP: Heap = Heap(UnsafeCell::new(Inner {
    buddy: Buddy::empty(),
    opts: Values::defaults(),
    retain: 0,
    load_retain: 0,
    purge_delay: 0,
    over_since: 0,
    low_dirty: 0,
    last_op: 0,
    run_high: 0,
    run_in_use_high: 0,
    reuse_slack: 0,
    retain_percent: 0,
    refaulted: 0,
    reused: 0,
    grown: 0,
    limit: 0,
    peak: 0,
    large_bytes: 0,
    peak_in_use: 0,
    moving: 0,
    move_give: 0,
    lazy: false,
    secure: false,
    in_flight: 0,
    growing: false,
    pid: 0,
    warm: 0,
    pool: [0; POOL_MAX],
    pool_n: 0,
}));

/// Runs `f` with the heap locked.
fn with_heap<R>(f: impl FnOnce(&mut Inner) -> R) -> R {
    sync::HEAP.lock();
    // SAFETY: the lock is held, so this is the only reference to the state.
    let r = f(unsafe { &mut *HEAP.0.get() });
    sync::HEAP.unlock();
    r
}

/// Whether the heap is initialised (cheap; for fast paths that must not initialise).
#[inline]
pub fn is_ready() -> bool {
    STATE.load(Ordering::Acquire) == READY
}

/// Initialises the heap on first use. Allocation-free; safe to call from any thread at any time,
/// including from the dynamic loader. Returns `false` if the heap could not be set up (the allocator
/// then returns null for everything).
#[inline]
pub fn ensure_init() -> bool {
    match STATE.load(Ordering::Acquire) {
        READY => true,
        FAILED => false,
        _ => init_slow(),
    }
}

#[cold]
#[inline(never)]
fn init_slow() -> bool {
    // The reservation may be refused and halved on the way: a malloc that succeeds leaves errno as
    // it found it.
    let saved_errno = os::errno();
    let mut opts = None;
    let ok = with_heap(|h| {
        match STATE.load(Ordering::Acquire) {
            READY => return true,
            FAILED => return false,
            _ => {}
        }
        let Some(st) = init::start() else {
            STATE.store(FAILED, Ordering::Release);
            return false;
        };
        let top = (st.opts.get(options::MAX_BLOCK) as usize).trailing_zeros();
        // SAFETY: `st.map` and `st.bits` are in a fresh zeroed mapping covering every page of the
        // region (entries, then the bitmap); top is within
        // MIN_ORDER..=MAX_ORDER_LIMIT by option validation (256 KiB ..= 1 GiB).
        unsafe { h.buddy.init(st.map, st.bits, top) };
        h.opts = st.opts;
        h.retain = st.opts.get(options::RETAIN) as usize;
        h.load_retain = st.opts.get(options::LOAD_RETAIN) as usize;
        h.purge_delay = st.opts.get(options::PURGE_DELAY).saturating_mul(1_000_000);
        h.reuse_slack = st.opts.get(options::REUSE_SLACK).min(10_000) as usize;
        h.retain_percent = st.opts.get(options::RETAIN_PERCENT).min(10_000) as usize;
        h.limit = st.opts.get(options::LIMIT) as usize;
        BUDGETED.store(h.limit != 0, Ordering::Relaxed);
        h.lazy = st.lazy;
        os::set_heap_reserved(!st.lazy);
        h.secure = st.opts.get(options::SECURE) != 0;
        SECURE.store(h.secure, Ordering::Relaxed);
        init::open_startup_phase(&st.opts);
        MAX_BLOCK.store(1 << top, Ordering::Relaxed);
        LOAD_PREFAULT.store(st.opts.get(options::LOAD_PREFAULT) != 0, Ordering::Relaxed);
        MOVE_PAGES.store(st.opts.get(options::MOVE_PAGES) != 0 && !crate::valgrind::active(), Ordering::Relaxed);
        REGION.base.store(st.base, Ordering::Relaxed);
        REGION.map.store(st.map, Ordering::Relaxed);
        REGION.slabs.store(st.slabs, Ordering::Relaxed);
        // Release: see `Region`.
        REGION.span.store(st.span, Ordering::Release);
        STATE.store(READY, Ordering::Release);
        opts = Some(st.opts);
        true
    });
    if let Some(o) = opts {
        init::after_start(&o, print_stats_at_exit);
    }
    if ok {
        os::set_errno(saved_errno);
    }
    ok
}

/// `EDGEPOOL_STATS` at exit: the report on stderr, or JSON into the file of `json:PATH`.
extern "C" fn print_stats_at_exit() {
    let s = stats();
    if options().get(options::STATS) != options::STATS_JSON {
        return stats::write_report(2, &s);
    }
    os::with_option(b"STATS", |value| {
        let Some(path) = value.strip_prefix(b"json:") else { return };
        match os::open_write(path) {
            Some(fd) => {
                stats::write_json(fd, &s);
                os::close(fd);
            }
            None => os::write_stderr(b"edgepool: EDGEPOOL_STATS=json: cannot create the file\n"),
        }
    });
}

/// The options in effect (defaults before initialisation).
pub fn options() -> Values {
    if !is_ready() {
        return Values::defaults();
    }
    with_heap(|h| h.opts)
}

/// The kind of the page holding `p`, or `None` when `p` is outside the region (for tests; the
/// allocator uses [`page_kind_off`]).
#[cfg(test)]
pub fn page_kind(p: usize) -> Option<PageKind> {
    page_kind_off(p).map(|(k, _)| k)
}

/// The kind of the page holding `p` and `p`'s offset in the region (for [`slab_at`]), or `None` when
/// `p` is outside the region. Lock-free: for a live block of the caller, the entry was written before
/// the block was handed out and does not change while it lives.
#[inline(always)]
pub fn page_kind_off(p: usize) -> Option<(PageKind, usize)> {
    let off = region_off(p)?;
    Some((page_kind_at(off), off))
}

/// `p`'s offset in the heap's region, or `None` outside it (or before initialisation): the first
/// half of [`page_kind_off`], for a caller that reads the slab table instead of the page map (the free
/// path: see `global::free_raw`). The slab table covers the whole region, so [`slab_at`] of the
/// offset is always an entry that may be read.
#[inline(always)]
pub fn region_off(p: usize) -> Option<usize> {
    // Acquire first: see `Region`.
    let span = REGION.span.load(Ordering::Acquire);
    let off = p.wrapping_sub(REGION.base.load(Ordering::Relaxed));
    (off < span).then_some(off)
}

/// The page-map kind of the page at region offset `off`, which came from [`region_off`] on this thread
/// (so that the map's publication is visible): [`page_kind_off`]'s second half.
#[inline(always)]
pub fn page_kind_at(off: usize) -> PageKind {
    debug_assert!(off < REGION.span.load(Ordering::Relaxed));
    // SAFETY: `off < span` (from `region_off`), so the entry is inside the page map, which covers the
    // region; every value the map holds is a valid `PageKind` (it starts zeroed, `Interior`, and only
    // kinds are stored).
    unsafe { (*REGION.map.load(Ordering::Relaxed).add(off >> buddy::PAGE_SHIFT)).kind }
}

/// The heap's region as `(base, span)`; `(0, 0)` before initialisation.
pub fn region() -> (usize, usize) {
    // Acquire first: see `Region`.
    let span = REGION.span.load(Ordering::Acquire);
    (REGION.base.load(Ordering::Relaxed), span)
}

/// The header entry of the slab whose block holds the region offset `off` (from [`page_kind_off`] or
/// [`region_off`]).
#[inline(always)]
pub fn slab_at(off: usize) -> *mut Slab {
    // The table covers every 64 KiB of the region; `off` came from `page_kind_off` or `region_off`,
    // on this thread, so the table's publication is visible. Only pointer arithmetic here: using the
    // entry is the caller's business.
    REGION.slabs.load(Ordering::Relaxed).wrapping_add((off >> SLAB_SHIFT) << SLAB_META_SHIFT).cast()
}

/// The header entry of the slab whose block holds `p` (out of band: see `slab`). The entry is
/// meaningful only where the page map says `Slab`.
///
/// # Safety
/// - `p` lies inside the region ([`page_kind_off`] is `Some` for it, on this thread).
#[inline(always)]
pub unsafe fn slab_of(p: *mut u8) -> *mut Slab {
    // p is in the region (contract), so its offset is one `page_kind_off` would give.
    slab_at(p as usize - REGION.base.load(Ordering::Relaxed))
}

/// The page-map entry of the page holding `p`.
///
/// # Safety
/// - `p` lies inside the region ([`page_kind_off`] is `Some` for it, on this thread, so that the region's
///   publication is visible).
#[inline(always)]
unsafe fn page_entry(p: usize) -> *mut PageEntry {
    let idx = (p - REGION.base.load(Ordering::Relaxed)) >> buddy::PAGE_SHIFT;
    // SAFETY: p is in the region, so idx < npages, which the page map covers.
    unsafe { REGION.map.load(Ordering::Relaxed).add(idx) }
}

#[inline]
fn addr_of(idx: u32) -> usize {
    REGION.base.load(Ordering::Relaxed) + ((idx as usize) << buddy::PAGE_SHIFT)
}

#[inline]
fn index_of(p: usize) -> u32 {
    ((p - REGION.base.load(Ordering::Relaxed)) >> buddy::PAGE_SHIFT) as u32
}

impl Inner {
    fn os_bytes(&self) -> usize {
        let committed = self.buddy.committed_pages() as usize * PAGE;
        committed - self.buddy.free_bytes + self.buddy.dirty_bytes + COUNTERS.direct_bytes.load(Ordering::Relaxed)
    }

    /// `os_bytes` without the blocks out for purging (they count as taken until put back clean).
    fn settled_bytes(&self) -> usize {
        self.os_bytes().saturating_sub(self.in_flight)
    }

    /// Bytes in allocated blocks and direct mappings. Blocks out for purging are free: the buddy
    /// counts them as taken until they are put back, and they are left out here (else a purge
    /// raised the most bytes in use, `peak_in_use` and `run_in_use_high`, by the bytes it returns).
    fn in_use(&self) -> usize {
        let committed = self.buddy.committed_pages() as usize * PAGE;
        (committed - self.buddy.free_bytes + COUNTERS.direct_bytes.load(Ordering::Relaxed))
            .saturating_sub(self.in_flight + self.pooled())
    }

    /// [`Inner::in_use`] with a block that `realloc` moves counted once: without the bytes of the
    /// old block that [`move_out`] gives back as the new one's fresh pages fault in
    /// (`move_give`). The high-water mark that the purge policy holds the heap to
    /// (`run_in_use_high`) is what was resident, not both blocks whole.
    fn in_use_once(&self) -> usize {
        self.in_use().saturating_sub(self.move_give)
    }

    /// Bytes of the slab blocks in the pool.
    fn pooled(&self) -> usize {
        self.pool_n << SLAB_SHIFT
    }

    /// Free bytes whose pages may be resident: the free lists' dirty bytes and the pool.
    fn dirty_free(&self) -> usize {
        self.buddy.dirty_bytes + self.pooled()
    }

    /// Whether blocks of this kind, order and phase go through the pool: run-time slab blocks, not
    /// under the hardened mode (whose slabs carry a guard page).
    fn poolable(&self, kind: PageKind, order: u32, load: bool) -> bool {
        kind == PageKind::Slab && order == SLAB_SHIFT && !load && !self.secure
    }

    /// A slab block from the pool, if the pool has one: allocated, dirty and used, its pages still
    /// marked as pooled (the caller marks them).
    fn pool_take(&mut self) -> Option<(u32, u8)> {
        if self.pool_n == 0 {
            return None;
        }
        self.pool_n -= 1;
        self.note_peak();
        Some((self.pool[self.pool_n], DIRTY | USED))
    }

    /// Keeps the freed run-time slab block at `idx` in the pool, if there is room.
    ///
    /// # Safety
    /// - `idx` is the head of an allocated block of order `SLAB_SHIFT` with `load` 0, its other
    ///   pages marked `Interior`, that the caller gives up.
    unsafe fn pool_put(&mut self, idx: u32) -> bool {
        if self.pool_n == POOL_MAX {
            return false;
        }
        // SAFETY: the block's head (contract), below the frontier.
        unsafe { self.buddy.entry_mut(idx).kind = PageKind::Meta };
        self.pool[self.pool_n] = idx;
        self.pool_n += 1;
        true
    }

    /// Gives every pooled block to the free lists, dirty: before memory is purged (which takes it
    /// from there, smallest first) or fresh pages are handed out.
    fn pool_flush(&mut self) {
        while self.pool_n > 0 {
            self.pool_n -= 1;
            let idx = self.pool[self.pool_n];
            // SAFETY: a pooled block is allocated, of order SLAB_SHIFT, below the frontier, and
            // nobody uses it (invariants of `pool`); its pages may be resident, so it goes back dirty.
            unsafe { self.buddy.free(idx, SLAB_SHIFT, DIRTY) };
        }
    }

    /// Whether the block just allocated at `idx`, over the budget as counted, fits it as a block that
    /// `realloc` moves ([`alloc_large_moving`]) counts: the old block's pages go back as the new one's
    /// `fresh` bytes fault in ([`move_out`]), so the two are never resident whole at once (one piece
    /// is counted twice). Only if pages can be given back now: a page of the new block, not handed
    /// out yet, is given back as a probe (under `mlockall` `madvise` refuses, and from then on no
    /// move is counted once: [`gives_back`]).
    fn move_fits(&self, idx: u32, fresh: usize) -> bool {
        let give = fresh.min(self.moving);
        if give == 0 || counted_once(self.os_bytes(), give) > self.limit {
            return false;
        }
        // SAFETY: the block at idx was just allocated, nobody else knows it, and it holds nothing
        // yet.
        unsafe { probe_give_back(addr_of(idx) as *mut u8) }
    }

    /// A block that `realloc` moves was just allocated (the peak was `peak0` before), and `give` bytes
    /// of the old block will go back to the OS as the new one faults in ([`move_out`]): the peak
    /// counts the two without those bytes, but for one piece.
    fn unpeak_move(&mut self, peak0: usize, give: usize) {
        if self.peak > peak0 {
            let lowered = counted_once(self.os_bytes(), give);
            self.peak = peak0.max(lowered.min(self.peak));
        }
    }

    fn note_peak(&mut self) {
        let now = self.os_bytes();
        if now > self.peak {
            self.peak = now;
        }
        self.peak_in_use = self.peak_in_use.max(self.in_use());
        self.run_in_use_high = self.run_in_use_high.max(self.in_use_once());
        // The high-water mark rises only with memory that could not have been purged: blocks out
        // for purging count in `os_bytes` until they are put back clean, and while more dirty
        // memory than the threshold waits, a purge is still under way (batches take a few blocks at
        // a time).
        let settled = self.settled_bytes();
        if settled > self.run_high && self.dirty_free() <= self.retain_now() {
            self.run_high = settled;
        }
    }

    /// Plans the next growth of the committed part of the region: top blocks of a reserved region,
    /// or one piece of a lazy one (see `init::start`), at the frontier. The pages are this thread's
    /// to commit (`growing` is set) until [`Inner::finish_grow`]. `None` when the region is full.
    ///
    /// A reserved region's first top block comes in pieces: [`FIRST_PIECE`], then each as large as
    /// all before it, so that they merge into the top block. A free block's head entry lies in the
    /// page map at its first page, and splitting a whole top block of 64 MiB for the first slab
    /// wrote heads 2, 4, ... 32 MiB into the region: five more pages of the map resident (20 KiB)
    /// in every process, the smallest included.
    fn plan_grow(&mut self) -> Option<Growth> {
        let span_pages = REGION.span.load(Ordering::Relaxed) / PAGE;
        let idx = self.buddy.frontier;
        let top = self.buddy.top;
        let order = growth_order(idx, top, self.lazy);
        let pages = 1u32 << (order - MIN_ORDER);
        if idx as usize + pages as usize > span_pages {
            return None;
        }
        let room = ((span_pages - idx as usize) / pages as usize) as u32;
        let count = if self.lazy || order < top { 1 } else { (idx / pages / 4).clamp(1, MAX_GROW_TOPS).min(room) };
        self.growing = true;
        Some(Growth { idx, order, count, lazy: self.lazy })
    }

    /// Adds what [`Growth::run`] did to the buddy: the new block, or a hole where something else had
    /// mapped a lazy piece. Returns whether the OS refused.
    fn finish_grow(&mut self, g: Growth, r: Grown) -> bool {
        self.growing = false;
        let pages = 1u32 << (g.order - MIN_ORDER);
        // SAFETY: g.idx is still the frontier (only the one thread growing moves it, here), aligned to
        // the block or piece (every piece and hole of a lazy window has the same size; a piece of the
        // first top block is as large as the frontier, a power of two), and the page map covers the
        // whole region; `n` top blocks from it were committed.
        unsafe {
            match r {
                Grown::Done(_) if g.lazy || g.order < self.buddy.top => self.buddy.add_block(g.idx, g.order),
                Grown::Done(n) => {
                    for i in 0..n {
                        self.buddy.add_top(g.idx + i * pages);
                    }
                }
                Grown::Taken => self.buddy.add_hole(g.idx, pages),
                Grown::Refused => return true,
            }
        }
        false
    }

    /// On a slow path: in a `fork` child, forgets the growth and the purges that the parent's other
    /// threads had under way (those threads do not exist here; their pages stay out of the lists).
    fn forget_other_threads_after_fork(&mut self) {
        let pid = os::pid();
        if self.pid != pid {
            self.pid = pid;
            self.growing = false;
            self.in_flight = 0;
        }
    }

    /// Purges free dirty blocks, smallest first, until at least `want` bytes are clean (or none is
    /// dirty). Returns the bytes made clean.
    fn purge(&mut self, want: usize) -> usize {
        let secure = self.secure;
        self.buddy.purge(want, |idx, order, dirty| purge_pages(idx, order, dirty, secure))
    }

    fn purge_all(&mut self) -> usize {
        self.pool_flush();
        self.purge(usize::MAX)
    }

    /// Outside load phases, whether the process reused more freed memory (and faulted more purged
    /// memory back in) than its heap grew by since the last `trim()` or phase end: it churns, where a
    /// heap growing as a model loads does not.
    fn churning(&self) -> bool {
        !phase_state::any_active() && self.earned() > 0
    }

    /// Bytes of freed memory reused and of purged memory faulted back in, beyond the bytes the heap
    /// grew by, since the last `trim()` or phase end: what a churning process earned.
    fn earned(&self) -> usize {
        (self.refaulted + self.reused).saturating_sub(self.grown)
    }

    /// Dirty free bytes kept resident: `RETAIN`, or `LOAD_RETAIN` while a load phase is open.
    /// At least the bytes [`prefault_free`] warmed.
    ///
    /// Outside load phases, also up to `RETAIN_PERCENT` of the bytes in use, as far as the process
    /// earned it: bytes of freed memory reused and of purged memory faulted back in, beyond the bytes
    /// the heap grew by, since the last `trim()` or phase end. A churning process has its free memory
    /// in pieces that the next requests fit soon after. The suite's `mstress` (random sizes up to
    /// 1 MiB, threads replaced), with RETAIN alone, purged them whenever fresh memory took the heap to
    /// a new high and faulted them back in (80–170k page faults a run, tcmalloc 35k; with the share,
    /// 32–40k); `malloc_large` (64 KiB–32 MiB blocks in a loop) purged mostly by decay (with the
    /// share kept from fresh memory's purges only, 281–353k page faults and 1.5–1.8 s; kept from
    /// decay too, 139–155k and 0.9–1.1 s). A heap growing as a model loads reuses less than it grows
    /// and keeps RETAIN (onnxruntime loading a 140 MB U-Net without a phase: 394.7 MiB peak either
    /// way; with the share granted unearned, 496.5). What a churning process keeps stays until
    /// `trim()` or a phase's end, as glibc and tcmalloc keep theirs.
    fn retain_now(&self) -> usize {
        let keep = if phase_state::any_active() {
            self.load_retain
        } else {
            self.retain.max((self.in_use() / 100 * self.retain_percent).min(self.earned()))
        };
        keep.max(self.warm)
    }

    /// Purges `want` bytes of dirty free memory, smallest blocks first: takes them out of the free
    /// lists into `batch`, to be purged once the lock is dropped ([`PurgeBatch::run`]), as many as
    /// it holds (a purge of a few MiB takes long enough to queue every other thread's allocation
    /// behind it); when they fill it, the rest follows batch by batch as long as more than `keep`
    /// dirty bytes are free. Under a budget it purges at once instead: blocks being purged count
    /// as taken, and a concurrent request must not be refused for them.
    fn purge_soon(&mut self, want: usize, keep: usize, batch: &mut PurgeBatch) {
        // Of the purges that share a batch (`make_room` then `decay`), the one that keeps least.
        batch.keep = if batch.n == 0 { keep } else { batch.keep.min(keep) };
        self.pool_flush();
        if self.limit != 0 {
            self.purge(want);
            return;
        }
        batch.secure = self.secure;
        let mut want = want;
        while want > 0 && batch.n < PURGE_BATCH {
            let Some((idx, order, flags, dirty)) = self.buddy.take_dirty() else { break };
            batch.blocks[batch.n] = (idx, order, flags, dirty);
            batch.n += 1;
            self.in_flight += 1 << order;
            want = want.saturating_sub(dirty);
        }
        batch.more = if batch.n == PURGE_BATCH { want } else { 0 };
    }

    /// About to hand out `bytes` of clean memory (new page faults) for a block or run of `request`
    /// bytes: first purge as much dirty memory beyond the threshold, so that waiting free memory
    /// never raises the resident set. Inside a load phase, at once (the loader's peak is what
    /// matters, and other memory, such as the mapped model, may rise meanwhile); outside, only what
    /// would take the heap above its high-water mark since the last `trim()` or phase end: below it
    /// no peak rises, and the memory waits for reuse until decay returns it. (`malloc_large` of the
    /// suite: 9.1k purges and 2.45 M page faults before, 5.6k and 1.69 M after; peaks within the
    /// spread between runs.)
    ///
    /// A request of [`STRICT_REQUEST`] bytes or more, outside load phases, is also held to the most
    /// bytes in use since then plus `RETAIN` (where that is lower): neither the share of the bytes
    /// in use that a churning process keeps nor the reuse slack lets it take the resident set
    /// higher. Such a request adds megabytes to the resident set at once, and the free memory it
    /// could not use is a bet that lost for it. (The suite's `malloc_large`, blocks of 64 KiB-32
    /// MiB: its peak held the share, about 25 % above its bytes in use, 173 MiB against glibc's
    /// 146; held to the mark too, 147 MiB, at 2.4x the page faults and 0.69x glibc's time.
    /// `mstress`, whose churn of blocks up to 1 MiB needs the share, is not concerned.)
    fn make_room(&mut self, bytes: usize, request: usize, batch: &mut PurgeBatch) {
        let load = phase_state::any_active();
        let strict = !load && request >= STRICT_REQUEST;
        let keep = if strict { self.retain.max(self.warm) } else { self.retain_now() };
        if self.dirty_free() <= keep {
            return;
        }
        let mut want = (self.dirty_free() - keep).min(bytes);
        if !load {
            // Outside load phases, fresh pages below the high-water mark since the last phase's end
            // raise no peak: memory waiting for reuse stays (decay returns what waits unused).
            // Above it, a process whose purged memory keeps being faulted back in (more bytes
            // refaulted than grown since then: churn, not a heap growing as a model loads) keeps
            // that excess, up to `REUSE_SLACK` percent of the most bytes in use since then: free
            // memory in pieces smaller than the requests waits for requests that fit instead of
            // being purged and faulted back in (the suite's `malloc_large`: 2.5x glibc's time with
            // the high-water mark alone). A loading heap grows into fresh pages and keeps its peak.
            let earned = self.refaulted.saturating_sub(self.grown);
            let slack = (self.run_in_use_high / 100 * self.reuse_slack).min(earned);
            let mut ceiling = self.run_high.max(self.run_in_use_high + slack);
            if strict {
                // The block just taken counts as in use (the mark rises with it at `note_peak`).
                ceiling = ceiling.min(self.run_in_use_high.max(self.in_use_once()) + keep);
            }
            want = want.min(self.settled_bytes().saturating_sub(ceiling));
        }
        if want > 0 {
            self.purge_soon(want, keep, batch);
        }
    }

    /// Decay: purges dirty free bytes beyond the threshold ([`Inner::retain_now`]) that have waited
    /// `PURGE_DELAY` without being reused; with a delay of 0, at once.
    ///
    /// Memory that waited is told apart from memory being recycled by the low-water mark of the
    /// dirty bytes over a window of one delay: what never went below it was not reused during the
    /// window, so the excess of the mark over the threshold goes back at the window's end, and a new
    /// window starts. A process that keeps freeing and taking blocks keeps them (the mark stays low);
    /// one that stopped gives its freed memory back. After a pause of a whole delay without heap
    /// operations, all the excess has waited: it goes at once. (Before, all the excess went every
    /// delay while it lasted: a ring of four threads passing 4-16 KiB blocks purged 2.9 GB in 6 s,
    /// which it faulted straight back in.)
    ///
    /// Not while a load phase is open: there only [`Inner::make_room`] purges (before clean memory is
    /// touched, so the resident set grows only with the live bytes), and the phase's end purges
    /// everything free. Decay's purges there lowered no peak and were faulted back in by the loader:
    /// tract loading a 128 MB model in one to four threads took 5–17 % longer with them, at the same
    /// peak.
    fn decay(&mut self, batch: &mut PurgeBatch) {
        if phase_state::any_active() {
            return;
        }
        let keep = self.retain_now();
        let dirty = self.dirty_free();
        if dirty <= keep {
            self.over_since = 0;
            return;
        }
        if self.purge_delay == 0 {
            self.purge_soon(dirty - keep, keep, batch);
            return;
        }
        let now = os::now_ns();
        if self.over_since == 0 {
            self.over_since = now;
            self.low_dirty = dirty;
            self.last_op = now;
            return;
        }
        if now.wrapping_sub(self.last_op) >= self.purge_delay {
            // Nothing happened for a whole delay: everything beyond the threshold waited.
            self.purge_soon(dirty - keep, keep, batch);
            self.over_since = 0;
            return;
        }
        self.last_op = now;
        self.low_dirty = self.low_dirty.min(dirty);
        if now.wrapping_sub(self.over_since) >= self.purge_delay {
            if self.low_dirty > keep {
                self.purge_soon(self.low_dirty - keep, keep, batch);
            }
            self.over_since = now;
            self.low_dirty = self.dirty_free();
        }
    }

    /// Gives back, with `flags`, what [`Inner::alloc`] just took: the run of `run` pages at `idx` if
    /// `run > 0`, else the block of `order` at `idx`.
    ///
    /// # Safety
    /// - it was taken by the `alloc` under way, and nobody else knows it.
    unsafe fn give_back(&mut self, idx: u32, order: u32, run: u32, flags: u8) {
        // SAFETY: the caller's contract: these pages are ours to free, once.
        unsafe {
            if run > 0 {
                self.buddy.release_range(idx, idx + run, flags);
            } else {
                self.buddy.free(idx, order, flags);
            }
        }
    }

    /// Allocates a block of `order` marked `kind` or, for `kind == Large`, a run of `run` pages
    /// aligned to `order`, honouring the budget. When the region must grow, returns the growth to
    /// do without the lock (unless `may_grow` is false: the last growth was refused).
    fn alloc(
        &mut self,
        order: u32,
        kind: PageKind,
        run: u32,
        may_grow: bool,
        batch: &mut PurgeBatch,
    ) -> Result<(u32, u8), Miss> {
        let mut purged = false;
        let large = kind == PageKind::Large;
        let bytes = if large { run as usize * PAGE } else { 1usize << order };
        loop {
            // Runs of a churning process go over the most resident free pages (see
            // `Buddy::dirtiest_run`). Not inside a load phase, whose purges before fresh pages
            // keep little dirty memory, nor in a heap that grows more than it reuses: fewer page
            // faults there meant fewer purges, and tract's load peak rose (295.7 -> 298.0 MB with
            // the phase, +0.7 MB without).
            let took = if large {
                self.buddy.alloc_run_placing(run, order, self.churning())
            } else {
                self.buddy.alloc(order, kind)
            };
            let got = match took {
                Some(g) => Some(g),
                None if self.pool_n > 0 => {
                    // The pooled blocks may merge into a block large enough.
                    self.pool_flush();
                    continue;
                }
                None => {
                    self.forget_other_threads_after_fork();
                    if self.growing {
                        return Err(Miss::Busy);
                    }
                    if may_grow {
                        if let Some(g) = self.plan_grow() {
                            return Err(Miss::Grow(g));
                        }
                    }
                    // The region cannot grow (the OS refused, or it is full). A run may still lie
                    // over free blocks end to end that no block of its order holds: the slow, whole
                    // look ([`Buddy::span_any`]) first, while their resident pages are there to reuse.
                    let spanned = if large { self.buddy.span_any(run, order) } else { None };
                    if spanned.is_some() {
                        spanned
                    } else {
                        // Nothing: purge every free page (a refusal then leaves as little resident
                        // as possible) and look once more.
                        if !purged && self.dirty_free() > 0 {
                            self.purge_all();
                            purged = true;
                            continue;
                        }
                        // Blocks out for purging may serve it once back.
                        if self.in_flight > 0 {
                            return Err(Miss::Busy);
                        }
                        None
                    }
                }
            };
            let Some((idx, flags)) = got else {
                stats::add(&COUNTERS.oom_refusals, 1);
                return Err(Miss::Refused);
            };
            // SAFETY: the block or run was just allocated and nobody else knows it.
            if flags & SEALED != 0 && !unsafe { os::protect(addr_of(idx) as *mut u8, bytes, true) } {
                // SAFETY: as above.
                unsafe { self.give_back(idx, order, run, flags) };
                stats::add(&COUNTERS.oom_refusals, 1);
                return Err(Miss::Refused);
            }
            let flags = flags & !SEALED;
            // Pages not resident yet will be faulted in.
            let fresh = bytes.saturating_sub(self.buddy.taken_dirty as usize * PAGE);
            if fresh > 0 && self.pool_n > 0 {
                // Resident pooled memory first: the free lists then hand out dirty blocks before
                // clean ones, and `make_room` sees the pool's bytes.
                // SAFETY: the block or run was just allocated above and nobody else knows it.
                unsafe { self.give_back(idx, order, run, flags) };
                self.pool_flush();
                continue;
            }
            self.reused += bytes - fresh;
            self.move_give = fresh.min(self.moving);
            if fresh > 0 {
                if flags & USED != 0 {
                    self.refaulted += fresh;
                } else {
                    self.grown += fresh;
                }
                self.make_room(fresh, bytes, batch);
            }
            if self.limit != 0 && self.os_bytes() > self.limit && !self.move_fits(idx, fresh) {
                // Given back in the state it was taken in: a refused clean block is not dirty.
                // SAFETY: the block or run was just allocated above and nobody else knows it.
                unsafe { self.give_back(idx, order, run, flags) };
                if !purged && self.dirty_free() > 0 {
                    self.purge_all();
                    purged = true;
                    continue;
                }
                stats::add(&COUNTERS.budget_refusals, 1);
                return Err(Miss::Refused);
            }
            self.note_peak();
            self.move_give = 0;
            self.decay(batch);
            return Ok((idx, flags));
        }
    }

    /// Whether `extra` more bytes from the OS fit the budget, purging every free page first if that
    /// makes them fit.
    fn budget_allows(&mut self, extra: usize) -> bool {
        if self.limit == 0 || self.os_bytes() + extra <= self.limit {
            return true;
        }
        self.purge_all();
        self.os_bytes() + extra <= self.limit
    }
}

/// Purges the free block of `order` at page `idx`, `dirty` bytes of which are dirty (under the
/// heap's lock or, taken out of the free lists by [`Buddy::take_dirty`], outside it). Under
/// `EDGEPOOL_SECURE` also makes it inaccessible (`SEALED`), so that a write after free into it faults
/// instead of landing in memory that will be handed out again. Returns the flags to add (`SEALED`
/// or none), or `None` if the OS refused.
fn purge_pages(idx: u32, order: u32, dirty: usize, secure: bool) -> Option<u8> {
    let len = 1usize << order;
    let p = addr_of(idx) as *mut u8;
    // SAFETY: the block is free (so dead) and inside the committed region; nobody else can take it
    // (it is on a free list under the lock, or taken out by take_dirty).
    if !unsafe { os::purge_heap(p, len) } {
        return None;
    }
    stats::add(&COUNTERS.purges, 1);
    stats::add(&COUNTERS.purged_bytes, dirty);
    // SAFETY: as above; the block is unsealed before it is handed out (`Inner::alloc`).
    Some(if secure && unsafe { os::protect(p, len, false) } { SEALED } else { 0 })
}

/// Fresh bytes from which an allocation (or a block grown in place) takes the resident pages of
/// the free blocks it purges to make room ([`PurgeBatch::fill`]), and a block that `realloc` moves
/// has its pages moved ([`move_out`]). Below, faulting pages in costs little more than the move's
/// system call and the mapping that each move adds (see [`os::move_pages`]).
const MOVE_MIN: usize = 1 << 20;

/// Fewest pages one move takes ([`PurgeBatch::fill`], [`move_into_holes`]): each move is a system
/// call and may add mappings, which a process has a limited number of (see [`os::move_pages`]).
const MOVE_RUN: usize = 16;

/// Most dirty blocks one decay takes out of the free lists to purge outside the lock.
const PURGE_BATCH: usize = 8;

/// Dirty blocks taken out of the free lists to be purged with the heap unlocked: page index, order,
/// flags, dirty bytes.
struct PurgeBatch {
    blocks: [(u32, u32, u8, usize); PURGE_BATCH],
    n: usize,
    /// Bytes still to purge when the batch filled up: [`PurgeBatch::run`] takes more.
    more: usize,
    /// The dirty free bytes that the purge which filled the batch keeps: [`PurgeBatch::run`] takes
    /// more only above them (`make_room` for a large request keeps less than `retain_now`).
    keep: usize,
    secure: bool,
    /// Where the pages of the blocks being purged may go instead ([`PurgeBatch::fill`]): the part
    /// of a block just allocated, not handed out yet, from `fill` to `fill_end` (page addresses;
    /// equal when there is none). `moved` counts the bytes moved there.
    fill: usize,
    fill_end: usize,
    moved: usize,
}

impl PurgeBatch {
    const fn new() -> Self {
        PurgeBatch {
            blocks: [(0, 0, 0, 0); PURGE_BATCH],
            n: 0,
            more: 0,
            keep: 0,
            secure: false,
            fill: 0,
            fill_end: 0,
            moved: 0,
        }
    }

    /// The next run of pages of the fill range that hold nothing resident: its address and length
    /// (within one look of `mincore`), or `None` when the range has no more (or `mincore` failed:
    /// then the range is dropped).
    #[inline(never)]
    fn next_hole(&mut self) -> Option<(usize, usize)> {
        let mut res = [0u8; 256];
        while self.fill < self.fill_end {
            let span = (self.fill_end - self.fill).min(res.len() * PAGE);
            let pages = span / PAGE;
            if !os::resident_pages(self.fill as *mut u8, span, &mut res) {
                break;
            }
            let mut h = 0;
            while h < pages {
                let end = run_end(&res[..pages], h);
                // Holes shorter than a move's least are left to fault in (one cut by the end of
                // this look, where the range goes on, is taken as it is).
                let long = end - h >= MOVE_RUN || (end == pages && self.fill + span < self.fill_end);
                if res[h] & 1 == 0 && long {
                    return Some((self.fill + h * PAGE, (end - h) * PAGE));
                }
                h = end;
            }
            self.fill += span;
        }
        self.fill_end = self.fill;
        None
    }

    /// Moves the resident pages of the free block of `len` bytes at `src` (taken out of the free
    /// lists for this batch) into the pages of the fill range that hold nothing resident, in address
    /// order, as far as the range has room (the block is purged after, so what stays goes then). A
    /// page moved there instead of purged here is one page fault fewer and one page fewer to zero,
    /// at the same resident set.
    #[inline(never)]
    fn fill(&mut self, src: usize, len: usize) {
        let mut res = [0u8; 256];
        let mut off = 0;
        while off < len {
            let span = (len - off).min(res.len() * PAGE);
            let pages = span / PAGE;
            if self.fill >= self.fill_end || !os::resident_pages((src + off) as *mut u8, span, &mut res) {
                return;
            }
            let mut i = 0;
            while i < pages {
                let end = run_end(&res[..pages], i);
                if res[i] & 1 == 0 {
                    i = end;
                    continue;
                }
                while i < end {
                    // A run of resident pages shorter than a move's least (but one cut by the end
                    // of this look, where the block goes on) stays, and the block's pages after it
                    // too.
                    if end - i < MOVE_RUN && (end < pages || off + span == len) {
                        return;
                    }
                    let Some((at, room)) = self.next_hole() else { return };
                    let n = ((end - i) * PAGE).min(room);
                    // SAFETY: `src + off + i * PAGE..` lies in a free block taken out of the free
                    // lists for this batch (nobody else can reach it, and what it holds is dead);
                    // `at..at + n` in the block being allocated, not handed out yet. Both are page
                    // aligned heap pages, and they do not overlap (one is free, the other taken).
                    if !unsafe { os::move_pages((src + off + i * PAGE) as *mut u8, at as *mut u8, n) } {
                        self.fill_end = self.fill;
                        return;
                    }
                    self.fill = at + n;
                    self.moved += n;
                    stats::add(&MOVED_BYTES, n);
                    i += n / PAGE;
                }
            }
            off += span;
        }
    }

    /// Purges the blocks (the heap unlocked) and puts them back on the free lists, clean, under the
    /// lock; a block the OS refused to purge goes back dirty. When the batch was too small for what
    /// was asked, takes the next blocks (as many as are still beyond the threshold) and goes on.
    fn run(&mut self) {
        while self.n > 0 {
            let mut flags = [0u8; PURGE_BATCH];
            for (k, f) in flags.iter_mut().enumerate().take(self.n) {
                let (idx, order, old, dirty) = self.blocks[k];
                if self.fill < self.fill_end {
                    // What must go may move into the block being allocated first.
                    self.fill(addr_of(idx), 1usize << order);
                }
                *f = match purge_pages(idx, order, dirty, self.secure) {
                    Some(extra) => (old & !DIRTY) | extra,
                    None => old,
                };
            }
            let refused = flags[..self.n].iter().any(|f| f & DIRTY != 0);
            with_heap(|h| {
                for (&f, &(idx, order, _, _)) in flags.iter().zip(&self.blocks[..self.n]) {
                    // SAFETY: taken by take_dirty for this batch and not put back since; purged
                    // unless `f` still says DIRTY.
                    unsafe { h.buddy.put_back(idx, order, f) };
                    h.in_flight -= 1 << order;
                }
                self.n = 0;
                let (more, keep) = (core::mem::take(&mut self.more), self.keep);
                if more > 0 && !refused && h.dirty_free() > keep {
                    h.purge_soon(more.min(h.dirty_free() - keep), keep, self);
                }
            });
        }
    }
}

/// Order of the smallest block holding `size` bytes at alignment `align` (≥ 4 KiB).
#[inline]
pub fn order_for(size: usize, align: usize) -> u32 {
    let need = size.max(align).max(PAGE);
    usize::BITS - (need - 1).leading_zeros()
}

/// Whether load phases prefault fresh large blocks (`EDGEPOOL_LOAD_PREFAULT`), read once at init.
#[inline]
pub fn load_prefault() -> bool {
    LOAD_PREFAULT.load(Ordering::Relaxed)
}

/// Size of the largest buddy block (0 before initialisation); larger requests are mapped directly.
#[inline]
pub fn max_block() -> usize {
    MAX_BLOCK.load(Ordering::Relaxed)
}

/// Runs `f` with the heap locked and a batch of blocks to purge, then purges them with the heap
/// unlocked.
fn with_heap_then_purge<R>(f: impl FnOnce(&mut Inner, &mut PurgeBatch) -> R) -> R {
    with_heap_then_purge_moved(f).0
}

/// [`with_heap_then_purge`], with the bytes the batch moved rather than purged
/// ([`PurgeBatch::fill`]).
fn with_heap_then_purge_moved<R>(f: impl FnOnce(&mut Inner, &mut PurgeBatch) -> R) -> (R, usize) {
    let mut batch = PurgeBatch::new();
    let r = with_heap(|h| f(h, &mut batch));
    batch.run();
    (r, batch.moved)
}

/// How often an allocation waits for another thread's growth or purge before it gives up (a
/// safeguard: those always finish, in microseconds to milliseconds).
const BUSY_RETRIES: usize = 100_000;

/// [`with_heap_then_purge`] for an allocation `f`: grows the region without the lock when `f` asks
/// for it, and waits (yielding) while another thread grows it or has blocks out for purging.
fn alloc_retrying<R>(mut f: impl FnMut(&mut Inner, bool, &mut PurgeBatch) -> Result<R, Miss>) -> Option<(R, usize)> {
    let mut may_grow = true;
    for _ in 0..BUSY_RETRIES {
        let (r, moved) = with_heap_then_purge_moved(|h, batch| f(h, may_grow, batch));
        match r {
            Ok(r) => return Some((r, moved)),
            Err(Miss::Refused) => return None,
            Err(Miss::Busy) => os::sleep_ns(20_000),
            Err(Miss::Grow(g)) => {
                let r = g.run();
                if with_heap(|h| h.finish_grow(g, r)) {
                    may_grow = false;
                }
            }
        }
    }
    None
}

/// Allocates a block of `order` and marks it `kind` (`Slab`, `Meta` or `Arena`; every page of a slab
/// or arena chunk is marked); `load` records that a load phase allocated it. Returns the address and
/// whether the memory may be dirty (not known zero).
pub fn alloc_block(order: u32, kind: PageKind, load: bool) -> Option<(*mut u8, bool)> {
    debug_assert!(matches!(kind, PageKind::Slab | PageKind::Meta | PageKind::Arena));
    if !ensure_init() {
        return None;
    }
    alloc_retrying(|h, may_grow, batch| {
        // Under EDGEPOOL_SECURE a slab takes a block twice its size: the slab, then a guard page
        // (inaccessible), then pages never touched. An overflow past the slab's last slot faults.
        let guard = kind == PageKind::Slab && h.secure;
        let pooled = if h.poolable(kind, order, load) { h.pool_take() } else { None };
        let (idx, flags) = match pooled {
            Some(taken) => taken,
            None => {
                let take = order + u32::from(guard);
                if take > h.buddy.top {
                    return Err(Miss::Refused);
                }
                h.alloc(take, kind, 0, may_grow, batch)?
            }
        };
        let n = 1u32 << (order - MIN_ORDER);
        // SAFETY: idx..idx+n are pages of the block just allocated, below the frontier.
        unsafe {
            h.buddy.entry_mut(idx).load = u8::from(load);
            if kind != PageKind::Meta {
                for i in 0..n {
                    let e = h.buddy.entry_mut(idx + i);
                    e.kind = kind;
                    e.load = u8::from(load);
                }
            }
        }
        let p = addr_of(idx) as *mut u8;
        if guard {
            // SAFETY: the page after the slab is inside the block just taken, which nobody uses. A
            // refusal (too many mappings) leaves the slab without its guard.
            unsafe { os::protect(p.add(1 << order), PAGE, false) };
        }
        if crate::valgrind::active() {
            // The block may have been a user's, freed (inaccessible to valgrind): now it is ours.
            crate::valgrind::defined(p, 1 << order);
        }
        Ok((p, flags & (DIRTY | USED) != 0))
    })
    .map(|(r, _)| r)
}

/// Allocates a large block: a run of whole pages holding `size` bytes at alignment `align` (both at
/// most [`max_block`]); `load` records that a load phase allocated it. Returns the address, the
/// run's flags (`buddy::DIRTY`: some pages are resident; `buddy::USED`: may read non-zero; neither:
/// fresh pages, known zero and not resident), the run's size, and the bytes of it already resident
/// (dirty pages reused).
pub fn alloc_large(size: usize, align: usize, load: bool) -> Option<(*mut u8, u8, usize, usize)> {
    alloc_large_moving(size, align, load, 0, None)
}

/// [`alloc_large`] for a block that `realloc` moves a live block of `moving` bytes into (then
/// [`move_out`], which gives the old block's pages back as the new one's fresh pages fault in, up to
/// `moving`): the peak of bytes taken from the OS, and a memory budget, count the new block without
/// as many of the old block's bytes, but for one piece, as the process never holds both whole.
pub fn alloc_large_moving(
    size: usize,
    align: usize,
    load: bool,
    moving: usize,
    fill_from: Option<usize>,
) -> Option<(*mut u8, u8, usize, usize)> {
    if !ensure_init() {
        return None;
    }
    let run = size.div_ceil(PAGE) as u32;
    let order = order_for(PAGE, align);
    alloc_retrying(|h, may_grow, batch| {
        if run as usize > (1usize << (h.buddy.top - MIN_ORDER)) || order > h.buddy.top {
            return Err(Miss::Refused);
        }
        let peak0 = h.peak;
        h.moving = moving;
        let took = h.alloc(order, PageKind::Large, run, may_grow, batch);
        h.moving = 0;
        let (idx, flags) = took?;
        let bytes = run as usize * PAGE;
        let resident = h.buddy.taken_dirty as usize * PAGE;
        h.large_bytes += bytes;
        // SAFETY: idx is the head just allocated.
        unsafe { h.buddy.entry_mut(idx).load = u8::from(load) };
        if moving > 0 {
            h.unpeak_move(peak0, (bytes - resident).min(moving));
        }
        if let Some(from) = fill_from {
            // The blocks purged to make room for this one's fresh pages move there instead.
            let from = (from & !(PAGE - 1)).min(bytes);
            if batch.n > 0 && bytes - from >= MOVE_MIN && resident < bytes && may_move(h) {
                batch.fill = addr_of(idx) + from;
                batch.fill_end = addr_of(idx) + bytes;
            }
        }
        Ok((addr_of(idx) as *mut u8, flags, bytes, resident))
    })
    .map(|((p, flags, bytes, resident), moved)| {
        // Moved pages hold what their block held: the block may read non-zero. (They went where no
        // page was resident, but the dirty pages counted in `resident` need not all be: at most
        // the block's bytes.)
        let flags = if moved > 0 { flags | USED | DIRTY } else { flags };
        (p, flags, bytes, (resident + moved).min(bytes))
    })
}

/// Bytes of pages moved between heap blocks ([`Stats::moved_bytes`]).
static MOVED_BYTES: AtomicUsize = AtomicUsize::new(0);

/// `EDGEPOOL_MOVE_PAGES`, published by [`ensure_init`]: off under valgrind, which would not know
/// where the moved pages' contents went.
static MOVE_PAGES: AtomicBool = AtomicBool::new(false);

/// Whether pages may move between heap blocks ([`os::move_pages`]).
fn moves_allowed() -> bool {
    MOVE_PAGES.load(Ordering::Relaxed)
}

/// Whether the blocks that the allocation under way purges may move into it instead: moves on, no
/// budget (which counts every byte as it goes) and no hardened mode (whose purged blocks are sealed).
fn may_move(h: &Inner) -> bool {
    moves_allowed() && !h.secure && h.limit == 0 && os::moves_possible()
}

/// Frees a block allocated by [`alloc_block`] or [`alloc_large`]. Returns whether a load phase
/// allocated it, and its size.
///
/// # Safety
/// - `p` was returned by [`alloc_block`] or [`alloc_large`] and not freed since; nothing uses it any
///   more.
pub unsafe fn free_block(p: *mut u8) -> (bool, usize) {
    with_heap_then_purge(|h, batch| {
        let idx = index_of(p as usize);
        // SAFETY: p is the head of an allocated block (caller's contract), so idx is below frontier.
        let e = unsafe { h.buddy.entry(idx) };
        let size = if e.kind == PageKind::Large {
            // SAFETY: a live run's head, given up by the caller.
            unsafe {
                let n = h.buddy.run_pages(idx);
                h.buddy.free_run(idx);
                h.large_bytes -= n as usize * PAGE;
                n as usize * PAGE
            }
        } else {
            let order = e.order as u32;
            if e.kind != PageKind::Meta {
                for i in 1..(1u32 << (order - MIN_ORDER)) {
                    // SAFETY: pages of the same block, below frontier.
                    unsafe { h.buddy.entry_mut(idx + i).kind = PageKind::Interior };
                }
            }
            // SAFETY: the head of an allocated slab block of a run-time slab, its other pages
            // Interior, given up (contract).
            if h.poolable(e.kind, order, e.load != 0) && unsafe { h.pool_put(idx) } {
                return (false, 1usize << order);
            }
            // A secure slab's block holds its guard page, still inaccessible (see `alloc_block`).
            let sealed = if e.kind == PageKind::Slab && h.secure { SEALED } else { 0 };
            // SAFETY: the caller gives the whole block up.
            unsafe { h.buddy.free(idx, order, DIRTY | sealed) };
            1usize << order
        };
        h.decay(batch);
        (e.load == RUN_LOAD, size)
    })
}

/// Pieces in which [`move_out`] copies a large block, giving each copied piece of the old block back
/// to the OS before the next is copied.
pub const MOVE_PIECE: usize = 1 << 20;

/// Large blocks from this size on that `realloc` moves are copied by [`move_out`].
pub const MOVE_OUT_MIN: usize = MOVE_PIECE;

/// `bytes` that count a block being moved and its old block, less the `give` bytes of the old one
/// that [`move_out`] gives back as the new one faults in, but for one piece (the piece copied before
/// it goes back): what the budget and the peak count for a move.
fn counted_once(bytes: usize, give: usize) -> usize {
    bytes.saturating_sub(give) + give.min(MOVE_PIECE)
}

/// Set when [`move_out`] could not give a piece back (`madvise` refused: pages locked by `mlockall`,
/// say): from then on a moved block is not counted once (see [`gives_back`]).
static GIVE_BACK_REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether [`move_out`] can be counted on to give the old block's pages back, so that the budget
/// and the peak may count a moved block once: the OS's pages are the heap's (4 KiB; with larger
/// ones a piece's start need not be one's, and nothing would go back), and no give-back was refused
/// yet. (A move that needs it to fit a budget probes first: [`Inner::move_fits`].)
pub fn gives_back() -> bool {
    os::os_page_size() == PAGE && !GIVE_BACK_REFUSED.load(Ordering::Relaxed)
}

/// Gives the page at `p` back to the OS as a probe of whether pages can be given back now; on a
/// refusal, no moved block is counted once any more ([`gives_back`]).
///
/// # Safety
/// - `[p, p + PAGE)` is a page of a block or mapping of ours that holds nothing yet.
pub unsafe fn probe_give_back(p: *mut u8) -> bool {
    // SAFETY: forwarded contract.
    unsafe { return_pages(p, PAGE) }
}

/// Returns `[p, p + len)` to the OS ([`os::purge`]); a refusal means no moved block is counted once
/// any more ([`gives_back`]).
///
/// # Safety
/// - as [`os::purge`].
unsafe fn return_pages(p: *mut u8, len: usize) -> bool {
    // SAFETY: forwarded contract.
    if unsafe { os::purge(p, len) } {
        return true;
    }
    GIVE_BACK_REFUSED.store(true, Ordering::Relaxed);
    false
}

/// Moves the first `len` bytes of the large block `p` to `q` and frees `p`. Where `q` is a heap
/// block and its pages hold nothing resident, `p`'s pages move there ([`move_into_holes`],
/// `EDGEPOOL_MOVE_PAGES`: no copy, no page fault; never into a direct mapping, which would be split
/// in two and could no longer grow by `mremap`, also where one lies in a hole of a lazy region);
/// elsewhere, and where pages cannot move, they are copied, and `p`'s pages go back to the OS piece
/// by piece as they are copied, until `give_back` bytes (the new block's fresh
/// pages, which fault in as they are written) went back: a block grown by moving then holds at the
/// peak its new size plus one piece, where a copy then a free held both (`scripts/grow-buffer.c`, a
/// buffer doubled to 128 MiB: 193.6 MiB at the peak before, 129.6 after). A new block of resident
/// free memory raises no peak, and the old block's pages stay resident for reuse. The freed block
/// goes to the free lists clean where its pages moved or went back (`USED`), dirty elsewhere.
/// Returns what [`free_block`] returns. Not under `EDGEPOOL_SECURE` (its purged pages are sealed;
/// the caller copies and frees there).
///
/// # Safety
/// - `p` is the head of a live large block (from [`alloc_large`]) that the caller gives up, `q` a
///   live block of at least `len` bytes, distinct from `p`, and `len` at most `p`'s size.
pub unsafe fn move_out(p: *mut u8, q: *mut u8, len: usize, give_back: usize) -> (bool, usize) {
    // Ranges of `p`'s pages that hold nothing any more (page offsets and counts): moved into `q`,
    // or given back to the OS.
    let mut gone = Gone { ranges: [(0, 0); GONE_RANGES], n: 0 };
    let mut off = 0usize;
    let whole = len & !(PAGE - 1);
    let in_heap = page_kind_off(q as usize).is_some_and(|(k, _)| k != PageKind::Outside);
    if whole >= MOVE_MIN && in_heap && moves_allowed() && os::moves_possible() {
        // SAFETY: forwarded contract.
        off = unsafe { move_into_holes(p, q, whole, &mut gone) };
    }
    let mut given = 0usize;
    while off < len {
        let n = (len - off).min(MOVE_PIECE);
        // SAFETY: both blocks are live and distinct, and hold `len` bytes (caller's contract); the
        // piece of `p` is ours (the block is given up, nothing else reads it) and no longer needed
        // once copied. A piece that cannot be given back ends the giving back.
        unsafe {
            core::ptr::copy_nonoverlapping(p.add(off), q.add(off), n);
            if given < give_back && gone.room(off) {
                given = if gone.give_back(p, off, n) { given + n } else { usize::MAX };
            }
        }
        off += n;
    }
    with_heap_then_purge(|h, batch| {
        let idx = index_of(p as usize);
        // SAFETY: p is the head of a live run given up by the caller; the pages of `gone` were given
        // back or moved out after their last write.
        let (load, n) = unsafe {
            let e = h.buddy.entry(idx);
            let n = h.buddy.run_pages(idx);
            h.buddy.free_run_cleaned(idx, gone.ranges());
            (e.load == RUN_LOAD, n as usize * PAGE)
        };
        h.large_bytes -= n;
        h.decay(batch);
        (load, n)
    })
}

/// Ranges of a block's pages that hold nothing any more ([`move_out`]): page offsets and counts,
/// in address order, a range that continues the last one joined to it.
struct Gone {
    ranges: [(u32, u32); GONE_RANGES],
    n: usize,
}

impl Gone {
    /// Whether a range from byte `off` can be recorded.
    fn room(&self, off: usize) -> bool {
        self.n < GONE_RANGES || self.joins(off)
    }

    fn joins(&self, off: usize) -> bool {
        self.n > 0 && {
            let (at, m) = self.ranges[self.n - 1];
            (at + m) as usize * PAGE == off
        }
    }

    /// Records `[off, off + len)` (whole pages; `room(off)` said yes).
    fn add(&mut self, off: usize, len: usize) {
        let pages = (len / PAGE) as u32;
        if self.joins(off) {
            self.ranges[self.n - 1].1 += pages;
        } else if self.n < GONE_RANGES {
            self.ranges[self.n] = ((off / PAGE) as u32, pages);
            self.n += 1;
        }
    }

    fn ranges(&self) -> &[(u32, u32)] {
        &self.ranges[..self.n]
    }

    /// Gives `[p + off, p + off + len)` back to the OS and records it (`room(off)` said yes), or
    /// says the OS refused (then nothing is recorded, and the pages keep what they held).
    ///
    /// # Safety
    /// - the range is whole pages of a large block of ours that nothing reads any more.
    unsafe fn give_back(&mut self, p: *mut u8, off: usize, len: usize) -> bool {
        // SAFETY: forwarded contract.
        if !unsafe { return_pages(p.add(off), len) } {
            return false;
        }
        self.add(off, len);
        stats::add(&COUNTERS.purges, 1);
        stats::add(&COUNTERS.purged_bytes, len);
        true
    }
}

/// The end of the run of pages from `i` that `mincore` saw all resident or all not (bit 0 of
/// each byte of `res`), at most `res.len()`.
fn run_end(res: &[u8], i: usize) -> usize {
    let resident = res[i] & 1;
    i + res[i..].iter().position(|r| r & 1 != resident).unwrap_or(res.len() - i)
}

/// The part of [`move_out`] where pages may move, over `q`'s first `whole` bytes, run by run of
/// its pages: where they hold nothing resident, `p`'s pages move there (a run of at least
/// [`MOVE_RUN`] pages), or are copied and given back (as the copy faults `q`'s pages in); where
/// they are resident (free memory reused), a copy, and `p`'s pages there stay resident, free.
/// Returns how far it went (all of `whole` unless `mincore` failed: the rest is the caller's).
/// (Out of line, in the library's cold code with the rest of the moves.)
///
/// # Safety
/// - as [`move_out`]; `q` is a heap block (in the region); `whole` is a multiple of [`PAGE`], at most `len`.
#[cold]
#[inline(never)]
unsafe fn move_into_holes(p: *mut u8, q: *mut u8, whole: usize, gone: &mut Gone) -> usize {
    let mut res = [0u8; 256];
    let mut off = 0;
    while off < whole {
        let span = (whole - off).min(res.len() * PAGE);
        let pages = span / PAGE;
        // SAFETY: `q..q + whole` is a live block of ours; mincore only reads the page tables.
        if !os::resident_pages(unsafe { q.add(off) }, span, &mut res) {
            break;
        }
        let mut i = 0;
        while i < pages {
            let hole = res[i] & 1 == 0;
            let end = run_end(&res[..pages], i);
            let (at, n) = (off + i * PAGE, (end - i) * PAGE);
            // SAFETY: both blocks are live, page aligned and distinct, and hold `whole` bytes
            // (caller's contract); nothing uses `q` yet, nor `p` any more: `p`'s pages may move out
            // or go back once copied, and a hole of `q` holds nothing to keep.
            unsafe {
                if hole && n >= MOVE_RUN * PAGE && gone.room(at) && os::move_pages(p.add(at), q.add(at), n) {
                    gone.add(at, n);
                    stats::add(&MOVED_BYTES, n);
                } else {
                    core::ptr::copy_nonoverlapping(p.add(at), q.add(at), n);
                    if hole && gone.room(at) {
                        gone.give_back(p, at, n);
                    }
                }
            }
            i = end;
        }
        off += span;
    }
    off
}

/// Most ranges of pages that [`move_out`] records as gone (beyond, it copies and keeps them).
const GONE_RANGES: usize = 32;

/// `PageEntry::load` of a live large block's head: allocated outside a load phase.
pub const RUN_LIVE: u8 = 0;
/// `PageEntry::load` of a live block's head: allocated inside a load phase.
pub const RUN_LOAD: u8 = 1;
/// `PageEntry::load` of a large block's head: held in a thread's run cache (`cache::runs`), not
/// handed out.
pub const RUN_CACHED: u8 = 2;

/// Whether a memory budget is set (read lock-free by the thread run caches, which stay off under one).
static BUDGETED: AtomicBool = AtomicBool::new(false);

/// Whether a memory budget is set.
#[inline]
pub fn budgeted() -> bool {
    BUDGETED.load(Ordering::Relaxed)
}

/// `EDGEPOOL_SECURE`, published at initialisation (thread run caches stay off in the hardened mode:
/// a freed run kept resident and accessible would let a write after free land unnoticed).
static SECURE: AtomicBool = AtomicBool::new(false);

/// Whether the hardened mode (`EDGEPOOL_SECURE`) is on.
#[inline]
pub fn secure() -> bool {
    SECURE.load(Ordering::Relaxed)
}

/// Marks the head of the large block `p` as live again ([`RUN_LIVE`]) or held in a run cache
/// ([`RUN_CACHED`]).
///
/// # Safety
/// - `p` is the head of a large block allocated outside a load phase, owned by the caller (live, or
///   in the caller's run cache).
pub unsafe fn set_run_state(p: *mut u8, state: u8) {
    // SAFETY: the head entry of a live run is only written by its owner (contract); `p` is in the
    // region.
    unsafe { (*page_entry(p as usize)).load = state }
}

/// Whether the large block whose head is `p` sits in a run cache: freeing it is a double free.
///
/// # Safety
/// - `p` is the head of a large block (live or cached) in the region.
pub unsafe fn is_run_cached(p: *mut u8) -> bool {
    // SAFETY: as `is_load_block`: a head entry, read by the thread that frees it.
    unsafe { (*page_entry(p as usize)).load == RUN_CACHED }
}

/// Whether a load phase allocated the large block whose head is `p`.
///
/// # Safety
/// - `p` is the head of a live large block (from [`alloc_large`]) owned by the caller.
pub unsafe fn is_load_block(p: *mut u8) -> bool {
    // SAFETY: the head entry of a live run is only written by its owner (caller's contract); `p` is
    // in the region.
    unsafe { (*page_entry(p as usize)).load == RUN_LOAD }
}

/// Size in bytes of the large block whose head is `p`.
///
/// # Safety
/// - `p` is the head of a live large block (from [`alloc_large`]).
pub unsafe fn block_size(p: *mut u8) -> usize {
    // SAFETY: the head entry of a live run is only written by its owner.
    unsafe { (*page_entry(p as usize)).next as usize * PAGE }
}

/// Tries to resize the large block at `p` to hold `new_size` bytes without moving it. Returns the new
/// size of the block, or `None` when the pages after it are not free (or the budget refuses).
///
/// # Safety
/// - `p` is the head of a live large block owned by the caller.
pub unsafe fn resize_in_place(p: *mut u8, new_size: usize) -> Option<usize> {
    let m = new_size.div_ceil(PAGE);
    with_heap_then_purge(|h, batch| {
        if m > (1usize << (h.buddy.top - MIN_ORDER)) {
            return None;
        }
        let idx = index_of(p as usize);
        // SAFETY: idx is a live run's head (caller's contract).
        let n = unsafe { h.buddy.run_pages(idx) } as usize;
        if m == n {
            return Some(m * PAGE);
        }
        // Budget: growing adds at most its new pages to the OS bytes (claimed dirty pages add none).
        // Checked before anything changes, so a refusal leaves the heap exactly as it was.
        if m > n && h.limit != 0 && h.os_bytes() + (m - n) * PAGE > h.limit {
            stats::add(&COUNTERS.budget_refusals, 1);
            return None;
        }
        let (free0, dirty0) = (h.buddy.free_bytes, h.buddy.dirty_bytes);
        // SAFETY: a live run's head owned by the caller; m >= 1 (new_size >= 1).
        if !unsafe { h.buddy.resize_run(idx, m as u32) } {
            return None;
        }
        h.large_bytes = h.large_bytes + m * PAGE - n * PAGE;
        if m < n {
            h.decay(batch);
            return Some(m * PAGE);
        }
        // SAFETY: the pages just claimed are the caller's now; under EDGEPOOL_SECURE they may have
        // been sealed when purged. A refusal gives them back.
        if h.secure && !unsafe { os::protect(p.add(n * PAGE), (m - n) * PAGE, true) } {
            // SAFETY: the run's head, owned by the caller, shrunk back to what it was; the pages claimed
            // go back as they are: maybe inaccessible.
            unsafe {
                h.buddy.entry_mut(idx).next = n as u32;
                h.buddy.release_range(idx + n as u32, idx + m as u32, SEALED | USED);
            }
            h.large_bytes = h.large_bytes + n * PAGE - m * PAGE;
            return None;
        }
        // Clean pages claimed fault in when used: make room as for any clean allocation (what must
        // leave the resident set may move into them instead).
        let clean = (free0 - h.buddy.free_bytes).saturating_sub(dirty0 - h.buddy.dirty_bytes);
        if clean > 0 {
            h.pool_flush();
            h.make_room(clean, m * PAGE, batch);
            if batch.n > 0 && clean >= MOVE_MIN && may_move(h) {
                batch.fill = p as usize + n * PAGE;
                batch.fill_end = p as usize + m * PAGE;
            }
        }
        h.note_peak();
        Some(m * PAGE)
    })
}

/// Returns every free heap page to the OS. Returns the bytes purged.
pub fn trim() -> usize {
    if !is_ready() {
        return 0;
    }
    with_heap(|h| {
        let purged = h.purge_all();
        // The high-water mark that on-demand purging keeps starts again from here (a load phase's
        // end comes through here too).
        h.run_high = h.settled_bytes();
        h.run_in_use_high = h.in_use();
        h.refaulted = 0;
        h.reused = 0;
        h.grown = 0;
        purged
    })
}

/// Largest piece [`prefault_free`] takes at a time: the heap lock is not held while it faults in.
const PREFAULT_PIECE: usize = 2 << 20;

/// Faults in `bytes` (rounded up to pages) of free heap memory, so that the next allocations (which
/// take resident free memory first) land on resident pages, and from then on keeps that much free
/// memory resident instead of purging it (until `prefault_free(0)`; `trim()` and a load phase's end
/// still purge everything free once). Takes resident free blocks first, then clean ones, growing the
/// heap if needed, within the budget. Returns the bytes made resident (less than asked when the
/// budget or the OS refused).
///
/// The pieces are taken as large blocks, faulted in with the heap unlocked, and freed (dirty).
pub fn prefault_free(bytes: usize) -> usize {
    if !ensure_init() {
        return 0;
    }
    let want = bytes.next_multiple_of(PAGE);
    with_heap(|h| h.warm = want);
    let piece = PREFAULT_PIECE.min(max_block());
    let mut head: *mut u8 = core::ptr::null_mut();
    let mut done = 0;
    while done < want {
        let Some((p, _, len, _)) = alloc_large(piece.min(want - done), PAGE, false) else {
            break;
        };
        // SAFETY: the run was just allocated for us, mapped read-write, and nobody else knows it.
        unsafe {
            os::prefault(p, len);
            // The pieces are chained through their first word until they are all taken.
            p.cast::<*mut u8>().write(head);
        }
        head = p;
        done += len;
    }
    while !head.is_null() {
        // SAFETY: each piece of the chain is a live run from alloc_large, its first word the next.
        unsafe {
            let next = head.cast::<*mut u8>().read();
            free_block(head);
            head = next;
        }
    }
    done
}

/// Sets the memory budget (0 = none). Takes effect for the next request.
pub fn set_limit(bytes: usize) {
    ensure_init();
    with_heap(|h| h.limit = bytes);
    BUDGETED.store(bytes != 0, Ordering::Relaxed);
}

/// The statistics report: the heap's figures (under its lock) and the counters.
pub fn stats() -> Stats {
    let calls = &os::OS_CALLS;
    let mut s = Stats {
        counters: COUNTERS.snapshot(),
        os_mmap_calls: calls.mmap.load(Ordering::Relaxed),
        os_munmap_calls: calls.munmap.load(Ordering::Relaxed),
        os_madvise_calls: calls.madvise.load(Ordering::Relaxed),
        os_mprotect_calls: calls.mprotect.load(Ordering::Relaxed),
        os_mremap_calls: calls.mremap.load(Ordering::Relaxed),
        page_faults: os::page_faults() as usize,
        moved_bytes: MOVED_BYTES.load(Ordering::Relaxed),
        ..Stats::default()
    };
    if is_ready() {
        with_heap(|h| {
            s.os_bytes = h.os_bytes();
            s.peak_os_bytes = h.peak;
            s.committed_bytes = h.buddy.committed_pages() as usize * PAGE;
            s.free_bytes = h.buddy.free_bytes + h.pooled();
            s.dirty_free_bytes = h.dirty_free();
            s.limit_bytes = h.limit;
            s.in_use_bytes = h.in_use();
            s.peak_in_use_bytes = h.peak_in_use.max(s.in_use_bytes);
            s.large_bytes = h.large_bytes;
        });
    }
    stats::complete(&mut s);
    s
}

/// Runs `then` under the heap lock if `extra` more bytes from the OS fit the budget (purging every
/// free page first if that makes them fit), so that nothing else takes the room meanwhile, and notes
/// the peak afterwards. `then` may take only locks that come after the heap's in the lock order
/// (`sync`), and returns `None` when it did not take the memory after all. A refusal by the budget is
/// counted and returns `None`.
pub fn with_budget<R>(extra: usize, then: impl FnOnce() -> Option<R>) -> Option<R> {
    if !ensure_init() {
        return None;
    }
    with_heap(|h| {
        if !h.budget_allows(extra) {
            stats::add(&COUNTERS.budget_refusals, 1);
            return None;
        }
        let r = then();
        h.note_peak();
        r
    })
}

/// Whether a direct mapping of `len` bytes fits the budget ([`Inner::budget_allows`]), for one that
/// a block of `moving` bytes which `realloc` moves goes into: `Some(false)` when it fits as any
/// mapping, `Some(true)` when it fits only counted with the old block's pages given back as it is
/// copied (the caller then probes the new mapping: [`probe_give_back`]), `None` (a refusal, counted)
/// otherwise.
pub fn budget_allows_moving(len: usize, moving: usize) -> Option<bool> {
    if !ensure_init() {
        return None;
    }
    let give = len.min(moving);
    let r = with_heap(|h| {
        if h.budget_allows(len) {
            Some(false)
        } else if give > 0 && h.budget_allows(counted_once(len, give)) {
            Some(true)
        } else {
            None
        }
    });
    if r.is_none() {
        stats::add(&COUNTERS.budget_refusals, 1);
    }
    r
}

/// Records a new peak of the OS bytes if the present figure is one (after direct mappings grew).
pub fn note_peak() {
    if is_ready() {
        with_heap(|h| h.note_peak());
    }
}

/// Resets the peak to the current figure and returns it (phase reports).
pub fn reset_peak() -> usize {
    if !ensure_init() {
        return 0;
    }
    with_heap(|h| {
        h.peak = h.os_bytes();
        h.peak
    })
}

/// [`Inner::unpeak_move`] for a block that `realloc` moved into a direct mapping: the peak was
/// `peak0` before the mapping was made, and `give` bytes of the old block go back as it is copied.
pub fn unpeak_move(peak0: usize, give: usize) {
    if is_ready() {
        with_heap(|h| h.unpeak_move(peak0, give));
    }
}

/// The peak of bytes taken from the OS since the last [`reset_peak`].
pub fn peak() -> usize {
    if !is_ready() {
        return 0;
    }
    with_heap(|h| h.peak)
}

/// Checks the buddy heap's invariants (tests, debug), and the page map's kinds against them.
pub fn check() -> Result<(), &'static str> {
    if !is_ready() {
        return Ok(());
    }
    with_heap(|h| {
        let runs = h.buddy.check_counting_runs()?;
        if runs != h.large_bytes {
            return Err("large_bytes differs from the runs in the page map");
        }
        h.check_pool()
    })
}

impl Inner {
    /// The invariants of `pool`.
    fn check_pool(&self) -> Result<(), &'static str> {
        if self.pool_n > POOL_MAX {
            return Err("the slab pool holds more than POOL_MAX blocks");
        }
        for (k, &idx) in self.pool[..self.pool_n].iter().enumerate() {
            if self.pool[..k].contains(&idx) {
                return Err("a slab block is in the pool twice");
            }
            if idx >= self.buddy.frontier || idx % (1 << (SLAB_SHIFT - MIN_ORDER)) != 0 {
                return Err("a pooled block is not an aligned block below the frontier");
            }
            // SAFETY: below the frontier (checked).
            let head = unsafe { self.buddy.entry(idx) };
            if head.kind != PageKind::Meta || head.order as u32 != SLAB_SHIFT || head.load != 0 {
                return Err("a pooled block's head is not an unloaded Meta block of the slab order");
            }
            for i in 1..1u32 << (SLAB_SHIFT - MIN_ORDER) {
                // SAFETY: pages of the block, below the frontier.
                if unsafe { self.buddy.entry(idx + i) }.kind != PageKind::Interior {
                    return Err("a pooled block has a page that is not Interior");
                }
            }
        }
        Ok(())
    }
}

/// Slab blocks in the pool (tests).
#[cfg(test)]
fn pool_len() -> usize {
    with_heap(|h| h.pool_n)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Other unit tests share the heap and run at the same time: these tests assert only on blocks they
    // own, never on heap-wide figures.

    #[test]
    fn large_runs_hold_whole_pages_and_are_marked_in_the_page_map() {
        let (p, _, bytes, _) = alloc_large(5 * PAGE + 1, PAGE, false).unwrap();
        assert_eq!(bytes, 6 * PAGE);
        assert_eq!(p as usize % PAGE, 0);
        assert_eq!(page_kind(p as usize), Some(PageKind::Large));
        assert_eq!(page_kind(p as usize + PAGE), Some(PageKind::Interior));
        // SAFETY: a live large block owned by this test, freed once at the end.
        unsafe {
            assert_eq!(block_size(p), 6 * PAGE);
            assert!(!is_load_block(p));
            p.write_bytes(7, bytes);
            // Shrinking in place always works; growing works when the pages after it are free.
            assert_eq!(resize_in_place(p, 2 * PAGE), Some(2 * PAGE));
            assert_eq!(block_size(p), 2 * PAGE);
            if let Some(n) = resize_in_place(p, 3 * PAGE) {
                assert_eq!(n, 3 * PAGE);
            }
            assert!(*p.add(2 * PAGE - 1) == 7, "shrinking kept the data");
            let (load, size) = free_block(p);
            assert!(!load);
            assert!(size >= 2 * PAGE);
        }
        check().unwrap();
    }

    /// The slab pool, in a child process of its own (the other unit tests share the heap).
    #[test]
    fn freed_slab_blocks_wait_in_a_bounded_pool_emptied_before_purges_and_fresh_pages() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["heap::tests::child_slab_pool", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    #[ignore = "run by freed_slab_blocks_wait_in_a_bounded_pool_emptied_before_purges_and_fresh_pages"]
    fn child_slab_pool() {
        let slab = || alloc_block(SLAB_SHIFT, PageKind::Slab, false).unwrap().0;
        let figures = || with_heap(|h| (h.in_use(), h.dirty_free()));
        let n = POOL_MAX + 8;
        let blocks: Vec<*mut u8> = (0..n).map(|_| slab()).collect();
        for &b in &blocks {
            // SAFETY: our own block: its pages are resident once written.
            unsafe { b.write_bytes(1, 1 << SLAB_SHIFT) };
        }
        let (used0, dirty0) = figures();
        for &b in &blocks {
            // SAFETY: each block is ours and freed once.
            unsafe { free_block(b) };
        }
        check().unwrap();
        assert_eq!(pool_len(), POOL_MAX, "the pool keeps at most POOL_MAX blocks");
        // Pooled blocks are neither in use nor hidden: they count as free and dirty.
        let (used1, dirty1) = figures();
        assert_eq!(used0 - used1, n << SLAB_SHIFT);
        assert!(dirty1 >= dirty0 + (n << SLAB_SHIFT), "{dirty0} -> {dirty1}");
        // The first POOL_MAX freed are pooled (the rest went to the free lists). A pointer into a
        // pooled block is not a live slab's.
        let last = blocks[POOL_MAX - 1];
        assert_eq!(page_kind(last as usize), Some(PageKind::Meta));
        assert_eq!(page_kind(last as usize + PAGE), Some(PageKind::Interior));
        // The next slab is the block pooled last, whole, marked as a slab again; a load phase's slab
        // never comes from the pool.
        let again = slab();
        assert_eq!(again, last);
        for i in 0..1 << (SLAB_SHIFT - MIN_ORDER) {
            assert_eq!(page_kind(again as usize + i * PAGE), Some(PageKind::Slab));
        }
        let (load, _) = alloc_block(SLAB_SHIFT, PageKind::Slab, true).unwrap();
        assert!(!blocks[..POOL_MAX].contains(&load), "a load slab came from the pool");
        assert_eq!(pool_len(), POOL_MAX - 1);
        // SAFETY: ours, freed once; a load slab's block is not pooled.
        unsafe { free_block(load) };
        assert_eq!(pool_len(), POOL_MAX - 1);
        check().unwrap();
        // A request that would fault fresh pages in takes the pooled memory first.
        let (big, _, _, resident) = alloc_large(POOL_MAX << SLAB_SHIFT, PAGE, false).unwrap();
        assert_eq!(pool_len(), 0);
        assert!(resident > 0, "the pooled blocks' resident pages were not reused");
        // SAFETY: ours, freed once.
        unsafe { free_block(big) };
        // SAFETY: ours, freed once.
        unsafe { free_block(again) };
        assert_eq!(pool_len(), 1);
        // trim() gives everything free back, the pool included.
        trim();
        assert_eq!(pool_len(), 0);
        assert_eq!(figures().1, 0);
        check().unwrap();
    }

    #[test]
    fn slab_blocks_mark_every_page_and_load_blocks_say_so() {
        let (p, _) = alloc_block(16, PageKind::Slab, true).unwrap();
        assert_eq!(p as usize % (1 << 16), 0);
        for i in 0..16 {
            assert_eq!(page_kind(p as usize + i * PAGE), Some(PageKind::Slab));
        }
        // SAFETY: the block is ours and freed once.
        let (load, size) = unsafe { free_block(p) };
        assert!(load);
        assert_eq!(size, 1 << 16);
        let (q, _, _, _) = alloc_large(PAGE, PAGE, true).unwrap();
        // SAFETY: a live large block of ours, freed once.
        unsafe {
            assert!(is_load_block(q));
            assert!(free_block(q).0);
        }
        check().unwrap();
    }

    #[test]
    fn requests_beyond_the_budget_or_the_top_block_are_refused() {
        assert!(alloc_large(max_block() + 1, PAGE, false).is_none());
        assert!(alloc_block(40, PageKind::Meta, false).is_none());
        let refusals = COUNTERS.budget_refusals.load(Ordering::Relaxed);
        // No limit is set in unit tests: everything fits but what no limit can hold.
        assert_eq!(with_budget(PAGE, || Some(1)), Some(1));
        set_limit(usize::MAX / 4);
        assert_eq!(with_budget(usize::MAX / 2, || Some(1)), None);
        set_limit(0);
        assert!(COUNTERS.budget_refusals.load(Ordering::Relaxed) > refusals);
    }

    #[test]
    fn the_first_top_block_grows_in_doubling_pieces_that_merge_into_it() {
        let top = 26;
        let (mut idx, mut orders) = (0u32, vec![]);
        while idx < 3 << (top - MIN_ORDER) {
            let o = growth_order(idx, top, false);
            assert_eq!(idx % (1 << (o - MIN_ORDER)), 0, "a piece of order {o} at page {idx} is not aligned");
            orders.push(o);
            idx += 1 << (o - MIN_ORDER);
        }
        assert_eq!(orders, [21, 21, 22, 23, 24, 25, 26, 26]);
        assert_eq!(growth_order(0, 20, false), 20, "a top block below the first piece comes whole");
        assert_eq!(growth_order(1 << 14, 26, true), 21, "a lazy region grows in its pieces");
        // Added at the frontier one after the other, free, they are one top block.
        let mut map =
            vec![PageEntry { kind: PageKind::Interior, order: 0, flags: 0, load: 0, prev: 0, next: 0 }; 1 << 14];
        let mut bits = vec![0u64; buddy::bitmap_words(1 << 14)];
        let mut b = Buddy::empty();
        // SAFETY: the map and bitmap cover the 2^14 pages of one top block of order 26, and live
        // as long as `b`, which only this test uses.
        unsafe {
            b.init(map.as_mut_ptr(), bits.as_mut_ptr(), top);
            let mut idx = 0;
            for &o in &orders[..6] {
                b.add_block(idx, o);
                idx += 1 << (o - MIN_ORDER);
            }
        }
        b.check().unwrap();
        assert_eq!((b.frontier, b.free_bytes), (1 << 14, 64 << 20));
        assert_eq!(b.alloc(top, PageKind::Meta).map(|(i, _)| i), Some(0), "the pieces merged into one top block");
    }

    #[test]
    fn order_for_is_the_smallest_holding_block() {
        assert_eq!(order_for(1, 1), 12);
        assert_eq!(order_for(PAGE, PAGE), 12);
        assert_eq!(order_for(PAGE + 1, 16), 13);
        assert_eq!(order_for(100, 1 << 20), 20);
    }
}
