//! Thread-local caches: the small-object fast path.
//!
//! Call tree (`global` routes small requests here):
//! ```text
//! alloc_fast(class)             [inline(always)]  TLS load, row: pop the stack of recent frees, else
//!                                                 take the lowest bit of the checked-out word
//!   (miss: global's cold path)  → alloc_slow(class)   [cold]  thread setup, the slab's remote frees,
//!                                                               next word, the remote queue,
//!                                                               partial list, new slab
//!                                                               (or arena)
//! free_small(p, slab)           [inline(always)]  owner compare, slot check, push on the row's stack
//!                                                 (or, when full, set the bit in word or bitmap);
//!                                                 `global`'s free enters at its second step,
//!                                                 free_owned, when the slab-table entry names the
//!                                                 thread's cache
//!   ├─ free_slow(slab)          [cold]  full→partial, empty→spare/heap
//!   └─ remote::free(p, slab)    [cold]  set the slot's bit in the slab's remote bitmap (+ queue the
//!                                       slab once)
//! ```
//! Instruction budget, measured (`cargo build --release --example asm_probe && python3
//! scripts/fast-path-insns.py`, x86-64): from the entry of `raw::alloc` to its return, an allocation
//! that hits the row's stack runs 20 instructions and one that hits the checked-out word 26, both
//! including the size check, the size-class table (which gives the row's byte offset,
//! [`ROW_OF_SIZE`]: 22 and 28 when it gave the class, which the path multiplied by the row's size),
//! the TLS load, the row's allocation count (one
//! `inc` on the row's line: the phase reports and the statistics count every allocation) and clearing
//! the freed mark; a free by the owner onto the stack runs 40, including the region check, the
//! slab-table entry's owner compare (which says the pointer is in one of the thread's slabs without
//! the page map: see `slab::Slab`'s invariants and `global::free_raw`; 46 through the page map), the
//! interior-pointer check (`Slab::slot_of`: the offset from the pointer's low bits, then one
//! multiply by the class's reciprocal gives the slot and says whether the pointer starts one; 56
//! when it read the block's address and multiplied back), the freed mark (5 of them) and the row's
//! free count (1, for the statistics); 48 while it kept a stack frame for the calls of its aborts,
//! which never return (see [`free_small`]). The `debug` feature adds the hooks check (`global`:
//! debug mode, profiling) to each: 24, 30 and 44. (Before the rows were reached through
//! `rows_now` and slabs recorded their row's byte offset, and without the mark: 24, 30 and 51.) The
//! library's own `malloc` and `free` run the same counts (the script counts them too); they ran two
//! more each, a stack frame for their `extern "C"` landing pads and, in `malloc`, for setting errno
//! after the slow path returned (`global::alloc_c`).
//!
//! Double frees: a free writes the freed mark (`slab::freed_mark`, random per process) into the
//! slot's second word, and an allocation clears it. A free that finds the mark already there checks
//! whether the slot is free — on the row's stack, in the checked-out word or the bitmap, in the slab's
//! remote bitmap — and aborts if so ([`free_marked`]); so a slot freed twice is never handed out twice,
//! whether the frees land on the stack, the bitmap or both. (A slot on a page that a phase end, or
//! a sweep inside a phase (`settle::sweep_if_due`), purged has lost its mark: freeing it again is
//! caught only if it reaches the bitmap.)
//!
//! # Ownership, said once
//! A cache is used by exactly one thread at a time: the thread whose TLS points at it, or the thread
//! that took it out of the pool of abandoned caches ([`life`]). That thread *owns* the cache; every
//! `unsafe fn` here that takes `cache: *mut Cache` (or a row of it, or a slab of it) requires it, and
//! the `// SAFETY:` comments say "owner" for that. Only the owner touches the rows, `spare`, `chunk`,
//! and its slabs' owner lines and bitmaps. Other threads touch only atomics: `rows_now` and
//! `settle_pending` (phase switches, [`settle`]), `depth` (read), `remote` and a slab's `shared` line
//! ([`remote`]). Rows are reached only through raw pointers ([`row`]), never through a `&mut` to the
//! rows array, so a row pointer held by a caller stays valid while a callee reaches another row; and
//! no reference is ever formed to the static empty cache, which every new thread reads at once.

pub mod life;
pub mod remote;
pub mod runs;
pub mod settle;

use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::arena::{self, Chunk};
use crate::buddy::PageKind;
use crate::heap;
use crate::os;
use crate::phase_state::{RowSet, NSETS};
use crate::size_class::{NCLASSES, SIZE_TO_CLASS, SLAB_SHIFT, SMALL_MAX};
use crate::slab::{self, OwnerId, Slab, SlabState};
use crate::stats;

pub use life::{collect_abandoned, current, mine};
pub use settle::LoadEnd;

pub const ROWS: usize = NSETS * NCLASSES;
/// `widx` when no word is checked out.
const NO_WORD: u32 = u32::MAX;
/// Capacity of a row's stack of recently freed slots (fills the row to three cache lines).
pub const STACK: usize = 14;

/// One class's slabs in one row set: the allocation fast path reads only this row.
///
/// Invariants:
/// - `current` is a live slab in state `Current` owned by this cache, or null ([`empty_slab`]);
/// - when `current` is not null and `widx != NO_WORD`, bitmap word `widx` of `current` is *checked
///   out*: it reads 0 in the slab and its free bits live in `word`; `base` is the address of the slot
///   of bit 0 of that word and `size` the slot size, so bit `i` of `word` set means slot
///   `base + i * size` is free; otherwise no word is checked out and `word == 0` (`widx` means
///   nothing while `current` is null, so that a row of zero bytes is an empty row: a fresh cache
///   leaves the rows it does not use unwritten, see [`Cache::init_at`]);
/// - `partial` heads a doubly linked (`next`/`prev`) list of this cache's slabs in state `Partial` for
///   this row, and `full` likewise of its slabs in state `Full`, so that every slab of a row is
///   reachable (`current`, `partial`, `full`);
/// - `count` is the number of slots the row has handed out, ever, and `frees` the number its owner
///   took back (slots of the row's slabs freed by the owner thread); both are written by the owner
///   only (a relaxed load and store: no locked instruction) and read by any thread for the
///   statistics ([`class_counts`]). The load rows' `count` at the last settle is in
///   `Cache::load_mark` (phase reports);
/// - `stack[..top]` are distinct free slots of this row's slabs (any of them, not only `current`),
///   recently freed by the owner. Their bitmap bits are clear: to their slab they still count as in
///   use, until they are handed out again or flushed back ([`flush_stack`]).
///
/// Layout: everything a fast path touches but the stack is in the first cache line (`count` and
/// `frees` beside `top`), the slow path's lists and the stack in the other two.
#[repr(C, align(64))]
pub struct ClassState {
    top: u32,
    widx: u32,
    word: u64,
    base: *mut u8,
    size: usize,
    current: *mut Slab,
    count: AtomicU64,
    frees: AtomicU64,
    partial: *mut Slab,
    full: *mut Slab,
    stack: [*mut u8; STACK],
}

const _: () = assert!(core::mem::size_of::<ClassState>() == 192);

/// Bytes of one row: row `c` of a row set starts `c * ROW_BYTES` bytes after its first.
pub const ROW_BYTES: usize = core::mem::size_of::<ClassState>();

/// `ROW_OF_SIZE[(size + 15) >> 4]` is the byte offset in a row set of the row of `size`'s class
/// ([`SIZE_TO_CLASS`] times [`ROW_BYTES`]), so that the allocation fast path adds it to `rows_now`
/// as it is: two instructions fewer than a class index, which it multiplied by the row's size.
pub static ROW_OF_SIZE: [u16; SMALL_MAX / 16 + 1] = {
    let mut t = [0u16; SMALL_MAX / 16 + 1];
    let mut i = 0;
    while i < t.len() {
        t[i] = (SIZE_TO_CLASS[i] as usize * ROW_BYTES) as u16;
        i += 1;
    }
    t
};
const _: () = assert!(NCLASSES * ROW_BYTES <= u16::MAX as usize);

/// The byte offset of the row of `size`'s class in a row set (`size <= SMALL_MAX`, alignment ≤ 16).
#[inline(always)]
pub fn row_of_size(size: usize) -> usize {
    ROW_OF_SIZE[(size + 15) >> 4] as usize
}

/// The class of the row at byte offset `off` in a row set.
#[inline(always)]
pub fn class_of_row(off: usize) -> usize {
    off / ROW_BYTES
}

const _: () = assert!(core::mem::offset_of!(ClassState, frees) < 64);

/// A row with no slab, all zero bytes (each use is a fresh value: the atomics in it are never shared).
#[allow(clippy::declare_interior_mutable_const)]
const EMPTY_ROW: ClassState = ClassState {
    top: 0,
    widx: 0,
    word: 0,
    base: core::ptr::null_mut(),
    size: 0,
    current: empty_slab(),
    count: AtomicU64::new(0),
    frees: AtomicU64::new(0),
    partial: core::ptr::null_mut(),
    full: core::ptr::null_mut(),
    stack: [core::ptr::null_mut(); STACK],
};

/// Adds one to a counter that only the calling thread writes: a relaxed load and store (one `inc`
/// on x86-64, no locked instruction), readable by other threads without a data race.
#[inline(always)]
fn bump(c: &AtomicU64) {
    c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Counts of one cache's slow-path events, for the statistics: each is written only by the cache's
/// owner (with [`bump`] or [`gauge`]: a load and a store, no locked instruction) and read by any
/// thread. Kept per cache and summed when a report is made ([`counts`]): as process-wide atomics
/// they shared one cache line that every thread's slow paths wrote with a locked add, which
/// `perf` found under `rptest` (4 threads, 4–16 KiB blocks: a slab every 25 allocations) on
/// 6.5 % of its samples, at the add of `slab_refills` alone.
#[repr(C)]
struct Counts {
    /// Allocation slow paths (`slab_refills`).
    refills: AtomicU64,
    /// Slabs of other caches queued for their owner by this thread's frees (`remote_frees`).
    queued: AtomicU64,
    /// Slabs taken from the heap (`slabs_acquired`).
    acquired: AtomicU64,
    /// Slabs given back to the heap (`slabs_released`).
    released: AtomicU64,
    /// Per class, slabs this cache has laid out for the class now: a gauge, up when a slab is laid
    /// out, down when it leaves the class (wrapping: only the sum over the caches is a count).
    class_slabs: [AtomicU64; NCLASSES],
}

impl Counts {
    const fn new() -> Counts {
        Counts {
            refills: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            acquired: AtomicU64::new(0),
            released: AtomicU64::new(0),
            class_slabs: [const { AtomicU64::new(0) }; NCLASSES],
        }
    }
}

/// Adds `by` (wrapping: a gauge's decrement is `by = -1 as u64`) to a counter that only the calling
/// thread writes, as [`bump`] does.
#[inline(always)]
fn gauge(c: &AtomicU64, by: u64) {
    c.store(c.load(Ordering::Relaxed).wrapping_add(by), Ordering::Relaxed);
}

/// Counts a slab laid out for `class` in `cache`; `fresh` if it came from the heap (not the spare).
///
/// # Safety
/// - owner: `cache` is owned by the calling thread; `class < NCLASSES`.
unsafe fn count_laid_out(cache: *mut Cache, class: usize, fresh: bool) {
    // SAFETY: owner (contract): the counts are written by the owner only.
    unsafe {
        if fresh {
            bump(&(*cache).counts.acquired);
        }
        gauge(&(*cache).counts.class_slabs[class], 1);
    }
}

/// Counts a slab of `class` that leaves its class in `cache`; `released` if it goes back to the heap
/// (not to the spare).
///
/// # Safety
/// - owner: `cache` is owned by the calling thread; `class < NCLASSES`.
unsafe fn count_left(cache: *mut Cache, class: usize, released: bool) {
    // SAFETY: owner (contract).
    unsafe {
        if released {
            bump(&(*cache).counts.released);
        }
        gauge(&(*cache).counts.class_slabs[class], u64::MAX);
    }
}

/// Gives `cache`'s spare (if any) back to the heap.
///
/// # Safety
/// - owner: `cache` is owned by the calling thread.
unsafe fn release_spare(cache: *mut Cache) {
    // SAFETY: owner (contract): the spare is an empty slab of this cache on no list.
    unsafe {
        let s = (*cache).spare;
        if !s.is_null() {
            (*cache).spare = core::ptr::null_mut();
            bump(&(*cache).counts.released);
            Slab::disown(s);
            heap::free_block((*s).data);
        }
    }
}

/// A thread cache.
///
/// Invariants: owned by one thread at a time (see the module documentation); `rows_now` points at
/// `rows[base]`, the first row of the row set the cache allocates from (`base` is a [`RowSet`] offset:
/// 0, `NCLASSES` or `2 * NCLASSES`), so `rows_now + c` is the row of class `c`; `spare` is null or
/// an empty slab of this cache in state `Spare`;
/// `remote` heads a Treiber stack (link `shared.remote_next`) of this cache's slabs with `QUEUED` set;
/// `depth` counts this thread's open load-phase guards; `settle_pending` asks the owner to settle its
/// load rows at its next slow path.
#[repr(C)]
pub struct Cache {
    rows: [ClassState; ROWS],
    /// The first row of the row set allocations come from (a pointer, so that the fast path adds the
    /// class's row to it and nothing else). Written by the owner, and by a process-wide phase switch
    /// from any thread (relaxed: the owner picks the change up at its next allocation; every row set
    /// is its own). Read once per allocation.
    rows_now: AtomicPtr<ClassState>,
    /// Nesting depth of this thread's load-phase guards (owner writes; other threads read).
    depth: AtomicUsize,
    /// Set when a load phase ended while this cache's thread was elsewhere: the owner settles its load
    /// rows at its next slow path.
    settle_pending: AtomicBool,
    /// The thread's current load-arena chunk (owner only), or null.
    chunk: *mut Chunk,
    spare: *mut Slab,
    remote: AtomicPtr<Slab>,
    /// Next cache in the list of all caches (immutable once linked).
    all_next: *mut Cache,
    /// Next cache in the pool of abandoned caches (pool lock).
    pool_next: *mut Cache,
    /// Per class, the load row's `count` when its rows were last settled (owner only).
    load_mark: [u64; NCLASSES],
    /// The bytes of load-row slots freed (`settle::load_freed`) at which the next sweep of the load
    /// slabs' free pages is due (owner only; see [`settle::sweep_if_due`]).
    sweep_at: usize,
    /// Per class, slots of other caches' slabs that this cache's thread freed (owner writes, with
    /// [`bump`]; any thread reads).
    remote_freed: [AtomicU64; NCLASSES],
    /// The cache layer's event counts of this cache's thread (owner writes, with [`bump`]; any
    /// thread reads), summed over every cache into the statistics ([`counts`]).
    counts: Counts,
    /// The scan for idle caches' state of this cache ([`remote::maybe_scan`], one at a time, the only
    /// reader and writer).
    idle: remote::Idle,
    /// Recently freed medium runs (owner only; see [`runs`]). Last, so that the end of its table of
    /// runs has a page of its own that only a thread which caches runs touches (see
    /// [`Cache::init_at`]).
    runs: runs::Runs,
}

/// A static that is never written: the empty cache.
#[repr(transparent)]
struct ReadOnly<T>(UnsafeCell<T>);
// SAFETY: the wrapped statics are never written: every write path first checks that it is not
// handling them (the empty cache's rows have no stack entry and no word, so the fast paths only read
// them, and the slow paths replace the empty cache before writing).
unsafe impl<T> Sync for ReadOnly<T> {}

/// `current` of a row without a slab: null. (It was the address of a static empty slab, never read:
/// every row of the static empty cache held it, so each of the cache's pages needed a relocation
/// at load, and every process had the 16 KiB of the empty cache copied into private memory.)
const fn empty_slab() -> *mut Slab {
    core::ptr::null_mut()
}

impl Cache {
    /// A cache with every row empty, allocating from the row set that starts at `rows_now` (a row of
    /// the cache being made: see [`Cache::rows_now`]).
    const fn new(rows_now: *mut ClassState) -> Cache {
        Cache {
            rows: [EMPTY_ROW; ROWS],
            rows_now: AtomicPtr::new(rows_now),
            depth: AtomicUsize::new(0),
            settle_pending: AtomicBool::new(false),
            chunk: core::ptr::null_mut(),
            spare: core::ptr::null_mut(),
            remote: AtomicPtr::new(core::ptr::null_mut()),
            all_next: core::ptr::null_mut(),
            pool_next: core::ptr::null_mut(),
            load_mark: [0; NCLASSES],
            sweep_at: settle::SWEEP_MIN,
            remote_freed: [const { AtomicU64::new(0) }; NCLASSES],
            counts: Counts::new(),
            idle: remote::Idle::new(),
            runs: runs::Runs::new(),
        }
    }

    /// Writes [`Cache::new`]`(rows_now)` at `c` field by field. Built whole and copied (`c.write(
    /// Cache::new(..))`), the 16 KiB cache was a temporary in `life::acquire_raw`'s 11.6 KiB stack
    /// frame, three pages of every new thread's stack touched for it; and the run table's entries
    /// need no writing (only the first `n[k]` of each bin are ever read), so its last page stays
    /// untouched in a thread that never caches a run. When the block is `zeroed` (fresh pages), the
    /// rows are not written either (an empty row is zero bytes): the page that holds only load and
    /// arena rows stays untouched in a thread that never allocates inside a load phase (4 KiB of
    /// every thread).
    ///
    /// # Safety
    /// - `c` is a writable, 64-aligned block of `size_of::<Cache>()` bytes that nothing else uses,
    ///   which reads as zero bytes if `zeroed`.
    unsafe fn init_at(c: *mut Cache, rows_now: *mut ClassState, zeroed: bool) {
        // Every field is written below: a field added to `Cache` must be added here (this pattern
        // stops compiling until it is).
        #[allow(dead_code)]
        fn every_field(c: Cache) {
            let Cache {
                rows: _,
                rows_now: _,
                depth: _,
                settle_pending: _,
                chunk: _,
                spare: _,
                remote: _,
                all_next: _,
                pool_next: _,
                load_mark: _,
                sweep_at: _,
                remote_freed: _,
                counts: _,
                idle: _,
                runs: _,
            } = c;
        }
        // SAFETY: field projections of a block we may write (contract), no reference formed.
        unsafe {
            if !zeroed {
                for i in 0..ROWS {
                    row(c, i).write(EMPTY_ROW);
                }
            }
            (&raw mut (*c).rows_now).write(AtomicPtr::new(rows_now));
            (&raw mut (*c).depth).write(AtomicUsize::new(0));
            (&raw mut (*c).settle_pending).write(AtomicBool::new(false));
            (&raw mut (*c).chunk).write(core::ptr::null_mut());
            (&raw mut (*c).spare).write(core::ptr::null_mut());
            (&raw mut (*c).remote).write(AtomicPtr::new(core::ptr::null_mut()));
            (&raw mut (*c).all_next).write(core::ptr::null_mut());
            (&raw mut (*c).pool_next).write(core::ptr::null_mut());
            (&raw mut (*c).load_mark).write([0; NCLASSES]);
            (&raw mut (*c).sweep_at).write(settle::SWEEP_MIN);
            (&raw mut (*c).remote_freed).write([const { AtomicU64::new(0) }; NCLASSES]);
            (&raw mut (*c).counts).write(Counts::new());
            (&raw mut (*c).idle).write(remote::Idle::new());
            runs::Runs::init_at(&raw mut (*c).runs);
        }
    }
}

/// The empty cache every thread starts with: all rows are empty. It allocates from its first row set,
/// whose first row is at its own address (`rows` is its first field).
static EMPTY_CACHE: ReadOnly<Cache> = ReadOnly(UnsafeCell::new(Cache::new(EMPTY_CACHE.0.get().cast())));

const fn empty_cache() -> *mut Cache {
    EMPTY_CACHE.0.get()
}

/// Row `i` of `cache`, without forming a reference to the rows array.
///
/// # Safety
/// - `cache` is a live cache (or the empty cache) and `i < ROWS`.
#[inline(always)]
unsafe fn row(cache: *mut Cache, i: usize) -> *mut ClassState {
    // SAFETY: `i < ROWS` keeps the pointer inside the array (contract); `&raw mut` forms no reference.
    unsafe { (&raw mut (*cache).rows).cast::<ClassState>().add(i) }
}

/// Makes `cache` allocate from the row set starting at row `base` (any thread: one atomic store).
///
/// # Safety
/// - `cache` is a live cache (not the empty one) and `base` a [`RowSet`] offset.
unsafe fn set_row_set(cache: *mut Cache, base: usize) {
    // SAFETY: `base < ROWS` (a RowSet offset); `rows_now` is atomic.
    unsafe { (*cache).rows_now.store(row(cache, base), Ordering::Relaxed) }
}

/// The [`RowSet`] offset `cache` allocates from.
///
/// # Safety
/// - `cache` is a live cache or the empty cache.
unsafe fn row_set(cache: *mut Cache) -> usize {
    // SAFETY: `rows_now` points into the cache's rows (invariant).
    unsafe {
        ((*cache).rows_now.load(Ordering::Relaxed) as usize - cache as usize) / core::mem::size_of::<ClassState>()
    }
}

/// What a slab records of its row (`Slab::row`): the row's byte offset in the cache, so that a free
/// finds the row with one add.
const fn row_tag(i: usize) -> u16 {
    (i * core::mem::size_of::<ClassState>()) as u16
}

const _: () = assert!(ROWS * core::mem::size_of::<ClassState>() <= u16::MAX as usize);

/// The row of `cache` that slab `s` belongs to.
///
/// # Safety
/// - `s` is a live slab of `cache`, a live cache.
#[inline(always)]
unsafe fn row_of(cache: *mut Cache, s: *mut Slab) -> *mut ClassState {
    // SAFETY: `row` is `row_tag(i)` of a row `i < ROWS` of the owner (set at `Slab::init` and
    // `settle`), so the byte offset stays inside the rows array, which starts the cache.
    unsafe { cache.cast::<u8>().add((*s).row as usize).cast() }
}

/// The row index of a slab's row tag.
fn row_index(tag: u16) -> usize {
    tag as usize / core::mem::size_of::<ClassState>()
}

/// The cache of a slab.
#[inline(always)]
fn cache_of(s: OwnerId) -> *mut Cache {
    s.cast()
}

/// Allocates a slot of `class` from the calling thread's cache, or `None` when the row has no
/// recently freed slot and no free bit in its checked-out word (then [`alloc_slow`]).
#[inline(always)]
pub fn alloc_fast(class: usize) -> Option<NonNull<u8>> {
    alloc_fast_at(class * ROW_BYTES)
}

/// [`alloc_fast`] for the class whose row starts `off` bytes into the row set ([`row_of_size`]).
#[inline(always)]
pub fn alloc_fast_at(off: usize) -> Option<NonNull<u8>> {
    debug_assert!(off % ROW_BYTES == 0 && off < NCLASSES * ROW_BYTES);
    let cache = life::tls_cache();
    // SAFETY: `cache` is this thread's cache or the empty cache; `rows_now + off` bytes is a row of
    // it (`rows_now` starts a row set of NCLASSES rows, and `off` is a multiple of the row's size
    // below NCLASSES of them). Stack
    // entries below `top` are free slots (non-null); a set bit of the row's word is a free slot at
    // `base + bit * size` (ClassState invariant). The empty cache's rows have `top == 0` and
    // `word == 0`, so they are only read; any other cache is the caller's own (owner).
    unsafe {
        let row = (*cache).rows_now.load(Ordering::Relaxed).byte_add(off);
        let t = (*row).top as usize;
        let p = if t != 0 {
            (*row).top = (t - 1) as u32;
            *(&raw const (*row).stack).cast::<*mut u8>().add(t - 1)
        } else {
            let w = (*row).word;
            if w == 0 {
                return None;
            }
            (*row).word = w & (w - 1);
            (*row).base.add(w.trailing_zeros() as usize * (*row).size)
        };
        bump(&(*row).count);
        // A slot handed out carries no freed mark (see the module documentation).
        p.add(slab::MARK_OFFSET).cast::<u64>().write(0);
        Some(NonNull::new_unchecked(p))
    }
}

/// The allocation slow path of [`alloc_fast`]: sets the thread up, then refills the row. Returns
/// null when memory runs out.
#[cold]
#[inline(never)]
pub fn alloc_slow(class: usize) -> *mut u8 {
    let mut cache = life::tls_cache();
    if cache == empty_cache() {
        if life::exiting() {
            return life::alloc_while_exiting(class);
        }
        cache = life::acquire();
        if cache.is_null() {
            return core::ptr::null_mut();
        }
    }
    // SAFETY: `cache` is this thread's own (owner); a slot (or arena object) has at least 16 bytes.
    unsafe {
        let p = refill_and_take(cache, class);
        if !p.is_null() {
            p.add(slab::MARK_OFFSET).cast::<u64>().write(0);
        }
        p
    }
}

/// Returns the row's checked-out word to its slab's bitmap.
///
/// # Safety
/// - `row` belongs to a cache owned by the calling thread.
unsafe fn checkin(row: *mut ClassState) {
    // SAFETY: owner; while a word is checked out, `current` is a live slab and widx < its nwords.
    unsafe {
        let (w, s) = ((*row).widx, (*row).current);
        if w == NO_WORD || s.is_null() {
            return;
        }
        *Slab::bits(s).add(w as usize) = (*row).word;
        (*s).free_count += (*row).word.count_ones();
        if w < (*s).hint {
            (*s).hint = w;
        }
        (*row).word = 0;
        (*row).widx = NO_WORD;
    }
}

/// Checks out the first non-zero bitmap word of the row's current slab. Returns `false` if none.
///
/// # Safety
/// - `row` belongs to a cache owned by the calling thread, has no word checked out, and its current
///   slab is live (not null).
unsafe fn checkout(row: *mut ClassState) -> bool {
    // SAFETY: owner; the word indices stay below the live slab's nwords.
    unsafe {
        let s = (*row).current;
        let bits = Slab::bits(s);
        let mut h = (*s).hint;
        while h < (*s).nwords {
            let w = *bits.add(h as usize);
            if w != 0 {
                *bits.add(h as usize) = 0;
                (*s).free_count -= w.count_ones();
                (*s).hint = h;
                (*row).word = w;
                (*row).widx = h;
                (*row).size = (*s).size as usize;
                (*row).base = (*s).data.add(h as usize * 64 * (*row).size);
                return true;
            }
            h += 1;
        }
        (*s).hint = h;
        false
    }
}

/// A thread looks for idle caches whose pages other threads' frees hold ([`remote::maybe_scan`]) at
/// every this many entries into its allocation slow path (the scan itself reads the clock and runs
/// at most every [`remote::IDLE_NS`]` / 2`).
const SCAN_EVERY: u64 = 64;

/// The allocation slow path: find a slot of `class` for `cache`.
///
/// # Safety
/// - `cache` is a live cache owned by the calling thread.
unsafe fn refill_and_take(cache: *mut Cache, class: usize) -> *mut u8 {
    // SAFETY: owner; `base + class < ROWS`.
    unsafe {
        bump(&(*cache).counts.refills);
        if (*cache).counts.refills.load(Ordering::Relaxed) % SCAN_EVERY == 0 {
            remote::maybe_scan(cache);
        }
        settle::settle_pending(cache);
        // Read once: a process-wide phase may switch the row set from another thread meanwhile, and
        // the decision (arena or rows) and the row must come from the same reading.
        let base = row_set(cache);
        if base == RowSet::Arena as usize {
            return arena_alloc(cache, class);
        }
        let ri = base + class;
        let row = row(cache, ri);
        loop {
            let w = (*row).word;
            if w != 0 {
                (*row).word = w & (w - 1);
                bump(&(*row).count);
                return (*row).base.add(w.trailing_zeros() as usize * (*row).size);
            }
            let s = (*row).current;
            if s != empty_slab() {
                checkin(row);
                // What other threads freed in this slab first: their slots go back to the bitmap
                // and lower the hint, so the next word checked out is the lowest with a free slot.
                // A producer whose blocks other threads free then keeps reusing the same pages
                // instead of walking through the whole slab before it looks back (xmalloc, rptest).
                remote::collect(cache, s);
                if checkout(row) {
                    continue;
                }
                if remote::collect(cache, s) > 0 {
                    continue;
                }
                (*row).current = empty_slab();
                list_push(row, s, SlabState::Full);
            }
            // Other threads' frees, every class's, before the next slab is chosen (not only when no
            // partial slab is left): slabs they emptied leave the full list at once, as the spare or
            // back to the heap where any class or thread can take them, and slabs they refilled join
            // the partial list. A producer whose consumers free its blocks otherwise kept a slab
            // per class waiting on its queue while it went through its partial ones (xmalloc's
            // median peak RSS 4.59 -> 4.49 MB, see the README's "Other threads").
            if !(*cache).remote.load(Ordering::Relaxed).is_null() {
                remote::drain(cache);
            }
            let next = (*row).partial;
            if !next.is_null() {
                list_remove(row, next);
                (*next).state = SlabState::Current;
                (*row).current = next;
                (*row).widx = NO_WORD;
                continue;
            }
            let fresh = new_slab(cache, class, ri);
            if fresh.is_null() {
                return core::ptr::null_mut();
            }
            (*row).current = fresh;
            (*row).widx = NO_WORD;
        }
    }
}

/// Bumps a `class` object out of the thread's load-arena chunk, taking a new chunk when it is full.
///
/// # Safety
/// - `cache` is owned by the calling thread.
unsafe fn arena_alloc(cache: *mut Cache, class: usize) -> *mut u8 {
    // SAFETY: owner; `chunk` is this thread's current chunk.
    unsafe {
        for _ in 0..2 {
            if !(*cache).chunk.is_null() {
                let p = arena::alloc((*cache).chunk, class);
                if !p.is_null() {
                    return p;
                }
                arena::retire((*cache).chunk);
            }
            (*cache).chunk = arena::new_chunk();
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
unsafe fn end_arena(cache: *mut Cache) {
    // SAFETY: owner.
    unsafe {
        let c = (*cache).chunk;
        if !c.is_null() {
            (*cache).chunk = core::ptr::null_mut();
            arena::retire(c);
        }
    }
}

/// A slab for `class` in row `row`: the cache's spare re-laid, or a new block from the heap.
///
/// # Safety
/// - `cache` is owned by the calling thread.
unsafe fn new_slab(cache: *mut Cache, class: usize, ri: usize) -> *mut Slab {
    // SAFETY: owner; the spare is an empty slab of this cache, on no list.
    unsafe {
        let s = (*cache).spare;
        if !s.is_null() {
            (*cache).spare = core::ptr::null_mut();
            Slab::init(s, (*s).data, class, row_tag(ri), cache.cast());
            count_laid_out(cache, class, false);
            return s;
        }
        let load = ri >= RowSet::Load as usize;
        let Some((block, _dirty)) = heap::alloc_block(SLAB_SHIFT, PageKind::Slab, load) else {
            return core::ptr::null_mut();
        };
        count_laid_out(cache, class, true);
        // The block is in the heap's region; its header is its entry of the slab table.
        let s = heap::slab_of(block);
        Slab::init(s, block, class, row_tag(ri), cache.cast());
        s
    }
}

/// The list head of `row` for slabs in `state` (`Partial` or `Full`).
///
/// # Safety
/// - `row` is a row of a cache owned by the calling thread.
unsafe fn list_head(row: *mut ClassState, state: SlabState) -> *mut *mut Slab {
    debug_assert!(matches!(state, SlabState::Partial | SlabState::Full));
    // SAFETY: field projection of a valid row, no reference formed.
    unsafe {
        if state == SlabState::Full {
            &raw mut (*row).full
        } else {
            &raw mut (*row).partial
        }
    }
}

/// Unlinks `s` from the list of its state (`Partial` or `Full`) in `row`.
///
/// # Safety
/// - owner; `s` is on that list of `row`.
unsafe fn list_remove(row: *mut ClassState, s: *mut Slab) {
    // SAFETY: list members are live slabs of the same cache (owner).
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

/// Pushes `s` onto the `state` list (`Partial` or `Full`) of `row` and sets its state.
///
/// # Safety
/// - owner; `s` is a live slab of the cache owning `row`, on no list.
unsafe fn list_push(row: *mut ClassState, s: *mut Slab, state: SlabState) {
    // SAFETY: list members are live slabs of the same cache (owner).
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
/// Every way out of the path that pushes onto the row's stack is a tail call of a function that
/// cannot unwind (`extern "C"`, or a Rust function that returns): so the path needs no stack frame
/// (an `extern "C"` caller, such as the library's `free`, would otherwise keep one for the landing
/// pad that aborts an unwinding callee, and one `call` of an abort, which never returns, kept it for
/// the stack's alignment: two instructions on every free).
///
/// # Safety
/// - `slab` is a live slab and `p` a pointer inside its block that was allocated and not freed.
#[inline(always)]
pub unsafe fn free_small(p: *mut u8, slab: *mut Slab) {
    let cache = life::tls_cache();
    // SAFETY: the slab is live (caller); its owner field is immutable.
    if unsafe { (*slab).owner } != cache.cast::<u8>() {
        // SAFETY: forwarded contract.
        return unsafe { remote::free(p, slab) };
    }
    // SAFETY: forwarded contract; `cache` owns the slab (just compared).
    unsafe { free_owned(p, slab, cache.cast()) }
}

/// Frees slot `p` of `slab`, a slab that another thread's cache owns: [`free_small`]'s other branch,
/// for the library's `free`, which has compared the owner already.
///
/// # Safety
/// - as [`free_small`], and `slab` is not the calling thread's cache's.
#[inline(always)]
pub unsafe fn free_remote(p: *mut u8, slab: *mut Slab) {
    // SAFETY: forwarded contract.
    unsafe { remote::free(p, slab) }
}

/// The calling thread's cache (the empty cache when it has none), to compare with a slab's `owner`
/// ([`free_owned`]).
#[inline(always)]
pub fn owner_id() -> OwnerId {
    life::tls_cache().cast()
}

/// Frees slot `p` of `slab`, a slab of the calling thread's cache: [`free_small`] after its owner
/// compare. The library's `free` calls it directly when the slab-table entry of `p`'s block names the
/// thread's own cache ([`owner_id`]), which says `p` is in one of its slabs (see `slab::Slab`'s
/// invariants) without the page map.
///
/// # Safety
/// - as [`free_small`], and `(*slab).owner == cache`, `cache` the calling thread's cache.
#[inline(always)]
pub unsafe fn free_owned(p: *mut u8, slab: *mut Slab, cache: OwnerId) {
    let cache = cache.cast::<Cache>();
    // SAFETY: owner (the slab is this thread's cache's); `p` lies in the slab's block (caller), and
    // once validated is a slot of at least 16 bytes, 16-aligned, so its second word is in it.
    unsafe {
        let Some(idx) = Slab::slot_of(slab, p as usize) else { return slab::reject(p) };
        let (mark, m) = (p.add(slab::MARK_OFFSET).cast::<u64>(), slab::freed_mark());
        if *mark == m {
            return free_marked(cache, slab, idx, p);
        }
        *mark = m;
        owner_release(cache, slab, idx, p)
    }
}

/// The owner's free of a slot whose freed mark is set: onto the row's stack, or into the word or
/// bitmap when the stack is full.
///
/// # Safety
/// - owner; `p` is slot `idx` of `slab`, a slab of `cache`, and is being freed.
#[inline(always)]
unsafe fn owner_release(cache: *mut Cache, slab: *mut Slab, idx: usize, p: *mut u8) {
    // SAFETY: owner; `t < STACK`.
    unsafe {
        let row = row_of(cache, slab);
        let t = (*row).top as usize;
        bump(&(*row).frees);
        if t < STACK {
            *(&raw mut (*row).stack).cast::<*mut u8>().add(t) = p;
            (*row).top = t as u32 + 1;
            return;
        }
        release_slot(row, slab, idx, p)
    }
}

/// A free that found the freed mark already in the slot: aborts if the slot is free (a double
/// free); otherwise the program's data happened to equal the mark, and the free goes on.
///
/// # Safety
/// - as [`owner_release`].
#[cold]
#[inline(never)]
unsafe extern "C" fn free_marked(cache: *mut Cache, slab: *mut Slab, idx: usize, p: *mut u8) {
    // SAFETY: owner: the row, its stack and the slab's bitmap are ours to read; the remote bitmap is
    // atomic.
    unsafe {
        let row = row_of(cache, slab);
        let stack = (&raw const (*row).stack).cast::<*mut u8>();
        let stacked = (0..(*row).top as usize).any(|i| *stack.add(i) == p);
        let (w, bit) = ((idx >> 6) as u32, 1u64 << (idx & 63));
        let in_word = (*row).current == slab && (*row).widx == w;
        let free_bit = if in_word { (*row).word & bit != 0 } else { *Slab::bits(slab).add(w as usize) & bit != 0 };
        if stacked || free_bit || remote::is_remote_freed(slab, idx) {
            os::invalid_pointer(p, "free(): double free detected");
        }
        owner_release(cache, slab, idx, p);
    }
}

/// Returns slot `idx` of `slab` to the row's checked-out word if it lies there, else to the slab's
/// bitmap, lowering the search hint and counting it free, and then moves the slab to the list its
/// fill level calls for ([`needs_refile`], [`free_slow`]). Aborts on a double free. Every call in it
/// is its last act, of a function that cannot unwind, so that the free path that inlines it needs no
/// stack frame (see [`free_small`]).
///
/// # Safety
/// - owner; `row` is `slab`'s row; `idx < nslots`; `p` is the slot.
#[inline(always)]
unsafe fn release_slot(row: *mut ClassState, slab: *mut Slab, idx: usize, p: *mut u8) {
    let w = (idx >> 6) as u32;
    let bit = 1u64 << (idx & 63);
    // SAFETY: owner: the row and the slab's bitmap are ours; w < nwords because idx < nslots.
    unsafe {
        if (*row).widx == w && (*row).current == slab {
            if (*row).word & bit != 0 {
                return double_free(p);
            }
            (*row).word |= bit;
            return;
        }
        let word = Slab::bits(slab).add(w as usize);
        if *word & bit != 0 {
            return double_free(p);
        }
        *word |= bit;
        if w < (*slab).hint {
            (*slab).hint = w;
        }
        (*slab).free_count += 1;
        if needs_refile(slab) {
            free_slow(slab);
        }
    }
}

/// Aborts on a double free of `p`: a function that returns as far as its callers know (see
/// [`slab::reject`]).
#[cold]
#[inline(never)]
extern "C" fn double_free(p: *mut u8) {
    os::invalid_pointer(p, "free(): double free detected")
}

/// Re-files a slab of the calling thread's cache after a slot was returned to it (out of line, and
/// unable to unwind: see [`release_slot`]).
///
/// # Safety
/// - `slab` is owned by the calling thread's cache.
#[cold]
#[inline(never)]
unsafe extern "C" fn free_slow(slab: *mut Slab) {
    // SAFETY: forwarded contract.
    unsafe { refile(slab) }
}

/// Returns the slots of `bits` in word `w` of `slab` (other threads' frees) to the row's checked-out
/// word if it is that word, else to the slab's bitmap, lowering the search hint and counting them
/// free. Aborts on a slot that is free already (a double free).
/// ([`release_slot`] for many slots at once; the one-slot version stays separate because it sits
/// inline in the owner's free path, where this one's generality cost two instructions.)
///
/// # Safety
/// - owner; `row` is `slab`'s row; `w < nwords`; `bits` are slots of the slab that were in use.
unsafe fn release_bits(row: *mut ClassState, slab: *mut Slab, w: u32, bits: u64) {
    // SAFETY: owner: the row and the slab's bitmap are ours; w < nwords.
    unsafe {
        let word = if (*row).widx == w && (*row).current == slab {
            &raw mut (*row).word
        } else {
            (*slab).free_count += bits.count_ones();
            if w < (*slab).hint {
                (*slab).hint = w;
            }
            Slab::bits(slab).add(w as usize)
        };
        let mut twice = *word & bits;
        // A slot on the row's stack that comes back from another thread too: freed by the owner and by
        // that thread. The owner's free looks for its freed mark first, but a slot on a page purged
        // since it was freed (a phase's sweep, an idle owner's purge) has lost it.
        let (lo, size) = ((*slab).data as usize + w as usize * 64 * (*slab).size as usize, (*slab).size as usize);
        for k in 0..(*row).top as usize {
            let off = (*(&raw const (*row).stack).cast::<*mut u8>().add(k) as usize).wrapping_sub(lo);
            if off < 64 * size {
                twice |= bits & (1u64 << (off / size));
            }
        }
        if twice != 0 {
            let p = (*slab).data.add((w as usize * 64 + twice.trailing_zeros() as usize) * (*slab).size as usize);
            os::invalid_pointer(p, "free(): double free detected");
        }
        *word |= bits;
    }
}

/// Whether a slab whose free count just grew must move lists: a full slab now has free slots, or a
/// partial slab is now empty (see [`refile`]).
///
/// # Safety
/// - `slab` is a live slab owned by the calling thread's cache.
#[inline(always)]
unsafe fn needs_refile(slab: *mut Slab) -> bool {
    // SAFETY: owner-only fields of a live slab.
    unsafe {
        (*slab).state == SlabState::Full
            || ((*slab).free_count == (*slab).nslots && (*slab).state == SlabState::Partial)
    }
}

/// Frees a slot of a slab owned by `cache`, wherever its word is, and re-files the slab if its fill
/// level calls for it.
///
/// # Safety
/// - as [`free_small`], and `cache` owns `slab` and is owned by the calling thread.
unsafe fn owner_free(cache: *mut Cache, slab: *mut Slab, p: *mut u8) {
    // SAFETY: forwarded contract.
    unsafe {
        let idx = Slab::index_of(slab, p);
        release_slot(row_of(cache, slab), slab, idx, p);
    }
}

/// Returns the slots on a row's stack to their slabs' bitmaps (aborting on a double free among them),
/// re-filing the slabs whose fill level changed.
///
/// # Safety
/// - owner: `row` belongs to `cache`, which the calling thread owns.
unsafe fn flush_stack(cache: *mut Cache, row: *mut ClassState) {
    // SAFETY: owner; entries below `top` are free slots of this cache's slabs.
    unsafe {
        while (*row).top > 0 {
            (*row).top -= 1;
            let p = *(&raw const (*row).stack).cast::<*mut u8>().add((*row).top as usize);
            let slab = heap::slab_of(p);
            owner_free(cache, slab, p);
        }
    }
}

/// Moves a slab to the list its fill level calls for: a full slab with free slots to the partial list,
/// an empty partial slab to the spare or back to the heap.
///
/// # Safety
/// - `slab` is owned by the calling thread's cache.
unsafe fn refile(slab: *mut Slab) {
    // SAFETY: owner; the slab is live and its owner's.
    unsafe {
        let cache = cache_of((*slab).owner);
        let row = row_of(cache, slab);
        if (*slab).state == SlabState::Full && (*slab).free_count > 0 {
            list_remove(row, slab);
            list_push(row, slab, SlabState::Partial);
        }
        if (*slab).state == SlabState::Partial && (*slab).free_count == (*slab).nslots {
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
/// - owner; `slab` is empty, on no list, owned by `cache`, not queued.
unsafe fn retire(cache: *mut Cache, slab: *mut Slab) {
    // SAFETY: owner.
    unsafe {
        let keep = (*cache).spare.is_null();
        count_left(cache, (*slab).class as usize, !keep);
        if keep {
            (*slab).state = SlabState::Spare;
            (*cache).spare = slab;
        } else {
            Slab::disown(slab);
            heap::free_block((*slab).data);
        }
    }
}

/// Per class, the slots handed out and the slots given back, ever, summed over every cache (and the
/// frees of threads without one): `allocs[c] - frees[c]` slots of class `c` are in use. Read while
/// other threads allocate, the sums are a moment's figures each, not one snapshot; with the other
/// threads quiet they are exact. Arena objects (load phases in arena mode) are not slots and are not
/// counted here.
pub fn class_counts() -> ([u64; NCLASSES], [u64; NCLASSES]) {
    let (mut allocs, mut frees) = ([0u64; NCLASSES], [0u64; NCLASSES]);
    for (c, f) in frees.iter_mut().enumerate() {
        *f = remote::ORPHAN_FREES[c].load(Ordering::Relaxed);
    }
    life::for_each_cache(|cache| {
        for ri in 0..ROWS {
            // SAFETY: `cache` is a live cache (never freed) and `ri < ROWS`; only its atomics are
            // read, through shared references to those fields alone (none to the row).
            let (a, f) = unsafe {
                let r = row(cache, ri);
                ((*r).count.load(Ordering::Relaxed), (*r).frees.load(Ordering::Relaxed))
            };
            allocs[ri % NCLASSES] += a;
            frees[ri % NCLASSES] += f;
        }
        for (c, f) in frees.iter_mut().enumerate() {
            // SAFETY: as above: an atomic of a live cache.
            *f += unsafe { (*cache).remote_freed[c].load(Ordering::Relaxed) };
        }
    });
    (allocs, frees)
}

/// The cache layer's counts, summed over every cache (see [`Counts`]).
#[derive(Default)]
struct CountSums {
    refills: u64,
    queued: u64,
    acquired: u64,
    released: u64,
    run_bytes: usize,
    run_hits: u64,
    run_puts: u64,
    class_slabs: [u64; NCLASSES],
}

/// Sums every cache's [`Counts`] and run-cache figures. Read while other threads allocate, each sum
/// is a moment's figure; with the other threads quiet they are exact.
fn counts() -> CountSums {
    let mut t = CountSums::default();
    life::for_each_cache(|cache| {
        // SAFETY: `cache` is a live cache (never freed); only its atomics are read, through shared
        // references to those fields alone.
        unsafe {
            let c = &raw const (*cache).counts;
            t.refills += (*c).refills.load(Ordering::Relaxed);
            t.queued += (*c).queued.load(Ordering::Relaxed);
            t.acquired += (*c).acquired.load(Ordering::Relaxed);
            t.released += (*c).released.load(Ordering::Relaxed);
            for (sum, g) in t.class_slabs.iter_mut().zip((*c).class_slabs.iter()) {
                *sum = sum.wrapping_add(g.load(Ordering::Relaxed));
            }
            let (bytes, hits, puts) = runs::cached(cache);
            t.run_bytes += bytes;
            t.run_hits += hits;
            t.run_puts += puts;
        }
    });
    t
}

/// The cache layer's figures in a statistics report (registered with [`stats::set_completer`] when
/// the first cache is made): its counters (kept per cache, see [`Counts`]), the slab bytes, the
/// per-class slots and `live_bytes`, which needs them.
fn complete_stats(s: &mut stats::Stats) {
    let t = counts();
    let k = &mut s.counters;
    k.slab_refills += t.refills as usize;
    k.remote_frees += t.queued as usize;
    k.slabs_acquired += t.acquired as usize;
    k.slabs_released += t.released as usize;
    k.run_cache_bytes += t.run_bytes;
    k.run_cache_hits += t.run_hits as usize;
    k.large_allocs += t.run_hits as usize;
    k.large_frees += t.run_puts as usize;
    s.slab_bytes = k.slabs_acquired.saturating_sub(k.slabs_released) * crate::size_class::SLAB_SIZE;
    let (allocs, frees) = class_counts();
    let mut small = 0;
    for (c, out) in s.classes.iter_mut().enumerate() {
        let g = crate::size_class::GEOMETRY[c];
        let in_use = allocs[c].saturating_sub(frees[c]) as usize;
        *out = stats::ClassStats {
            size: g.size as usize,
            slots_in_use: in_use,
            // A gauge summed while slabs come and go may be a moment below zero (wrapped).
            slots_reserved: (t.class_slabs[c] as i64).max(0) as usize * g.nslots as usize,
            allocations: allocs[c],
            frees: frees[c],
        };
        small += in_use * g.size as usize;
    }
    s.live_bytes = small
        + arena::LIVE_BYTES.load(Ordering::Relaxed)
        + s.large_bytes.saturating_sub(s.counters.run_cache_bytes)
        + s.counters.direct_bytes;
}

/// Settles the calling thread's load rows if the end of a phase left that to it (`settle_pending`,
/// see [`settle`]). The small slow path does it at every refill; the large paths call this, so that
/// a thread that allocates only large blocks after a process-wide phase (or a phase guard dropped on
/// another thread) gives its load slabs' free pages back then too.
#[inline]
pub fn settle_if_pending() {
    let c = mine();
    if c.is_null() {
        return;
    }
    // SAFETY: our own live cache (owner).
    unsafe { settle::settle_pending(c) }
}

/// Whether the calling thread allocates in a load phase (for marking large blocks).
#[inline]
pub fn current_is_load() -> bool {
    let c = mine();
    if c.is_null() {
        return crate::phase_state::process_active();
    }
    // SAFETY: our own live cache.
    unsafe { row_set(c) != RowSet::Run as usize }
}

/// Walks the calling thread's cache and checks its invariants: every row's current slab, word, lists
/// and stack against its slabs' bitmaps (see [`ClassState`] and [`Slab`]). For tests and debugging;
/// `Ok` for a thread with no cache yet.
pub fn check_mine() -> Result<(), &'static str> {
    let cache = mine();
    if cache.is_null() {
        return Ok(());
    }
    // SAFETY: our own cache (owner).
    unsafe { check(cache) }
}

/// # Safety
/// - owner.
unsafe fn check(cache: *mut Cache) -> Result<(), &'static str> {
    // SAFETY: owner: rows, slabs and bitmaps of this cache are ours to read.
    unsafe {
        let spare = (*cache).spare;
        if !spare.is_null() && ((*spare).state != SlabState::Spare || (*spare).owner != cache.cast::<u8>()) {
            return Err("the spare is not an empty slab of this cache in state Spare");
        }
        for ri in 0..ROWS {
            let r = row(cache, ri);
            let cur = (*r).current;
            if (cur == empty_slab() || (*r).widx == NO_WORD) && (*r).word != 0 {
                return Err("a row without a checked-out word has free bits");
            }
            if cur != empty_slab() {
                check_slab(cache, cur, ri, SlabState::Current)?;
                let out: &[(u32, u64)] = if (*r).widx == NO_WORD { &[] } else { &[((*r).widx, (*r).word)] };
                if let Some(&(w, _)) = out.first() {
                    let base = (*cur).data.add(w as usize * 64 * (*cur).size as usize);
                    if (*r).base != base || (*r).size != (*cur).size as usize {
                        return Err("the row's word base or size does not match its slab");
                    }
                }
                Slab::check(cur, out)?;
            }
            for state in [SlabState::Partial, SlabState::Full] {
                let mut prev: *mut Slab = core::ptr::null_mut();
                let mut s = *list_head(r, state);
                let mut n = 0;
                while !s.is_null() {
                    check_slab(cache, s, ri, state)?;
                    if (*s).prev != prev {
                        return Err("broken prev link in a slab list");
                    }
                    Slab::check(s, &[])?;
                    prev = s;
                    s = (*s).next;
                    n += 1;
                    if n > 1 << 20 {
                        return Err("a slab list does not end");
                    }
                }
            }
            let top = (*r).top as usize;
            if top > STACK {
                return Err("stack top beyond its capacity");
            }
            let stack = (&raw const (*r).stack).cast::<*mut u8>();
            for i in 0..top {
                let p = *stack.add(i);
                let s = match heap::page_kind_off(p as usize) {
                    Some((PageKind::Slab, off)) => heap::slab_at(off),
                    _ => return Err("a stacked slot is not in a slab of this cache"),
                };
                if (*s).owner != cache.cast::<u8>() {
                    return Err("a stacked slot is not in a slab of this cache");
                }
                if row_index((*s).row) != ri {
                    return Err("a stacked slot belongs to another row");
                }
                let idx = Slab::index_of(s, p);
                let (w, bit) = ((idx >> 6) as u32, 1u64 << (idx & 63));
                let in_word = s == cur && (*r).widx == w && (*r).word & bit != 0;
                if *Slab::bits(s).add(w as usize) & bit != 0 || in_word {
                    return Err("a stacked slot is also free in its slab (double free)");
                }
                if (0..i).any(|j| *stack.add(j) == p) {
                    return Err("a slot is stacked twice (double free)");
                }
            }
        }
        Ok(())
    }
}

/// # Safety
/// - owner; `s` is reachable from row `ri` of `cache`.
unsafe fn check_slab(cache: *mut Cache, s: *mut Slab, ri: usize, state: SlabState) -> Result<(), &'static str> {
    // SAFETY: owner-only header fields of a live slab of this cache.
    unsafe {
        if (*s).owner != cache.cast::<u8>() {
            return Err("a slab in a row of this cache has another owner");
        }
        if row_index((*s).row) != ri || (*s).class as usize != ri % NCLASSES {
            return Err("a slab is in the row of another class or row set");
        }
        if (*s).state != state {
            return Err("a slab's state does not match the list that holds it");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size_class::{class_of, GEOMETRY};

    /// Lays a new cache out in a fresh mapping of four pages (zero bytes), as in a block the heap says
    /// is `zeroed` or not, checks its invariants, and returns which pages that made resident.
    fn pages_of_a_new_cache(zeroed: bool) -> [u8; 4] {
        const PAGE: usize = 4096;
        let size = core::mem::size_of::<Cache>();
        assert!(size > 3 * PAGE && size <= 4 * PAGE, "the cache is {size} bytes: revisit these tests");
        // SAFETY: a fresh private anonymous mapping of four pages (zero bytes), ours alone, unmapped
        // at the end; the cache written there is only checked.
        unsafe {
            let m = libc::mmap(
                core::ptr::null_mut(),
                4 * PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(m, libc::MAP_FAILED);
            let c = m as *mut Cache;
            Cache::init_at(c, row(c, 0), zeroed);
            let mut res = [0u8; 4];
            assert!(os::resident_pages(m as *mut u8, 4 * PAGE, &mut res));
            // The rows read as empty ones, written or not: the invariants hold.
            assert_eq!(check(c), Ok(()));
            libc::munmap(m, 4 * PAGE);
            res.map(|b| b & 1)
        }
    }

    #[test]
    fn a_new_cache_leaves_the_last_page_of_its_block_untouched() {
        assert_eq!(pages_of_a_new_cache(false), [1, 1, 1, 0], "pages of a new cache made resident");
    }

    /// In a block known to be zero, a new cache writes only the page of its fields: its rows, empty
    /// as zero bytes, are left for the thread's allocations to touch (the process rows' page), and
    /// the page of load and arena rows stays untouched.
    #[test]
    fn a_new_cache_in_zeroed_memory_writes_only_the_page_of_its_fields() {
        assert_eq!(pages_of_a_new_cache(true), [0, 0, 1, 0], "pages of a new cache in zeroed memory made resident");
    }

    /// Allocates through the fast path, or the slow path on a miss.
    fn alloc(class: usize) -> *mut u8 {
        match alloc_fast(class) {
            Some(p) => p.as_ptr(),
            None => alloc_slow(class),
        }
    }

    fn slab_of(p: *mut u8) -> *mut Slab {
        assert_eq!(heap::page_kind(p as usize), Some(PageKind::Slab));
        // SAFETY: p is in the region (checked above).
        unsafe { heap::slab_of(p) }
    }

    /// Runs `f` on a new thread (a cache of its own), checking the cache after it.
    fn on_thread(f: impl FnOnce() + Send + 'static) {
        std::thread::spawn(move || {
            f();
            check_mine().unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn slots_are_distinct_and_the_last_freed_comes_back_first() {
        on_thread(|| {
            let class = class_of(40);
            let n = 3 * GEOMETRY[class].nslots as usize;
            let v: Vec<*mut u8> = (0..n).map(|_| alloc(class)).collect();
            check_mine().unwrap();
            let mut sorted = v.clone();
            sorted.sort();
            sorted.dedup();
            assert_eq!(sorted.len(), n, "a slot was handed out twice");
            for (i, &p) in v.iter().enumerate() {
                // SAFETY: our live slots of 48 bytes.
                unsafe { p.write_bytes(i as u8, 48) };
            }
            // Free every slot, checking after each: the stack fills, then words and bitmaps take them,
            // and slabs move between the lists.
            for &p in v.iter().rev() {
                // SAFETY: a live slot of a slab of this thread, freed once.
                unsafe { free_small(p, slab_of(p)) };
                check_mine().unwrap();
            }
            // The stack kept the first STACK slots freed (later ones went to the bitmap); the next
            // allocation pops the most recent of them.
            let again = alloc(class);
            assert_eq!(again, v[n - STACK]);
            // SAFETY: live slot.
            unsafe { free_small(again, slab_of(again)) };
        });
    }

    #[test]
    fn a_slab_given_back_names_no_cache() {
        on_thread(|| {
            let class = class_of(2048);
            let n = 8 * GEOMETRY[class].nslots as usize;
            let v: Vec<*mut u8> = (0..n).map(|_| alloc(class)).collect();
            let mut slabs: Vec<*mut Slab> = v.iter().map(|&p| slab_of(p)).collect();
            slabs.dedup();
            assert!(slabs.len() >= 8);
            let me = owner_id();
            // SAFETY: our live slots, each freed once.
            unsafe { free_all(v.iter().map(|&p| p as usize)) };
            // The cache holds its current slab, the slabs of the slots on its stack (on the partial
            // list) and a spare; the others went back to the heap. No entry of those names this
            // cache any more (another thread may have made one its own slab since, which names that
            // thread's cache), so a free of a large block there cannot be taken for a free of one
            // of this cache's slots (`global::free_raw`).
            let cache = life::tls_cache();
            let mut held = Vec::new();
            // SAFETY: the cache is this thread's (owner): its rows, lists and spare are ours to read.
            unsafe {
                let r = row(cache, row_set(cache) + class);
                held.push((*r).current);
                for head in [(*r).partial, (*r).full] {
                    let mut s = head;
                    while !s.is_null() {
                        held.push(s);
                        s = (*s).next;
                    }
                }
                held.push((*cache).spare);
            }
            let given_back: Vec<_> = slabs.iter().filter(|s| !held.contains(s)).collect();
            assert!(given_back.len() >= 2, "{} slabs, {} held", slabs.len(), held.len());
            for &&s in &given_back {
                // SAFETY: an entry of the slab table: readable (zeroed where no slab ever was).
                assert_ne!(unsafe { (*s).owner }, me, "a slab given back still names its cache");
            }
            for &s in held.iter().filter(|s| !s.is_null()) {
                // SAFETY: a slab this cache holds.
                assert_eq!(unsafe { (*s).owner }, me);
            }
        });
    }

    /// Frees every slot of `ps`, from whichever thread calls it.
    ///
    /// # Safety
    /// - every address in `ps` is a live slot that the caller gives up, listed once.
    unsafe fn free_all(ps: impl IntoIterator<Item = usize>) {
        for p in ps {
            // SAFETY: a live slot, freed once (contract).
            unsafe { free_small(p as *mut u8, slab_of(p as *mut u8)) };
        }
    }

    /// Runs `before` on a thread of its own (the owner); a second thread frees the slots it returns
    /// (remote frees); then `after` runs on the owner with the rest of what `before` returned.
    fn freed_by_another_thread<T: Send + 'static>(
        before: impl FnOnce() -> (Vec<usize>, T) + Send + 'static,
        after: impl FnOnce(T) + Send + 'static,
    ) {
        let (tx, rx) = std::sync::mpsc::channel::<Vec<usize>>();
        let (back_tx, back_rx) = std::sync::mpsc::channel::<()>();
        let owner = std::thread::spawn(move || {
            let (remote, rest) = before();
            tx.send(remote).unwrap();
            back_rx.recv().unwrap();
            after(rest);
        });
        let v = rx.recv().unwrap();
        // SAFETY: the owner's live slots, handed over whole and freed once here.
        on_thread(move || unsafe { free_all(v) });
        back_tx.send(()).unwrap();
        owner.join().unwrap();
    }

    #[test]
    fn remote_frees_come_back_to_the_owner() {
        let class = class_of(100);
        // Two whole slabs: the owner's current slab has no free slot left.
        let n = 2 * GEOMETRY[class].nslots as usize;
        freed_by_another_thread(
            move || {
                let v: Vec<usize> = (0..n).map(|_| alloc(class) as usize).collect();
                (v.clone(), v)
            },
            move |v| {
                // Every slot was freed by the other thread. The owner applies the remote frees: the
                // current slab's come back first, and an emptied slab is kept as the spare and re-laid,
                // so at least one slab's worth of the same slots is handed out again.
                let again: Vec<usize> = (0..n).map(|_| alloc(class) as usize).collect();
                check_mine().unwrap();
                let reused = again.iter().filter(|p| v.contains(p)).count();
                assert!(reused >= n / 2, "remote frees were not reused by the owner ({reused} of {n})");
                // SAFETY: live slots of this thread, freed once.
                unsafe { free_all(again) };
            },
        );
    }

    #[test]
    fn a_slab_emptied_by_other_threads_is_taken_back_at_the_next_slow_path() {
        let class = class_of(100);
        let slots = GEOMETRY[class].nslots as usize;
        freed_by_another_thread(
            move || {
                // Three whole slabs, in the order handed out: the first goes to the other thread, the
                // second gets half its slots back from its owner (on the partial list: its bitmap has
                // free bits), the third is current with no free slot.
                let v: Vec<usize> = (0..3 * slots).map(|_| alloc(class) as usize).collect();
                let (first, second) = (slab_of(v[0] as *mut u8), slab_of(v[slots] as *mut u8));
                assert!(v[..slots].iter().all(|&p| slab_of(p as *mut u8) == first));
                assert!(v[slots..2 * slots].iter().all(|&p| slab_of(p as *mut u8) == second));
                // SAFETY: live slots of this thread, freed once (the second slab's first half).
                unsafe { free_all(v[slots..slots + slots / 2].iter().copied()) };
                // SAFETY: owner-only fields of this thread's live slabs, read by the owner.
                unsafe {
                    assert_eq!((*second).state, SlabState::Partial);
                    assert_eq!((*first).state, SlabState::Full);
                }
                (v[..slots].to_vec(), v)
            },
            move |v| {
                let (first, second) = (slab_of(v[0] as *mut u8), slab_of(v[slots] as *mut u8));
                // Every slot of the first slab was freed by the other thread. The stack's slots first,
                // then the slow path: the partial slab is there to take, and the queued remote frees
                // are applied on the way, so the emptied slab leaves the full list at once (kept as
                // the spare or given back to the heap) instead of waiting until no partial slab is
                // left.
                let mut again: Vec<usize> = (0..STACK + 1).map(|_| alloc(class) as usize).collect();
                assert_eq!(slab_of(again[STACK] as *mut u8), second, "the partial slab was not taken");
                // SAFETY: the owner reads its own slab's state; a slab given back is no longer a slab
                // of this class (its page kind changes or it is re-laid).
                let kept =
                    heap::page_kind(v[0]) == Some(PageKind::Slab) && unsafe { (*first).state } == SlabState::Full;
                assert!(!kept, "a slab that other threads emptied stayed on the full list");
                check_mine().unwrap();
                again.extend(v[slots / 2 + slots..].iter().copied());
                // SAFETY: the slots this thread still holds (the second slab's other half, the third
                // slab, the ones just taken), each once.
                unsafe { free_all(again) };
            },
        );
    }

    #[test]
    fn the_walker_sees_a_slot_stacked_twice() {
        on_thread(|| {
            let class = class_of(16);
            let p = alloc(class);
            let q = alloc(class);
            // SAFETY: our own cache (owner); `q` is freed once, then its stack entry is duplicated by
            // hand (a double free would abort before it got there) and the duplicate taken off again.
            unsafe {
                free_small(q, slab_of(q));
                let row = row_of(mine(), slab_of(q));
                let t = (*row).top as usize;
                *(&raw mut (*row).stack).cast::<*mut u8>().add(t) = q;
                (*row).top += 1;
                assert_eq!(check_mine(), Err("a slot is stacked twice (double free)"));
                (*row).top -= 1;
                check_mine().unwrap();
                free_small(p, slab_of(p));
            }
        });
    }

    #[test]
    fn data_equal_to_the_freed_mark_is_not_a_double_free() {
        on_thread(|| {
            let class = class_of(32);
            let p = alloc(class);
            // SAFETY: a live slot of 32 bytes, freed once.
            unsafe {
                p.add(slab::MARK_OFFSET).cast::<u64>().write(slab::freed_mark());
                free_small(p, slab_of(p));
            }
            assert_eq!(alloc(class), p, "freed normally, onto the stack");
            // SAFETY: live again; its mark was cleared when it was handed out.
            unsafe {
                assert_eq!(p.add(slab::MARK_OFFSET).cast::<u64>().read(), 0);
                free_small(p, slab_of(p));
            }
        });
    }

    #[test]
    fn the_empty_cache_sends_every_class_to_the_slow_path() {
        on_thread(|| {
            for class in 0..NCLASSES {
                assert!(alloc_fast(class).is_none() || !mine().is_null());
            }
        });
        std::thread::spawn(|| assert!(alloc_fast(0).is_none())).join().unwrap();
    }
}
