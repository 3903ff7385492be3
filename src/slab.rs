//! A slab: one 64 KiB buddy block holding the slots of one size class, and, out of band, its header
//! and bitmaps (one `SLAB_META` entry of the heap's slab table, beside the page map: no overflow of a
//! slot reaches them). Single-owner: only the owning cache's thread touches the owner line and the
//! bitmap of free slots; other threads only set bits of the *remote bitmap* (the slots they freed)
//! and the `remote` summary. The owner is an opaque [`OwnerId`]: this layer never looks inside the
//! cache that owns it. A `*mut Slab` is the address of the header.
//!
//! Remote frees are bits, not a list: taking them back costs the owner one atomic swap per word of
//! 64 slots and never reads the freed slots, which another core wrote last (a list linked through
//! the slots made the owner walk them, one cache miss after another: 14 % of a producer/consumer
//! ring's time, `benches/suite/rptest.c`).
//!
//! ```text
//! header entry:  0        64          128                 128 + 8 MAX_WORDS        SLAB_META (1024)
//!                | owner  | shared    | free bitmap (u64s) | remote bitmap (atomic u64s) |
//! data block:    0                                                         64 KiB
//!                | slot 0 | slot 1 | ...                      | slot n-1 | (slack) |
//! ```

use core::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use crate::os;
use crate::size_class::{is_slot_start, slot_index, GEOMETRY, MAX_WORDS, SLAB_HEADER, SLAB_META, SLAB_SIZE};

/// `remote` bit: the slab is on (or being pushed onto) its owner's remote queue.
pub const QUEUED: usize = 1;
/// `remote` bit: the owner is taking remote words back (from setting it until its swaps of the
/// words are done); no other thread starts purging the slab's pages meanwhile.
pub const COLLECTING: usize = 1 << 62;
/// `remote` bit: a thread other than the owner is purging pages of the slab on which every slot is a
/// remote free not taken back yet (`cache::remote`, idle owners); the owner waits for it to clear
/// before it takes remote words back, so that no slot on those pages is handed out while they are
/// purged.
pub const PURGING: usize = 1 << 63;
/// The summary bits of `remote`: one per remote word ([`summary_bit`]).
pub const SUMMARY: usize = !(QUEUED | COLLECTING | PURGING);
const _: () = assert!(summary_bit(MAX_WORDS - 1) & !SUMMARY == 0);

/// The bits of bitmap word `w` that stand for slots of a slab of `nslots` slots.
#[inline]
pub const fn valid_bits(nslots: u32, w: usize) -> u64 {
    let lo = w * 64;
    let n = nslots as usize;
    if lo + 64 <= n {
        u64::MAX
    } else if lo < n {
        (1u64 << (n - lo)) - 1
    } else {
        0
    }
}

/// `remote` bit of remote-bitmap word `w`: the word may have bits the owner has not taken yet.
#[inline(always)]
pub const fn summary_bit(w: usize) -> usize {
    2 << w
}

/// Where a freed slot carries the *freed mark*: its second word (every slot has at least 16 bytes and
/// is 16-aligned).
pub const MARK_OFFSET: usize = 8;

/// The freed mark (glibc's tcache key, in spirit): a per-process random value written into a slot's
/// second word when it is freed and cleared when it is handed out again. A free that finds the mark
/// already there looks for the slot among the free ones (stack, word, bitmap, remote bitmap) and aborts
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
///   not set in the remote bitmap, and word `w` is not checked out by the owner's class row (see
///   [`crate::cache::ClassState`]: a checked-out word reads 0 here and lives in the row);
/// - every bitmap word below `hint` is zero;
/// - `free_count` is the number of set bits of the bitmap (checked-out bits not included);
/// - `state` says where the slab is among the owner's lists (see [`SlabState`]); `next`/`prev` link
///   the partial or full list of row `row` that holds it (null otherwise);
/// - `size`, `nslots`, `nwords`, `recip`, `class` are the class's [`GEOMETRY`], fixed at
///   [`Slab::init`]; so are `owner` and `data`, the 64 KiB-aligned block holding the slots;
/// - in every entry of the slab table, `owner` is null unless the entry's block is a slab that its
///   cache holds (in any state, the spare too): it is written at [`Slab::init`] and cleared by
///   [`Slab::disown`] before the block goes back to the heap, and the table starts zeroed. So a free
///   that finds its own cache in the `owner` of its pointer's entry knows the pointer is in one of
///   its slabs without asking the page map (`global::free_raw`).
#[repr(C, align(64))]
pub struct Slab {
    pub hint: u32,
    pub free_count: u32,
    pub nslots: u32,
    pub size: u32,
    pub recip: u32,
    pub nwords: u32,
    pub class: u8,
    pub state: SlabState,
    /// Where the owner keeps the row this slab belongs to (an offset the owner defines; opaque here).
    pub row: u16,
    /// The owning cache; fixed for the slab's lifetime (caches are recycled whole, never split), null
    /// in an entry whose block is no slab (see the invariants).
    pub owner: OwnerId,
    pub next: *mut Slab,
    pub prev: *mut Slab,
    /// The slab's block: slot `i` starts at `data + i * size`.
    pub data: *mut u8,
    /// Remote-free state on its own cache line.
    pub shared: Shared,
}

/// The line other threads write.
///
/// Invariants: bit `i` of remote-bitmap word `w` ([`Slab::remote_bits`]) is set iff another thread
/// freed slot `64 w + i` and the owner has not taken it back into its bitmap yet; whoever turns a
/// remote word from zero to non-zero then sets that word's [`summary_bit`] in `remote` (so every
/// set remote bit is covered by a summary bit, or is about to be); `QUEUED` is set iff the slab is
/// on, or being pushed onto, its owner's remote queue (or held off it for a moment by the scan for
/// idle caches, which puts it back), and only the queue's consumer clears it; while
/// `remote` is not zero the slab is never given back to the heap (nor while a remote bit is set: such
/// a slot is not free in the owner's count). `COLLECTING` and `PURGING` exclude each other: only the
/// owner sets `COLLECTING`, only a thread that holds the slab off its owner's queue with `QUEUED` set
/// sets `PURGING` (so the slab stays alive while it is set), and remote words are swapped back only
/// under `COLLECTING`.
#[repr(C, align(64))]
pub struct Shared {
    pub remote: AtomicUsize,
    pub remote_next: AtomicPtr<Slab>,
}

const _: () = assert!(core::mem::size_of::<Slab>() == SLAB_HEADER && SLAB_HEADER <= SLAB_META);

/// Aborts on a pointer inside a slab that does not start a slot. Out of line with its message, so
/// that the free path's checks branch here without setting the message's arguments up first (the
/// compiler hoisted them into the path: two instructions on every free).
#[cold]
#[inline(never)]
fn not_a_slot(p: *mut u8) -> ! {
    os::invalid_pointer(p, "free(): pointer is not the start of a block")
}

/// [`not_a_slot`] for a free path that must end in a tail call: a function that returns, as far as
/// its callers know (a call of one that never returns keeps the caller's stack frame, for the
/// stack's alignment at the call), and that cannot unwind (`extern "C"`).
#[cold]
#[inline(never)]
pub extern "C" fn reject(p: *mut u8) {
    not_a_slot(p)
}

impl Slab {
    /// The bitmap: `nwords` words right after the header.
    ///
    /// # Safety
    /// - `this` is a live slab (its header entry). The words may be read and written only by the
    ///   owner's thread (or a thread that holds the owner cache exclusively).
    #[inline(always)]
    pub unsafe fn bits(this: *mut Slab) -> *mut u64 {
        // SAFETY: the bitmap follows the 128-byte header inside the same header entry (contract).
        unsafe { (this as *mut u8).add(SLAB_HEADER) as *mut u64 }
    }

    /// Lays out a fresh slab of `class` whose slots are the block at `data`, with its header and
    /// bitmap at `this`.
    ///
    /// # Safety
    /// - `this` is a 64-aligned, writable header entry of `SLAB_META` bytes owned by the caller;
    /// - `data` is a 64 KiB-aligned, writable block of `SLAB_SIZE` bytes owned by the caller.
    pub unsafe fn init(this: *mut Slab, data: *mut u8, class: usize, row: u16, owner: OwnerId) {
        let g = GEOMETRY[class];
        // SAFETY: the entry is ours and large enough for header and bitmap (Geometry invariants).
        unsafe {
            this.write(Slab {
                hint: 0,
                free_count: g.nslots,
                nslots: g.nslots,
                size: g.size,
                recip: g.recip,
                nwords: g.nwords,
                class: class as u8,
                state: SlabState::Current,
                row,
                owner,
                next: core::ptr::null_mut(),
                prev: core::ptr::null_mut(),
                data,
                shared: Shared { remote: AtomicUsize::new(0), remote_next: AtomicPtr::new(core::ptr::null_mut()) },
            });
            let bits = Slab::bits(this);
            let remote = Slab::remote_bits(this);
            for w in 0..g.nwords as usize {
                bits.add(w).write(valid_bits(g.nslots, w));
                (*remote.add(w)).store(0, Ordering::Relaxed);
            }
        }
    }

    /// Marks the entry as no slab's, before its block goes back to the heap (see the invariants).
    ///
    /// # Safety
    /// - `this` is a slab that the caller's cache holds and gives up: nothing uses its slots any more.
    #[inline]
    pub unsafe fn disown(this: *mut Slab) {
        // SAFETY: the caller's own slab header (contract); other threads read `owner` only of a slab
        // they hold a slot of, and it has none.
        unsafe { (*this).owner = core::ptr::null_mut() }
    }

    /// The slot index of `p`, aborting with a message if `p` is not the start of a slot.
    ///
    /// # Safety
    /// - `this` is a live slab and `p` lies inside its block.
    #[inline(always)]
    pub unsafe fn index_of(this: *mut Slab, p: *mut u8) -> usize {
        // SAFETY: forwarded contract.
        match unsafe { Slab::slot_of(this, p as usize) } {
            Some(idx) => idx,
            None => not_a_slot(p),
        }
    }

    /// The slot index of address `p`, or `None` if `p` is not the start of one of the slab's slots.
    /// Two fields of the header are read: `p`'s offset in the block comes from its low bits (the
    /// block is aligned to its size).
    ///
    /// # Safety
    /// - `this` is a live slab and `p` lies inside its block (`data .. data + SLAB_SIZE`).
    #[inline(always)]
    pub unsafe fn slot_of(this: *mut Slab, p: usize) -> Option<usize> {
        // SAFETY: the geometry fields of a live slab are immutable after init; they are read through
        // the raw pointer, without a reference to the header, whose owner fields the owner may be
        // writing meanwhile (this runs on remote frees too).
        let (data, recip, nslots) = unsafe { ((*this).data as usize, (*this).recip, (*this).nslots as usize) };
        debug_assert_eq!(p & !(SLAB_SIZE - 1), data, "{p:#x} is outside the slab's block");
        let off = p & (SLAB_SIZE - 1);
        let idx = slot_index(off, recip);
        (is_slot_start(off, recip) && idx < nslots).then_some(idx)
    }

    /// The remote bitmap: `nwords` atomic words after the free bitmap's room (`MAX_WORDS` words).
    ///
    /// # Safety
    /// - `this` is a live slab (its header entry); any thread may use the words.
    #[inline(always)]
    pub unsafe fn remote_bits(this: *mut Slab) -> *const AtomicU64 {
        // SAFETY: inside the same header entry (SLAB_HEADER + 16 MAX_WORDS <= SLAB_META), 8-aligned.
        unsafe { (this as *mut u8).add(SLAB_HEADER + 8 * MAX_WORDS) as *const AtomicU64 }
    }

    /// Marks slot `idx` freed by a thread that does not own the slab (any thread). `None` if its bit
    /// was set already: the slot was freed twice, and nothing changed. `Some(true)` when the caller
    /// set `QUEUED` and must therefore push the slab onto its owner's queue.
    ///
    /// # Safety
    /// - `this` is a live slab, `idx < nslots`, and the caller gives the slot up.
    #[inline]
    pub unsafe fn push_remote(this: *mut Slab, idx: usize) -> Option<bool> {
        let (w, bit) = (idx >> 6, 1u64 << (idx & 63));
        // SAFETY: w < nwords <= MAX_WORDS (contract); the words and `remote` are atomic.
        unsafe {
            // Release: the program's writes to the slot happen before the owner hands it out again.
            let old = (*Slab::remote_bits(this).add(w)).fetch_or(bit, Ordering::Release);
            if old & bit != 0 {
                return None;
            }
            if old != 0 {
                // Whoever made the word non-zero covers it with its summary bit.
                return Some(false);
            }
            let s = (*this).shared.remote.fetch_or(summary_bit(w) | QUEUED, Ordering::Release);
            Some(s & QUEUED == 0)
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
        if (s.size, s.nslots, s.nwords, s.recip) != (g.size, g.nslots, g.nwords, g.recip) {
            return Err("slab header does not match its class's geometry");
        }
        if s.data as usize & (SLAB_SIZE - 1) != 0 || this as usize & 63 != 0 {
            return Err("slab block not aligned to its size, or header not to a cache line");
        }
        let mut set = 0;
        for w in 0..s.nwords {
            // SAFETY: w < nwords.
            let word = unsafe { *Slab::bits(this).add(w as usize) };
            let valid = valid_bits(s.nslots, w as usize);
            if word & !valid != 0 {
                return Err("bitmap bit set beyond the last slot");
            }
            // SAFETY: w < nwords; atomic words.
            let remote = unsafe { (*Slab::remote_bits(this).add(w as usize)).load(Ordering::Acquire) };
            if remote & !valid != 0 {
                return Err("remote bitmap bit set beyond the last slot");
            }
            if remote & word != 0 {
                return Err("a slot is both free and freed by another thread");
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

    /// A header entry and a 64 KiB-aligned block for one slab (from the system allocator: unit tests
    /// do not install edgepool), freed on drop.
    struct Fake {
        s: *mut Slab,
        data: *mut u8,
    }

    const HDR: std::alloc::Layout = match std::alloc::Layout::from_size_align(SLAB_META, 64) {
        Ok(l) => l,
        Err(_) => panic!(),
    };
    const DATA: std::alloc::Layout = match std::alloc::Layout::from_size_align(SLAB_SIZE, SLAB_SIZE) {
        Ok(l) => l,
        Err(_) => panic!(),
    };

    fn block() -> Fake {
        // SAFETY: non-zero sizes.
        let (s, data) = unsafe { (std::alloc::alloc(HDR), std::alloc::alloc(DATA)) };
        assert!(!s.is_null() && !data.is_null());
        Fake { s: s.cast(), data }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            // SAFETY: allocated in `block` with these layouts.
            unsafe {
                std::alloc::dealloc(self.s.cast(), HDR);
                std::alloc::dealloc(self.data, DATA);
            }
        }
    }

    #[test]
    fn init_lays_out_every_class_and_check_accepts_it() {
        let f = block();
        let s = f.s;
        for (class, g) in GEOMETRY.iter().enumerate() {
            // SAFETY: a fresh header entry and aligned block of SLAB_SIZE bytes, ours.
            unsafe {
                Slab::init(s, f.data, class, class as u16, 0x40 as OwnerId);
                assert_eq!(Slab::check(s, &[]), Ok(g.nslots));
                assert_eq!((*s).state, SlabState::Current);
                // Every slot's index round-trips through index_of.
                for i in [0, 1, g.nslots as usize - 1] {
                    let p = f.data.add(i * g.size as usize);
                    assert_eq!(Slab::index_of(s, p), i);
                }
            }
        }
    }

    #[test]
    fn check_catches_a_wrong_count_and_a_stray_bit() {
        let f = block();
        let s = f.s;
        // SAFETY: a fresh header entry and block, ours; the writes stay inside header and bitmap.
        unsafe {
            // 96-byte slots: 682 of them, so the last bitmap word has bits beyond the last slot.
            Slab::init(s, f.data, 4, 4, core::ptr::null_mut());
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
            assert_eq!(Slab::check(s, &[(0, w)]), Err("bitmap bit set beyond the last slot"));
        }
    }

    #[test]
    fn remote_pushes_queue_the_slab_once() {
        let f = block();
        let s = f.s;
        // SAFETY: a fresh slab; the slots pushed are slots of it that nobody uses.
        unsafe {
            Slab::init(s, f.data, 0, 0, core::ptr::null_mut());
            assert_eq!(Slab::push_remote(s, 0), Some(true));
            assert_eq!(Slab::push_remote(s, 1), Some(false));
            // Twice: refused, nothing changes.
            assert_eq!(Slab::push_remote(s, 1), None);
            // Another word: its summary bit, but the slab is queued already.
            assert_eq!(Slab::push_remote(s, 70), Some(false));
            let summary = (*s).shared.remote.load(Ordering::Relaxed);
            assert_eq!(summary, QUEUED | summary_bit(0) | summary_bit(1));
            assert_eq!((*Slab::remote_bits(s)).load(Ordering::Relaxed), 0b11);
            assert_eq!((*Slab::remote_bits(s).add(1)).load(Ordering::Relaxed), 1 << 6);
        }
    }
}
