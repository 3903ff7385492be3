//! The planner on instances that are hard by construction (`edgepool::plan::hard`): the optimum is the
//! lower bound, reached by one tight arrangement. Small ones are solved and proven optimal; larger ones
//! give valid plans, never worse than greedy, within a ratio of the optimum. Plans are reproducible
//! when node and step limits end the search.

use std::time::Duration;

use edgepool::plan::hard::{guillotine, tiling, HardSpec};
use edgepool::plan::{self, Budget, Strategy, Tensor};

fn both(n: usize, seed: u64) -> [(&'static str, Vec<Tensor>); 2] {
    [("guillotine", guillotine(HardSpec::new(n, seed))), ("tiling", tiling(HardSpec::new(n, seed)))]
}

#[test]
fn small_hard_instances_are_solved_and_proven_optimal() {
    // The proof, not the time, is what this checks, so the limit is far off: all 32 take about 0.6 s
    // in a release build here (tiling 40/7 alone took 8-10 s before the sweep's look-ahead, and a
    // slow moment of a shared machine once stopped it short of `Budget::exact()`'s 10 s).
    let budget = Budget { max_time: Duration::from_secs(120), ..Budget::exact() };
    for n in [30, 40] {
        for seed in 0..8 {
            for (kind, ts) in both(n, seed) {
                let p = plan::plan_with(&ts, Strategy::Exact, budget).unwrap();
                plan::validate(&ts, &p.offsets, p.arena_size).unwrap();
                assert_eq!(p.arena_size, HardSpec::new(n, seed).bound, "{kind} n={n} seed={seed}");
                assert!(p.proven_optimal, "{kind} n={n} seed={seed}");
                assert_eq!(p.best_bound, p.arena_size);
            }
        }
    }
}

#[test]
fn larger_hard_instances_beat_greedy_within_a_second() {
    let budget = Budget { max_time: Duration::from_secs(1), ..Budget::default() };
    let (mut greedy_sum, mut search_sum, mut count) = (0.0, 0.0, 0.0);
    for n in [100, 200, 400] {
        for seed in 0..3 {
            for (kind, ts) in both(n, seed) {
                let bound = HardSpec::new(n, seed).bound as f64;
                let g = plan::plan_with(&ts, Strategy::GreedyBySize, budget).unwrap();
                let b = plan::plan_with(&ts, Strategy::GreedyByBreadth, budget).unwrap();
                let s = plan::plan_with(&ts, Strategy::Search, budget).unwrap();
                plan::validate(&ts, &s.offsets, s.arena_size).unwrap();
                assert!(s.arena_size <= g.arena_size.min(b.arena_size), "{kind} n={n} seed={seed}");
                assert!(s.best_bound <= s.arena_size && s.best_bound as f64 >= bound);
                // Measured here at up to 1.10 (README); a wide margin for a loaded machine.
                let ratio = s.arena_size as f64 / bound;
                assert!(ratio <= 1.2, "{kind} n={n} seed={seed}: {ratio:.4}");
                greedy_sum += g.arena_size.min(b.arena_size) as f64 / bound;
                search_sum += ratio;
                count += 1.0;
            }
        }
    }
    let (greedy, search) = (greedy_sum / count, search_sum / count);
    assert!(search < 1.0 + (greedy - 1.0) / 2.0, "search {search:.4} against greedy {greedy:.4}: not half the excess");
}

#[test]
fn hard_instances_of_100_and_200_tensors_end_within_1_05_and_mostly_at_the_bound_under_fixed_limits() {
    // The ratio, on any machine: node and step limits, not the clock, end the search (the
    // time limit is far off), so the plans are the same everywhere. Measured when written: 15 of the
    // 16 at the bound, tiling 200/2 at 1.034; 0.6 s at most per instance in a release build, 12 s
    // for all in a debug one. (At 1 s instead, the bench's seeds 0-12 end within 1.05x on all 52
    // instances of these sizes; 400 tensors take longer than a test should.)
    let budget = Budget { max_nodes: 50_000, max_steps: 20_000, max_time: Duration::from_secs(120), seed: 1 };
    let mut at_bound = 0;
    for n in [100, 200] {
        for seed in 0..4 {
            for (kind, ts) in both(n, seed) {
                let bound = HardSpec::new(n, seed).bound;
                let p = plan::plan_with(&ts, Strategy::Search, budget).unwrap();
                plan::validate(&ts, &p.offsets, p.arena_size).unwrap();
                let ratio = p.arena_size as f64 / bound as f64;
                assert!(ratio <= 1.05, "{kind} n={n} seed={seed}: {ratio:.4}");
                at_bound += usize::from(p.arena_size == bound);
            }
        }
    }
    assert!(at_bound >= 12, "only {at_bound} of 16 at the bound");
}

#[test]
fn plans_are_reproducible_under_node_and_step_limits() {
    let ts = tiling(HardSpec::new(100, 0));
    let budget = Budget { max_nodes: 20_000, max_steps: 2_000, max_time: Duration::from_secs(120), seed: 9 };
    let a = plan::plan_with(&ts, Strategy::Search, budget).unwrap();
    let b = plan::plan_with(&ts, Strategy::Search, budget).unwrap();
    assert_eq!(a, b);
}

#[test]
fn exact_reports_its_bound_when_it_stops_at_the_limit() {
    let ts = tiling(HardSpec::new(400, 3));
    let budget = Budget { max_time: Duration::from_millis(300), ..Budget::exact() };
    let p = plan::plan_with(&ts, Strategy::Exact, budget).unwrap();
    plan::validate(&ts, &p.offsets, p.arena_size).unwrap();
    if p.proven_optimal {
        assert_eq!(p.arena_size, p.best_bound);
    } else {
        assert!(p.best_bound >= p.lower_bound && p.best_bound < p.arena_size);
    }
}

/// A hard instance with slack: a fifth of its tensors (picked by `seed`) shrunk by a quarter.
fn with_slack(mut ts: Vec<Tensor>, seed: u64) -> Vec<Tensor> {
    let mut r = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for t in ts.iter_mut() {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        if r % 5 == 0 {
            t.size = (t.size * 3 / 4).max(1);
        }
    }
    ts
}

#[test]
fn point_searches_at_the_bound_run_on_every_preorder_before_the_sweeps() {
    // Where sections have room to spare, a sweep node checks every section of the placed tensor's
    // lifetime and costs several point-search nodes, and the sweep rarely ends at the bound; a point
    // search on one of the preorders often does. Each round of the branch and bound now starts with
    // the point searches on all its preorders. These four reach their lower bound within 3 000
    // nodes; with a sweep before each preorder's point search, none did (and MiniMalloc's
    // benchmark instance "challenging/B" took 290-410 ms, past the default 500 ms budget's half for
    // the branch and bound: 26-36 ms now).
    let budget = Budget { max_nodes: 3_000, max_steps: 0, max_time: Duration::from_secs(120), seed: 1 };
    for (kind, n, seed) in [("tiling", 100, 5), ("tiling", 100, 7), ("tiling", 200, 6), ("guillotine", 200, 7)] {
        let spec = HardSpec::new(n, seed);
        let ts = with_slack(if kind == "tiling" { tiling(spec) } else { guillotine(spec) }, seed);
        let p = plan::plan_with(&ts, Strategy::Search, budget).unwrap();
        plan::validate(&ts, &p.offsets, p.arena_size).unwrap();
        assert_eq!(p.arena_size, plan::lower_bound(&ts), "{kind} {n}/{seed}");
        assert!(p.proven_optimal, "{kind} {n}/{seed}");
    }
}
