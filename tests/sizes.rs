//! Every size from 0 to 16 KiB and a sample up to 1 GiB, with every power-of-two alignment up to
//! 1 MiB: pointer aligned, usable, content preserved through realloc up and down. This binary runs on
//! `EdgePool`: the harness, std and the tests all allocate through it.

mod common;

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

use common::{fill, verify};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

fn check_block(p: *mut u8, size: usize, align: usize) {
    assert!(!p.is_null(), "null for size {size} align {align}");
    assert_eq!(p as usize % align, 0, "misaligned: size {size} align {align}");
    assert_eq!(p as usize % 16, 0, "below 16-byte base alignment: size {size}");
    // SAFETY: p is live with at least `size` bytes.
    let usable = unsafe { edgepool::raw::usable_size(p) };
    assert!(usable >= size.max(1), "usable {usable} < size {size}");
}

#[test]
fn every_size_to_16k_with_every_alignment_to_1m() {
    for shift in 0..=20 {
        let align = 1usize << shift;
        let mut size = 0;
        while size <= 16 << 10 {
            // Large alignments are expensive blocks: test every size up to 16 KiB for small
            // alignments, and a dense sample for the big ones. The debug build (CI's second pass, for
            // the allocator's debug_assert!s) samples sizes above 4 KiB too: unoptimised, the
            // byte-by-byte fill and check of every one took 4–5 minutes; the release pass tests them all.
            let step = if align > 4096 {
                61
            } else if cfg!(debug_assertions) && size >= 4096 {
                7
            } else {
                1
            };
            let layout = Layout::from_size_align(size.max(1), align).unwrap();
            // SAFETY: layout has non-zero size.
            unsafe {
                let p = alloc(layout);
                check_block(p, size, align);
                fill(p, size, p as usize);
                // Grow: content preserved.
                let up = size * 2 + 17;
                let q = realloc(p, layout, up);
                check_block(q, up, align);
                assert_eq!(verify(q, size, p as usize), None, "grow lost data: size {size} align {align}");
                fill(q, up, q as usize);
                // Shrink: prefix preserved.
                let down = size / 2 + 1;
                let r = realloc(q, Layout::from_size_align(up, align).unwrap(), down);
                check_block(r, down, align);
                assert_eq!(verify(r, down, q as usize), None, "shrink lost data: size {size} align {align}");
                dealloc(r, Layout::from_size_align(down, align).unwrap());
            }
            size += step;
        }
    }
    edgepool::check_heap().unwrap();
}

#[test]
fn sample_up_to_1g() {
    let mut sizes = vec![];
    for k in 12..=30 {
        let b = 1usize << k;
        sizes.extend([b - 1, b, b + 1, b + b / 2]);
    }
    sizes.retain(|&s| s <= 1 << 30);
    for &size in &sizes {
        for align in [16usize, 4096, 1 << 16, 1 << 20] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: non-zero size.
            unsafe {
                let p = alloc(layout);
                check_block(p, size, align);
                // Touch the first and last page and a byte in the middle.
                for off in [0, size / 2, size.saturating_sub(4096), size - 1] {
                    *p.add(off) = (off % 251) as u8;
                }
                for off in [0, size / 2, size.saturating_sub(4096), size - 1] {
                    assert_eq!(*p.add(off), (off % 251) as u8);
                }
                let q = realloc(p, layout, size + size / 3);
                check_block(q, size + size / 3, align);
                assert_eq!(*q, 0);
                assert_eq!(*q.add(size - 1), ((size - 1) % 251) as u8);
                let r = realloc(q, Layout::from_size_align(size + size / 3, align).unwrap(), size / 3 + 1);
                check_block(r, size / 3 + 1, align);
                assert_eq!(*r, 0);
                dealloc(r, Layout::from_size_align(size / 3 + 1, align).unwrap());
            }
        }
    }
    edgepool::check_heap().unwrap();
}

#[test]
fn alloc_zeroed_is_zero_even_after_reuse() {
    for &size in &[1usize, 15, 16, 100, 4096, 5000, 65536, 1 << 20, 3 << 20, 100 << 20] {
        for _ in 0..3 {
            let layout = Layout::from_size_align(size, 16).unwrap();
            // SAFETY: non-zero size.
            unsafe {
                let p = alloc_zeroed(layout);
                assert!(!p.is_null());
                let s = std::slice::from_raw_parts(p, size);
                assert!(s.iter().all(|&b| b == 0), "alloc_zeroed({size}) not zero");
                // Dirty it so that a reuse would show.
                std::ptr::write_bytes(p, 0xEE, size);
                dealloc(p, layout);
            }
        }
    }
}

#[test]
fn small_classes_are_distinct_and_usable() {
    let mut v: Vec<(usize, usize)> = vec![];
    for size in 1..=4096usize {
        let layout = Layout::from_size_align(size, 8).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: live block of `size` bytes.
        unsafe { fill(p, size, p as usize) };
        v.push((p as usize, size));
    }
    let mut sorted = v.clone();
    sorted.sort();
    for w in sorted.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "overlapping blocks");
    }
    for (p, size) in v {
        // SAFETY: live block.
        unsafe {
            assert_eq!(verify(p as *const u8, size, p), None);
            dealloc(p as *mut u8, Layout::from_size_align(size, 8).unwrap());
        }
    }
}

#[test]
fn impossible_request_returns_null_and_allocator_keeps_working() {
    for &size in &[isize::MAX as usize - 4095, isize::MAX as usize / 2, 1usize << 47] {
        let layout = Layout::from_size_align(size, 16).unwrap();
        // SAFETY: non-zero size. black_box: LLVM may otherwise elide an unused allocation and assume
        // it succeeded.
        let p = std::hint::black_box(unsafe { alloc(std::hint::black_box(layout)) });
        assert!(p.is_null(), "size {size} should fail");
    }
    let huge_align = Layout::from_size_align(16, 1usize << 46).unwrap();
    // SAFETY: non-zero size.
    let p = std::hint::black_box(unsafe { alloc(std::hint::black_box(huge_align)) });
    if !p.is_null() {
        // Allowed to succeed (it is only address space); then it must be aligned and freeable.
        assert_eq!(p as usize % (1usize << 46), 0);
        // SAFETY: live block with this layout.
        unsafe { dealloc(p, huge_align) };
    }
    // Still works.
    let v: Vec<u64> = (0..100_000).collect();
    assert_eq!(v.iter().sum::<u64>(), 4_999_950_000);
    // A realloc that cannot be satisfied returns null and keeps the block.
    let layout = Layout::from_size_align(64, 16).unwrap();
    // SAFETY: non-zero size; realloc failure keeps p valid.
    unsafe {
        let p = alloc(layout);
        fill(p, 64, 7);
        let q = std::hint::black_box(realloc(p, layout, std::hint::black_box(isize::MAX as usize - 4095)));
        assert!(q.is_null());
        assert_eq!(verify(p, 64, 7), None);
        dealloc(p, layout);
    }
}

#[test]
fn large_realloc_grows_in_place_when_the_buddy_is_free() {
    let before = edgepool::stats().counters.large_realloc_in_place;
    // SAFETY: standard alloc/realloc/dealloc pairs.
    unsafe {
        let layout = Layout::from_size_align(1 << 20, 1 << 20).unwrap();
        let p = alloc(layout);
        fill(p, 1 << 20, 1);
        let q = realloc(p, layout, 2 << 20);
        assert_eq!(verify(q, 1 << 20, 1), None);
        let r = realloc(q, Layout::from_size_align(2 << 20, 1 << 20).unwrap(), 300 << 10);
        assert_eq!(r, q, "shrinking a large block moves nothing");
        assert_eq!(verify(r, 300 << 10, 1), None);
        dealloc(r, Layout::from_size_align(300 << 10, 1 << 20).unwrap());
    }
    assert!(edgepool::stats().counters.large_realloc_in_place > before);
}

#[test]
fn vec_growth_and_strings() {
    let mut v = Vec::new();
    for i in 0..1_000_000u32 {
        v.push(i);
    }
    let s: String = (0..10_000).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    assert_eq!(v.len(), 1_000_000);
    assert_eq!(s.len(), 10_000);
    let mut m = std::collections::HashMap::new();
    for i in 0..50_000 {
        m.insert(i.to_string(), i);
    }
    assert_eq!(m["4242"], 4242);
}

/// A slab's two bitmaps (free slots, and slots other threads freed) live in its 1 KiB slab-table
/// entry, which has room for 3584 slots in each: the 16-byte class (room for 4096 in a 64 KiB
/// block) hands out only the first 56 KiB of each slab and never touches the rest, the 32-byte class
/// fills its slabs, and every slot they hand out is distinct.
#[test]
fn the_16_byte_class_uses_the_first_56_kib_of_its_slabs_and_the_32_byte_class_all() {
    for (size, per_slab) in [(16, 3584), (32, 2048)] {
        std::thread::spawn(move || {
            let ps: Vec<usize> = (0..20_000).map(|_| edgepool::raw::alloc(size, 16) as usize).collect();
            assert!(ps.iter().all(|&p| p != 0));
            let mut slabs = std::collections::HashMap::new();
            for &p in &ps {
                assert!(p % 65536 < per_slab * size, "{size}-byte slot at offset {} of its 64 KiB slab", p % 65536);
                *slabs.entry(p / 65536).or_insert(0usize) += 1;
            }
            assert!(slabs.values().all(|&n| n <= per_slab));
            // Full slabs: every slot of each is handed out before another slab.
            assert!(slabs.values().filter(|&&n| n == per_slab).count() >= 20_000 / per_slab - 1);
            let distinct: std::collections::HashSet<usize> = ps.iter().copied().collect();
            assert_eq!(distinct.len(), ps.len());
            for p in ps {
                // SAFETY: live blocks of this thread.
                unsafe { edgepool::raw::free(p as *mut u8) };
            }
        })
        .join()
        .unwrap();
    }
    edgepool::check_heap().unwrap();
}
