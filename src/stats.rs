//! Statistics: one declarative list of counters generates the live atomic struct and its snapshot.
//!
//! Counters are added to with relaxed atomics on slow paths only (block allocation, thread start
//! and exit); the small-object fast paths stay free of shared writes. The thread caches' own figures
//! (`slab_refills`, `remote_frees`, `slabs_acquired`, `slabs_released`, `run_cache_hits`,
//! `run_cache_bytes`, and the run cache's share of `large_allocs` and `large_frees`) are kept per
//! cache and added to the snapshot by the cache layer's completer (`cache::complete_stats`), so
//! [`COUNTERS`] holds only what no cache counted of them (frees by exiting threads). Heap-wide figures
//! (bytes taken from the OS, free and dirty bytes) are filled in by the heap under its lock
//! (`heap::stats`); [`write_report`] prints a report without allocating.

use core::sync::atomic::{AtomicUsize, Ordering};

use crate::os;
use crate::size_class::NCLASSES;

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
    /// large allocations (runs of up to 64 KiB) served from the thread's run cache, without the heap
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

/// Adds `by` to counter `c` and returns the new value.
#[inline]
pub fn add_fetch(c: &AtomicUsize, by: usize) -> usize {
    c.fetch_add(by, Ordering::Relaxed) + by
}

/// Subtracts `by` from counter `c` (gauges such as `direct_bytes`).
#[inline]
pub fn sub(c: &AtomicUsize, by: usize) {
    c.fetch_sub(by, Ordering::Relaxed);
}

/// Writes the statistics report `s` to file descriptor `fd`, one figure a line, without allocating.
pub fn write_report(fd: libc::c_int, s: &Stats) {
    os::write_fd(fd, b"edgepool statistics\n");
    for (name, v) in s.fields() {
        let mut m = os::MsgBuf::new();
        m.str("  ").str(name).str(" ").num(v as u64).str("\n");
        os::write_fd(fd, m.as_bytes());
    }
    let mut m = os::MsgBuf::new();
    m.str("  fragmentation ").fixed(s.fragmentation_ppm() / 1000, 1).str(" % (1 - live_bytes / os_bytes)\n");
    os::write_fd(fd, m.as_bytes());
    os::write_fd(
        fd,
        b"  slots by size class:\n         size    in use  reserved  utilisation  allocations        frees\n",
    );
    for c in s.classes.iter() {
        // Utilisation in tenths of a per cent, right-aligned as "  0.0" to "100.0".
        let tenths = (c.slots_in_use as u64 * 1000).checked_div(c.slots_reserved as u64).unwrap_or(0);
        let mut m = os::MsgBuf::new();
        m.str("  ").num_padded(c.size as u64, 9).str(" B").num_padded(c.slots_in_use as u64, 8);
        m.num_padded(c.slots_reserved as u64, 10).str("      ").num_padded(tenths / 10, 3).str(".");
        m.num(tenths % 10).str(" %").num_padded(c.allocations, 13).num_padded(c.frees, 13).str("\n");
        os::write_fd(fd, m.as_bytes());
    }
}

/// Writes `s` to `fd` as one JSON object (`{"os_bytes": N, ...}`, the fields of [`Stats::fields`],
/// then `"fragmentation"` as a fraction and `"classes"`, a list of objects), without allocating.
pub fn write_json(fd: libc::c_int, s: &Stats) {
    os::write_fd(fd, b"{");
    for (i, (name, v)) in s.fields().enumerate() {
        let mut m = os::MsgBuf::new();
        m.str(if i == 0 { "\n  \"" } else { ",\n  \"" }).str(name).str("\": ").num(v as u64);
        os::write_fd(fd, m.as_bytes());
    }
    let mut m = os::MsgBuf::new();
    m.str(",\n  \"fragmentation\": ").fixed(s.fragmentation_ppm(), 6).str(",\n  \"classes\": [");
    os::write_fd(fd, m.as_bytes());
    for (i, c) in s.classes.iter().enumerate() {
        let mut m = os::MsgBuf::new();
        m.str(if i == 0 { "\n    {" } else { ",\n    {" });
        m.str("\"size\": ").num(c.size as u64).str(", \"slots_in_use\": ").num(c.slots_in_use as u64);
        m.str(", \"slots_reserved\": ").num(c.slots_reserved as u64);
        m.str(", \"allocations\": ").num(c.allocations).str(", \"frees\": ").num(c.frees).str("}");
        os::write_fd(fd, m.as_bytes());
    }
    os::write_fd(fd, b"\n  ]\n}\n");
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
    /// The allocator's calls into the OS's memory map: `mmap` (and purges once pages have moved:
    /// fresh memory mapped over free blocks), `munmap`, `madvise` (purges and populates),
    /// `mprotect` (heap growth, the hardened mode), `mremap` (direct mappings, pages that move).
    pub os_mmap_calls: usize,
    pub os_munmap_calls: usize,
    pub os_madvise_calls: usize,
    pub os_mprotect_calls: usize,
    pub os_mremap_calls: usize,
    /// Page faults the process has taken (minor and major, every thread's, not only edgepool's
    /// memory): read before and after loading for the faults of a load.
    pub page_faults: usize,
    /// Bytes of the blocks the program holds now, each at the size it can use: small slots at their
    /// class's size, large blocks at their pages, arena objects, direct mappings. (Not the bytes it
    /// asked for: C's `free` does not say how many that was. `EDGEPOOL_PROFILE=1` reports requested
    /// bytes against these.)
    pub live_bytes: usize,
    /// Bytes in allocated heap blocks (slabs whole, large blocks, the allocator's metadata) and direct
    /// mappings: the memory edgepool has handed out or keeps for handing out, free blocks left out.
    pub in_use_bytes: usize,
    /// The highest `in_use_bytes` seen (at any heap allocation).
    pub peak_in_use_bytes: usize,
    /// Bytes in live large blocks (including the freed runs that threads' run caches hold).
    pub large_bytes: usize,
    /// Bytes of resident pages moved between heap blocks instead of purged in one and faulted in,
    /// zeroed, in the other (`mremap`: a freed block's pages into a large block being allocated, a
    /// large block's pages into the block that `realloc` moves it to).
    pub moved_bytes: usize,
    /// Per size class, in the order of [`crate::classes::CLASS_SIZES`]: slots in use and reserved.
    pub classes: [ClassStats; NCLASSES],
}

/// One size class's slots.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// The slot size in bytes.
    pub size: usize,
    /// Slots handed out and not given back (a slot freed by another thread counts as given back at
    /// once, although its owner reuses it only after collecting it).
    pub slots_in_use: usize,
    /// Slots of the slabs laid out for the class now: in use or free.
    pub slots_reserved: usize,
    /// Slots handed out, ever.
    pub allocations: u64,
    /// Slots given back, ever.
    pub frees: u64,
}

impl ClassStats {
    /// `slots_in_use / slots_reserved` (0 with no slab).
    pub fn utilisation(&self) -> f64 {
        if self.slots_reserved == 0 {
            0.0
        } else {
            self.slots_in_use as f64 / self.slots_reserved as f64
        }
    }
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
            ("live_bytes", self.live_bytes),
            ("in_use_bytes", self.in_use_bytes),
            ("peak_in_use_bytes", self.peak_in_use_bytes),
            ("large_bytes", self.large_bytes),
            ("moved_bytes", self.moved_bytes),
        ])
    }

    /// The part of the memory edgepool holds from the OS that no live block uses:
    /// `1 - live_bytes / os_bytes` (free slots, free heap blocks awaiting purge, cached runs, slab
    /// and page rounding). 0 when nothing is held.
    pub fn fragmentation(&self) -> f64 {
        if self.os_bytes == 0 {
            0.0
        } else {
            1.0 - (self.live_bytes.min(self.os_bytes) as f64 / self.os_bytes as f64)
        }
    }

    /// `fragmentation()` in parts per million (for reports written without floating-point
    /// formatting).
    pub fn fragmentation_ppm(&self) -> u64 {
        if self.os_bytes == 0 {
            return 0;
        }
        let live = self.live_bytes.min(self.os_bytes) as u128;
        (1_000_000 - live * 1_000_000 / self.os_bytes as u128) as u64
    }
}

/// The cache layer's part of a report (the per-class figures and `live_bytes`), registered by that
/// layer when it makes its first cache (0: none yet; else a `fn(&mut Stats)`).
static COMPLETER: AtomicUsize = AtomicUsize::new(0);

/// Registers `f` to fill in the figures of the layers above the heap (see [`COMPLETER`]).
pub fn set_completer(f: fn(&mut Stats)) {
    COMPLETER.store(f as usize, Ordering::Release);
}

/// Fills in what the registered completer knows, if one is.
pub fn complete(s: &mut Stats) {
    let f = COMPLETER.load(Ordering::Acquire);
    if f != 0 {
        // SAFETY: a non-zero value was stored by `set_completer` from a `fn(&mut Stats)`.
        let f: fn(&mut Stats) = unsafe { core::mem::transmute::<usize, fn(&mut Stats)>(f) };
        f(s);
    }
}
