//! Start-up: reads the options, reserves the heap's region and its page map, opens the start-up load
//! phase, and, once the heap is ready, does the work that may allocate: the `fork` handlers of every
//! lock, the banner, and the statistics report at exit.
//!
//! The heap calls [`start`] and [`open_startup_phase`] under its lock during its one-time
//! initialisation, then [`after_start`] outside every lock (libc may allocate there, which re-enters an
//! allocator that is ready).

use crate::buddy::PageEntry;
use crate::options::{self, Values};
use crate::os::{self, PAGE};
use crate::phase_state::{self, RowSet, Start};
use crate::size_class::{SLAB_META_SHIFT, SLAB_SHIFT};
use crate::slab;
use crate::sync;

/// Its address mixes address-space randomisation into the freed mark where `AT_RANDOM` is missing.
static FREED_SEED: u8 = 0;

/// What [`start`] set up: the options in effect and the heap's region.
pub struct Started {
    pub opts: Values,
    /// The region `[base, base + span)`, aligned to the top block size: reserved without access, or,
    /// when `lazy`, a window of address space nothing else uses yet.
    pub base: usize,
    pub span: usize,
    /// A zeroed page map with one entry per page of the region.
    pub map: *mut PageEntry,
    /// The buddy's zeroed dirty bitmap, one bit per page of the region (in the page map's mapping,
    /// after the entries).
    pub bits: *mut u64,
    /// The slab table: one `SLAB_META`-byte entry (a slab's header and bitmap) per 64 KiB of the
    /// region, touched only where slabs are.
    pub slabs: *mut u8,
    /// The region is a window claimed piece by piece ([`LAZY_UNIT`]), not a reservation.
    pub lazy: bool,
}

/// The options from the environment. A bad value is reported on stderr with the reason, and its
/// default kept; a name that is no option (a typo) is reported with the closest option's name.
pub fn read_options() -> Values {
    let mut opts = Values::defaults();
    os::for_each_option(|name, value| apply_option(&mut opts, name, value));
    opts
}

/// Applies one `EDGEPOOL_<name>=<value>`, or says on stderr why not. Out of line, so that the scan of
/// the environment, which every process runs, stays small: this runs only where a variable is set,
/// and `cdylib/link/layout.ld` puts it with the other code that most processes never run.
#[inline(never)]
fn apply_option(opts: &mut Values, name: &[u8], value: &[u8]) {
    let shown = core::str::from_utf8(name).unwrap_or("?");
    let mut m = os::MsgBuf::new();
    match opts.apply(name, value) {
        Ok(true) => return,
        Ok(false) if options::is_tool_name(name) => return,
        Ok(false) => {
            m.str("edgepool: EDGEPOOL_").str(shown).str(" is not an option of edgepool, ignored");
            if let Some(c) = options::closest(name) {
                m.str(" (did you mean EDGEPOOL_").str(c).str("?)");
            }
            m.str("; EDGEPOOL_VERBOSE=1 lists the options\n");
        }
        Err(why) => {
            m.str("edgepool: ignoring bad value of EDGEPOOL_").str(shown).str(" (");
            m.str(why).str("), keeping the default\n");
        }
    }
    os::write_stderr(m.as_bytes());
}

/// Size of the pieces a lazy region is claimed in (or the top block, if smaller).
pub const LAZY_UNIT: usize = 2 << 20;

/// Reads the options and sets up the region and its page map. `None` when no address space is left
/// (the allocator then returns null for everything). Allocation-free.
///
/// Without an address-space limit the whole region is reserved at once (halved until the OS grants
/// it). Under a limit (`ulimit -v`), address space reserved and unused would count against it, so the
/// region is *lazy*: a window of at most the limit is chosen far below where the kernel places
/// mappings, nothing is reserved, and the heap maps it in [`LAZY_UNIT`] pieces as it grows (see
/// `heap`). The page map covers the window and is only as large as the window needs.
pub fn start() -> Option<Started> {
    // Before any slot can be freed: the mark must not be guessable from the program's own data.
    slab::set_freed_mark(os::startup_random(0) ^ (&raw const FREED_SEED as u64).rotate_left(29));
    let opts = read_options();
    let top_size = opts.get(options::MAX_BLOCK) as usize;
    let want = (opts.get(options::RESERVE) as usize).max(top_size) & !(top_size - 1);
    let limit = os::address_limit();
    let (base, span, lazy) = match limit {
        None => match reserve_whole(want, top_size) {
            Some((base, span)) => (base, span, false),
            None => (lazy_window(want, top_size)?, want, true),
        },
        Some(l) => {
            let span = want.min(l.div_ceil(top_size).max(1) * top_size);
            (lazy_window(span, top_size)?, span, true)
        }
    };
    let npages = span / PAGE;
    let entries = (npages * core::mem::size_of::<PageEntry>()).next_multiple_of(64);
    let map_bytes = (entries + crate::buddy::bitmap_words(npages) * 8).next_multiple_of(PAGE);
    let map = os::map(map_bytes) as *mut PageEntry;
    let slabs_bytes = ((span >> SLAB_SHIFT) << SLAB_META_SHIFT).max(PAGE);
    let slabs = if map.is_null() { core::ptr::null_mut() } else { os::map(slabs_bytes) };
    if slabs.is_null() {
        // SAFETY: the region and the page map were mapped above and are not published.
        unsafe {
            if !map.is_null() {
                os::unmap(map.cast(), map_bytes);
            }
            if !lazy {
                os::unmap(base as *mut u8, span);
            }
        }
        return None;
    }
    // The dirty bitmap follows the entries, inside the same mapping.
    let bits = map.cast::<u8>().wrapping_add(entries).cast::<u64>();
    Some(Started { opts, base, span, map, bits, slabs, lazy })
}

/// Reserves `span` bytes (halved until the OS grants them, down to one top block) aligned to
/// `top_size`. Returns the region's base and span.
fn reserve_whole(mut span: usize, top_size: usize) -> Option<(usize, usize)> {
    let mut raw;
    loop {
        raw = os::reserve(span + top_size);
        if !raw.is_null() || span <= top_size {
            break;
        }
        span /= 2;
    }
    if raw.is_null() {
        return None;
    }
    // Align the region to the top block size and give back the slack at both ends.
    let base = (raw as usize + top_size - 1) & !(top_size - 1);
    // SAFETY: head and tail slack lie inside the reservation just made and hold nothing.
    unsafe {
        if base > raw as usize {
            os::unmap(raw, base - raw as usize);
        }
        let tail = raw as usize + span + top_size - (base + span);
        if tail > 0 {
            os::unmap((base + span) as *mut u8, tail);
        }
    }
    Some((base, span))
}

/// The base of a lazy window of `span` bytes, aligned to `top_size`: it ends halfway between address
/// zero and where the kernel places mappings now. The kernel places new mappings top down from there,
/// so it would reach the window only after mapping about as much as half the address space; the
/// program's own image and `brk` heap lie near the bottom (the window is checked to stay above 4 GiB).
fn lazy_window(span: usize, top_size: usize) -> Option<usize> {
    let probe = os::probe_address();
    let base = (probe / 2).checked_sub(span)? & !(top_size - 1);
    (base >= 1 << 32).then_some(base)
}

/// Opens the process-wide load phase at start-up if `EDGEPOOL_LOAD_PHASE` asks for it, and arms its
/// trigger (`SIGUSR2`, `EDGEPOOL_LOAD_SECONDS`). Called before the heap is published as ready, so no
/// thread cache exists yet: every cache is created in the phase's row set.
pub fn open_startup_phase(opts: &Values) {
    if opts.get(options::LOAD_PHASE) == 0 {
        return;
    }
    let rows = if opts.get(options::LOAD_ARENA) != 0 { RowSet::Arena } else { RowSet::Load };
    phase_state::process_enter(rows);
    let now = os::now_ns();
    phase_state::c_open(Start { t_ns: now, ..Start::default() });
    let secs = opts.get(options::LOAD_SECONDS);
    let deadline = if secs > 0 { now.saturating_add(secs.saturating_mul(1_000_000_000)) } else { u64::MAX };
    phase_state::arm_trigger(deadline);
}

/// Work done once after the heap is ready, outside every lock: registers the `fork` handlers of every
/// lock (in the one order of [`sync`]), prints the banner (`EDGEPOOL_VERBOSE`), and registers
/// `stats_at_exit` (`EDGEPOOL_STATS`).
pub fn after_start(opts: &Values, stats_at_exit: extern "C" fn()) {
    os::at_fork(sync::fork_prepare, sync::fork_parent, sync::fork_child);
    if opts.get(options::VERBOSE) != 0 {
        print_banner(opts);
    }
    if opts.get(options::STATS) != 0 {
        os::at_exit(stats_at_exit);
    }
    if !cfg!(feature = "debug") && (opts.get(options::DEBUG) != 0 || opts.get(options::PROFILE) != 0) {
        os::write_stderr(
            b"edgepool: EDGEPOOL_DEBUG and EDGEPOOL_PROFILE need a library built with the `debug` feature \
              (cargo build --release -p edgepool-cdylib --features debug); ignored\n",
        );
    }
}

/// `EDGEPOOL_VERBOSE`: the version, the build flavour and every option in effect, on stderr.
fn print_banner(o: &Values) {
    let mut m = os::MsgBuf::new();
    m.str("edgepool ").str(env!("CARGO_PKG_VERSION")).str(" active (");
    m.str(if cfg!(debug_assertions) { "debug" } else { "release" }).str(" build)\n");
    os::write_stderr(m.as_bytes());
    for (i, def) in options::OPTIONS.iter().enumerate() {
        let mut m = os::MsgBuf::new();
        m.str("  EDGEPOOL_").str(def.name).str("=").num(o.get(i)).str("\n");
        os::write_stderr(m.as_bytes());
    }
}
