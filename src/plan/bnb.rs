//! Exact search for plans: a branch and bound over the lowest point of the skyline, in the family of
//! MiniMalloc (Moffitt, ASPLOS 2023: search over canonical solutions with inference per section), and
//! a time sweep for the instances whose every op is full.
//!
//! **Sections.** Ops are compressed into sections: maximal runs of ops with the same live tensors.
//!
//! **The point search (`Search`).** The state is a floor per section (the highest end placed there,
//! or more where space was left empty). At the lowest floor `m` among sections with tensors left to
//! place, pick the section where fewest tensors can start (ties: earliest), and branch: either one of
//! the tensors covering it starts exactly at `m` (every floor under its lifetime is at most `m`, and
//! its alignment allows it), or nothing starts there and its floor rises to the lowest offset the
//! lowest tensor covering it could then take. Completeness, by induction on any valid plan P: every
//! floor stays at or below the offset in P of every unplaced tensor covering it; the tensor of P
//! starting at `(section, m)`, if any, has everything below it placed (all unplaced tensors lie at `m`
//! or above) and is therefore a branch. So the search explores every plan's shape; tensors alike in
//! size, lifetime and alignment are tried once.
//!
//! **The canonical search** (`Search::canon`, MiniMalloc's own branching): each node places the
//! next tensor at its lowest offset, in the order of offsets, with dominance pruning. The driver
//! uses it above the bound on instances where fewer than half of the sections are full, where the
//! skyline branching needs a node for each step of the room it climbs.
//!
//! **Pruning** (inference per section): a section's unplaced bytes lie above its floor and above the
//! lowest offset any of its unplaced tensors can take, so that plus its unplaced bytes must fit the
//! capacity. `Domains` sharpens "the lowest offset a tensor can take" with subset sums where sections
//! have little spare room.
//!
//! **The sweep (`Sweep`).** Sections in time order, each starting tensor into the free holes. When
//! every section is full at the capacity, every hole is exactly tiled by the tensors that start
//! there. Four things make it fast on full instances: a look-ahead after each placement (in every
//! section of the tensor's lifetime, each free interval must be a subset sum of the sizes still to
//! come there), the hole with fewest candidates filled first, adjacent tensors of one lifetime
//! searched in one order only, and backjumping: a dead end goes back to the latest placement that
//! bounds the free intervals it failed on, past the placements in between. That skips placements
//! that could have changed the outcome (one of them could have gone into the interval), so the
//! sweep is a heuristic, used for plans, never for proofs.
//!
//! **Driver.** A decision search (is there a plan within `cap`?) at the lower bound, by the sweep and
//! by the point search, and an optimisation search (`cap` = best known − 1, lowered at each plan
//! found), alternate over several preorders (fixed ones, then random ones, new in every round) with
//! node limits that double each round: restarts. Each round starts with the point searches at the
//! bound on all its preorders, then the sweeps: on instances with room to spare a point search often
//! ends at the bound within a few hundred nodes, and a sweep node costs several point nodes there.
//! The sweep gets its nodes in the share of the sections that are full at the bound (all of them
//! on the instances hard by construction; 2 of 211 on MiniMalloc's "challenging/J", where its
//! nodes took most of the time and found nothing). A point search that ends without hitting its node
//! limit has explored every plan within its capacity: its answer is a proof.

use std::time::Instant;

use super::{Rng, Tensor};

const NONE: u64 = u64::MAX;

/// Random preorders tried in each round of the driver, after the fixed ones.
const RANDOM_PREORDERS: usize = 4;
/// The sweep's node limit, in units of the round's limit (the point searches get one each): the
/// sweep is the search that reaches the bound of tiled instances.
const SWEEP_NODES: u64 = 4;
/// Tensors beyond which the branch and bound is not tried (its tables grow with the overlaps).
pub(super) const MAX_TENSORS: usize = 4000;
/// Section memberships beyond which it is not tried.
const MAX_ENTRIES: usize = 16 << 20;
/// Depth of the search (placements and decisions to leave space empty) beyond which it gives up; the
/// search runs on a thread whose stack holds this many frames.
const MAX_DEPTH: u32 = 100_000;
const STACK_BYTES: usize = 256 << 20;

/// The instance, compressed to sections.
///
/// Invariants: `lo[b] < hi[b] <= nsec`; `members[s]` lists the tensors whose range contains `s`, `starts[s]`
/// those whose range starts there; every size is > 0
/// (zero-sized tensors go at offset 0 and are left out).
struct Problem {
    /// Index of each problem tensor in the caller's slice.
    index: Vec<usize>,
    size: Vec<u64>,
    align: Vec<u64>,
    lo: Vec<u32>,
    hi: Vec<u32>,
    members: Vec<Vec<u32>>,
    /// The tensors whose range starts at each section.
    starts: Vec<Vec<u32>>,
    /// Bytes live in each section.
    section_total: Vec<u64>,
}

impl Problem {
    fn new(tensors: &[Tensor]) -> Option<Problem> {
        let index: Vec<usize> = (0..tensors.len()).filter(|&i| tensors[i].size > 0).collect();
        if index.len() > MAX_TENSORS {
            return None;
        }
        let mut points: Vec<u64> = Vec::with_capacity(index.len() * 2);
        for &i in &index {
            points.push(tensors[i].first as u64);
            points.push(tensors[i].last as u64 + 1);
        }
        points.sort_unstable();
        points.dedup();
        let nsec = points.len().saturating_sub(1);
        let at = |p: u64| points.binary_search(&p).expect("every end point was collected") as u32;
        let lo: Vec<u32> = index.iter().map(|&i| at(tensors[i].first as u64)).collect();
        let hi: Vec<u32> = index.iter().map(|&i| at(tensors[i].last as u64 + 1)).collect();
        let n = index.len();
        let mut entries = 0usize;
        let mut members = vec![Vec::new(); nsec];
        let mut section_total = vec![0u64; nsec];
        for b in 0..n {
            entries += (hi[b] - lo[b]) as usize;
            if entries > MAX_ENTRIES {
                return None;
            }
            for s in lo[b]..hi[b] {
                members[s as usize].push(b as u32);
                section_total[s as usize] += tensors[index[b]].size;
            }
        }
        let mut starts = vec![Vec::new(); nsec];
        for b in 0..n {
            starts[lo[b] as usize].push(b as u32);
        }
        Some(Problem {
            starts,
            size: index.iter().map(|&i| tensors[i].size).collect(),
            align: index.iter().map(|&i| tensors[i].align.max(1)).collect(),
            index,
            lo,
            hi,
            members,
            section_total,
        })
    }

    fn len(&self) -> usize {
        self.size.len()
    }

    /// Preorders (a rank per tensor), in the order the driver tries them: by the fullest section a
    /// tensor is in, by size, by area, by lifetime.
    fn preorders(&self) -> Vec<Vec<u32>> {
        let n = self.len();
        let span = |b: usize| (self.hi[b] - self.lo[b]) as u64;
        let fullest: Vec<u64> = (0..n)
            .map(|b| (self.lo[b]..self.hi[b]).map(|s| self.section_total[s as usize]).max().unwrap_or(0))
            .collect();
        type Key = (u64, u64, u64);
        let keys: [&dyn Fn(usize) -> Key; 4] = [
            &|b| (fullest[b], self.size[b], span(b)),
            &|b| (self.size[b], span(b), 0),
            &|b| ((self.size[b] as u128 * span(b) as u128).min(u64::MAX as u128) as u64, self.size[b], 0),
            &|b| (span(b), self.size[b], 0),
        ];
        keys.iter()
            .map(|key| {
                let mut order: Vec<usize> = (0..n).collect();
                // Largest key first; ties by index, so that every preorder is deterministic.
                order.sort_by(|&a, &b| key(b).cmp(&key(a)).then(a.cmp(&b)));
                let mut rank = vec![0u32; n];
                for (r, &b) in order.iter().enumerate() {
                    rank[b] = r as u32;
                }
                rank
            })
            .collect()
    }
}

/// Bit sets over offsets in units of `Domains::unit` bytes.
#[derive(Clone)]
struct Bits(Vec<u64>);

impl Bits {
    fn ones(len: usize) -> Bits {
        let mut b = Bits(vec![u64::MAX; len.div_ceil(64)]);
        b.truncate(len);
        b
    }

    /// Clears every bit at or above `len`.
    fn truncate(&mut self, len: usize) {
        for (w, word) in self.0.iter_mut().enumerate() {
            let lo = w * 64;
            if lo >= len {
                *word = 0;
            } else if len - lo < 64 {
                *word &= (1u64 << (len - lo)) - 1;
            }
        }
    }

    fn get(&self, i: usize) -> bool {
        self.0.get(i / 64).is_some_and(|w| w >> (i % 64) & 1 == 1)
    }

    /// Sets bit `i` (which must be below the length).
    fn set(&mut self, i: usize) {
        self.0[i / 64] |= 1 << (i % 64);
    }

    /// Clears bit `i` (which must be below the length).
    fn unset(&mut self, i: usize) {
        self.0[i / 64] &= !(1 << (i % 64));
    }

    fn or(&mut self, o: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a |= *b;
        }
    }

    /// The lowest set bit at or above `from`.
    fn next(&self, from: usize) -> Option<usize> {
        let mut w = from / 64;
        let mut word = *self.0.get(w)? & (u64::MAX << (from % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            word = *self.0.get(w)?;
        }
    }

    /// `self |= self << k` (bits pushed past the end are dropped).
    fn or_shifted(&mut self, k: usize) {
        let (words, bits) = (k / 64, k % 64);
        let len = self.0.len();
        if words >= len {
            return;
        }
        // From the top down, so that each word reads lower ones not yet changed; the words below
        // `words` take nothing.
        let v = &mut self.0;
        if bits == 0 {
            for w in (words..len).rev() {
                v[w] |= v[w - words];
            }
        } else {
            for w in (words + 1..len).rev() {
                v[w] |= (v[w - words] << bits) | (v[w - words - 1] >> (64 - bits));
            }
            v[words] |= v[0] << bits;
        }
    }

    /// Every offset at most `k` above a member.
    fn dilate(&mut self, k: usize) {
        let mut covered = 1;
        while covered <= k {
            let step = covered.min(k + 1 - covered);
            self.or_shifted(step);
            covered += step;
        }
    }

    /// Makes this the set of subset sums of `sizes` below `len` (bits `0..len`; sums at or past `len`
    /// may be left set in the last word), reusing the buffer.
    fn subset_sums(&mut self, len: usize, sizes: impl IntoIterator<Item = usize>) {
        self.0.clear();
        self.0.resize(len.div_ceil(64), 0);
        self.0[0] = 1;
        for k in sizes {
            self.or_shifted(k);
        }
    }

    /// The highest set bit at or below `i`.
    fn prev(&self, i: usize) -> Option<usize> {
        let mut w = (i / 64).min(self.0.len().checked_sub(1)?);
        let mut word = self.0[w];
        if w == i / 64 && i % 64 < 63 {
            word &= (1u64 << (i % 64 + 1)) - 1;
        }
        loop {
            if word != 0 {
                return Some(w * 64 + 63 - word.leading_zeros() as usize);
            }
            w = w.checked_sub(1)?;
            word = self.0[w];
        }
    }

    fn and(&mut self, o: &Bits) {
        for (a, b) in self.0.iter_mut().zip(&o.0) {
            *a &= *b;
        }
    }
}

/// The sweep's look-ahead (`Sweep::check`) needs, in a later section `t`, the subset sums of the
/// sizes not placed yet. While the sweep is in section `s` those are the tensors of `t` that start
/// after `s` (the same in every branch and every restart) and the few of `s` itself not placed yet:
/// the first part is computed once per pair `(s, t)` and kept here. Without it the look-ahead was
/// most of the sweep's time (the shifts of `Bits::or_shifted`: 65 % of `fill`'s samples in perf).
///
/// Invariants: `sums[s * nsec + t]`, once computed, holds the subset sums (in units, bits `0..=cap`)
/// of the sizes of the tensors of section `t` starting after section `s`, their count and the
/// largest of them.
struct SumsCache {
    nsec: usize,
    cap: usize,
    sums: Vec<Option<Box<(Bits, usize, usize)>>>,
}

/// Bytes beyond which `SumsCache` is not kept (it would hold every pair of sections).
const MAX_CACHE_BYTES: usize = 8 << 20;

impl SumsCache {
    fn new(p: &Problem, cap_units: u64) -> Option<SumsCache> {
        let nsec = p.members.len();
        let words = (cap_units as usize + 1).div_ceil(64);
        let pairs = nsec.checked_mul(nsec + 1)? / 2;
        if pairs.checked_mul(words * 8)? > MAX_CACHE_BYTES {
            return None;
        }
        Some(SumsCache { nsec, cap: cap_units as usize, sums: vec![None; nsec * nsec] })
    }

    /// The entry of `(s, t)`, computed on first use from the sizes (in `unit`s) of the members of `t`.
    fn get(&mut self, p: &Problem, unit: u64, s: usize, t: usize) -> &(Bits, usize, usize) {
        let slot = &mut self.sums[s * self.nsec + t];
        slot.get_or_insert_with(|| {
            let mut b = Bits(Vec::new());
            let later = p.members[t].iter().map(|&c| c as usize).filter(|&c| p.lo[c] as usize > s);
            let sizes: Vec<usize> = later.map(|c| (p.size[c] / unit) as usize).collect();
            b.subset_sums(self.cap + 1, sizes.iter().copied());
            let largest = sizes.iter().copied().max().unwrap_or(0);
            Box::new((b, sizes.len(), largest))
        })
    }
}

/// Where each tensor can start in a plan within a capacity, from sums alone: in every section of its
/// lifetime, the tensors below it there are some of the section's other tensors, and the space left
/// empty below it is at most the section's spare bytes (capacity minus the bytes live there). So its
/// offset is a subset sum of the section's other sizes plus at most the spare, in each section. Where
/// sections are full (no spare), this pins most offsets down to a handful of values.
///
/// Invariants: `unit` divides every size and the capacity; `of[b]` has a bit per unit offset up to
/// `capacity - size[b]`, set where `b` may start.
struct Domains {
    unit: u64,
    of: Vec<Bits>,
}

/// Offsets per domain beyond which domains are not computed (their tables would be too large).
const MAX_DOMAIN_UNITS: u64 = 1 << 16;
const MAX_DOMAIN_WORDS: usize = 4 << 20;
/// Sections with at least 1/`SPARE_SKIP` of the capacity to spare are left out of the domains: there,
/// the subset sums widened by the spare allow nearly every offset, and computing them took most of
/// the time of a search on instances with long-lived tensors (skipping a section only prunes less).
const SPARE_SKIP: usize = 16;

impl Domains {
    fn new(p: &Problem, cap: u64) -> Option<Domains> {
        let unit = p.size.iter().fold(cap, |g, &x| gcd(g, x));
        if unit == 0 || cap / unit > MAX_DOMAIN_UNITS || p.len() * (cap / unit) as usize / 64 > MAX_DOMAIN_WORDS {
            return None;
        }
        let units = (cap / unit) as usize;
        let mut of: Vec<Bits> = (0..p.len()).map(|b| Bits::ones(units + 1 - (p.size[b] / unit) as usize)).collect();
        let mut by_size: Vec<(u64, u32)> = Vec::new();
        let mut sums = Bits(Vec::new());
        for (s, members) in p.members.iter().enumerate() {
            let spare = ((cap - p.section_total[s].min(cap)) / unit) as usize;
            if spare.saturating_mul(SPARE_SKIP) >= units {
                continue;
            }
            // Members alike in size have the same others: one subset-sum table for each size.
            by_size.clear();
            by_size.extend(members.iter().map(|&c| (p.size[c as usize], c)));
            by_size.sort_unstable();
            let mut k = 0;
            while k < by_size.len() {
                let (size, first) = by_size[k];
                let others = members.iter().filter(|&&o| o != first).map(|&o| (p.size[o as usize] / unit) as usize);
                sums.subset_sums(units + 1, others);
                sums.dilate(spare);
                while k < by_size.len() && by_size[k].0 == size {
                    of[by_size[k].1 as usize].and(&sums);
                    k += 1;
                }
            }
        }
        Some(Domains { unit, of })
    }

    /// The lowest offset at or above `from` (a multiple of the unit or not) where `b` may start.
    fn next(&self, b: usize, from: u64) -> u64 {
        match self.of[b].next(from.div_ceil(self.unit) as usize) {
            Some(i) => i as u64 * self.unit,
            None => NONE,
        }
    }

    fn allows(&self, b: usize, at: u64) -> bool {
        at % self.unit == 0 && self.of[b].get((at / self.unit) as usize)
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// How a search ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    /// Decision search: a plan within the capacity was found.
    Found,
    /// Every plan within the capacity in force was explored (none left, or none at all).
    Exhausted,
    /// The node limit or the deadline stopped it.
    Limit,
}

/// Where [`Search::undo`] goes back to: the lengths of the undo logs, and the trail's generation.
#[derive(Clone, Copy, Debug)]
struct Mark {
    floors: usize,
    tensors: usize,
    fails: usize,
    gen: u32,
}

/// One depth-first search.
///
/// Invariants: `offset[b] == NONE` exactly for the unplaced tensors; `floor[s]` is the highest end
/// placed in section `s`, or more where the search decided that the space below stays empty;
/// `left[s]` is the bytes of `s`'s unplaced tensors; `height` is the highest end placed. Unless
/// `all_dirty` is set, every floor that changed since `feasible` last ran rose, inside a range of
/// `raised`, and every section whose tensors' placed state changed lies in one; outside those
/// ranges, `rest_of`, `top_of` (unplaced tensors) and `fails` are what `feasible` would compute
/// now, and `failing` counts the sections with `fails` set. The trail (`tensor_log`, `fails_log`)
/// holds the old values of every change `feasible` made since the generation began.
#[derive(Clone)]
struct Search<'p> {
    p: &'p Problem,
    rank: &'p [u32],
    /// Where each tensor may start within `cap` (or a larger capacity), if computed.
    dom: Option<&'p Domains>,
    cap: u64,
    /// Stop at the first plan within `cap` (decision), or lower `cap` below each plan found.
    decision: bool,
    /// A plan at this size is optimal: stop there.
    floor_of_plans: u64,
    offset: Vec<u64>,
    floor: Vec<u64>,
    left: Vec<u64>,
    placed: usize,
    height: u64,
    /// Undo log: (section, old floor).
    floor_log: Vec<(u32, u64)>,
    /// Scratch of `feasible`: each unplaced tensor's lowest offset and the highest floor under
    /// its lifetime ([`Search::lowest`]).
    rest_of: Vec<u64>,
    top_of: Vec<u64>,
    /// Ranges of sections `raise`d since `feasible` last ran (`lo`, `hi`, new floor), and whether
    /// every section is to be computed again (at the start, and when `cap` changed).
    raised: Vec<(u32, u32, u64)>,
    all_dirty: bool,
    /// The trail of `feasible`'s changes, for `undo`: (tensor, old `rest_of`, old `top_of`), and the
    /// sections whose `fails` flipped; `gen` counts the passes over every section, after which
    /// older marks cannot be restored from the trail.
    tensor_log: Vec<(u32, u64, u64)>,
    fails_log: Vec<u32>,
    gen: u32,
    /// Per section: its unplaced bytes do not fit above its floor and its lowest offset; how many do not.
    fails: Vec<bool>,
    failing: usize,
    /// Scratch of `feasible`: the tensors and sections it computes again, each marked with `epoch`.
    epoch: u32,
    seen_tensor: Vec<u32>,
    seen_section: Vec<u32>,
    redo_sections: Vec<u32>,
    /// Scratch of `feasible`: the lifetimes of the tensors it computes again.
    spans: Vec<(u32, u32)>,
    /// Branch as MiniMalloc does (`branch_canon`) instead of at the lowest point of the skyline.
    canon: bool,
    /// Canonical search: the offset and rank of the last tensor placed; every later one goes at or
    /// above that offset, after it in rank where at the same offset.
    last: (u64, u32),
    nodes_left: u64,
    /// Frames of `node` on the stack (bounded by `MAX_DEPTH`).
    depth: u32,
    deadline: Instant,
    /// The best plan found by this search: offsets per problem tensor, and its size.
    best: Option<(Vec<u64>, u64)>,
}

impl<'p> Search<'p> {
    fn new(p: &'p Problem, rank: &'p [u32], cap: u64, decision: bool, nodes: u64, deadline: Instant) -> Self {
        let n = p.len();
        Search {
            p,
            rank,
            dom: None,
            cap,
            decision,
            floor_of_plans: 0,
            offset: vec![NONE; n],
            floor: vec![0; p.members.len()],
            left: p.section_total.clone(),
            placed: 0,
            height: 0,
            floor_log: Vec::new(),
            rest_of: vec![0; n],
            top_of: vec![0; n],
            raised: Vec::new(),
            all_dirty: true,
            tensor_log: Vec::new(),
            fails_log: Vec::new(),
            gen: 0,
            fails: vec![false; p.members.len()],
            failing: 0,
            epoch: 0,
            seen_tensor: vec![0; n],
            seen_section: vec![0; p.members.len()],
            redo_sections: Vec::new(),
            spans: Vec::new(),
            canon: false,
            last: (0, 0),
            nodes_left: nodes,
            depth: 0,
            deadline,
            best: None,
        }
    }

    fn run(&mut self) -> End {
        if self.p.len() == 0 {
            self.best = Some((Vec::new(), 0));
            return End::Found;
        }
        if !self.feasible() {
            return End::Exhausted;
        }
        self.node()
    }

    /// Whether every section can still hold its unplaced bytes: above its floor, and above the lowest
    /// offset any of its unplaced tensors can take.
    /// Brings `rest_of` and `top_of` up to date for the unplaced tensors on the way. Incremental:
    /// since the last call, floors only rose, over the ranges `raise` recorded (every way back goes
    /// through `undo`, which restores what the calls in between changed, from the trail). A tensor's
    /// highest floor then becomes the larger of its old one and a range's new floor wherever its
    /// lifetime meets that range (one comparison, not a walk of its lifetime); the sections checked
    /// again are the raised ones and those under the tensors whose lowest offset moved.
    fn feasible(&mut self) -> bool {
        let p = self.p;
        if self.all_dirty {
            // Every section from scratch (at the start, and when `cap` changed): the trail starts
            // again, and marks taken before are of an older generation.
            self.all_dirty = false;
            self.raised.clear();
            self.tensor_log.clear();
            self.fails_log.clear();
            self.gen = self.gen.wrapping_add(1);
            for c in 0..p.len() {
                if self.offset[c] == NONE {
                    (self.rest_of[c], self.top_of[c]) = self.lowest(c);
                }
            }
            self.failing = 0;
            for s in 0..self.floor.len() {
                self.fails[s] = self.fails_at(s);
                self.failing += self.fails[s] as usize;
            }
            return self.failing == 0;
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.seen_tensor.fill(0);
            self.seen_section.fill(0);
            self.epoch = 1;
        }
        let epoch = self.epoch;
        self.redo_sections.clear();
        self.spans.clear();
        for k in 0..self.raised.len() {
            let (lo, hi, to) = self.raised[k];
            for s in lo..hi {
                if self.seen_section[s as usize] != epoch {
                    self.seen_section[s as usize] = epoch;
                    self.redo_sections.push(s);
                }
            }
            // The unplaced tensors meeting `lo..hi`: those covering `lo` and those starting inside
            // (not each section's members: tensors that live long are members of them all).
            let starting = (lo + 1..hi).flat_map(|s| p.starts[s as usize].iter());
            for &d in p.members[lo as usize].iter().chain(starting) {
                let d = d as usize;
                if self.offset[d] != NONE || self.top_of[d] >= to {
                    continue;
                }
                self.tensor_log.push((d as u32, self.rest_of[d], self.top_of[d]));
                let old = self.rest_of[d];
                self.top_of[d] = to;
                self.rest_of[d] = self.rest_from(d, to);
                if self.rest_of[d] != old && self.seen_tensor[d] != epoch {
                    self.seen_tensor[d] = epoch;
                    self.spans.push((p.lo[d], p.hi[d]));
                }
            }
        }
        self.raised.clear();
        // The sections under the tensors whose lowest offset moved: the union of their lifetimes,
        // walked once.
        self.spans.sort_unstable();
        let mut done = 0;
        for k in 0..self.spans.len() {
            let (lo, hi) = self.spans[k];
            for s in lo.max(done)..hi {
                if self.seen_section[s as usize] != epoch {
                    self.seen_section[s as usize] = epoch;
                    self.redo_sections.push(s);
                }
            }
            done = done.max(hi);
        }
        for k in 0..self.redo_sections.len() {
            let s = self.redo_sections[k] as usize;
            let fails = self.fails_at(s);
            if fails != self.fails[s] {
                self.fails[s] = fails;
                self.fails_log.push(s as u32);
                if fails {
                    self.failing += 1;
                } else {
                    self.failing -= 1;
                }
            }
        }
        self.failing == 0
    }

    /// Whether section `s`'s unplaced bytes do not fit: above its floor, or above the lowest offset
    /// any of its unplaced tensors can take (`max(floor, lowest) + left > cap`). The scan stops at
    /// the first tensor low enough, where it used to take the lowest of all (on instances whose
    /// tensors live long, every section has many, and this was most of a node's time).
    fn fails_at(&self, s: usize) -> bool {
        let (f, l) = (self.floor[s], self.left[s]);
        l != 0
            && (f.saturating_add(l) > self.cap || {
                let room = self.cap - l;
                !self.p.members[s].iter().any(|&c| self.offset[c as usize] == NONE && self.rest_of[c as usize] <= room)
            })
    }

    /// The highest floor under `c`'s lifetime.
    fn top(&self, c: usize) -> u64 {
        let p = self.p;
        (p.lo[c]..p.hi[c]).map(|s| self.floor[s as usize]).max().unwrap_or(0)
    }

    /// `c`'s lowest offset when the highest floor under its lifetime is `top`: `top` aligned,
    /// sharpened by the domains if any.
    fn rest_from(&self, c: usize, top: u64) -> u64 {
        let p = self.p;
        let r = top.div_ceil(p.align[c]) * p.align[c];
        match self.dom {
            Some(d) => d.next(c, r),
            None => r,
        }
    }

    /// `c`'s lowest offset and the highest floor under its lifetime ([`Search::top`]).
    fn lowest(&self, c: usize) -> (u64, u64) {
        let t = self.top(c);
        (self.rest_from(c, t), t)
    }

    /// Sets the floor of sections `lo..hi` to at least `to`, logging the old values.
    fn raise(&mut self, lo: u32, hi: u32, to: u64) {
        for s in lo..hi {
            self.floor_log.push((s, self.floor[s as usize]));
            self.floor[s as usize] = self.floor[s as usize].max(to);
        }
        self.raised.push((lo, hi, to));
    }

    /// Where `undo` goes back to.
    fn mark(&self) -> Mark {
        Mark {
            floors: self.floor_log.len(),
            tensors: self.tensor_log.len(),
            fails: self.fails_log.len(),
            gen: self.gen,
        }
    }

    /// Back to `mark`: the floors, and what `feasible` changed since (or, where the capacity changed
    /// since, everything computed again at the next `feasible`).
    fn undo(&mut self, mark: Mark) {
        while self.floor_log.len() > mark.floors {
            let (s, f) = self.floor_log.pop().expect("above the mark");
            self.floor[s as usize] = f;
        }
        self.raised.clear();
        if mark.gen != self.gen {
            self.all_dirty = true;
            return;
        }
        while self.tensor_log.len() > mark.tensors {
            let (c, r, t) = self.tensor_log.pop().expect("above the mark");
            self.rest_of[c as usize] = r;
            self.top_of[c as usize] = t;
        }
        while self.fails_log.len() > mark.fails {
            let s = self.fails_log.pop().expect("above the mark") as usize;
            self.fails[s] = !self.fails[s];
            if self.fails[s] {
                self.failing += 1;
            } else {
                self.failing -= 1;
            }
        }
    }

    fn node(&mut self) -> End {
        if self.depth >= MAX_DEPTH {
            return End::Limit;
        }
        self.depth += 1;
        let end = match self.tick() {
            Some(end) => end,
            None if self.canon => self.branch_canon(),
            None => self.branch(),
        };
        self.depth -= 1;
        end
    }

    /// A node's start, for both branchings: its count against the node limit and the deadline, and
    /// the leaf (every tensor placed); `None` where it is to branch.
    fn tick(&mut self) -> Option<End> {
        if self.nodes_left == 0 {
            return Some(End::Limit);
        }
        self.nodes_left -= 1;
        if self.nodes_left % 512 == 0 && Instant::now() >= self.deadline {
            self.nodes_left = 0;
            return Some(End::Limit);
        }
        if self.placed == self.p.len() {
            return Some(self.leaf());
        }
        None
    }

    /// Places `c` at `o`; returns what [`Search::unplace`] needs to take it out again.
    fn place(&mut self, c: usize, o: u64) -> (Mark, u64) {
        let p = self.p;
        let mark = self.mark();
        let top = o + p.size[c];
        self.raise(p.lo[c], p.hi[c], top);
        for s in p.lo[c]..p.hi[c] {
            self.left[s as usize] -= p.size[c];
        }
        self.offset[c] = o;
        self.placed += 1;
        let height = self.height;
        self.height = self.height.max(top);
        (mark, height)
    }

    /// Takes `c` out again, back to the state before [`Search::place`].
    fn unplace(&mut self, c: usize, (mark, height): (Mark, u64)) {
        let p = self.p;
        self.height = height;
        self.placed -= 1;
        self.offset[c] = NONE;
        for s in p.lo[c]..p.hi[c] {
            self.left[s as usize] += p.size[c];
        }
        self.undo(mark);
    }

    fn branch(&mut self) -> End {
        let p = self.p;
        // The lowest point of the skyline among sections with something left to place (every tensor
        // not placed yet lies at or above it, so a tensor starting there has everything below it
        // placed); of the sections at that height, the one where fewest tensors can start (`rest_of`
        // is fresh: `feasible` ran on the way here).
        let m = self.floor.iter().zip(&self.left).filter(|&(_, &l)| l > 0).map(|(&f, _)| f).min().expect("not done");
        let star = self.choose(m);
        let waste = self.waste_to(star, m);
        // Either a tensor covering that section starts exactly there…
        let valley = self.valley(star, m);
        let mut cands: Vec<(u8, u32, u32)> = p.members[star]
            .iter()
            .filter(|&&c| self.offset[c as usize] == NONE && self.rest_of[c as usize] == m)
            .map(|&c| {
                (
                    2 - (p.lo[c as usize] == valley.0) as u8 - (p.hi[c as usize] == valley.1) as u8,
                    self.rank[c as usize],
                    c,
                )
            })
            .collect();
        cands.sort_unstable();
        let mut tried: Vec<(u64, u32, u32, u64)> = Vec::with_capacity(cands.len());
        for &(_, _, c) in &cands {
            let c = c as usize;
            let top = m + p.size[c];
            if top > self.cap {
                continue;
            }
            // Tensors alike in size, lifetime and alignment are interchangeable: try one of them.
            let key = (p.size[c], p.lo[c], p.hi[c], p.align[c]);
            if tried.contains(&key) {
                continue;
            }
            tried.push(key);
            let placed = self.place(c, m);
            let end = if self.feasible() { self.node() } else { End::Exhausted };
            self.unplace(c, placed);
            if end != End::Exhausted {
                return end;
            }
        }
        // …or the space there stays empty up to the lowest offset the lowest tensor covering it could
        // then take (see `waste_to`: it rests on a tensor beside the section, or is lifted above `m`
        // by its alignment).
        let Some(waste) = waste else { return End::Exhausted };
        let mark = self.mark();
        self.raise(star as u32, star as u32 + 1, waste);
        let end = if self.feasible() { self.node() } else { End::Exhausted };
        self.undo(mark);
        end
    }

    /// Whether every section's unplaced bytes fit above `o` (and above its floor): in the canonical
    /// search every tensor placed later goes at `o` or above.
    fn fits_above(&self, o: u64) -> bool {
        self.floor.iter().zip(&self.left).all(|(&f, &l)| l == 0 || f.max(o).saturating_add(l) <= self.cap)
    }

    /// The canonical branching (MiniMalloc's): each node places one tensor at its lowest offset,
    /// trying the unplaced ones in the order of (lowest offset, rank), from the last placement's
    /// on. Complete, as every plan made to rest (each tensor moved down as far as it goes, in the
    /// order of offsets) is one of these sequences: sorted by (offset, rank), each tensor lies at
    /// its lowest offset given the ones before it. Pruned as MiniMalloc does: a tensor is skipped
    /// whose offset would lie at or above the lowest end some unplaced tensor can reach (that one
    /// would rest below it, so it comes first), and every section's unplaced bytes must fit above
    /// the last placement's offset. Nothing is ever left empty by a decision: on instances with
    /// room to spare and tensors of many sizes, the skyline branching climbs that room a step at a
    /// time, one node for each step as high as the smallest neighbour (thousands of nodes for one
    /// plan of 409 tensors), where this one places a tensor at every node. Its placements leave
    /// holes under the floors, which the skyline branching does not; on the instances full at the
    /// bound it found worse plans, so the driver uses it only where sections have room.
    fn branch_canon(&mut self) -> End {
        let p = self.p;
        let (lo_off, lo_rank) = self.last;
        let n = p.len();
        let mut min_height = NONE;
        for c in 0..n {
            if self.offset[c] == NONE {
                min_height = min_height.min(self.rest_of[c].saturating_add(p.size[c]));
            }
        }
        let mut cands: Vec<(u64, u32, u32)> = (0..n)
            .filter(|&c| {
                self.offset[c] == NONE
                    && (self.rest_of[c], self.rank[c]) >= (lo_off, lo_rank)
                    && self.rest_of[c] < min_height
                    && self.rest_of[c].saturating_add(p.size[c]) <= self.cap
            })
            .map(|c| (self.rest_of[c], self.rank[c], c as u32))
            .collect();
        cands.sort_unstable();
        let mut tried: Vec<(u64, u32, u32, u64, u64)> = Vec::new();
        for &(o, r, c) in &cands {
            let c = c as usize;
            let key = (p.size[c], p.lo[c], p.hi[c], p.align[c], o);
            if tried.contains(&key) {
                continue;
            }
            tried.push(key);
            let placed = self.place(c, o);
            let last = std::mem::replace(&mut self.last, (o, r));
            let end = if self.fits_above(o) && self.feasible() { self.node() } else { End::Exhausted };
            self.last = last;
            self.unplace(c, placed);
            if end != End::Exhausted {
                return end;
            }
        }
        End::Exhausted
    }

    /// Of the sections at floor `m` with something left to place, the one where fewest tensors can
    /// start (`rest_of` must be fresh).
    fn choose(&self, m: u64) -> usize {
        let p = self.p;
        let mut star = usize::MAX;
        let mut fewest = usize::MAX;
        for (s, (&f, &l)) in self.floor.iter().zip(&self.left).enumerate() {
            if l > 0 && f == m {
                let k = p.members[s]
                    .iter()
                    .filter(|&&c| self.offset[c as usize] == NONE && self.rest_of[c as usize] == m)
                    .count();
                if k < fewest {
                    (star, fewest) = (s, k);
                }
            }
        }
        star
    }

    /// Where the floor of section `star` (at `m`, the lowest) goes if nothing starts at `m` there, or
    /// `None` if nothing could then cover it. Take a plan P where nothing starts there, made to rest on
    /// things (each tensor moved down as far as it goes, in the order of offsets: no larger). Its
    /// lowest tensor `c` above `m` there lies at or above every floor under its lifetime, and rests
    /// either on the floors, lifted above `m` by its alignment, or on a tensor `d` beside the section.
    /// If every floor beside is at `m` (the lowest), `d` is not placed yet, and `c` starts at least at
    /// `d`'s lowest offset plus its size. A tensor covering the section alone rests on its floor.
    /// `rest_of` and `top_of` must be fresh. (Until 2026-12-03 the alignment's lift was left out:
    /// with alignments, the search could end "exhausted" at a capacity that holds a plan.)
    fn waste_to(&self, star: usize, m: u64) -> Option<u64> {
        let p = self.p;
        let star32 = star as u32;
        let covers_star = |d: usize| p.lo[d] <= star32 && star32 < p.hi[d];
        p.members[star]
            .iter()
            .map(|&c| c as usize)
            .filter(|&c| self.offset[c] == NONE)
            .filter_map(|c| {
                // The highest floor beside the section, where it is above `m`: the highest under
                // `c`'s lifetime (the section's own is `m`).
                let top = self.top_of[c];
                let lifted = m.div_ceil(p.align[c]) * p.align[c];
                let r = if top > m {
                    top
                } else if lifted > m {
                    // Resting on the floors, `c` is lifted above `m` by its alignment alone (a
                    // tensor covering the section alone too).
                    lifted
                } else if p.hi[c] - p.lo[c] > 1 {
                    let mut on = NONE;
                    for s in (p.lo[c]..p.hi[c]).filter(|&s| s != star32) {
                        for &d in &p.members[s as usize] {
                            let d = d as usize;
                            if self.offset[d] == NONE && !covers_star(d) {
                                on = on.min(self.rest_of[d].saturating_add(p.size[d]));
                            }
                        }
                    }
                    on.max(m + 1)
                } else {
                    return None;
                };
                let r = r.saturating_add(p.align[c] - 1) / p.align[c] * p.align[c];
                Some(match self.dom {
                    Some(d) if r != NONE => d.next(c, r),
                    _ => r,
                })
            })
            .min()
            .filter(|&w| w != NONE && w < self.cap)
    }

    /// The valley around `star`: the run of sections `lo..hi` at floor `m` with tensors left. The
    /// candidates are tried first that span it whole, then those that reach one end of it (a tensor
    /// that leaves a narrow strip beside it at `m` makes that strip hard to fill), each in preorder.
    fn valley(&self, star: usize, m: u64) -> (u32, u32) {
        let open = |s: usize| self.floor[s] == m && self.left[s] > 0;
        let mut lo = star;
        while lo > 0 && open(lo - 1) {
            lo -= 1;
        }
        let mut hi = star + 1;
        while hi < self.floor.len() && open(hi) {
            hi += 1;
        }
        (lo as u32, hi as u32)
    }

    fn leaf(&mut self) -> End {
        let size = self.height;
        if self.best.as_ref().is_none_or(|&(_, s)| size < s) {
            self.best = Some((self.offset.clone(), size));
        }
        if self.decision || size <= self.floor_of_plans {
            return End::Found;
        }
        // Only strictly better plans are wanted from here on.
        self.cap = size - 1;
        self.all_dirty = true;
        End::Exhausted
    }
}

/// The time sweep: sections in order of time; at each, the tensors that start there go into the free
/// intervals (holes) that the tensors still live leave, each at the lowest free point of the lowest
/// hole, or a hole's rest stays empty where the section has bytes to spare (`cap` minus the bytes live
/// there). Where every section is full at `cap` (the instances that are hard by construction, at their
/// bound) nothing may stay empty and every hole is exactly tiled by the tensors starting there.
/// Elsewhere a tensor may need to rest on one that starts later. A heuristic (see the backjumping in
/// `fill`), used for plans, never for proofs.
///
/// Backjumping (conflict-directed, as in constraint solvers, with conflict sets that are a guess):
/// each dead end records the placements it depends on (`conf`, by index in `ends`): the ones that
/// bound the hole it failed to fill, or the free interval the look-ahead refused. A node whose
/// candidates all fail passes up the union of their sets without itself; a node not in the set it
/// gets back returns at once, without trying its other candidates. The sets leave out the placements
/// that put tensors elsewhere, one of which could have gone into that interval and changed it: a
/// sound set would hold nearly every placement and jump nowhere. Hard instances, seeds 0-12 of 100,
/// 200 and 400 tensors, 1 s (with four times the sweep's nodes): 29 of 78 at the bound against 25;
/// the sweep alone, 50 000 nodes per preorder: tiling 100 at the bound on 7 of 13 against 4.
///
/// Invariants: the tensors placed are exactly those starting before the current section, plus those
/// of the current section already put in a hole; no two placed tensors live at the same op overlap.
struct Sweep<'p> {
    p: &'p Problem,
    dom: Option<&'p Domains>,
    cap: u64,
    offset: Vec<u64>,
    /// The tensors starting in each section, in preorder.
    starters: Vec<Vec<u32>>,
    nodes_left: u64,
    depth: u32,
    deadline: Instant,
    best: Option<(Vec<u64>, u64)>,
    /// The unit of the look-ahead (`check`): a divisor of every size, alignment and the capacity,
    /// so of every offset the sweep gives; 0 where the capacity has too many units for its tables.
    unit: u64,
    /// Scratch of `check`: placed intervals, free intervals' lengths and unplaced sizes (in units),
    /// subset sums.
    held: Vec<(u64, u64, u32)>,
    gaps: Vec<usize>,
    sizes: Vec<usize>,
    sums: Bits,
    /// Subset sums of later sections' sizes, kept across restarts (`drive` moves it from one sweep to
    /// the next); `None` where too large.
    cache: Option<SumsCache>,
    /// The tensors placed, in the order of placement: (section, end, tensor).
    ends: Vec<(u32, u64, u32)>,
    /// Per tensor, the lowest rank among the tensors interchangeable with it (itself included).
    group_rank: Vec<u32>,
    /// Per placed tensor, its index in `ends`.
    pos: Vec<u32>,
    /// Scratch of `check`: the placements bounding each free interval; after a refusal, the
    /// placements it depends on.
    gap_by: Vec<(u32, u32)>,
    why: Vec<u32>,
    /// After a dead end: the placements it depends on (indices in `ends`), for `fill`.
    conf: Bits,
}

/// Units of the capacity beyond which the sweep does not look ahead (as for `Domains`: a node's
/// subset sums stay within a thousand words per section, and the deadline, checked every 512 nodes,
/// is not overrun by much).
const MAX_CHECK_UNITS: u64 = MAX_DOMAIN_UNITS;

impl<'p> Sweep<'p> {
    fn new(p: &'p Problem, rank: &'p [u32], cap: u64, nodes: u64, deadline: Instant) -> Self {
        let mut starters = vec![Vec::new(); p.members.len()];
        for c in 0..p.len() {
            starters[p.lo[c] as usize].push(c as u32);
        }
        for list in &mut starters {
            list.sort_unstable_by_key(|&c| rank[c as usize]);
        }
        // An alignment of 1 adds no offsets: only ends, 0 and multiples of larger alignments occur.
        let unit = p.size.iter().chain(p.align.iter().filter(|&&a| a > 1)).fold(cap, |g, &x| gcd(g, x));
        let unit = if unit == 0 || cap / unit > MAX_CHECK_UNITS { 0 } else { unit };
        Sweep {
            p,
            dom: None,
            cap,
            offset: vec![NONE; p.len()],
            starters,
            nodes_left: nodes,
            depth: 0,
            deadline,
            best: None,
            unit,
            held: Vec::new(),
            gaps: Vec::new(),
            sizes: Vec::new(),
            sums: Bits(Vec::new()),
            cache: None,
            ends: Vec::new(),
            group_rank: Self::group_ranks(p, rank),
            pos: vec![0; p.len()],
            gap_by: Vec::new(),
            why: Vec::new(),
            conf: Bits(vec![0; p.len().div_ceil(64) + 1]),
        }
    }

    fn group_ranks(p: &Problem, rank: &[u32]) -> Vec<u32> {
        let key = |c: usize| (p.size[c], p.lo[c], p.hi[c], p.align[c]);
        let mut by_key: Vec<usize> = (0..p.len()).collect();
        by_key.sort_unstable_by_key(|&c| (key(c), rank[c]));
        let mut group = vec![0u32; p.len()];
        let mut first = 0;
        for (k, &c) in by_key.iter().enumerate() {
            if k == 0 || key(by_key[k - 1]) != key(c) {
                first = rank[c];
            }
            group[c] = first;
        }
        group
    }

    /// Look-ahead over sections `from..to`: in each, the tensors placed leave free intervals, and the
    /// tensors not placed yet that live there must go inside them, each wholly inside one. So in an
    /// interval of `len` bytes, the bytes left empty are at least `len` minus the largest subset sum
    /// of their sizes that fits; summed over the intervals, that must fit the section's spare bytes
    /// (none where the section is full, as in the instances hard by construction: there every
    /// interval must be an exact subset sum, which few arrangements satisfy). And the largest of them
    /// must fit the largest interval.
    fn check(&mut self, from: usize, to: usize) -> bool {
        let p = self.p;
        let unit = self.unit;
        if unit == 0 {
            return true;
        }
        for s in from..to.min(p.members.len()) {
            let spare = self.cap.saturating_sub(p.section_total[s]) / unit;
            self.held.clear();
            self.sizes.clear();
            // With the cache, the tensors starting after `from` come from it, and `sizes` holds
            // only those of `from` not placed yet.
            let cached = self.cache.is_some();
            for &c in &p.members[s] {
                let c = c as usize;
                if self.offset[c] == NONE {
                    if !cached || p.lo[c] as usize == from {
                        self.sizes.push((p.size[c] / unit) as usize);
                    }
                } else {
                    self.held.push((self.offset[c] / unit, (self.offset[c] + p.size[c]) / unit, self.pos[c]));
                }
            }
            let later = self.cache.as_mut().map(|cache| cache.get(p, unit, from, s));
            let (count, later_max) = later.map_or((0, 0), |e| (e.1, e.2));
            if (self.sizes.is_empty() && count == 0) || self.held.is_empty() {
                continue;
            }
            self.held.sort_unstable();
            let cap = self.cap / unit;
            // Free intervals: between the placed ones, and above them up to the capacity, with the
            // placements bounding them.
            self.gaps.clear();
            self.gap_by.clear();
            let mut at = 0;
            let mut at_by = u32::MAX;
            for k in 0..=self.held.len() {
                let (o, e, by) = self.held.get(k).copied().unwrap_or((cap, cap, u32::MAX));
                if o > at {
                    self.gaps.push((o - at) as usize);
                    self.gap_by.push((at_by, by));
                }
                if e > at {
                    at = e;
                    at_by = by;
                }
            }
            let widest = self.gaps.iter().copied().max().unwrap_or(0);
            if self.sizes.iter().copied().max().unwrap_or(0).max(later_max) > widest {
                self.why.clear();
                self.why.extend(self.held.iter().map(|h| h.2));
                return false;
            }
            match later {
                Some((base, ..)) => {
                    let words = (widest + 1).div_ceil(64);
                    self.sums.0.clear();
                    self.sums.0.extend_from_slice(&base.0[..words]);
                    for &k in &self.sizes {
                        self.sums.or_shifted(k);
                    }
                }
                None => self.sums.subset_sums(widest + 1, self.sizes.iter().copied()),
            }
            let mut empty = 0;
            self.why.clear();
            for (g, &len) in self.gaps.iter().enumerate() {
                let lost = (len - self.sums.prev(len).unwrap_or(0)) as u64;
                if lost > 0 {
                    let (x, y) = self.gap_by[g];
                    self.why.extend([x, y].into_iter().filter(|&v| v != u32::MAX));
                }
                empty += lost;
                if empty > spare {
                    return false;
                }
            }
        }
        true
    }

    fn run(&mut self) -> End {
        self.section(0)
    }

    fn section(&mut self, s: usize) -> End {
        let p = self.p;
        if s == p.members.len() {
            let height = (0..p.len()).map(|c| self.offset[c] + p.size[c]).max().unwrap_or(0);
            self.best = Some((self.offset.clone(), height));
            return End::Found;
        }
        let Some(spare) = self.cap.checked_sub(p.section_total[s]) else {
            self.conf_all();
            return End::Exhausted;
        };
        let mut held: Vec<(u64, u64)> = p.members[s]
            .iter()
            .map(|&c| c as usize)
            .filter(|&c| p.lo[c] < s as u32)
            .map(|c| (self.offset[c], self.offset[c] + p.size[c]))
            .collect();
        held.sort_unstable();
        let mut holes = Vec::with_capacity(held.len() + 1);
        let mut at = 0;
        for (o, e) in held {
            if o > at {
                holes.push((at, o));
            }
            at = at.max(e);
        }
        if self.cap > at {
            holes.push((at, self.cap));
        }
        let mut todo = self.starters[s].clone();
        self.fill(s, &mut holes, &mut todo, spare)
    }

    /// Which hole to fill next. Where the section has no bytes to spare every hole must be tiled
    /// exactly from its bottom up, so any hole's bottom is a complete choice: the one where fewest of
    /// `todo` can start (fail first, as an exact cover picks its column with fewest rows), counting a
    /// tensor only if the rest of the hole above it is a subset sum of `todo`'s sizes. `Err` with a
    /// hole that has no candidate, if any. With bytes to spare, or no look-ahead unit, the lowest hole.
    fn choose_hole(&mut self, s: usize, holes: &[(u64, u64)], todo: &[u32], spare: u64) -> Result<usize, usize> {
        let p = self.p;
        let unit = self.unit;
        if spare > 0 || unit == 0 || holes.len() == 1 {
            return Ok(0);
        }
        let widest = holes.iter().map(|&(a, b)| (b - a) / unit).max().unwrap_or(0) as usize;
        self.sums.subset_sums(widest + 1, todo.iter().map(|&c| (p.size[c as usize] / unit) as usize));
        let mut best = (usize::MAX, 0);
        for (h, &(a, b)) in holes.iter().enumerate() {
            let mut count = 0;
            let below = self.starter_below(s, a);
            for &c in todo {
                let c = c as usize;
                let top = a + p.size[c];
                if a % p.align[c] != 0 || top > b || self.dom.is_some_and(|d| !d.allows(c, a)) {
                    continue;
                }
                if self.sums.get(((b - top) / unit) as usize) && !below.is_some_and(|d| self.swappable(d, c)) {
                    count += 1;
                }
            }
            if count == 0 {
                return Err(h);
            }
            if count < best.0 {
                best = (count, h);
            }
        }
        Ok(best.1)
    }

    /// Whether `c` at `o` sits right above a tensor `d` of the same section with the same lifetime
    /// whose group comes later in the preorder, where the two could trade places (alignment
    /// allowing). The pair holds the same bytes over the same ops either way, so only the order with
    /// the earlier group below is searched: any plan becomes one of those by swapping such pairs
    /// (each swap removes one inversion of the stack). Groups are the interchangeable tensors (alike
    /// in size, lifetime and alignment), ranked by their first member: two of one group are never
    /// refused, which keeps the rule compatible with trying one tensor of each group (`fill`'s
    /// `tried`).
    fn swapped_is_canonical(&self, s: usize, c: usize, o: u64) -> bool {
        self.starter_below(s, o).is_some_and(|d| self.swappable(d, c))
    }

    /// The tensor of section `s` placed in this section and ending at `o`, if any.
    fn starter_below(&self, s: usize, o: u64) -> Option<usize> {
        let s = s as u32;
        self.ends.iter().rev().take_while(|e| e.0 == s).find(|e| e.1 == o).map(|e| e.2 as usize)
    }

    /// Whether `c`, starting right above `d` (of the same section), should not go there: see
    /// `swapped_is_canonical`.
    fn swappable(&self, d: usize, c: usize) -> bool {
        let p = self.p;
        p.hi[d] == p.hi[c]
            && self.group_rank[d] > self.group_rank[c]
            && self.offset[d] % p.align[c] == 0
            && (self.offset[d] + p.size[c]) % p.align[d] == 0
    }

    /// Places the tensors of `todo` (starting in section `s`) into `holes` (sorted, non-empty), with
    /// at most `spare` bytes left empty. At a dead end (`End::Exhausted`), `conf` holds the
    /// placements it depends on (see the backjumping on `Sweep`).
    fn fill(&mut self, s: usize, holes: &mut Vec<(u64, u64)>, todo: &mut Vec<u32>, spare: u64) -> End {
        if todo.is_empty() {
            return self.section(s + 1);
        }
        if self.nodes_left == 0 || self.depth >= MAX_DEPTH {
            return End::Limit;
        }
        self.nodes_left -= 1;
        if self.nodes_left % 512 == 0 && Instant::now() >= self.deadline {
            self.nodes_left = 0;
            return End::Limit;
        }
        if holes.is_empty() {
            self.conf_all();
            return End::Exhausted;
        }
        let h = match self.choose_hole(s, holes, todo, spare) {
            Ok(h) => h,
            Err(h) => {
                self.conf.0.fill(0);
                self.add_bounds(s, holes[h].0, holes[h].1);
                return End::Exhausted;
            }
        };
        let (a, b) = holes[h];
        let p = self.p;
        self.depth += 1;
        let mut tried: Vec<(u64, u32, u64)> = Vec::new();
        let mut end = End::Exhausted;
        // The placements this node's dead end depends on: the hole's bounds, and what each
        // candidate's refusal or subtree depended on (but this node's own placement).
        self.conf.0.fill(0);
        self.add_bounds(s, a, b);
        let mut node_conf = self.conf.clone();
        let me = self.ends.len();
        for k in 0..todo.len() {
            let c = todo[k] as usize;
            let o = a.div_ceil(p.align[c]) * p.align[c];
            if o - a > spare || o + p.size[c] > b || self.dom.is_some_and(|d| !d.allows(c, o)) {
                continue;
            }
            // Tensors alike in size, lifetime and alignment are interchangeable.
            let key = (p.size[c], p.hi[c], p.align[c]);
            if tried.contains(&key) {
                continue;
            }
            if self.swapped_is_canonical(s, c, o) {
                continue;
            }
            tried.push(key);
            todo.remove(k);
            self.offset[c] = o;
            let top = o + p.size[c];
            self.pos[c] = me as u32;
            self.ends.push((s as u32, top, c as u32));
            if top < b {
                holes[h] = (top, b);
            } else {
                holes.remove(h);
            }
            let refused = !self.check(s, p.hi[c] as usize);
            end = if refused { End::Exhausted } else { self.fill(s, holes, todo, spare - (o - a)) };
            if top < b {
                holes[h] = (a, b);
            } else {
                holes.insert(h, (a, b));
            }
            self.ends.pop();
            self.offset[c] = NONE;
            todo.insert(k, c as u32);
            if end != End::Exhausted {
                break;
            }
            if refused {
                for &w in self.why.iter().filter(|&&w| (w as usize) < me) {
                    node_conf.set(w as usize);
                }
            } else {
                if !self.conf.get(me) {
                    // The dead end below does not depend on this placement: back further.
                    self.depth -= 1;
                    return End::Exhausted;
                }
                node_conf.or(&self.conf);
                node_conf.unset(me);
            }
        }
        if end == End::Exhausted && b - a <= spare {
            // The rest of this hole stays empty.
            holes.remove(h);
            end = self.fill(s, holes, todo, spare - (b - a));
            holes.insert(h, (a, b));
            if end == End::Exhausted {
                node_conf.or(&self.conf);
            }
        }
        self.conf = node_conf;
        self.depth -= 1;
        end
    }

    /// Adds to `conf` the placements bounding the free interval `a..b` of section `s`.
    fn add_bounds(&mut self, s: usize, a: u64, b: u64) {
        let p = self.p;
        for &c in &p.members[s] {
            let c = c as usize;
            let o = self.offset[c];
            if o != NONE && (o + p.size[c] == a || o == b) {
                self.conf.set(self.pos[c] as usize);
            }
        }
    }

    /// Every placement so far (a dead end with no finer reason).
    fn conf_all(&mut self) {
        self.conf.0.fill(0);
        for w in 0..self.ends.len() {
            self.conf.set(w);
        }
    }
}

/// What the branch and bound achieved.
pub(super) struct Outcome {
    /// Offsets per input tensor (zero-sized ones at 0), if it found a plan better than the one given.
    pub offsets: Option<Vec<u64>>,
    pub size: u64,
    pub proven_optimal: bool,
    /// The best lower bound known: the most bytes live at one op, or more if a search proved it.
    pub best_bound: u64,
    pub nodes: u64,
}

/// Improves the plan of size `best` for `tensors` (lower bound `bound`) until it is proven optimal, the
/// deadline passes or `max_nodes` nodes have been searched. `None` when the instance is too large for
/// the search's tables.
pub(super) fn improve(tensors: &[Tensor], bound: u64, best: u64, deadline: Instant, max_nodes: u64) -> Option<Outcome> {
    let p = Problem::new(tensors)?;
    // The search recurses once per placement: on a thread of its own with a large stack (reserved
    // address space; only what the recursion reaches is touched).
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("edgepool-plan".into())
            .stack_size(STACK_BYTES)
            .spawn_scoped(scope, || drive(&p, tensors, bound, best, deadline, max_nodes))
            .ok()?
            .join()
            .ok()
    })
}

fn drive(p: &Problem, tensors: &[Tensor], bound: u64, best: u64, deadline: Instant, max_nodes: u64) -> Outcome {
    let preorders = p.preorders();
    let at_bound = Domains::new(p, bound);
    let mut out = Outcome { offsets: None, size: best, proven_optimal: best <= bound, best_bound: bound, nodes: 0 };
    let mut limit = (p.len() as u64 * 2).max(64);
    // Sections full at the bound. The sweep is for instances whose every section is full: it gets
    // that share of its nodes. Where fewer than half are full, the searches above the bound are
    // canonical (`Search::canon`).
    let full_sections = p.section_total.iter().filter(|&&t| t >= bound).count() as u64;
    let nsec = p.members.len().max(1) as u64;
    let canon = full_sections * 2 < nsec;
    // Whether the decision search at the lower bound is settled (found, or proven impossible).
    let mut bound_settled = false;
    let keep = |found: Option<(Vec<u64>, u64)>, out: &mut Outcome| {
        if let Some((offs, size)) = found {
            if size < out.size {
                let mut full = vec![0u64; tensors.len()];
                for (k, &i) in p.index.iter().enumerate() {
                    full[i] = offs[k];
                }
                out.offsets = Some(full);
                out.size = size;
            }
        }
    };
    // Random preorders join the fixed ones in every round (restarts: the searches' times are
    // heavy-tailed, and a preorder that leads one astray may be a lucky one for another instance).
    // A random permutation is as random read as ranks as read as an order: no inversion needed.
    let mut sums_cache: Option<SumsCache> = None;
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ p.len() as u64 | 1);
    let mut random_rank = || {
        let mut rank: Vec<u32> = (0..p.len() as u32).collect();
        for i in (1..rank.len()).rev() {
            rank.swap(i, rng.below(i + 1));
        }
        rank
    };
    while !out.proven_optimal && out.nodes < max_nodes && Instant::now() < deadline {
        let mut ranks = preorders.clone();
        ranks.extend((0..RANDOM_PREORDERS).map(|_| random_rank()));
        // The point searches at the bound first, over every preorder: on instances with slack (the
        // networks' and MiniMalloc's), one of them often ends at the bound within the round's few
        // nodes, while a sweep node costs several point nodes there (it checks every section of the
        // placed tensor's lifetime).
        for rank in &ranks {
            if out.proven_optimal || bound_settled || out.nodes >= max_nodes || Instant::now() >= deadline {
                break;
            }
            let nodes = limit.min(max_nodes.saturating_sub(out.nodes));
            if nodes > 0 {
                let mut s = Search::new(p, rank, out.best_bound, true, nodes, deadline);
                s.dom = at_bound.as_ref();
                let end = s.run();
                out.nodes += nodes - s.nodes_left;
                match end {
                    End::Found => {
                        keep(s.best.take(), &mut out);
                        out.proven_optimal = true;
                        break;
                    }
                    End::Exhausted => {
                        // Nothing fits the most bytes live at one op: the optimum is above it.
                        bound_settled = true;
                        out.best_bound = out.best_bound.saturating_add(1).min(out.size);
                    }
                    End::Limit => {}
                }
            }
        }
        for rank in &ranks {
            if out.size <= out.best_bound {
                out.proven_optimal = true;
            }
            if out.proven_optimal || out.nodes >= max_nodes || Instant::now() >= deadline {
                break;
            }
            let nodes =
                (limit.saturating_mul(SWEEP_NODES).saturating_mul(full_sections) / nsec).min(max_nodes - out.nodes);
            if !bound_settled && nodes > 0 {
                let mut s = Sweep::new(p, rank, out.best_bound, nodes, deadline);
                s.dom = at_bound.as_ref();
                if let Some(units) = out.best_bound.checked_div(s.unit) {
                    s.cache = match sums_cache.take() {
                        Some(c) if c.cap as u64 == units => Some(c),
                        _ => SumsCache::new(p, units),
                    };
                }
                let end = s.run();
                sums_cache = s.cache.take();
                out.nodes += nodes - s.nodes_left;
                if end == End::Found {
                    keep(s.best.take(), &mut out);
                    out.proven_optimal = out.size <= out.best_bound;
                    if out.proven_optimal {
                        break;
                    }
                }
            }
            let nodes = limit.min(max_nodes.saturating_sub(out.nodes));
            if nodes == 0 || Instant::now() >= deadline {
                break;
            }
            // Decision searches between the bound and the best plan (bisection): a plan found lowers
            // the top; an exhausted search proves a better bound; one stopped by its node limit
            // raises the bottom of this round only (the optimisation search below, and the next
            // rounds, still look there).
            let (mut lo, mut hi) = (out.best_bound, out.size);
            for _ in 0..8 {
                let nodes = limit.min(max_nodes.saturating_sub(out.nodes));
                if hi <= lo + 1 || nodes == 0 || Instant::now() >= deadline {
                    break;
                }
                let mid = lo + (hi - lo) / 2;
                let mut s = Search::new(p, rank, mid, true, nodes, deadline);
                s.canon = canon;
                let end = s.run();
                let (found, used) = (s.best.take(), nodes - s.nodes_left);
                out.nodes += used;
                match end {
                    End::Found => {
                        keep(found, &mut out);
                        hi = out.size;
                    }
                    End::Exhausted => {
                        // A proof: no plan fits in `mid` bytes.
                        out.best_bound = out.best_bound.max(mid + 1);
                        lo = mid;
                    }
                    End::Limit => lo = mid,
                }
            }
            let nodes = limit.min(max_nodes.saturating_sub(out.nodes));
            if nodes == 0 || Instant::now() >= deadline {
                break;
            }
            let below_best = Domains::new(p, out.size - 1);
            let mut s = Search::new(p, rank, out.size - 1, false, nodes, deadline);
            s.dom = below_best.as_ref();
            s.floor_of_plans = out.best_bound;
            s.canon = canon;
            let end = s.run();
            out.nodes += nodes - s.nodes_left;
            keep(s.best.take(), &mut out);
            if end != End::Limit || out.size <= out.best_bound {
                // Exhausted: no plan below the best one exists. Found: a plan at the bound.
                out.proven_optimal = true;
                out.best_bound = out.size;
            }
        }
        limit = limit.saturating_mul(2);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::hard::{guillotine_with_plan, tiling_with_plan, HardSpec};

    impl Search<'_> {
        /// Walks down the branch that leads to `target` (offsets per problem tensor, a valid plan
        /// within `cap`): the pruning must keep it open at every step.
        fn follow(&mut self, target: &[u64]) -> Result<(), String> {
            if !self.feasible() {
                return Err("root refused".into());
            }
            let p = self.p;
            while self.placed < p.len() {
                let m = self.floor.iter().zip(&self.left).filter(|&(_, &l)| l > 0).map(|(&f, _)| f).min().unwrap();
                let star = self.choose(m);
                let at =
                    p.members[star].iter().map(|&c| c as usize).find(|&c| self.offset[c] == NONE && target[c] == m);
                match at {
                    Some(c) => {
                        if self.rest_of[c] != m {
                            return Err(format!(
                                "tensor {c} starts at {m} in the plan but rests at {}",
                                self.rest_of[c]
                            ));
                        }
                        self.raise(p.lo[c], p.hi[c], m + p.size[c]);
                        for s in p.lo[c]..p.hi[c] {
                            self.left[s as usize] -= p.size[c];
                        }
                        self.offset[c] = m;
                        self.placed += 1;
                    }
                    None => {
                        let Some(w) = self.waste_to(star, m) else { return Err("waste refused".into()) };
                        let lowest = p.members[star]
                            .iter()
                            .map(|&c| c as usize)
                            .filter(|&c| self.offset[c] == NONE)
                            .map(|c| target[c])
                            .min()
                            .unwrap();
                        if w > lowest {
                            return Err(format!("waste to {w} buries a tensor at {lowest}"));
                        }
                        self.raise(star as u32, star as u32 + 1, w);
                    }
                }
                if !self.feasible() {
                    return Err(format!("pruned after {} placements", self.placed));
                }
            }
            Ok(())
        }
    }

    #[test]
    fn bits_or_shifted_is_a_shift_by_k_bits() {
        let mut rng = Rng(0x1234_5678_9ABC_DEF1);
        for _ in 0..2_000 {
            let len = 1 + rng.below(6);
            let words: Vec<u64> =
                (0..len).map(|_| (rng.below(1 << 30) as u64) << 34 | rng.below(1 << 30) as u64).collect();
            let k = [0, 64, 128, rng.below(64 * len + 70)][rng.below(4)];
            let mut b = Bits(words.clone());
            b.or_shifted(k);
            let naive: Vec<u64> = (0..len)
                .map(|w| {
                    (0..64).fold(words[w], |acc, bit| {
                        let i = w * 64 + bit;
                        let from = i.checked_sub(k);
                        let set = from.is_some_and(|f| words[f / 64] >> (f % 64) & 1 == 1);
                        acc | (set as u64) << bit
                    })
                })
                .collect();
            assert_eq!(b.0, naive, "k {k}");
        }
    }

    #[test]
    fn bits_prev_finds_the_highest_bit_at_or_below() {
        let mut b = Bits(vec![0; 4]);
        assert_eq!(b.prev(199), None);
        b.0[0] = 1 << 5;
        b.0[2] = 1 << 3; // bit 131
        assert_eq!(b.prev(4), None);
        assert_eq!(b.prev(5), Some(5));
        assert_eq!(b.prev(63), Some(5));
        assert_eq!(b.prev(130), Some(5));
        assert_eq!(b.prev(131), Some(131));
        assert_eq!(b.prev(191), Some(131));
        assert_eq!(b.prev(10_000), Some(131));
    }

    #[test]
    fn sweep_look_ahead_refuses_a_free_interval_no_sizes_fill() {
        // Ops 0 and 1, 10 bytes live at each: a (4 bytes) lives through both; b (6) at op 0; c and d
        // (3 each) at op 1. With a at 3, op 1 leaves 3 + 3 bytes free: c and d fit. With a at 2 it
        // leaves 2 + 4: no subset of {3, 3} makes 2.
        let ts = [
            Tensor::new("a", 4, 0, 1),
            Tensor::new("b", 6, 0, 0),
            Tensor::new("c", 3, 1, 1),
            Tensor::new("d", 3, 1, 1),
        ];
        let p = Problem::new(&ts).unwrap();
        let rank: Vec<u32> = (0..p.len() as u32).collect();
        let far = Instant::now() + std::time::Duration::from_secs(60);
        let mut s = Sweep::new(&p, &rank, 10, u64::MAX, far);
        assert_eq!(s.unit, 1);
        s.offset[0] = 3;
        assert!(s.check(1, 2));
        s.offset[0] = 2;
        s.pos[0] = 7;
        assert!(!s.check(1, 2));
        // The refusal depends on a's placement alone (the interval under it is bounded by 0).
        assert_eq!(s.why, [7]);
        // With two bytes to spare at op 1 the same arrangement is allowed.
        let mut s = Sweep::new(&p, &rank, 12, u64::MAX, far);
        s.offset[0] = 2;
        assert!(s.check(1, 2));
    }

    #[test]
    fn sweep_look_ahead_answers_the_same_with_the_cache() {
        // Along the constructed plan of hard instances, each starting tensor is tried at other
        // offsets too: the look-ahead with the kept subset sums must refuse exactly what it refuses
        // when it computes them anew, for the same placements.
        let (mut refused, mut checked) = (0, 0);
        for seed in 0..4 {
            let spec = HardSpec::new(60, seed);
            for (ts, plan) in [tiling_with_plan(spec), guillotine_with_plan(spec)] {
                let p = Problem::new(&ts).unwrap();
                let target: Vec<u64> = p.index.iter().map(|&i| plan[i]).collect();
                let rank: Vec<u32> = (0..p.len() as u32).collect();
                let far = Instant::now() + std::time::Duration::from_secs(60);
                let mut plain = Sweep::new(&p, &rank, spec.bound, 1, far);
                let mut kept = Sweep::new(&p, &rank, spec.bound, 1, far);
                kept.cache = SumsCache::new(&p, spec.bound / kept.unit);
                assert!(kept.cache.is_some());
                let mut rng = Rng(seed + 1);
                for sec in 0..p.members.len() {
                    for c in plain.starters[sec].clone() {
                        let c = c as usize;
                        let units = (spec.bound - p.size[c]) / plain.unit;
                        for k in 0..8 {
                            let o = if k == 0 { target[c] } else { rng.below(units as usize + 1) as u64 * plain.unit };
                            plain.offset[c] = o;
                            kept.offset[c] = o;
                            let (a, b) = (plain.check(sec, p.hi[c] as usize), kept.check(sec, p.hi[c] as usize));
                            assert_eq!(a, b, "seed {seed}: tensor {c} at {o}");
                            if !a {
                                assert_eq!(plain.why, kept.why);
                                refused += 1;
                            }
                            checked += 1;
                        }
                        plain.offset[c] = target[c];
                        kept.offset[c] = target[c];
                    }
                }
            }
        }
        assert!(refused > checked / 10, "{refused} of {checked}: the test must see refusals");
    }

    #[test]
    fn sweep_look_ahead_keeps_the_constructed_plan_open() {
        for seed in 0..8 {
            for n in [100, 200] {
                let spec = HardSpec::new(n, seed);
                for (kind, (ts, plan)) in
                    [("tiling", tiling_with_plan(spec)), ("guillotine", guillotine_with_plan(spec))]
                {
                    let p = Problem::new(&ts).unwrap();
                    let target: Vec<u64> = p.index.iter().map(|&i| plan[i]).collect();
                    let dom = Domains::new(&p, spec.bound).unwrap();
                    let rank: Vec<u32> = (0..p.len() as u32).collect();
                    let mut s = Sweep::new(&p, &rank, spec.bound, 1, Instant::now());
                    assert!(s.unit > 0);
                    for sec in 0..p.members.len() {
                        for c in s.starters[sec].clone() {
                            let c = c as usize;
                            assert!(dom.allows(c, target[c]), "{kind} {n}/{seed}: domain refuses {c}");
                            s.offset[c] = target[c];
                            assert!(s.check(sec, p.hi[c] as usize), "{kind} {n}/{seed}: look-ahead refuses {c}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn sweep_reaches_the_bound_of_small_hard_instances() {
        for seed in 0..8 {
            for n in [30, 40] {
                let spec = HardSpec::new(n, seed);
                for (kind, ts) in [("tiling", tiling_with_plan(spec).0), ("guillotine", guillotine_with_plan(spec).0)] {
                    let p = Problem::new(&ts).unwrap();
                    let dom = Domains::new(&p, spec.bound);
                    let far = Instant::now() + std::time::Duration::from_secs(60);
                    let found = p.preorders().iter().any(|rank| {
                        let mut s = Sweep::new(&p, rank, spec.bound, 200_000, far);
                        s.dom = dom.as_ref();
                        s.run() == End::Found && s.best.as_ref().is_some_and(|b| b.1 == spec.bound)
                    });
                    assert!(found, "{kind} {n}/{seed}");
                }
            }
        }
    }

    #[test]
    fn incremental_feasibility_matches_a_full_pass() {
        // Random walks down and back up the point search's branches (placements at the lowest
        // point, spaces left empty, undos), with and without domains, at the bound and above it:
        // after every step the incremental check answers as a full pass over every tensor and
        // section does, with the same lowest offsets.
        let mut steps = 0;
        let mut refused = 0;
        for seed in 0..6 {
            let spec = HardSpec::new(80, seed);
            for (kind, ts) in [("tiling", tiling_with_plan(spec).0), ("guillotine", guillotine_with_plan(spec).0)] {
                let p = Problem::new(&ts).unwrap();
                let rank: Vec<u32> = (0..p.len() as u32).collect();
                for cap in [spec.bound, spec.bound + spec.bound / 20] {
                    let dom = Domains::new(&p, cap);
                    for with_dom in [false, true] {
                        let far = Instant::now() + std::time::Duration::from_secs(60);
                        let mut s = Search::new(&p, &rank, cap, true, u64::MAX, far);
                        if with_dom {
                            s.dom = dom.as_ref();
                        }
                        let mut rng = Rng(seed * 31 + 7);
                        // Undo log of the walk: (floor-log mark, tensor placed or none).
                        let mut walk: Vec<(Mark, Option<usize>)> = Vec::new();
                        let mut ok = s.feasible();
                        for _ in 0..300 {
                            let back = !walk.is_empty() && (!ok || s.placed == p.len() || rng.below(4) == 0);
                            let mut moved = false;
                            if !back && s.placed < p.len() {
                                let m = s
                                    .floor
                                    .iter()
                                    .zip(&s.left)
                                    .filter(|&(_, &l)| l > 0)
                                    .map(|(&f, _)| f)
                                    .min()
                                    .unwrap();
                                let star = s.choose(m);
                                let cands: Vec<usize> = p.members[star]
                                    .iter()
                                    .map(|&c| c as usize)
                                    .filter(|&c| s.offset[c] == NONE && s.rest_of[c] == m && m + p.size[c] <= cap)
                                    .collect();
                                let waste = s.waste_to(star, m);
                                let mark = s.mark();
                                let pick = rng.below(cands.len() + 1);
                                if pick < cands.len() {
                                    let c = cands[pick];
                                    s.raise(p.lo[c], p.hi[c], m + p.size[c]);
                                    for sec in p.lo[c]..p.hi[c] {
                                        s.left[sec as usize] -= p.size[c];
                                    }
                                    s.offset[c] = m;
                                    s.placed += 1;
                                    walk.push((mark, Some(c)));
                                    moved = true;
                                } else if let Some(w) = waste {
                                    s.raise(star as u32, star as u32 + 1, w);
                                    walk.push((mark, None));
                                    moved = true;
                                }
                            }
                            if !moved {
                                let Some((mark, c)) = walk.pop() else { break };
                                if let Some(c) = c {
                                    s.offset[c] = NONE;
                                    s.placed -= 1;
                                    for sec in p.lo[c]..p.hi[c] {
                                        s.left[sec as usize] += p.size[c];
                                    }
                                }
                                s.undo(mark);
                            }
                            ok = s.feasible();
                            let mut full = s.clone();
                            full.all_dirty = true;
                            assert_eq!(ok, full.feasible(), "{kind} {seed} cap {cap} dom {with_dom}");
                            for c in (0..p.len()).filter(|&c| s.offset[c] == NONE) {
                                assert_eq!(s.rest_of[c], full.rest_of[c], "{kind} {seed}: tensor {c}");
                                assert_eq!(s.top_of[c], full.top_of[c], "{kind} {seed}: tensor {c}");
                            }
                            assert_eq!(s.fails, full.fails, "{kind} {seed}");
                            steps += 1;
                            refused += !ok as usize;
                        }
                    }
                }
            }
        }
        assert!(steps > 5_000 && refused > 100, "{steps} steps, {refused} refused: the walks must see both");
    }

    #[test]
    fn pruning_keeps_the_constructed_plan_open() {
        for seed in 0..30 {
            for (kind, (ts, plan)) in [
                ("guillotine", guillotine_with_plan(HardSpec::new(150, seed))),
                ("tiling", tiling_with_plan(HardSpec::new(150, seed))),
            ] {
                let p = Problem::new(&ts).unwrap();
                let target: Vec<u64> = p.index.iter().map(|&i| plan[i]).collect();
                let rank: Vec<u32> = (0..p.len() as u32).collect();
                let bound = HardSpec::new(150, seed).bound;
                let mut s =
                    Search::new(&p, &rank, bound, true, u64::MAX, Instant::now() + std::time::Duration::from_secs(60));
                s.follow(&target).unwrap_or_else(|e| panic!("{kind} seed {seed}: {e}"));
            }
        }
    }

    fn on_big_stack(f: impl FnOnce() + Send) {
        std::thread::scope(|scope| {
            std::thread::Builder::new().stack_size(STACK_BYTES).spawn_scoped(scope, f).unwrap().join().unwrap()
        })
    }

    /// Whether a plan's offsets (per problem tensor) make a valid plan of `ts` within `cap`
    /// (`plan::validate`; the zero-sized tensors the problem leaves out go at 0).
    fn valid(ts: &[Tensor], p: &Problem, offs: &[u64], cap: u64) -> bool {
        let mut full = vec![0u64; ts.len()];
        for (k, &i) in p.index.iter().enumerate() {
            full[i] = offs[k];
        }
        crate::plan::validate(ts, &full, cap).is_ok()
    }

    fn random_small(rng: &mut Rng, n: usize) -> Vec<Tensor> {
        (0..n)
            .map(|i| {
                let first = rng.below(8) as u32;
                let last = first + rng.below(5) as u32;
                let mut t = Tensor::new(format!("t{i}"), 1 + rng.below(9) as u64, first, last);
                t.align = [1, 1, 2, 4][rng.below(4)];
                t
            })
            .collect()
    }

    #[test]
    fn canonical_search_agrees_with_the_point_search() {
        // The searches recurse once per node: on a stack as large as `improve`'s (debug builds
        // take more per frame).
        on_big_stack(|| {
            // Both searches are complete: at every capacity they find a plan, or both prove there is
            // none; with the domains of that capacity or without.
            let mut rng = Rng(0x5DEE_CE66_D1CE_4E5B);
            let far = Instant::now() + std::time::Duration::from_secs(600);
            let (mut found, mut refused, mut brute_checked) = (0, 0, 0);
            for _ in 0..300 {
                let n = 4 + rng.below(8);
                let ts = random_small(&mut rng, n);
                let p = Problem::new(&ts).unwrap();
                let bound = p.section_total.iter().copied().max().unwrap();
                let rank: Vec<u32> = (0..p.len() as u32).collect();
                for cap in bound..bound + 4 {
                    let dom = Domains::new(&p, cap);
                    for with_dom in [false, true] {
                        let mut ends = Vec::new();
                        for canon in [false, true] {
                            let mut s = Search::new(&p, &rank, cap, true, u64::MAX, far);
                            s.canon = canon;
                            if with_dom {
                                s.dom = dom.as_ref();
                            }
                            let end = s.run();
                            if end == End::Found {
                                let (offs, size) = s.best.clone().unwrap();
                                assert!(size <= cap && valid(&ts, &p, &offs, cap), "canon {canon}: an invalid plan");
                            }
                            ends.push(end);
                        }
                        assert_eq!(ends[0], ends[1], "cap {cap} (bound {bound}), domains {with_dom}: {ts:?}");
                        if p.len() <= 7 {
                            // Small enough to try every aligned offset of every tensor: the pruning
                            // both share must not refuse a capacity that holds a plan.
                            assert_eq!(ends[0] == End::Found, brute(&p, cap), "cap {cap}: {ts:?}");
                            brute_checked += 1;
                        }
                        found += (ends[0] == End::Found) as usize;
                        refused += (ends[0] == End::Exhausted) as usize;
                    }
                }
            }
            assert!(found > 300 && refused > 100, "{found} found, {refused} refused: both answers must be seen");
            assert!(brute_checked > 200, "{brute_checked} checked by trying every offset");
        });
    }

    /// Whether some plan within `cap` exists: every aligned offset of every tensor, in turn.
    fn brute(p: &Problem, cap: u64) -> bool {
        fn place(p: &Problem, cap: u64, offs: &mut Vec<u64>) -> bool {
            let a = offs.len();
            if a == p.len() {
                return true;
            }
            let mut o = 0;
            while o + p.size[a] <= cap {
                let clear = (0..a).all(|b| {
                    p.hi[a] <= p.lo[b] || p.hi[b] <= p.lo[a] || o + p.size[a] <= offs[b] || offs[b] + p.size[b] <= o
                });
                if clear {
                    offs.push(o);
                    if place(p, cap, offs) {
                        return true;
                    }
                    offs.pop();
                }
                o += p.align[a];
            }
            false
        }
        place(p, cap, &mut Vec::new())
    }

    #[test]
    fn canonical_search_needs_no_chains_of_empty_space() {
        // The searches recurse once per node: on a stack as large as `improve`'s (debug builds
        // take more per frame).
        on_big_stack(|| {
            // Long-lived small tensors under short-lived large ones, with room to spare (as in
            // MiniMalloc's benchmark instances): the point search climbs the room a step at a time,
            // one node per step (each step as high as the smallest neighbour), the canonical search
            // places a tensor at every node.
            let mut rng = Rng(0x2545_F491_4F6C_DD1D);
            // `count` tensors: starting below `starts`, of 1 KiB times `units` (plus up to `more`
            // - 1), living `life` ops and up to `longer` - 1 more.
            let mut ts = Vec::new();
            let mut add = |name: &str,
                           count: usize,
                           starts: usize,
                           units: u64,
                           more: usize,
                           life: u32,
                           longer: usize| {
                for i in 0..count {
                    let first = rng.below(starts) as u32;
                    let size = 1024 * (units + rng.below(more) as u64);
                    ts.push(Tensor::new(format!("{name}{i}"), size, first, first + life + rng.below(longer) as u32));
                }
            };
            add("long", 60, 150, 1, 4, 50, 100);
            add("short", 140, 290, 8, 56, 1, 8);
            let p = Problem::new(&ts).unwrap();
            let bound = p.section_total.iter().copied().max().unwrap();
            let cap = bound + bound / 5;
            let far = Instant::now() + std::time::Duration::from_secs(600);
            let mut used = Vec::new();
            for canon in [false, true] {
                let mut worst = 0;
                for rank in p.preorders() {
                    let mut s = Search::new(&p, &rank, cap, true, 200_000, far);
                    s.canon = canon;
                    assert_eq!(s.run(), End::Found, "canon {canon}");
                    let (offs, _) = s.best.clone().unwrap();
                    assert!(valid(&ts, &p, &offs, cap));
                    worst = worst.max(200_000 - s.nodes_left);
                }
                used.push(worst);
            }
            let n = p.len() as u64;
            assert!(used[1] <= 2 * n && used[0] > 2 * used[1], "nodes, point and canonical: {used:?} for {n} tensors");
        });
    }

    #[test]
    fn domains_are_the_per_tensor_subset_sums_where_computed() {
        // Domains computed once per size in a section are those computed per tensor; sections with
        // room to spare are left out, which only allows more.
        fn per_tensor(p: &Problem, cap: u64) -> Vec<Bits> {
            let unit = p.size.iter().fold(cap, |g, &x| gcd(g, x));
            let units = (cap / unit) as usize;
            let mut of: Vec<Bits> = (0..p.len()).map(|b| Bits::ones(units + 1 - (p.size[b] / unit) as usize)).collect();
            for (s, members) in p.members.iter().enumerate() {
                let spare = ((cap - p.section_total[s].min(cap)) / unit) as usize;
                let mut sums = Bits(Vec::new());
                for &c in members {
                    let others = members.iter().filter(|&&o| o != c).map(|&o| (p.size[o as usize] / unit) as usize);
                    sums.subset_sums(units + 1, others);
                    sums.dilate(spare);
                    of[c as usize].and(&sums);
                }
            }
            of
        }
        for seed in 0..6 {
            let spec = HardSpec::new(60, seed);
            let (full, _) = tiling_with_plan(spec);
            let p = Problem::new(&full).unwrap();
            let d = Domains::new(&p, spec.bound).unwrap();
            assert_eq!(
                d.of.iter().map(|b| &b.0).collect::<Vec<_>>(),
                per_tensor(&p, spec.bound).iter().map(|b| &b.0).collect::<Vec<_>>()
            );
            // Some sections with room to spare, left out, and the others computed.
            let cap = spec.bound + (spec.bound / 20) / 4096 * 4096;
            let d = Domains::new(&p, cap).unwrap();
            for (b, naive) in per_tensor(&p, cap).iter().enumerate() {
                let len = naive.0.len() * 64;
                assert!((0..len).all(|i| !naive.get(i) || d.of[b].get(i)), "seed {seed}: tensor {b}");
            }
        }
    }
}
