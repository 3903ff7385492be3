//! Planner benchmarks. Run: `cargo bench --bench plan` (about three minutes).
//!
//! 1. Instances hard by construction (`edgepool::plan::hard`, optimum = lower bound): one run each of
//!    greedy (the better of TensorFlow Lite's two), `search` (1 s) and `exact` (2 s), printed as a
//!    Markdown table of ratios to the optimum and times, and how many reach the bound and end within
//!    1.05x (set `PLAN_HARD=0` to skip it; `PLAN_SEEDS=3-12` for other seeds than 0-2;
//!    `PLAN_SIZES=400` for only the instances of 400 tensors).
//!    `PLAN_SEARCH_SEEDS=1,2,3` then runs `search` again on every instance once per seed of the
//!    search (`Budget::seed`) and prints each seed's counts and their mean: on a quiet machine,
//!    repeated runs of one seed repeat one another, so a comparison of two versions of the search
//!    needs several seeds of it.
//! 2. criterion: every dataset of `tests/data/plan` with `search` and `exact` (target: under 10 ms),
//!    and 10 000 random tensors with each strategy (200 ms budget).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use edgepool::plan::{self, Budget, Strategy, Tensor};

fn load(name: &str) -> Vec<Tensor> {
    let path = format!("{}/../tests/data/plan/{name}.csv", env!("CARGO_MANIFEST_DIR"));
    edgepool_plan::read_csv(&std::fs::read_to_string(path).unwrap(), 1).unwrap()
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

/// The seeds of the hard instances: `PLAN_SEEDS` as `first-last` (inclusive), 0-2 by default.
fn seeds() -> std::ops::RangeInclusive<u64> {
    let var = std::env::var("PLAN_SEEDS").unwrap_or_default();
    match var.split_once('-').map(|(a, b)| (a.trim().parse(), b.trim().parse())) {
        Some((Ok(a), Ok(b))) if a <= b => a..=b,
        _ if var.is_empty() => 0..=2,
        _ => panic!("PLAN_SEEDS={var}: expected first-last, e.g. 3-12"),
    }
}

/// The tensor counts of the hard instances: `PLAN_SIZES` as a comma list, 40, 100, 200 and 400 by
/// default.
fn sizes() -> Vec<usize> {
    list("PLAN_SIZES").unwrap_or_else(|| vec![40, 100, 200, 400])
}

/// A comma list of numbers from the environment variable `var`, `None` where it is not set.
fn list<T: std::str::FromStr>(var: &str) -> Option<Vec<T>> {
    let v = std::env::var(var).ok().filter(|v| !v.trim().is_empty())?;
    Some(
        v.split(',').map(|x| x.trim().parse().unwrap_or_else(|_| panic!("{var}={v}: expected a comma list"))).collect(),
    )
}

/// The hard instances of the chosen sizes and seeds: (name, tensors, optimum).
fn hard_instances() -> Vec<(String, Vec<Tensor>, u64)> {
    use edgepool::plan::hard::{guillotine, tiling, HardSpec};
    let mut out = Vec::new();
    for kind in ["guillotine", "tiling"] {
        for &n in &sizes() {
            for seed in seeds() {
                let spec = HardSpec::new(n, seed);
                let ts = if kind == "guillotine" { guillotine(spec) } else { tiling(spec) };
                out.push((format!("{kind} {n}/{seed}"), ts, spec.bound));
            }
        }
    }
    out
}

/// `search` (1 s) on every one of `instances` (from [`hard_instances`]) once per seed of the search:
/// per seed, the plans at the bound, within 1.05x of it and the geometric mean of the ratios; then
/// the means of the three over the seeds.
fn search_seeds(instances: &[(String, Vec<Tensor>, u64)], seeds_of_search: &[u64]) {
    let count = instances.len() as f64;
    let (mut at_sum, mut within_sum, mut gm_sum) = (0.0, 0.0, 0.0);
    for &seed in seeds_of_search {
        let (mut at_bound, mut within, mut log_sum) = (0, 0, 0.0);
        for (_, ts, opt) in instances {
            let budget = Budget { max_time: Duration::from_millis(1000), seed, ..Budget::default() };
            let p = plan::plan_with(ts, Strategy::Search, budget).unwrap();
            let r = p.arena_size as f64 / *opt as f64;
            at_bound += (p.arena_size == *opt) as u32;
            within += (r <= 1.05) as u32;
            log_sum += r.ln();
        }
        let gm = (log_sum / count).exp();
        println!("search (1 s), seed {seed}: {at_bound}/{count} at the bound, {within}/{count} within 1.05x, geometric mean {gm:.4}");
        at_sum += at_bound as f64;
        within_sum += within as f64;
        gm_sum += gm;
    }
    let k = seeds_of_search.len() as f64;
    println!(
        "search (1 s), mean of {k} seeds: {:.1} at the bound, {:.1} within 1.05x, geometric means {:.4}",
        at_sum / k,
        within_sum / k,
        gm_sum / k
    );
}

/// One run per instance and strategy: the plan's ratio to the optimum and the time it took.
fn hard_table() {
    use std::time::Instant;
    println!("| instance | tensors | greedy | search (1 s) | search ms | exact (2 s) | exact ms | proven |");
    println!("|---|---|---|---|---|---|---|---|");
    let (mut gsum, mut ssum, mut esum, mut count, mut proven) = (0.0, 0.0, 0.0, 0.0, 0);
    // Search (1 s): plans at the bound, and within 1.05x of it (the target of the hard instances).
    let (mut at_bound, mut within) = (0, 0);
    let instances = hard_instances();
    for (name, ts, bound) in &instances {
        let (ts, bound) = (ts.as_slice(), *bound);
        let opt = bound as f64;
        let run = |s: Strategy, ms: u64| {
            let t0 = Instant::now();
            let p =
                plan::plan_with(ts, s, Budget { max_time: Duration::from_millis(ms), ..Budget::default() }).unwrap();
            (p.arena_size as f64 / opt, t0.elapsed().as_secs_f64() * 1e3, p.proven_optimal, p.arena_size == bound)
        };
        let g = run(Strategy::GreedyBySize, 0).0.min(run(Strategy::GreedyByBreadth, 0).0);
        let (s, s_ms, _, s_at_bound) = run(Strategy::Search, 1000);
        let (e, e_ms, e_proven, _) = run(Strategy::Exact, 2000);
        println!(
            "| {name} | {} | {g:.3} | {s:.3} | {s_ms:.1} | {e:.3} | {e_ms:.1} | {} |",
            ts.len(),
            if e_proven { "yes" } else { "no" }
        );
        gsum += g.ln();
        ssum += s.ln();
        esum += e.ln();
        count += 1.0;
        proven += e_proven as u32;
        at_bound += s_at_bound as u32;
        within += (s <= 1.05) as u32;
    }
    let gm = |x: f64| (x / count).exp();
    println!("| geometric mean | | {:.3} | {:.3} | | {:.3} | | {proven}/{count} |", gm(gsum), gm(ssum), gm(esum));
    println!();
    println!("search (1 s): {at_bound}/{count} at the bound, {within}/{count} within 1.05x of it");
    if let Some(search) = list::<u64>("PLAN_SEARCH_SEEDS") {
        search_seeds(&instances, &search);
    }
}

fn bench(c: &mut Criterion) {
    if std::env::var("PLAN_HARD").map_or(true, |v| v != "0") {
        hard_table();
    }
    let mut g = c.benchmark_group("plan_dataset");
    let dir = format!("{}/../tests/data/plan", env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok()?.strip_suffix(".csv").map(str::to_owned))
        .collect();
    names.sort();
    for name in &names {
        let ts = load(name);
        for s in [Strategy::Search, Strategy::Exact] {
            g.bench_function(BenchmarkId::new(s.name(), name), |b| {
                b.iter(|| plan::plan_with(&ts, s, Budget::exact()).unwrap())
            });
        }
    }
    g.finish();
    let ts = random_tensors(10_000);
    let mut g = c.benchmark_group("plan_random_10k");
    g.sample_size(10).measurement_time(Duration::from_secs(8));
    let budget = Budget { max_time: Duration::from_millis(200), ..Budget::default() };
    for s in [Strategy::GreedyBySize, Strategy::GreedyByBreadth, Strategy::Search] {
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
