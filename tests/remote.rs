//! Producer/consumer: one thread only allocates, the other only frees (ORT thread pools do this).
//! Memory must stay bounded: remote frees come back to the producer's slabs even though the producer
//! never frees anything itself (mimalloc#1364 regressed exactly here). Its own process, so the figures
//! are this test's alone.

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
