//! Size classes and slab geometry: pure arithmetic, computed at compile time.
//!
//! Classes: 16, 32, 48 (the finer classes below 64 B, where real programs make most requests), then
//! the ×1.5 ladder 64, 96, 128, …, 3072, 4096, and on into *medium* classes 6144, 8192, 12288 and
//! 16384 (10, 8, 5 and 4 slots per 64 KiB slab). Every slot of a class is aligned to the class's
//! *natural alignment*: the largest power of two dividing its size, capped at 4096 (so 96-byte slots
//! are 32-aligned, 3072-byte slots 1024-aligned). A request with a large alignment takes the smallest
//! class that is both big enough and aligned enough.
#![forbid(unsafe_code)]

/// Largest request served by slabs.
pub const SMALL_MAX: usize = 16384;
/// Every slab is one buddy block of this order (64 KiB), aligned to its size.
pub const SLAB_SHIFT: u32 = 16;
pub const SLAB_SIZE: usize = 1 << SLAB_SHIFT;
/// Bytes of slab header before the bitmap (two cache lines: owner's, then remote-free state).
pub const SLAB_HEADER: usize = 128;
/// Slab headers and bitmaps live out of band, in a table beside the page map (see `heap`), one entry
/// of this many bytes per 64 KiB of the heap's region: an overflow past a slab's last slot reaches
/// the next slab's first slot, never allocator state. 1 KiB: the header and two bitmaps of up to
/// [`MAX_SLOTS`] slots each, the owner's bitmap of free slots and the bitmap of slots other threads
/// freed (see `slab`). Every slab in use keeps its entry's page resident, so the entry's size is a
/// share of every slab's cost. 512-byte entries (one bitmap of 3072 slots, before remote frees
/// became bits) would hold both bitmaps only for 1536 slots: the 16-byte class's slabs would use
/// 24 KiB of their 64 KiB and the 32-byte class's 48, and a memory budget, which counts slabs
/// whole, would count a program of 16-byte objects at 2.7 times its slots (1.14 times now). Measured
/// against 512-byte entries: `model_load`'s peak the same (182.9 and 183.3 MiB), the footprint
/// program's anonymous memory 20 KiB more (796 and 776 KiB).
pub const SLAB_META_SHIFT: u32 = 10;
pub const SLAB_META: usize = 1 << SLAB_META_SHIFT;
/// Words in each of the two bitmaps of a slab-table entry.
pub const MAX_WORDS: usize = (SLAB_META - SLAB_HEADER) / 16;
/// Most slots a slab holds: as many as each bitmap in its table entry has bits (3584). Only the
/// 16-byte class has more room than that (4096 slots); its slabs use the first 56 KiB, and the rest
/// of the block is never touched.
pub const MAX_SLOTS: usize = MAX_WORDS * 64;

// The tables here (and `ROW_OF_SIZE` in `cache`) are `static`, not `const`: each use of a `const`
// array is a copy of it in the code unit that uses it (`tests/preload.rs`,
// `the_library_holds_each_table_once`).
pub static CLASS_SIZES: [usize; 20] =
    [16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384];
pub const NCLASSES: usize = CLASS_SIZES.len();

/// Natural alignment of a slot size: the largest power of two dividing it, capped at 4096.
pub const fn natural_align(size: usize) -> usize {
    let a = 1usize << size.trailing_zeros();
    if a > 4096 {
        4096
    } else {
        a
    }
}

/// The geometry of a slab of one class: slot `i` starts `i * size` bytes into the slab's block (the
/// header and bitmaps are out of band, so slot 0 starts the block, at every class's natural
/// alignment). Invariants: `nwords <= MAX_WORDS` (the header and both bitmaps fit their out-of-band
/// entry); `nslots * size <= SLAB_SIZE`; `nwords * 64 >= nslots`; `recip = ceil(2^32 / size)`, which
/// turns the division of any offset below `SLAB_SIZE` by `size` into an exact multiply and shift,
/// and tells whether `size` divides it ([`slot_index`], [`is_slot_start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub size: u32,
    pub nslots: u32,
    pub nwords: u32,
    pub recip: u32,
}

const fn geometry(size: usize) -> Geometry {
    // The whole block holds slots: the header and bitmap are out of band.
    let fit = SLAB_SIZE / size;
    let nslots = if fit < MAX_SLOTS { fit } else { MAX_SLOTS };
    let nwords = nslots.div_ceil(64);
    let recip = ((1u64 << 32).div_ceil(size as u64)) as u32;
    Geometry { size: size as u32, nslots: nslots as u32, nwords: nwords as u32, recip }
}

pub static GEOMETRY: [Geometry; NCLASSES] = {
    let mut g = [Geometry { size: 0, nslots: 0, nwords: 0, recip: 0 }; NCLASSES];
    let mut i = 0;
    while i < NCLASSES {
        g[i] = geometry(CLASS_SIZES[i]);
        i += 1;
    }
    g
};

/// `SIZE_TO_CLASS[(size + 15) >> 4]` is the smallest class holding `size` (for `size <= SMALL_MAX`,
/// alignment ≤ 16).
pub static SIZE_TO_CLASS: [u8; SMALL_MAX / 16 + 1] = {
    let mut t = [0u8; SMALL_MAX / 16 + 1];
    let mut i = 0;
    let mut c = 0;
    while i < t.len() {
        while CLASS_SIZES[c] < i * 16 {
            c += 1;
        }
        t[i] = c as u8;
        i += 1;
    }
    t
};

// Compile-time checks of the tables' invariants.
const _: () = {
    let mut i = 0;
    while i < NCLASSES {
        let g = GEOMETRY[i];
        assert!(g.nwords as usize <= MAX_WORDS && SLAB_HEADER + 16 * MAX_WORDS <= SLAB_META);
        assert!(g.nslots as usize * g.size as usize <= SLAB_SIZE);
        // `slot_index` and `is_slot_start` are exact for offsets below SLAB_SIZE = 2^16 when
        // 2^32 >= 2^16 * size (see `is_slot_start`).
        assert!(g.size as usize <= 1 << 16);
        assert!(g.nwords as usize * 64 >= g.nslots as usize);
        assert!(g.nslots >= 4);
        assert!(CLASS_SIZES[i] % 16 == 0);
        i += 1;
    }
};

/// The class for a request of `size` bytes (≤ `SMALL_MAX`) and alignment ≤ 16.
#[inline(always)]
pub fn class_of(size: usize) -> usize {
    SIZE_TO_CLASS[(size + 15) >> 4] as usize
}

/// The class for `size` bytes at alignment `align` (a power of two), or `None` when no slab class fits
/// (size or alignment beyond 4096).
pub fn class_for(size: usize, align: usize) -> Option<usize> {
    if size > SMALL_MAX || align > SMALL_MAX {
        return None;
    }
    let mut c = class_of(size);
    while c < NCLASSES {
        if natural_align(CLASS_SIZES[c]) >= align {
            return Some(c);
        }
        c += 1;
    }
    None
}

/// `offset / size` for an offset inside a slab, by the class's reciprocal (see [`Geometry`]).
#[inline(always)]
pub fn slot_index(offset: usize, recip: u32) -> usize {
    ((offset as u64 * recip as u64) >> 32) as usize
}

/// Whether `size` divides `offset` (an offset inside a slab), by the class's reciprocal: the low 32
/// bits of `offset * recip` are below `recip` exactly when it does (Lemire, Kaser and Kurz, "Faster
/// remainder by direct computation", 2019: with `recip = ceil(2^32 / size)` this holds for every
/// offset below `2^32 / size`, so for every offset below `SLAB_SIZE = 2^16` as `size <= 2^16`). One
/// comparison on the product [`slot_index`] takes its high half from, in place of a multiply back
/// and a compare.
#[inline(always)]
pub fn is_slot_start(offset: usize, recip: u32) -> bool {
    ((offset as u64 * recip as u64) as u32) < recip
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_of_is_smallest_fitting_class() {
        for size in 0..=SMALL_MAX {
            let c = class_of(size);
            assert!(CLASS_SIZES[c] >= size, "size {size}");
            if c > 0 {
                assert!(CLASS_SIZES[c - 1] < size.max(1), "size {size} not smallest");
            }
        }
    }

    #[test]
    fn class_for_respects_alignment() {
        for size in 0..=SMALL_MAX {
            for shift in 0..=12 {
                let align = 1 << shift;
                let c = class_for(size, align).unwrap();
                let g = GEOMETRY[c];
                assert!(g.size as usize >= size);
                assert!(natural_align(g.size as usize) >= align, "{size} {align}");
                assert_eq!(g.size as usize % align, 0);
            }
        }
        assert_eq!(class_for(SMALL_MAX + 1, 8), None);
        assert_eq!(class_for(16, 8192), None);
    }

    #[test]
    fn reciprocal_division_is_exact_for_every_offset() {
        for g in GEOMETRY {
            for off in 0..SLAB_SIZE {
                assert_eq!(slot_index(off, g.recip), off / g.size as usize, "size {} off {off}", g.size);
            }
        }
    }

    #[test]
    fn slot_start_test_is_exact_for_every_offset() {
        for g in GEOMETRY {
            for off in 0..SLAB_SIZE {
                assert_eq!(is_slot_start(off, g.recip), off % g.size as usize == 0, "size {} off {off}", g.size);
            }
        }
    }

    #[test]
    fn ladder_grows_by_one_and_a_half_from_64() {
        let from64: Vec<usize> = CLASS_SIZES.iter().copied().filter(|&s| s >= 64).collect();
        for w in from64.windows(2) {
            assert!(w[1] * 2 == w[0] * 3 || w[1] * 3 == w[0] * 4, "{:?}", w);
        }
        assert_eq!(*CLASS_SIZES.last().unwrap(), SMALL_MAX);
    }
}
