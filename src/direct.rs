//! Direct mappings: requests beyond the largest buddy block, each its own OS mapping, found through
//! an open-addressing table in a mapping of its own (never through the allocator).
//!
//! Locks: the table is guarded by `sync::DIRECT`, which comes after `sync::HEAP` in the lock order. A
//! mapping is made or unmapped outside both; the budget is asked of the heap before a mapping is made
//! or grown, and a growth by `mremap` runs inside the heap's budget check so that the two cannot
//! disagree (heap, then direct: never the other way round).

use core::cell::UnsafeCell;

use crate::heap;
use crate::os::{self, PAGE};
use crate::stats::{self, COUNTERS};
use crate::sync;

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

/// The table; its lock is `sync::DIRECT`.
struct Direct(UnsafeCell<DirectTable>);

// SAFETY: the table is only accessed with `sync::DIRECT` held (see `with_direct`).
unsafe impl Sync for Direct {}

static DIRECT: Direct = Direct(UnsafeCell::new(DirectTable { slots: core::ptr::null_mut(), cap: 0, used: 0, live: 0 }));

fn with_direct<R>(f: impl FnOnce(&mut DirectTable) -> R) -> R {
    sync::DIRECT.lock();
    // SAFETY: the lock is held, so this is the only reference to the table.
    let r = f(unsafe { &mut *DIRECT.0.get() });
    sync::DIRECT.unlock();
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

    /// Makes room for one more entry. `false` when the table cannot grow (no memory).
    fn reserve_one(&mut self) -> bool {
        (self.used + 1) * 2 <= self.cap || self.rehash()
    }

    /// Inserts `e`; `false` (changing nothing) when the table cannot grow. After a successful
    /// [`DirectTable::reserve_one`], an insert that follows the removal of an entry cannot fail.
    fn insert(&mut self, e: DirectEntry) -> bool {
        if !self.reserve_one() {
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
                // Cannot fail: the new table holds at most half as many entries as slots.
                self.insert(e);
            }
        }
        if !old.slots.is_null() {
            // SAFETY: the old table is no longer referenced.
            unsafe { os::unmap(old.slots.cast(), old.cap * core::mem::size_of::<DirectEntry>()) };
        }
        true
    }

    /// Removes the entry at slot `i` (from [`DirectTable::find`]) and returns it.
    fn remove_at(&mut self, i: usize) -> DirectEntry {
        // SAFETY: i < cap (find's result).
        let s = unsafe { &mut *self.slots.add(i) };
        let e = *s;
        s.key = TOMBSTONE;
        self.live -= 1;
        e
    }

    /// The entry at slot `i` (from [`DirectTable::find`]).
    fn at(&self, i: usize) -> DirectEntry {
        // SAFETY: i < cap (find's result).
        unsafe { *self.slots.add(i) }
    }
}

/// Maps `size` bytes aligned to `align` directly from the OS. Returns null on failure.
pub fn alloc(size: usize, align: usize) -> *mut u8 {
    alloc_moving(size, align, 0)
}

/// [`alloc`] for a mapping that `realloc` moves a live block of `moving` bytes into, giving the old
/// block's pages back as it copies (`heap::move_out`): the budget counts the new mapping without as
/// many of the old block's bytes, but for one piece.
pub fn alloc_moving(size: usize, align: usize, moving: usize) -> *mut u8 {
    let Some(len) = size.checked_add(PAGE - 1).map(|l| l & !(PAGE - 1)) else { return core::ptr::null_mut() };
    let align = align.max(PAGE);
    let Some(total) = len.checked_add(align - PAGE) else { return core::ptr::null_mut() };
    if total > isize::MAX as usize {
        return core::ptr::null_mut();
    }
    // Budget: direct bytes count against the limit; a mapping that a moved block of `moving` bytes
    // fits only counted once is probed once made (below).
    let Some(probe) = heap::budget_allows_moving(len, moving) else {
        return core::ptr::null_mut();
    };
    // Under the overcommit policy (no MAP_NORESERVE): the program owns this memory.
    let raw = os::map_owned(total);
    if raw.is_null() {
        stats::add(&COUNTERS.oom_refusals, 1);
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
    // SAFETY: the mapping was made above, is ours alone and holds nothing yet.
    if probe && !unsafe { heap::probe_give_back(p as *mut u8) } {
        // SAFETY: as above; not published.
        unsafe { os::unmap(p as *mut u8, len) };
        stats::add(&COUNTERS.budget_refusals, 1);
        return core::ptr::null_mut();
    }
    if !with_direct(|t| t.insert(DirectEntry { key: p, base: p, len })) {
        // SAFETY: the mapping was made above and is not published.
        unsafe { os::unmap(p as *mut u8, len) };
        return core::ptr::null_mut();
    }
    stats::add(&COUNTERS.direct_allocs, 1);
    stats::add(&COUNTERS.direct_bytes, len);
    heap::note_peak();
    p as *mut u8
}

/// The length of the direct mapping at `p`, or `None` if `p` is not one.
pub fn size_of(p: *mut u8) -> Option<usize> {
    with_direct(|t| t.find(p as usize).map(|i| t.at(i).len))
}

/// Calls `f(p, len)` for every live direct mapping, with the table's lock held: no mapping is unmapped
/// while `f` runs (`f` must not allocate or take a lock that comes before `DIRECT`).
pub fn for_each(mut f: impl FnMut(*mut u8, usize)) {
    with_direct(|t| {
        for i in 0..t.cap {
            let e = t.at(i);
            if e.key != EMPTY_KEY && e.key != TOMBSTONE {
                f(e.key as *mut u8, e.len);
            }
        }
    })
}

/// Unmaps the direct mapping at `p` (one look-up). Returns `false` (doing nothing) if `p` is not one.
pub fn free(p: *mut u8) -> bool {
    let Some(e) = with_direct(|t| t.find(p as usize).map(|i| t.remove_at(i))) else { return false };
    // SAFETY: the entry was removed, so the mapping is ours alone and dead.
    unsafe { os::unmap(e.base as *mut u8, e.len) };
    stats::add(&COUNTERS.direct_frees, 1);
    stats::sub(&COUNTERS.direct_bytes, e.len);
    true
}

/// Resizes the direct mapping at `p` of `len` bytes (`mremap`), returning the new pointer, or null
/// with `p` intact. Only for mappings with page alignment.
///
/// # Safety
/// - `p` is a live direct mapping of `len` bytes ([`size_of`]) owned by the caller.
pub unsafe fn realloc(p: *mut u8, len: usize, new_size: usize) -> *mut u8 {
    let Some(new_len) = new_size.checked_add(PAGE - 1).map(|l| l & !(PAGE - 1)) else { return core::ptr::null_mut() };
    // SAFETY: forwarded contract.
    let remap = || unsafe { remap(p, len, new_len) };
    let q = if new_len > len { heap::with_budget(new_len - len, remap) } else { remap() };
    q.unwrap_or(core::ptr::null_mut())
}

/// Moves the mapping at `p` from `len` to `new_len` bytes and its table entry with it.
///
/// # Safety
/// - as [`realloc`].
unsafe fn remap(p: *mut u8, len: usize, new_len: usize) -> Option<*mut u8> {
    let q = with_direct(|t| {
        let i = t.find(p as usize)?;
        // Room for the entry at its new key first, so that the move can always be recorded.
        if !t.reserve_one() {
            return None;
        }
        // SAFETY: [p, p + len) is exactly one mapping of ours (contract).
        let q = unsafe { os::remap(p, len, new_len) };
        if q.is_null() {
            return None;
        }
        t.remove_at(i);
        let recorded = t.insert(DirectEntry { key: q as usize, base: q as usize, len: new_len });
        debug_assert!(recorded, "insert after reserve_one and a removal cannot fail");
        Some(q)
    })?;
    if new_len > len {
        stats::add(&COUNTERS.direct_bytes, new_len - len);
    } else {
        stats::sub(&COUNTERS.direct_bytes, len - new_len);
    }
    Some(q)
}
