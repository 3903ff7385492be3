//! Sizing advice (`EDGEPOOL_PROFILE=1`): "profile, then size" as a command.
//!
//! While the process runs, every request is counted in a histogram of sizes (16-byte buckets up to
//! 16 KiB, powers of two above), and the live blocks of each size class and the live bytes of large
//! blocks are tracked with their peaks (`global` calls [`on_alloc`] and [`on_free`] on the branch it
//! takes for valgrind and debug mode; atomics, no lock). At exit [`report`] prints on stderr:
//!
//! - the waste of today's classes for this run: bytes handed out beyond the bytes requested, per class
//!   and in all;
//! - the classes that would have served this run's requests with the least waste, as many as today's
//!   (an exact dynamic program over the histogram's buckets), and their waste;
//! - the pool that would have held the run's peak with 1.2× headroom: per class, blocks and slabs of
//!   64 KiB; for large blocks, bytes.

use core::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::os::{self, MsgBuf};
use crate::size_class::{CLASS_SIZES, GEOMETRY, NCLASSES, SMALL_MAX};

/// 16-byte buckets of requests up to `SMALL_MAX`: bucket `i` holds sizes `16 i + 1 ..= 16 (i + 1)`
/// (size 0 counts as 1).
const BUCKETS: usize = SMALL_MAX / 16;

/// Set once profiling is on (for debuggers and core files: the counters below are only written then).
static ON: AtomicU8 = AtomicU8::new(0);
/// Requests per 16-byte bucket, and their requested bytes.
static COUNT: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];
static BYTES: [AtomicU64; BUCKETS] = [const { AtomicU64::new(0) }; BUCKETS];
/// Requests above `SMALL_MAX` by power of two (index `k`: sizes up to `2^k`), and their bytes.
static LARGE_COUNT: [AtomicU64; 64] = [const { AtomicU64::new(0) }; 64];
static LARGE_BYTES: AtomicU64 = AtomicU64::new(0);
/// Blocks handed out per class (by the class that served them), live now and at the peak.
static ALLOCS: [AtomicU64; NCLASSES] = [const { AtomicU64::new(0) }; NCLASSES];
static LIVE: [AtomicU64; NCLASSES] = [const { AtomicU64::new(0) }; NCLASSES];
static PEAK: [AtomicU64; NCLASSES] = [const { AtomicU64::new(0) }; NCLASSES];
/// Usable bytes of large blocks, live now and at the peak.
static LARGE_LIVE: AtomicU64 = AtomicU64::new(0);
static LARGE_PEAK: AtomicU64 = AtomicU64::new(0);

/// Turns profiling on (allocation-free; the caller registers [`report`] at exit).
pub fn start() {
    ON.store(1, Ordering::Relaxed);
}

/// The class whose slots are exactly `usable` bytes, if any.
fn class_of_slot(usable: usize) -> Option<usize> {
    CLASS_SIZES.iter().position(|&c| c == usable)
}

/// A request of `size` bytes was served by a block of `usable` bytes.
pub fn on_alloc(size: usize, usable: usize) {
    if size <= SMALL_MAX {
        let b = size.max(1).div_ceil(16) - 1;
        COUNT[b].fetch_add(1, Ordering::Relaxed);
        BYTES[b].fetch_add(size as u64, Ordering::Relaxed);
    } else {
        let k = size.next_power_of_two().trailing_zeros() as usize;
        LARGE_COUNT[k].fetch_add(1, Ordering::Relaxed);
        LARGE_BYTES.fetch_add(size as u64, Ordering::Relaxed);
    }
    match class_of_slot(usable).filter(|_| usable <= SMALL_MAX) {
        Some(c) => {
            ALLOCS[c].fetch_add(1, Ordering::Relaxed);
            let live = LIVE[c].fetch_add(1, Ordering::Relaxed) + 1;
            PEAK[c].fetch_max(live, Ordering::Relaxed);
        }
        None => {
            let live = LARGE_LIVE.fetch_add(usable as u64, Ordering::Relaxed) + usable as u64;
            LARGE_PEAK.fetch_max(live, Ordering::Relaxed);
        }
    }
}

/// A block of `usable` bytes is freed.
pub fn on_free(usable: usize) {
    match class_of_slot(usable).filter(|_| usable <= SMALL_MAX) {
        Some(c) => LIVE[c].fetch_sub(1, Ordering::Relaxed),
        None => LARGE_LIVE.fetch_sub(usable as u64, Ordering::Relaxed),
    };
}

/// What a set of classes makes of this run's histogram.
pub struct Plan {
    /// The classes, ascending (the last one is `SMALL_MAX`).
    pub classes: [usize; NCLASSES],
    pub n: usize,
    /// Bytes handed out beyond the bytes requested, over every request up to `SMALL_MAX`.
    pub waste: u64,
}

/// The histogram now: requests and bytes per 16-byte bucket.
pub fn histogram() -> ([u64; BUCKETS], [u64; BUCKETS]) {
    let mut c = [0u64; BUCKETS];
    let mut b = [0u64; BUCKETS];
    for i in 0..BUCKETS {
        c[i] = COUNT[i].load(Ordering::Relaxed);
        b[i] = BYTES[i].load(Ordering::Relaxed);
    }
    (c, b)
}

/// The waste of serving the histogram `(count, bytes)` with `classes` (ascending, the last `SMALL_MAX`).
pub fn waste_of(count: &[u64; BUCKETS], bytes: &[u64; BUCKETS], classes: &[usize]) -> u64 {
    let mut w = 0;
    for i in 0..BUCKETS {
        if count[i] == 0 {
            continue;
        }
        let top = 16 * (i + 1);
        let c = classes.iter().copied().find(|&c| c >= top).unwrap_or(SMALL_MAX);
        w += count[i] * c as u64 - bytes[i];
    }
    w
}

/// The `k` classes (multiples of 16, the largest `SMALL_MAX`) that serve the histogram with the least
/// waste: a dynamic program over the buckets, exact for class sizes that are multiples of 16.
pub fn best_classes(count: &[u64; BUCKETS], bytes: &[u64; BUCKETS], k: usize) -> Plan {
    let k = k.clamp(1, NCLASSES);
    // Prefix sums: requests and bytes of buckets below `i`.
    let mut pc = [0u64; BUCKETS + 1];
    let mut pb = [0u64; BUCKETS + 1];
    for i in 0..BUCKETS {
        pc[i + 1] = pc[i] + count[i];
        pb[i + 1] = pb[i] + bytes[i];
    }
    // Waste of buckets `a..=j` served by a class of `16 (j + 1)` bytes.
    let seg = |a: usize, j: usize| (pc[j + 1] - pc[a]) * (16 * (j + 1)) as u64 - (pb[j + 1] - pb[a]);
    // cost[m][j]: least waste of buckets 0..=j with m + 1 classes, the largest 16 (j + 1).
    let mut cost = [[u64::MAX; BUCKETS]; NCLASSES];
    let mut from = [[0u16; BUCKETS]; NCLASSES];
    for (j, c) in cost[0].iter_mut().enumerate() {
        *c = seg(0, j);
    }
    for m in 1..k {
        for j in 0..BUCKETS {
            let mut best = cost[m - 1][j];
            let mut arg = u16::MAX;
            for (i, &c) in cost[m - 1].iter().enumerate().take(j) {
                if c != u64::MAX {
                    let v = c + seg(i + 1, j);
                    if v < best {
                        best = v;
                        arg = i as u16;
                    }
                }
            }
            cost[m][j] = best;
            from[m][j] = arg;
        }
    }
    // Walk back from the largest class, SMALL_MAX.
    let mut classes = [0usize; NCLASSES];
    let mut n = 0;
    let mut j = BUCKETS - 1;
    let mut m = k - 1;
    loop {
        classes[n] = 16 * (j + 1);
        n += 1;
        // Find the row that holds the next class below (skipping rows that added none).
        while m > 0 && from[m][j] == u16::MAX {
            m -= 1;
        }
        if m == 0 {
            break;
        }
        j = from[m][j] as usize;
        m -= 1;
    }
    classes[..n].reverse();
    Plan { classes, n, waste: cost[k - 1][BUCKETS - 1] }
}

/// Writes the report (see the module documentation) to `fd`.
pub fn write_report(fd: libc::c_int) {
    let (count, bytes) = histogram();
    let requests: u64 = count.iter().sum();
    let requested: u64 = bytes.iter().sum();
    let large: u64 = LARGE_COUNT.iter().map(|c| c.load(Ordering::Relaxed)).sum();
    let today = waste_of(&count, &bytes, &CLASS_SIZES);
    let line = |m: &MsgBuf| os::write_fd(fd, m.as_bytes());
    let mut m = MsgBuf::new();
    m.str("edgepool profile (EDGEPOOL_PROFILE): ").num(requests + large).str(" allocations, ");
    m.num(requests).str(" of them up to 16 KiB (").num(requested).str(" bytes requested), ").num(large);
    m.str(" larger (").num(LARGE_BYTES.load(Ordering::Relaxed)).str(" bytes requested)\n");
    line(&m);
    let mut m = MsgBuf::new();
    m.str("today's ").num(NCLASSES as u64).str(" classes: waste ").num(today).str(" bytes (");
    pct(&mut m, today, requested + today).str(" of the bytes handed out)\n");
    line(&m);
    line(MsgBuf::new().str("  class  allocations  peak live  waste bytes  pool for the peak x1.2\n"));
    let mut pool_total = 0u64;
    for c in 0..NCLASSES {
        let allocs = ALLOCS[c].load(Ordering::Relaxed);
        if allocs == 0 {
            continue;
        }
        // Requests this class serves: buckets above the class below, up to this class.
        let lo = if c == 0 { 0 } else { CLASS_SIZES[c - 1] / 16 };
        let hi = CLASS_SIZES[c] / 16;
        let w: u64 = (lo..hi).map(|i| count[i] * CLASS_SIZES[c] as u64 - bytes[i]).sum();
        let peak = PEAK[c].load(Ordering::Relaxed);
        let blocks = (peak * 12).div_ceil(10);
        let slabs = blocks.div_ceil(GEOMETRY[c].nslots as u64);
        pool_total += slabs * crate::size_class::SLAB_SIZE as u64;
        let mut m = MsgBuf::new();
        m.str("  ");
        m.num_padded(CLASS_SIZES[c] as u64, 5).str("  ");
        m.num_padded(allocs, 11).str("  ");
        m.num_padded(peak, 9).str("  ");
        m.num_padded(w, 11).str("  ").num(blocks).str(" blocks = ").num(slabs).str(" slabs of 64 KiB\n");
        line(&m);
    }
    let large_pool = (LARGE_PEAK.load(Ordering::Relaxed) * 12).div_ceil(10);
    let mut m = MsgBuf::new();
    m.str("pools for the peak x1.2: ").num(pool_total).str(" bytes of slabs, ").num(large_pool);
    m.str(" bytes of large blocks (peak live ").num(LARGE_PEAK.load(Ordering::Relaxed)).str(")\n");
    line(&m);
    let best = best_classes(&count, &bytes, NCLASSES);
    let mut m = MsgBuf::new();
    m.str("least waste with ").num(best.n as u64).str(" classes: waste ").num(best.waste).str(" bytes (");
    pct(&mut m, best.waste, requested + best.waste).str("):");
    for &c in &best.classes[..best.n] {
        m.str(" ").num(c as u64);
    }
    m.str("\n");
    line(&m);
}

/// Appends `part / whole` as a percentage with one decimal.
fn pct(m: &mut MsgBuf, part: u64, whole: u64) -> &mut MsgBuf {
    let tenths = if whole == 0 { 0 } else { (part as u128 * 1000 / whole as u128) as u64 };
    m.fixed(tenths, 1).str(" %")
}

/// At exit: the report on stderr.
pub extern "C" fn report() {
    write_report(2);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_classes_are_exact_on_a_small_histogram_and_never_worse_than_today() {
        let mut count = [0u64; BUCKETS];
        let mut bytes = [0u64; BUCKETS];
        // 1000 requests of 24 bytes, 500 of 200, 10 of 4000.
        for (size, n) in [(24usize, 1000u64), (200, 500), (4000, 10)] {
            count[size.div_ceil(16) - 1] += n;
            bytes[size.div_ceil(16) - 1] += n * size as u64;
        }
        let p = best_classes(&count, &bytes, 3);
        // The largest class is always SMALL_MAX.
        assert_eq!(&p.classes[..p.n], &[32, 208, SMALL_MAX]);
        assert_eq!(p.waste, 1000 * 8 + 500 * 8 + 10 * (SMALL_MAX as u64 - 4000));
        assert_eq!(waste_of(&count, &bytes, &p.classes[..p.n]), p.waste);
        let today = waste_of(&count, &bytes, &CLASS_SIZES);
        assert_eq!(today, 1000 * 8 + 500 * 56 + 10 * 96);
        assert!(best_classes(&count, &bytes, NCLASSES).waste <= today);
        // One class: everything in the largest.
        let one = best_classes(&count, &bytes, 1);
        assert_eq!(&one.classes[..one.n], &[SMALL_MAX]);
    }
}
