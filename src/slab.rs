//! A slab: one 64 KiB buddy block holding its header, a bitmap of free slots, and the slots of one
//! size class. Single-owner: only the owning cache's thread touches the owner line and the bitmap;
//! other threads only push onto `remote`. The owner is an opaque [`OwnerId`]: this layer never looks
//! inside the cache that owns it.
//!
//! ```text
//! 0        64          128              first                                     64 KiB
//! | owner  | shared    | bitmap (u64s)  | slot 0 | slot 1 | ...        | slot n-1 |  (slack) |
//! ```

use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::os;
use crate::size_class::{slot_index, GEOMETRY, SLAB_HEADER, SLAB_SIZE};

/// `remote` bit: the slab is on (or being pushed onto) its owner's remote queue.
pub const QUEUED: usize = 1;

/// Where a freed slot carries the *freed mark*: its second word (every slot has at least 16 bytes and
/// is 16-aligned; the first word is the remote-free link).
pub const MARK_OFFSET: usize = 8;

/// The freed mark (glibc's tcache key, in spirit): a per-process random value written into a slot's
/// second word when it is freed and cleared when it is handed out again. A free that finds the mark
/// already there looks for the slot among the free ones (stack, word, bitmap, remote list) and aborts
/// if it is one: a double free can never hand a slot out twice. User data that happens to equal the
/// mark costs only that look-up. Never zero.
static FREED_MARK: AtomicU64 = AtomicU64::new(0x5bd1_e995_9e37_79b9);

/// The freed mark (see [`FREED_MARK`]).
#[inline(always)]
pub fn freed_mark() -> u64 {
    FREED_MARK.load(Ordering::Relaxed)
}

/// Sets the freed mark from `seed` (random bytes), once, before any slot is freed.
pub fn set_freed_mark(seed: u64) {
    FREED_MARK.store(seed | 1, Ordering::Relaxed);
}

/// The cache that owns a slab, as an opaque address (compared, never dereferenced here).
pub type OwnerId = *mut u8;

/// Where a slab is among its owner's lists.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlabState {
    /// Its row's current slab (the one allocations take words from).
    Current = 1,
    /// On its row's partial list: some slots free.
    Partial = 2,
    /// On its row's full list: no free bit when it was filed there.
    Full = 3,
    /// The owner's one empty spare, on no list.
    Spare = 4,
}

/// Owner-side header fields (first cache line).
///
/// Invariants:
/// - bit `i` of word `w` of the bitmap is set iff slot `64*w + i` exists (`< nslots`), is free, is
///   not on the remote list, and word `w` is not checked out by the owner's class row (see
///   [`crate::cache::ClassState`]: a checked-out word reads 0 here and lives in the row);
/// - every bitmap word below `hint` is zero;
/// - `free_count` is the number of set bits of the bitmap (checked-out bits not included);
/// - `state` says where the slab is among the owner's lists (see [`SlabState`]); `next`/`prev` link
///   the partial or full list of row `row` that holds it (null otherwise);
/// - `size`, `first`, `nslots`, `nwords`, `recip`, `class` are the class's [`GEOMETRY`], fixed at
///   [`Slab::init`]; so is `owner`.
#[repr(C, align(64))]
pub struct Slab {
    pub hint: u32,
    pub free_count: u32,
    pub nslots: u32,
    pub size: u32,
    pub first: u32,
    pub recip: u32,
    pub nwords: u32,
    pub class: u8,
    pub state: SlabState,
    /// Where the owner keeps the row this slab belongs to (an offset the owner defines; opaque here).
    pub row: u16,
    /// The owning cache; fixed for the slab's lifetime (caches are recycled whole, never split).
    pub owner: OwnerId,
    pub next: *mut Slab,
    pub prev: *mut Slab,
    /// Remote-free state on its own cache line.
    pub shared: Shared,
}

/// The line other threads write.
///
/// Invariants: `remote & !QUEUED` heads a singly linked list (link in each slot's first word) of slots
/// freed by other threads and not yet applied to the bitmap; `QUEUED` is set iff the slab is on, or
/// being pushed onto, its owner's remote queue, and only the queue's consumer clears it; while it is
/// set the slab is never given back to the heap.
#[repr(C, align(64))]
pub struct Shared {
    pub remote: AtomicUsize,
    pub remote_next: AtomicPtr<Slab>,
}

const _: () = assert!(core::mem::size_of::<Slab>() == SLAB_HEADER);

impl Slab {
    /// The bitmap: `nwords` words right after the header.
    ///
    /// # Safety
    /// - `this` is a live slab (inside its 64 KiB block). The words may be read and written only by
    ///   the owner's thread (or a thread that holds the owner cache exclusively).
    #[inline(always)]
    pub unsafe fn bits(this: *mut Slab) -> *mut u64 {
        // SAFETY: the bitmap follows the 128-byte header inside the same slab block (contract).
        unsafe { (this as *mut u8).add(SLAB_HEADER) as *mut u64 }
    }

    /// Lays out a fresh slab of `class` in the block at `this`.
    ///
    /// # Safety
    /// - `this` is a 64 KiB-aligned, writable block of `SLAB_SIZE` bytes owned by the caller.
    pub unsafe fn init(this: *mut Slab, class: usize, row: u16, owner: OwnerId) {
        let g = GEOMETRY[class];
        // SAFETY: the block is ours and large enough for header and bitmap (Geometry invariants).
        unsafe {
            this.write(Slab {
                hint: 0,
                free_count: g.nslots,
                nslots: g.nslots,
                size: g.size,
                first: g.first,
                recip: g.recip,
                nwords: g.nwords,
                class: class as u8,
                state: SlabState::Current,
                row,
                owner,
                next: core::ptr::null_mut(),
                prev: core::ptr::null_mut(),
                shared: Shared { remote: AtomicUsize::new(0), remote_next: AtomicPtr::new(core::ptr::null_mut()) },
            });
            let bits = Slab::bits(this);
            let full = (g.nslots / 64) as usize;
            for w in 0..g.nwords as usize {
                let v = if w < full {
                    u64::MAX
                } else if w == full && g.nslots % 64 != 0 {
                    (1u64 << (g.nslots % 64)) - 1
                } else {
                    0
                };
                bits.add(w).write(v);
            }
        }
    }

    /// The slot index of `p`, aborting with a message if `p` is not the start of a slot.
    ///
    /// # Safety
    /// - `this` is a live slab and `p` lies inside its block.
    #[inline(always)]
    pub unsafe fn index_of(this: *mut Slab, p: *mut u8) -> usize {
        // SAFETY: the geometry fields of a live slab are immutable after init; they are read through
        // the raw pointer, without a reference to the header, whose owner fields the owner may be
        // writing meanwhile (this runs on remote frees too).
        let (first, recip, size, nslots) =
            unsafe { ((*this).first as usize, (*this).recip, (*this).size as usize, (*this).nslots as usize) };
        let off = (p as usize).wrapping_sub(this as usize + first);
        let idx = slot_index(off & (SLAB_SIZE - 1), recip);
        if off >= SLAB_SIZE || idx * size != off || idx >= nslots {
            os::invalid_pointer(p, "free(): pointer is not the start of a block");
        }
        idx
    }

    /// Pushes `p` onto the remote-free list (any thread). Returns `true` when the caller set `QUEUED`
    /// and must therefore push the slab onto its owner's queue.
    ///
    /// # Safety
    /// - `this` is a live slab and `p` a live slot of it that the caller owns and gives up.
    #[inline]
    pub unsafe fn push_remote(this: *mut Slab, p: *mut u8) -> bool {
        // SAFETY: the slab header is live; `p` is a dead slot of at least 16 bytes we may write.
        let remote = unsafe { &(*this).shared.remote };
        let mut old = remote.load(Ordering::Relaxed);
        loop {
            // SAFETY: as above.
            unsafe { (p as *mut usize).write(old & !QUEUED) };
            match remote.compare_exchange_weak(old, p as usize | QUEUED, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return old & QUEUED == 0,
                Err(o) => old = o,
            }
        }
    }

    /// Checks the slab's own invariants: the geometry of its class, the bitmap (no bit beyond
    /// `nslots`, no set word below `hint`), and `free_count` against the bitmap. `out_words` are the
    /// bits the owner holds outside the bitmap (a checked-out word), which must not be set in it.
    /// Returns the number of free slots it holds (bitmap and `out_words`).
    ///
    /// # Safety
    /// - `this` is a live slab owned by the calling thread's cache (or held exclusively by it).
    pub unsafe fn check(this: *mut Slab, out_words: &[(u32, u64)]) -> Result<u32, &'static str> {
        // SAFETY: owner-only header fields and bitmap of a live slab (contract).
        let s = unsafe { &*this };
        let g = GEOMETRY.get(s.class as usize).ok_or("slab class out of range")?;
        if (s.size, s.first, s.nslots, s.nwords, s.recip) != (g.size, g.first, g.nslots, g.nwords, g.recip) {
            return Err("slab header does not match its class's geometry");
        }
        if this as usize & (SLAB_SIZE - 1) != 0 {
            return Err("slab not aligned to its size");
        }
        let mut set = 0;
        for w in 0..s.nwords {
            // SAFETY: w < nwords.
            let word = unsafe { *Slab::bits(this).add(w as usize) };
            let valid = if (w + 1) * 64 <= s.nslots {
                u64::MAX
            } else if w * 64 < s.nslots {
                (1u64 << (s.nslots - w * 64)) - 1
            } else {
                0
            };
            if word & !valid != 0 {
                return Err("bitmap bit set beyond the last slot");
            }
            if w < s.hint && word != 0 {
                return Err("bitmap word below the search hint is not zero");
            }
            if let Some(&(_, out)) = out_words.iter().find(|&&(i, _)| i == w) {
                if word != 0 {
                    return Err("a checked-out word is not zero in the bitmap");
                }
                if out & !valid != 0 {
                    return Err("checked-out word has a bit beyond the last slot");
                }
                set += out.count_ones();
            }
            set += word.count_ones();
        }
        let out: u32 = out_words.iter().map(|&(_, w)| w.count_ones()).sum();
        if s.free_count + out != set {
            return Err("free_count does not match the bitmap");
        }
        if s.free_count > s.nslots {
            return Err("free_count beyond nslots");
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64 KiB-aligned block for one slab (from the system allocator: unit tests do not install
    /// edgepool).
    fn block() -> (*mut Slab, std::alloc::Layout) {
        let layout = std::alloc::Layout::from_size_align(SLAB_SIZE, SLAB_SIZE).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        assert!(!p.is_null());
        (p.cast(), layout)
    }

    #[test]
    fn init_lays_out_every_class_and_check_accepts_it() {
        let (s, layout) = block();
        for (class, g) in GEOMETRY.iter().enumerate() {
            // SAFETY: a fresh aligned block of SLAB_SIZE bytes, ours.
            unsafe {
                Slab::init(s, class, class as u16, 0x40 as OwnerId);
                assert_eq!(Slab::check(s, &[]), Ok(g.nslots));
                assert_eq!((*s).state, SlabState::Current);
                // Every slot's index round-trips through index_of.
                for i in [0, 1, g.nslots as usize - 1] {
                    let p = (s as *mut u8).add(g.first as usize + i * g.size as usize);
                    assert_eq!(Slab::index_of(s, p), i);
                }
            }
        }
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(s.cast(), layout) };
    }

    #[test]
    fn check_catches_a_wrong_count_and_a_stray_bit() {
        let (s, layout) = block();
        // SAFETY: a fresh aligned block, ours; the writes stay inside header and bitmap.
        unsafe {
            Slab::init(s, 3, 3, core::ptr::null_mut());
            // Take slot 0 without counting it.
            *Slab::bits(s) &= !1;
            assert!(Slab::check(s, &[]).is_err());
            (*s).free_count -= 1;
            assert!(Slab::check(s, &[]).is_ok());
            // A checked-out word must read zero in the bitmap.
            let w = *Slab::bits(s);
            assert!(Slab::check(s, &[(0, w)]).is_err());
            *Slab::bits(s) = 0;
            (*s).free_count -= w.count_ones();
            assert!(Slab::check(s, &[(0, w)]).is_ok());
            // A bit beyond the last slot.
            let nw = (*s).nwords as usize;
            *Slab::bits(s).add(nw - 1) |= 1 << 63;
            assert!(Slab::check(s, &[(0, w)]).is_err());
            std::alloc::dealloc(s.cast(), layout);
        }
    }

    #[test]
    fn remote_pushes_queue_the_slab_once() {
        let (s, layout) = block();
        // SAFETY: a fresh slab; the slots pushed are slots of it that nobody uses.
        unsafe {
            Slab::init(s, 0, 0, core::ptr::null_mut());
            let first = (s as *mut u8).add((*s).first as usize);
            assert!(Slab::push_remote(s, first));
            assert!(!Slab::push_remote(s, first.add(16)));
            let head = (*s).shared.remote.load(Ordering::Relaxed);
            assert_eq!(head & QUEUED, QUEUED);
            assert_eq!(head & !QUEUED, first.add(16) as usize);
            assert_eq!((first.add(16) as *const usize).read(), first as usize);
            std::alloc::dealloc(s.cast(), layout);
        }
    }
}
