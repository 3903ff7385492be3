//! Multi-threaded stress (mimalloc's test-stress shape): threads allocate random sizes, fill each block
//! with a pattern derived from its address, hand a share of their blocks to other threads to free, and
//! verify every pattern before freeing. Any corruption fails the test. Scale with
//! `EDGEPOOL_TEST_SCALE=N`.
//!
//! In debug builds (where the allocator's `debug_assert!`s and its lock-order check run), every
//! operation is followed by a walk of the thread's cache (`check_thread_cache`: rows, words, stacks,
//! slab lists and bitmaps), and every 256th by a walk of the heap; the rounds are fewer.

mod common;

use std::sync::mpsc;
use std::sync::{Arc, Barrier};

use common::{fill, scale, verify, Rng};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

struct Block {
    ptr: usize,
    size: usize,
    key: usize,
}

// SAFETY: a Block is an owned heap allocation handed from thread to thread.
unsafe impl Send for Block {}

fn random_size(rng: &mut Rng) -> usize {
    match rng.below(100) {
        0..=59 => 1 + rng.below(64) as usize,
        60..=89 => 1 + rng.below(4096) as usize,
        90..=98 => 4097 + rng.below(64 << 10) as usize,
        _ => (64 << 10) + rng.below(2 << 20) as usize,
    }
}

/// Debug builds: checks the calling thread's cache after an operation (and the heap now and then).
fn check_after_op(op: usize) {
    if cfg!(debug_assertions) {
        edgepool::check_thread_cache().unwrap_or_else(|e| panic!("thread cache after operation {op}: {e}"));
        if op % 256 == 0 {
            edgepool::check_heap().unwrap_or_else(|e| panic!("heap after operation {op}: {e}"));
        }
    }
}

fn alloc_block(rng: &mut Rng) -> Block {
    let size = random_size(rng);
    let p = edgepool::raw::alloc(size, 16);
    assert!(!p.is_null());
    // SAFETY: fresh block of `size` bytes.
    unsafe { fill(p, size.min(256), p as usize) };
    Block { ptr: p as usize, size, key: p as usize }
}

fn check_and_free(b: Block) {
    // SAFETY: the block is live and owned by us.
    unsafe {
        let bad = verify(b.ptr as *const u8, b.size.min(256), b.key);
        assert_eq!(bad, None, "corrupted block {:#x} size {}", b.ptr, b.size);
        edgepool::raw::free(b.ptr as *mut u8);
    }
}

#[test]
fn threads_exchange_blocks_and_verify_patterns() {
    let threads = 4;
    let rounds = if cfg!(debug_assertions) { 20_000 } else { 100_000 } * scale();
    let barrier = Arc::new(Barrier::new(threads));
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..threads).map(|_| mpsc::channel::<Vec<Block>>()).unzip();
    let mut handles = vec![];
    for (t, rx) in receivers.into_iter().enumerate() {
        let senders = senders.clone();
        let barrier = barrier.clone();
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng::new(0x1234_5678 + t as u64 * 7919);
            let mut live: Vec<Block> = Vec::new();
            barrier.wait();
            for round in 0..rounds {
                // Allocate, sometimes realloc, sometimes free locally.
                let b = alloc_block(&mut rng);
                live.push(b);
                check_after_op(round);
                if rng.below(10) == 0 && !live.is_empty() {
                    let k = rng.below(live.len() as u64) as usize;
                    let b = &mut live[k];
                    let new_size = random_size(&mut rng);
                    // SAFETY: live block; on success the old pointer is gone.
                    unsafe {
                        assert_eq!(verify(b.ptr as *const u8, b.size.min(256), b.key), None);
                        let q = edgepool::raw::realloc(b.ptr as *mut u8, new_size, 16);
                        assert!(!q.is_null());
                        assert_eq!(verify(q, b.size.min(new_size).min(256), b.key), None, "realloc lost data");
                        fill(q, new_size.min(256), q as usize);
                        *b = Block { ptr: q as usize, size: new_size, key: q as usize };
                    }
                    check_after_op(round);
                }
                if live.len() > 200 {
                    // Send a third to another thread, free a third here.
                    let n = live.len() / 3;
                    let to = (t + 1 + rng.below(threads as u64 - 1) as usize) % threads;
                    let batch: Vec<Block> = live.drain(..n).collect();
                    let _ = senders[to].send(batch);
                    for _ in 0..n {
                        let k = rng.below(live.len() as u64) as usize;
                        check_and_free(live.swap_remove(k));
                        check_after_op(round);
                    }
                }
                if round % 64 == 0 {
                    while let Ok(batch) = rx.try_recv() {
                        for b in batch {
                            check_and_free(b);
                            check_after_op(round);
                        }
                    }
                }
            }
            for b in live {
                check_and_free(b);
            }
            drop(senders);
            rx
        }));
    }
    drop(senders);
    let receivers: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for rx in receivers {
        while let Ok(batch) = rx.try_recv() {
            for b in batch {
                check_and_free(b);
            }
        }
    }
    let s = edgepool::stats();
    assert!(s.counters.remote_frees > 0, "the test must exercise cross-thread frees");
    edgepool::check_heap().unwrap();
}
