//! Statistics against known workloads: the per-class slot counts exactly, live and large bytes
//! within the bounds that page and slab rounding allow, from one thread and from several (frees by
//! another thread count at once). Each test runs in its own child process, so that the figures belong
//! to that test alone.

mod common;

use std::alloc::{alloc, dealloc, Layout};

use edgepool::classes::CLASS_SIZES;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

fn class_index(size: usize) -> usize {
    CLASS_SIZES.iter().position(|&c| c == size).unwrap()
}

/// The change of class `c`'s (in use, allocations, frees) from `a` to `b`.
fn delta(a: &edgepool::Stats, b: &edgepool::Stats, c: usize) -> (i64, i64, i64) {
    let (x, y) = (a.classes[c], b.classes[c]);
    (y.slots_in_use as i64 - x.slots_in_use as i64, (y.allocations - x.allocations) as i64, (y.frees - x.frees) as i64)
}

/// The statistics once the process is quiet (see [`common::settled`]), for a first reading that
/// exact deltas start from: the bytes live and every class's allocations stay put.
fn settled_stats() -> edgepool::Stats {
    common::settled(edgepool::stats, |s| (s.live_bytes, s.large_bytes, s.classes.map(|c| c.allocations)))
}

#[test]
fn one_thread_class_counts_are_exact() {
    common::run_child("child_one_thread", &[]);
}

#[test]
#[ignore = "run by one_thread_class_counts_are_exact in a child process"]
fn child_one_thread() {
    // 1000 blocks of 100 bytes (the 128-byte class) and 300 of 40 (48), freed in part; the pointer
    // arrays are allocated before the first reading.
    let (l100, l40) = (Layout::from_size_align(100, 8).unwrap(), Layout::from_size_align(40, 8).unwrap());
    let mut a: Vec<*mut u8> = Vec::with_capacity(1000);
    let mut b: Vec<*mut u8> = Vec::with_capacity(300);
    let (c128, c48) = (class_index(128), class_index(48));
    let s0 = settled_stats();
    for _ in 0..1000 {
        // SAFETY: non-zero size.
        a.push(unsafe { alloc(l100) });
    }
    for _ in 0..300 {
        // SAFETY: non-zero size.
        b.push(unsafe { alloc(l40) });
    }
    let s1 = edgepool::stats();
    assert_eq!(delta(&s0, &s1, c128), (1000, 1000, 0));
    assert_eq!(delta(&s0, &s1, c48), (300, 300, 0));
    for (c, n) in [(c128, 1000), (c48, 300)] {
        let k = s1.classes[c];
        assert!(k.slots_reserved >= k.slots_in_use && k.size == CLASS_SIZES[c], "{k:?}");
        // Slabs are laid out as needed: the new slots took at most one slab beyond what they fill.
        let per_slab = edgepool::classes::SLAB_SIZE / k.size;
        let grew = k.slots_reserved - s0.classes[c].slots_reserved;
        assert!(grew <= (n / per_slab + 1) * per_slab, "{k:?} {:?}", s0.classes[c]);
        assert!(k.utilisation() > 0.0 && k.utilisation() <= 1.0);
    }
    // Live bytes grew by the slots at their class size (the two Vecs were there before).
    let grown = s1.live_bytes as i64 - s0.live_bytes as i64;
    assert_eq!(grown, 1000 * 128 + 300 * 48, "{s0:?}\n{s1:?}");
    for &p in &a[..600] {
        // SAFETY: allocated above with this layout.
        unsafe { dealloc(p, l100) };
    }
    for &p in &b {
        // SAFETY: as above.
        unsafe { dealloc(p, l40) };
    }
    let s2 = edgepool::stats();
    assert_eq!(delta(&s1, &s2, c128), (-600, 0, 600));
    assert_eq!(delta(&s1, &s2, c48), (-300, 0, 300));
    assert_eq!(s1.live_bytes - s2.live_bytes, 600 * 128 + 300 * 48);
    for &p in &a[600..] {
        // SAFETY: as above.
        unsafe { dealloc(p, l100) };
    }
    let s3 = edgepool::stats();
    assert_eq!(s3.classes[c128].slots_in_use, s0.classes[c128].slots_in_use);
    assert_eq!(s3.live_bytes, s0.live_bytes);
}

#[test]
fn large_blocks_and_live_bytes_are_counted_at_their_pages() {
    common::run_child("child_large", &[]);
}

#[test]
#[ignore = "run by large_blocks_and_live_bytes_are_counted_at_their_pages in a child process"]
fn child_large() {
    let s0 = settled_stats();
    // 100 KiB is 25 pages; 20 000 bytes (above the largest slab class, 16 KiB) round up to 5 pages.
    let big: Vec<Vec<u8>> = (0..3).map(|_| vec![1u8; 100 << 10]).collect();
    let odd: Vec<u8> = vec![2u8; 20_000];
    let s1 = edgepool::stats();
    // The outer Vec (3 * 24 bytes) is a 96-byte slot.
    assert_eq!(s1.large_bytes - s0.large_bytes, 3 * (100 << 10) + 5 * 4096);
    assert_eq!(s1.live_bytes - s0.live_bytes, 3 * (100 << 10) + 5 * 4096 + 96);
    assert!(s1.in_use_bytes >= s1.live_bytes && s1.peak_in_use_bytes >= s1.in_use_bytes, "{s1:?}");
    assert!(s1.os_bytes >= s1.live_bytes, "{s1:?}");
    let f = s1.fragmentation();
    assert!((0.0..1.0).contains(&f), "{f}");
    assert_eq!(s1.fragmentation_ppm(), 1_000_000 - (s1.live_bytes as u128 * 1_000_000 / s1.os_bytes as u128) as u64);
    let peak = s1.peak_in_use_bytes;
    drop(big);
    drop(odd);
    let s2 = edgepool::stats();
    // The 5-page block may wait in the thread's run cache: large in the heap's view, not live.
    assert_eq!(s2.large_bytes - s2.counters.run_cache_bytes, s0.large_bytes - s0.counters.run_cache_bytes);
    assert_eq!(s2.live_bytes, s0.live_bytes);
    assert!(s2.peak_in_use_bytes >= peak && s2.in_use_bytes <= s1.in_use_bytes);
}

#[test]
fn blocks_out_for_purging_are_not_in_use() {
    common::run_child("child_purge_in_flight", &[]);
}

#[test]
#[ignore = "run by blocks_out_for_purging_are_not_in_use in a child process"]
fn child_purge_in_flight() {
    // In a load phase, fresh memory first has the dirty free memory purged (none is kept by
    // default): the allocation of `b` takes `a`'s freed block out of the free lists to purge it, or
    // to move its pages into `b` (`EDGEPOOL_MOVE_PAGES`), once the heap is unlocked. That block is
    // not in use, then or after, and the most bytes in use must not count it.
    let phase = edgepool::load_phase();
    let a = vec![1u8; 1 << 20];
    let keep = vec![2u8; 1 << 20];
    let s1 = edgepool::stats();
    drop(a);
    let b = vec![3u8; 3 << 20];
    let s2 = edgepool::stats();
    let gone = s2.counters.purged_bytes + s2.moved_bytes - s1.counters.purged_bytes - s1.moved_bytes;
    assert!(gone >= 1 << 20, "{s1:?}\n{s2:?}");
    // Bytes in use at `b`'s allocation: those at s1, less `a`, plus `b` (a 3 MiB run); the slack is
    // for the stats themselves.
    let most = s1.in_use_bytes - (1 << 20) + (3 << 20) + (256 << 10);
    assert!(
        s2.peak_in_use_bytes <= most.max(s1.peak_in_use_bytes),
        "{} > {most}\n{s1:?}\n{s2:?}",
        s2.peak_in_use_bytes
    );
    drop((b, keep, phase));
}

#[test]
fn frees_by_other_threads_count_at_once() {
    common::run_child("child_threads", &[]);
}

#[test]
#[ignore = "run by frees_by_other_threads_count_at_once in a child process"]
fn child_threads() {
    // Four threads allocate 2 000 blocks of 200 bytes (the 256-byte class) each; each frees half of
    // its own, and hands the other half to the main thread, which frees them after the threads ended.
    const N: usize = 2000;
    let layout = Layout::from_size_align(200, 8).unwrap();
    let c = class_index(256);
    let s0 = settled_stats();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || {
                // SAFETY: non-zero size.
                let v: Vec<usize> = (0..N).map(|_| unsafe { alloc(layout) } as usize).collect();
                for &p in &v[..N / 2] {
                    // SAFETY: allocated above with this layout.
                    unsafe { dealloc(p as *mut u8, layout) };
                }
                v[N / 2..].to_vec()
            })
        })
        .collect();
    let kept: Vec<Vec<usize>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let s1 = edgepool::stats();
    assert_eq!(delta(&s0, &s1, c), (4 * N as i64 / 2, 4 * N as i64, 4 * N as i64 / 2), "{:?}", s1.classes[c]);
    for v in &kept {
        for &p in v {
            // SAFETY: allocated by a worker with this layout, handed over, freed once.
            unsafe { dealloc(p as *mut u8, layout) };
        }
    }
    let s2 = edgepool::stats();
    assert_eq!(delta(&s1, &s2, c), (-(4 * N as i64) / 2, 0, 4 * N as i64 / 2));
    assert_eq!(s2.classes[c].slots_in_use, s0.classes[c].slots_in_use);
}

#[test]
fn counters_of_every_thread_add_up_after_it_exits() {
    common::run_child("child_counters", &[]);
}

#[test]
#[ignore = "run by counters_of_every_thread_add_up_after_it_exits in a child process"]
fn child_counters() {
    // The cache layer counts in each thread's cache (its slabs, refills and remote frees) and the
    // report sums the caches: three threads lay out three whole slabs of 1024-byte slots each and
    // exit with every slot live, then this thread frees them all (remote frees, to caches whose
    // threads are gone).
    let c = class_index(1024);
    let per_slab = edgepool::classes::SLAB_SIZE / 1024;
    let layout = Layout::from_size_align(1000, 8).unwrap();
    let s0 = settled_stats();
    let handles: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                // SAFETY: non-zero size; the blocks are freed by the main thread below.
                (0..3 * per_slab).map(|_| unsafe { alloc(layout) } as usize).collect::<Vec<usize>>()
            })
        })
        .collect();
    let blocks: Vec<usize> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let s1 = edgepool::stats();
    let (k0, k1) = (s0.counters, s1.counters);
    // Nine new slabs, none given back (every slot is live), each reached through a slow path.
    assert!(k1.slabs_acquired - k0.slabs_acquired >= 9, "{k0:?}\n{k1:?}");
    assert!(k1.slab_refills - k0.slab_refills >= 9, "{k0:?}\n{k1:?}");
    assert_eq!(s1.classes[c].slots_reserved - s0.classes[c].slots_reserved, 9 * per_slab);
    assert_eq!(s1.classes[c].slots_in_use - s0.classes[c].slots_in_use, 9 * per_slab);
    assert_eq!(s1.slab_bytes, (k1.slabs_acquired - k1.slabs_released) * edgepool::classes::SLAB_SIZE);
    for &p in &blocks {
        // SAFETY: allocated above with this layout, freed once.
        unsafe { dealloc(p as *mut u8, layout) };
    }
    let s2 = edgepool::stats();
    assert_eq!(s2.classes[c].slots_in_use, s0.classes[c].slots_in_use, "{:?}", s2.classes[c]);
    // Each of the nine slabs was queued for its (departed) owner at its first free from here.
    assert!(s2.counters.remote_frees - k1.remote_frees >= 9, "{k1:?}\n{:?}", s2.counters);
}
