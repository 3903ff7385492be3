//! Coverage-guided fuzzing of the memory planner (`edgepool::plan`): the fuzzer's bytes are a list of
//! tensors (sizes from zero to near `u64::MAX`, lifetimes dense, short, spread over the whole `u32`
//! range or at its very end, alignments good and bad) and a strategy. Every strategy must answer
//! an invalid list with its error and a valid one with a valid plan, and never panic. A plan's
//! figures are checked against this file's own sums: the lower bound (the most bytes live at one
//! op, summed at each tensor's first op), the naive total, the arena (the highest end), and the
//! claims of `proven_optimal` and `best_bound` (against the optimum itself, found by trying every
//! order, for up to six tensors). A small plan's arena (`PlannedArena`) is made, and
//! the tensors live at each op write and read back their slices. Run with
//! `scripts/fuzz.sh SECONDS 1 plan`. With bit 0x20 of the first byte, the list is instead a hard
//! instance of `edgepool::plan::hard`, changed here and there (`generated`).
#![no_main]

use edgepool::plan::hard::{self, HardSpec};
use edgepool::plan::{
    lower_bound, naive_total, plan_with, validate, ArenaError, Budget, PlanError, PlannedArena, Strategy, Tensor,
};
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

/// Bytes per tensor in the input.
const RECORD: usize = 8;
/// Tensors at most (the search's cost grows fast with their number).
const MAX_TENSORS: usize = 40;

fn tensor(k: usize, r: &[u8]) -> Tensor {
    let (s, f, l) =
        (u16::from_le_bytes([r[0], r[1]]), u16::from_le_bytes([r[2], r[3]]), u16::from_le_bytes([r[4], r[5]]));
    let (a, kind) = (r[6], r[7]);
    let size = match kind & 3 {
        0 => s as u64,
        1 => (s as u64) << 12,
        2 => u64::MAX >> (s % 64),
        _ => 0,
    };
    let (first, last) = match (kind >> 2) & 3 {
        // Dense, in any order (`last < first` is an error).
        0 => (f as u32 % 64, l as u32 % 64),
        // Short lifetimes.
        1 => (f as u32 % 256, f as u32 % 256 + l as u32 % 4),
        // Spread over the whole range of op numbers.
        2 => (f as u32 * 65_537, (f as u32 * 65_537).saturating_add(l as u32 * 65_537)),
        // At the very end of it.
        _ => (u32::MAX - f as u32 % 8, u32::MAX - (f as u32 % 8).min(l as u32 % 8)),
    };
    let align = match a {
        0..=127 => 1,
        255 => 0,
        254 => 3 << (a % 8),
        _ => 1u64 << (a % 66).min(63),
    };
    Tensor { align, ..Tensor::new(format!("t{k}"), size, first, last) }
}

/// An instance of `edgepool::plan::hard` (full at every op, so the tiling search runs too) from the
/// first 11 bytes (count, unit, bound, seed; the seed's lowest bit picks tiling or guillotine cuts),
/// then changed by each 3 bytes after them: a tensor made smaller, living an op longer, or given an
/// alignment (which leaves room at some ops, for the other searches).
fn generated(r: &[u8]) -> Vec<Tensor> {
    let Some((spec, edits)) = r.split_first_chunk::<11>() else { return Vec::new() };
    let seed = u64::from_le_bytes(spec[3..11].try_into().expect("8 bytes"));
    let hard = HardSpec {
        tensors: 1 + spec[0] as usize % 150,
        unit: 1 << (spec[1] % 16),
        bound: (1 + spec[2] as u64 % 64) << (spec[1] % 16 + spec[1] / 16),
        seed,
    };
    let mut ts = if seed & 1 == 0 { hard::tiling(hard) } else { hard::guillotine(hard) };
    for e in edits.chunks_exact(3) {
        let n = ts.len();
        let t = &mut ts[e[0] as usize % n];
        match e[1] % 3 {
            0 => t.size -= t.size * (e[2] as u64 % 8) / 8,
            1 => t.last = t.last.saturating_add(1),
            _ => t.align = 1 << (e[2] % 24),
        }
    }
    ts
}

/// The smallest arena of any plan, for a few tensors: the lowest-offset fit over every order (the
/// order of an optimal plan's offsets gives every tensor its offset there or lower). Tensors of no
/// bytes are in no one's way, as `validate` has it.
fn optimum(ts: &[Tensor]) -> u64 {
    fn fit(ts: &[Tensor], order: &[usize]) -> u64 {
        let mut placed: Vec<(usize, u64)> = Vec::new();
        let mut top = 0;
        for &i in order {
            let t = &ts[i];
            let up = |x: u64| x.div_ceil(t.align).saturating_mul(t.align);
            let clear = |x: u64| {
                t.size == 0
                    || placed.iter().all(|&(j, o)| {
                        let u = &ts[j];
                        u.size == 0
                            || u.last < t.first
                            || t.last < u.first
                            || o.saturating_add(u.size) <= x
                            || x.saturating_add(t.size) <= o
                    })
            };
            let off = std::iter::once(0)
                .chain(placed.iter().map(|&(j, o)| up(o.saturating_add(ts[j].size))))
                .filter(|&x| clear(x))
                .min()
                .expect("above every placed tensor is clear");
            top = top.max(off.saturating_add(t.size));
            placed.push((i, off));
        }
        top
    }
    fn orders(k: usize, order: &mut Vec<usize>, ts: &[Tensor], best: &mut u64) {
        if k == order.len() {
            *best = (*best).min(fit(ts, order));
            return;
        }
        for j in k..order.len() {
            order.swap(k, j);
            orders(k + 1, order, ts, best);
            order.swap(k, j);
        }
    }
    let mut best = u64::MAX;
    orders(0, &mut (0..ts.len()).collect(), ts, &mut best);
    best
}

/// The most bytes live at one op: the peak is at some tensor's first op.
fn peak(ts: &[Tensor]) -> u64 {
    ts.iter()
        .map(|at| ts.iter().filter(|t| t.first <= at.first && at.first <= t.last).map(|t| t.size).sum())
        .max()
        .unwrap_or(0)
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else { return };
    let strategy = Strategy::ALL[head as usize % Strategy::ALL.len()];
    let ts: Vec<Tensor> = if head & 0x20 != 0 {
        generated(rest)
    } else {
        rest.chunks_exact(RECORD).take(MAX_TENSORS).enumerate().map(|(k, r)| tensor(k, r)).collect()
    };
    let budget = Budget {
        max_steps: 300,
        max_nodes: 2_000,
        max_time: Duration::from_millis(if head & 0x80 != 0 { 5 } else { 30 }),
        seed: head as u64,
    };
    let result = plan_with(&ts, strategy, budget);
    let bad = ts.iter().any(|t| t.last < t.first || !t.align.is_power_of_two());
    let overflow = ts.iter().try_fold(0u64, |acc, t| acc.checked_add(t.size)?.checked_add(t.align)).is_none();
    // Either error where the list has both faults (the first one met is reported).
    match (bad, overflow) {
        (false, false) => {}
        (true, false) => {
            assert!(matches!(result, Err(PlanError::BadTensor { .. })), "{strategy:?} {ts:?}: {result:?}");
            return;
        }
        (false, true) => {
            assert!(matches!(result, Err(PlanError::Overflow)), "{strategy:?} {ts:?}: {result:?}");
            return;
        }
        (true, true) => {
            assert!(
                matches!(result, Err(PlanError::BadTensor { .. } | PlanError::Overflow)),
                "{strategy:?} {ts:?}: {result:?}"
            );
            return;
        }
    }
    let p = match result {
        Ok(p) => p,
        Err(e) => panic!("{strategy:?} {ts:?}: {e}"),
    };
    validate(&ts, &p.offsets, p.arena_size).unwrap_or_else(|e| panic!("{strategy:?} {ts:?}: {e}"));
    let lb = peak(&ts);
    let top = ts.iter().zip(&p.offsets).map(|(t, &o)| o + t.size).max().unwrap_or(0);
    assert_eq!(lower_bound(&ts), lb, "{ts:?}");
    assert_eq!(p.lower_bound, lb, "{strategy:?} {ts:?}");
    assert_eq!(p.naive_total, ts.iter().map(|t| t.size).sum::<u64>(), "{ts:?}");
    assert_eq!(naive_total(&ts), p.naive_total);
    assert_eq!(p.arena_size, top, "{strategy:?} {ts:?}: the arena is the highest end");
    assert!(lb <= p.best_bound && p.best_bound <= p.arena_size, "{strategy:?} {ts:?}: {p:?}");
    assert_eq!(p.proven_optimal, p.best_bound == p.arena_size, "{strategy:?} {ts:?}: {p:?}");
    if p.arena_size == lb {
        assert!(p.proven_optimal, "{strategy:?} {ts:?}: {p:?}");
    }
    if ts.len() <= 6 {
        // What is proven must hold: the best bound is no higher than the optimum, and a plan proven
        // optimal is at it.
        let opt = optimum(&ts);
        assert!(p.best_bound <= opt && opt <= p.arena_size, "{strategy:?} {ts:?}: {p:?}, optimum {opt}");
        assert!(!p.proven_optimal || p.arena_size == opt, "{strategy:?} {ts:?}: {p:?}, optimum {opt}");
    }
    assert_eq!(p.strategy, strategy);
    // The arena of a small plan (any alignment: one the allocator cannot give is an error, not a
    // crash): each tensor's slice where the plan put it, and the tensors live at one op each
    // keeping their own bytes.
    if p.arena_size <= 1 << 20 {
        match PlannedArena::new(&ts, &p, head & 0x40 != 0) {
            Err(ArenaError::OutOfMemory { .. }) => {}
            Err(e) => panic!("{ts:?}: {e}"),
            Ok(mut arena) => {
                assert_eq!(arena.size() as u64, p.arena_size);
                assert_eq!(arena.as_ptr() as usize % arena.align(), 0);
                for (k, (t, &o)) in ts.iter().zip(&p.offsets).enumerate() {
                    // Ids are unique here (`t{k}`, or the generator's numbering).
                    assert_eq!(arena.range(&t.id), Some((o as usize, t.size as usize)), "{k}");
                }
                for at in &ts {
                    let live: Vec<&Tensor> = ts.iter().filter(|t| t.first <= at.first && at.first <= t.last).collect();
                    for (k, t) in live.iter().enumerate() {
                        arena.slice_mut(&t.id).expect("every id").fill(k as u8);
                    }
                    for (k, t) in live.iter().enumerate() {
                        assert!(arena.slice(&t.id).expect("every id").iter().all(|&b| b == k as u8), "{ts:?}");
                    }
                }
            }
        }
    }
});
