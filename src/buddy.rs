//! The buddy allocator: power-of-two blocks of 4 KiB up to the top order, split on allocation and merged
//! with their free buddy on release. A single-threaded structure: the lock lives in [`crate::heap`].
//!
//! All bookkeeping lives in the *page map*, one [`PageEntry`] per 4 KiB page of the region, never in
//! the blocks themselves: a free block may have been purged (its pages given back to the OS and reading
//! as zero), and writing a list link into it would fault a page back in.

use crate::os::PAGE;

pub const PAGE_SHIFT: u32 = 12;
/// Smallest block order (4 KiB).
pub const MIN_ORDER: u32 = PAGE_SHIFT;
/// Largest top order supported (1 GiB).
pub const MAX_ORDER_LIMIT: u32 = 30;
pub const NORDERS: usize = (MAX_ORDER_LIMIT - MIN_ORDER + 1) as usize;
/// "No page": end of a list.
pub const NIL: u32 = u32::MAX;

/// Page kinds. A page that is not the head of a block (interior) is `NONE`, except that every page of
/// a slab is `SLAB` (of an arena chunk, `ARENA`) so that any interior pointer finds its block.
pub const NONE: u8 = 0;
pub const FREE: u8 = 1;
pub const LARGE: u8 = 2;
pub const SLAB: u8 = 3;
pub const META: u8 = 4;
/// Every page of a load-arena chunk (so that any interior pointer finds its chunk).
pub const ARENA: u8 = 5;

/// `flags` bit: the free block may hold resident (non-zero) pages.
pub const DIRTY: u8 = 1;

/// One entry per 4 KiB page of the region.
///
/// Invariants: for a block head, `kind` is `FREE`, `LARGE`, `SLAB` or `META` and `order` is the block's
/// order; `prev`/`next` are list links meaningful only while `kind == FREE`; the pages inside a block
/// other than its head are `NONE` (or `SLAB` for every page of a slab block).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PageEntry {
    pub kind: u8,
    pub order: u8,
    pub flags: u8,
    /// Owner-defined tag of an allocated block (the phase it was allocated in).
    pub tag: u8,
    pub prev: u32,
    pub next: u32,
}

/// The free lists.
///
/// Invariants (checked by [`Buddy::check`]):
/// - `heads[o - MIN_ORDER]` starts a doubly linked list of exactly the free blocks of order `o`;
/// - a block of order `o` starts at a page index that is a multiple of `2^(o - MIN_ORDER)`;
/// - every page below `frontier` belongs to exactly one block (free or allocated);
/// - two free buddies of the same order below `top` never coexist (they are merged on release);
/// - `free_bytes` / `dirty_bytes` are the sums of the sizes of free / free-and-dirty blocks.
pub struct Buddy {
    map: *mut PageEntry,
    heads: [u32; NORDERS],
    /// Order of the blocks the region is carved into.
    pub top: u32,
    /// Pages `[0, frontier)` are committed and covered by blocks.
    pub frontier: u32,
    pub free_bytes: usize,
    pub dirty_bytes: usize,
}

// SAFETY: the page map pointer is only dereferenced by the owner of the `Buddy`, which the heap
// serialises with its lock.
unsafe impl Send for Buddy {}

#[inline]
const fn pages(order: u32) -> u32 {
    1 << (order - MIN_ORDER)
}

impl Buddy {
    pub const fn empty() -> Self {
        Buddy { map: core::ptr::null_mut(), heads: [NIL; NORDERS], top: MIN_ORDER, frontier: 0, free_bytes: 0, dirty_bytes: 0 }
    }

    /// # Safety
    /// - `map` points to a zeroed, writable array of page entries covering every page the buddy will
    ///   ever be given (see [`Buddy::add_top`]), and outlives the buddy.
    /// - `MIN_ORDER <= top <= MAX_ORDER_LIMIT`.
    pub unsafe fn init(&mut self, map: *mut PageEntry, top: u32) {
        *self = Buddy::empty();
        self.map = map;
        self.top = top;
    }

    /// A copy of the page-map entry of page `idx`.
    ///
    /// # Safety
    /// - `idx` is inside the page map given to [`Buddy::init`].
    #[inline]
    pub unsafe fn entry(&self, idx: u32) -> PageEntry {
        // SAFETY: the caller guarantees `idx` is in range; the map is valid per `init`.
        unsafe { *self.map.add(idx as usize) }
    }

    /// The page-map entry of page `idx`, for writing.
    ///
    /// # Safety
    /// - as [`Buddy::entry`].
    #[inline]
    pub unsafe fn entry_mut(&mut self, idx: u32) -> &mut PageEntry {
        // SAFETY: the caller guarantees `idx` is in range; `&mut self` makes the access exclusive.
        unsafe { &mut *self.map.add(idx as usize) }
    }

    fn set_head(&mut self, idx: u32, kind: u8, order: u32, flags: u8) {
        // SAFETY: every index passed here is below `frontier`, which `add_top` keeps inside the map.
        let e = unsafe { self.entry_mut(idx) };
        e.kind = kind;
        e.order = order as u8;
        e.flags = flags;
        e.tag = 0;
    }

    fn push(&mut self, idx: u32, order: u32, flags: u8) {
        let h = (order - MIN_ORDER) as usize;
        let old = self.heads[h];
        self.set_head(idx, FREE, order, flags);
        // SAFETY: idx and old (if not NIL) are block heads below `frontier`.
        unsafe {
            let e = self.entry_mut(idx);
            e.prev = NIL;
            e.next = old;
            if old != NIL {
                self.entry_mut(old).prev = idx;
            }
        }
        self.heads[h] = idx;
        let bytes = (pages(order) as usize) * PAGE;
        self.free_bytes += bytes;
        if flags & DIRTY != 0 {
            self.dirty_bytes += bytes;
        }
    }

    fn unlink(&mut self, idx: u32) {
        // SAFETY: idx is a free block head below `frontier`; its links are valid list members.
        unsafe {
            let e = self.entry(idx);
            if e.prev != NIL {
                self.entry_mut(e.prev).next = e.next;
            } else {
                self.heads[(e.order as u32 - MIN_ORDER) as usize] = e.next;
            }
            if e.next != NIL {
                self.entry_mut(e.next).prev = e.prev;
            }
            self.entry_mut(idx).kind = NONE;
            let bytes = (pages(e.order as u32) as usize) * PAGE;
            self.free_bytes -= bytes;
            if e.flags & DIRTY != 0 {
                self.dirty_bytes -= bytes;
            }
        }
    }

    /// Adds a new top-order block at page `idx` (freshly committed, hence clean). The caller guarantees
    /// that the page map covers it.
    pub fn add_top(&mut self, idx: u32) {
        debug_assert!(idx == self.frontier);
        self.frontier = idx + pages(self.top);
        self.push(idx, self.top, 0);
    }

    /// Takes a block of `order` and marks its head `kind`. Returns its page index and whether it may be
    /// dirty, or `None` when no free block is large enough (the caller then grows the region).
    pub fn alloc(&mut self, order: u32, kind: u8) -> Option<(u32, bool)> {
        let mut o = order;
        while o <= self.top && self.heads[(o - MIN_ORDER) as usize] == NIL {
            o += 1;
        }
        if o > self.top {
            return None;
        }
        let idx = self.heads[(o - MIN_ORDER) as usize];
        // SAFETY: idx is a free head below frontier.
        let flags = unsafe { self.entry(idx).flags };
        self.unlink(idx);
        while o > order {
            o -= 1;
            self.push(idx + pages(o), o, flags);
        }
        self.set_head(idx, kind, order, 0);
        Some((idx, flags & DIRTY != 0))
    }

    /// Releases the allocated block at `idx` of `order` and merges it with free buddies. Returns the
    /// head and order of the resulting free block.
    pub fn free(&mut self, mut idx: u32, mut order: u32, mut flags: u8) -> (u32, u32) {
        while order < self.top {
            let b = idx ^ pages(order);
            if b >= self.frontier {
                break;
            }
            // SAFETY: b < frontier.
            let e = unsafe { self.entry(b) };
            if e.kind != FREE || e.order as u32 != order {
                break;
            }
            self.unlink(b);
            flags |= e.flags & DIRTY;
            idx = idx.min(b);
            order += 1;
        }
        self.push(idx, order, flags);
        (idx, order)
    }

    /// Tries to grow the allocated block at `idx` from `order` to `new_order` in place, by absorbing
    /// its free upper buddies. Returns `true` on success (the head now has `new_order`).
    pub fn grow_in_place(&mut self, idx: u32, order: u32, new_order: u32) -> bool {
        if new_order > self.top || idx % pages(new_order) != 0 {
            return false;
        }
        for o in order..new_order {
            let b = idx + pages(o);
            if b >= self.frontier {
                return false;
            }
            // SAFETY: b < frontier.
            let e = unsafe { self.entry(b) };
            if e.kind != FREE || e.order as u32 != o {
                return false;
            }
        }
        for o in order..new_order {
            self.unlink(idx + pages(o));
        }
        // SAFETY: idx < frontier.
        unsafe { self.entry_mut(idx).order = new_order as u8 };
        true
    }

    /// Shrinks the allocated block at `idx` from `order` to `new_order`, freeing the upper halves.
    pub fn shrink_in_place(&mut self, idx: u32, order: u32, new_order: u32) {
        let mut o = order;
        while o > new_order {
            o -= 1;
            // The upper half was in use: dirty. It cannot merge with anything but free blocks above it.
            self.free(idx + pages(o), o, DIRTY);
        }
        // SAFETY: idx < frontier.
        unsafe { self.entry_mut(idx).order = new_order as u8 };
    }

    /// Calls `purge(idx, order)` for every free dirty block; where it returns `true` the block is
    /// marked clean. Returns the bytes made clean.
    pub fn purge_all(&mut self, mut purge: impl FnMut(u32, u32) -> bool) -> usize {
        let mut cleaned = 0;
        for h in 0..NORDERS {
            let mut idx = self.heads[h];
            while idx != NIL {
                // SAFETY: list members are free heads below frontier.
                let e = unsafe { self.entry_mut(idx) };
                let next = e.next;
                if e.flags & DIRTY != 0 && purge(idx, e.order as u32) {
                    e.flags &= !DIRTY;
                    let bytes = (pages(e.order as u32) as usize) * PAGE;
                    self.dirty_bytes -= bytes;
                    cleaned += bytes;
                }
                idx = next;
            }
        }
        cleaned
    }

    /// Marks the free block at `idx` clean after a successful purge.
    pub fn mark_clean(&mut self, idx: u32) {
        // SAFETY: idx is a free head below frontier (caller's contract, checked in debug).
        let e = unsafe { self.entry_mut(idx) };
        debug_assert!(e.kind == FREE);
        if e.flags & DIRTY != 0 {
            e.flags &= !DIRTY;
            self.dirty_bytes -= (pages(e.order as u32) as usize) * PAGE;
        }
    }

    /// Walks the whole structure and checks every invariant. Returns a description of the first
    /// violation. For tests and debug builds.
    pub fn check(&self) -> Result<(), &'static str> {
        let mut free = 0usize;
        let mut dirty = 0usize;
        for h in 0..NORDERS {
            let order = h as u32 + MIN_ORDER;
            let mut prev = NIL;
            let mut idx = self.heads[h];
            while idx != NIL {
                if idx >= self.frontier {
                    return Err("free block beyond frontier");
                }
                // SAFETY: idx < frontier.
                let e = unsafe { self.entry(idx) };
                if e.kind != FREE || e.order as u32 != order {
                    return Err("list member is not a free head of the list's order");
                }
                if e.prev != prev {
                    return Err("broken prev link");
                }
                if idx % pages(order) != 0 {
                    return Err("misaligned block");
                }
                free += (pages(order) as usize) * PAGE;
                if e.flags & DIRTY != 0 {
                    dirty += (pages(order) as usize) * PAGE;
                }
                prev = idx;
                idx = e.next;
            }
        }
        if free != self.free_bytes {
            return Err("free_bytes mismatch");
        }
        if dirty != self.dirty_bytes {
            return Err("dirty_bytes mismatch");
        }
        // Tiling: walk blocks from page 0.
        let mut idx = 0u32;
        while idx < self.frontier {
            // SAFETY: idx < frontier.
            let e = unsafe { self.entry(idx) };
            if !matches!(e.kind, FREE | LARGE | SLAB | META | ARENA) {
                return Err("page inside the frontier is not covered by a block head");
            }
            let o = e.order as u32;
            if !(MIN_ORDER..=self.top).contains(&o) || idx % pages(o) != 0 {
                return Err("bad block order");
            }
            if e.kind == FREE && o < self.top {
                let b = idx ^ pages(o);
                if b < self.frontier {
                    // SAFETY: b < frontier.
                    let be = unsafe { self.entry(b) };
                    if be.kind == FREE && be.order as u32 == o {
                        return Err("two free buddies not merged");
                    }
                }
            }
            idx += pages(o);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_buddy(top: u32, tops: u32, f: impl FnOnce(&mut Buddy)) {
        let n = (tops * pages(top)) as usize;
        let mut map = vec![PageEntry { kind: 0, order: 0, flags: 0, tag: 0, prev: 0, next: 0 }; n];
        let mut b = Buddy::empty();
        // SAFETY: the vector is zeroed and covers `tops` top blocks; it outlives `b` inside this call.
        unsafe { b.init(map.as_mut_ptr(), top) };
        for t in 0..tops {
            b.add_top(t * pages(top));
        }
        f(&mut b);
        drop(map);
    }

    #[test]
    fn split_and_merge_back_to_top() {
        with_buddy(20, 2, |b| {
            let total = b.free_bytes;
            let mut got = vec![];
            for o in [12, 13, 12, 15, 20, 14] {
                let (idx, dirty) = b.alloc(o, LARGE).unwrap();
                assert!(!dirty);
                assert_eq!(idx % pages(o), 0);
                got.push((idx, o));
                b.check().unwrap();
            }
            for (idx, o) in got.into_iter().rev() {
                b.free(idx, o, DIRTY);
                b.check().unwrap();
            }
            assert_eq!(b.free_bytes, total);
            assert_eq!(b.dirty_bytes, total);
            assert!(b.heads[(20 - MIN_ORDER) as usize] != NIL);
            let cleaned = b.purge_all(|_, _| true);
            assert_eq!(cleaned, total);
            assert_eq!(b.dirty_bytes, 0);
            b.check().unwrap();
        });
    }

    #[test]
    fn exhausts_then_reports_none() {
        with_buddy(16, 1, |b| {
            let mut v = vec![];
            while let Some((i, _)) = b.alloc(12, LARGE) {
                v.push(i);
            }
            assert_eq!(v.len(), 16);
            assert!(b.alloc(12, LARGE).is_none());
            for i in v {
                b.free(i, 12, 0);
            }
            b.check().unwrap();
            assert!(b.alloc(16, LARGE).is_some());
        });
    }

    #[test]
    fn grow_and_shrink_in_place() {
        with_buddy(18, 1, |b| {
            let (a, _) = b.alloc(12, LARGE).unwrap();
            assert_eq!(a, 0);
            assert!(b.grow_in_place(a, 12, 15));
            b.check().unwrap();
            let (c, _) = b.alloc(12, LARGE).unwrap();
            assert_eq!(c, 8); // right after the grown block
            assert!(!b.grow_in_place(a, 15, 16)); // its buddy holds `c`
            b.free(c, 12, DIRTY);
            assert!(b.grow_in_place(a, 15, 16));
            b.shrink_in_place(a, 16, 12);
            b.check().unwrap();
            b.free(a, 12, DIRTY);
            b.check().unwrap();
            assert_eq!(b.free_bytes, 1 << 18);
        });
    }

    #[test]
    fn random_operations_keep_invariants() {
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        with_buddy(20, 4, |b| {
            let mut live: Vec<(u32, u32)> = vec![];
            for step in 0..20000 {
                if live.is_empty() || rnd() % 3 != 0 {
                    let o = 12 + (rnd() % 6) as u32;
                    if let Some((i, _)) = b.alloc(o, LARGE) {
                        live.push((i, o));
                    }
                } else {
                    let k = (rnd() as usize) % live.len();
                    let (i, o) = live.swap_remove(k);
                    b.free(i, o, if rnd() % 2 == 0 { DIRTY } else { 0 });
                }
                if step % 500 == 0 {
                    b.check().unwrap();
                }
            }
            for (i, o) in live.drain(..) {
                b.free(i, o, 0);
            }
            b.check().unwrap();
            assert_eq!(b.free_bytes, 4 << 20);
        });
    }
}
