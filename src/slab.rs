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
/// - bit `i` of word `w` of the bitmap is set iff slot `64*w + i` exists (`< nslots`), is free, is
///   not on the remote list, and word `w` is not checked out by the owner's class row (see
///   [`crate::cache::ClassState`]: a checked-out word reads 0 here and lives in the row);
/// - every bitmap word below `hint` is zero;
/// - `free_count` is the number of set bits of the bitmap (checked-out bits not included);
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

}

/// Reports a pointer that cannot be freed and aborts.
#[cold]
#[inline(never)]
pub fn invalid_pointer(p: *mut u8, what: &[u8]) -> ! {
    let mut m = os::MsgBuf::new();
    m.str(core::str::from_utf8(what).unwrap_or("invalid pointer")).str(" (pointer ").hex(p as usize).str(")");
    os::fatal(m.as_bytes())
}
