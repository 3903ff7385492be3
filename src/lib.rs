//! # edgepool
//!
//! A memory allocator for machine-learning inference on small devices.
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();
//! ```
//!
//! # Layers
//!
//! Each module belongs to one layer and uses only modules of its own layer or lower ones, never a
//! module of a higher layer, and modules never form a cycle. `tests/layers.rs` reads this table and
//! the `crate::` paths of every file under `src/`, and fails when either rule is broken. A lower layer
//! that needs something from above takes it as a parameter or reads a flag kept below both
//! (`phase_state`). The crate root (this file) is above every layer.
//!
//! | layer | modules | job |
//! |---|---|---|
//! | 0 | os, valgrind | every call into libc: mappings, purge, futex, environment, stderr, keys, `fork` and exit hooks; valgrind client requests |
//! | 1 | size_class, options | pure arithmetic: class tables, slab geometry, option parsing |
//! | 2 | sync, stats, phase_state | the lock and the lock order; counters and reports; the phase flags lower layers read |
//! | 3 | buddy, slab | single-threaded block structures: the buddy free lists over the page map; one slab |
//! | 4 | init | start-up: options, the region's reservation, the start-up phase, the `fork` handlers, the banner |
//! | 5 | heap | the global buddy heap: its lock, growth, purging, the budget, the page map |
//! | 6 | direct, arena, curve | direct mappings beyond the largest block; the load arena; the memory curve's sampler |
//! | 7 | cache, owner | thread caches (fast paths, remote frees, life, phase settling); pointer → owner |
//! | 8 | phase, debug, profile | load and run phases: guards, reports, the C API's phase, the start-up trigger; debug mode's canaries, live-block bitmap, quarantine and event ring; sizing advice (`EDGEPOOL_PROFILE`) |
//! | 9 | global | routing: which part serves a request; [`EdgePool`] |
//! | 10 | c_api | the C allocation API with glibc's semantics (exported by `libedgepool.so`) |
//! | 11 | plan, model | the static memory planner; memory-mapped model files (both use only the allocation entry points) |

#![warn(clippy::undocumented_unsafe_blocks)]

mod arena;
mod buddy;
pub mod c_api;
mod cache;
pub mod curve;
mod debug;
mod direct;
mod global;
mod heap;
mod init;
mod model;
pub mod options;
pub mod os;
mod owner;
mod phase;
mod phase_state;
pub mod plan;
mod profile;
mod size_class;
mod slab;
mod stats;
mod sync;
mod valgrind;

pub use global::EdgePool;
pub use model::{HugePages, MapOptions, MappedModel, ModelError};
pub use stats::{ClassStats, CounterValues, Stats};

/// Raw allocation entry points with C-like semantics shared by the C API and tests.
pub mod raw {
    pub use crate::global::{alloc, alloc_zeroed, free, realloc, usable_size};
}

/// The per-thread cache of freed medium runs (large blocks of up to 64 KiB, above the slab
/// classes): its bounds, and what the calling thread holds (for tests and tools).
pub mod run_cache {
    pub use crate::cache::runs::{mine_bytes, RUN_BYTES, RUN_PAGES, SLOTS};
}

/// Size classes of the slab caches, largest request served by slabs, and slab size.
pub mod classes {
    pub use crate::size_class::{natural_align, CLASS_SIZES, SLAB_SIZE, SMALL_MAX};
}

/// A statistics report: heap figures, counters, live bytes and the slots of each size class
/// ([`Stats::classes`]); [`Stats::fragmentation`]. It does not allocate; the per-thread counts are
/// summed over every thread cache.
pub fn stats() -> Stats {
    heap::stats()
}

/// Returns free memory to the OS: empties the threads' run caches (the caller's now, the others' at
/// their next allocation or free of a medium block), applies pending frees held by exited threads'
/// caches, then purges every free heap page. Returns the bytes purged.
pub fn trim() -> usize {
    global::trim()
}

/// Faults in every page of `buf` for writing before it is used, without changing its contents, so
/// that the first inference writing its buffers takes no page faults: `MADV_POPULATE_WRITE` where the
/// kernel has it (Linux 5.14+), one byte per page read and written back where not.
pub fn prefault(buf: &mut [u8]) {
    // SAFETY: a `&mut [u8]` is mapped read-write and nobody else touches it during the call.
    unsafe { os::prefault(buf.as_mut_ptr(), buf.len()) };
}

/// Faults in `bytes` of the heap's free memory so that the next allocations, up to that many bytes,
/// land on resident pages (call it after loading, before the first inference), and keeps that much
/// free memory resident from then on instead of giving it back to the OS (`prefault_free(0)` stops
/// that; `trim()` and the end of a load phase still give back everything free). Counts in the budget.
/// Returns the bytes made resident.
pub fn prefault_free(bytes: usize) -> usize {
    heap::prefault_free(bytes)
}

/// Sets the memory budget in bytes (0 = none): requests that would take edgepool's OS memory beyond
/// it fail with a null pointer. Same as `EDGEPOOL_LIMIT`.
pub fn set_limit(bytes: usize) {
    global::set_limit(bytes)
}

/// Debug mode (`EDGEPOOL_DEBUG=1`): walks every live block and checks its canary, and every block in
/// the quarantine and checks that nothing wrote to it after it was freed. Returns the number of live
/// blocks checked, or `None` when debug mode is off. At the first damaged block it prints what it
/// found and the last allocator events, and aborts the process.
pub fn check() -> Option<usize> {
    debug::check()
}

/// Walks the heap's internal structures and checks their invariants (for tests and debugging).
pub fn check_heap() -> Result<(), &'static str> {
    heap::check()
}

/// Walks the calling thread's cache — its rows, their slabs' bitmaps, lists and stacks — and checks
/// their invariants (for tests and debugging). `Ok` for a thread that has not allocated yet.
pub fn check_thread_cache() -> Result<(), &'static str> {
    cache::check_mine()
}

/// The options in effect.
pub fn options() -> options::Values {
    heap::options()
}

/// Size of the largest buddy block; larger requests are mapped directly from the OS.
pub fn max_block() -> usize {
    heap::ensure_init();
    heap::max_block()
}

pub use phase::{
    load_phase, load_phase_process, load_phase_process_with, load_phase_with, LoadPhase, PhaseMode, PhaseReport,
};

/// The C API's process-wide phase (also opened by `EDGEPOOL_LOAD_PHASE=1`): `edgepool_load_begin()` and
/// `edgepool_load_end()`.
pub mod c_phase {
    pub use crate::phase::{c_begin as begin, c_end as end, print_report};
}
