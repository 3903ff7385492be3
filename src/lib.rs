//! # edgepool
//!
//! A memory allocator for machine-learning inference on small devices.
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();
//! ```
//!
//! Map of the modules, lowest layer first (a module uses only the ones above it in this list):
//! - [`os`]: every call into libc — mappings, purge, futex, environment, stderr.
//! - `size_class`, [`options`]: pure arithmetic — class tables, slab geometry, option parsing.
//! - `sync`: the allocation-free futex lock.
//! - `buddy`: the buddy free lists over the page map (single-threaded).
//! - `slab`: one slab's header, bitmap and remote-free list.
//! - `heap`: the global heap — region, lock, growth, purging, budget, direct mappings, `fork`.
//! - `cache`: thread-local caches — fast paths, remote frees, thread exit and adoption.
//! - `global`: routing — which part serves a request and who owns a pointer; [`EdgePool`].
//! - [`c_api`]: the C allocation API with glibc's semantics (exported by `libedgepool.so`).
//! - `stats`: counters and the statistics report.
//! - `arena`: the load arena (bump allocation in chunks), the arena mode of load phases.
//! - `phase`: load and run phases ([`load_phase`], [`load_phase_process`], the C API's phase).
//! - [`plan`]: the static memory planner (independent of the allocator).

#![warn(clippy::undocumented_unsafe_blocks)]

mod arena;
mod buddy;
mod cache;
pub mod c_api;
mod global;
mod heap;
pub mod options;
pub mod os;
mod phase;
pub mod plan;
mod size_class;
mod slab;
mod stats;
mod sync;

pub use global::EdgePool;
pub use stats::{CounterValues, Stats};

/// Raw allocation entry points with C-like semantics shared by the C API and tests.
pub mod raw {
    pub use crate::global::{alloc, alloc_zeroed, free, realloc, usable_size};
}

/// Size classes of the slab caches, largest request served by slabs, and slab size.
pub mod classes {
    pub use crate::size_class::{natural_align, CLASS_SIZES, SLAB_SIZE, SMALL_MAX};
}

/// A statistics report: heap figures and counters.
pub fn stats() -> Stats {
    let mut s = Stats { counters: stats::COUNTERS.snapshot(), slab_bytes: cache::slab_bytes(), ..Stats::default() };
    heap::fill_stats(&mut s);
    s
}

/// Returns free memory to the OS: applies pending frees held by exited threads' caches, then purges
/// every free heap page. Returns the bytes purged.
pub fn trim() -> usize {
    cache::collect_abandoned();
    heap::trim()
}

/// Sets the memory budget in bytes (0 = none): requests that would take edgepool's OS memory beyond
/// it fail with a null pointer. Same as `EDGEPOOL_LIMIT`.
pub fn set_limit(bytes: usize) {
    heap::set_limit(bytes)
}

/// Walks the heap's internal structures and checks their invariants (for tests and debugging).
pub fn check_heap() -> Result<(), &'static str> {
    heap::check()
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

pub use phase::{load_phase, load_phase_process, load_phase_process_with, load_phase_with, LoadPhase, PhaseMode, PhaseReport};

/// The C API's process-wide phase (also opened by `EDGEPOOL_LOAD_PHASE=1`): `edgepool_load_begin()` and
/// `edgepool_load_end()`.
pub mod c_phase {
    pub use crate::phase::{c_begin as begin, c_end as end, print_report};
}
