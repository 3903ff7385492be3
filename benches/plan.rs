//! Planner benchmarks: the three shared datasets with the default strategy (target: each under 10 ms),
//! and 10 000 random tensors with each strategy (search under a 200 ms budget; target well under 1 s).
//! Run: `cargo bench --bench plan`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use edgepool::plan::{self, Budget, Strategy, Tensor};

fn load(name: &str) -> Vec<Tensor> {
    let path = format!("{}/tests/data/plan/{name}.csv", env!("CARGO_MANIFEST_DIR"));
    plan::csv::parse(&std::fs::read_to_string(path).unwrap(), 1).unwrap()
}

/// 10 000 tensors over 2 000 ops: mostly short-lived activations, some long skips, sizes 1 KiB..4 MiB.
fn random_tensors(n: usize) -> Vec<Tensor> {
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..n)
        .map(|i| {
            let first = (next() % 2000) as u32;
            let len = if next() % 10 == 0 { next() % 200 } else { next() % 4 } as u32;
            Tensor::new(format!("t{i}"), 1024 + next() % (4 << 20), first, first + len)
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("plan_dataset");
    for name in ["mobilenet_v2_224", "unet_512", "deeplabv3_mnv2_513"] {
        let ts = load(name);
        g.bench_function(BenchmarkId::new("search", name), |b| b.iter(|| plan::plan(&ts).unwrap()));
    }
    g.finish();
    let ts = random_tensors(10_000);
    let mut g = c.benchmark_group("plan_random_10k");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    let budget = Budget { max_time: Duration::from_millis(200), ..Budget::default() };
    for s in Strategy::ALL {
        g.bench_function(s.name(), |b| b.iter(|| plan::plan_with(&ts, s, budget).unwrap()));
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    targets = bench
}
criterion_main!(benches);
