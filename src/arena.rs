//! The load arena: the bump-pointer form of the load phase (`PhaseMode::Arena`).
//!
//! While an arena phase is open, a thread's small allocations are bumped out of 1 MiB chunks taken
//! from the buddy heap, one current chunk per thread. A chunk goes back to the heap as soon as it is
//! retired (no longer current) and holds no live object. Survivors pin their whole chunk: unlike the
//! segregated slabs, free space inside a chunk is never reused or purged.
//!
//! ```text
//! 0            64                  64 KiB                                          1 MiB
//! | header     | class table (1 byte per 16-byte granule of the chunk) | objects (bumped) |
//! ```

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::buddy::PageKind;
use crate::heap;
use crate::os;
use crate::size_class::{natural_align, CLASS_SIZES};
use crate::stats::{self, COUNTERS};

pub const CHUNK_SHIFT: u32 = 20;
pub const CHUNK_SIZE: usize = 1 << CHUNK_SHIFT;
const GRANULE: usize = 16;
const TABLE: usize = 64;
const FIRST: usize = TABLE + CHUNK_SIZE / GRANULE;
/// `live` bit: the chunk is retired (no longer a thread's current chunk).
const RETIRED: usize = 1 << (usize::BITS - 1);

/// Live bytes of arena objects (for phase reports).
pub static LIVE_BYTES: AtomicUsize = AtomicUsize::new(0);
/// Arena allocations made, ever (for phase reports).
pub static ALLOCS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// A chunk's header.
///
/// Invariants: `live & !RETIRED` counts the objects handed out and not freed; `RETIRED` is set once,
/// by the owner, when the chunk stops being current; whoever moves `live` to exactly `RETIRED` (the
/// owner retiring an empty chunk, or the last free of a retired one) gives the chunk back, so exactly
/// one party does. `next_free` (owner only) is the address of the next free byte; table byte `g` (for
/// the granule at `16 * g`) is `class + 1` for a live object starting there and 0 elsewhere.
#[repr(C)]
pub struct Chunk {
    live: AtomicUsize,
    next_free: usize,
}

impl Chunk {
    /// The class table, right after the header.
    ///
    /// # Safety
    /// - `this` is a live chunk (inside its 1 MiB block).
    unsafe fn table(this: *mut Chunk) -> *mut u8 {
        // SAFETY: the table follows the 64-byte header inside the chunk (contract).
        unsafe { (this as *mut u8).add(TABLE) }
    }
}

/// A new chunk, or null when memory runs out.
pub fn new_chunk() -> *mut Chunk {
    let Some((p, _)) = heap::alloc_block(CHUNK_SHIFT, PageKind::Arena, true) else { return core::ptr::null_mut() };
    let c = p as *mut Chunk;
    // SAFETY: a fresh 1 MiB block owned by us. The class table may hold old bytes: clear it.
    unsafe {
        c.write(Chunk { live: AtomicUsize::new(0), next_free: p as usize + FIRST });
        core::ptr::write_bytes(Chunk::table(c), 0, CHUNK_SIZE / GRANULE);
    }
    c
}

/// Bumps an object of `class` out of `chunk`; null if it does not fit.
///
/// # Safety
/// - `chunk` is the calling thread's current chunk (not retired).
pub unsafe fn alloc(chunk: *mut Chunk, class: usize) -> *mut u8 {
    let size = CLASS_SIZES[class];
    let align = natural_align(size);
    // SAFETY: owner-only fields of a live chunk; the object and its table byte lie inside the chunk.
    unsafe {
        let start = ((*chunk).next_free + align - 1) & !(align - 1);
        if start + size > chunk as usize + CHUNK_SIZE {
            return core::ptr::null_mut();
        }
        (*chunk).next_free = start + size;
        (*chunk).live.fetch_add(1, Ordering::Relaxed);
        *Chunk::table(chunk).add((start - chunk as usize) / GRANULE) = class as u8 + 1;
        LIVE_BYTES.fetch_add(size, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        start as *mut u8
    }
}

/// The class of the live object at `p` in `chunk`, aborting on a pointer that is not one.
///
/// # Safety
/// - `chunk` is a live chunk and `p` lies inside it.
unsafe fn class_of(chunk: *mut Chunk, p: *mut u8) -> usize {
    let off = p as usize - chunk as usize;
    // SAFETY: off < CHUNK_SIZE, so the table index is inside the table.
    let c = unsafe { *Chunk::table(chunk).add(off / GRANULE) };
    if off < FIRST || off % GRANULE != 0 || c == 0 {
        os::invalid_pointer(p, "free(): invalid pointer or double free (load arena)");
    }
    c as usize - 1
}

/// Usable size of the arena object at `p`.
///
/// # Safety
/// - `p` is a live arena object of `chunk`.
pub unsafe fn usable_size(chunk: *mut Chunk, p: *mut u8) -> usize {
    // SAFETY: forwarded.
    CLASS_SIZES[unsafe { class_of(chunk, p) }]
}

/// Frees the arena object at `p` (any thread).
///
/// # Safety
/// - `p` is a live arena object of `chunk`.
pub unsafe fn free(chunk: *mut Chunk, p: *mut u8) {
    // SAFETY: forwarded; the table byte is the object's own, cleared once.
    unsafe {
        let class = class_of(chunk, p);
        *Chunk::table(chunk).add((p as usize - chunk as usize) / GRANULE) = 0;
        LIVE_BYTES.fetch_sub(CLASS_SIZES[class], Ordering::Relaxed);
        if (*chunk).live.fetch_sub(1, Ordering::AcqRel) == RETIRED | 1 {
            give_back(chunk);
        }
    }
}

/// Retires the owner's current chunk: from now on its last free gives it back.
///
/// # Safety
/// - `chunk` is the calling thread's current chunk; the caller forgets it.
pub unsafe fn retire(chunk: *mut Chunk) {
    // SAFETY: a live chunk.
    unsafe {
        if (*chunk).live.fetch_or(RETIRED, Ordering::AcqRel) == 0 {
            give_back(chunk);
        }
    }
}

/// # Safety
/// - nobody references the chunk any more.
unsafe fn give_back(chunk: *mut Chunk) {
    stats::add(&COUNTERS.arena_chunks_released, 1);
    // SAFETY: the chunk is dead.
    unsafe { heap::free_block(chunk as *mut u8) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by each test that gives a chunk back: the first counts the chunks given back process-wide
    /// (`arena_chunks_released`), and the test harness runs tests on parallel threads (a chunk the
    /// other test gave back in between once failed it in CI).
    static CHUNK_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn objects_are_bumped_found_and_the_chunk_goes_back_after_the_last_free() {
        let _serial = CHUNK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let c = new_chunk();
        assert!(!c.is_null());
        let released = COUNTERS.arena_chunks_released.load(Ordering::Relaxed);
        // SAFETY: `c` is our current chunk until retired; the objects are live until freed.
        unsafe {
            let a = alloc(c, 0);
            let b = alloc(c, 0);
            assert_eq!(b as usize, a as usize + 16, "consecutive objects are adjacent");
            let d = alloc(c, 5);
            assert_eq!(d as usize % natural_align(CLASS_SIZES[5]), 0);
            assert_eq!(usable_size(c, d), CLASS_SIZES[5]);
            assert_eq!(usable_size(c, a), 16);
            free(c, a);
            free(c, d);
            retire(c);
            // One object is still live: the chunk stays.
            assert_eq!(COUNTERS.arena_chunks_released.load(Ordering::Relaxed), released);
            free(c, b);
        }
        assert!(COUNTERS.arena_chunks_released.load(Ordering::Relaxed) > released);
    }

    #[test]
    fn a_full_chunk_says_so() {
        let _serial = CHUNK_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let c = new_chunk();
        assert!(!c.is_null());
        let mut n = 0;
        // SAFETY: our current chunk; every object is freed below before the chunk is retired.
        unsafe {
            let mut live = vec![];
            loop {
                let p = alloc(c, CLASS_SIZES.len() - 1);
                if p.is_null() {
                    break;
                }
                live.push(p);
                n += 1;
            }
            let size = CLASS_SIZES[CLASS_SIZES.len() - 1];
            assert_eq!(n, (CHUNK_SIZE - FIRST.next_multiple_of(natural_align(size))) / size);
            for p in live {
                free(c, p);
            }
            retire(c);
        }
    }
}
