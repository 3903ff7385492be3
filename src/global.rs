//! Routing: which part of the allocator serves a request. `GlobalAlloc` and the C API both call in
//! here; who owns a pointer is answered by `owner`.
//!
//! - a small request (≤ 16 KiB, alignment ≤ 4 KiB) goes to the thread cache: its fast path, or on a
//!   miss [`small_slow`], which also polls the start-up phase trigger;
//! - a large one (up to the largest buddy block) to the heap, as a run of whole pages;
//! - anything larger to a direct mapping.

use core::alloc::{GlobalAlloc, Layout};
use core::sync::atomic::{AtomicU8, Ordering};

use crate::buddy;
use crate::cache;
use crate::debug;
use crate::direct;
use crate::heap;
use crate::options;
use crate::os::{self, PAGE};
use crate::owner::{self, Owner};
use crate::phase;
use crate::profile;
use crate::size_class::{class_for, natural_align, CLASS_SIZES, SMALL_MAX};
use crate::stats::{self, COUNTERS};
use crate::valgrind as vg;

/// A slot of `class` from the calling thread's cache: the fast path, else the slow path.
#[inline(always)]
fn small(class: usize) -> *mut u8 {
    match cache::alloc_fast(class) {
        Some(p) => p.as_ptr(),
        None => small_slow(class),
    }
}

/// [`small`] for a request of `size` bytes (≤ `SMALL_MAX`, alignment ≤ 16), by the row of its class.
#[inline(always)]
fn small_of_size(size: usize) -> *mut u8 {
    let off = cache::row_of_size(size);
    match cache::alloc_fast_at(off) {
        Some(p) => p.as_ptr(),
        None => small_slow(cache::class_of_row(off)),
    }
}

/// What every allocation slow path (the small one, and every large allocation) does around its
/// allocation: the start-up phase's trigger is polled before it (here, because the phase layer sits
/// above the caches; an allocation after the phase's end belongs to the run), and
/// `EDGEPOOL_CURVE`'s sampler is started after it if asked, outside every lock (starting it may
/// allocate: pthread_create).
#[inline(always)]
fn around_slow_path(alloc: impl FnOnce() -> *mut u8) -> *mut u8 {
    phase::poll_trigger();
    let p = alloc();
    crate::curve::poll();
    p
}

/// The small-object slow path: the cache refills (settling its load rows first if a phase's end
/// left that to it), inside [`around_slow_path`].
#[cold]
#[inline(never)]
fn small_slow(class: usize) -> *mut u8 {
    around_slow_path(|| {
        let p = cache::alloc_slow(class);
        if p.is_null() {
            small_as_run(class)
        } else {
            p
        }
    })
}

/// A small request that no slot could serve, because the heap had no 64 KiB block for a new slab
/// (an address-space limit or a budget reached, the free pages scattered): a run of whole pages, as
/// a large request takes, while free pages remain. glibc serves such a request from its last free
/// chunks; before, edgepool failed it (a program that filled a 50 MB address-space limit with
/// 100 000-byte blocks then got `NULL` from `malloc(16)`). Freed, reallocated and sized as any run:
/// the page map says what a block is, not the request that made it. Not in the hardened mode, which
/// promises a guard page after every small block's slab.
#[cold]
#[inline(never)]
fn small_as_run(class: usize) -> *mut u8 {
    if !heap::ensure_init() || heap::secure() {
        return core::ptr::null_mut();
    }
    let size = CLASS_SIZES[class];
    // The thread's run cache first, which keeps such a run once it is freed.
    large_or_mapped(size, natural_align(size), false, false)
}

/// Allocates `size` bytes aligned to `align` (a power of two). Returns null on failure. `size == 0`
/// is served as 1 byte.
#[inline(always)]
pub fn alloc(size: usize, align: usize) -> *mut u8 {
    if hooked() {
        return alloc_hooked(size, align, false);
    }
    alloc_raw(size, align)
}

/// The alignment `malloc` gives (glibc's: twice the size of a pointer).
pub const MALLOC_ALIGN: usize = 16;

/// `malloc`'s path: [`alloc`] at [`MALLOC_ALIGN`], with errno set to `ENOMEM` on failure. Every way
/// out of the fast path is a tail call of a function that cannot unwind, so that the library's
/// `malloc`, an `extern "C"` function, keeps no stack frame (it kept one for the test of the slow
/// path's result that errno needs, and for the landing pad that aborts an unwinding callee: two
/// instructions on every allocation; see `cache::free_small`).
#[inline(always)]
pub fn alloc_c(size: usize) -> *mut u8 {
    if !hooked() && is_small(size, MALLOC_ALIGN) {
        if let Some(p) = cache::alloc_fast_at(cache::row_of_size(size)) {
            return p.as_ptr();
        }
    }
    alloc_c_slow(size)
}

/// [`alloc_c`] when the fast path missed.
#[cold]
#[inline(never)]
extern "C" fn alloc_c_slow(size: usize) -> *mut u8 {
    let p = alloc(size, MALLOC_ALIGN);
    if p.is_null() {
        os::set_errno(libc::ENOMEM);
    }
    p
}

/// Whether a request goes to the slab caches: one unsigned compare sends 0 and everything beyond
/// SMALL_MAX to the general path.
#[inline(always)]
fn is_small(size: usize, align: usize) -> bool {
    size.wrapping_sub(1) < SMALL_MAX && align <= 16
}

/// [`alloc`] without the hooks.
#[inline(always)]
fn alloc_raw(size: usize, align: usize) -> *mut u8 {
    if is_small(size, align) {
        small_of_size(size)
    } else {
        alloc_general(size, align, false)
    }
}

/// Whether allocations go through [`alloc_hooked`] and frees through [`free_hooked`]: under valgrind,
/// in debug mode or profiling, and until the first call has found out (the hooks must be known before the first
/// block is handed out: debug mode changes every block's layout).
static HOOKS: AtomicU8 = AtomicU8::new(HOOKS_UNKNOWN);
const HOOKS_UNKNOWN: u8 = 0x80;
const HOOK_VALGRIND: u8 = 1;
const HOOK_DEBUG: u8 = 2;
const HOOK_PROFILE: u8 = 4;

/// With the `debug` feature, one load and branch on the fast paths: 4 instructions on each
/// (`scripts/fast-path-insns.py`), criterion's `pair` about 10 % slower (see the README, "Debug
/// mode"); hence the feature.
///
/// Without the `debug` feature only valgrind's client requests need it: with the `valgrind` feature
/// [`vg::active`] is the check, and without either nothing is checked at all.
#[inline(always)]
fn hooked() -> bool {
    if cfg!(feature = "debug") {
        HOOKS.load(Ordering::Relaxed) != 0
    } else {
        vg::active()
    }
}

/// The hooks in effect, found out on first use: initialises the heap (which reads the options),
/// starts debug mode if `EDGEPOOL_DEBUG` asks for it and profiling if `EDGEPOOL_PROFILE` does (neither
/// under valgrind, which checks the same things itself, and would see debug mode's trailers as the
/// program's bytes).
#[cold]
fn hooks() -> u8 {
    let h = HOOKS.load(Ordering::Relaxed);
    if h & HOOKS_UNKNOWN == 0 {
        return h;
    }
    if vg::active() {
        HOOKS.store(HOOK_VALGRIND, Ordering::Relaxed);
        return HOOK_VALGRIND;
    }
    if !cfg!(feature = "debug") {
        HOOKS.store(0, Ordering::Relaxed);
        return 0;
    }
    let mut h = 0;
    if heap::ensure_init() {
        let opts = heap::options();
        if debug::start(opts.get(options::DEBUG)) {
            h |= HOOK_DEBUG;
        }
        if opts.get(options::PROFILE) != 0 {
            profile::start();
            h |= HOOK_PROFILE;
        }
    }
    // Published before the exit hook is registered: `atexit` may allocate, which must find the hooks
    // known. Threads that resolve at the same time find the same value; one of them publishes it and
    // registers the report.
    if HOOKS.compare_exchange(HOOKS_UNKNOWN, h, Ordering::Relaxed, Ordering::Relaxed).is_ok() && h & HOOK_PROFILE != 0 {
        os::at_exit(profile::report);
    }
    h
}

/// [`alloc`] (or [`alloc_zeroed`]) through the hooks.
#[cold]
#[inline(never)]
fn alloc_hooked(size: usize, align: usize, zeroed: bool) -> *mut u8 {
    let h = hooks();
    let p = if h & HOOK_DEBUG != 0 {
        debug_alloc(size, align, zeroed, debug::Op::Alloc)
    } else if zeroed {
        alloc_zeroed_raw(size, align)
    } else {
        alloc_raw(size, align)
    };
    if h & HOOK_VALGRIND != 0 {
        vg_handed_out(p, size, zeroed);
    }
    if h & HOOK_PROFILE != 0 && !p.is_null() {
        profile::on_alloc(size, block_usable(p));
    }
    p
}

/// The usable size of the live block `p` in the allocator underneath (debug mode's trailer
/// included), or 0 when `p` is not a block.
fn block_usable(p: *mut u8) -> usize {
    // SAFETY: `owner` only looks `p` up; `usable` reads a live block's metadata, and answers `None`
    // for a pointer that is not one.
    unsafe { owner::usable(owner::owner(p), p) }.unwrap_or(0)
}

/// Debug mode's allocation: `size` plus the trailer, then the canary (see `debug`).
fn debug_alloc(size: usize, align: usize, zeroed: bool, op: debug::Op) -> *mut u8 {
    let Some(n) = size.checked_add(debug::TRAILER) else { return core::ptr::null_mut() };
    let p = if zeroed { alloc_zeroed_raw(n, align) } else { alloc_raw(n, align) };
    if !p.is_null() {
        // SAFETY: a block just handed out; its owner tells its usable size.
        unsafe {
            let o = owner::owner(p);
            let usable = owner::usable(o, p).unwrap_or(n);
            debug::handed_out(p, o, size, usable, op);
        }
    }
    p
}

/// Tells valgrind that `p` (if not null) is a block of `size` bytes, its slack beyond them out of
/// bounds (see `valgrind`).
#[cold]
#[inline(never)]
fn vg_handed_out(p: *mut u8, size: usize, zeroed: bool) {
    if p.is_null() {
        return;
    }
    vg::malloclike(p, size, zeroed);
    // SAFETY: `p` is a live block just allocated.
    let usable = unsafe { usable_size(p) };
    if usable > size {
        vg::noaccess(p.wrapping_add(size), usable - size);
    }
}

/// Tells valgrind that the block at `p` (not null) is given back; the first 16 bytes of a slab slot
/// stay the allocator's (its remote-free link and freed mark).
#[cold]
#[inline(never)]
fn vg_given_back(p: *mut u8) {
    vg::freelike(p);
    if let Some(Owner::Slab(_)) = owner::in_heap(p) {
        vg::defined(p, 16);
    }
}

/// Allocation of anything but a small request with alignment ≤ 16. With `zeroed`, the memory is zero.
#[cold]
#[inline(never)]
pub fn alloc_general(size: usize, align: usize, zeroed: bool) -> *mut u8 {
    alloc_general_with(size, align, zeroed, true)
}

/// Smallest large block that a load phase prefaults.
const PREFAULT_MIN: usize = 256 << 10;

/// [`alloc_general`]; `prefault` allows a load phase to prefault a large block of fresh memory
/// (`EDGEPOOL_LOAD_PREFAULT`). Loaders write the large blocks they allocate (weights, their copies,
/// packed forms), and one `MADV_POPULATE_WRITE` per block costs far less than a fault per page:
/// measured on tract loading a 128 MB model, 147k page faults fell to about 4k and the load time
/// from ~380 to ~330 ms (load-bench median), at the same peak. Zeroed requests are left out (a large
/// zeroed buffer is often used sparsely), and so are `realloc`'s moves (their new tail is capacity,
/// not yet data).
#[inline]
fn alloc_general_with(size: usize, align: usize, zeroed: bool, prefault: bool) -> *mut u8 {
    let size = size.max(1);
    if let Some(c) = class_for(size, align) {
        let p = small(c);
        if zeroed && !p.is_null() {
            // SAFETY: the slot holds at least `size` writable bytes.
            unsafe { core::ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    if size > isize::MAX as usize - PAGE || align > isize::MAX as usize / 2 + 1 {
        return core::ptr::null_mut();
    }
    if !heap::ensure_init() {
        return core::ptr::null_mut();
    }
    // The large paths are allocation slow paths too, and a program may allocate nothing small for a
    // long while (a loader reading weights): as the small slow path's refill does, a phase's end
    // that left this thread's load rows to it is carried out before the allocation.
    around_slow_path(|| {
        cache::settle_if_pending();
        large_or_mapped(size, align, zeroed, prefault)
    })
}

/// The rest of [`alloc_general_with`] for a request no size class serves: the thread's run cache,
/// a large block of the heap, or a mapping of its own.
#[inline]
fn large_or_mapped(size: usize, align: usize, zeroed: bool, prefault: bool) -> *mut u8 {
    let max = heap::max_block();
    if size <= max && align <= max {
        let load = cache::current_is_load();
        if !load && align <= PAGE {
            // A hit counts in `large_allocs` through the run cache's own count.
            let p = cache::runs::take(size.div_ceil(PAGE));
            if !p.is_null() {
                if zeroed {
                    // SAFETY: the run holds at least `size` bytes, ours now.
                    unsafe { core::ptr::write_bytes(p, 0, size) };
                }
                return p;
            }
        }
        if load {
            cache::settle::sweep_if_due();
        }
        return large_block(size, align, zeroed, prefault, load, 0).map_or(core::ptr::null_mut(), |(p, _)| p);
    }
    // Fresh mappings are zero: nothing to clear.
    direct::alloc(size, align)
}

/// A large block from the heap for [`alloc_general_with`] (the thread's run cache missed) and for a
/// block that `realloc` moves a block of `moving` bytes into: the block, and how many of its bytes
/// were not resident (the pages it faults in as it is written).
#[inline(never)]
fn large_block(
    size: usize,
    align: usize,
    zeroed: bool,
    prefault: bool,
    load: bool,
    moving: usize,
) -> Option<(*mut u8, usize)> {
    let fill_from = (!zeroed).then_some(moving);
    let (p, flags, bytes, resident) = heap::alloc_large_moving(size, align, load, moving, fill_from)?;
    stats::add(&COUNTERS.large_allocs, 1);
    if load && prefault && !zeroed && bytes - resident >= PREFAULT_MIN && heap::load_prefault() {
        // SAFETY: a page-aligned, read-write run of `bytes` that this call owns, mostly fresh pages
        // (populating the resident ones changes nothing).
        unsafe { os::populate(p, bytes) };
    }
    if load {
        phase::LOAD_LARGE_ALLOCS.fetch_add(1, Ordering::Relaxed);
        stats::add(&phase::LOAD_LARGE_LIVE, bytes);
    }
    // Purged pages read zero unless the program wrote to them after freeing them: only pages never
    // handed out are trusted to be zero.
    if zeroed && flags & (buddy::DIRTY | buddy::USED) != 0 {
        // SAFETY: the block holds at least `size` bytes.
        unsafe { core::ptr::write_bytes(p, 0, size) };
    }
    Some((p, bytes - resident))
}

/// Allocates zeroed memory.
#[inline]
pub fn alloc_zeroed(size: usize, align: usize) -> *mut u8 {
    if hooked() {
        return alloc_hooked(size, align, true);
    }
    alloc_zeroed_raw(size, align)
}

#[inline]
fn alloc_zeroed_raw(size: usize, align: usize) -> *mut u8 {
    if size.wrapping_sub(1) < SMALL_MAX && align <= 16 {
        let p = small_of_size(size);
        if !p.is_null() {
            // SAFETY: the slot holds at least `size` bytes.
            unsafe { core::ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    alloc_general(size, align, true)
}

/// Frees `p` (null is a no-op). Aborts with a message on a pointer that is not a live block.
///
/// # Safety
/// - `p` is null or was returned by this allocator and not freed since.
#[inline(always)]
pub unsafe fn free(p: *mut u8) {
    if hooked() {
        // SAFETY: forwarded contract.
        return unsafe { free_hooked(p) };
    }
    // SAFETY: forwarded contract.
    unsafe { free_raw(p) }
}

/// [`free`] through the hooks.
///
/// # Safety
/// - as [`free`].
#[cold]
#[inline(never)]
unsafe extern "C" fn free_hooked(p: *mut u8) {
    if p.is_null() {
        return;
    }
    let h = hooks();
    if h & HOOK_PROFILE != 0 {
        profile::on_free(block_usable(p));
    }
    // SAFETY: forwarded contract.
    unsafe { free_with(h, p) }
}

/// Frees `p` (not null) through the hooks `h` other than profiling.
///
/// # Safety
/// - as [`free`].
unsafe fn free_with(h: u8, p: *mut u8) {
    if h & HOOK_DEBUG != 0 {
        // SAFETY: debug mode is on; `retire` checks `p` and aborts unless it is a live block.
        let r = unsafe { debug::retire(p, debug::Op::Free) };
        // SAFETY: a live block of the allocator underneath that debug mode gives up (or null).
        unsafe { free_raw(r.block()) };
        return;
    }
    if h & HOOK_VALGRIND != 0 {
        vg_given_back(p);
    }
    // SAFETY: forwarded contract.
    unsafe { free_raw(p) }
}

/// [`free`] without the hooks.
///
/// The common case first, without the page map: `p` in the region, and the slab-table entry of its
/// 64 KiB block naming this thread's cache as its owner. That entry's `owner` is null unless the
/// block is a slab that the cache holds (`slab::Slab`'s invariants), so the match says `p` lies in
/// one of this thread's slabs. Otherwise the page map says whether `p` is in another thread's slab
/// (a remote free), and every other pointer (a large block, an arena object, a direct mapping, null)
/// takes [`free_general`]. One memory access and six instructions fewer on the owner's free than
/// through [`owner::in_heap`]; five more on a remote free (cachegrind, `xmalloc 0.2`, whose frees
/// are all remote: `free` 55.5 M instructions against 45.2 M, the program 443.1 M against 432.8 M).
/// Going on to [`free_general`] instead cost 37 more (the program 508.9 M).
///
/// # Safety
/// - as [`free`].
#[inline(always)]
unsafe fn free_raw(p: *mut u8) {
    if let Some(off) = heap::region_off(p as usize) {
        let s = heap::slab_at(off);
        let mine = cache::owner_id();
        // SAFETY: the slab table covers the region, and its entries are readable (zeroed where no slab
        // ever was); `owner` is written only at a slab's init and by its own cache.
        if unsafe { (*s).owner } == mine {
            // SAFETY: forwarded contract; the entry names this thread's cache, so `p` lies in one of
            // its slabs (see above).
            return unsafe { cache::free_owned(p, s, mine) };
        }
        // The offset again, so that the owner's path above need not keep it in a register (one
        // instruction there; four more here, on the remote free).
        if let Some(off) = heap::region_off(p as usize) {
            if heap::page_kind_at(off) == buddy::PageKind::Slab {
                // SAFETY: forwarded contract; the page map says `p` is in a live slab, and its entry
                // names another cache.
                return unsafe { cache::free_remote(p, s) };
            }
        }
    }
    // SAFETY: forwarded contract.
    unsafe { free_general(p) }
}

/// `extern "C"`: it cannot unwind, so that [`free_raw`] ends in a tail call of it (see
/// `cache::free_small`).
#[cold]
#[inline(never)]
unsafe extern "C" fn free_general(p: *mut u8) {
    if p.is_null() {
        return;
    }
    match owner::in_heap(p) {
        // SAFETY: caller's contract: a live block.
        Some(Owner::Slab(s)) => unsafe { cache::free_small(p, s) },
        // SAFETY: caller's contract: a live arena object.
        Some(Owner::Arena(c)) => unsafe { crate::arena::free(c, p) },
        Some(Owner::Large) => {
            // SAFETY: `p` is a large block's head in the region (the owner look-up said so).
            if unsafe { heap::is_run_cached(p) } {
                os::invalid_pointer(p, "free(): double free (the block is in a thread's run cache)");
            }
            // SAFETY: a live large block head, given up by the caller; a run allocated outside a load
            // phase may be kept by this thread's run cache (which counts it in `large_frees`).
            if unsafe { !heap::is_load_block(p) && cache::runs::put(p, heap::block_size(p) / PAGE) } {
                return;
            }
            stats::add(&COUNTERS.large_frees, 1);
            // SAFETY: a live large block head, given up by the caller.
            let (load, size) = unsafe { heap::free_block(p) };
            if load {
                stats::sub(&phase::LOAD_LARGE_LIVE, size);
            }
        }
        // Outside the heap: a direct mapping, found and removed in one look-up.
        None if heap::is_ready() && direct::free(p) => {}
        _ => os::invalid_pointer(p, "free(): invalid pointer or double free"),
    }
}

/// Usable size of a live block (at least what was requested; all of it writable). 0 for null. In
/// debug mode, the size requested (the rest belongs to the canary).
///
/// # Safety
/// - `p` is null or a live block of this allocator.
pub unsafe fn usable_size(p: *mut u8) -> usize {
    if p.is_null() {
        return 0;
    }
    if hooked() && hooks() & HOOK_DEBUG != 0 {
        // SAFETY: debug mode is on; aborts unless `p` is a live block.
        return unsafe { debug::live_size(p, debug::Op::UsableSize) };
    }
    // SAFETY: forwarded contract.
    match unsafe { owner::usable(owner::owner(p), p) } {
        Some(n) => n,
        None => os::invalid_pointer(p, "malloc_usable_size(): invalid pointer"),
    }
}

/// Resizes the block at `p` to `new_size` bytes at alignment `align`, in place when it fits. On
/// failure returns null and leaves `p` intact. `p` must not be null; `new_size == 0` is served as 1.
///
/// # Safety
/// - `p` is a live block of this allocator, allocated with alignment `align`.
pub unsafe fn realloc(p: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    if hooked() {
        // SAFETY: forwarded contract.
        return unsafe { realloc_hooked(p, new_size, align) };
    }
    // SAFETY: forwarded contract.
    unsafe { realloc_raw(p, new_size, align) }
}

/// [`realloc`] through the hooks.
///
/// # Safety
/// - as [`realloc`].
#[cold]
#[inline(never)]
unsafe fn realloc_hooked(p: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    let h = hooks();
    if h & HOOK_VALGRIND != 0 {
        // SAFETY: forwarded contract.
        return unsafe { realloc_under_valgrind(p, new_size, align) };
    }
    let old = if h & HOOK_PROFILE != 0 { block_usable(p) } else { 0 };
    let q = if h & HOOK_DEBUG != 0 {
        // SAFETY: forwarded contract.
        unsafe { realloc_debug(p, new_size, align) }
    } else {
        // SAFETY: forwarded contract.
        unsafe { realloc_raw(p, new_size, align) }
    };
    if h & HOOK_PROFILE != 0 && !q.is_null() {
        profile::on_free(old);
        profile::on_alloc(new_size, block_usable(q));
    }
    q
}

/// [`realloc`] in debug mode: the old block's canary is checked, and the block always moves (so that
/// a stale pointer to the old one reads the freed fill).
///
/// # Safety
/// - as [`realloc`].
#[cold]
#[inline(never)]
unsafe fn realloc_debug(p: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    // SAFETY: debug mode is on; aborts unless `p` is a live block.
    let old = unsafe { debug::live_size(p, debug::Op::Realloc) };
    let q = debug_alloc(new_size.max(1), align, false, debug::Op::Realloc);
    if q.is_null() {
        return q;
    }
    debug::note_realloc(p, q, new_size);
    // SAFETY: both blocks are live and distinct; the copy stays inside both; then the old block is
    // given up (checked again, filled, quarantined).
    unsafe {
        core::ptr::copy_nonoverlapping(p, q, old.min(new_size));
        free_with(HOOK_DEBUG, p);
    }
    q
}

/// [`realloc`] under valgrind: always a new block (as valgrind's own `realloc` does), so that the
/// old one is reported freed and the new one allocated. The old block's bytes up to its usable size
/// are marked defined before the copy: its slack is not readable otherwise, and the requested size
/// is not known here (an uninitialised byte copied over is then no longer reported).
///
/// # Safety
/// - as [`realloc`].
#[cold]
#[inline(never)]
unsafe fn realloc_under_valgrind(p: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    // SAFETY: forwarded contract; aborts on a pointer that is not a live block.
    let old = unsafe { usable_size(p) };
    let q = alloc(new_size.max(1), align);
    if q.is_null() {
        return q;
    }
    vg::defined(p, old);
    // SAFETY: both blocks are live and distinct; the copy stays inside both.
    unsafe {
        core::ptr::copy_nonoverlapping(p, q, old.min(new_size));
        free(p);
    }
    q
}

/// [`realloc`] without telling valgrind.
///
/// # Safety
/// - as [`realloc`].
unsafe fn realloc_raw(p: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    let new_size = new_size.max(1);
    let mut moved_out = false;
    let old = match owner::owner(p) {
        Owner::Slab(s) => {
            // SAFETY: live slab header.
            let usable = unsafe { (*s).size as usize };
            if new_size <= usable && (usable <= 64 || new_size > usable / 2) {
                return p;
            }
            usable
        }
        Owner::Arena(c) => {
            // SAFETY: a live arena object.
            let usable = unsafe { crate::arena::usable_size(c, p) };
            if new_size <= usable {
                return p;
            }
            usable
        }
        Owner::Large => {
            // SAFETY: `p` is a large block's head in the region (the owner look-up said so).
            if unsafe { heap::is_run_cached(p) } {
                os::invalid_pointer(p, "realloc(): the block was freed (it is in a thread's run cache)");
            }
            // SAFETY: a live large block head.
            let usable = unsafe { heap::block_size(p) };
            if new_size > SMALL_MAX && new_size <= heap::max_block() {
                // SAFETY: a live large block head owned by the caller (its alignment is kept).
                if let Some(now) = unsafe { heap::resize_in_place(p, new_size) } {
                    stats::add(&COUNTERS.large_realloc_in_place, 1);
                    // SAFETY: still a live large block head of the caller.
                    if unsafe { heap::is_load_block(p) } {
                        let live = &phase::LOAD_LARGE_LIVE;
                        if now > usable {
                            stats::add(live, now - usable);
                        } else {
                            stats::sub(live, usable - now);
                        }
                    }
                    return p;
                }
            }
            moved_out = true;
            usable
        }
        Owner::Direct(len) => {
            if new_size <= len && new_size > len / 2 {
                return p;
            }
            if new_size > heap::max_block() && align <= PAGE {
                // SAFETY: a live direct mapping of `len` bytes owned by the caller.
                let q = unsafe { direct::realloc(p, len, new_size) };
                if !q.is_null() {
                    return q;
                }
            }
            len
        }
        Owner::Unknown => os::invalid_pointer(p, "realloc(): invalid pointer"),
    };
    if moved_out
        && old >= heap::MOVE_OUT_MIN
        && new_size > old
        && new_size <= isize::MAX as usize - PAGE
        && align <= isize::MAX as usize / 2 + 1
        && !heap::secure()
    {
        // A large block grown by moving: as many of its pages go back to the OS as it is copied as
        // the new block faults in (`heap::move_out`), and the budget and the peak count it once
        // where that can be counted on.
        let moving = if heap::gives_back() { old } else { 0 };
        let (q, fresh) = if new_size <= heap::max_block() && align <= heap::max_block() {
            let load = cache::current_is_load();
            if load {
                cache::settle::sweep_if_due();
            }
            match large_block(new_size, align, false, false, load, moving) {
                Some(b) => b,
                None => return core::ptr::null_mut(),
            }
        } else {
            // A fresh mapping: every page of it faults in.
            let peak0 = heap::peak();
            let q = direct::alloc_moving(new_size, align, moving);
            if !q.is_null() && moving > 0 {
                heap::unpeak_move(peak0, moving);
            }
            (q, new_size)
        };
        if q.is_null() {
            return q;
        }
        stats::add(&COUNTERS.large_frees, 1);
        // SAFETY: `p` is a live large block head given up here (not in a run cache: checked above),
        // `q` a distinct live block of more than `old` bytes.
        let (load, size) = unsafe { heap::move_out(p, q, old, fresh) };
        if load {
            stats::sub(&phase::LOAD_LARGE_LIVE, size);
        }
        return q;
    }
    let q = alloc_general_with(new_size, align, false, false);
    if q.is_null() {
        return q;
    }
    // SAFETY: both blocks are live and distinct; `old` and `new_size` bound what each holds.
    unsafe {
        core::ptr::copy_nonoverlapping(p, q, old.min(new_size));
        free_raw(p);
    }
    q
}

/// Returns free memory to the OS: empties thread run caches (this thread's now, the others' at their
/// next use), applies pending frees held by exited threads' caches, then purges every free heap
/// page. Returns the bytes purged.
pub fn trim() -> usize {
    cache::runs::flush_all();
    cache::collect_abandoned();
    heap::trim()
}

/// Sets the memory budget (0 = none). Thread run caches stay off under a budget: they are emptied.
pub fn set_limit(bytes: usize) {
    heap::set_limit(bytes);
    cache::runs::flush_all();
}

/// The allocator, for `#[global_allocator]`.
///
/// ```no_run
/// #[global_allocator]
/// static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();
/// ```
pub struct EdgePool {
    _private: (),
}

impl EdgePool {
    pub const fn new() -> Self {
        EdgePool { _private: () }
    }
}

impl Default for EdgePool {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: every method upholds the GlobalAlloc contract: blocks are at least `layout.size()` bytes,
// aligned to `layout.align()`, distinct while live; failure is a null pointer, never a panic.
unsafe impl GlobalAlloc for EdgePool {
    #[inline(always)]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        alloc(layout.size(), layout.align())
    }

    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: GlobalAlloc contract: `ptr` is a live block from this allocator.
        unsafe { free(ptr) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        alloc_zeroed(layout.size(), layout.align())
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: GlobalAlloc contract: `ptr` is live with `layout`.
        unsafe { realloc(ptr, new_size, layout.align()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_alloc_free_roundtrip_in_unit_tests() {
        let p = alloc(24, 8);
        assert!(!p.is_null());
        assert_eq!(p as usize % 16, 0);
        // SAFETY: p is live and holds 24 bytes.
        unsafe {
            p.write_bytes(0xAB, 24);
            assert_eq!(usable_size(p), 32);
            free(p);
        }
    }
}
