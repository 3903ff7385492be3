//! A slab: one 64 KiB buddy block holding its header, a bitmap of free slots, and the slots of one
//! size class. Single-owner: only the owning cache's thread touches the owner line and the bitmap;
//! other threads only push onto `remote`.
//!
//! ```text
//! 0        64          128              first                                     64 KiB
//! | owner  | shared    | bitmap (u64s)  | slot 0 | slot 1 | ...        | slot n-1 |  (slack) |
//! ```

use core::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use crate::cache::Cache;
use crate::os;
use crate::size_class::{slot_index, GEOMETRY, SLAB_HEADER, SLAB_SIZE};

/// `remote` bit: the slab is on (or being pushed onto) its owner's remote queue.
pub const QUEUED: usize = 1;

/// Slab list states.
pub const CURRENT: u8 = 1;
pub const PARTIAL: u8 = 2;
pub const FULL: u8 = 3;
pub const SPARE: u8 = 4;

/// Owner-side header fields (first cache line).
///
/// Invariants:
/// - bit `i` of word `w` of the bitmap is set iff slot `64*w + i` exists (`< nslots`) and is free
///   and not on the remote list;
/// - every bitmap word below `hint` is zero;
/// - `free_count` is the number of set bits;
/// - `state` says which of the owner's lists holds the slab: `CURRENT` (a class's current slab),
///   `PARTIAL` (on the class's partial list, via `next`/`prev`), `FULL` (on no list: no set bit when it
///   was detached), `SPARE` (the owner's one empty spare).
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
    pub state: u8,
    /// Index of the owner's class-state row the slab belongs to (phase × class).
    pub row: u16,
    /// The owning cache; fixed for the slab's lifetime (caches are recycled whole, never split).
    pub owner: *mut Cache,
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
    /// The bitmap.
    #[inline(always)]
    pub fn bits(this: *mut Slab) -> *mut u64 {
        // SAFETY: the bitmap follows the 128-byte header inside the same slab block (or, for the
        // static empty slab, inside its wrapper struct).
        unsafe { (this as *mut u8).add(SLAB_HEADER) as *mut u64 }
    }

    /// Lays out a fresh slab of `class` in the block at `this`.
    ///
    /// # Safety
    /// - `this` is a 64 KiB-aligned, writable block of `SLAB_SIZE` bytes owned by the caller.
    pub unsafe fn init(this: *mut Slab, class: usize, row: u16, owner: *mut Cache) {
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
                state: CURRENT,
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

    /// Takes a free slot, scanning forward from `hint`. Returns null when no bit is set.
    ///
    /// # Safety
    /// - `this` is a live slab owned by the calling thread's cache (or the static empty slab).
    #[inline]
    pub unsafe fn take(this: *mut Slab) -> *mut u8 {
        // SAFETY: owner-only fields of a live slab; word indices stay below nwords.
        unsafe {
            let s = &mut *this;
            let bits = Slab::bits(this);
            let mut h = s.hint as usize;
            while h < s.nwords as usize {
                let w = *bits.add(h);
                if w != 0 {
                    *bits.add(h) = w & (w - 1);
                    s.hint = h as u32;
                    s.free_count -= 1;
                    let idx = h * 64 + w.trailing_zeros() as usize;
                    return (this as *mut u8).add(s.first as usize + idx * s.size as usize);
                }
                h += 1;
            }
            s.hint = h as u32;
            core::ptr::null_mut()
        }
    }

    /// The slot index of `p`, aborting with a message if `p` is not the start of a slot.
    ///
    /// # Safety
    /// - `this` is a live slab and `p` lies inside its block.
    #[inline(always)]
    pub unsafe fn index_of(this: *mut Slab, p: *mut u8) -> usize {
        // SAFETY: header fields of a live slab are immutable after init.
        let s = unsafe { &*this };
        let off = (p as usize).wrapping_sub(this as usize + s.first as usize);
        let idx = slot_index(off & (SLAB_SIZE - 1), s.recip);
        if off >= SLAB_SIZE || idx * s.size as usize != off || idx >= s.nslots as usize {
            invalid_pointer(p, b"free(): pointer is not the start of a block");
        }
        idx
    }

    /// Marks slot `idx` free in the bitmap (owner only). Aborts on a double free.
    ///
    /// # Safety
    /// - `this` is a live slab owned by the calling thread's cache; `idx < nslots`.
    #[inline(always)]
    pub unsafe fn release_slot(this: *mut Slab, idx: usize, p: *mut u8) {
        // SAFETY: owner-only access; idx < nslots <= 64 * nwords.
        unsafe {
            let s = &mut *this;
            let w = idx >> 6;
            let bit = 1u64 << (idx & 63);
            let word = Slab::bits(this).add(w);
            if *word & bit != 0 {
                invalid_pointer(p, b"free(): double free detected");
            }
            *word |= bit;
            if (w as u32) < s.hint {
                s.hint = w as u32;
            }
            s.free_count += 1;
        }
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

    /// Applies the remote list `list` (a chain of slots) to the bitmap. Returns the slots applied.
    ///
    /// # Safety
    /// - owner only; `list` was taken from this slab's `remote` with acquire ordering.
    pub unsafe fn apply_remote(this: *mut Slab, mut list: usize) -> u32 {
        let mut n = 0;
        while list != 0 {
            let p = list as *mut u8;
            // SAFETY: every list member is a dead slot of this slab; its first word links the next.
            unsafe {
                list = (p as *const usize).read();
                let idx = Slab::index_of(this, p);
                Slab::release_slot(this, idx, p);
            }
            n += 1;
        }
        n
    }

    /// Takes the remote list while keeping `QUEUED` (owner only, outside the queue). Returns the slots
    /// applied.
    ///
    /// # Safety
    /// - owner only.
    pub unsafe fn collect_remote(this: *mut Slab) -> u32 {
        // SAFETY: the header is live.
        let remote = unsafe { &(*this).shared.remote };
        if remote.load(Ordering::Relaxed) & !QUEUED == 0 {
            return 0;
        }
        let old = remote.fetch_and(QUEUED, Ordering::Acquire);
        // SAFETY: owner only; list taken with acquire.
        unsafe { Slab::apply_remote(this, old & !QUEUED) }
    }
}

/// Reports a pointer that cannot be freed and aborts.
#[cold]
#[inline(never)]
pub fn invalid_pointer(p: *mut u8, what: &[u8]) -> ! {
    let mut m = os::MsgBuf::new();
    m.str(core::str::from_utf8(what).unwrap_or("invalid pointer")).str(" (pointer ").hex(p as usize).str(")");
    os::fatal(m.as_bytes())
}
