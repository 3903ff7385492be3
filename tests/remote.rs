//! Producer/consumer: one thread only allocates, the other only frees (ORT thread pools do this).
//! Memory must stay bounded: remote frees come back to the producer's slabs even though the producer
//! never frees anything itself (mimalloc#1364 regressed exactly here). Its own process, so the figures
//! are this file's alone (the second test allocates 256 blocks).

mod common;

use std::sync::mpsc;

use common::scale;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

/// Producer/consumer: one thread only allocates, the other only frees. Memory must stay bounded:
/// remote frees come back to the producer even though it never frees anything itself.
#[test]
fn producer_consumer_memory_stays_bounded() {
    let (tx, rx) = mpsc::sync_channel::<Vec<usize>>(4);
    let total = 5_000_000 * scale();
    let producer = std::thread::spawn(move || {
        let mut sent = 0;
        while sent < total {
            let batch: Vec<usize> = (0..1000)
                .map(|i| {
                    let p = edgepool::raw::alloc(16 + (i % 7) * 16, 16);
                    assert!(!p.is_null());
                    // SAFETY: fresh block of ≥ 16 bytes.
                    unsafe { (p as *mut usize).write(p as usize) };
                    p as usize
                })
                .collect();
            sent += batch.len();
            tx.send(batch).unwrap();
        }
    });
    let consumer = std::thread::spawn(move || {
        let mut peak = 0;
        for batch in rx {
            peak = peak.max(edgepool::stats().slab_bytes);
            for p in batch {
                // SAFETY: a live block handed over by the producer.
                unsafe {
                    assert_eq!((p as *const usize).read(), p);
                    edgepool::raw::free(p as *mut u8);
                }
            }
        }
        peak
    });
    producer.join().unwrap();
    let peak = consumer.join().unwrap();
    let s = edgepool::stats();
    assert!(s.counters.remote_frees > 0);
    // 2M objects of up to 112 bytes passed through; at most ~6 batches (6000 objects) were live at a
    // time. Slab memory held must be a small multiple of that, not of the total.
    assert!(peak < 16 << 20, "slab bytes peaked at {peak}: they grew with the total, not the live set");
    assert!(s.slab_bytes < 16 << 20, "slab bytes {} grew with the total, not the live set", s.slab_bytes);
    edgepool::check_heap().unwrap();
}

/// Slots that another thread freed are handed out again before the owner's slab moves on to slots it
/// never used: the owner takes its current slab's remote frees back each time it needs a new bitmap
/// word, so a producer whose blocks come back keeps touching the same pages (xmalloc's and rptest's
/// peaks: the producer used to walk through every slot of each slab before it looked at what had come
/// back).
#[test]
fn a_producer_reuses_its_remotely_freed_slots_before_fresh_ones() {
    std::thread::spawn(|| {
        // 208 bytes (the 256-byte class, 255 slots to a slab): a class that the thread machinery below
        // does not allocate in. Half a slab, so that unused slots remain after them.
        const N: usize = 128;
        let first: Vec<usize> = (0..N).map(|_| edgepool::raw::alloc(208, 16) as usize).collect();
        assert!(first.iter().all(|&p| p != 0));
        let given = first.clone();
        std::thread::spawn(move || {
            for p in given {
                // SAFETY: live blocks handed over by the producer.
                unsafe { edgepool::raw::free(p as *mut u8) };
            }
        })
        .join()
        .unwrap();
        let second: Vec<usize> = (0..N).map(|_| edgepool::raw::alloc(208, 16) as usize).collect();
        let old: std::collections::HashSet<usize> = first.iter().copied().collect();
        let reused = second.iter().filter(|p| old.contains(p)).count();
        // The word in hand when the frees came (at most 64 slots) may be used up first.
        assert!(reused >= N / 2, "only {reused} of {N} allocations reused the slots freed by the other thread");
        for p in second {
            // SAFETY: live blocks of this thread.
            unsafe { edgepool::raw::free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    edgepool::check_heap().unwrap();
}

/// A write after free cannot make the owner hand out a live slot: a slot another thread frees is a
/// bit in its slab's table entry, and nothing the owner takes back is read out of the freed slot.
/// (When remote frees were a list linked through the freed slots, the same write forged a link.)
#[test]
fn a_write_after_a_remote_free_cannot_hand_out_a_live_slot() {
    std::thread::spawn(|| {
        let (x, live) = (edgepool::raw::alloc(100, 16) as usize, edgepool::raw::alloc(100, 16) as usize);
        std::thread::spawn(move || {
            // SAFETY: a live block, given up here.
            unsafe { edgepool::raw::free(x as *mut u8) }
        })
        .join()
        .unwrap();
        // The program's bug: it writes after free, a pointer to a live block of the same slab, into
        // both of the freed slot's first words.
        // SAFETY: deliberately wrong (the slot is freed), but it lies in a mapped slab.
        unsafe {
            (x as *mut usize).write(live);
            (x as *mut usize).add(1).write(live);
        }
        let v: Vec<usize> = (0..2000).map(|_| edgepool::raw::alloc(100, 16) as usize).collect();
        assert!(!v.contains(&live), "a live block was handed out again");
        assert!(v.contains(&x), "the remotely freed slot did not come back");
        let distinct: std::collections::HashSet<usize> = v.iter().copied().collect();
        assert_eq!(distinct.len(), v.len());
        for p in v.into_iter().chain([live]) {
            // SAFETY: live blocks of this thread.
            unsafe { edgepool::raw::free(p as *mut u8) };
        }
    })
    .join()
    .unwrap();
    edgepool::check_heap().unwrap();
}

/// The pages of an idle owner's slabs that other threads freed leave the resident set: a thread
/// allocates 256 blocks of 1000 bytes (four slabs of the 1024-byte class), hands them to another and
/// waits, allocating nothing, as `larson`'s lane threads wait in `pthread_join`; the other frees them
/// all and goes on allocating (its slow path runs the scan for idle caches). The owner's slabs stay
/// its own: when it wakes, its new blocks take the same slots again (on pages faulted back in,
/// zeroed), and they hold their data. (An owner that takes the frees back before it waits holds
/// them as free slots of its own slabs, which no other thread touches: they stay resident.)
#[test]
fn an_idle_owners_slabs_that_another_thread_freed_leave_the_resident_set() {
    const N: usize = 256;
    let resident = |blocks: &[usize]| -> usize {
        let mut pages: Vec<usize> = blocks.iter().map(|&p| p & !4095).collect();
        pages.dedup();
        pages
            .iter()
            .filter(|&&page| {
                let mut v = 0u8;
                // SAFETY: one page of the heap's mapping; `v` receives one byte.
                unsafe { libc::mincore(page as *mut libc::c_void, 4096, &mut v) == 0 && v & 1 != 0 }
            })
            .count()
    };
    let (to_freer, blocks) = mpsc::channel::<Vec<usize>>();
    let woken = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let wake = woken.clone();
    let owner = std::thread::spawn(move || {
        let first: Vec<usize> = (0..N)
            .map(|i| {
                let p = edgepool::raw::alloc(1000, 16);
                assert!(!p.is_null());
                // SAFETY: a fresh block of 1000 bytes.
                unsafe { p.write_bytes(i as u8, 1000) };
                p as usize
            })
            .collect();
        to_freer.send(first.clone()).unwrap();
        // Waits without allocating (a channel's receive may allocate as it blocks, and an allocation
        // would take the frees back).
        while !woken.load(std::sync::atomic::Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let second: Vec<usize> = (0..N)
            .map(|i| {
                let p = edgepool::raw::alloc(1000, 16);
                // SAFETY: a fresh block of 1000 bytes.
                unsafe { p.write_bytes(!(i as u8), 1000) };
                p as usize
            })
            .collect();
        let old: std::collections::HashSet<usize> = first.iter().copied().collect();
        let reused = second.iter().filter(|p| old.contains(p)).count();
        for (i, &p) in second.iter().enumerate() {
            // SAFETY: live blocks of this thread, 1000 bytes each.
            let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, 1000) };
            assert!(bytes.iter().all(|&b| b == !(i as u8)), "block {i} lost its data");
            // SAFETY: a live block of this thread.
            unsafe { edgepool::raw::free(p as *mut u8) };
        }
        reused
    });
    let first = blocks.recv().unwrap();
    let before = resident(&first);
    let purged_before = edgepool::stats().counters.purged_bytes;
    for &p in &first {
        // SAFETY: live blocks handed over by the owner.
        unsafe { edgepool::raw::free(p as *mut u8) };
    }
    let start = std::time::Instant::now();
    let mut after = before;
    while start.elapsed() < std::time::Duration::from_secs(5) {
        let v: Vec<usize> = (0..2000).map(|_| edgepool::raw::alloc(64, 16) as usize).collect();
        for p in v {
            // SAFETY: live blocks of this thread.
            unsafe { edgepool::raw::free(p as *mut u8) };
        }
        after = resident(&first);
        if after * 4 <= before {
            break;
        }
    }
    let purged = edgepool::stats().counters.purged_bytes - purged_before;
    wake.store(true, std::sync::atomic::Ordering::Release);
    let reused = owner.join().unwrap();
    assert!(before >= N * 1000 / 4096, "only {before} pages of the blocks were resident");
    assert!(
        after * 4 <= before,
        "{after} of the {before} pages stayed resident after {:?} (purged {purged} bytes)",
        start.elapsed()
    );
    assert!(purged >= (before - after) * 4096 / 2, "purged {purged} bytes for {} pages", before - after);
    assert!(reused >= N / 2, "only {reused} of {N} new blocks took the owner's slots again");
    edgepool::check_heap().unwrap();
}

/// Owners that pause while other threads free what they handed over, again and again, and keep
/// every fourth block for themselves: the scans purge the pages of their slabs on which every slot
/// was freed by another thread, while the owners wake, take their remote frees back and allocate on
/// those pages again. No block ever loses a byte (a page with a live block on it is never purged, and
/// no slot is handed out while its page is purged), and the purges happen.
#[test]
fn pausing_owners_and_busy_freers_exchange_blocks_without_losing_data() {
    use std::sync::{Arc, Mutex};
    let rounds = 60 * scale();
    let queue: Arc<Mutex<Vec<(usize, usize, u8)>>> = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let purged_before = edgepool::stats().counters.purged_bytes;
    let fill = |p: usize, n: usize, v: u8| {
        // SAFETY: a live block of `n` bytes.
        unsafe { (p as *mut u8).write_bytes(v, n) }
    };
    let intact = |p: usize, n: usize, v: u8| {
        // SAFETY: a live block of `n` bytes.
        unsafe { std::slice::from_raw_parts(p as *const u8, n) }.iter().all(|&b| b == v)
    };
    let owners: Vec<_> = (0..2)
        .map(|t| {
            let (queue, done) = (queue.clone(), done.clone());
            std::thread::spawn(move || {
                let mut rng = common::Rng::new(t + 1);
                let mut kept: Vec<(usize, usize, u8)> = Vec::new();
                for _ in 0..rounds {
                    let mut batch = Vec::new();
                    for i in 0..400 {
                        let n = 16 + rng.below(2000) as usize;
                        let p = edgepool::raw::alloc(n, 16) as usize;
                        assert_ne!(p, 0);
                        let v = (rng.below(255) + 1) as u8;
                        fill(p, n, v);
                        if i % 4 == 0 {
                            kept.push((p, n, v));
                        } else {
                            batch.push((p, n, v));
                        }
                    }
                    queue.lock().unwrap().extend(batch);
                    // Idle long enough, now and then, for the scans to purge.
                    std::thread::sleep(std::time::Duration::from_millis(rng.below(12)));
                    for &(p, n, v) in &kept {
                        assert!(intact(p, n, v), "a kept block lost its data");
                    }
                    while kept.len() > 300 {
                        let (p, n, v) = kept.swap_remove(rng.below(kept.len() as u64) as usize);
                        assert!(intact(p, n, v));
                        // SAFETY: a live block of this thread.
                        unsafe { edgepool::raw::free(p as *mut u8) };
                    }
                }
                for (p, n, v) in kept {
                    assert!(intact(p, n, v));
                    // SAFETY: a live block of this thread.
                    unsafe { edgepool::raw::free(p as *mut u8) };
                }
                done.fetch_add(1, std::sync::atomic::Ordering::Release);
            })
        })
        .collect();
    let freers: Vec<_> = (0..2)
        .map(|_| {
            let (queue, done) = (queue.clone(), done.clone());
            std::thread::spawn(move || loop {
                let taken = std::mem::take(&mut *queue.lock().unwrap());
                for &(p, n, v) in &taken {
                    assert!(intact(p, n, v), "a handed-over block lost its data");
                    // SAFETY: a live block handed over by its owner.
                    unsafe { edgepool::raw::free(p as *mut u8) };
                }
                // Slow paths of this thread, which run the scans.
                let junk: Vec<usize> = (0..500).map(|i| edgepool::raw::alloc(24 + i % 200, 16) as usize).collect();
                for p in junk {
                    // SAFETY: live blocks of this thread.
                    unsafe { edgepool::raw::free(p as *mut u8) };
                }
                if taken.is_empty() && done.load(std::sync::atomic::Ordering::Acquire) == 2 {
                    break;
                }
            })
        })
        .collect();
    for t in owners.into_iter().chain(freers) {
        t.join().unwrap();
    }
    let purged = edgepool::stats().counters.purged_bytes - purged_before;
    assert!(purged > 0, "no page of a pausing owner was purged");
    edgepool::check_heap().unwrap();
}
