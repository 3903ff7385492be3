//! Statistics: one declarative list of counters generates the live atomic struct and its snapshot.
//!
//! Counters are added to with relaxed atomics on slow paths only (slab refills, block allocation,
//! thread start and exit); the small-object fast paths stay free of shared writes. Heap-wide figures
//! (bytes taken from the OS, free and dirty bytes) are filled in by the heap under its lock
//! (`heap::stats`); [`write_report`] prints a report without allocating.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::os;

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident,)*) => {
        /// Live counters, updated by the allocator.
        pub struct Counters { $($(#[doc = $doc])* pub $name: AtomicUsize,)* }
        impl Counters {
            pub const fn new() -> Self { Counters { $($name: AtomicUsize::new(0),)* } }
            pub fn snapshot(&self) -> CounterValues {
                CounterValues { $($name: self.$name.load(Ordering::Relaxed),)* }
            }
        }
        /// A copy of the counters at one moment.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct CounterValues { $($(#[doc = $doc])* pub $name: usize,)* }
        impl CounterValues {
            /// `(name, value)` for every counter, in declaration order.
            pub fn fields(&self) -> [(&'static str, usize); [$(stringify!($name)),*].len()] {
                [$((stringify!($name), self.$name)),*]
            }
        }
    };
}

counters! {
    /// slabs taken from the buddy heap
    slabs_acquired,
    /// slabs given back to the buddy heap (became empty)
    slabs_released,
    /// allocation slow paths: a small request that found neither a recently freed slot nor a free bit
    /// in its row's checked-out word (a new word, slab or thread cache follows)
    slab_refills,
    /// slabs queued for their owner by another thread's free (the first remote free into a slab since
    /// its owner last collected them; later ones join the same queue entry uncounted)
    remote_frees,
    /// large (buddy) allocations
    large_allocs,
    /// large (buddy) frees
    large_frees,
    /// reallocations of large blocks done in place
    large_realloc_in_place,
    /// requests mapped directly from the OS (beyond the largest buddy block)
    direct_allocs,
    /// direct mappings unmapped
    direct_frees,
    /// bytes currently mapped directly
    direct_bytes,
    /// purge calls (madvise) that returned memory to the OS
    purges,
    /// bytes returned to the OS by purging
    purged_bytes,
    /// thread caches created (each reused after its thread exits)
    caches_created,
    /// thread caches adopted by a new thread after their thread exited
    caches_adopted,
    /// thread caches abandoned at thread exit
    caches_abandoned,
    /// load-arena chunks given back to the heap
    arena_chunks_released,
    /// requests refused because of the memory budget (EDGEPOOL_LIMIT)
    budget_refusals,
    /// requests refused because the OS or the reservation had no memory left
    oom_refusals,
    /// lock acquisitions that found the lock taken (all of edgepool's locks; in practice the heap's)
    lock_contended,
    /// nanoseconds threads spent waiting for those locks
    lock_wait_ns,
    /// large allocations (4-64 KiB runs) served from the thread's run cache, without the heap
    run_cache_hits,
    /// bytes of freed runs held in threads' run caches now (allocated in the heap's view)
    run_cache_bytes,
}

pub static COUNTERS: Counters = Counters::new();

/// Adds `by` to counter `c`.
#[inline]
pub fn add(c: &AtomicUsize, by: usize) {
    c.fetch_add(by, Ordering::Relaxed);
}

/// Subtracts `by` from counter `c` (gauges such as `direct_bytes`).
#[inline]
pub fn sub(c: &AtomicUsize, by: usize) {
    c.fetch_sub(by, Ordering::Relaxed);
}

/// Bytes held in slabs: slabs taken minus slabs given back, at the slab size.
pub fn slab_bytes() -> usize {
    let s = COUNTERS.slabs_acquired.load(Ordering::Relaxed);
    let r = COUNTERS.slabs_released.load(Ordering::Relaxed);
    s.saturating_sub(r) * crate::size_class::SLAB_SIZE
}

/// Writes the statistics report `s` to file descriptor `fd`, one figure a line, without allocating.
pub fn write_report(fd: libc::c_int, s: &Stats) {
    os::write_fd(fd, b"edgepool statistics\n");
    for (name, v) in s.fields() {
        let mut m = os::MsgBuf::new();
        m.str("  ").str(name).str(" ").num(v as u64).str("\n");
        os::write_fd(fd, m.as_bytes());
    }
}

/// Writes `s` to `fd` as one JSON object (`{"os_bytes": N, ...}`, the fields of [`Stats::fields`]),
/// without allocating.
pub fn write_json(fd: libc::c_int, s: &Stats) {
    os::write_fd(fd, b"{");
    for (i, (name, v)) in s.fields().enumerate() {
        let mut m = os::MsgBuf::new();
        m.str(if i == 0 { "\n  \"" } else { ",\n  \"" }).str(name).str("\": ").num(v as u64);
        os::write_fd(fd, m.as_bytes());
    }
    os::write_fd(fd, b"\n}\n");
}

/// A full statistics report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Bytes edgepool holds from the OS that may be resident: allocated heap blocks (slabs, large
    /// blocks, metadata), free heap blocks not yet purged, and direct mappings. The budget caps this.
    pub os_bytes: usize,
    /// The highest `os_bytes` seen.
    pub peak_os_bytes: usize,
    /// Heap address space committed (grown) so far.
    pub committed_bytes: usize,
    /// Free bytes inside the heap.
    pub free_bytes: usize,
    /// Free heap bytes that may still be resident (awaiting purge).
    pub dirty_free_bytes: usize,
    /// Bytes in slabs (including their free slots).
    pub slab_bytes: usize,
    /// The memory budget in effect (0 = none).
    pub limit_bytes: usize,
    pub counters: CounterValues,
    /// The allocator's calls into the OS's memory map: `mmap`, `munmap`, `madvise` (purges and
    /// populates), `mprotect` (heap growth, the hardened mode), `mremap` (direct mappings).
    pub os_mmap_calls: usize,
    pub os_munmap_calls: usize,
    pub os_madvise_calls: usize,
    pub os_mprotect_calls: usize,
    pub os_mremap_calls: usize,
    /// Page faults the process has taken (minor and major, every thread's, not only edgepool's
    /// memory): read before and after loading for the faults of a load.
    pub page_faults: usize,
}

impl Stats {
    /// `(name, value)` for every figure, then every counter: the order of the report and of the C
    /// API's `struct edgepool_stats` (which may only grow at its end).
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, usize)> {
        [
            ("os_bytes", self.os_bytes),
            ("peak_os_bytes", self.peak_os_bytes),
            ("committed_bytes", self.committed_bytes),
            ("free_bytes", self.free_bytes),
            ("dirty_free_bytes", self.dirty_free_bytes),
            ("slab_bytes", self.slab_bytes),
            ("limit_bytes", self.limit_bytes),
        ]
        .into_iter()
        .chain(self.counters.fields())
        .chain([
            ("os_mmap_calls", self.os_mmap_calls),
            ("os_munmap_calls", self.os_munmap_calls),
            ("os_madvise_calls", self.os_madvise_calls),
            ("os_mprotect_calls", self.os_mprotect_calls),
            ("os_mremap_calls", self.os_mremap_calls),
            ("page_faults", self.page_faults),
        ])
    }
}
