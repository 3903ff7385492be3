//! Statistics: one declarative list of counters generates the live atomic struct and its snapshot.
//!
//! Counters are bumped with relaxed atomics on slow paths only (slab refills, block allocation, thread
//! start and exit); the small-object fast paths stay free of shared writes. Heap-wide figures (bytes
//! taken from the OS, free and dirty bytes) are read from the heap under its lock by
//! [`crate::stats()`].

use core::sync::atomic::{AtomicUsize, Ordering};

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
    /// slab refills: times a thread's current slab of a class ran out
    slab_refills,
    /// blocks freed by another thread than their slab's owner
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
}

pub static COUNTERS: Counters = Counters::new();

#[inline]
pub fn bump(c: &AtomicUsize, by: usize) {
    c.fetch_add(by, Ordering::Relaxed);
}

#[inline]
pub fn drop_by(c: &AtomicUsize, by: usize) {
    c.fetch_sub(by, Ordering::Relaxed);
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
}
