//! The global heap: one reserved region of address space, carved into buddy blocks, plus direct OS
//! mappings for requests beyond the largest block.
//!
//! Layout: the region `[base, base + span)` is aligned to the top block size and reserved without
//! access; it is committed (made read-write) one top block at a time as the heap grows, and pages are
//! only faulted in when touched. A side *page map* (one [`PageEntry`] per 4 KiB page, in its own lazily
//! touched mapping) records every block's order and kind, so a pointer's owner is found with one range
//! check and one load, and large blocks stay page aligned at no cost in user memory.
//!
//! Concurrency: the buddy structure is guarded by `HEAP.lock`; direct mappings by `DIRECT.lock`. The
//! region bounds and the page map pointer are published once at initialisation and read lock-free.
//!
//! Large blocks are *runs* of whole pages: a request takes the smallest buddy block that holds it and
//! gives the pages beyond the request straight back as smaller free blocks, so a 40 MiB tensor holds
//! 40 MiB (not 64), and the OS bytes, the budget and the phase report count what is really taken.
//!
//! Memory return policy: freed blocks stay resident ("dirty"), and allocation takes dirty blocks before
//! clean ones, so a freed temporary is reused without page faults. Only blocks in the same state
//! merge, so `dirty_bytes` is what may be resident (all of a freed block counts, touched or not).
//! Dirty memory goes back to the OS, smallest blocks first, in three ways:
//! - *on demand*: when an allocation must take clean memory (which faults new pages in) while the
//!   dirty free bytes exceed the threshold, as much dirty memory is purged first, so the resident set
//!   does not grow while freed memory waits for reuse;
//! - *by decay*: dirty bytes beyond the threshold that stay so for `EDGEPOOL_PURGE_DELAY`
//!   milliseconds (checked on every heap operation) are purged; a delay of 0 purges at free;
//! - *at once*: `trim()`, and the end of a load phase, purge everything free.
//!
//! The threshold is `EDGEPOOL_RETAIN`, or `EDGEPOOL_LOAD_RETAIN` while a load phase is open.

use core::cell::UnsafeCell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use crate::buddy::{self, Buddy, PageEntry, DIRTY, MIN_ORDER};
use crate::options::{self, Values};
use crate::os::{self, PAGE};
use crate::stats::{bump, drop_by, Stats, COUNTERS};
use crate::sync::RawLock;

const UNINIT: u8 = 0;
const READY: u8 = 1;
const FAILED: u8 = 2;

/// Region bounds and page map, published once by [`init`] and read lock-free by every `free`. Before
/// that `span == 0`, so no pointer is "in the heap". One cache line, read-mostly.
#[repr(C, align(64))]
struct Region {
    base: AtomicUsize,
    span: AtomicUsize,
    map: AtomicPtr<PageEntry>,
}

static REGION: Region =
    Region { base: AtomicUsize::new(0), span: AtomicUsize::new(0), map: AtomicPtr::new(core::ptr::null_mut()) };
static STATE: AtomicU8 = AtomicU8::new(UNINIT);
/// Size of the largest buddy block, published by [`init`] (0 before).
static MAX_BLOCK: AtomicUsize = AtomicUsize::new(0);
/// `EDGEPOOL_LOAD_PREFAULT`, published by [`init`].
static LOAD_PREFAULT: AtomicBool = AtomicBool::new(false);

struct Inner {
    buddy: Buddy,
    opts: Values,
    retain: usize,
    load_retain: usize,
    /// `EDGEPOOL_PURGE_DELAY` in nanoseconds.
    purge_delay: u64,
    /// When the dirty free bytes last rose above the threshold (0: they are within it).
    over_since: u64,
    limit: usize,
    peak: usize,
}

/// The buddy heap and its lock.
struct Heap {
    lock: RawLock,
    inner: UnsafeCell<Inner>,
}

// SAFETY: `inner` is only accessed while `lock` is held (see `with_heap`).
unsafe impl Sync for Heap {}

static HEAP: Heap = Heap {
    lock: RawLock::new(),
    inner: UnsafeCell::new(Inner { buddy: Buddy::empty(), opts: Values::defaults(), retain: 0, load_retain: 0, purge_delay: 0, over_since: 0, limit: 0, peak: 0 }),
};

/// Runs `f` with the heap locked.
fn with_heap<R>(f: impl FnOnce(&mut Inner) -> R) -> R {
    HEAP.lock.lock();
    // SAFETY: the lock is held, so this is the only reference to `inner`.
    let r = f(unsafe { &mut *HEAP.inner.get() });
    HEAP.lock.unlock();
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
    let mut did_init = false;
    let ok = with_heap(|h| {
        match STATE.load(Ordering::Acquire) {
            READY => return true,
            FAILED => return false,
            _ => {}
        }
        let mut opts = Values::defaults();
        os::for_each_option(|name, value| {
            if opts.apply(name, value).is_err() {
                let mut m = os::MsgBuf::new();
                m.str("edgepool: ignoring bad value of EDGEPOOL_");
                m.str(core::str::from_utf8(name).unwrap_or("?"));
                m.str(", keeping the default\n");
                os::write_stderr(m.as_bytes());
            }
        });
        let top_size = opts.get(options::MAX_BLOCK) as usize;
        let top = top_size.trailing_zeros();
        let mut span = (opts.get(options::RESERVE) as usize).max(top_size) & !(top_size - 1);
        let mut raw;
        loop {
            raw = os::reserve(span + top_size);
            if !raw.is_null() || span <= top_size {
                break;
            }
            span /= 2;
        }
        if raw.is_null() {
            STATE.store(FAILED, Ordering::Release);
            return false;
        }
        // Align the region to the top block size and give back the slack at both ends.
        let base = (raw as usize + top_size - 1) & !(top_size - 1);
        // SAFETY: head and tail slack lie inside the reservation just made and hold nothing.
        unsafe {
            if base > raw as usize {
                os::unmap(raw, base - raw as usize);
            }
            let tail = raw as usize + span + top_size - (base + span);
            if tail > 0 {
                os::unmap((base + span) as *mut u8, tail);
            }
        }
        let npages = span / PAGE;
        let map_bytes = (npages * core::mem::size_of::<PageEntry>() + PAGE - 1) & !(PAGE - 1);
        let map = os::map(map_bytes) as *mut PageEntry;
        if map.is_null() {
            STATE.store(FAILED, Ordering::Release);
            return false;
        }
        // SAFETY: `map` is a fresh zeroed mapping covering every page of the region; top is within
        // MIN_ORDER..=MAX_ORDER_LIMIT by option validation (256 KiB ..= 1 GiB).
        unsafe { h.buddy.init(map, top) };
        h.opts = opts;
        h.retain = opts.get(options::RETAIN) as usize;
        h.load_retain = opts.get(options::LOAD_RETAIN) as usize;
        h.purge_delay = opts.get(options::PURGE_DELAY).saturating_mul(1_000_000);
        h.limit = opts.get(options::LIMIT) as usize;
        MAX_BLOCK.store(top_size, Ordering::Relaxed);
        LOAD_PREFAULT.store(opts.get(options::LOAD_PREFAULT) != 0, Ordering::Relaxed);
        REGION.base.store(base, Ordering::Relaxed);
        REGION.map.store(map, Ordering::Relaxed);
        REGION.span.store(span, Ordering::Relaxed);
        STATE.store(READY, Ordering::Release);
        did_init = true;
        true
    });
    if did_init {
        post_init();
    }
    ok
}

/// Work done once after the heap is ready, outside the heap lock, because it may call into libc
/// functions that allocate (which then re-enter a ready allocator).
fn post_init() {
    // SAFETY: the handlers are `extern "C"` functions that take the allocator's locks in a fixed order.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    let o = options();
    if o.get(options::VERBOSE) != 0 {
        print_banner();
    }
    if o.get(options::STATS) != 0 {
        // SAFETY: `print_stats_at_exit` is an `extern "C"` function that does not unwind.
        unsafe { libc::atexit(print_stats_at_exit) };
    }
    crate::phase::startup(&o);
}

extern "C" fn print_stats_at_exit() {
    crate::c_api::write_stats(2);
}

/// The options in effect (defaults before initialisation).
pub fn options() -> Values {
    if !is_ready() {
        return Values::defaults();
    }
    with_heap(|h| h.opts)
}

fn print_banner() {
    let o = options();
    let mut m = os::MsgBuf::new();
    m.str("edgepool ").str(env!("CARGO_PKG_VERSION")).str(" active (");
    m.str(if cfg!(debug_assertions) { "debug" } else { "release" }).str(" build)\n");
    os::write_stderr(m.as_bytes());
    for (i, def) in options::OPTIONS.iter().enumerate() {
        let mut m = os::MsgBuf::new();
        m.str("  EDGEPOOL_").str(def.name).str("=").num(o.get(i)).str("\n");
        os::write_stderr(m.as_bytes());
    }
}

/// Whether `p` lies inside the heap region.
#[inline(always)]
pub fn in_region(p: usize) -> bool {
    p.wrapping_sub(REGION.base.load(Ordering::Relaxed)) < REGION.span.load(Ordering::Relaxed)
}

/// The page-map entry of the page holding `p`.
///
/// # Safety
/// - `in_region(p)` holds.
#[inline(always)]
pub unsafe fn page_entry(p: usize) -> *mut PageEntry {
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
        let committed = (self.buddy.frontier as usize) * PAGE;
        committed - self.buddy.free_bytes + self.buddy.dirty_bytes + COUNTERS.direct_bytes.load(Ordering::Relaxed)
    }

    fn note_peak(&mut self) {
        let now = self.os_bytes();
        if now > self.peak {
            self.peak = now;
        }
    }

    /// Grows the committed part of the region by one top block.
    fn grow(&mut self) -> bool {
        let top_pages = 1u32 << (self.buddy.top - MIN_ORDER);
        let idx = self.buddy.frontier;
        let span_pages = REGION.span.load(Ordering::Relaxed) / PAGE;
        if idx as usize + top_pages as usize > span_pages {
            return false;
        }
        // SAFETY: the range is inside the reservation and page aligned.
        if !unsafe { os::commit(addr_of(idx) as *mut u8, (top_pages as usize) * PAGE) } {
            return false;
        }
        self.buddy.add_top(idx);
        true
    }

    fn purge_block(&mut self, idx: u32, order: u32) -> bool {
        let len = 1usize << order;
        // SAFETY: the block is free (so dead) and inside the committed region.
        let ok = unsafe { os::purge(addr_of(idx) as *mut u8, len) };
        if ok {
            bump(&COUNTERS.purges, 1);
            bump(&COUNTERS.purged_bytes, len);
        }
        ok
    }

    /// Purges free dirty blocks, smallest first, until at least `want` bytes are clean (or none is
    /// dirty). Returns the bytes made clean.
    fn purge(&mut self, want: usize) -> usize {
        let mut buddy = core::mem::replace(&mut self.buddy, Buddy::empty());
        let cleaned = buddy.purge(want, |idx, order| self.purge_block(idx, order));
        self.buddy = buddy;
        cleaned
    }

    fn purge_all(&mut self) -> usize {
        self.purge(usize::MAX)
    }

    /// Dirty free bytes kept resident: `RETAIN`, or `LOAD_RETAIN` while a load phase is open.
    fn retain_now(&self) -> usize {
        if crate::phase::any_active() {
            self.load_retain
        } else {
            self.retain
        }
    }

    /// About to hand out `bytes` of clean memory (new page faults): first purge as much dirty memory
    /// beyond the threshold, so that waiting free memory never adds to the resident set.
    fn make_room(&mut self, bytes: usize) {
        let keep = self.retain_now();
        if self.buddy.dirty_bytes > keep {
            self.purge((self.buddy.dirty_bytes - keep).min(bytes));
        }
    }

    /// Decay: purges the dirty bytes beyond the threshold ([`Inner::retain_now`]) once they have
    /// stayed beyond it for `PURGE_DELAY`; with a delay of 0, at once.
    fn decay(&mut self) {
        let keep = self.retain_now();
        if self.buddy.dirty_bytes <= keep {
            self.over_since = 0;
            return;
        }
        if self.purge_delay != 0 {
            let now = os::now_ns();
            if self.over_since == 0 {
                self.over_since = now;
                return;
            }
            if now.wrapping_sub(self.over_since) < self.purge_delay {
                return;
            }
        }
        self.purge(self.buddy.dirty_bytes - keep);
        self.over_since = 0;
    }

    /// Allocates a block of `order` marked `kind` or, for `kind == LARGE`, a run of `run` pages
    /// aligned to `order`; grows the region and honours the budget.
    fn alloc(&mut self, order: u32, kind: u8, run: u32) -> Option<(u32, bool)> {
        let mut purged = false;
        let bytes = if kind == buddy::LARGE { run as usize * PAGE } else { 1usize << order };
        loop {
            let took = if kind == buddy::LARGE { self.buddy.alloc_run(run, order) } else { self.buddy.alloc(order, kind) };
            let got = match took {
                Some(g) => Some(g),
                None => {
                    if self.grow() {
                        continue;
                    }
                    None
                }
            };
            let Some((idx, dirty)) = got else {
                bump(&COUNTERS.oom_refusals, 1);
                return None;
            };
            if !dirty {
                self.make_room(bytes);
            }
            if self.limit != 0 && self.os_bytes() > self.limit {
                if kind == buddy::LARGE {
                    // Given back in the state it was taken in: a refused clean run is not dirty.
                    self.buddy.release_range(idx, idx + run, if dirty { DIRTY } else { 0 });
                } else {
                    self.buddy.free(idx, order, if dirty { DIRTY } else { 0 });
                }
                if !purged && self.buddy.dirty_bytes > 0 {
                    self.purge_all();
                    purged = true;
                    continue;
                }
                bump(&COUNTERS.budget_refusals, 1);
                return None;
            }
            self.note_peak();
            self.decay();
            return Some((idx, dirty));
        }
    }

    fn free(&mut self, idx: u32, order: u32) {
        self.buddy.free(idx, order, DIRTY);
        self.decay();
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

/// Allocates a block of `order` and marks it `kind` (`SLAB`, `META` or `ARENA`; every page of a slab
/// or arena chunk is marked). Returns the address and whether the memory may be dirty (not known zero).
pub fn alloc_block(order: u32, kind: u8, tag: u8) -> Option<(*mut u8, bool)> {
    debug_assert!(kind != buddy::LARGE);
    if !ensure_init() {
        return None;
    }
    with_heap(|h| {
        if order > h.buddy.top {
            return None;
        }
        let (idx, dirty) = h.alloc(order, kind, 0)?;
        let n = 1u32 << (order - MIN_ORDER);
        // SAFETY: idx..idx+n are pages of the block just allocated, below the frontier.
        unsafe {
            h.buddy.entry_mut(idx).tag = tag;
            if kind == buddy::SLAB || kind == buddy::ARENA {
                for i in 0..n {
                    let e = h.buddy.entry_mut(idx + i);
                    e.kind = kind;
                    e.tag = tag;
                }
            }
        }
        Some((addr_of(idx) as *mut u8, dirty))
    })
}

/// Allocates a large block: a run of whole pages holding `size` bytes at alignment `align` (both at
/// most [`max_block`]). Returns the address, whether the memory may be dirty, and the run's size.
pub fn alloc_large(size: usize, align: usize, tag: u8) -> Option<(*mut u8, bool, usize)> {
    if !ensure_init() {
        return None;
    }
    let run = size.div_ceil(PAGE) as u32;
    let order = order_for(PAGE, align);
    with_heap(|h| {
        if run as usize > (1usize << (h.buddy.top - MIN_ORDER)) || order > h.buddy.top {
            return None;
        }
        let (idx, dirty) = h.alloc(order, buddy::LARGE, run)?;
        // SAFETY: idx is the head just allocated.
        unsafe { h.buddy.entry_mut(idx).tag = tag };
        Some((addr_of(idx) as *mut u8, dirty, run as usize * PAGE))
    })
}

/// Frees a block allocated by [`alloc_block`] or [`alloc_large`]. Returns its tag and size.
///
/// # Safety
/// - `p` was returned by [`alloc_block`] or [`alloc_large`] and not freed since; nothing uses it any
///   more.
pub unsafe fn free_block(p: *mut u8) -> (u8, usize) {
    with_heap(|h| {
        let idx = index_of(p as usize);
        // SAFETY: p is the head of an allocated block (caller's contract), so idx is below frontier.
        let e = unsafe { h.buddy.entry(idx) };
        if e.kind == buddy::LARGE {
            // SAFETY: a live run's head.
            let n = unsafe { h.buddy.run_pages(idx) };
            h.buddy.free_run(idx);
            h.decay();
            return (e.tag, n as usize * PAGE);
        }
        let order = e.order as u32;
        if e.kind == buddy::SLAB || e.kind == buddy::ARENA {
            for i in 1..(1u32 << (order - MIN_ORDER)) {
                // SAFETY: pages of the same block.
                unsafe { h.buddy.entry_mut(idx + i).kind = buddy::NONE };
            }
        }
        h.free(idx, order);
        (e.tag, 1usize << order)
    })
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
    with_heap(|h| {
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
            bump(&COUNTERS.budget_refusals, 1);
            return None;
        }
        let (free0, dirty0) = (h.buddy.free_bytes, h.buddy.dirty_bytes);
        if !h.buddy.resize_run(idx, m as u32) {
            return None;
        }
        if m < n {
            h.decay();
            return Some(m * PAGE);
        }
        // Clean pages claimed fault in when used: make room as for any clean allocation.
        let clean = (free0 - h.buddy.free_bytes).saturating_sub(dirty0 - h.buddy.dirty_bytes);
        if clean > 0 {
            h.make_room(clean);
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
    with_heap(|h| h.purge_all())
}

/// Sets the memory budget (0 = none). Takes effect for the next request.
pub fn set_limit(bytes: usize) {
    ensure_init();
    with_heap(|h| h.limit = bytes);
}

/// Heap figures for [`Stats`].
pub fn fill_stats(s: &mut Stats) {
    if !is_ready() {
        return;
    }
    with_heap(|h| {
        s.os_bytes = h.os_bytes();
        s.peak_os_bytes = h.peak;
        s.committed_bytes = (h.buddy.frontier as usize) * PAGE;
        s.free_bytes = h.buddy.free_bytes;
        s.dirty_free_bytes = h.buddy.dirty_bytes;
        s.limit_bytes = h.limit;
    });
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

/// The peak of bytes taken from the OS since the last [`reset_peak`].
pub fn peak() -> usize {
    if !is_ready() {
        return 0;
    }
    with_heap(|h| h.peak)
}

/// Checks the buddy heap's invariants (tests, debug).
pub fn check() -> Result<(), &'static str> {
    if !is_ready() {
        return Ok(());
    }
    with_heap(|h| h.buddy.check())
}

// ---------------------------------------------------------------------------------------------------
// Direct mappings: requests beyond the largest buddy block.

/// One direct mapping: the user pointer, the mapping's start and length.
#[derive(Clone, Copy)]
struct DirectEntry {
    key: usize,
    base: usize,
    len: usize,
}

const EMPTY_KEY: usize = 0;
const TOMBSTONE: usize = 1;

/// An open-addressing table of live direct mappings, in its own OS mapping.
///
/// Invariants: `cap` is zero or a power of two; `used` counts live entries plus tombstones and stays
/// at most `cap / 2`; every live entry's `key` is found by linear probing from its hash.
struct DirectTable {
    slots: *mut DirectEntry,
    cap: usize,
    used: usize,
    live: usize,
}

struct Direct {
    lock: RawLock,
    table: UnsafeCell<DirectTable>,
}

// SAFETY: `table` is only accessed with `lock` held.
unsafe impl Sync for Direct {}

static DIRECT: Direct = Direct {
    lock: RawLock::new(),
    table: UnsafeCell::new(DirectTable { slots: core::ptr::null_mut(), cap: 0, used: 0, live: 0 }),
};

fn with_direct<R>(f: impl FnOnce(&mut DirectTable) -> R) -> R {
    DIRECT.lock.lock();
    // SAFETY: lock held.
    let r = f(unsafe { &mut *DIRECT.table.get() });
    DIRECT.lock.unlock();
    r
}

#[inline]
fn hash(key: usize) -> usize {
    (key >> 12).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl DirectTable {
    fn find(&self, key: usize) -> Option<usize> {
        if self.cap == 0 {
            return None;
        }
        let mut i = hash(key) & (self.cap - 1);
        loop {
            // SAFETY: i < cap, slots holds cap entries.
            let e = unsafe { *self.slots.add(i) };
            if e.key == key {
                return Some(i);
            }
            if e.key == EMPTY_KEY {
                return None;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    fn insert(&mut self, e: DirectEntry) -> bool {
        if (self.used + 1) * 2 > self.cap && !self.rehash() {
            return false;
        }
        let mut i = hash(e.key) & (self.cap - 1);
        loop {
            // SAFETY: i < cap.
            let s = unsafe { &mut *self.slots.add(i) };
            if s.key == EMPTY_KEY || s.key == TOMBSTONE {
                if s.key == EMPTY_KEY {
                    self.used += 1;
                }
                *s = e;
                self.live += 1;
                return true;
            }
            i = (i + 1) & (self.cap - 1);
        }
    }

    fn rehash(&mut self) -> bool {
        let new_cap = if self.live * 4 < self.cap { self.cap.max(256) } else { (self.cap * 2).max(256) };
        let bytes = new_cap * core::mem::size_of::<DirectEntry>();
        let slots = os::map(bytes) as *mut DirectEntry;
        if slots.is_null() {
            return false;
        }
        let old = core::mem::replace(self, DirectTable { slots, cap: new_cap, used: 0, live: 0 });
        for i in 0..old.cap {
            // SAFETY: i < old.cap.
            let e = unsafe { *old.slots.add(i) };
            if e.key != EMPTY_KEY && e.key != TOMBSTONE {
                self.insert(e);
            }
        }
        if !old.slots.is_null() {
            // SAFETY: the old table is no longer referenced.
            unsafe { os::unmap(old.slots.cast(), old.cap * core::mem::size_of::<DirectEntry>()) };
        }
        true
    }
}

/// Maps `size` bytes aligned to `align` directly from the OS. Returns null on failure.
pub fn direct_alloc(size: usize, align: usize) -> *mut u8 {
    let Some(len) = size.checked_add(PAGE - 1).map(|l| l & !(PAGE - 1)) else { return core::ptr::null_mut() };
    let align = align.max(PAGE);
    let Some(total) = len.checked_add(align - PAGE) else { return core::ptr::null_mut() };
    if total > isize::MAX as usize {
        return core::ptr::null_mut();
    }
    if !ensure_init() {
        return core::ptr::null_mut();
    }
    // Budget: direct bytes count against the limit.
    let over = with_heap(|h| {
        if h.limit != 0 && h.os_bytes() + len > h.limit {
            h.purge_all();
            if h.os_bytes() + len > h.limit {
                return true;
            }
        }
        false
    });
    if over {
        bump(&COUNTERS.budget_refusals, 1);
        return core::ptr::null_mut();
    }
    let raw = os::map(total);
    if raw.is_null() {
        bump(&COUNTERS.oom_refusals, 1);
        return core::ptr::null_mut();
    }
    let p = (raw as usize + align - 1) & !(align - 1);
    // SAFETY: the slack before and after the aligned range is part of the mapping just made.
    unsafe {
        if p > raw as usize {
            os::unmap(raw, p - raw as usize);
        }
        let tail = raw as usize + total - (p + len);
        if tail > 0 {
            os::unmap((p + len) as *mut u8, tail);
        }
    }
    if !with_direct(|t| t.insert(DirectEntry { key: p, base: p, len })) {
        // SAFETY: the mapping was made above and is not published.
        unsafe { os::unmap(p as *mut u8, len) };
        return core::ptr::null_mut();
    }
    bump(&COUNTERS.direct_allocs, 1);
    bump(&COUNTERS.direct_bytes, len);
    with_heap(|h| h.note_peak());
    p as *mut u8
}

/// The length of the direct mapping at `p`, or `None` if `p` is not one.
pub fn direct_size(p: *mut u8) -> Option<usize> {
    with_direct(|t| t.find(p as usize).map(|i| {
        // SAFETY: find returns an index below cap.
        unsafe { (*t.slots.add(i)).len }
    }))
}

/// Unmaps the direct mapping at `p`. Returns `false` (doing nothing) if `p` is not one.
pub fn direct_free(p: *mut u8) -> bool {
    let e = with_direct(|t| {
        let i = t.find(p as usize)?;
        // SAFETY: i < cap.
        let s = unsafe { &mut *t.slots.add(i) };
        let e = *s;
        s.key = TOMBSTONE;
        t.live -= 1;
        Some(e)
    });
    match e {
        Some(e) => {
            // SAFETY: the entry was removed, so the mapping is ours alone and dead.
            unsafe { os::unmap(e.base as *mut u8, e.len) };
            bump(&COUNTERS.direct_frees, 1);
            drop_by(&COUNTERS.direct_bytes, e.len);
            true
        }
        None => false,
    }
}

/// Resizes a direct mapping (`mremap`), returning the new pointer or null (the old one intact).
/// Only for mappings with page alignment.
pub fn direct_realloc(p: *mut u8, new_size: usize) -> *mut u8 {
    let Some(new_len) = new_size.checked_add(PAGE - 1).map(|l| l & !(PAGE - 1)) else { return core::ptr::null_mut() };
    DIRECT.lock.lock();
    // SAFETY: lock held.
    let t = unsafe { &mut *DIRECT.table.get() };
    let Some(i) = t.find(p as usize) else {
        DIRECT.lock.unlock();
        return core::ptr::null_mut();
    };
    // SAFETY: i < cap.
    let e = unsafe { *t.slots.add(i) };
    let grow = new_len.saturating_sub(e.len);
    let over = grow > 0 && with_heap(|h| h.limit != 0 && h.os_bytes() + grow > h.limit);
    if over {
        DIRECT.lock.unlock();
        bump(&COUNTERS.budget_refusals, 1);
        return core::ptr::null_mut();
    }
    // SAFETY: [base, base+len) is exactly one mapping of ours.
    let q = unsafe { os::remap(e.base as *mut u8, e.len, new_len) };
    if q.is_null() {
        DIRECT.lock.unlock();
        return core::ptr::null_mut();
    }
    // SAFETY: i < cap.
    unsafe { (*t.slots.add(i)).key = TOMBSTONE };
    t.live -= 1;
    t.insert(DirectEntry { key: q as usize, base: q as usize, len: new_len });
    DIRECT.lock.unlock();
    if new_len > e.len {
        bump(&COUNTERS.direct_bytes, new_len - e.len);
    } else {
        drop_by(&COUNTERS.direct_bytes, e.len - new_len);
    }
    with_heap(|h| h.note_peak());
    q
}

// ---------------------------------------------------------------------------------------------------
// fork: no child may inherit a held lock. Order: caches, heap, direct.

extern "C" fn fork_prepare() {
    crate::cache::fork_prepare();
    HEAP.lock.lock();
    DIRECT.lock.lock();
}

extern "C" fn fork_parent() {
    DIRECT.lock.unlock();
    HEAP.lock.unlock();
    crate::cache::fork_parent();
}

extern "C" fn fork_child() {
    DIRECT.lock.reset();
    HEAP.lock.reset();
    crate::cache::fork_child();
}
