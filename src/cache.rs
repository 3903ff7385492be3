//! Thread-local caches: the small-object fast path.
//!
//! Call tree:
//! ```text
//! alloc_small(class)            [inline(always)]  TLS load, row: pop the stack of recent frees, else
//!                                                 the checked-out word: blsr, tzcnt, madd
//!   └─ alloc_slow(class)        [cold]  thread setup, scan bitmap, remote frees, partial list, new slab
//! free_small(p, slab)           [inline(always)]  owner compare, slot check, push on the row's stack
//!                                                 (or, when full, set the bit in word or bitmap)
//!   ├─ free_slow(slab)          [cold]  full→partial, empty→spare/heap
//!   └─ free_remote(p, slab)     [cold]  CAS onto the slab's remote list (+ queue the slab once)
//! ```
//! The allocation fast path is ~12 instructions with two predictable branches and touches the thread's
//! row of that class; free is ~40 including the page-map lookup and the interior-pointer check (see
//! `examples/asm_probe.rs` to read them). Double frees are caught when a slot reaches the bitmap: at
//! once on the bitmap path, at flush for a slot freed twice onto the stack, and not at all if the
//! stacked duplicate is handed out again first (as with mimalloc's free lists).
//!
//! Ownership: a cache owns its slabs for their whole life. When its thread exits, the cache is
//! *abandoned* whole (its slabs stay in it) to a pool, and the next thread that starts adopts it, so
//! nothing leaks with thread churn and a slab's owner never changes. Frees from other threads go to
//! the slab's remote list; the first one to find the list unqueued pushes the slab onto the owner's
//! remote queue, which the owner drains in its slow path (so memory freed by a consumer thread comes
//! back even when the owner never touches that slab again).
//!
//! TLS holds only a raw pointer with a `const` initialiser and no destructor, so it never registers a
//! destructor (which would call `malloc`); thread exit is learned from a `pthread_key_create` key.

use core::cell::{Cell, UnsafeCell};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};

use crate::buddy;
use crate::heap;
use crate::slab::{self, Slab, CURRENT, FULL, PARTIAL, QUEUED, SPARE};
use crate::size_class::{NCLASSES, SLAB_SHIFT, SLAB_SIZE};
use crate::stats::{bump, COUNTERS};
use crate::sync::RawLock;

/// Row sets: 0 = run phase, 1 = load phase (segregated slabs), 2 = load phase in arena mode (rows
/// that stay empty, so that every allocation reaches the slow path, which bumps it out of the arena).
pub const NPHASES: usize = 3;
/// `active` value of the arena mode.
pub const ARENA_ROWS: usize = 2 * NCLASSES;
pub const ROWS: usize = NPHASES * NCLASSES;
/// `widx` when no word is checked out.
const NO_WORD: u32 = u32::MAX;
/// Capacity of a row's stack of recently freed slots (fills the row to three cache lines).
pub const STACK: usize = 16;

/// One class's slabs in one phase: the allocation fast path reads only this line.
///
/// Invariants:
/// - `current` is a live slab in state `CURRENT` owned by this cache, or the static empty slab;
/// - when `widx != NO_WORD`, bitmap word `widx` of `current` is *checked out*: it reads 0 in the slab
///   and its free bits live in `word`; `base` is the address of the slot of bit 0 of that word and
///   `size` the slot size, so bit `i` of `word` set means slot `base + i * size` is free;
///   when `widx == NO_WORD`, `word == 0`;
/// - `partial` heads a doubly linked (`next`/`prev`) list of this cache's slabs in state `PARTIAL` for
///   this row, and `full` likewise of its slabs in state `FULL`, so that every slab of a row is
///   reachable (`current`, `partial`, `full`);
/// - `count` is the number of slots the row has handed out, ever (statistics, phase reports);
/// - `stack[..top]` are distinct free slots of this row's slabs (any of them, not only `current`),
///   recently freed by the owner. Their bitmap bits are clear: to their slab they still count as in
///   use, until they are handed out again or flushed back ([`flush_stack`]).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct ClassState {
    pub top: u32,
    pub widx: u32,
    pub word: u64,
    pub base: *mut u8,
    pub size: usize,
    pub current: *mut Slab,
    pub partial: *mut Slab,
    pub full: *mut Slab,
    pub count: u64,
    pub stack: [*mut u8; STACK],
}

const _: () = assert!(core::mem::size_of::<ClassState>() == 192);

const EMPTY_ROW: ClassState = ClassState {
    top: 0,
    widx: NO_WORD,
    word: 0,
    base: core::ptr::null_mut(),
    size: 0,
    current: empty_slab(),
    partial: core::ptr::null_mut(),
    full: core::ptr::null_mut(),
    count: 0,
    stack: [core::ptr::null_mut(); STACK],
};

/// A thread cache.
///
/// Invariants: used by at most one thread at a time (the one whose TLS points at it), or sitting in the
/// pool (`in_pool`); `rows[active + c]` is the row of class `c` for the current phase (`active` is
/// `0` or `NCLASSES`); `spare` is null or an empty slab in state `SPARE`; `remote` heads a Treiber
/// stack (link `shared.remote_next`) of this cache's slabs with `QUEUED` set.
#[repr(C)]
pub struct Cache {
    pub rows: [ClassState; ROWS],
    /// Written by the owner, and by a process-wide phase switch from any thread (relaxed: the owner
    /// picks the change up at its next allocation; both rows are its own).
    pub active: AtomicUsize,
    /// Nesting depth of this thread's load-phase guards (owner writes; read by other threads).
    pub depth: AtomicUsize,
    /// Set when a process-wide load phase ended while this cache's thread was elsewhere: the owner ends
    /// its load rows at its next slow path.
    pub end_pending: AtomicBool,
    /// The thread's current load-arena chunk (owner only), or null.
    pub chunk: *mut crate::arena::Chunk,
    pub spare: *mut Slab,
    pub remote: AtomicPtr<Slab>,
    /// Next cache in the list of all caches (immutable once linked).
    pub all_next: *mut Cache,
    /// Next cache in the pool of abandoned caches.
    pub pool_next: *mut Cache,
    pub in_pool: bool,
}

#[repr(transparent)]
struct SyncCell<T>(UnsafeCell<T>);
// SAFETY: the wrapped statics (the empty slab and cache) are never written: every write path first
// checks that it is not handling them.
unsafe impl<T> Sync for SyncCell<T> {}

/// The empty slab: its rows never check out a word, so the fast path always falls to the slow path.
static EMPTY_SLAB: SyncCell<Slab> = SyncCell(UnsafeCell::new(Slab {
    hint: 0,
    free_count: 0,
    nslots: 0,
    size: 16,
    first: 0,
    recip: 0,
    nwords: 0,
    class: 0,
    state: CURRENT,
    row: 0,
    owner: core::ptr::null_mut(),
    next: core::ptr::null_mut(),
    prev: core::ptr::null_mut(),
    shared: slab::Shared {
        remote: core::sync::atomic::AtomicUsize::new(0),
        remote_next: AtomicPtr::new(core::ptr::null_mut()),
    },
}));

const fn empty_slab() -> *mut Slab {
    EMPTY_SLAB.0.get()
}

impl Cache {
    /// A cache with every row empty, allocating from row set `active`.
    const fn new(active: usize) -> Cache {
        Cache {
            rows: [EMPTY_ROW; ROWS],
            active: AtomicUsize::new(active),
            depth: AtomicUsize::new(0),
            end_pending: AtomicBool::new(false),
            chunk: core::ptr::null_mut(),
            spare: core::ptr::null_mut(),
            remote: AtomicPtr::new(core::ptr::null_mut()),
            all_next: core::ptr::null_mut(),
            pool_next: core::ptr::null_mut(),
            in_pool: false,
        }
    }
}

/// The empty cache every thread starts with: all rows are empty.
static EMPTY_CACHE: SyncCell<Cache> = SyncCell(UnsafeCell::new(Cache::new(0)));

const fn empty_cache() -> *mut Cache {
    EMPTY_CACHE.0.get()
}

thread_local! {
    /// This thread's cache (the empty cache until the first slow path).
    static TLS_CACHE: Cell<*mut Cache> = const { Cell::new(empty_cache()) };
    /// Set once this thread's key destructor has run: later allocations borrow a cache briefly.
    static TLS_EXITING: Cell<bool> = const { Cell::new(false) };
}

#[inline(always)]
fn tls_cache() -> *mut Cache {
    TLS_CACHE.with(|c| c.get())
}

// Pool of abandoned caches, and the list of all caches.
static POOL_LOCK: RawLock = RawLock::new();
static POOL: AtomicPtr<Cache> = AtomicPtr::new(core::ptr::null_mut());
static ALL: AtomicPtr<Cache> = AtomicPtr::new(core::ptr::null_mut());
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);
static KEY_LOCK: RawLock = RawLock::new();
static KEY_READY: AtomicBool = AtomicBool::new(false);

/// Allocates a slot of `class` from the calling thread's cache. Returns null when memory runs out.
#[inline(always)]
pub fn alloc_small(class: usize) -> *mut u8 {
    let cache = tls_cache();
    // SAFETY: `cache` is this thread's cache or the empty cache; `active + class < ROWS`. Stack entries
    // below `top` are free slots; a set bit of the row's word is a free slot at `base + bit * size`
    // (ClassState invariant).
    unsafe {
        let row = &mut *(*cache).rows.as_mut_ptr().add((*cache).active.load(Ordering::Relaxed) + class);
        let t = row.top as usize;
        if t != 0 {
            row.top = (t - 1) as u32;
            row.count += 1;
            return *row.stack.get_unchecked(t - 1);
        }
        let w = row.word;
        if w != 0 {
            row.word = w & (w - 1);
            row.count += 1;
            return row.base.add(w.trailing_zeros() as usize * row.size);
        }
    }
    alloc_slow(class)
}

#[cold]
#[inline(never)]
fn alloc_slow(class: usize) -> *mut u8 {
    let mut cache = tls_cache();
    if cache == empty_cache() {
        if TLS_EXITING.with(|e| e.get()) {
            return alloc_while_exiting(class);
        }
        cache = acquire();
        if cache.is_null() {
            return core::ptr::null_mut();
        }
    }
    // SAFETY: `cache` is owned by this thread.
    unsafe { refill_and_take(cache, class) }
}

/// Serves an allocation made after this thread's cache was abandoned (from a later TLS destructor):
/// adopt a cache, allocate, abandon it again.
#[cold]
fn alloc_while_exiting(class: usize) -> *mut u8 {
    let cache = acquire_raw();
    if cache.is_null() {
        return core::ptr::null_mut();
    }
    // SAFETY: the cache was just taken from the pool or created, so this thread owns it.
    let p = unsafe { refill_and_take(cache, class) };
    // SAFETY: owned by this thread, and not referenced by its TLS.
    unsafe { abandon(cache) };
    p
}

/// Returns the row's checked-out word to its slab's bitmap.
///
/// # Safety
/// - `row` belongs to a cache owned by the calling thread.
unsafe fn checkin(row: *mut ClassState) {
    // SAFETY: owner only; widx < nwords of the current slab while checked out.
    unsafe {
        let r = &mut *row;
        if r.widx == NO_WORD {
            return;
        }
        let s = r.current;
        let w = r.widx;
        *Slab::bits(s).add(w as usize) = r.word;
        (*s).free_count += r.word.count_ones();
        if w < (*s).hint {
            (*s).hint = w;
        }
        r.word = 0;
        r.widx = NO_WORD;
    }
}

/// Checks out the first non-zero bitmap word of the row's current slab. Returns `false` if none.
///
/// # Safety
/// - `row` belongs to a cache owned by the calling thread, has no word checked out, and its current
///   slab is live (not the empty slab).
unsafe fn checkout(row: *mut ClassState) -> bool {
    // SAFETY: owner only; word indices stay below nwords.
    unsafe {
        let r = &mut *row;
        let s = r.current;
        let bits = Slab::bits(s);
        let mut h = (*s).hint;
        while h < (*s).nwords {
            let w = *bits.add(h as usize);
            if w != 0 {
                *bits.add(h as usize) = 0;
                (*s).free_count -= w.count_ones();
                (*s).hint = h;
                r.word = w;
                r.widx = h;
                r.size = (*s).size as usize;
                r.base = (s as *mut u8).add((*s).first as usize + h as usize * 64 * r.size);
                return true;
            }
            h += 1;
        }
        (*s).hint = h;
        false
    }
}

/// The allocation slow path: find a slot of `class` for `cache`.
///
/// # Safety
/// - `cache` is a live cache owned by the calling thread.
unsafe fn refill_and_take(cache: *mut Cache, class: usize) -> *mut u8 {
    bump(&COUNTERS.slab_refills, 1);
    // SAFETY: caller owns the cache; row index < ROWS.
    unsafe {
        if (*cache).end_pending.load(Ordering::Acquire) {
            crate::phase::end_pending(cache);
        }
        crate::phase::poll_trigger();
        if (*cache).active.load(Ordering::Relaxed) == ARENA_ROWS {
            return arena_alloc(cache, class);
        }
        let ri = (*cache).active.load(Ordering::Relaxed) + class;
        let row = (*cache).rows.as_mut_ptr().add(ri);
        loop {
            let r = &mut *row;
            if r.word != 0 {
                let w = r.word;
                r.word = w & (w - 1);
                r.count += 1;
                return r.base.add(w.trailing_zeros() as usize * r.size);
            }
            let s = r.current;
            if s != empty_slab() {
                checkin(row);
                if checkout(row) {
                    continue;
                }
                if collect_remote(cache, s) > 0 {
                    continue;
                }
                (*row).current = empty_slab();
                list_push(row, s, FULL);
            }
            let mut next = (*row).partial;
            if next.is_null() && drain_remote(cache) > 0 {
                next = (*row).partial;
            }
            if !next.is_null() {
                list_remove(row, next);
                (*next).state = CURRENT;
                (*row).current = next;
                continue;
            }
            let fresh = new_slab(cache, class, ri as u16);
            if fresh.is_null() {
                return core::ptr::null_mut();
            }
            (*row).current = fresh;
        }
    }
}

/// Bumps a `class` object out of the thread's load-arena chunk, taking a new chunk when it is full.
///
/// # Safety
/// - `cache` is owned by the calling thread.
unsafe fn arena_alloc(cache: *mut Cache, class: usize) -> *mut u8 {
    // SAFETY: owner only; `chunk` is this thread's current chunk.
    unsafe {
        for _ in 0..2 {
            if !(*cache).chunk.is_null() {
                let p = crate::arena::alloc((*cache).chunk, class);
                if !p.is_null() {
                    return p;
                }
                crate::arena::retire((*cache).chunk);
            }
            (*cache).chunk = crate::arena::new_chunk();
            if (*cache).chunk.is_null() {
                return core::ptr::null_mut();
            }
        }
        core::ptr::null_mut()
    }
}

/// Retires the thread's current load-arena chunk, if any (end of an arena phase, thread exit).
///
/// # Safety
/// - `cache` is owned by the calling thread.
pub unsafe fn end_arena(cache: *mut Cache) {
    // SAFETY: owner only.
    unsafe {
        let c = (*cache).chunk;
        if !c.is_null() {
            (*cache).chunk = core::ptr::null_mut();
            crate::arena::retire(c);
        }
    }
}

/// A slab for `class`: the cache's spare re-laid, or a new block from the heap.
///
/// # Safety
/// - `cache` is owned by the calling thread.
unsafe fn new_slab(cache: *mut Cache, class: usize, row: u16) -> *mut Slab {
    // SAFETY: caller owns the cache; the spare is an empty slab of this cache.
    unsafe {
        let s = (*cache).spare;
        if !s.is_null() {
            (*cache).spare = core::ptr::null_mut();
            Slab::init(s, class, row, cache);
            return s;
        }
        let tag = (row as usize / NCLASSES) as u8;
        let Some((block, _dirty)) = heap::alloc_block(SLAB_SHIFT, buddy::SLAB, tag) else {
            return core::ptr::null_mut();
        };
        bump(&COUNTERS.slabs_acquired, 1);
        let s = block as *mut Slab;
        Slab::init(s, class, row, cache);
        s
    }
}

/// The list head of `row` for slabs in `state` (`PARTIAL` or `FULL`).
///
/// # Safety
/// - `row` is a row of a cache owned by the calling thread.
unsafe fn list_head(row: *mut ClassState, state: u8) -> *mut *mut Slab {
    // SAFETY: field projection of a valid row.
    unsafe {
        if state == FULL {
            &raw mut (*row).full
        } else {
            &raw mut (*row).partial
        }
    }
}

/// Unlinks `s` from the list of its state (`PARTIAL` or `FULL`) in `row`.
///
/// # Safety
/// - `s` is on that list of `row`.
unsafe fn list_remove(row: *mut ClassState, s: *mut Slab) {
    // SAFETY: list members are live slabs of the same cache.
    unsafe {
        let (p, n) = ((*s).prev, (*s).next);
        if p.is_null() {
            *list_head(row, (*s).state) = n;
        } else {
            (*p).next = n;
        }
        if !n.is_null() {
            (*n).prev = p;
        }
        (*s).next = core::ptr::null_mut();
        (*s).prev = core::ptr::null_mut();
    }
}

/// Pushes `s` onto the `state` list (`PARTIAL` or `FULL`) of `row` and sets its state.
///
/// # Safety
/// - `s` is a live slab of the cache owning `row`, on no list.
unsafe fn list_push(row: *mut ClassState, s: *mut Slab, state: u8) {
    // SAFETY: as above.
    unsafe {
        let head = list_head(row, state);
        let h = *head;
        (*s).prev = core::ptr::null_mut();
        (*s).next = h;
        if !h.is_null() {
            (*h).prev = s;
        }
        *head = s;
        (*s).state = state;
    }
}

/// Frees slot `p` of `slab` (any thread).
///
/// # Safety
/// - `slab` is a live slab and `p` a pointer inside its block that was allocated and not freed.
#[inline(always)]
pub unsafe fn free_small(p: *mut u8, slab: *mut Slab) {
    // SAFETY: the slab is live (caller); owner fields are only touched when we own it.
    unsafe {
        let cache = tls_cache();
        if (*slab).owner != cache {
            return free_remote(p, slab);
        }
        let idx = Slab::index_of(slab, p);
        let row = &mut *(*cache).rows.as_mut_ptr().add((*slab).row as usize);
        let t = row.top as usize;
        if t < STACK {
            *row.stack.get_unchecked_mut(t) = p;
            row.top = t as u32 + 1;
            return;
        }
        if release_slot(row, slab, idx, p) && needs_refile(slab) {
            free_slow(slab);
        }
    }
}

/// Returns slot `idx` of `slab` to the row's checked-out word if it lies there (returns `false`),
/// else to the slab's bitmap, lowering the search hint and counting it free (returns `true`: the
/// slab's fill level changed, see [`needs_refile`]). Aborts on a double free.
///
/// # Safety
/// - `row` is `slab`'s row in a cache owned by the calling thread; `idx < nslots`; `p` is the slot.
#[inline(always)]
unsafe fn release_slot(row: &mut ClassState, slab: *mut Slab, idx: usize, p: *mut u8) -> bool {
    let w = (idx >> 6) as u32;
    let bit = 1u64 << (idx & 63);
    if row.widx == w && row.current == slab {
        if row.word & bit != 0 {
            slab::invalid_pointer(p, b"free(): double free detected");
        }
        row.word |= bit;
        return false;
    }
    // SAFETY: owner-only access; w < nwords.
    unsafe {
        let s = &mut *slab;
        let word = Slab::bits(slab).add(w as usize);
        if *word & bit != 0 {
            slab::invalid_pointer(p, b"free(): double free detected");
        }
        *word |= bit;
        if w < s.hint {
            s.hint = w;
        }
        s.free_count += 1;
    }
    true
}

/// Whether a slab whose free count just grew must move lists: a full slab now has free slots, or a
/// partial slab is now empty (see [`refile`]).
///
/// # Safety
/// - `slab` is a live slab owned by the calling thread's cache.
#[inline(always)]
unsafe fn needs_refile(slab: *mut Slab) -> bool {
    // SAFETY: owner-only fields of a live slab.
    let s = unsafe { &*slab };
    s.state == FULL || (s.free_count == s.nslots && s.state == PARTIAL)
}

/// Frees a slot of a slab owned by `cache` (the calling thread's), wherever its word is.
///
/// # Safety
/// - as [`free_small`], and `cache` owns `slab` and is owned by the calling thread.
unsafe fn owner_free(cache: *mut Cache, slab: *mut Slab, p: *mut u8) {
    // SAFETY: forwarded contract.
    unsafe {
        let idx = Slab::index_of(slab, p);
        release_slot(&mut *(*cache).rows.as_mut_ptr().add((*slab).row as usize), slab, idx, p);
    }
}

/// Returns the slots on a row's stack to their slabs' bitmaps (aborting on a double free among them),
/// then re-files the slabs whose fill level changed.
///
/// # Safety
/// - `row` belongs to `cache`, which the calling thread owns.
unsafe fn flush_stack(cache: *mut Cache, row: *mut ClassState) {
    // SAFETY: owner only; entries below `top` are free slots of this cache's slabs.
    unsafe {
        while (*row).top > 0 {
            (*row).top -= 1;
            let p = (*row).stack[(*row).top as usize];
            let slab = (p as usize & !(SLAB_SIZE - 1)) as *mut Slab;
            owner_free(cache, slab, p);
            if needs_refile(slab) {
                refile(slab);
            }
        }
    }
}

/// Applies a remote list (a chain of slots linked through their first word) to `slab`.
///
/// # Safety
/// - `cache` is owned by the calling thread and owns `slab`; `list` was taken from the slab's
///   `remote` with acquire ordering.
unsafe fn apply_remote(cache: *mut Cache, slab: *mut Slab, mut list: usize) -> u32 {
    let mut n = 0;
    while list != 0 {
        let p = list as *mut u8;
        // SAFETY: every list member is a dead slot of this slab; its first word links the next.
        unsafe {
            list = (p as *const usize).read();
            owner_free(cache, slab, p);
        }
        n += 1;
    }
    n
}

/// Takes `slab`'s remote list while keeping `QUEUED` (owner only, outside the queue). Returns the
/// slots applied.
///
/// # Safety
/// - `cache` is owned by the calling thread and owns `slab`.
unsafe fn collect_remote(cache: *mut Cache, slab: *mut Slab) -> u32 {
    // SAFETY: the header is live.
    let remote = unsafe { &(*slab).shared.remote };
    if remote.load(Ordering::Relaxed) & !QUEUED == 0 {
        return 0;
    }
    let old = remote.fetch_and(QUEUED, Ordering::Acquire);
    // SAFETY: owner only; list taken with acquire.
    unsafe { apply_remote(cache, slab, old & !QUEUED) }
}

/// Re-files a slab of the calling thread's cache after slots were returned to it.
///
/// # Safety
/// - `slab` is owned by the calling thread's cache.
#[cold]
#[inline(never)]
unsafe fn free_slow(slab: *mut Slab) {
    // SAFETY: owner only.
    unsafe { refile(slab) }
}

/// Moves a slab to the list its fill level calls for: a full slab with free slots to the partial list,
/// an empty partial slab to the spare or back to the heap.
///
/// # Safety
/// - `slab` is owned by the calling thread's cache.
unsafe fn refile(slab: *mut Slab) {
    // SAFETY: owner only; row index was stored at init and is < ROWS.
    unsafe {
        let cache = (*slab).owner;
        let row = (*cache).rows.as_mut_ptr().add((*slab).row as usize);
        if (*slab).state == FULL && (*slab).free_count > 0 {
            list_remove(row, slab);
            list_push(row, slab, PARTIAL);
        }
        if (*slab).state == PARTIAL && (*slab).free_count == (*slab).nslots {
            // Never give back a slab that is (being) queued for remote frees.
            if (*slab).shared.remote.load(Ordering::Acquire) != 0 {
                return;
            }
            list_remove(row, slab);
            retire(cache, slab);
        }
    }
}

/// Keeps an empty slab as the cache's spare or returns it to the heap.
///
/// # Safety
/// - `slab` is empty, on no list, owned by `cache` (which the calling thread owns), not queued.
unsafe fn retire(cache: *mut Cache, slab: *mut Slab) {
    // SAFETY: as above.
    unsafe {
        if (*cache).spare.is_null() {
            (*slab).state = SPARE;
            (*cache).spare = slab;
        } else {
            bump(&COUNTERS.slabs_released, 1);
            heap::free_block(slab as *mut u8);
        }
    }
}

#[cold]
#[inline(never)]
unsafe fn free_remote(p: *mut u8, slab: *mut Slab) {
    // SAFETY: the caller gives up `p`, a live slot of `slab`; validate it before linking it.
    unsafe {
        let _ = Slab::index_of(slab, p);
        if Slab::push_remote(slab, p) {
            let owner = (*slab).owner;
            let q = &(*owner).remote;
            let mut head = q.load(Ordering::Relaxed);
            loop {
                (*slab).shared.remote_next.store(head, Ordering::Relaxed);
                match q.compare_exchange_weak(head, slab, Ordering::Release, Ordering::Relaxed) {
                    Ok(_) => break,
                    Err(h) => head = h,
                }
            }
            bump(&COUNTERS.remote_frees, 1);
        }
    }
}

/// Applies every queued remote free of `cache` (owner only). Returns the number of slabs processed.
///
/// # Safety
/// - `cache` is owned by the calling thread.
unsafe fn drain_remote(cache: *mut Cache) -> usize {
    // SAFETY: owner only; each popped slab is a live slab of this cache with QUEUED set, which keeps it
    // alive until we clear it below.
    unsafe {
        let mut s = (*cache).remote.swap(core::ptr::null_mut(), Ordering::Acquire);
        let mut n = 0;
        while !s.is_null() {
            let next = (*s).shared.remote_next.load(Ordering::Relaxed);
            let list = (*s).shared.remote.swap(0, Ordering::Acquire) & !QUEUED;
            apply_remote(cache, s, list);
            refile(s);
            n += 1;
            s = next;
        }
        n
    }
}

/// Creates the thread-exit key once. Done outside any allocator lock: `pthread_key_create` does not
/// allocate, but the first `pthread_setspecific` on a high key may.
fn ensure_key() -> bool {
    if KEY_READY.load(Ordering::Acquire) {
        return true;
    }
    KEY_LOCK.lock();
    if !KEY_READY.load(Ordering::Acquire) {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: `thread_exit` matches the destructor signature.
        if unsafe { libc::pthread_key_create(&mut key, Some(thread_exit)) } == 0 {
            KEY.store(key, Ordering::Relaxed);
            KEY_READY.store(true, Ordering::Release);
        }
    }
    KEY_LOCK.unlock();
    KEY_READY.load(Ordering::Acquire)
}

/// Takes a cache from the pool, or makes one; not yet bound to the thread.
fn acquire_raw() -> *mut Cache {
    if !heap::ensure_init() {
        return core::ptr::null_mut();
    }
    POOL_LOCK.lock();
    let c = POOL.load(Ordering::Relaxed);
    if !c.is_null() {
        // SAFETY: pool members are live caches; the pool lock is held.
        unsafe {
            POOL.store((*c).pool_next, Ordering::Relaxed);
            (*c).pool_next = core::ptr::null_mut();
            (*c).in_pool = false;
        }
    }
    POOL_LOCK.unlock();
    if !c.is_null() {
        bump(&COUNTERS.caches_adopted, 1);
        // SAFETY: we own it now.
        unsafe {
            drain_remote(c);
            crate::phase::on_adopt(c);
        }
        return c;
    }
    let size = core::mem::size_of::<Cache>();
    let order = heap::order_for(size, 64);
    let Some((block, _)) = heap::alloc_block(order, buddy::META, 0) else {
        return core::ptr::null_mut();
    };
    let c = block as *mut Cache;
    // SAFETY: a fresh block of at least size_of::<Cache>() bytes, page aligned.
    unsafe {
        c.write(Cache::new(crate::phase::global_rows()));
        let mut head = ALL.load(Ordering::Relaxed);
        loop {
            (*c).all_next = head;
            match ALL.compare_exchange_weak(head, c, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
    }
    bump(&COUNTERS.caches_created, 1);
    c
}

/// Binds a cache to the calling thread.
#[cold]
fn acquire() -> *mut Cache {
    if !heap::ensure_init() || !ensure_key() {
        return core::ptr::null_mut();
    }
    let c = acquire_raw();
    if c.is_null() {
        return c;
    }
    TLS_CACHE.with(|t| t.set(c));
    // Set after TLS: if this allocates (keys ≥ 32), the nested call finds the cache ready.
    // SAFETY: the key was created by ensure_key.
    unsafe { libc::pthread_setspecific(KEY.load(Ordering::Relaxed), c as *const libc::c_void) };
    c
}

/// Returns the calling thread's cache, creating it if needed (null if memory is exhausted).
pub fn current() -> *mut Cache {
    let c = tls_cache();
    if c != empty_cache() {
        return c;
    }
    if TLS_EXITING.with(|e| e.get()) {
        return core::ptr::null_mut();
    }
    acquire()
}

/// Gives a cache back to the pool: applies remote frees, returns empty slabs, keeps the rest.
///
/// # Safety
/// - `cache` is owned by the calling thread, which will not use it again.
unsafe fn abandon(cache: *mut Cache) {
    // SAFETY: owner only until it is in the pool.
    unsafe {
        end_arena(cache);
        drain_remote(cache);
        for r in 0..ROWS {
            flush_stack(cache, (*cache).rows.as_mut_ptr().add(r));
        }
        for r in 0..ROWS {
            let row = (*cache).rows.as_mut_ptr().add(r);
            let s = (*row).current;
            if s != empty_slab() {
                checkin(row);
                collect_remote(cache, s);
                if (*s).free_count == (*s).nslots && (*s).shared.remote.load(Ordering::Acquire) == 0 {
                    (*row).current = empty_slab();
                    retire(cache, s);
                }
            }
        }
        let spare = (*cache).spare;
        if !spare.is_null() {
            (*cache).spare = core::ptr::null_mut();
            bump(&COUNTERS.slabs_released, 1);
            heap::free_block(spare as *mut u8);
        }
        POOL_LOCK.lock();
        (*cache).in_pool = true;
        (*cache).pool_next = POOL.load(Ordering::Relaxed);
        POOL.store(cache, Ordering::Relaxed);
        POOL_LOCK.unlock();
    }
    bump(&COUNTERS.caches_abandoned, 1);
}

/// The thread-exit destructor of the key.
extern "C" fn thread_exit(arg: *mut libc::c_void) {
    let c = arg as *mut Cache;
    if c.is_null() || c != tls_cache() {
        return;
    }
    TLS_CACHE.with(|t| t.set(empty_cache()));
    TLS_EXITING.with(|e| e.set(true));
    // SAFETY: the cache belonged to this thread, whose TLS no longer points at it.
    unsafe { abandon(c) };
}

/// Reclaims what abandoned caches hold: applies their remote frees and returns their empty slabs.
pub fn collect_abandoned() {
    // Bounded: remote frees may keep arriving while we work.
    for _ in 0..4096 {
        // Take one cache at a time out of the pool, process it, and put it back.
        POOL_LOCK.lock();
        let c = POOL.load(Ordering::Relaxed);
        let mut taken = core::ptr::null_mut();
        let mut prev: *mut Cache = core::ptr::null_mut();
        let mut cur = c;
        // Find a cache with pending remote frees.
        // SAFETY: pool members are live caches; lock held.
        unsafe {
            while !cur.is_null() {
                if !(*cur).remote.load(Ordering::Acquire).is_null() {
                    if prev.is_null() {
                        POOL.store((*cur).pool_next, Ordering::Relaxed);
                    } else {
                        (*prev).pool_next = (*cur).pool_next;
                    }
                    (*cur).in_pool = false;
                    taken = cur;
                    break;
                }
                prev = cur;
                cur = (*cur).pool_next;
            }
        }
        POOL_LOCK.unlock();
        if taken.is_null() {
            return;
        }
        // SAFETY: taken out of the pool, so exclusively ours; abandon puts it back.
        unsafe { abandon(taken) };
        crate::stats::drop_by(&COUNTERS.caches_abandoned, 1);
    }
}

/// Bytes currently held in slabs by all caches is not tracked per slab; this counts slabs instead.
pub fn slab_bytes() -> usize {
    let s = COUNTERS.slabs_acquired.load(Ordering::Relaxed);
    let r = COUNTERS.slabs_released.load(Ordering::Relaxed);
    s.saturating_sub(r) * SLAB_SIZE
}

pub(crate) fn fork_prepare() {
    KEY_LOCK.lock();
    POOL_LOCK.lock();
}

pub(crate) fn fork_parent() {
    POOL_LOCK.unlock();
    KEY_LOCK.unlock();
}

/// In the child only the forking thread exists. The other threads' caches may have been in the middle
/// of a lock-free fast path at the fork, so they are left as they are (their memory stays reserved; frees
/// into their slabs queue up harmlessly) rather than adopted in a possibly torn state.
pub(crate) fn fork_child() {
    POOL_LOCK.reset();
    KEY_LOCK.reset();
}

/// What ending a cache's load rows did.
#[derive(Clone, Copy, Debug, Default)]
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
pub unsafe fn end_load_rows(cache: *mut Cache) -> LoadEnd {
    let mut r = LoadEnd::default();
    // SAFETY: owner only; rows and slabs of this cache.
    unsafe {
        for class in 0..NCLASSES {
            let lrow = (*cache).rows.as_mut_ptr().add(NCLASSES + class);
            let rrow = (*cache).rows.as_mut_ptr().add(class);
            flush_stack(cache, lrow);
            checkin(lrow);
            r.allocations += (*lrow).count;
            (*lrow).count = 0;
            let cur = (*lrow).current;
            (*lrow).current = empty_slab();
            if cur != empty_slab() {
                end_slab(cache, cur, rrow, class, &mut r);
            }
            for state in [PARTIAL, FULL] {
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
    }
    r
}

/// One load slab at the end of its phase.
///
/// # Safety
/// - `s` is a live slab of `cache` on no list; `rrow` is the run row of its class.
unsafe fn end_slab(cache: *mut Cache, s: *mut Slab, rrow: *mut ClassState, class: usize, r: &mut LoadEnd) {
    // SAFETY: owner only.
    unsafe {
        collect_remote(cache, s);
        let used = ((*s).nslots - (*s).free_count) as usize;
        r.survivor_bytes += used * (*s).size as usize;
        if used == 0 && (*s).shared.remote.load(Ordering::Acquire) == 0 {
            bump(&COUNTERS.slabs_released, 1);
            r.slabs_released += 1;
            heap::free_block(s as *mut u8);
            return;
        }
        r.purged_bytes += purge_free_pages(s);
        (*s).row = class as u16;
        list_push(rrow, s, if (*s).free_count > 0 { PARTIAL } else { FULL });
    }
}

/// Purges the pages of a slab on which every slot is free, counting only pages that were resident.
/// Free slots hold no allocator data (the bitmap is in the header page), so a purged page simply reads
/// as zero when its slots are handed out again.
///
/// # Safety
/// - `s` is a live slab owned by the caller with no word checked out, no stacked slot and its remote
///   list applied (every free slot's bit is set in the bitmap).
unsafe fn purge_free_pages(s: *mut Slab) -> usize {
    const PAGES: usize = SLAB_SIZE / crate::os::PAGE;
    let mut resident = [0u8; PAGES];
    let base = s as *mut u8;
    if !crate::os::resident_pages(base, SLAB_SIZE, &mut resident) {
        return 0;
    }
    // SAFETY: header fields and bitmap of a live slab owned by the caller.
    let (first, size, nslots, bits) = unsafe { ((*s).first as usize, (*s).size as usize, (*s).nslots as usize, Slab::bits(s)) };
    let free = |i: usize| {
        // SAFETY: i < nslots <= 64 * nwords.
        unsafe { *bits.add(i >> 6) & (1u64 << (i & 63)) != 0 }
    };
    let mut purged = 0;
    let mut run_start = usize::MAX;
    // Page 0 holds the header and bitmap: never purged. The loop runs one past the last page to flush
    // the final run of purgeable pages.
    #[allow(clippy::needless_range_loop)]
    for page in 1..=PAGES {
        let purge_this = page < PAGES && {
            let ps = page * crate::os::PAGE;
            let pe = ps + crate::os::PAGE;
            let lo = (ps - first.min(ps)) / size;
            let hi = nslots.min((pe - first).div_ceil(size));
            lo < hi && (lo..hi).all(free) && resident[page] & 1 != 0
        };
        if purge_this {
            if run_start == usize::MAX {
                run_start = page;
            }
        } else if run_start != usize::MAX {
            let len = (page - run_start) * crate::os::PAGE;
            // SAFETY: whole pages of this slab whose slots are all free (dead memory).
            if unsafe { crate::os::purge(base.add(run_start * crate::os::PAGE), len) } {
                purged += len;
            }
            run_start = usize::MAX;
        }
    }
    if purged > 0 {
        bump(&COUNTERS.purges, 1);
        bump(&COUNTERS.purged_bytes, purged);
    }
    purged
}

/// Calls `f` on every cache in the list of all caches.
pub fn for_each_cache(mut f: impl FnMut(*mut Cache)) {
    let mut c = ALL.load(Ordering::Acquire);
    while !c.is_null() {
        f(c);
        // SAFETY: caches are never freed; `all_next` is immutable once linked.
        c = unsafe { (*c).all_next };
    }
}

/// Takes every cache out of the pool, calls `f` on each (exclusively ours meanwhile), and puts them
/// back.
pub fn with_pooled_caches(mut f: impl FnMut(*mut Cache)) {
    POOL_LOCK.lock();
    let mut c = POOL.swap(core::ptr::null_mut(), Ordering::Relaxed);
    POOL_LOCK.unlock();
    let mut taken = core::ptr::null_mut::<Cache>();
    while !c.is_null() {
        // SAFETY: pool members are live caches, now exclusively ours.
        unsafe {
            let next = (*c).pool_next;
            f(c);
            (*c).pool_next = taken;
            taken = c;
            c = next;
        }
    }
    POOL_LOCK.lock();
    while !taken.is_null() {
        // SAFETY: as above; relinked under the pool lock.
        unsafe {
            let next = (*taken).pool_next;
            (*taken).pool_next = POOL.load(Ordering::Relaxed);
            POOL.store(taken, Ordering::Relaxed);
            taken = next;
        }
    }
    POOL_LOCK.unlock();
}

/// The calling thread's cache, if it has one (no creation).
pub fn mine() -> *mut Cache {
    let c = tls_cache();
    if c == empty_cache() {
        core::ptr::null_mut()
    } else {
        c
    }
}
