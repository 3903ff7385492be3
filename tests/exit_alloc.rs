//! Allocation from thread-exit destructors that run after edgepool's own (a `pthread_key_create`
//! key made after edgepool's, as C++ runtimes and libraries make them): the thread's cache is already
//! abandoned then. Such allocations are served from one cache that exiting threads share; each used
//! to adopt a cache from the pool and abandon it again. Its own process (one test), so the counters
//! are this test's alone.

use std::sync::OnceLock;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const THREADS: usize = 200;
/// Allocations made by each thread's late destructor.
const LATE_ALLOCS: usize = 25;

static KEY: OnceLock<libc::pthread_key_t> = OnceLock::new();

/// The late destructor: allocates blocks of several small classes, checks them, and frees them.
unsafe extern "C" fn late_destructor(arg: *mut libc::c_void) {
    let seed = arg as usize;
    let blocks: Vec<Vec<u8>> = (0..LATE_ALLOCS).map(|i| vec![(seed + i) as u8; 24 + 40 * (i % 8)]).collect();
    for (i, b) in blocks.iter().enumerate() {
        if b.iter().any(|&x| x != (seed + i) as u8) {
            // A panic in a destructor run by libc would abort anyway; say why first.
            eprintln!("late destructor: block {i} of thread {seed} was overwritten");
            std::process::abort();
        }
    }
}

#[test]
fn late_destructors_do_not_adopt_a_cache_per_allocation() {
    // edgepool's key exists once some thread has a cache: make sure before ours is created, so that
    // ours is later in the destructor order.
    std::thread::spawn(|| drop(vec![1u8; 64])).join().unwrap();
    // SAFETY: a fresh key with a destructor that only touches its argument as an integer.
    let key = *KEY.get_or_init(|| unsafe {
        let mut k: libc::pthread_key_t = 0;
        assert_eq!(libc::pthread_key_create(&mut k, Some(late_destructor)), 0);
        k
    });
    let before = edgepool::stats().counters;
    for batch in 0..THREADS / 20 {
        let handles: Vec<_> = (0..20)
            .map(|t| {
                std::thread::spawn(move || {
                    let own: Vec<Box<u64>> = (0..100).map(Box::new).collect();
                    assert!(own.iter().enumerate().all(|(i, b)| **b == i as u64));
                    let value = (1 + batch * 20 + t) as *const libc::c_void;
                    // SAFETY: our key; the value is an integer, never dereferenced.
                    let rc = unsafe { libc::pthread_setspecific(key, value) };
                    assert_eq!(rc, 0);
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
    let after = edgepool::stats().counters;
    let taken = (after.caches_adopted + after.caches_created) - (before.caches_adopted + before.caches_created);
    // One cache per thread, plus the exit cache: not one per late allocation (THREADS × LATE_ALLOCS).
    assert!(
        (THREADS..=THREADS + 4).contains(&taken),
        "{taken} caches taken for {THREADS} threads whose late destructors allocated {LATE_ALLOCS} times each"
    );
    // The exit cache goes back to the pool at a trim, and its slots freed by the destructors (remote
    // frees) are applied there: every slot is free again and the heap is consistent.
    edgepool::trim();
    let s = edgepool::stats();
    assert!(s.counters.caches_abandoned > before.caches_abandoned);
    edgepool::check_heap().unwrap();
    // The exit cache is taken again by the next late destructor, and works.
    std::thread::spawn(move || {
        // SAFETY: as above.
        assert_eq!(unsafe { libc::pthread_setspecific(key, 7usize as *const libc::c_void) }, 0);
    })
    .join()
    .unwrap();
    edgepool::check_heap().unwrap();
}
