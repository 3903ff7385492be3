//! Instances that are hard by construction, made the way the literature makes them: a `bound ×
//! horizon` rectangle (bytes × ops) is cut into tensors, so that every op has exactly `bound` bytes live
//! and the optimum equals the lower bound — but only the arrangement they were cut from (or few others)
//! reaches it.
//!
//! - [`guillotine`]: the rectangle is cut recursively, each cut splitting one piece in two, across the
//!   addresses or across the ops.
//! - [`tiling`]: ops are swept in order; at each op boundary some tiles end, the address holes they
//!   leave (adjacent ones merged) are re-split at new points into tiles that start there. The result
//!   is in general not a guillotine cut.
//!
//! Sizes are multiples of `unit` bytes (tiled or quantised activations come in few sizes). Both are
//! deterministic for a seed.

use super::{Rng, Tensor};

/// Parameters of a generated instance.
#[derive(Clone, Copy, Debug)]
pub struct HardSpec {
    /// Number of tensors (the generator stops at this count).
    pub tensors: usize,
    /// Bytes live at every op: the lower bound and the optimum.
    pub bound: u64,
    /// Granularity of sizes and cuts, in bytes; `bound` is rounded down to a multiple of it.
    pub unit: u64,
    pub seed: u64,
}

impl HardSpec {
    pub fn new(tensors: usize, seed: u64) -> HardSpec {
        HardSpec { tensors, bound: 64 << 20, unit: 4096, seed }
    }

    fn units(&self) -> u64 {
        (self.bound / self.unit.max(1)).max(1)
    }
}

fn rng(seed: u64) -> Rng {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    r.below(2);
    r
}

/// A random cut strictly inside `lo..hi` (which must hold at least two units).
fn cut(r: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + 1 + r.below((hi - lo - 1) as usize) as u64
}

/// Recursive (guillotine) cuts of the `bound × horizon` rectangle into `spec.tensors` tensors; the
/// horizon is about a third of the count.
pub fn guillotine(spec: HardSpec) -> Vec<Tensor> {
    guillotine_with_plan(spec).0
}

/// [`guillotine`], with the offsets it was cut from (a plan of `spec.bound` bytes).
pub fn guillotine_with_plan(spec: HardSpec) -> (Vec<Tensor>, Vec<u64>) {
    let mut r = rng(spec.seed);
    let units = spec.units();
    let horizon = (spec.tensors as u64 / 3).max(2);
    // Pieces: (address lo, hi in units, op lo, hi exclusive).
    let mut pieces: Vec<(u64, u64, u64, u64)> = vec![(0, units, 0, horizon)];
    let mut stuck = 0;
    while pieces.len() < spec.tensors && stuck < 1000 {
        let k = r.below(pieces.len());
        let (a0, a1, t0, t1) = pieces[k];
        let can_addr = a1 - a0 >= 2;
        let can_time = t1 - t0 >= 2;
        let across_addr = match (can_addr, can_time) {
            (false, false) => {
                stuck += 1;
                continue;
            }
            (true, false) => true,
            (false, true) => false,
            // Cut the longer side more often (relative to the whole), so pieces stay varied.
            (true, true) => {
                let fa = (a1 - a0) as f64 / units as f64;
                let ft = (t1 - t0) as f64 / horizon as f64;
                (r.below(1000) as f64) < 1000.0 * fa / (fa + ft)
            }
        };
        if across_addr {
            let c = cut(&mut r, a0, a1);
            pieces[k] = (a0, c, t0, t1);
            pieces.push((c, a1, t0, t1));
        } else {
            let c = cut(&mut r, t0, t1);
            pieces[k] = (a0, a1, t0, c);
            pieces.push((a0, a1, c, t1));
        }
    }
    let tensors = pieces
        .iter()
        .enumerate()
        .map(|(i, &(a0, a1, t0, t1))| Tensor::new(format!("g{i}"), (a1 - a0) * spec.unit, t0 as u32, (t1 - 1) as u32))
        .collect();
    (tensors, pieces.iter().map(|p| p.0 * spec.unit).collect())
}

/// Tiles re-split at every op boundary (not in general a guillotine cut) into `spec.tensors` tensors.
pub fn tiling(spec: HardSpec) -> Vec<Tensor> {
    tiling_with_plan(spec).0
}

/// [`tiling`], with the offsets it was cut from (a plan of `spec.bound` bytes).
pub fn tiling_with_plan(spec: HardSpec) -> (Vec<Tensor>, Vec<u64>) {
    let mut r = rng(spec.seed ^ 0x7111);
    let units = spec.units();
    let mut out: Vec<Tensor> = Vec::with_capacity(spec.tensors);
    let mut offsets: Vec<u64> = Vec::with_capacity(spec.tensors);
    // Live tiles, in address order: (address lo, hi in units, first op).
    let mut live: Vec<(u64, u64, u32)> = Vec::new();
    let split = |r: &mut Rng, lo: u64, hi: u64, op: u32, into: &mut Vec<(u64, u64, u32)>| {
        let pieces = 1 + r.below(3) as u64;
        let mut cuts: Vec<u64> = (1..pieces.min(hi - lo)).map(|_| cut(r, lo, hi)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut at = lo;
        for c in cuts.into_iter().chain(std::iter::once(hi)) {
            into.push((at, c, op));
            at = c;
        }
    };
    split(&mut r, 0, units, 0, &mut live);
    let mut op = 0u32;
    while out.len() + live.len() < spec.tensors {
        op += 1;
        // Each tile ends here with probability 1/3 (at least one does).
        let forced = r.below(live.len());
        let mut next: Vec<(u64, u64, u32)> = Vec::with_capacity(live.len() + 4);
        let mut hole: Option<(u64, u64)> = None;
        for (k, &(lo, hi, first)) in live.iter().enumerate() {
            if k == forced || r.below(3) == 0 {
                out.push(Tensor::new(format!("h{}", out.len()), (hi - lo) * spec.unit, first, op - 1));
                offsets.push(lo * spec.unit);
                hole = Some(hole.map_or((lo, hi), |(l, _)| (l, hi)));
            } else {
                if let Some((l, h)) = hole.take() {
                    split(&mut r, l, h, op, &mut next);
                }
                next.push((lo, hi, first));
            }
        }
        if let Some((l, h)) = hole {
            split(&mut r, l, h, op, &mut next);
        }
        live = next;
    }
    for (lo, hi, first) in live {
        out.push(Tensor::new(format!("h{}", out.len()), (hi - lo) * spec.unit, first, op));
        offsets.push(lo * spec.unit);
    }
    (out, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_holds_exactly_the_bound() {
        for seed in 0..20 {
            for (kind, ts) in
                [("guillotine", guillotine(HardSpec::new(120, seed))), ("tiling", tiling(HardSpec::new(120, seed)))]
            {
                let spec = HardSpec::new(120, seed);
                assert!(ts.len() >= 120 && ts.len() <= 150, "{kind} {seed}: {} tensors", ts.len());
                let ops = ts.iter().map(|t| t.last).max().unwrap();
                for op in 0..=ops {
                    let live: u64 = ts.iter().filter(|t| t.first <= op && op <= t.last).map(|t| t.size).sum();
                    assert_eq!(live, spec.bound, "{kind} seed {seed} op {op}");
                }
                assert!(ts.iter().all(|t| t.size > 0 && t.size % spec.unit == 0));
                assert_eq!(super::super::lower_bound(&ts), spec.bound);
                let plan = if kind == "tiling" { tiling_with_plan(spec).1 } else { guillotine_with_plan(spec).1 };
                super::super::validate(&ts, &plan, spec.bound).unwrap();
            }
        }
    }

    #[test]
    fn same_seed_same_instance() {
        assert_eq!(tiling(HardSpec::new(200, 7)), tiling(HardSpec::new(200, 7)));
        assert_ne!(tiling(HardSpec::new(200, 7)), tiling(HardSpec::new(200, 8)));
        assert_eq!(guillotine(HardSpec::new(200, 7)), guillotine(HardSpec::new(200, 7)));
    }
}
