//! Thread churn: thousands of short-lived threads allocate and exit. Caches are recycled, so the memory
//! held afterwards is bounded by the number of threads alive at once, not the number that ever ran.

mod common;

use common::scale;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

#[test]
fn thousands_of_short_lived_threads_hold_bounded_memory() {
    let waves = 500 * scale();
    let per_wave = 8;
    // Warm up one wave so that the baseline includes the caches of `per_wave` threads.
    let run_wave = |keep: &mut Vec<Vec<u8>>| {
        let hs: Vec<_> = (0..per_wave)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut v: Vec<Box<[u8]>> = Vec::new();
                    for k in 0..200 {
                        v.push(vec![(k % 251) as u8; 1 + (k * 37 + i) % 3000].into_boxed_slice());
                    }
                    let big = vec![7u8; 100_000];
                    // Return one survivor allocated on this thread: freed later by the main thread.
                    let survivor = v[17].to_vec();
                    drop(v);
                    assert_eq!(big[99_999], 7);
                    survivor
                })
            })
            .collect();
        for h in hs {
            keep.push(h.join().unwrap());
        }
    };
    let mut keep = Vec::new();
    run_wave(&mut keep);
    let base = edgepool::stats();
    for _ in 0..waves {
        run_wave(&mut keep);
        if keep.len() > 64 {
            keep.clear();
        }
    }
    keep.clear();
    edgepool::trim();
    let after = edgepool::stats();
    let threads = waves * per_wave;
    assert!(after.counters.caches_abandoned >= threads / 2, "threads exited without abandoning caches");
    // Caches are reused: far fewer created than threads run.
    assert!(
        after.counters.caches_created <= base.counters.caches_created + 2 * per_wave,
        "caches created {} for {} threads (baseline {})",
        after.counters.caches_created,
        threads,
        base.counters.caches_created
    );
    // Memory taken from the OS did not grow with the number of threads.
    assert!(
        after.os_bytes <= base.os_bytes + (8 << 20),
        "os bytes grew from {} to {} over {} threads",
        base.os_bytes,
        after.os_bytes,
        threads
    );
    edgepool::check_heap().unwrap();
}

/// Every kind of operation as the very first thing a new thread does.
#[test]
fn every_operation_as_a_threads_first() {
    use std::alloc::{alloc, alloc_zeroed, dealloc, realloc, Layout};
    let small = Layout::from_size_align(40, 8).unwrap();
    for op in 0..6 {
        // A block made on this thread, handed to the new one.
        // SAFETY: non-zero size.
        let p = unsafe { alloc(small) } as usize;
        let h = std::thread::spawn(move || {
            // SAFETY: standard alloc API with matching layouts.
            unsafe {
                match op {
                    0 => dealloc(p as *mut u8, small),
                    1 => {
                        let q = realloc(p as *mut u8, small, 5000);
                        assert!(!q.is_null());
                        dealloc(q, Layout::from_size_align(5000, 8).unwrap());
                    }
                    2 => {
                        let q = alloc_zeroed(Layout::from_size_align(3000, 64).unwrap());
                        assert!(!q.is_null() && *q == 0);
                        dealloc(q, Layout::from_size_align(3000, 64).unwrap());
                        dealloc(p as *mut u8, small);
                    }
                    3 => {
                        let q = alloc(Layout::from_size_align(1 << 20, 4096).unwrap());
                        assert!(!q.is_null());
                        dealloc(q, Layout::from_size_align(1 << 20, 4096).unwrap());
                        dealloc(p as *mut u8, small);
                    }
                    4 => {
                        let _ = edgepool::raw::usable_size(p as *mut u8);
                        dealloc(p as *mut u8, small);
                    }
                    _ => {
                        let q = alloc(Layout::from_size_align(100 << 20, 16).unwrap());
                        assert!(!q.is_null());
                        dealloc(q, Layout::from_size_align(100 << 20, 16).unwrap());
                        dealloc(p as *mut u8, small);
                    }
                }
            }
        });
        h.join().unwrap();
    }
    edgepool::check_heap().unwrap();
}
