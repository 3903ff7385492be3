//! The per-thread run cache (freed large blocks of up to 64 KiB kept for the thread's next requests;
//! the runs here are of 5 to 16 pages, above the largest slab class of 16 KiB):
//! it serves the next request of the same page count, stays within its bounds, and empties on
//! `trim()`, at thread exit and at a load phase's end, and stays off during a phase, under a budget
//! and in the hardened mode; a thread with no cache yet gets one at its first free of a run.
//! Each test runs in its own child process, so that the process-wide figures belong to it alone.

mod common;

use edgepool::run_cache::{mine_bytes, RUN_BYTES, RUN_PAGES, SLOTS};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const PAGE: usize = 4096;

fn cached_total() -> usize {
    edgepool::stats().counters.run_cache_bytes
}

/// Empties this thread's run cache and returns the bytes other threads (the test harness's) hold in
/// theirs, which stay put while they wait for this test.
fn start() -> usize {
    let _ = Vec::<u8>::with_capacity(16); // this thread has a cache
    edgepool::trim();
    assert_eq!(mine_bytes(), 0);
    cached_total()
}

/// Allocates `n` blocks of `pages` pages, writes them, and frees them; returns their addresses.
fn churn(n: usize, pages: usize) -> Vec<usize> {
    let blocks: Vec<*mut u8> = (0..n).map(|_| edgepool::raw::alloc(pages * PAGE, 16)).collect();
    for &p in &blocks {
        assert!(!p.is_null());
        // SAFETY: a live block of `pages * PAGE` bytes.
        unsafe { p.write_bytes(0x5A, pages * PAGE) };
    }
    let addrs = blocks.iter().map(|&p| p as usize).collect();
    for p in blocks {
        // SAFETY: live, freed once.
        unsafe { edgepool::raw::free(p) };
    }
    addrs
}

#[test]
fn serves_the_next_request_and_stays_bounded() {
    common::run_child("child_serves_and_bounded", &[]);
}

#[test]
#[ignore = "run by serves_the_next_request_and_stays_bounded in a child process"]
fn child_serves_and_bounded() {
    let others = start();
    let freed = churn(4, 6);
    assert_eq!(mine_bytes(), 4 * 6 * PAGE);
    assert_eq!(cached_total(), others + mine_bytes());
    // The next request of six pages (24 KiB or a little less) takes one of them, without the heap.
    let hits = edgepool::stats().counters.run_cache_hits;
    let large = edgepool::stats().counters.large_allocs;
    let p = edgepool::raw::alloc(6 * PAGE - 100, 16);
    assert!(freed.contains(&(p as usize)), "not a cached run");
    assert_eq!(edgepool::stats().counters.run_cache_hits, hits + 1);
    assert_eq!(edgepool::stats().counters.large_allocs, large + 1);
    assert_eq!(mine_bytes(), 3 * 6 * PAGE);
    // A zeroed request served from the cache reads zero (the run held 0x5A).
    let z = edgepool::raw::alloc_zeroed(6 * PAGE, 16);
    // SAFETY: a live block of 6 pages.
    assert!(unsafe { std::slice::from_raw_parts(z, 2 * PAGE) }.iter().all(|&b| b == 0));
    // Runs kept by the cache count as large frees.
    let frees = edgepool::stats().counters.large_frees;
    // SAFETY: live, freed once.
    unsafe {
        edgepool::raw::free(p);
        edgepool::raw::free(z);
    }
    assert_eq!(mine_bytes(), 4 * 6 * PAGE);
    assert_eq!(edgepool::stats().counters.large_frees, frees + 2);
    // No more than SLOTS runs of one page count, no more than RUN_BYTES in all.
    churn(3 * SLOTS, 6);
    assert_eq!(mine_bytes(), SLOTS * 6 * PAGE, "the six-page bin not filled to SLOTS");
    churn(200, RUN_PAGES);
    assert!(mine_bytes() <= RUN_BYTES && mine_bytes() > RUN_BYTES - RUN_PAGES * PAGE, "{}", mine_bytes());
    assert_eq!(cached_total(), others + mine_bytes());
    // Nothing above RUN_PAGES pages is cached.
    let before = mine_bytes();
    churn(4, RUN_PAGES + 1);
    assert_eq!(mine_bytes(), before);
    // Every block the heap thinks allocated is live or cached: trim empties the cache.
    edgepool::trim();
    assert_eq!(mine_bytes(), 0);
    assert_eq!(cached_total(), others);
    edgepool::check_heap().unwrap();
}

#[test]
fn empties_at_thread_exit_and_for_other_threads_after_trim() {
    common::run_child("child_thread_exit_and_trim", &[]);
}

#[test]
#[ignore = "run by empties_at_thread_exit_and_for_other_threads_after_trim in a child process"]
fn child_thread_exit_and_trim() {
    let others = start();
    // A thread that exits with a full cache leaves nothing cached.
    std::thread::spawn(|| {
        churn(8, 7);
        assert_eq!(mine_bytes(), 8 * 7 * PAGE);
    })
    .join()
    .unwrap();
    assert_eq!(cached_total(), others);
    // A live thread's cache empties at its next medium free or allocation after another thread's trim.
    let (to_main, from_worker) = std::sync::mpsc::channel();
    let (to_worker, from_main) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        churn(8, 7);
        to_main.send(mine_bytes()).unwrap();
        from_main.recv().unwrap();
        let p = edgepool::raw::alloc(7 * PAGE, 16); // the cache is flushed first, then misses
        let left = mine_bytes();
        // SAFETY: live, freed once (cached again).
        unsafe { edgepool::raw::free(p) };
        (left, mine_bytes())
    });
    assert_eq!(from_worker.recv().unwrap(), 8 * 7 * PAGE);
    assert_eq!(cached_total(), others + 8 * 7 * PAGE);
    edgepool::trim();
    to_worker.send(()).unwrap();
    let (left, after) = worker.join().unwrap();
    assert_eq!(left, 0, "the worker's cache was not emptied after trim()");
    assert_eq!(after, 7 * PAGE, "the worker's last free was not cached");
    assert_eq!(cached_total(), others, "the worker's cache was not emptied at its exit");
}

#[test]
fn off_during_a_load_phase_and_empty_at_its_end() {
    common::run_child("child_phase", &[]);
}

#[test]
#[ignore = "run by off_during_a_load_phase_and_empty_at_its_end in a child process"]
fn child_phase() {
    let others = start();
    churn(4, 6);
    assert_eq!(mine_bytes(), 4 * 6 * PAGE);
    let report = {
        let guard = edgepool::load_phase();
        // Inside the phase: frees go to the heap, and allocations do not take cached runs.
        let hits = edgepool::stats().counters.run_cache_hits;
        churn(4, 5);
        let p = edgepool::raw::alloc(6 * PAGE, 16);
        assert_eq!(edgepool::stats().counters.run_cache_hits, hits);
        // SAFETY: live, freed once.
        unsafe { edgepool::raw::free(p) };
        assert_eq!(mine_bytes(), 4 * 6 * PAGE);
        guard.finish()
    };
    assert_eq!(mine_bytes(), 0, "the phase's end leaves runs cached");
    assert_eq!(cached_total(), others);
    assert!(report.peak_bytes > 0);
    // Under a budget the cache is off too.
    churn(2, 6);
    assert_eq!(mine_bytes(), 2 * 6 * PAGE);
    edgepool::set_limit(1 << 30);
    assert_eq!(mine_bytes(), 0);
    churn(2, 6);
    assert_eq!(mine_bytes(), 0);
    edgepool::set_limit(0);
    churn(2, 6);
    assert_eq!(mine_bytes(), 2 * 6 * PAGE);
}

#[test]
fn off_in_the_hardened_mode() {
    common::run_child("child_secure", &[("EDGEPOOL_SECURE", "1")]);
}

#[test]
#[ignore = "run by off_in_the_hardened_mode in a child process"]
fn child_secure() {
    // Freed runs go to the heap, to be purged and sealed: none waits accessible in a thread's cache.
    start();
    churn(8, 6);
    assert_eq!(mine_bytes(), 0);
}

#[test]
fn a_thread_without_a_cache_gets_one_to_keep_a_run() {
    common::run_child("child_no_cache_yet", &[]);
}

/// What the thread of [`child_no_cache_yet`] saw, written before it ends (its assertions are made in
/// the main thread: a panic could not unwind out of its C start routine).
static SEEN: [std::sync::atomic::AtomicUsize; 4] = [const { std::sync::atomic::AtomicUsize::new(0) }; 4];

/// A thread started with `pthread_create` (not `std::thread`, whose start allocates small blocks), that
/// allocates and frees one run of eight pages and then asks for eight pages again, with no small
/// allocation before: its first free makes its cache, which keeps the run for the second request.
extern "C" fn medium_only(_: *mut libc::c_void) -> *mut libc::c_void {
    use std::sync::atomic::Ordering::Relaxed;
    SEEN[0].store(mine_bytes(), Relaxed);
    let p = edgepool::raw::alloc(8 * PAGE, 16);
    // SAFETY: a live block of 8 pages (null is checked in the main thread through SEEN[1]).
    unsafe {
        if !p.is_null() {
            p.write_bytes(0x5A, 8 * PAGE);
            edgepool::raw::free(p);
        }
    }
    SEEN[1].store(mine_bytes(), Relaxed);
    let q = edgepool::raw::alloc(8 * PAGE, 16);
    SEEN[2].store(usize::from(!q.is_null() && q == p), Relaxed);
    SEEN[3].store(mine_bytes(), Relaxed);
    // SAFETY: live (or null), freed once.
    unsafe { edgepool::raw::free(q) };
    core::ptr::null_mut()
}

#[test]
#[ignore = "run by a_thread_without_a_cache_gets_one_to_keep_a_run in a child process"]
fn child_no_cache_yet() {
    use std::sync::atomic::Ordering::Relaxed;
    let others = start();
    let hits = edgepool::stats().counters.run_cache_hits;
    let mut t: libc::pthread_t = 0;
    // SAFETY: a valid start routine that ignores its argument; the thread is joined below.
    unsafe {
        assert_eq!(libc::pthread_create(&mut t, core::ptr::null(), medium_only, core::ptr::null_mut()), 0);
        assert_eq!(libc::pthread_join(t, core::ptr::null_mut()), 0);
    }
    let seen: Vec<usize> = SEEN.iter().map(|s| s.load(Relaxed)).collect();
    assert_eq!(seen[0], 0, "the thread had runs cached before its first free");
    assert_eq!(seen[1], 8 * PAGE, "the thread's first free kept no run: {seen:?}");
    assert_eq!(seen[2], 1, "the second request did not get the cached run back: {seen:?}");
    assert_eq!(seen[3], 0, "{seen:?}");
    assert_eq!(edgepool::stats().counters.run_cache_hits, hits + 1);
    // The thread's exit emptied its cache: the run it freed last, kept there, went back to the heap.
    assert_eq!(cached_total(), others);
}
