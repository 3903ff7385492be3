//! A thread cache's life: the TLS pointer, the thread-exit key, the pool of abandoned caches,
//! adoption by a new thread, and abandonment at thread exit.
//!
//! A cache owns its slabs for their whole life. When its thread exits, the cache is *abandoned* whole
//! (its slabs stay in it) to a pool, and the next thread that starts adopts it, so nothing leaks with
//! thread churn and a slab's owner never changes. Caches are never freed; every cache ever made is on
//! the list of all caches (for process-wide phase switches).
//!
//! TLS holds only a raw pointer with a `const` initialiser and no destructor, so it never registers a
//! destructor (which would call `malloc`); thread exit is learned from a `pthread_key_create` key,
//! whose destructor [`thread_exit`] abandons the cache. A TLS destructor that runs after that one
//! and allocates is served from one cache that exiting threads share ([`alloc_while_exiting`]). The
//! key, the shared cache and the pool have the locks `sync::CACHE_KEY`, `sync::CACHE_EXIT` and
//! `sync::CACHE_POOL`.

use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use super::{
    checkin, empty_cache, empty_slab, end_arena, flush_stack, refill_and_take, remote, retire, row, Cache, ROWS,
};
use crate::buddy::PageKind;
use crate::heap;
use crate::os;
use crate::phase_state;
use crate::stats::{self, COUNTERS};
use crate::sync;

std::thread_local! {
    /// This thread's cache (the empty cache until the first slow path).
    static TLS_CACHE: Cell<*mut Cache> = const { Cell::new(empty_cache()) };
    /// Set once this thread's key destructor has run: later allocations use the exit cache.
    static TLS_EXITING: Cell<bool> = const { Cell::new(false) };
}

/// The pool of abandoned caches (linked by `pool_next`; `sync::CACHE_POOL`).
static POOL: AtomicPtr<Cache> = AtomicPtr::new(core::ptr::null_mut());
/// Every cache ever made (linked by `all_next`, immutable once linked).
static ALL: AtomicPtr<Cache> = AtomicPtr::new(core::ptr::null_mut());
static KEY: AtomicU32 = AtomicU32::new(u32::MAX);
static KEY_READY: AtomicBool = AtomicBool::new(false);

/// This thread's cache, or the empty cache.
#[inline(always)]
pub(super) fn tls_cache() -> *mut Cache {
    TLS_CACHE.with(|c| c.get())
}

/// Whether this thread's cache was already abandoned (allocation from a later TLS destructor).
pub(super) fn exiting() -> bool {
    TLS_EXITING.with(|e| e.get())
}

/// The cache that exiting threads share (`sync::CACHE_EXIT`): null until a thread allocates after its
/// own cache was abandoned, and again after [`collect_abandoned`] puts it back in the pool. Whoever
/// holds the lock owns it; no thread's TLS points at it, so every free of its slots is a remote free,
/// applied when it refills or when it goes back to the pool.
static EXIT_CACHE: AtomicPtr<Cache> = AtomicPtr::new(core::ptr::null_mut());

/// Serves an allocation made after this thread's cache was abandoned (from a TLS destructor that runs
/// after ours): from the cache exiting threads share, under its lock. Each allocation used to adopt a
/// cache and abandon it again (a whole flush per allocation: 5 607 adoptions for 200 threads whose
/// late destructors allocated 25 times each); the shared cache stays set up between them.
#[cold]
pub(super) fn alloc_while_exiting(class: usize) -> *mut u8 {
    sync::CACHE_EXIT.lock();
    let mut cache = EXIT_CACHE.load(Ordering::Relaxed);
    if cache.is_null() {
        cache = acquire_raw();
        EXIT_CACHE.store(cache, Ordering::Relaxed);
    }
    let p = if cache.is_null() {
        core::ptr::null_mut()
    } else {
        // SAFETY: the exit cache is owned by whoever holds its lock (held); its rows are set up like
        // any cache's, and a process-wide phase reaches it through `settle_pending` and its row set,
        // as it reaches an idle thread's cache.
        unsafe { refill_and_take(cache, class) }
    };
    sync::CACHE_EXIT.unlock();
    p
}

/// Creates the thread-exit key once. `pthread_key_create` does not allocate, but the first
/// `pthread_setspecific` on a high key may: that happens in [`acquire`], outside every lock.
fn ensure_key() -> bool {
    if KEY_READY.load(Ordering::Acquire) {
        return true;
    }
    sync::CACHE_KEY.lock();
    if !KEY_READY.load(Ordering::Acquire) {
        if let Some(key) = os::thread_key_create(thread_exit) {
            KEY.store(key, Ordering::Relaxed);
            KEY_READY.store(true, Ordering::Release);
        }
    }
    sync::CACHE_KEY.unlock();
    KEY_READY.load(Ordering::Acquire)
}

/// Takes a cache from the pool, or makes one; not yet bound to the thread.
fn acquire_raw() -> *mut Cache {
    if !heap::ensure_init() {
        return core::ptr::null_mut();
    }
    sync::CACHE_POOL.lock();
    let c = POOL.load(Ordering::Relaxed);
    if !c.is_null() {
        // SAFETY: pool members are live caches; the pool lock is held.
        unsafe {
            POOL.store((*c).pool_next, Ordering::Relaxed);
            (*c).pool_next = core::ptr::null_mut();
        }
    }
    sync::CACHE_POOL.unlock();
    if !c.is_null() {
        stats::add(&COUNTERS.caches_adopted, 1);
        // SAFETY: taken out of the pool: ours now (owner).
        unsafe {
            remote::drain(c);
            super::settle::on_adopt(c);
        }
        return c;
    }
    let size = core::mem::size_of::<Cache>();
    let order = heap::order_for(size, 64);
    let Some((block, dirty)) = heap::alloc_block(order, PageKind::Meta, false) else {
        return core::ptr::null_mut();
    };
    let c = block as *mut Cache;
    // SAFETY: a fresh block of at least size_of::<Cache>() bytes, page aligned, ours; it is linked
    // onto the list of all caches once initialised (release).
    unsafe {
        // `row` only computes an address inside the block: nothing is read before the write.
        Cache::init_at(c, row(c, phase_state::process_row_base()), !dirty);
        let mut head = ALL.load(Ordering::Relaxed);
        loop {
            (*c).all_next = head;
            match ALL.compare_exchange_weak(head, c, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => break,
                Err(h) => head = h,
            }
        }
    }
    if stats::add_fetch(&COUNTERS.caches_created, 1) == 1 {
        stats::set_completer(super::complete_stats);
    }
    c
}

/// Binds a cache to the calling thread.
#[cold]
pub(super) fn acquire() -> *mut Cache {
    if !heap::ensure_init() || !ensure_key() {
        return core::ptr::null_mut();
    }
    let c = acquire_raw();
    if c.is_null() {
        return c;
    }
    TLS_CACHE.with(|t| t.set(c));
    // Set after TLS: if this allocates (keys ≥ 32), the nested call finds the cache ready.
    // SAFETY: the key was made by `ensure_key` with `thread_exit`, which takes this cache.
    unsafe { os::thread_key_set(KEY.load(Ordering::Relaxed), c.cast()) };
    c
}

/// Returns the calling thread's cache, creating it if needed (null if memory is exhausted or the
/// thread is exiting).
pub fn current() -> *mut Cache {
    let c = tls_cache();
    if c != empty_cache() {
        return c;
    }
    if exiting() {
        return core::ptr::null_mut();
    }
    acquire()
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

/// Gives a cache back to the pool: applies remote frees, returns empty slabs, keeps the rest.
///
/// # Safety
/// - owner: `cache` is owned by the calling thread, which will not use it again.
unsafe fn abandon(cache: *mut Cache) {
    // SAFETY: owner until it is in the pool; rows are reached through `row` (i < ROWS).
    unsafe {
        end_arena(cache);
        super::runs::flush(cache);
        remote::drain(cache);
        for r in 0..ROWS {
            flush_stack(cache, row(cache, r));
        }
        for r in 0..ROWS {
            let row = row(cache, r);
            let s = (*row).current;
            if s != empty_slab() {
                checkin(row);
                remote::collect(cache, s);
                if (*s).free_count == (*s).nslots && (*s).shared.remote.load(Ordering::Acquire) == 0 {
                    (*row).current = empty_slab();
                    retire(cache, s);
                }
            }
        }
        super::release_spare(cache);
        sync::CACHE_POOL.lock();
        (*cache).pool_next = POOL.load(Ordering::Relaxed);
        POOL.store(cache, Ordering::Relaxed);
        sync::CACHE_POOL.unlock();
    }
    stats::add(&COUNTERS.caches_abandoned, 1);
}

/// The thread-exit destructor of the key.
unsafe extern "C" fn thread_exit(arg: *mut libc::c_void) {
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
/// The exit cache goes back to the pool first (the next exiting thread takes a cache again).
pub fn collect_abandoned() {
    sync::CACHE_EXIT.lock();
    let exit = EXIT_CACHE.swap(core::ptr::null_mut(), Ordering::Relaxed);
    sync::CACHE_EXIT.unlock();
    if !exit.is_null() {
        // SAFETY: taken from the exit slot under its lock: no one else reaches it now (owner).
        unsafe { abandon(exit) };
    }
    // Bounded: remote frees may keep arriving while we work.
    for _ in 0..4096 {
        // Take one cache with pending remote frees out of the pool, process it, and put it back.
        sync::CACHE_POOL.lock();
        let mut taken = core::ptr::null_mut();
        let mut prev: *mut Cache = core::ptr::null_mut();
        let mut cur = POOL.load(Ordering::Relaxed);
        // SAFETY: pool members are live caches; the pool lock is held.
        unsafe {
            while !cur.is_null() {
                if !(*cur).remote.load(Ordering::Acquire).is_null() {
                    if prev.is_null() {
                        POOL.store((*cur).pool_next, Ordering::Relaxed);
                    } else {
                        (*prev).pool_next = (*cur).pool_next;
                    }
                    taken = cur;
                    break;
                }
                prev = cur;
                cur = (*cur).pool_next;
            }
        }
        sync::CACHE_POOL.unlock();
        if taken.is_null() {
            return;
        }
        // SAFETY: taken out of the pool, so exclusively ours (owner); abandon puts it back.
        unsafe { abandon(taken) };
        stats::sub(&COUNTERS.caches_abandoned, 1);
    }
}

/// Calls `f` on every cache in the list of all caches (owned by any thread: `f` may touch only its
/// atomics).
pub fn for_each_cache(mut f: impl FnMut(*mut Cache)) {
    let mut c = ALL.load(Ordering::Acquire);
    while !c.is_null() {
        f(c);
        // SAFETY: caches are never freed; `all_next` is immutable once linked.
        c = unsafe { (*c).all_next };
    }
}

/// Takes every cache out of the pool, calls `f` on each (owned by the calling thread meanwhile), and
/// puts them back.
pub fn with_pooled_caches(mut f: impl FnMut(*mut Cache)) {
    sync::CACHE_POOL.lock();
    let mut c = POOL.swap(core::ptr::null_mut(), Ordering::Relaxed);
    sync::CACHE_POOL.unlock();
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
    sync::CACHE_POOL.lock();
    while !taken.is_null() {
        // SAFETY: as above; relinked under the pool lock.
        unsafe {
            let next = (*taken).pool_next;
            (*taken).pool_next = POOL.load(Ordering::Relaxed);
            POOL.store(taken, Ordering::Relaxed);
            taken = next;
        }
    }
    sync::CACHE_POOL.unlock();
}
