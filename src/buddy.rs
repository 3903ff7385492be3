//! The buddy allocator: power-of-two blocks of 4 KiB up to the top order, split on allocation and merged
//! with their free buddy on release. A single-threaded structure: the lock lives in [`crate::heap`].
//!
//! All bookkeeping lives in the *page map*, one [`PageEntry`] per 4 KiB page of the region, never in
//! the blocks themselves: a free block may have been purged (its pages given back to the OS and reading
//! as zero), and writing a list link into it would fault a page back in.

use crate::os::{self, PAGE};

pub const PAGE_SHIFT: u32 = 12;
/// Smallest block order (4 KiB).
pub const MIN_ORDER: u32 = PAGE_SHIFT;
/// Largest top order supported (1 GiB).
pub const MAX_ORDER_LIMIT: u32 = 30;
pub const NORDERS: usize = (MAX_ORDER_LIMIT - MIN_ORDER + 1) as usize;
/// "No page": end of a list.
pub const NIL: u32 = u32::MAX;
/// Runs of this many pages or more are placed over the most dirty free pages
/// ([`Buddy::dirtiest_run`]).
const DIRTIEST_MIN: u32 = 16;

/// What a page of the region is. The page map starts zeroed, so every page starts `Interior`.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    /// Not the head of a block: inside a block or run, or not yet committed.
    Interior = 0,
    /// The head of a free block (on a free list).
    Free = 1,
    /// The head of a large block: a run of whole pages.
    Large = 2,
    /// Every page of a slab, so that any interior pointer finds its slab.
    Slab = 3,
    /// The head of a block of the allocator's own metadata (thread caches).
    Meta = 4,
    /// Every page of a load-arena chunk, so that any interior pointer finds its chunk.
    Arena = 5,
    /// Every page of a *hole*: a piece of a lazy region that something else had mapped when the heap
    /// grew over it. Not the heap's; the head's `next` is the hole's length in pages.
    Outside = 6,
}

/// `flags` bit: the free block holds resident (non-zero) pages: at least one of its pages is dirty
/// (see [`Buddy`]'s dirty bitmap). Of a block or run handed out: at least one of its pages was.
pub const DIRTY: u8 = 1;
/// `flags` bit: the free block's pages were handed out since they were committed, so they may read
/// non-zero even when clean (a write after free into a purged page faults a page back in with the
/// written data). Only a block without it is known to read zero. `DIRTY` implies `USED`.
pub const USED: u8 = 2;
/// `flags` bit: the free block may hold pages made inaccessible (`PROT_NONE`: a purged block, or a
/// slab's guard page, under `EDGEPOOL_SECURE`); the heap makes them accessible before handing the
/// block out.
pub const SEALED: u8 = 4;

/// One entry per 4 KiB page of the region.
///
/// Invariants: for a block head, `kind` is `FREE`, `SLAB`, `META` or `ARENA` and `order` is the
/// block's order, or `kind` is `LARGE` and the head starts a *run* of `next` pages (any length; the
/// pages of its tail were given back as free blocks); `prev`/`next` are list links while
/// `kind == FREE`, and the `prev` of the second page of a free block (of two pages or more) is the
/// number of its dirty pages; the pages inside a block or run other than its head are `NONE` (or
/// `SLAB`/`ARENA` for every page of a slab or arena chunk).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PageEntry {
    pub kind: PageKind,
    pub order: u8,
    /// `DIRTY` and `USED` bits, for a free block.
    pub flags: u8,
    /// Of an allocated block's head: 1 if it was allocated inside a load phase, 2 if it is held in a
    /// thread's run cache (`heap::RUN_CACHED`), else 0.
    pub load: u8,
    pub prev: u32,
    pub next: u32,
}

/// Words of the dirty bitmap for `npages` pages.
pub const fn bitmap_words(npages: usize) -> usize {
    npages.div_ceil(64)
}

/// The free lists.
///
/// Residency is tracked per page: bit `i` of the *dirty bitmap* `bits` says that page `i` is free and
/// dirty (freed since it was last purged, so it may be resident). Free blocks merge whatever their
/// pages' states, so a freed block always joins its free buddy and a later request of the merged size
/// finds it; a *mixed* block counts only its dirty pages as resident.
///
/// Invariants (checked by [`Buddy::check_counting_runs`]):
/// - `heads[d][o - MIN_ORDER]` starts a doubly linked list of exactly the free blocks of order `o` whose
///   `DIRTY` flag is `d` (blocks without a dirty page in list 0, the others in list 1), so that
///   allocation can prefer memory that is already resident and purging can find dirty blocks without
///   walking clean ones; a free block's `DIRTY` flag is set exactly when one of its bits is;
/// - the bits set are exactly the dirty pages of free blocks, plus those of blocks taken out by
///   [`Buddy::take_dirty`] and not yet put back; the bits of a block are changed only while it is on
///   no list;
/// - a block of order `o` starts at a page index that is a multiple of `2^(o - MIN_ORDER)`;
/// - every page below `frontier` belongs to exactly one block (free or allocated) or one hole
///   (`Outside` pages, `hole_pages` in all);
/// - two free buddies of the same order never coexist: they are merged on release;
/// - a free block of an order above `MIN_ORDER` keeps the number of its dirty pages in the `prev`
///   field of its second page's entry (a page inside the block, whose entry nothing else reads while
///   the block is free; see [`Buddy::block_dirty`]), so that taking it off a list, merging it and
///   weighing it for a run cost no walk over its bits;
/// - `free_bytes` is the sum of the sizes of free blocks, `dirty_bytes` the bytes of their dirty
///   pages; `taken_dirty` is the number of dirty pages in the block or run the last
///   [`Buddy::alloc`] or [`Buddy::alloc_run`] handed out.
pub struct Buddy {
    map: *mut PageEntry,
    /// The dirty bitmap: one bit per page of the page map.
    bits: *mut u64,
    heads: [[u32; NORDERS]; 2],
    /// Bit `o - MIN_ORDER` of `nonempty[d]` is set exactly when `heads[d][o - MIN_ORDER] != NIL`.
    nonempty: [u32; 2],
    /// Order of the blocks the region is carved into.
    pub top: u32,
    /// Pages `[0, frontier)` are committed and covered by blocks, except the holes.
    pub frontier: u32,
    /// Pages below the frontier that are holes, not the heap's.
    pub hole_pages: u32,
    pub free_bytes: usize,
    pub dirty_bytes: usize,
    /// Dirty pages of the block or run last handed out (resident already: no page faults).
    pub taken_dirty: u32,
}

// SAFETY: the page map pointer is only dereferenced by the owner of the `Buddy`, which the heap
// serialises with its lock.
unsafe impl Send for Buddy {}

/// Which free list (clean 0, dirty 1) a block with `flags` belongs on.
#[inline]
const fn list(flags: u8) -> usize {
    (flags & DIRTY) as usize
}

#[inline]
const fn pages(order: u32) -> u32 {
    1 << (order - MIN_ORDER)
}

impl Buddy {
    pub const fn empty() -> Self {
        Buddy {
            map: core::ptr::null_mut(),
            bits: core::ptr::null_mut(),
            heads: [[NIL; NORDERS]; 2],
            nonempty: [0; 2],
            top: MIN_ORDER,
            frontier: 0,
            hole_pages: 0,
            free_bytes: 0,
            dirty_bytes: 0,
            taken_dirty: 0,
        }
    }

    /// # Safety
    /// - `map` points to a zeroed, writable array of page entries covering every page the buddy will
    ///   ever be given (see [`Buddy::add_top`]), and outlives the buddy; `bits` likewise to a zeroed
    ///   array of words with one bit per one of those pages ([`bitmap_words`]).
    /// - `MIN_ORDER <= top <= MAX_ORDER_LIMIT`.
    pub unsafe fn init(&mut self, map: *mut PageEntry, bits: *mut u64, top: u32) {
        *self = Buddy::empty();
        self.map = map;
        self.bits = bits;
        self.top = top;
    }

    /// Calls `f(word, mask)` for the words of the dirty bitmap that pages `[idx, idx + n)` touch, with
    /// the mask of their bits.
    ///
    /// The words between the first and the last come in a loop of their own with the full mask,
    /// which the compiler unrolls (a mask computed for each word was most of the instructions of
    /// an 8 MiB allocation's placement under callgrind).
    #[inline]
    fn for_bits(idx: u32, n: u32, mut f: impl FnMut(usize, u64)) {
        if n == 0 {
            return;
        }
        let (first, last) = ((idx / 64) as usize, ((idx + n - 1) / 64) as usize);
        let head = u64::MAX << (idx % 64);
        let tail = u64::MAX >> (63 - (idx + n - 1) % 64);
        if first == last {
            f(first, head & tail);
            return;
        }
        f(first, head);
        for w in first + 1..last {
            f(w, u64::MAX);
        }
        f(last, tail);
    }

    /// Dirty pages among `[idx, idx + n)`.
    fn count_dirty(&self, idx: u32, n: u32) -> u32 {
        let mut c = 0;
        // SAFETY: every page passed here is below `frontier`, inside the map, so its word is inside
        // the bitmap (`init`).
        Self::for_bits(idx, n, |w, m| c += unsafe { (*self.bits.add(w) & m).count_ones() });
        c
    }

    /// Dirty pages among `[idx, idx + n)`, part of a span of `len` pages `d` of which are dirty:
    /// counted only where the span is partly dirty (its free blocks record `d`: [`Buddy::block_dirty`]).
    fn dirty_within(&self, idx: u32, n: u32, d: u32, len: u32) -> u32 {
        if d == 0 {
            0
        } else if d == len {
            n
        } else {
            self.count_dirty(idx, n)
        }
    }

    /// Marks pages `[idx, idx + n)` dirty (`on`) or clean. Returns how many were dirty before.
    fn set_dirty(&mut self, idx: u32, n: u32, on: bool) -> u32 {
        let mut c = 0;
        let bits = self.bits;
        Self::for_bits(idx, n, |w, m| {
            // SAFETY: as in `count_dirty`; `&mut self` makes the access exclusive.
            unsafe {
                let p = bits.add(w);
                c += (*p & m).count_ones();
                *p = if on { *p | m } else { *p & !m };
            }
        });
        c
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

    fn set_head(&mut self, idx: u32, kind: PageKind, order: u32, flags: u8) {
        // SAFETY: every index passed here is below `frontier`, which `add_top` keeps inside the map.
        let e = unsafe { self.entry_mut(idx) };
        e.kind = kind;
        e.order = order as u8;
        e.flags = flags;
        e.load = 0;
    }

    /// Puts the block of `order` at `idx`, `d` of whose pages are dirty, on its free list, and
    /// records `d` ([`Buddy::block_dirty`]). Its `DIRTY` flag comes from `d` (and implies `USED`);
    /// the other bits of `flags` are kept.
    fn push(&mut self, idx: u32, order: u32, flags: u8, d: u32) {
        debug_assert_eq!(d, self.count_dirty(idx, pages(order)));
        let flags = if d > 0 { flags | DIRTY | USED } else { flags & !DIRTY };
        let (l, h) = (list(flags), (order - MIN_ORDER) as usize);
        let old = self.heads[l][h];
        self.set_head(idx, PageKind::Free, order, flags);
        // SAFETY: idx and old (if not NIL) are block heads below `frontier`.
        unsafe {
            let e = self.entry_mut(idx);
            e.prev = NIL;
            e.next = old;
            if old != NIL {
                self.entry_mut(old).prev = idx;
            }
            if order > MIN_ORDER {
                // idx + 1 is a page inside the block (Buddy's invariants).
                self.entry_mut(idx + 1).prev = d;
            }
        }
        self.heads[l][h] = idx;
        self.nonempty[l] |= 1 << h;
        self.free_bytes += (pages(order) as usize) * PAGE;
        self.dirty_bytes += d as usize * PAGE;
    }

    /// Dirty pages of the free block at `idx` of `order` (on a list: [`Buddy::push`] recorded them).
    #[inline]
    fn block_dirty(&self, idx: u32, order: u32) -> u32 {
        if order == MIN_ORDER {
            return self.count_dirty(idx, 1);
        }
        // SAFETY: idx + 1 is a page of the free block at idx, below frontier.
        let d = unsafe { self.entry(idx + 1).prev };
        debug_assert_eq!(d, self.count_dirty(idx, pages(order)));
        d
    }

    /// Takes the free block at `idx` off its list. Returns its dirty pages.
    fn unlink(&mut self, idx: u32) -> u32 {
        // SAFETY: idx is a free block head below `frontier`; its links are valid list members.
        unsafe {
            let e = self.entry(idx);
            if e.prev != NIL {
                self.entry_mut(e.prev).next = e.next;
            } else {
                let (l, h) = (list(e.flags), (e.order as u32 - MIN_ORDER) as usize);
                self.heads[l][h] = e.next;
                if e.next == NIL {
                    self.nonempty[l] &= !(1 << h);
                }
            }
            if e.next != NIL {
                self.entry_mut(e.next).prev = e.prev;
            }
            let d = if e.flags & DIRTY != 0 { self.block_dirty(idx, e.order as u32) } else { 0 };
            self.entry_mut(idx).kind = PageKind::Interior;
            let n = pages(e.order as u32);
            self.free_bytes -= (n as usize) * PAGE;
            self.dirty_bytes -= d as usize * PAGE;
            d
        }
    }

    /// Adds a new block of `order` at page `idx` (freshly committed, hence clean), merged with the
    /// clean free blocks below it.
    ///
    /// # Safety
    /// - `idx == frontier`, `idx` is aligned to the block's size, `MIN_ORDER <= order <= top`, and the
    ///   page map given to [`Buddy::init`] covers the new block's pages.
    pub unsafe fn add_block(&mut self, idx: u32, order: u32) {
        debug_assert!(idx == self.frontier && idx % pages(order) == 0 && order <= self.top);
        self.frontier = idx + pages(order);
        // SAFETY: the block's pages are now below the frontier, aligned, and belong to nobody: giving
        // them to the free lists is what `free` does with a block its caller gives up.
        unsafe { self.free(idx, order, 0) };
    }

    /// Adds a new top-order block at page `idx` (freshly committed, hence clean).
    ///
    /// # Safety
    /// - as [`Buddy::add_block`] with `order == top`.
    pub unsafe fn add_top(&mut self, idx: u32) {
        // SAFETY: the caller's contract.
        unsafe { self.add_block(idx, self.top) };
    }

    /// Pages below the frontier that are the heap's (committed): all but the holes.
    pub fn committed_pages(&self) -> u32 {
        self.frontier - self.hole_pages
    }

    /// Skips `n` pages at the frontier that are not the heap's (a hole, see [`PageKind::Outside`]).
    ///
    /// # Safety
    /// - `idx == frontier`, and the page map given to [`Buddy::init`] covers `idx .. idx + n`.
    pub unsafe fn add_hole(&mut self, idx: u32, n: u32) {
        debug_assert!(idx == self.frontier && n > 0);
        for i in idx..idx + n {
            // SAFETY: i is inside the map (caller's contract).
            let e = unsafe { self.entry_mut(i) };
            e.kind = PageKind::Outside;
            e.next = n - (i - idx);
        }
        self.frontier = idx + n;
        self.hole_pages += n;
    }

    /// Smallest order `>= order` whose list `l` is not empty.
    fn smallest(&self, l: usize, order: u32) -> Option<u32> {
        let above = self.nonempty[l] >> (order - MIN_ORDER);
        let o = order + above.trailing_zeros();
        (above != 0 && o <= self.top).then_some(o)
    }

    /// Takes a free block of `order` off the lists, splitting a larger one, and returns its head,
    /// its inherited `USED`/`SEALED` flags and its dirty pages; its bits are left as they are, for
    /// the caller to clear. `None` when no free block is large enough.
    ///
    /// Resident memory comes first: the smallest block with a dirty page that fits, and only when
    /// there is none the smallest clean one; a split keeps the half with more dirty pages. Reusing
    /// a dirty page costs no page fault and adds nothing to the resident set. Within the list, the
    /// lowest address of its first few blocks ([`Buddy::lowest_of`]).
    fn take(&mut self, order: u32) -> Option<(u32, u8, u32)> {
        let (l, mut o) = match self.smallest(1, order) {
            Some(o) => (1, o),
            None => (0, self.smallest(0, order)?),
        };
        let mut idx = self.lowest_of(self.heads[l][(o - MIN_ORDER) as usize]);
        // SAFETY: idx is a free head below frontier.
        let flags = unsafe { self.entry(idx).flags } & (USED | SEALED);
        let mut d = self.unlink(idx);
        while o > order {
            o -= 1;
            let half = pages(o);
            let upper = self.dirty_within(idx + half, half, d, 2 * half);
            if l == 1 && upper > d - upper {
                self.push(idx, o, flags, d - upper);
                idx += half;
                d = upper;
            } else {
                self.push(idx + half, o, flags, upper);
                d -= upper;
            }
        }
        Some((idx, flags, d))
    }

    /// The block at the lowest address among the first `LOWEST_OF` of the free list that starts at
    /// `idx` (not `NIL`). Taking low blocks first keeps the heap's live blocks packed at its low end
    /// and lets freed blocks above them merge and wait together, where taking the most recently freed
    /// block (a list's head) scatters long-lived blocks over the whole heap. Measured on the suite's
    /// `mstress` (random sizes up to 1 MiB, threads replaced), with the spanning runs: page faults
    /// 391k → 51k–166k and 1.6–1.9 s → 0.5–1.1 s (four and five alternating runs); with the lowest
    /// address for large runs only, 232k–279k. A bounded scan, not an address-ordered structure:
    /// 32 list entries at most, and a list is rarely longer.
    fn lowest_of(&self, mut idx: u32) -> u32 {
        const LOWEST_OF: usize = 32;
        let mut best = idx;
        for _ in 0..LOWEST_OF {
            if idx == NIL {
                break;
            }
            best = best.min(idx);
            // SAFETY: idx is a member of a free list, so a free head below frontier.
            idx = unsafe { self.entry(idx).next };
        }
        best
    }

    /// Takes a block of `order` and marks its head `kind`. Returns its page index and its flags
    /// (`DIRTY`: some of its pages are resident, [`Buddy::taken_dirty`] of them; `USED`: may read
    /// non-zero), or `None` when no free block is large enough (the caller then grows the region).
    pub fn alloc(&mut self, order: u32, kind: PageKind) -> Option<(u32, u8)> {
        let (idx, flags, _) = self.take(order)?;
        let d = self.set_dirty(idx, pages(order), false);
        self.taken_dirty = d;
        self.set_head(idx, kind, order, 0);
        Some((idx, if d > 0 { flags | DIRTY | USED } else { flags }))
    }

    /// Releases the allocated block at `idx` of `order` and merges it with free buddies. Returns the
    /// head and order of the resulting free block. With `DIRTY` in `flags` all its pages become
    /// dirty; without, clean (fresh, or purged).
    ///
    /// # Safety
    /// - Pages `idx .. idx + 2^(order - MIN_ORDER)` are below `frontier`, aligned to their size, and
    ///   allocated (a block, or part of a run) to the caller, who gives them up. (Freeing pages that
    ///   are already free would put them on two lists and hand them out twice.) Without `DIRTY`, they
    ///   read as zero unless `USED`.
    pub unsafe fn free(&mut self, idx: u32, order: u32, flags: u8) -> (u32, u32) {
        let dirty = flags & DIRTY != 0;
        self.set_dirty(idx, pages(order), dirty);
        // SAFETY: forwarded contract; the block's pages are all dirty or all clean, as said.
        unsafe { self.merge_in(idx, order, flags, if dirty { pages(order) } else { 0 }) }
    }

    /// Gives the block at `idx` of `order` to the free lists with its pages' dirty bits as they
    /// are (`d` of them set), merged with its free buddies (whatever their state).
    ///
    /// # Safety
    /// - as [`Buddy::free`], the bits of its pages saying which of them are dirty, `d` of them.
    unsafe fn merge_in(&mut self, mut idx: u32, mut order: u32, flags: u8, mut d: u32) -> (u32, u32) {
        let mut flags = flags & (USED | SEALED);
        // If the block merges with a buddy below it, its head becomes an interior page: clear its kind
        // now so that no stale `LARGE`/`SLAB` entry is left for a later (invalid) free to find.
        // SAFETY: idx is an allocated head below frontier (caller's contract).
        unsafe { self.entry_mut(idx).kind = PageKind::Interior };
        while order < self.top {
            let b = idx ^ pages(order);
            if b >= self.frontier {
                break;
            }
            // SAFETY: b < frontier.
            let e = unsafe { self.entry(b) };
            if e.kind != PageKind::Free || e.order as u32 != order {
                break;
            }
            d += self.unlink(b);
            flags |= e.flags & (USED | SEALED);
            idx = idx.min(b);
            order += 1;
        }
        self.push(idx, order, flags, d);
        (idx, order)
    }

    /// Largest order of an aligned block that starts at page `i` and ends at or before page `end`.
    fn fit_order(&self, i: u32, end: u32) -> u32 {
        let by_align = if i == 0 { self.top } else { (i.trailing_zeros() + MIN_ORDER).min(self.top) };
        let by_len = (u32::BITS - 1 - (end - i).leading_zeros()) + MIN_ORDER;
        by_align.min(by_len)
    }

    /// Frees the pages `[start, end)` as the aligned blocks that tile them, each merged with free
    /// buddies.
    ///
    /// # Safety
    /// - `start < end <= frontier`, and every page of `[start, end)` is allocated to the caller (a
    ///   block, a run or part of one), who gives them up.
    pub unsafe fn release_range(&mut self, start: u32, end: u32, flags: u8) {
        let dirty = flags & DIRTY != 0;
        self.set_dirty(start, end - start, dirty);
        // SAFETY: forwarded contract; the bits now say what `flags` says.
        unsafe { self.merge_range(start, end, flags, if dirty { end - start } else { 0 }) }
    }

    /// [`Buddy::release_range`] with the pages' dirty bits kept as they are, `d` of them set.
    /// The bits of a piece are counted only where the range is partly dirty, and never those of its
    /// last piece (the largest, when the range is a block's tail).
    ///
    /// # Safety
    /// - as [`Buddy::release_range`], the bits saying which pages are dirty, `d` of them.
    unsafe fn merge_range(&mut self, start: u32, end: u32, flags: u8, mut d: u32) {
        let mut i = start;
        while i < end {
            let o = self.fit_order(i, end);
            let next = i + pages(o);
            let here = if next == end { d } else { self.dirty_within(i, pages(o), d, end - i) };
            d -= here;
            // SAFETY: the aligned block [i, i + 2^o) lies inside [start, end) (fit_order), allocated
            // to the caller (contract), `here` of its pages dirty.
            unsafe { self.merge_in(i, o, flags, here) };
            i = next;
        }
    }

    /// Allocates a run of exactly `n` pages whose first page is aligned to `2^align_order` bytes, and
    /// marks its head `LARGE` with `next = n`. A run of `DIRTIEST_MIN` pages or more (page aligned)
    /// goes where the free pages it covers hold the most dirty ones ([`Buddy::dirtiest_run`]). Else
    /// the smallest block holding the run is taken (dirty first, see [`Buddy::take`]) and the pages
    /// beyond the run go straight back as free blocks, so a 40 MiB request holds 40 MiB, not 64;
    /// when no dirty block is large enough, dirty free blocks of lower orders with free blocks after
    /// them come first ([`Buddy::span_run`]). Returns the head and the run's flags (as
    /// [`Buddy::alloc`]).
    #[cfg(test)]
    pub fn alloc_run(&mut self, n: u32, align_order: u32) -> Option<(u32, u8)> {
        self.alloc_run_placing(n, align_order, true)
    }

    /// [`Buddy::alloc_run`], placing a run of `DIRTIEST_MIN` pages or more over the most dirty free
    /// pages only if `dirtiest` (else as the smaller ones).
    pub fn alloc_run_placing(&mut self, n: u32, align_order: u32, dirtiest: bool) -> Option<(u32, u8)> {
        debug_assert!(n >= 1);
        let order = (u32::BITS - (n - 1).leading_zeros() + MIN_ORDER).max(align_order);
        if order > self.top {
            return None;
        }
        if dirtiest && align_order == MIN_ORDER && n >= DIRTIEST_MIN {
            if let Some((lo, block)) = self.dirtiest_run(n, order) {
                return Some(match block {
                    Some((h, end)) => self.take_span(h, lo, end, n, order),
                    None => self.take_at(lo, n, order),
                });
            }
        }
        if align_order == MIN_ORDER && self.smallest(1, order).is_none() {
            if let Some(got) = self.span_run(n, order) {
                return Some(got);
            }
        }
        let (idx, mut flags, mut d) = self.take(order)?;
        let mut lo = idx;
        let top_end = idx + pages(order) - n;
        // The block's dirty pages at its end and at its start, counted only where it is partly dirty.
        let high = (align_order == MIN_ORDER && n < pages(order))
            .then(|| self.dirty_within(top_end, n, d, pages(order)))
            .filter(|&high| high > self.dirty_within(idx, n, d, pages(order)));
        if let Some(high) = high {
            // The block's resident pages are at its end: the run goes there, and the pages below it
            // go back.
            lo = top_end;
            // SAFETY: `[idx, lo)` are pages of the block just taken, ours, their bits as they were:
            // `d - high` of them set.
            unsafe { self.merge_range(idx, lo, flags, d - high) };
            d = high;
        } else if align_order == MIN_ORDER && n < pages(order) {
            // Slide the run down over the free blocks that end right below the block (the tails
            // earlier runs gave back; at most one block's worth): runs of one odd size then pack end
            // to end instead of each stranding a tail too small for the next (25-page runs kept 25
            // of every 32 pages before). Where the run fits below, the block goes back whole.
            while lo > 0 {
                let Some((h, o)) = self.free_block_at(lo - 1) else { break };
                debug_assert_eq!(h + pages(o), lo);
                if idx - h > pages(order) {
                    break;
                }
                // SAFETY: h is a free head below frontier.
                let f = unsafe { self.entry(h).flags };
                d += self.unlink(h);
                flags |= f & (USED | SEALED);
                lo = h;
            }
        }
        // SAFETY: `[lo, idx + pages(order))` is ours: the block just taken at `idx` and, where the run
        // slid down, the free blocks below it unlinked above (or, placed at the block's end, the
        // pages below `lo` went back and `lo + n` is the block's end); `n <= pages(order)`, so the
        // run ends inside it. The pages' bits are as they were (`d` of them set); all below frontier.
        Some(unsafe { self.make_run(lo, n, idx + pages(order), order, flags, d) })
    }

    /// The first page of the placement of a run of `n` pages (needing a block of `order`) over free
    /// pages that covers the most dirty ones, with the free block `[head, end)` that holds it when it
    /// lies in one (else the caller finds the blocks, [`Buddy::take_at`]), or `None` when the
    /// candidates below hold no dirty page in a stretch of free pages that long.
    ///
    /// Where a request is placed decides how much of it faults in: a freed run's pages wait dirty,
    /// but a buddy block of the next request's order rarely holds them (a freed 5 MiB run lies
    /// across blocks of 4 MiB and 1 MiB; a 6 MiB request needs a block of 8), so the request took
    /// clean pages while the dirty ones waited, to be purged and faulted in again. Candidates: the
    /// first `PER_ORDER` dirty free blocks of each order from `order` up (each holds the run: its
    /// first and last `n` pages; the smallest order with a wholly dirty window ends the search),
    /// then of each of the four orders below, down (the stretch of free blocks from the block on,
    /// extended down over at most `BACK_STEPS` free blocks: its first and last `n` pages, and the
    /// `n` from the block). The most dirty pages win, then the shortest stretch (best fit), then
    /// the lowest address. The suite's `malloc_large` (64 KiB-32 MiB blocks in a loop): 188k page
    /// faults to 101k at the same purge policy; in `mstress` the scan costs no time measurably.
    /// (Unbounded walks down and 32 blocks of each order took 29 % of `mstress`'s samples.)
    fn dirtiest_run(&self, n: u32, order: u32) -> Option<(u32, Option<(u32, u32)>)> {
        const PER_ORDER: usize = 8;
        const BACK_STEPS: usize = 4;
        type Window = (u32, u32, u32, Option<(u32, u32)>);
        // (dirty pages, stretch length, first page, the block holding it) of the best window so far.
        let mut best: Option<Window> = None;
        let consider = |best: &mut Option<Window>, d: u32, len: u32, p: u32, block: Option<(u32, u32)>| {
            let key = (d, core::cmp::Reverse(len), core::cmp::Reverse(p));
            if d > 0 && best.is_none_or(|(bd, bl, bp, _)| key > (bd, core::cmp::Reverse(bl), core::cmp::Reverse(bp))) {
                *best = Some((d, len, p, block));
            }
        };
        let lowest = order.saturating_sub(4).max(MIN_ORDER);
        for o in (order..=self.top).chain((lowest..order).rev()) {
            let size = pages(o);
            let mut h = self.heads[1][(o - MIN_ORDER) as usize];
            for _ in 0..PER_ORDER {
                if h == NIL {
                    break;
                }
                // A window holds at most the dirty pages its free pages hold, which the blocks record:
                // where that is fewer than the best so far, it is not counted.
                if size >= n {
                    let bd = self.block_dirty(h, o);
                    if best.is_none_or(|b| bd >= b.0) {
                        for p in [h, h + size - n] {
                            consider(&mut best, self.dirty_within(p, n, bd, size), size, p, Some((h, h + size)));
                        }
                    }
                } else {
                    let end = self.free_end(h, n);
                    let mut lo = h;
                    for _ in 0..BACK_STEPS {
                        if lo == 0 || end - lo >= n {
                            break;
                        }
                        let Some((b, _)) = self.free_block_at(lo - 1) else { break };
                        lo = b;
                    }
                    // Every page of `[lo, end)` is free (blocks end to end), below frontier.
                    let sd = if end - lo >= n { self.stretch_dirty(lo, end) } else { 0 };
                    if sd > 0 && best.is_none_or(|b| sd >= b.0) {
                        for p in [lo, h.min(end - n), end - n] {
                            consider(&mut best, self.dirty_within(p, n, sd, end - lo), end - lo, p, None);
                        }
                    }
                }
                // SAFETY: h is a member of a free list, so a free head below frontier.
                h = unsafe { self.entry(h).next };
            }
            if o >= order && best.is_some_and(|b| b.0 == n) {
                break;
            }
        }
        best.map(|b| (b.2, b.3))
    }

    /// Dirty pages of the free blocks that tile `[lo, end)` (as [`Buddy::free_end`] found them), from
    /// what each block records.
    fn stretch_dirty(&self, lo: u32, end: u32) -> u32 {
        let (mut i, mut d) = (lo, 0);
        while i < end {
            // SAFETY: i heads one of the free blocks tiling `[lo, end)`, below frontier.
            let o = unsafe { self.entry(i) }.order as u32;
            d += self.block_dirty(i, o);
            i += pages(o);
        }
        d
    }

    /// Makes `[lo, lo + n)` a run (head `LARGE` with `next = n`, its dirty bits cleared and counted
    /// in [`Buddy::taken_dirty`]) and gives `[lo + n, end)` back as free blocks with `flags`. Returns
    /// the run as [`Buddy::alloc_run`] does.
    ///
    /// # Safety
    /// - the pages `[lo, end)` are below frontier, on no free list and the caller's (taken off the
    ///   lists for this run), their dirty bits saying which are dirty, `span_dirty` of them;
    ///   `lo + n <= end`.
    unsafe fn make_run(&mut self, lo: u32, n: u32, end: u32, order: u32, flags: u8, span_dirty: u32) -> (u32, u8) {
        let d = self.set_dirty(lo, n, false);
        self.taken_dirty = d;
        self.set_head(lo, PageKind::Large, order, 0);
        // SAFETY: the caller's contract: the pages beyond the run are ours to give back, below
        // frontier, their bits as they were (the span's but the run's).
        unsafe {
            if lo + n < end {
                self.merge_range(lo + n, end, flags, span_dirty - d);
            }
            self.entry_mut(lo).next = n;
        }
        (lo, if d > 0 { flags | DIRTY | USED } else { flags })
    }

    /// A run of `n` pages (needing a block of `order`, of which no dirty one is free) made of free
    /// blocks that lie end to end, the first of them dirty and of a lower order: the pages a freed run
    /// leaves when its block's tail was taken by others (`[8 MiB free][4 MiB free][4 MiB taken]` holds
    /// a 10 MiB run, which no free block of 16 MiB does). Without it the request takes clean pages
    /// (page faults, and a higher resident set while the dirty ones wait). Looks at up to
    /// `SPAN_CANDIDATES` dirty blocks of each of the four orders below `order`, largest first, and
    /// takes the first span long enough; the pages beyond the run go back as free blocks. (64 blocks
    /// of every lower order faulted as many pages in the suite's `mstress` as these 16 of four.) A
    /// span may cross from one top block into the next: the run's pages are contiguous and
    /// committed either way, and its release tiles them with aligned blocks again. Returns the run
    /// as [`Buddy::alloc_run`] does, or `None`.
    fn span_run(&mut self, n: u32, order: u32) -> Option<(u32, u8)> {
        const SPAN_CANDIDATES: usize = 16;
        let lowest = order.saturating_sub(4).max(MIN_ORDER);
        for o in (lowest..order).rev() {
            let mut idx = self.heads[1][(o - MIN_ORDER) as usize];
            for _ in 0..SPAN_CANDIDATES {
                if idx == NIL {
                    break;
                }
                // The candidate and the free blocks that follow it, until the span holds `n` pages.
                let end = self.free_end(idx, n);
                if end - idx >= n {
                    return Some(self.take_span(idx, idx, end, n, order));
                }
                // SAFETY: idx is a free head below frontier (a list member).
                idx = unsafe { self.entry(idx).next };
            }
        }
        None
    }

    /// A run of `n` pages whose first page is aligned to `2^align_order` bytes, over free blocks that
    /// lie end to end, wherever they lie and whatever their state: the last resort of a heap that
    /// cannot grow. [`Buddy::alloc_run`] finds a run only in a free block of its order or in a span
    /// that starts with a dirty block of one of the four orders below it (a few of each), so once a
    /// refused growth has purged every free page, 25 free pages in a row no longer served a 25-page
    /// request unless a 32-page block was free (under a 100 MB address-space limit, a program that
    /// freed 719 such runs got 127 of them back, glibc all: `tests/preload.rs`). Each stretch of free
    /// blocks is walked once, from its first block (one whose page before lies in no free block); of
    /// those that hold the run from their first aligned page on, the shortest is taken (lowest
    /// address on ties), the pages before and beyond the run back as free blocks. Costs a look at
    /// every free block (and the orders of the page before it): for the failure path only. Returns
    /// the run as [`Buddy::alloc_run`] does, or `None`.
    pub fn span_any(&mut self, n: u32, align_order: u32) -> Option<(u32, u8)> {
        if n == 0 || align_order < MIN_ORDER {
            return None;
        }
        let order = (u32::BITS - (n - 1).leading_zeros() + MIN_ORDER).max(align_order);
        if order > self.top {
            return None;
        }
        let align = pages(align_order);
        // (stretch length, the run's first page) of the best so far.
        let mut best: Option<(u32, u32)> = None;
        for l in 0..2 {
            for o in MIN_ORDER..=self.top {
                let mut h = self.heads[l][(o - MIN_ORDER) as usize];
                while h != NIL {
                    // SAFETY: h is a member of a free list, so a free head below frontier.
                    let next = unsafe { self.entry(h).next };
                    if h == 0 || self.free_block_at(h - 1).is_none() {
                        let end = self.free_end(h, u32::MAX);
                        let lo = h.next_multiple_of(align);
                        let len = end - h;
                        if lo <= end && end - lo >= n && best.is_none_or(|b| (len, lo) < b) {
                            best = Some((len, lo));
                        }
                    }
                    h = next;
                }
            }
        }
        let (_, lo) = best?;
        Some(self.take_at(lo, n, order))
    }

    /// Takes the run `[lo, lo + n)` (needing a block of `order`) out of the free blocks that hold it
    /// ([`Buddy::take_span`]): from the one that holds `lo` to the first that ends at or beyond
    /// `lo + n`.
    ///
    /// The caller has seen every page of `[lo, lo + n)` free (in free blocks that lie end to end).
    fn take_at(&mut self, lo: u32, n: u32, order: u32) -> (u32, u8) {
        let Some((first, _)) = self.free_block_at(lo) else { os::broken("take_at: a page seen free is not") };
        let end = self.free_end(first, lo + n - first);
        self.take_span(first, lo, end, n, order)
    }

    /// The end of the free blocks that lie end to end from page `from` (below frontier), walked until
    /// they hold `want` pages, or a page that heads no free block, or the frontier.
    fn free_end(&self, from: u32, want: u32) -> u32 {
        let mut end = from;
        while end - from < want && end < self.frontier {
            // SAFETY: end < frontier.
            let e = unsafe { self.entry(end) };
            if e.kind != PageKind::Free {
                break;
            }
            end += pages(e.order as u32);
        }
        end
    }

    /// Takes the free blocks that tile `[first, end)` off the lists and makes `[lo, lo + n)` a run of
    /// them ([`Buddy::make_run`]), giving `[first, lo)` and `[lo + n, end)` back.
    fn take_span(&mut self, first: u32, lo: u32, end: u32, n: u32, order: u32) -> (u32, u8) {
        debug_assert!(first <= lo && lo + n <= end);
        let (mut flags, mut d) = (0, 0);
        let mut i = first;
        while i < end {
            // SAFETY: `[first, end)` is tiled by free blocks below frontier (the callers' walks).
            let e = unsafe { self.entry(i) };
            debug_assert_eq!(e.kind, PageKind::Free);
            flags |= e.flags & (USED | SEALED);
            d += self.unlink(i);
            i += pages(e.order as u32);
        }
        // SAFETY: the blocks tiling `[first, end)` were unlinked above, so its pages are ours, below
        // frontier, their bits as they were (`d` of them set); `first <= lo` and `lo + n <= end`
        // (the callers' walks).
        unsafe {
            if first < lo {
                let below = self.dirty_within(first, lo - first, d, end - first);
                self.merge_range(first, lo, flags, below);
                d -= below;
            }
            self.make_run(lo, n, end, order, flags, d)
        }
    }

    /// Number of pages of the allocated run whose head is `idx`.
    ///
    /// # Safety
    /// - `idx` is the head of a run allocated by [`Buddy::alloc_run`].
    pub unsafe fn run_pages(&self, idx: u32) -> u32 {
        // SAFETY: forwarded.
        unsafe { self.entry(idx).next }
    }

    /// Frees the run whose head is `idx`.
    ///
    /// # Safety
    /// - `idx` is the head of a live run from [`Buddy::alloc_run`], which the caller gives up.
    pub unsafe fn free_run(&mut self, idx: u32) {
        // SAFETY: idx is the head of a live run (caller's contract), below frontier; its pages are
        // the caller's.
        unsafe {
            let n = self.run_pages(idx);
            self.release_range(idx, idx + n, DIRTY);
        }
    }

    /// Frees the run whose head is `idx`, the pages of `gone` (offsets in the run and counts) already
    /// moved elsewhere ([`os::move_pages`]) or returned to the OS: they hold nothing (they read as
    /// zero, but were handed out: `USED`); the rest dirty.
    ///
    /// # Safety
    /// - as [`Buddy::free_run`]; the ranges of `gone` lie inside the run and their pages were moved
    ///   out or purged after their last write.
    pub unsafe fn free_run_cleaned(&mut self, idx: u32, gone: &[(u32, u32)]) {
        // SAFETY: idx is the head of a live run (caller's contract), below frontier; its pages are
        // the caller's, and the bits say which of them are dirty before they are merged.
        unsafe {
            let n = self.run_pages(idx);
            self.set_dirty(idx, n, true);
            let mut d = n;
            for &(at, m) in gone {
                debug_assert!(at + m <= n);
                d -= self.set_dirty(idx + at.min(n), m.min(n - at.min(n)), false);
            }
            self.merge_range(idx, idx + n, USED, d);
        }
    }

    /// The free block that contains page `i`, if any: its head and order.
    fn free_block_at(&self, i: u32) -> Option<(u32, u32)> {
        if i >= self.frontier {
            return None;
        }
        (MIN_ORDER..=self.top).find_map(|o| {
            let h = i & !(pages(o) - 1);
            // SAFETY: h <= i < frontier.
            let e = unsafe { self.entry(h) };
            (e.kind == PageKind::Free && e.order as u32 == o).then_some((h, o))
        })
    }

    /// Resizes the run at `idx` to `m` pages in place: shrinking frees the pages beyond `m`; growing
    /// claims the free pages right after the run (splitting the free blocks that hold them) and fails,
    /// changing nothing, if any of them is not free.
    ///
    /// # Safety
    /// - `idx` is the head of a live run from [`Buddy::alloc_run`] owned by the caller; `m >= 1`.
    pub unsafe fn resize_run(&mut self, idx: u32, m: u32) -> bool {
        // SAFETY: idx is the head of a live run (caller's contract).
        let n = unsafe { self.run_pages(idx) };
        if m < n {
            // SAFETY: the run's pages beyond `m` are the caller's.
            unsafe { self.release_range(idx + m, idx + n, DIRTY) };
        } else if m > n {
            let end = idx + m;
            let mut i = idx + n;
            while i < end {
                let Some((h, o)) = self.free_block_at(i) else { return false };
                // The page before `i` is allocated (the run, or claimed below), so a free block
                // holding `i` starts at `i`.
                debug_assert_eq!(h, i);
                i = h + pages(o);
            }
            let mut i = idx + n;
            while i < end {
                let Some((h, o)) = self.free_block_at(i) else { os::broken("resize_run: a page checked free is not") };
                // SAFETY: h is a free head below frontier.
                let flags = unsafe { self.entry(h).flags };
                let d = self.unlink(h);
                let hi = h + pages(o);
                let claimed = self.set_dirty(h, hi.min(end) - h, false);
                if hi > end {
                    // SAFETY: [end, hi) is the tail of the free block just unlinked, so ours to give
                    // back, its bits as they were (the block's but the claimed ones').
                    unsafe { self.merge_range(end, hi, flags, d - claimed) };
                }
                i = hi.min(end);
            }
        }
        // SAFETY: idx is the run's head, below frontier.
        unsafe { self.entry_mut(idx).next = m };
        true
    }

    /// Calls `purge(idx, order)` on free dirty blocks, smallest first, until at least `want` bytes
    /// have been made clean or none is left; where it returns `Some(extra)` the block moves to the
    /// clean list with the flags `extra` added (`SEALED`), and `None` (the OS refused) stops.
    /// Returns the bytes made clean.
    ///
    /// Smallest first: a small dirty fragment can serve only small requests, a large dirty block any
    /// request, so the large ones are kept for reuse. Measured on the model-loading benchmark, this
    /// faults in fewer pages than largest first (147k against 152k for tract) at a lower peak.
    pub fn purge(&mut self, want: usize, mut purge: impl FnMut(u32, u32, usize) -> Option<u8>) -> usize {
        let mut cleaned = 0;
        for h in 0..NORDERS {
            while cleaned < want {
                let idx = self.heads[1][h];
                if idx == NIL {
                    break;
                }
                let order = h as u32 + MIN_ORDER;
                let dirty = self.block_dirty(idx, order) as usize * PAGE;
                let Some(extra) = purge(idx, order, dirty) else {
                    // The OS refused: leave this order's blocks dirty rather than retry forever.
                    break;
                };
                // SAFETY: idx heads a list of free blocks, so it is a free head below frontier.
                unsafe { self.mark_clean(idx, extra) };
                cleaned += dirty;
            }
        }
        cleaned
    }

    /// Takes the smallest free dirty block out of the free lists, to be purged outside the heap's
    /// lock: its head is marked `Meta` (an allocated block no user can free, which merges with
    /// nothing) until [`Buddy::put_back`] returns it. Returns its page index, order and flags, and
    /// the bytes of its dirty pages.
    pub fn take_dirty(&mut self) -> Option<(u32, u32, u8, usize)> {
        let h = self.nonempty[1].trailing_zeros() as usize;
        if h >= NORDERS {
            return None;
        }
        let idx = self.heads[1][h];
        // SAFETY: idx heads a non-empty free list, so it is a free head below frontier.
        let flags = unsafe { self.entry(idx).flags };
        let dirty = self.unlink(idx) as usize * PAGE;
        let order = h as u32 + MIN_ORDER;
        self.set_head(idx, PageKind::Meta, order, 0);
        Some((idx, order, flags, dirty))
    }

    /// Returns a block taken by [`Buddy::take_dirty`] to the free lists with `flags` (its flags
    /// without `DIRTY` once purged, plus `SEALED` if sealed), merging it with its buddies. With
    /// `DIRTY` (the OS refused to purge it) its pages' bits stay as they were.
    ///
    /// # Safety
    /// - `(idx, order)` was returned by `take_dirty` and not put back since; if `flags` lacks `DIRTY`,
    ///   its pages were purged (read as zero unless `USED`).
    pub unsafe fn put_back(&mut self, idx: u32, order: u32, flags: u8) {
        // SAFETY: taken by take_dirty, so allocated to the caller, who gives it up; its bits were
        // kept meanwhile, and are cleared once it was purged.
        unsafe {
            let d = if flags & DIRTY == 0 {
                self.set_dirty(idx, pages(order), false);
                0
            } else {
                self.count_dirty(idx, pages(order))
            };
            self.merge_in(idx, order, flags, d);
        }
    }

    /// Marks the free block at `idx` clean after a successful purge, and merges it with its clean
    /// buddies.
    ///
    /// # Safety
    /// - `idx` is the head of a free block below `frontier` whose pages really read as zero now.
    unsafe fn mark_clean(&mut self, idx: u32, extra: u8) {
        // SAFETY: idx is a free head below frontier (caller's contract, checked in debug).
        let e = unsafe { self.entry(idx) };
        debug_assert!(e.kind == PageKind::Free);
        if e.flags & DIRTY != 0 {
            self.unlink(idx);
            // SAFETY: unlinked, the block is allocated to us (no list holds it).
            unsafe { self.free(idx, e.order as u32, (e.flags & !DIRTY) | extra) };
        }
    }

    /// [`Buddy::check_counting_runs`] without the count (the unit tests).
    #[cfg(test)]
    pub fn check(&self) -> Result<(), &'static str> {
        self.check_counting_runs().map(|_| ())
    }

    /// Walks the whole structure and checks every invariant. Returns a description of the first
    /// violation, or the bytes of the allocated runs (large blocks) it walked. For tests and debug
    /// builds.
    pub fn check_counting_runs(&self) -> Result<usize, &'static str> {
        let mut runs = 0usize;
        let mut free = 0usize;
        let mut dirty = 0usize;
        for (h, l) in (0..NORDERS).flat_map(|h| [(h, 0), (h, 1)]) {
            let order = h as u32 + MIN_ORDER;
            let mut prev = NIL;
            let mut idx = self.heads[l][h];
            while idx != NIL {
                if idx >= self.frontier {
                    return Err("free block beyond frontier");
                }
                // SAFETY: idx < frontier.
                let e = unsafe { self.entry(idx) };
                if e.kind != PageKind::Free || e.order as u32 != order {
                    return Err("list member is not a free head of the list's order");
                }
                if e.prev != prev {
                    return Err("broken prev link");
                }
                if idx % pages(order) != 0 {
                    return Err("misaligned block");
                }
                if list(e.flags) != l {
                    return Err("block on the wrong one of the clean and dirty lists");
                }
                free += (pages(order) as usize) * PAGE;
                let d = self.count_dirty(idx, pages(order)) as usize;
                if (d > 0) != (e.flags & DIRTY != 0) {
                    return Err("a free block's DIRTY flag disagrees with its pages' bits");
                }
                // SAFETY: idx + 1 is a page of the block, below frontier.
                if order > MIN_ORDER && unsafe { self.entry(idx + 1).prev } as usize != d {
                    return Err("a free block's recorded dirty pages disagree with its bits");
                }
                if d > 0 && e.flags & USED == 0 {
                    return Err("a dirty free block not marked USED");
                }
                dirty += d * PAGE;
                prev = idx;
                idx = e.next;
            }
        }
        if free != self.free_bytes {
            return Err("free_bytes mismatch");
        }
        for (l, heads) in self.heads.iter().enumerate() {
            for (h, &head) in heads.iter().enumerate() {
                if (head != NIL) != (self.nonempty[l] >> h & 1 != 0) {
                    return Err("non-empty mask out of step with the lists");
                }
            }
        }
        if dirty != self.dirty_bytes {
            return Err("dirty_bytes mismatch");
        }
        // Tiling: walk blocks from page 0.
        let mut idx = 0u32;
        while idx < self.frontier {
            // SAFETY: idx < frontier.
            let e = unsafe { self.entry(idx) };
            if !matches!(e.kind, PageKind::Free | PageKind::Large | PageKind::Slab | PageKind::Meta | PageKind::Arena) {
                if e.kind == PageKind::Outside && e.next > 0 && e.next <= self.frontier - idx {
                    idx += e.next;
                    continue;
                }
                return Err("page inside the frontier is not covered by a block head");
            }
            if e.kind == PageKind::Large {
                if e.next == 0 || e.next > self.frontier - idx {
                    return Err("bad run length");
                }
                if self.count_dirty(idx, e.next) != 0 {
                    return Err("an allocated run has dirty bits");
                }
                runs += e.next as usize * PAGE;
                idx += e.next;
                continue;
            }
            let o = e.order as u32;
            if !(MIN_ORDER..=self.top).contains(&o) || idx % pages(o) != 0 {
                return Err("bad block order");
            }
            // A block taken by take_dirty is `Meta` with its bits kept; every other allocated block
            // has none.
            if matches!(e.kind, PageKind::Slab | PageKind::Arena) && self.count_dirty(idx, pages(o)) != 0 {
                return Err("an allocated block has dirty bits");
            }
            if e.kind == PageKind::Free && o < self.top {
                let b = idx ^ pages(o);
                if b < self.frontier {
                    // SAFETY: b < frontier.
                    let be = unsafe { self.entry(b) };
                    if be.kind == PageKind::Free && be.order as u32 == o {
                        return Err("two free buddies not merged");
                    }
                }
            }
            idx += pages(o);
        }
        Ok(runs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use PageKind::{Interior as NONE, Meta as META, Slab as SLAB};

    // The tests give back only blocks and runs they allocated, each once, and add top blocks at the
    // frontier of a map that covers them: the contracts of the unsafe functions hold.
    fn free(b: &mut Buddy, idx: u32, order: u32, flags: u8) -> (u32, u32) {
        // SAFETY: see above.
        unsafe { b.free(idx, order, flags) }
    }
    fn free_run(b: &mut Buddy, idx: u32) {
        // SAFETY: see above.
        unsafe { b.free_run(idx) }
    }
    fn resize_run(b: &mut Buddy, idx: u32, m: u32) -> bool {
        // SAFETY: see above.
        unsafe { b.resize_run(idx, m) }
    }
    fn add_top(b: &mut Buddy, idx: u32) {
        // SAFETY: see above.
        unsafe { b.add_top(idx) }
    }

    fn with_buddy(top: u32, tops: u32, f: impl FnOnce(&mut Buddy)) {
        let n = (tops * pages(top)) as usize;
        let mut map = vec![PageEntry { kind: NONE, order: 0, flags: 0, load: 0, prev: 0, next: 0 }; n];
        let mut bits = vec![0u64; bitmap_words(n)];
        let mut b = Buddy::empty();
        // SAFETY: the vectors are zeroed and cover `tops` top blocks; they outlive `b` inside this call.
        unsafe { b.init(map.as_mut_ptr(), bits.as_mut_ptr(), top) };
        for t in 0..tops {
            add_top(&mut b, t * pages(top));
        }
        f(&mut b);
        drop(map);
        drop(bits);
    }

    #[test]
    fn bit_ranges_cover_exactly_their_pages() {
        for idx in 0..200u32 {
            for n in 0..200u32 {
                let mut got = [0u64; 7];
                Buddy::for_bits(idx, n, |w, m| {
                    assert_eq!(got[w] & m, 0, "word {w} given twice for {idx}+{n}");
                    assert_ne!(m, 0, "an empty mask for {idx}+{n}");
                    got[w] |= m;
                });
                let mut want = [0u64; 7];
                for i in idx..idx + n {
                    want[(i / 64) as usize] |= 1 << (i % 64);
                }
                assert_eq!(got, want, "pages {idx}+{n}");
            }
        }
    }

    #[test]
    fn split_and_merge_back_to_top() {
        with_buddy(20, 2, |b| {
            let total = b.free_bytes;
            let mut got = vec![];
            for o in [12, 13, 12, 15, 20, 14] {
                let (idx, flags) = b.alloc(o, META).unwrap();
                assert_eq!(flags, 0, "fresh memory is neither dirty nor used");
                assert_eq!(idx % pages(o), 0);
                got.push((idx, o));
                b.check().unwrap();
            }
            for (idx, o) in got.into_iter().rev() {
                free(b, idx, o, DIRTY);
                b.check().unwrap();
            }
            assert_eq!(b.free_bytes, total);
            // Exactly the blocks that were handed out are dirty; the rest never was.
            let used: usize = [12, 13, 12, 15, 20, 14].iter().map(|o| 1usize << o).sum();
            assert_eq!(b.dirty_bytes, used);
            let cleaned = b.purge(usize::MAX, |_, _, _| Some(0));
            assert_eq!(cleaned, used);
            assert_eq!(b.dirty_bytes, 0);
            b.check().unwrap();
            // Once clean, everything has merged back into the two top blocks.
            assert!(b.alloc(20, META).is_some() && b.alloc(20, META).is_some());
        });
    }

    /// On a buddy of two free 1 MiB top blocks: dirties a 256 KiB block and a 64 KiB block in one of
    /// them; they merge with their clean buddies into one mixed top block. Returns its page index.
    fn two_tops_with_dirty_blocks(b: &mut Buddy) -> u32 {
        let (x, _) = b.alloc(20, META).unwrap();
        let (y, _) = b.alloc(20, META).unwrap();
        free(b, x, 20, 0);
        let (big, _) = b.alloc(18, META).unwrap();
        let (small, _) = b.alloc(16, META).unwrap();
        free(b, y, 20, 0);
        free(b, big, 18, DIRTY);
        free(b, small, 16, DIRTY);
        x
    }

    #[test]
    fn dirty_blocks_taken_for_purging_are_out_of_every_list_until_put_back() {
        with_buddy(20, 2, |b| {
            let mixed = two_tops_with_dirty_blocks(b);
            b.check().unwrap();
            assert_eq!(b.dirty_bytes, (256 + 64) << 10);
            let free0 = b.free_bytes;
            // The block with dirty pages, with its flags and its dirty bytes; it is neither free nor
            // dirty meanwhile, and the structure stays consistent (an allocated block to the checker).
            let (i, o, f, dirty) = b.take_dirty().unwrap();
            assert_eq!((i, o, dirty), (mixed, 20, (256 + 64) << 10));
            assert_eq!(f & DIRTY, DIRTY);
            assert_eq!(b.free_bytes, free0 - (1 << 20));
            assert_eq!(b.dirty_bytes, 0);
            b.check().unwrap();
            // Nothing else is handed it meanwhile: no other block is dirty, and a 64 KiB request
            // comes from the other top block.
            assert!(b.take_dirty().is_none());
            let (p, _) = b.alloc(16, META).unwrap();
            assert!(!(i..i + pages(20)).contains(&p));
            free(b, p, 16, 0);
            // Put back clean (purged): both top blocks clean and free.
            // SAFETY: taken by take_dirty above and put back once.
            unsafe { b.put_back(i, o, f & !DIRTY) };
            assert_eq!(b.dirty_bytes, 0);
            assert_eq!(b.free_bytes, 2 << 20);
            b.check().unwrap();
            let (t, flags) = b.alloc(20, META).unwrap();
            assert_eq!(flags & DIRTY, 0);
            free(b, t, 20, 0);
            // A block the OS refused to purge goes back with its dirty pages.
            let (d, _) = b.alloc(16, META).unwrap();
            free(b, d, 16, DIRTY);
            let (k, o3, f3, _) = b.take_dirty().unwrap();
            // SAFETY: taken above, put back once.
            unsafe { b.put_back(k, o3, f3) };
            assert_eq!(b.dirty_bytes, 64 << 10);
            b.check().unwrap();
        });
    }

    #[test]
    fn prefers_dirty_blocks_and_purges_smallest_first() {
        with_buddy(20, 2, |b| {
            // In one top block: 64 KiB blocks at pages 0 and 16 of it, 128 KiB at 32, 256 KiB at 64.
            let (a, _) = b.alloc(16, META).unwrap();
            let (keep1, _) = b.alloc(16, META).unwrap();
            let (keep2, _) = b.alloc(17, META).unwrap();
            let (d, _) = b.alloc(18, META).unwrap();
            assert_eq!((keep1 - a, keep2 - a, d - a), (16, 32, 64));
            // Freed dirty, `a` cannot merge (its buddy is allocated), nor can `d`.
            free(b, a, 16, DIRTY);
            free(b, d, 18, DIRTY);
            b.check().unwrap();
            assert_eq!(b.dirty_bytes, (64 + 256) << 10);
            // Purging 4 KiB takes the smallest dirty block, in one call, and counts its dirty bytes.
            let mut calls = vec![];
            let cleaned = b.purge(4096, |i, o, dirty| {
                calls.push((i, o, dirty));
                Some(0)
            });
            assert_eq!(calls, vec![(a, 16, 64 << 10)]);
            assert_eq!(cleaned, 64 << 10);
            b.check().unwrap();
            // A 4 KiB request is carved from dirty memory although clean blocks are free.
            let (p, flags) = b.alloc(12, META).unwrap();
            assert_eq!(flags, DIRTY | USED);
            assert_eq!(b.taken_dirty, 1);
            assert!((d..d + pages(18)).contains(&p));
            free(b, p, 12, DIRTY);
            b.check().unwrap();
            // A refused purge leaves the block dirty and stops.
            let dirty = b.dirty_bytes;
            assert_eq!(b.purge(usize::MAX, |_, _, _| None), 0);
            assert_eq!(b.dirty_bytes, dirty);
            b.check().unwrap();
        });
    }

    #[test]
    fn freed_blocks_merge_with_clean_buddies_and_count_only_their_dirty_pages() {
        with_buddy(20, 1, |b| {
            let (x, _) = b.alloc(19, META).unwrap();
            let (y, _) = b.alloc(19, META).unwrap();
            free(b, x, 19, DIRTY);
            assert_eq!(b.dirty_bytes, 512 << 10);
            // The clean half joins the dirty one: one free top block, half of it resident.
            free(b, y, 19, 0);
            b.check().unwrap();
            assert_eq!((b.free_bytes, b.dirty_bytes), (1 << 20, 512 << 10));
            // It serves a request of the whole size; half of it is resident already.
            let (t, flags) = b.alloc(20, META).unwrap();
            assert_eq!((t, flags & DIRTY, b.taken_dirty), (0, DIRTY, 128));
            assert_eq!(b.dirty_bytes, 0);
            free(b, t, 20, 0);
            // Dirty the upper half this time: a run splits off the dirtier half, so its pages are
            // resident, and the pages it leaves keep their states.
            let (x, _) = b.alloc(19, META).unwrap();
            let (y, _) = b.alloc(19, META).unwrap();
            free(b, x, 19, 0);
            free(b, y, 19, DIRTY);
            let (r, flags) = b.alloc_run(3, MIN_ORDER).unwrap();
            assert!((y..y + pages(19)).contains(&r), "the run came from the clean half");
            assert_eq!((flags & DIRTY, b.taken_dirty), (DIRTY, 3));
            assert_eq!(b.dirty_bytes, (512 - 12) << 10);
            b.check().unwrap();
            // Purging counts what was dirty, not the block's size.
            let cleaned = b.purge(usize::MAX, |_, _, _| Some(0));
            assert_eq!(cleaned, (512 - 12) << 10);
            assert_eq!(b.dirty_bytes, 0);
            free_run(b, r);
            assert_eq!(b.dirty_bytes, 12 << 10);
            b.check().unwrap();
        });
    }

    #[test]
    fn exhausts_then_reports_none() {
        with_buddy(16, 1, |b| {
            let mut v = vec![];
            while let Some((i, _)) = b.alloc(12, META) {
                v.push(i);
            }
            assert_eq!(v.len(), 16);
            assert!(b.alloc(12, META).is_none());
            for i in v {
                free(b, i, 12, 0);
            }
            b.check().unwrap();
            assert!(b.alloc(16, META).is_some());
        });
    }

    #[test]
    fn runs_give_their_tail_back_and_resize_in_place() {
        with_buddy(18, 1, |b| {
            let total = b.free_bytes;
            // 5 pages: an 8-page block whose 3-page tail goes back.
            let (a, _) = b.alloc_run(5, MIN_ORDER).unwrap();
            assert_eq!(a, 0);
            b.check().unwrap();
            assert_eq!(b.free_bytes, total - 5 * PAGE);
            // The tail is reusable: a 1-page run lands right after the run.
            let (c, _) = b.alloc_run(1, MIN_ORDER).unwrap();
            assert_eq!(c, 5);
            assert!(!resize_run(b, a, 6)); // page 5 is taken
            free_run(b, c);
            assert!(resize_run(b, a, 20)); // claims pages 5..20 across block boundaries
            b.check().unwrap();
            assert_eq!(b.free_bytes, total - 20 * PAGE);
            assert!(resize_run(b, a, 3));
            b.check().unwrap();
            assert_eq!(b.free_bytes, total - 3 * PAGE);
            // Alignment beyond the size.
            let (d, _) = b.alloc_run(1, MIN_ORDER + 4).unwrap();
            assert_eq!(d % 16, 0);
            free_run(b, d);
            free_run(b, a);
            b.check().unwrap();
            assert_eq!(b.free_bytes, total);
            // Purged, everything merges back into the top block.
            b.purge(usize::MAX, |_, _, _| Some(0));
            assert!(b.alloc(18, META).is_some());
        });
    }

    #[test]
    fn a_run_freed_with_pages_gone_counts_only_the_rest_dirty() {
        with_buddy(18, 1, |b| {
            let total = b.free_bytes;
            let (a, _) = b.alloc_run(40, MIN_ORDER).unwrap();
            // SAFETY: a live run of 40 pages, given up once; its first 24 pages "were purged".
            unsafe { b.free_run_cleaned(a, &[(0, 24)]) };
            b.check().unwrap();
            assert_eq!(b.free_bytes, total);
            assert_eq!(b.dirty_bytes, 16 * PAGE);
            assert_eq!(b.count_dirty(a, 24), 0);
            assert_eq!(b.count_dirty(a + 24, 16), 16);
            // The purged pages were handed out: taken again, they are not known to read zero.
            let (c, flags) = b.alloc_run(40, MIN_ORDER).unwrap();
            assert_eq!(c, a);
            assert_eq!(flags & USED, USED);
            assert_eq!(b.taken_dirty, 16);
            free_run(b, c);
            // A whole prefix and none.
            let (d, _) = b.alloc_run(8, MIN_ORDER).unwrap();
            // SAFETY: as above.
            unsafe { b.free_run_cleaned(d, &[(0, 8)]) };
            let (e, _) = b.alloc_run(8, MIN_ORDER).unwrap();
            // SAFETY: as above.
            unsafe { b.free_run_cleaned(e, &[]) };
            b.check().unwrap();
            assert_eq!(b.free_bytes, total);
            // Ranges whose pages moved out are clean too, several in one run.
            b.purge(usize::MAX, |_, _, _| Some(0));
            let (f, _) = b.alloc_run(40, MIN_ORDER).unwrap();
            // SAFETY: a live run of 40 pages, given up once; pages 0-3, 10-13 and 20-27 "moved".
            unsafe { b.free_run_cleaned(f, &[(0, 4), (10, 4), (20, 8)]) };
            b.check().unwrap();
            assert_eq!(b.dirty_bytes, (40 - 16) * PAGE);
            assert_eq!(b.count_dirty(f + 10, 4) + b.count_dirty(f + 20, 8) + b.count_dirty(f, 4), 0);
            assert_eq!(b.count_dirty(f + 4, 6) + b.count_dirty(f + 14, 6) + b.count_dirty(f + 28, 12), 24);
        });
    }

    #[test]
    fn a_run_spans_dirty_free_blocks_that_lie_end_to_end() {
        with_buddy(20, 1, |b| {
            let total = b.free_bytes;
            // [0, 8) and [8, 12) freed dirty; [12, 16) still taken, so they cannot merge into a
            // 16-page block; everything from page 16 on is clean.
            let (a, _) = b.alloc(15, META).unwrap();
            let (c, _) = b.alloc(14, META).unwrap();
            let (d, _) = b.alloc(14, META).unwrap();
            assert_eq!((a, c, d), (0, 8, 12));
            free(b, a, 15, DIRTY);
            free(b, c, 14, DIRTY);
            b.check().unwrap();
            // 11 pages need a 16-page block, and no dirty one is free: the run takes the 12 dirty
            // pages instead of faulting in clean ones at page 16, and gives page 11 back.
            let (r, flags) = b.alloc_run(11, MIN_ORDER).unwrap();
            assert_eq!(r, 0);
            assert_eq!(flags & DIRTY, DIRTY);
            assert_eq!(b.taken_dirty, 11);
            assert_eq!(b.dirty_bytes, PAGE);
            b.check().unwrap();
            // A run that no span holds takes a clean block as before (a 32-page one, the run sliding
            // down over the clean 16 pages below it).
            let (s, flags) = b.alloc_run(20, MIN_ORDER).unwrap();
            assert_eq!((s, flags & DIRTY), (16, 0));
            free_run(b, s);
            free_run(b, r);
            free(b, d, 14, DIRTY);
            b.check().unwrap();
            assert_eq!(b.free_bytes, total);
        });
    }

    /// Takes the 128 pages of `b` one by one, then frees the pages of each stretch with its flags.
    fn stretches_of_free_pages(b: &mut Buddy, stretches: &[(std::ops::Range<u32>, u8)]) {
        let mut all: Vec<u32> = (0..128).map(|_| b.alloc(MIN_ORDER, META).unwrap().0).collect();
        all.sort_unstable();
        assert_eq!(all, (0..128).collect::<Vec<u32>>());
        assert!(b.alloc(MIN_ORDER, META).is_none());
        for (r, flags) in stretches {
            for i in r.clone() {
                free(b, i, MIN_ORDER, *flags);
            }
        }
        b.check().unwrap();
    }

    /// Frees the pages outside the stretches, then the runs: every page is free again.
    fn all_back(b: &mut Buddy, stretches: &[(std::ops::Range<u32>, u8)], runs: &[u32], total: usize) {
        for i in (0..128).filter(|i| !stretches.iter().any(|(r, _)| r.contains(i))) {
            free(b, i, MIN_ORDER, DIRTY);
        }
        for &r in runs {
            free_run(b, r);
        }
        b.check().unwrap();
        assert_eq!(b.free_bytes, total);
    }

    #[test]
    fn a_run_anywhere_takes_the_shortest_stretch_of_free_blocks_long_enough() {
        with_buddy(17, 4, |b| {
            let total = b.free_bytes;
            // Stretches of 25 and 30 clean pages and one of 26 whose last 6 are dirty, none holding
            // a free aligned 32-page block.
            let stretches = [(0..25, USED), (40..70, USED), (80..100, USED), (100..106, DIRTY)];
            stretches_of_free_pages(b, &stretches);
            assert!(b.alloc_run(33, MIN_ORDER).is_none(), "no free block of 64 pages, no stretch of 33");
            // Best fit: 25 pages from the stretch of 25, 26 from the stretch of 26, none of 31.
            let (r1, f1) = b.span_any(25, MIN_ORDER).unwrap();
            assert_eq!((r1, f1 & DIRTY), (0, 0));
            let (r2, f2) = b.span_any(26, MIN_ORDER).unwrap();
            assert_eq!((r2, f2 & DIRTY, b.taken_dirty), (80, DIRTY, 6));
            assert!(b.span_any(31, MIN_ORDER).is_none());
            // 20 of the 30 pages: the other 10 go back as free blocks.
            let (r3, _) = b.span_any(20, MIN_ORDER).unwrap();
            assert_eq!(r3, 40);
            b.check().unwrap();
            assert_eq!(b.free_bytes, 10 * PAGE);
            assert_eq!(b.span_any(10, MIN_ORDER).map(|r| r.0), Some(60));
            assert!(b.span_any(1, MIN_ORDER).is_none());
            all_back(b, &stretches, &[r1, r2, r3, 60], total);
        });
    }

    #[test]
    fn a_run_goes_where_the_free_pages_hold_the_most_dirty_ones() {
        with_buddy(17, 4, |b| {
            let total = b.free_bytes;
            // A clean stretch of 40 pages (an aligned 32-page block in it), one of 32 whose last 20
            // are dirty, and 28 dirty pages.
            let stretches = [(0..40, USED), (48..60, USED), (60..80, DIRTY), (96..124, DIRTY)];
            stretches_of_free_pages(b, &stretches);
            // 24 pages: wholly dirty at 96, where the clean 32-page block would fault them all in.
            let (r1, f1) = b.alloc_run(24, MIN_ORDER).unwrap();
            assert_eq!((r1, f1 & DIRTY, b.taken_dirty), (96, DIRTY, 24));
            // 30 pages: no dirty window is whole any more; the one over [50, 80) holds 20 dirty pages
            // (from the block of 64 and down over the one at 48), against none in the clean block.
            let (r2, _) = b.alloc_run(30, MIN_ORDER).unwrap();
            assert_eq!((r2, b.taken_dirty), (50, 20));
            b.check().unwrap();
            assert_eq!(b.dirty_bytes, 4 * PAGE);
            // Below `DIRTIEST_MIN` pages, the smallest block holding the run, as before: the clean
            // block at 32 rather than the 4 dirty pages at 120 (which cannot hold 5).
            let (r3, f3) = b.alloc_run(5, MIN_ORDER).unwrap();
            assert_eq!((r3, f3 & DIRTY), (32, 0));
            all_back(b, &stretches, &[r1, r2, r3], total);
        });
    }

    #[test]
    fn a_run_anywhere_starts_at_its_alignment_and_gives_the_pages_before_it_back() {
        with_buddy(17, 4, |b| {
            let total = b.free_bytes;
            // One stretch of 33 free pages from page 37 (not aligned to 16 pages).
            let stretches = [(37..70, USED)];
            stretches_of_free_pages(b, &stretches);
            // 20 pages aligned to 16 pages (64 KiB): from page 48; 37..48 and 68..70 go back.
            let (r, _) = b.span_any(20, MIN_ORDER + 4).unwrap();
            assert_eq!(r, 48);
            b.check().unwrap();
            assert_eq!(b.free_bytes, 13 * PAGE);
            // 10 pages aligned to 8 do not fit in 37..48 (from 40, 8 pages) nor in 68..70; 8 do.
            assert!(b.span_any(10, MIN_ORDER + 3).is_none());
            let (s, _) = b.span_any(8, MIN_ORDER + 3).unwrap();
            assert_eq!(s, 40);
            b.check().unwrap();
            // 37..40 and 68..70 are still free.
            all_back(b, &stretches, &[r, s], total);
        });
    }

    #[test]
    fn the_lowest_address_of_a_list_is_taken_first() {
        with_buddy(16, 1, |b| {
            let got: Vec<u32> = (0..4).map(|_| b.alloc(12, META).unwrap().0).collect();
            assert_eq!(got, [0, 1, 2, 3]);
            // Page 0 freed first, then page 2: the list's head is 2 (neither merges: 1 and 3 are
            // taken), and the next allocation takes 0 all the same.
            free(b, 0, 12, DIRTY);
            free(b, 2, 12, DIRTY);
            assert_eq!(b.alloc(12, META).unwrap().0, 0);
            assert_eq!(b.alloc(12, META).unwrap().0, 2);
            b.check().unwrap();
        });
    }

    #[test]
    fn freed_head_merged_downwards_is_not_left_marked() {
        with_buddy(14, 1, |b| {
            let (lo, _) = b.alloc(12, SLAB).unwrap();
            let (hi, _) = b.alloc(12, SLAB).unwrap();
            assert_eq!((lo, hi), (0, 1));
            free(b, lo, 12, DIRTY);
            free(b, hi, 12, DIRTY); // merges into the block at page 0
                                    // SAFETY: page 1 is inside the map.
            assert_eq!(unsafe { b.entry(1) }.kind, NONE);
            b.check().unwrap();
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
            // (head, order) of a block, or (head, 0) of a run.
            let mut live: Vec<(u32, u32)> = vec![];
            // Runs that only `span_any` found.
            let mut spans = 0;
            for step in 0..20000 {
                let r = rnd();
                if live.is_empty() || r % 3 != 0 {
                    if r % 2 == 0 {
                        let o = 12 + (rnd() % 6) as u32;
                        if let Some((i, _)) = b.alloc(o, META) {
                            live.push((i, o));
                        }
                    } else {
                        // Runs that no block holds take a span anywhere, as the heap's last resort
                        // does.
                        let (n, a) = (1 + (rnd() % 40) as u32, 12 + (rnd() % 3) as u32);
                        let got = match b.alloc_run(n, a) {
                            None => {
                                let g = b.span_any(n, a);
                                if g.is_some() {
                                    spans += 1;
                                    b.check().unwrap();
                                }
                                g
                            }
                            g => g,
                        };
                        if let Some((i, _)) = got {
                            assert_eq!(i % pages(a), 0, "a run at page {i} is not aligned to order {a}");
                            live.push((i, 0));
                        }
                    }
                } else {
                    let k = (rnd() as usize) % live.len();
                    let (i, o) = live[k];
                    if o == 0 && r % 5 == 1 {
                        resize_run(b, i, 1 + (rnd() % 60) as u32);
                        continue;
                    }
                    live.swap_remove(k);
                    if o == 0 && r % 4 == 2 {
                        // Some of its pages moved out or purged: they go back clean, the rest dirty.
                        // SAFETY: `i` heads a live run of ours, given up here; the ranges lie inside it.
                        let n = unsafe { b.run_pages(i) };
                        let (at, m) = ((rnd() % n as u64) as u32, (rnd() % 8) as u32);
                        let gone = [(at, m.min(n - at)), (0, (rnd() % 3) as u32 % (n + 1))];
                        // SAFETY: as above; the test's pages hold nothing.
                        unsafe { b.free_run_cleaned(i, &gone) };
                    } else if o == 0 {
                        free_run(b, i);
                    } else {
                        free(b, i, o, if rnd() % 2 == 0 { DIRTY } else { 0 });
                    }
                }
                if step % 500 == 0 {
                    b.check().unwrap();
                }
                if step % 997 == 0 {
                    let before = b.dirty_bytes;
                    let cleaned = b.purge(64 << 10, |_, _, _| Some(0));
                    assert!(cleaned >= (64 << 10).min(before));
                    assert_eq!(b.dirty_bytes, before - cleaned);
                }
                if step % 301 == 0 {
                    // A dirty block taken out to be purged, put back purged or (the OS refused) dirty.
                    let before = b.dirty_bytes;
                    if let Some((i, o, f, dirty)) = b.take_dirty() {
                        assert_eq!(b.dirty_bytes, before - dirty);
                        let f = if rnd() % 2 == 0 { f & !DIRTY } else { f };
                        // SAFETY: taken by take_dirty just above and put back once.
                        unsafe { b.put_back(i, o, f) };
                        let kept = if f & DIRTY != 0 { dirty } else { 0 };
                        assert_eq!(b.dirty_bytes, before - dirty + kept);
                    }
                }
            }
            for (i, o) in live.drain(..) {
                if o == 0 {
                    free_run(b, i);
                } else {
                    free(b, i, o, 0);
                }
            }
            b.check().unwrap();
            assert_eq!(b.free_bytes, 4 << 20);
            assert!(spans > 0, "no run came from span_any");
        });
    }

    #[test]
    fn runs_of_one_odd_size_pack_end_to_end() {
        // 25-page runs, one after another, in a 256-page heap: before the runs slid over earlier
        // tails, each kept 7 of every 32 pages stranded (8 runs fitted, 56 pages lost).
        with_buddy(20, 1, |b| {
            let mut heads = vec![];
            while let Some((idx, _)) = b.alloc_run(25, MIN_ORDER) {
                heads.push(idx);
                b.check().unwrap();
            }
            // The tenth would fit the 31 pages left, but a run needs a free block of 32 to start from.
            assert_eq!(heads.len(), 9, "heads {heads:?}");
            for w in heads.windows(2) {
                assert_eq!(w[1], w[0] + 25, "heads {heads:?}");
            }
            assert_eq!(b.free_bytes, (256 - 9 * 25) as usize * PAGE);
            for h in heads {
                free_run(b, h);
            }
            b.check().unwrap();
        });
    }

    #[test]
    fn holes_are_skipped_and_never_handed_out() {
        let n = 4 * pages(16) as usize;
        let mut map = vec![PageEntry { kind: NONE, order: 0, flags: 0, load: 0, prev: 0, next: 0 }; n];
        let mut bits = vec![0u64; bitmap_words(n)];
        let mut b = Buddy::empty();
        // SAFETY: the vectors are zeroed and cover four 64 KiB pieces; they outlive `b` in this test.
        // The pieces and the hole are added at the frontier, each once.
        unsafe {
            b.init(map.as_mut_ptr(), bits.as_mut_ptr(), 17);
            b.add_block(0, 16);
            b.add_hole(pages(16), pages(16));
            b.add_block(2 * pages(16), 16);
            b.add_block(3 * pages(16), 16);
        }
        b.check().unwrap();
        assert_eq!(b.hole_pages, pages(16));
        assert_eq!(b.free_bytes, 3 << 16);
        // The pieces above the hole merged into one 128 KiB block; the one below stays alone.
        let (big, _) = b.alloc(17, META).unwrap();
        assert_eq!(big, 2 * pages(16));
        let (small, _) = b.alloc(16, META).unwrap();
        assert_eq!(small, 0);
        assert!(b.alloc(MIN_ORDER, META).is_none(), "a page of the hole was handed out");
        b.check().unwrap();
        free(&mut b, small, 16, 0);
        free(&mut b, big, 17, 0);
        b.check().unwrap();
        drop(map);
        drop(bits);
    }

    #[test]
    fn only_memory_never_handed_out_is_known_zero() {
        with_buddy(16, 2, |b| {
            // Fresh memory: neither dirty nor used.
            let (a, flags) = b.alloc(15, META).unwrap();
            assert_eq!(flags, 0);
            // Freed (dirty), then purged: clean but used, also once merged with its fresh buddy.
            free(b, a, 15, DIRTY);
            assert_eq!(b.purge(usize::MAX, |_, _, _| Some(0)), 32 << 10);
            b.check().unwrap();
            let (x, fx) = b.alloc(16, META).unwrap();
            let (y, fy) = b.alloc(16, META).unwrap();
            let used = if x == a & !(pages(16) - 1) { (fx, fy) } else { (fy, fx) };
            assert_eq!(used, (USED, 0), "the block holding the purged one is used, the other fresh");
            // Halves of a used block are used.
            free(b, x, 16, USED);
            free(b, y, 16, USED);
            let (_, f) = b.alloc(15, META).unwrap();
            assert_eq!(f, USED);
            b.check().unwrap();
        });
    }
}
