//! Pages that move between heap blocks (`EDGEPOOL_MOVE_PAGES`): a large block that would fault fresh
//! pages in takes the resident pages of free blocks instead, a block grown in place likewise, and a
//! large block that `realloc` moves has its pages moved rather than copied. Each test runs in its own
//! child process, so that the heap's figures and the process's page faults belong to it alone.

mod common;

use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

fn layout(n: usize) -> Layout {
    Layout::from_size_align(n, PAGE).unwrap()
}

/// A block of `n` bytes with every page written (`tag` in each byte).
fn written(n: usize, tag: u8) -> *mut u8 {
    // SAFETY: a fresh block of `n` bytes, written whole.
    unsafe {
        let p = alloc(layout(n));
        assert!(!p.is_null());
        p.write_bytes(tag, n);
        p
    }
}

/// Page faults taken while `f` runs.
fn faults(f: impl FnOnce()) -> u64 {
    let before = edgepool::os::page_faults();
    f();
    edgepool::os::page_faults() - before
}

/// Whether moves can work here: the option, and a kernel with `MREMAP_DONTUNMAP` (Linux 5.7+).
fn kernel_moves() -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release.split(|c: char| !c.is_ascii_digit()).filter_map(|x| x.parse::<u32>().ok());
    (v.next().unwrap_or(0), v.next().unwrap_or(0)) >= (5, 7)
}

#[test]
fn freed_resident_pages_move_into_a_block_instead_of_fresh_ones() {
    common::run_child("child_fill", &[("EDGEPOOL_RETAIN", "0")]);
}

#[test]
fn without_moves_the_same_block_faults_its_pages_in() {
    common::run_child("child_fill", &[("EDGEPOOL_RETAIN", "0"), ("EDGEPOOL_MOVE_PAGES", "0")]);
}

/// Two freed blocks of 3 MiB, kept apart by live ones, hold resident pages that no 6 MiB request
/// fits in: the 6 MiB block takes fresh address space, and with nothing kept for reuse
/// (`EDGEPOOL_RETAIN=0`) the freed pages must leave the resident set: they move into the block,
/// where they would have been purged and the block's pages faulted in.
#[test]
#[ignore = "run by the two tests above in a child process"]
fn child_fill() {
    let moves = edgepool::options().get(edgepool::options::MOVE_PAGES) != 0 && kernel_moves();
    let a = written(3 * MIB, 1);
    let s1 = written(64 << 10, 2);
    let c = written(3 * MIB, 3);
    let s2 = written(64 << 10, 4);
    // SAFETY: the blocks are this test's, each freed once with its own layout.
    unsafe {
        dealloc(a, layout(3 * MIB));
        dealloc(c, layout(3 * MIB));
    }
    let s0 = edgepool::stats();
    assert!(s0.dirty_free_bytes >= 6 * MIB, "the freed blocks were purged at once: {s0:?}");
    let rss0 = edgepool::os::rss_bytes();
    let mut e = std::ptr::null_mut();
    let taken = faults(|| {
        e = written(6 * MIB, 5);
    });
    let s = edgepool::stats();
    let rss = edgepool::os::rss_bytes();
    let moved = s.moved_bytes - s0.moved_bytes;
    let pages = (6 * MIB / PAGE) as u64;
    if moves {
        assert!(moved >= 5 * MIB, "only {moved} bytes moved into the block");
        assert!(taken < pages / 4, "{taken} page faults for a block of {pages} pages made of resident ones");
        // The freed blocks' pages went with the move: the heap no longer counts them resident.
        assert!(
            s.dirty_free_bytes + 5 * MIB <= s0.dirty_free_bytes,
            "{} -> {}",
            s0.dirty_free_bytes,
            s.dirty_free_bytes
        );
    } else {
        // The freed blocks were purged to make room, and the block's pages faulted in.
        assert_eq!(moved, 0);
        assert!(taken >= pages / 2, "{taken} page faults for {pages} fresh pages");
        let purged = s.counters.purged_bytes - s0.counters.purged_bytes;
        assert!(purged >= 5 * MIB, "only {purged} bytes purged to make room");
    }
    // Either way the process holds the 6 MiB block in about the memory that the freed ones held.
    assert!(rss < rss0 + 2 * MIB, "RSS {rss0} -> {rss}");
    // SAFETY: `e` holds 6 MiB written above; the blocks are this test's, each freed once.
    unsafe {
        assert!((0..6 * MIB).step_by(PAGE / 2).all(|i| *e.add(i) == 5));
        // A zeroed block where the pages moved out (or anywhere) reads zero.
        let z = alloc_zeroed(layout(3 * MIB));
        assert!(std::slice::from_raw_parts(z, 3 * MIB).iter().all(|&b| b == 0));
        dealloc(z, layout(3 * MIB));
        dealloc(e, layout(6 * MIB));
        dealloc(s1, layout(64 << 10));
        dealloc(s2, layout(64 << 10));
    }
    edgepool::check_heap().unwrap();
}

#[test]
fn a_large_block_that_realloc_moves_takes_its_pages_along() {
    common::run_child("child_realloc", &[]);
}

/// A 4 MiB block with a live block right after it cannot grow in place: grown to 8 MiB, it moves,
/// and its pages go with it instead of being copied into freshly faulted ones.
#[test]
#[ignore = "run by a_large_block_that_realloc_moves_takes_its_pages_along in a child process"]
fn child_realloc() {
    let moves = kernel_moves();
    let p = written(4 * MIB, 0);
    // SAFETY: `p` holds 4 MiB; the pattern tells each page apart.
    unsafe {
        for i in (0..4 * MIB).step_by(PAGE) {
            *p.add(i) = (i / PAGE) as u8 | 1;
            *p.add(i + PAGE - 1) = (i / PAGE) as u8 ^ 0x55;
        }
    }
    let s = written(64 << 10, 9);
    let s0 = edgepool::stats();
    let mut q = std::ptr::null_mut();
    // SAFETY: `p` is this test's block of 4 MiB, given up to realloc.
    let taken = faults(|| q = unsafe { realloc(p, layout(4 * MIB), 8 * MIB) });
    assert!(!q.is_null());
    assert_ne!(q, p, "the block grew in place: the live block after it did not stop it");
    let st = edgepool::stats();
    // SAFETY: `q` holds 8 MiB, the first 4 of them what `p` held.
    unsafe {
        for i in (0..4 * MIB).step_by(PAGE) {
            assert_eq!(*q.add(i), (i / PAGE) as u8 | 1, "page {} lost its first byte", i / PAGE);
            assert_eq!(*q.add(i + PAGE - 1), (i / PAGE) as u8 ^ 0x55, "page {} lost its last byte", i / PAGE);
        }
        q.add(4 * MIB).write_bytes(7, 4 * MIB);
    }
    if moves {
        assert!(st.moved_bytes - s0.moved_bytes >= 4 * MIB - PAGE, "{} bytes moved", st.moved_bytes - s0.moved_bytes);
        // A copy into fresh pages faults 1024 of them in.
        assert!(taken < 128, "{taken} page faults for a block whose pages moved");
    }
    // SAFETY: the blocks are this test's, each freed once.
    unsafe {
        dealloc(q, layout(8 * MIB));
        dealloc(s, layout(64 << 10));
    }
    edgepool::check_heap().unwrap();
}

#[test]
fn a_block_grown_in_place_takes_resident_free_pages() {
    common::run_child("child_grow_in_place", &[("EDGEPOOL_RETAIN", "0")]);
}

/// A block grown in place into clean free pages takes the resident pages of a freed block instead
/// of faulting fresh ones in. The arrangement: 12 MiB freed and purged, then a block of 2 MiB at
/// their start, whose growth claims clean pages; 4 MiB written and freed after them.
#[test]
#[ignore = "run by a_block_grown_in_place_takes_resident_free_pages in a child process"]
fn child_grow_in_place() {
    let moves = kernel_moves();
    // SAFETY: blocks of this test, each freed once with its own layout; `h` is never written.
    unsafe {
        let h = alloc(layout(12 * MIB));
        let d = written(4 * MIB, 1);
        let s = written(64 << 10, 2);
        dealloc(h, layout(12 * MIB));
        // Freed pages count as resident until purged (the heap does not know they were never
        // touched): trim purges them, and d stays.
        edgepool::trim();
        let p = written(2 * MIB, 3);
        assert!(
            p as usize >= h as usize && p as usize + 5 * MIB <= h as usize + 12 * MIB,
            "the block did not go where the untouched pages were: {p:?} against {h:?}"
        );
        dealloc(d, layout(4 * MIB));
        let s0 = edgepool::stats();
        let q = realloc(p, layout(2 * MIB), 5 * MIB);
        let st = edgepool::stats();
        assert_eq!(q, p, "the block did not grow in place into the free pages after it");
        assert_eq!(st.counters.large_realloc_in_place - s0.counters.large_realloc_in_place, 1);
        let taken = faults(|| {
            assert!((0..2 * MIB).step_by(PAGE / 2).all(|i| *q.add(i) == 3));
            q.add(2 * MIB).write_bytes(4, 3 * MIB);
        });
        let moved = st.moved_bytes - s0.moved_bytes;
        if moves {
            assert!(moved >= 2 * MIB, "{moved} bytes moved");
            assert!(taken < (3 * MIB / PAGE) as u64 / 3, "{taken} page faults in the grown part");
        } else {
            assert_eq!(moved, 0);
        }
        dealloc(q, layout(5 * MIB));
        dealloc(s, layout(64 << 10));
    }
    edgepool::check_heap().unwrap();
}

/// Frees the blocks [`churn`] left live.
fn free_live(live: Vec<(*mut u8, usize, u8)>) {
    for (p, n, _) in live {
        // SAFETY: live blocks of [`churn`], freed once.
        unsafe { dealloc(p, layout(n)) };
    }
}

/// `steps` blocks of 1-6 MiB written whole, each after freeing a random one of `live` (its contents
/// checked) once six are live. Returns the most mappings the process had after a step.
fn churn(rng: &mut common::Rng, live: &mut Vec<(*mut u8, usize, u8)>, steps: usize) -> usize {
    let mut most = 0;
    for step in 0..steps {
        if live.len() >= 6 {
            let (p, n, tag) = live.swap_remove(rng.below(live.len() as u64) as usize);
            // SAFETY: a live block of `n` bytes written with `tag`, freed once.
            unsafe {
                assert!((0..n).step_by(PAGE).all(|i| *p.add(i) == tag), "a block lost its contents");
                dealloc(p, layout(n));
            }
        }
        let n = (1 + rng.below(6) as usize) * MIB;
        let tag = step as u8 | 1;
        live.push((written(n, tag), n, tag));
        most = most.max(edgepool::os::mappings().unwrap());
    }
    most
}

#[test]
fn moves_stop_before_the_process_runs_short_of_mappings() {
    common::run_child("child_mapping_limit", &[("EDGEPOOL_RETAIN", "0")]);
}

/// Every move of pages splits the heap's mapping; moves stop while the process has as many
/// mappings as they may take it to, and the blocks stay right meanwhile.
#[test]
#[ignore = "run by moves_stop_before_the_process_runs_short_of_mappings in a child process"]
fn child_mapping_limit() {
    if !kernel_moves() {
        return;
    }
    let maps0 = edgepool::os::mappings().unwrap();
    let limit = maps0 + 24;
    edgepool::os::set_move_maps_limit(limit);
    let mut live = Vec::new();
    let most = churn(&mut common::Rng::new(7), &mut live, 300);
    let moved = edgepool::stats().moved_bytes;
    assert!(moved > 0, "nothing moved before the limit");
    // Each move adds at most four mappings, and one more may have been under way at the limit; the
    // heap's own growth adds a few.
    assert!(most <= limit + 8, "{most} mappings against a limit of {limit} ({maps0} at the start)");
    free_live(live);
    edgepool::check_heap().unwrap();
}

#[test]
fn the_heaps_mappings_do_not_pile_up_with_the_moves() {
    common::run_child("child_mappings_merge", &[("EDGEPOOL_RETAIN", "0")]);
}

/// Each move splits the heap's mapping (the moved pages keep a mapping of their own); purges map
/// fresh memory over free blocks, which merges it back: after a churn of large blocks that moves
/// pages many times, freeing everything and a trim leave the process with about the mappings it
/// had (with `madvise` purges, every move's mappings stayed).
#[test]
#[ignore = "run by the_heaps_mappings_do_not_pile_up_with_the_moves in a child process"]
fn child_mappings_merge() {
    if !kernel_moves() {
        return;
    }
    // The heap's first block, before the count.
    let first = written(MIB, 1);
    let maps0 = edgepool::os::mappings().unwrap();
    let mut live = Vec::new();
    let most = churn(&mut common::Rng::new(11), &mut live, 400).max(maps0);
    let moved = edgepool::stats().moved_bytes;
    assert!(moved > 64 * MIB, "{moved} bytes moved");
    free_live(live);
    edgepool::trim();
    let after = edgepool::os::mappings().unwrap();
    eprintln!("mappings: {maps0} at the start, {most} at most, {after} after a trim; {moved} bytes moved");
    assert!(after <= maps0 + 8, "{after} mappings after a trim against {maps0} at the start ({most} at most)");
    // SAFETY: allocated above, freed once.
    unsafe { dealloc(first, layout(MIB)) };
    edgepool::check_heap().unwrap();
}

#[test]
fn pages_move_into_heap_blocks_only() {
    common::run_child("child_into_direct", &[("EDGEPOOL_RETAIN", "0"), ("EDGEPOOL_MAX_BLOCK", "8M")]);
}

/// A heap block that `realloc` grows beyond the largest block goes to a direct mapping: its pages
/// are copied there, not moved, so the mapping stays one and grows again in place of a copy
/// (`mremap` moves only a range inside one mapping).
#[test]
#[ignore = "run by pages_move_into_heap_blocks_only in a child process"]
fn child_into_direct() {
    if !kernel_moves() {
        return;
    }
    let p = written(6 * MIB, 3);
    let (moved0, direct0) = (edgepool::stats().moved_bytes, edgepool::stats().counters.direct_allocs);
    // SAFETY: a live block of 6 MiB, reallocated once; then the direct mapping it became, once.
    unsafe {
        let q = realloc(p, layout(6 * MIB), 12 * MIB);
        assert!(!q.is_null());
        assert!((0..6 * MIB).step_by(PAGE).all(|i| *q.add(i) == 3), "the contents did not move along");
        assert_eq!(edgepool::stats().moved_bytes, moved0, "pages moved into a direct mapping");
        q.add(6 * MIB).write_bytes(4, 6 * MIB);
        let r = realloc(q, layout(12 * MIB), 24 * MIB);
        assert!(!r.is_null());
        assert_eq!(edgepool::stats().counters.direct_allocs, direct0 + 1, "the direct mapping was copied to grow");
        assert!((0..12 * MIB).step_by(PAGE).all(|i| *r.add(i) == if i < 6 * MIB { 3 } else { 4 }));
        dealloc(r, layout(24 * MIB));
    }
    edgepool::check_heap().unwrap();
}
