//! Side-by-side allocator benchmarks: the same workloads against the system allocator (glibc),
//! mimalloc, jemalloc and edgepool, each called through its own `GlobalAlloc` implementation in this
//! one process (the harness itself runs on the system allocator).
//!
//! Groups:
//! - `pair/<size>`: one malloc/free pair of a size class;
//! - `batch_lifo`, `batch_fifo`, `batch_random`: 1000 mixed small objects (8..=1024 B) allocated,
//!   then freed in LIFO, FIFO or shuffled order;
//! - `realloc_growth`: a buffer grown from 16 B to 1 MiB by steps of ×1.5 (as `Vec` does);
//! - `producer_consumer`: one thread allocates 64 B objects in batches of 256, another frees them;
//! - `large/<size>`: malloc/free of 64 KiB, 1 MiB and 8 MiB blocks.
//!
//! Reproduce: `cargo bench --bench alloc` then `python3 scripts/bench-table.py`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

static EDGEPOOL: edgepool::EdgePool = edgepool::EdgePool::new();
static MIMALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
static JEMALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn allocators() -> [(&'static str, &'static (dyn GlobalAlloc + Sync)); 4] {
    [("system", &System), ("mimalloc", &MIMALLOC), ("jemalloc", &JEMALLOC), ("edgepool", &EDGEPOOL)]
}

/// Runs `f` monomorphised for each allocator.
macro_rules! for_each_allocator {
    ($group:expr, $id:expr, $f:ident $(, $arg:expr)*) => {{
        $group.bench_function(BenchmarkId::new("system", $id), |b| $f(b, &System $(, $arg)*));
        $group.bench_function(BenchmarkId::new("mimalloc", $id), |b| $f(b, &MIMALLOC $(, $arg)*));
        $group.bench_function(BenchmarkId::new("jemalloc", $id), |b| $f(b, &JEMALLOC $(, $arg)*));
        $group.bench_function(BenchmarkId::new("edgepool", $id), |b| $f(b, &EDGEPOOL $(, $arg)*));
    }};
}

fn pair<A: GlobalAlloc>(b: &mut criterion::Bencher, a: &A, size: usize) {
    let layout = Layout::from_size_align(size, 8).unwrap();
    b.iter(|| {
        // SAFETY: non-zero size; freed with the same layout.
        unsafe {
            let p = a.alloc(black_box(layout));
            black_box(p).write(1);
            a.dealloc(p, layout);
        }
    });
}

fn sizes_for_batch() -> Vec<Layout> {
    let mut x = 0x9E37_79B9u32;
    (0..1000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            // Mostly small, as real programs: 8..=128 three times in four, up to 1 KiB otherwise.
            let size = if x % 4 != 0 { 8 + (x >> 8) % 121 } else { 8 + (x >> 8) % 1017 };
            Layout::from_size_align(size as usize, 8).unwrap()
        })
        .collect()
}

#[derive(Clone, Copy)]
enum Order {
    Lifo,
    Fifo,
    Random,
}

fn batch<A: GlobalAlloc>(b: &mut criterion::Bencher, a: &A, order: Order) {
    let layouts = sizes_for_batch();
    let mut perm: Vec<usize> = (0..layouts.len()).collect();
    let mut x = 12345u32;
    for i in (1..perm.len()).rev() {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        perm.swap(i, x as usize % (i + 1));
    }
    let mut ptrs = vec![std::ptr::null_mut::<u8>(); layouts.len()];
    b.iter(|| {
        // SAFETY: every pointer is freed once with its own layout.
        unsafe {
            for (i, l) in layouts.iter().enumerate() {
                let p = a.alloc(*l);
                p.write(i as u8);
                ptrs[i] = p;
            }
            match order {
                Order::Lifo => {
                    for i in (0..layouts.len()).rev() {
                        a.dealloc(ptrs[i], layouts[i]);
                    }
                }
                Order::Fifo => {
                    for i in 0..layouts.len() {
                        a.dealloc(ptrs[i], layouts[i]);
                    }
                }
                Order::Random => {
                    for &i in &perm {
                        a.dealloc(ptrs[i], layouts[i]);
                    }
                }
            }
        }
        black_box(&ptrs);
    });
}

fn realloc_growth<A: GlobalAlloc>(b: &mut criterion::Bencher, a: &A) {
    b.iter(|| {
        // SAFETY: the block is reallocated with its current layout and freed at the end.
        unsafe {
            let mut size = 16usize;
            let mut p = a.alloc(Layout::from_size_align(size, 8).unwrap());
            p.write(1);
            while size < 1 << 20 {
                let new = size + size / 2;
                p = a.realloc(p, Layout::from_size_align(size, 8).unwrap(), new);
                p.add(new - 1).write(2);
                size = new;
            }
            a.dealloc(black_box(p), Layout::from_size_align(size, 8).unwrap());
        }
    });
}

struct SendPtr(*mut u8);
// SAFETY: an owned allocation handed to the consumer thread.
unsafe impl Send for SendPtr {}

fn producer_consumer<A: GlobalAlloc + Sync>(b: &mut criterion::Bencher, a: &'static A) {
    b.iter_custom(|iters| {
        let layout = Layout::from_size_align(64, 8).unwrap();
        let (tx, rx) = mpsc::sync_channel::<Vec<SendPtr>>(8);
        let batches = iters.div_ceil(256);
        let start = Instant::now();
        let consumer = std::thread::spawn(move || {
            for batch in rx {
                for p in batch {
                    // SAFETY: allocated by the producer with `layout`.
                    unsafe { a.dealloc(p.0, layout) };
                }
            }
        });
        for _ in 0..batches {
            let mut v = Vec::with_capacity(256);
            for _ in 0..256 {
                // SAFETY: non-zero size.
                let p = unsafe { a.alloc(layout) };
                // SAFETY: fresh 64-byte block.
                unsafe { p.write(7) };
                v.push(SendPtr(p));
            }
            tx.send(v).unwrap();
        }
        drop(tx);
        consumer.join().unwrap();
        let t = start.elapsed();
        // Report per object.
        Duration::from_nanos((t.as_nanos() as u64 * iters / (batches * 256)).max(1))
    });
}

fn bench(c: &mut Criterion) {
    let _ = allocators;
    {
        let mut g = c.benchmark_group("pair");
        for size in [16usize, 48, 64, 128, 256, 512, 1024, 4096] {
            for_each_allocator!(g, size, pair, size);
        }
        g.finish();
    }
    for (name, order) in [("batch_lifo", Order::Lifo), ("batch_fifo", Order::Fifo), ("batch_random", Order::Random)] {
        let mut g = c.benchmark_group(name);
        for_each_allocator!(g, "1000", batch, order);
        g.finish();
    }
    {
        let mut g = c.benchmark_group("realloc_growth");
        for_each_allocator!(g, "16B-1MiB", realloc_growth);
        g.finish();
    }
    {
        let mut g = c.benchmark_group("producer_consumer");
        for_each_allocator!(g, "64B", producer_consumer);
        g.finish();
    }
    {
        let mut g = c.benchmark_group("large");
        for size in [64usize << 10, 1 << 20, 8 << 20] {
            for_each_allocator!(g, size, pair, size);
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1200))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
