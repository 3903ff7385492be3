//! Routing: which part of the allocator serves a request, and who owns a pointer. The one place each
//! of these questions is answered; `GlobalAlloc` and the C API both call in here.
//!
//! Owner of a pointer `p`:
//! - inside the heap region: the page map says `SLAB` (slab = `p` rounded down to 64 KiB) or `LARGE`
//!   (a buddy block starting exactly at `p`); anything else is not a live block;
//! - outside: a direct mapping if the direct table knows it; otherwise not ours.

use core::alloc::{GlobalAlloc, Layout};

use crate::buddy;
use crate::cache;
use crate::heap;
use crate::os::PAGE;
use crate::size_class::{class_for, class_of, SLAB_SIZE, SMALL_MAX};
use crate::slab::{invalid_pointer, Slab};
use crate::stats::{bump, COUNTERS};

/// Allocates `size` bytes aligned to `align` (a power of two). Returns null on failure. `size == 0`
/// is served as 1 byte.
#[inline(always)]
pub fn alloc(size: usize, align: usize) -> *mut u8 {
    // One unsigned compare sends 0 and everything beyond SMALL_MAX to the general path.
    if size.wrapping_sub(1) < SMALL_MAX && align <= 16 {
        return cache::alloc_small(class_of(size));
    }
    alloc_general(size, align, false)
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
/// from ~380 to ~330 ms (load-bench median), at the same peak. Zeroed requests are left out (a large zeroed buffer is often
/// used sparsely), and so are `realloc`'s moves (their new tail is capacity, not yet data).
#[inline]
fn alloc_general_with(size: usize, align: usize, zeroed: bool, prefault: bool) -> *mut u8 {
    let size = size.max(1);
    if let Some(c) = class_for(size, align) {
        let p = cache::alloc_small(c);
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
    let max = heap::max_block();
    if size <= max && align <= max {
        let load = crate::phase::current_is_load();
        return match heap::alloc_large(size, align, u8::from(load)) {
            Some((p, dirty, bytes)) => {
                bump(&COUNTERS.large_allocs, 1);
                if load && prefault && !zeroed && !dirty && bytes >= PREFAULT_MIN && heap::load_prefault() {
                    // SAFETY: a fresh, page-aligned, read-write run of `bytes` that this call owns.
                    unsafe { crate::os::populate(p, bytes) };
                }
                if load {
                    crate::phase::LOAD_LARGE_ALLOCS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
                    bump(&crate::phase::LOAD_LARGE_LIVE, bytes);
                }
                if zeroed && dirty {
                    // SAFETY: the block holds at least `size` bytes.
                    unsafe { core::ptr::write_bytes(p, 0, size) };
                }
                p
            }
            None => core::ptr::null_mut(),
        };
    }
    // Fresh mappings are zero: nothing to clear.
    heap::direct_alloc(size, align)
}

/// Allocates zeroed memory.
#[inline]
pub fn alloc_zeroed(size: usize, align: usize) -> *mut u8 {
    if size.wrapping_sub(1) < SMALL_MAX && align <= 16 {
        let p = cache::alloc_small(class_of(size));
        if !p.is_null() {
            // SAFETY: the slot holds at least `size` bytes.
            unsafe { core::ptr::write_bytes(p, 0, size) };
        }
        return p;
    }
    alloc_general(size, align, true)
}

/// What a pointer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    Slab(*mut Slab),
    Arena(*mut crate::arena::Chunk),
    Large,
    Direct,
    /// Not a live block of ours.
    Unknown,
}

/// Finds the owner of `p` (not null).
#[inline(always)]
pub fn owner(p: *mut u8) -> Owner {
    let a = p as usize;
    if heap::in_region(a) {
        // SAFETY: `a` is inside the region.
        let kind = unsafe { (*heap::page_entry(a)).kind };
        if kind == buddy::SLAB {
            return Owner::Slab((a & !(SLAB_SIZE - 1)) as *mut Slab);
        }
        if kind == buddy::ARENA {
            return Owner::Arena((a & !(crate::arena::CHUNK_SIZE - 1)) as *mut crate::arena::Chunk);
        }
        if kind == buddy::LARGE && a & (PAGE - 1) == 0 {
            return Owner::Large;
        }
        return Owner::Unknown;
    }
    if heap::is_ready() && heap::direct_size(p).is_some() {
        return Owner::Direct;
    }
    Owner::Unknown
}

/// Frees `p` (null is a no-op). Aborts with a message on a pointer that is not a live block.
///
/// # Safety
/// - `p` is null or was returned by this allocator and not freed since.
#[inline(always)]
pub unsafe fn free(p: *mut u8) {
    let a = p as usize;
    if heap::in_region(a) {
        // SAFETY: `a` is inside the region.
        if unsafe { (*heap::page_entry(a)).kind } == buddy::SLAB {
            // SAFETY: the page belongs to a live slab, which starts at the 64 KiB boundary below.
            return unsafe { cache::free_small(p, (a & !(SLAB_SIZE - 1)) as *mut Slab) };
        }
    }
    // SAFETY: forwarded contract.
    unsafe { free_general(p) }
}

#[cold]
#[inline(never)]
unsafe fn free_general(p: *mut u8) {
    if p.is_null() {
        return;
    }
    match owner(p) {
        // SAFETY: caller's contract: a live block.
        Owner::Slab(s) => unsafe { cache::free_small(p, s) },
        // SAFETY: caller's contract: a live arena object.
        Owner::Arena(c) => unsafe { crate::arena::free(c, p) },
        Owner::Large => {
            bump(&COUNTERS.large_frees, 1);
            // SAFETY: a live large block head.
            let (tag, size) = unsafe { heap::free_block(p) };
            if tag != 0 {
                crate::stats::drop_by(&crate::phase::LOAD_LARGE_LIVE, size);
            }
        }
        Owner::Direct => {
            heap::direct_free(p);
        }
        Owner::Unknown => invalid_pointer(p, b"free(): invalid pointer or double free"),
    }
}

/// Usable size of a live block (at least what was requested; all of it writable). 0 for null.
///
/// # Safety
/// - `p` is null or a live block of this allocator.
pub unsafe fn usable_size(p: *mut u8) -> usize {
    if p.is_null() {
        return 0;
    }
    match owner(p) {
        // SAFETY: a live slab's header is immutable after init.
        Owner::Slab(s) => unsafe { (*s).size as usize },
        // SAFETY: a live arena object.
        Owner::Arena(c) => unsafe { crate::arena::usable_size(c, p) },
        // SAFETY: a live large block head.
        Owner::Large => unsafe { heap::block_size(p) },
        Owner::Direct => heap::direct_size(p).unwrap_or(0),
        Owner::Unknown => invalid_pointer(p, b"malloc_usable_size(): invalid pointer"),
    }
}

/// Resizes the block at `p` to `new_size` bytes at alignment `align`, in place when it fits. On
/// failure returns null and leaves `p` intact. `p` must not be null; `new_size == 0` is served as 1.
///
/// # Safety
/// - `p` is a live block of this allocator, allocated with alignment `align`.
pub unsafe fn realloc(p: *mut u8, new_size: usize, align: usize) -> *mut u8 {
    let new_size = new_size.max(1);
    let old = match owner(p) {
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
            // SAFETY: a live large block head.
            let usable = unsafe { heap::block_size(p) };
            if new_size > SMALL_MAX && new_size <= heap::max_block() {
                // SAFETY: a live large block head owned by the caller (its alignment is kept).
                if let Some(now) = unsafe { heap::resize_in_place(p, new_size) } {
                    bump(&COUNTERS.large_realloc_in_place, 1);
                    // SAFETY: still a live large block head; its tag says which phase allocated it.
                    if unsafe { (*heap::page_entry(p as usize)).tag } != 0 {
                        let live = &crate::phase::LOAD_LARGE_LIVE;
                        if now > usable {
                            bump(live, now - usable);
                        } else {
                            crate::stats::drop_by(live, usable - now);
                        }
                    }
                    return p;
                }
            }
            usable
        }
        Owner::Direct => {
            let len = heap::direct_size(p).unwrap_or(0);
            if new_size <= len && new_size > len / 2 {
                return p;
            }
            if new_size > heap::max_block() && align <= PAGE {
                let q = heap::direct_realloc(p, new_size);
                if !q.is_null() {
                    return q;
                }
            }
            len
        }
        Owner::Unknown => invalid_pointer(p, b"realloc(): invalid pointer"),
    };
    let q = alloc_general_with(new_size, align, false, false);
    if q.is_null() {
        return q;
    }
    // SAFETY: both blocks are live and distinct; `old` and `new_size` bound what each holds.
    unsafe {
        core::ptr::copy_nonoverlapping(p, q, old.min(new_size));
        free(p);
    }
    q
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
