//! Debug mode (`EDGEPOOL_DEBUG=1`, or `=backtrace`): catches heap corruption where it happens and
//! says what the allocator saw last.
//!
//! Compiled in with the `debug` feature: `global` then sends every allocation entry point here when
//! the option is set at start-up (one load and branch on its fast paths, shared with valgrind's
//! client requests and profiling):
//!
//! - **Canary.** Every block is allocated 8 bytes larger and ends in a *trailer*: four `0xA5` bytes
//!   and the distance from the requested end to the trailer, XOR a per-process key mixed with the
//!   block's address. The slack between the requested end and the trailer is `0xA5` too (its first
//!   4 KiB where it is larger), so one byte written past the end is always caught. The canary is
//!   checked by `free`, `realloc`, `malloc_usable_size` and [`check`]; `malloc_usable_size` answers
//!   the requested size.
//! - **Every double and invalid free.** A bitmap with one bit per 16 bytes of the heap's region says
//!   which addresses start a live block (set when one is handed out, cleared when it is freed by an
//!   atomic test-and-clear, so that two threads freeing one block cannot both pass). A free
//!   of an address whose bit is clear is refused before the allocator underneath sees it — whichever
//!   path the block would take (the owner's stack of recently freed slots included). Direct mappings
//!   are found in their own table, which `free` already consults exactly.
//! - **Freed memory filled, writes after free caught.** A freed block is filled with `0xDD` (its first
//!   64 KiB). Blocks of up to 4 KiB then wait in a *quarantine* (a lock-free ring of the last 1024
//!   of them) before the allocator may hand them out again; when a block leaves it, and at every
//!   [`check`], its fill and its freed trailer are verified, so a write after free is reported with
//!   the block and the byte. Larger blocks go back at once (a read after free shows `0xDD`).
//! - **Ring buffer.** The last [`EVENTS`] operations (operation, address, size, thread; with
//!   `=backtrace` the six innermost callers too) are kept in a static ring, and dumped to stderr when
//!   corruption is detected and on `SIGSEGV`, `SIGBUS` and `SIGABRT` (the handler the program had
//!   before is then called, or the default action taken).
//!
//! No lock: the bitmap, the quarantine and the ring are atomics. [`check`] runs while other threads
//! allocate and free, so a fault it sees counts only if the block is still live (or still
//! quarantined) and shows the fault again when read once more.
//!
//! Memory: 8 bytes per block (which may move a request to the next size class), 1/128 of the heap's
//! resident region for the bitmap, the quarantine's blocks (1024 of at most 4 KiB), and the static
//! ring (about 20 KiB). Blocks allocated before the option takes effect do not exist: it is read
//! before the first block is handed out. Debug mode stays off in the hardened mode
//! (`EDGEPOOL_SECURE`), which makes free memory inaccessible where `check` may still read it.

use core::cell::{Cell, UnsafeCell};
use core::ffi::c_void;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};

use crate::direct;
use crate::heap;
use crate::options;
use crate::os::{self, MsgBuf, PAGE};
use crate::owner::{self, Owner};
use crate::slab::Slab;

/// Bytes added to every request for the trailer.
pub const TRAILER: usize = 8;
/// The canary byte.
pub const CANARY: u8 = 0xA5;
/// The byte freed memory is filled with.
pub const FREED: u8 = 0xDD;
/// Events kept in the ring buffer.
pub const EVENTS: usize = 256;
/// Callers kept per event with `EDGEPOOL_DEBUG=backtrace`.
const FRAMES: usize = 6;
/// Slack beyond the requested end that is given the canary (the rest of a larger slack is not).
const CANARY_MAX: usize = 4096;
/// Bytes of a freed block filled with [`FREED`].
const FILL_MAX: usize = 64 << 10;
/// The quarantine: the last `Q_SLOTS` blocks of at most `Q_BLOCK` bytes freed.
const Q_BLOCK: usize = 4096;
const Q_SLOTS: usize = 1024;
/// Granule of the live-block bitmap: every block starts at a multiple of 16.
const GRANULE_SHIFT: u32 = 4;
/// XOR'd into the key of a freed trailer.
const FREED_TAG: u32 = 0x5EED_F00D;

/// `STATE`: not started, starting, on, off.
const NOT_STARTED: u8 = 0;
const STARTING: u8 = 1;
const ON: u8 = 2;
const OFF: u8 = 3;

static STATE: AtomicU8 = AtomicU8::new(NOT_STARTED);
/// `EDGEPOOL_DEBUG`'s value while on (1, or [`options::DEBUG_BACKTRACE`]).
static MODE: AtomicU8 = AtomicU8::new(0);
/// Key of the trailers (random per process).
static KEY: AtomicU32 = AtomicU32::new(0);
/// The live-block bitmap: bit `i` of word `w` set iff a live block handed out through debug mode
/// starts at `base + ((64 * w + i) << 4)`, `base` being the region's. `HIGH` is one more than the
/// highest word ever written (the walk of [`check`] stops there).
static BITS: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
static BASE: AtomicUsize = AtomicUsize::new(0);
static WORDS: AtomicUsize = AtomicUsize::new(0);
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// Whether debug mode is on (after [`start`]).
#[inline]
pub fn active() -> bool {
    STATE.load(Ordering::Acquire) == ON
}

/// Starts debug mode if `mode` (`EDGEPOOL_DEBUG`'s value) asks for it, once, after the heap is ready
/// and before any block is handed out through it; concurrent callers wait for the first. Returns
/// whether debug mode is on. Allocation-free.
pub fn start(mode: u64) -> bool {
    if mode == 0 {
        return false;
    }
    loop {
        match STATE.compare_exchange(NOT_STARTED, STARTING, Ordering::Acquire, Ordering::Acquire) {
            Ok(_) => break,
            Err(ON) => return true,
            Err(OFF) => return false,
            Err(_) => os::spin_hint(),
        }
    }
    if heap::secure() {
        os::write_stderr(b"edgepool: EDGEPOOL_DEBUG is ignored in the hardened mode (EDGEPOOL_SECURE=1)\n");
        STATE.store(OFF, Ordering::Release);
        return false;
    }
    let (base, span) = heap::region();
    let words = span >> (GRANULE_SHIFT + 6);
    let bits = if words == 0 { core::ptr::null_mut() } else { os::map((words * 8).next_multiple_of(PAGE)) };
    if bits.is_null() {
        os::write_stderr(b"edgepool: EDGEPOOL_DEBUG: no memory for the live-block bitmap; debug mode is off\n");
        STATE.store(OFF, Ordering::Release);
        return false;
    }
    BITS.store(bits.cast(), Ordering::Relaxed);
    BASE.store(base, Ordering::Relaxed);
    WORDS.store(words, Ordering::Relaxed);
    let seed = os::startup_random(0).rotate_left(17) ^ os::startup_random(1).rotate_left(43) ^ (&raw const KEY as u64);
    KEY.store((seed ^ seed >> 32) as u32, Ordering::Relaxed);
    MODE.store(mode.min(u8::MAX as u64) as u8, Ordering::Relaxed);
    for (i, &sig) in SIGNALS.iter().enumerate() {
        // SAFETY: `OLD[i]` is written here, once, before our handler for `sig` exists; the handler
        // reads it only after it is installed.
        unsafe { os::install_fatal_handler(sig, on_fatal_signal, OLD.0.get().cast::<libc::sigaction>().add(i)) };
    }
    STATE.store(ON, Ordering::Release);
    true
}

// ---------------------------------------------------------------------------------------------
// Trailers

/// The key of the trailer of the block at `p`.
#[inline]
fn key(p: *mut u8) -> u32 {
    let h = ((p as u64) >> 4).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    KEY.load(Ordering::Relaxed) ^ (h >> 32) as u32
}

/// What is wrong with a block.
#[derive(Clone, Copy)]
enum Fault {
    /// Byte `at` (from the block's start) of the canary after the `size` requested bytes is not
    /// `0xA5` but `found`.
    Canary { size: usize, at: usize, found: u8 },
    /// The trailer's encoded distance is overwritten (the requested size is lost).
    Trailer,
    /// The block carries a freed trailer: it was freed already.
    Freed,
    /// Byte `at` of a freed block is not `0xDD` (or its freed trailer is changed) but `found`.
    WrittenAfterFree { at: usize, found: u8 },
}

/// Writes the canary and the trailer of a block of `usable` bytes at `p` of which `size` are the
/// program's.
///
/// # Safety
/// - `[p, p + usable)` is writable and the caller's; `size + TRAILER <= usable`.
unsafe fn write_live(p: *mut u8, size: usize, usable: usize) {
    let end = usable - TRAILER;
    let canary_end = end.min(size + CANARY_MAX);
    // SAFETY: every range written lies inside `[p, p + usable)` (contract).
    unsafe {
        core::ptr::write_bytes(p.add(size), CANARY, canary_end - size);
        core::ptr::write_bytes(p.add(end), CANARY, 4);
        p.add(end + 4).cast::<u32>().write_unaligned((end - size) as u32 ^ key(p));
    }
}

/// Writes the freed trailer of a block of `usable` bytes at `p`.
///
/// # Safety
/// - `[p, p + usable)` is writable and the caller's; `usable >= TRAILER`.
unsafe fn write_freed(p: *mut u8, usable: usize) {
    let end = usable - TRAILER;
    // SAFETY: inside the block (contract).
    unsafe {
        core::ptr::write_bytes(p.add(end), FREED, 4);
        p.add(end + 4).cast::<u32>().write_unaligned(key(p) ^ FREED_TAG);
    }
}

/// The first byte of `[p + from, p + to)` that is not `byte`, as `(offset, found)`. Eight bytes at a
/// time (the quarantine verifies up to 4 KiB per free).
///
/// # Safety
/// - the range is readable.
unsafe fn first_other(p: *mut u8, from: usize, to: usize, byte: u8) -> Option<(usize, u8)> {
    let word = u64::from_ne_bytes([byte; 8]);
    let mut i = from;
    while i + 8 <= to {
        // SAFETY: `[p + i, p + i + 8)` is inside the readable range (contract).
        if unsafe { p.add(i).cast::<u64>().read_unaligned() } != word {
            break;
        }
        i += 8;
    }
    while i < to {
        // SAFETY: inside the range.
        let b = unsafe { p.add(i).read() };
        if b != byte {
            return Some((i, b));
        }
        i += 1;
    }
    None
}

/// Checks the trailer and canary of the live block at `p` (`usable` bytes) and returns the requested
/// size.
///
/// # Safety
/// - `[p, p + usable)` is a block of the allocator, readable, handed out through debug mode.
unsafe fn verify_live(p: *mut u8, usable: usize) -> Result<usize, Fault> {
    if usable < TRAILER {
        return Err(Fault::Trailer);
    }
    let end = usable - TRAILER;
    // SAFETY: the trailer is inside the block (contract).
    let (tag, word) =
        unsafe { (p.add(end).cast::<u32>().read_unaligned(), p.add(end + 4).cast::<u32>().read_unaligned()) };
    let delta = (word ^ key(p)) as usize;
    if delta > end {
        if tag == u32::from_ne_bytes([FREED; 4]) && word == key(p) ^ FREED_TAG {
            return Err(Fault::Freed);
        }
        return Err(Fault::Trailer);
    }
    let size = end - delta;
    // SAFETY: both ranges are inside the block.
    let bad =
        unsafe { first_other(p, size, end.min(size + CANARY_MAX), CANARY).or(first_other(p, end, end + 4, CANARY)) };
    match bad {
        Some((at, found)) => Err(Fault::Canary { size, at, found }),
        None => Ok(size),
    }
}

/// Checks that the freed block at `p` (`usable` bytes, in the quarantine) is still filled and keeps its
/// freed trailer.
///
/// # Safety
/// - `[p, p + usable)` is readable, a block in the quarantine.
unsafe fn verify_freed(p: *mut u8, usable: usize) -> Result<(), Fault> {
    let end = usable - TRAILER;
    // SAFETY: inside the block (contract).
    let bad = unsafe { first_other(p, 0, end + 4, FREED) };
    if let Some((at, found)) = bad {
        return Err(Fault::WrittenAfterFree { at, found });
    }
    // SAFETY: as above.
    let word = unsafe { p.add(end + 4).cast::<u32>().read_unaligned() };
    if word != key(p) ^ FREED_TAG {
        return Err(Fault::WrittenAfterFree { at: end + 4, found: (word ^ key(p) ^ FREED_TAG) as u8 });
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The live-block bitmap

/// Bit index of `p` in the bitmap, if `p` lies inside the region and is 16-byte aligned.
#[inline]
fn bit_of(p: *mut u8) -> Option<usize> {
    let off = (p as usize).wrapping_sub(BASE.load(Ordering::Relaxed));
    let bit = off >> GRANULE_SHIFT;
    (off & ((1 << GRANULE_SHIFT) - 1) == 0 && bit / 64 < WORDS.load(Ordering::Relaxed)).then_some(bit)
}

fn word(w: usize) -> &'static AtomicU64 {
    // SAFETY: `w < WORDS` (callers get `w` from `bit_of` or a walk below `HIGH <= WORDS`); the bitmap is
    // a zeroed mapping of `WORDS` words that lives as long as the process and is only accessed
    // atomically.
    unsafe { &*BITS.load(Ordering::Relaxed).add(w) }
}

fn is_live(bit: usize) -> bool {
    word(bit / 64).load(Ordering::Acquire) & 1 << (bit % 64) != 0
}

// ---------------------------------------------------------------------------------------------
// The quarantine

/// A ring of [`Q_SLOTS`] freed blocks, lock-free: a free takes the next slot (threads reserve them
/// [`Q_BATCH`] at a time from a shared counter) and swaps its block in, getting back the block that
/// slot held, about [`Q_SLOTS`] frees ago, which leaves the quarantine. An entry is the block's address with its usable size in 16-byte units in bits 48 and up
/// (0: an empty slot). Invariant: every block in a slot is filled with [`FREED`], carries a freed
/// trailer, has its bit clear in the live-block bitmap, and counts as live for the allocator underneath.
static QUARANTINE: [AtomicU64; Q_SLOTS] = [const { AtomicU64::new(0) }; Q_SLOTS];
static Q_NEXT: AtomicUsize = AtomicUsize::new(0);

/// Slots of the ring a thread reserves at a time: one shared `fetch_add` per 16 frees.
const Q_BATCH: usize = 16;

/// The next slot of the ring for this thread's free.
fn next_quarantine_slot() -> usize {
    Q_RANGE.with(|r| {
        let (mut next, mut end) = r.get();
        if next == end {
            next = Q_NEXT.fetch_add(Q_BATCH, Ordering::Relaxed);
            end = next + Q_BATCH;
        }
        r.set((next + 1, end));
        next % Q_SLOTS
    })
}

fn q_entry(p: *mut u8, usable: usize) -> u64 {
    p as u64 | ((usable >> 4) as u64) << 48
}

fn q_block(e: u64) -> (*mut u8, usize) {
    ((e & ((1 << 48) - 1)) as usize as *mut u8, ((e >> 48) as usize) << 4)
}

/// Blocks the caller must now give to the allocator underneath: the block freed (when it is not
/// quarantined), or the one that left the quarantine to make room for it.
pub struct Release {
    block: *mut u8,
}

impl Release {
    /// The block to free (null: none).
    pub fn block(&self) -> *mut u8 {
        self.block
    }
}

// ---------------------------------------------------------------------------------------------
// The hooks `global` calls

/// The entry point that detected a problem (for the message).
#[derive(Clone, Copy)]
pub enum Op {
    Alloc,
    Free,
    Realloc,
    UsableSize,
    Check,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Alloc => "malloc",
            Op::Free => "free",
            Op::Realloc => "realloc",
            Op::UsableSize => "malloc_usable_size",
            Op::Check => "edgepool_check",
        }
    }

    fn detected(self) -> &'static str {
        match self {
            Op::Alloc => "at malloc()",
            Op::Free => "at free()",
            Op::Realloc => "at realloc()",
            Op::UsableSize => "at malloc_usable_size()",
            Op::Check => "by edgepool_check()",
        }
    }
}

/// The block at `p` (`usable` bytes, owned by `o`) was just handed out for a request of `size` bytes
/// (`size + TRAILER <= usable`): writes its canary and trailer, marks it live, records the event.
///
/// # Safety
/// - `p` is a block just handed out by the allocator underneath, of `usable` bytes, the caller's.
pub unsafe fn handed_out(p: *mut u8, o: Owner, size: usize, usable: usize, op: Op) {
    // SAFETY: forwarded contract.
    unsafe { write_live(p, size, usable) };
    // Release: whoever sees the bit sees the trailer. A direct mapping has no bit, even where it lies
    // in a hole of a lazy region: the direct table knows it exactly.
    if let Some(bit) = bit_of(p).filter(|_| !matches!(o, Owner::Direct(_))) {
        word(bit / 64).fetch_or(1 << (bit % 64), Ordering::Release);
        if HIGH.load(Ordering::Relaxed) <= bit / 64 {
            HIGH.fetch_max(bit / 64 + 1, Ordering::Release);
        }
    }
    // A `realloc` records its own event, with the old address ([`note_realloc`]).
    if !matches!(op, Op::Realloc) {
        record(op, p, size, 0);
    }
}

/// Checks the block at `p` that the program gives back (`free`, or the old block of `realloc`):
/// aborts with a message and the event dump on a pointer that is not a live block or on a broken
/// canary; otherwise takes it out of the live set, fills it, quarantines it if small, and returns the
/// blocks the caller must now free for real. `p` is not null.
///
/// # Safety
/// - debug mode is on.
pub unsafe fn retire(p: *mut u8, op: Op) -> Release {
    // SAFETY: forwarded.
    let (o, usable, size) = unsafe { live_block(p, op) };
    if let Some(bit) = bit_of(p).filter(|_| !matches!(o, Owner::Direct(_))) {
        let mask = 1u64 << (bit % 64);
        if word(bit / 64).fetch_and(!mask, Ordering::AcqRel) & mask == 0 {
            // Another thread freed it between our look and the clear.
            fail(p, op, "double free: the block was freed by another thread at the same time");
        }
    }
    record(op, p, size, 0);
    match o {
        // Unmapped at once: a later access faults.
        Owner::Direct(_) => Release { block: p },
        _ if usable <= Q_BLOCK => {
            // SAFETY: the block is ours alone now (its bit is clear, no one else frees it).
            unsafe {
                core::ptr::write_bytes(p, FREED, usable - TRAILER);
                write_freed(p, usable);
            }
            let i = next_quarantine_slot();
            let old = QUARANTINE[i].swap(q_entry(p, usable), Ordering::AcqRel);
            if old == 0 {
                return Release { block: core::ptr::null_mut() };
            }
            let (a, u) = q_block(old);
            // SAFETY: a block that was in the quarantine, now out of it: only this thread has it.
            if let Err(f) = unsafe { verify_freed(a, u) } {
                report(a, u, f, "when it left the quarantine");
            }
            Release { block: a }
        }
        _ => {
            // SAFETY: the block is ours alone now.
            unsafe { core::ptr::write_bytes(p, FREED, usable.min(FILL_MAX)) };
            Release { block: p }
        }
    }
}

/// The requested size of the live block at `p` (its canary checked); aborts as [`retire`] does when
/// `p` is not a live block or its canary is broken.
///
/// # Safety
/// - debug mode is on.
pub unsafe fn live_size(p: *mut u8, op: Op) -> usize {
    // SAFETY: forwarded.
    unsafe { live_block(p, op).2 }
}

/// Records a `realloc` that moved `old` to `new` (`size` bytes).
pub fn note_realloc(old: *mut u8, new: *mut u8, size: usize) {
    record(Op::Realloc, new, size, old as usize);
}

/// `(owner, usable size, requested size)` of the live block at `p`, or an abort with the reason.
///
/// # Safety
/// - debug mode is on.
unsafe fn live_block(p: *mut u8, op: Op) -> (Owner, usize, usize) {
    let o = owner::owner(p);
    match o {
        Owner::Unknown => {
            if let Some((_, true)) = last_event_at(p) {
                fail(p, op, "double free: the block was freed already (see the events below)");
            }
            fail(
                p,
                op,
                "invalid pointer: not memory of this allocator (a stack or static address, a pointer from another allocator, or a block freed long ago)",
            )
        }
        Owner::Direct(_) => {}
        _ => match bit_of(p) {
            Some(bit) if is_live(bit) => {}
            // SAFETY: `p` is in the region and `o` its owner.
            _ => unsafe { not_live(p, o, op) },
        },
    }
    // SAFETY: `p` starts a live block of `o` (its bit is set, or the direct table holds it).
    let usable = unsafe { owner::usable(o, p) }.unwrap_or(0);
    // SAFETY: a live block handed out through debug mode.
    match unsafe { verify_live(p, usable) } {
        Ok(size) => (o, usable, size),
        Err(f) => report(p, usable, f, op.detected()),
    }
}

/// Aborts for `p` in the region that starts no live block: a double free when it was freed (it is
/// in the quarantine, or a slab slot with a freed trailer), an invalid pointer otherwise.
///
/// # Safety
/// - `p` is in the region and `o` is its owner.
#[cold]
unsafe fn not_live(p: *mut u8, o: Owner, op: Op) -> ! {
    if QUARANTINE.iter().any(|e| q_block(e.load(Ordering::Relaxed)).0 == p) {
        fail(p, op, "double free: the block was freed already (it is still in the quarantine)");
    }
    if let Some((_, true)) = last_event_at(p) {
        fail(p, op, "double free: the block was freed already (see the events below)");
    }
    if let Owner::Slab(s) = o {
        // SAFETY: `s` is the live slab holding `p` (the page map says so); its geometry is immutable.
        if unsafe { Slab::slot_of(s, p as usize) }.is_some() {
            // SAFETY: a slot of the slab: `size` readable bytes.
            let usable = unsafe { (*s).size as usize };
            // SAFETY: as above.
            if let Err(Fault::Freed) = unsafe { verify_live(p, usable) } {
                fail(p, op, "double free: the block was freed already");
            }
            fail(p, op, "invalid pointer: a slot that is not in use (freed long ago, or never handed out)");
        }
    }
    fail(p, op, "invalid pointer: not the start of a live block (a pointer into a block, or to memory not handed out)")
}

/// The newest event of the ring about the block at `p`: its sequence number, and whether it gave the
/// block up (a free, or a `realloc` that moved it away).
fn last_event_at(p: *mut u8) -> Option<(usize, bool)> {
    let n = NEXT.load(Ordering::Acquire);
    (n.saturating_sub(EVENTS)..n).rev().find_map(|i| {
        let e = &RING[i % EVENTS];
        if e.seq.load(Ordering::Acquire) != i + 1 {
            return None;
        }
        let op = e.op_tid.load(Ordering::Relaxed) & 0xff;
        if e.other.load(Ordering::Relaxed) == p as usize {
            return Some((i, true));
        }
        (e.addr.load(Ordering::Relaxed) == p as usize).then_some((i, op == Op::Free as u64))
    })
}

// ---------------------------------------------------------------------------------------------
// check

/// Walks every live block and every quarantined one and checks them: canaries, trailers, fills.
/// Returns the number of live blocks checked, or `None` when debug mode is off; aborts with the
/// message and the event dump at the first problem.
pub fn check() -> Option<usize> {
    if !active() {
        return None;
    }
    let base = BASE.load(Ordering::Relaxed);
    let mut n = 0;
    for w in 0..HIGH.load(Ordering::Acquire) {
        let mut bits = word(w).load(Ordering::Acquire);
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let bit = w * 64 + b;
            let p = (base + (bit << GRANULE_SHIFT)) as *mut u8;
            // Other threads go on allocating and freeing: a block seen live may be freed (and filled,
            // even handed out again) while it is read. A fault counts only if the block is still live
            // and shows it again when read once more; a block that is no longer live is passed over.
            for attempt in 0.. {
                if !is_live(bit) {
                    break;
                }
                let o = owner::in_heap(p).unwrap_or(Owner::Unknown);
                // SAFETY: `p` started a live block of `o` when its bit was read; the region stays
                // mapped and readable (debug mode is off in the hardened mode, which seals free memory).
                let r = unsafe { owner::usable(o, p) }.map(|u| (u, unsafe { verify_live(p, u) }));
                match r {
                    Some((_, Ok(_))) => {
                        n += 1;
                        break;
                    }
                    _ if attempt < 2 => {}
                    None => fail(p, Op::Check, "the live-block bitmap names a block the heap does not know"),
                    Some((u, Err(f))) => report(p, u, f, "by edgepool_check()"),
                }
            }
        }
    }
    for slot in &QUARANTINE {
        let e = slot.load(Ordering::Acquire);
        if e == 0 {
            continue;
        }
        let (a, u) = q_block(e);
        // SAFETY: a quarantined block, readable (see above); if it leaves the quarantine meanwhile,
        // its slot changes and a fault is passed over.
        if let Err(f) = unsafe { verify_freed(a, u) } {
            if slot.load(Ordering::Acquire) == e {
                report(a, u, f, "by edgepool_check() (the block is in the quarantine)");
            }
        }
    }
    direct::for_each(|p, len| {
        // SAFETY: a live direct mapping, not unmapped while the table's lock is held.
        if let Err(f) = unsafe { verify_live(p, len) } {
            report(p, len, f, "by edgepool_check()");
        }
        n += 1;
    });
    Some(n)
}

// ---------------------------------------------------------------------------------------------
// Reports

/// Aborts with `what` about `p` found by `op`, after the event dump.
#[cold]
fn fail(p: *mut u8, op: Op, what: &str) -> ! {
    let mut m = MsgBuf::new();
    m.str(op.name()).str("(): ").str(what).str(" (pointer ").hex(p as usize).str(")");
    die(&m)
}

/// Aborts for fault `f` of the block at `p` (`usable` bytes), detected `when`.
#[cold]
fn report(p: *mut u8, usable: usize, f: Fault, when: &str) -> ! {
    let mut m = MsgBuf::new();
    match f {
        Fault::Canary { size, at, found } => {
            m.str("heap buffer overflow: the canary after the block at ").hex(p as usize).str(" (");
            m.num(size as u64).str(" bytes requested) is overwritten at byte ").num(at as u64);
            m.str(" (").hex(found as usize).str(" where 0xa5 belongs); detected ").str(when);
        }
        Fault::Trailer => {
            m.str("heap buffer overflow: the trailer of the block at ").hex(p as usize).str(" (");
            m.num(usable as u64).str(" bytes with the trailer) is overwritten; detected ").str(when);
        }
        Fault::Freed => {
            m.str("double free: the block at ").hex(p as usize).str(" was freed already; detected ").str(when);
        }
        Fault::WrittenAfterFree { at, found } => {
            m.str("write after free: the freed block at ").hex(p as usize).str(" (").num(usable as u64);
            m.str(" bytes) was written at byte ").num(at as u64).str(" (").hex(found as usize);
            m.str(" where 0xdd belongs); detected ").str(when);
        }
    }
    die(&m)
}

/// Prints `m`, the event dump, and aborts.
fn die(m: &MsgBuf) -> ! {
    os::write_stderr(b"edgepool: fatal: ");
    os::write_stderr(m.as_bytes());
    os::write_stderr(b"\n");
    if DUMPED.swap(1, Ordering::AcqRel) == 0 {
        dump(2, true);
    }
    os::abort()
}

// ---------------------------------------------------------------------------------------------
// The ring buffer of events

/// One event; every field is atomic, so that a dump running while other threads record reads torn
/// events at worst (it skips those whose sequence number changed).
struct Event {
    /// Sequence number + 1 of the event stored (0: none, or being written).
    seq: AtomicUsize,
    /// Operation (low 8 bits) and thread id (above).
    op_tid: AtomicU64,
    addr: AtomicUsize,
    size: AtomicUsize,
    /// `realloc`: the old address.
    other: AtomicUsize,
    frames: [AtomicUsize; FRAMES],
}

impl Event {
    const fn new() -> Event {
        Event {
            seq: AtomicUsize::new(0),
            op_tid: AtomicU64::new(0),
            addr: AtomicUsize::new(0),
            size: AtomicUsize::new(0),
            other: AtomicUsize::new(0),
            frames: [const { AtomicUsize::new(0) }; FRAMES],
        }
    }
}

static RING: [Event; EVENTS] = [const { Event::new() }; EVENTS];
static NEXT: AtomicUsize = AtomicUsize::new(0);
/// Set once the dump was written (a corruption report, then the `SIGABRT` of its abort: one dump).
static DUMPED: AtomicU8 = AtomicU8::new(0);

std::thread_local! {
    /// Set while this thread takes a backtrace: an allocation made by the unwinder (its first use
    /// loads it) records no backtrace of its own. `const` and no destructor: never allocates.
    static IN_BACKTRACE: Cell<bool> = const { Cell::new(false) };
    /// The quarantine slots this thread reserved and has not used yet: `[next, end)`.
    static Q_RANGE: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
    /// This thread's kernel id, once asked (0 before).
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn record(op: Op, addr: *mut u8, size: usize, other: usize) {
    let i = NEXT.fetch_add(1, Ordering::Relaxed);
    let e = &RING[i % EVENTS];
    e.seq.store(0, Ordering::Relaxed);
    let tid = TID.with(|t| {
        if t.get() == 0 {
            t.set(os::thread_id());
        }
        t.get()
    });
    e.op_tid.store(op as u64 | (tid as u64) << 8, Ordering::Relaxed);
    e.addr.store(addr as usize, Ordering::Relaxed);
    e.size.store(size, Ordering::Relaxed);
    e.other.store(other, Ordering::Relaxed);
    let mut frames = [core::ptr::null_mut::<c_void>(); FRAMES + 2];
    let mut n = 0;
    if MODE.load(Ordering::Relaxed) as u64 == options::DEBUG_BACKTRACE && !IN_BACKTRACE.with(|b| b.replace(true)) {
        n = os::backtrace(&mut frames);
        IN_BACKTRACE.with(|b| b.set(false));
    }
    // The two innermost frames are this function and the hook that called it.
    for (j, f) in e.frames.iter().enumerate() {
        f.store(if j + 2 < n { frames[j + 2] as usize } else { 0 }, Ordering::Relaxed);
    }
    e.seq.store(i + 1, Ordering::Release);
}

/// Writes the ring's events to `fd`, oldest first; with `symbolize`, callers are named through the
/// dynamic loader (not from a signal handler).
fn dump(fd: libc::c_int, symbolize: bool) {
    let n = NEXT.load(Ordering::Acquire);
    let from = n.saturating_sub(EVENTS);
    let mut m = MsgBuf::new();
    m.str("edgepool: the last ").num((n - from) as u64).str(" allocator events, oldest first (EDGEPOOL_DEBUG):\n");
    os::write_fd(fd, m.as_bytes());
    for i in from..n {
        let e = &RING[i % EVENTS];
        if e.seq.load(Ordering::Acquire) != i + 1 {
            continue;
        }
        let op_tid = e.op_tid.load(Ordering::Relaxed);
        let op = match op_tid & 0xff {
            x if x == Op::Alloc as u64 => "alloc  ",
            x if x == Op::Free as u64 => "free   ",
            x if x == Op::Realloc as u64 => "realloc",
            _ => "?      ",
        };
        let mut m = MsgBuf::new();
        m.str("  #").num(i as u64).str(" thread ").num(op_tid >> 8).str(" ").str(op).str(" ");
        m.hex(e.addr.load(Ordering::Relaxed)).str(" ").num(e.size.load(Ordering::Relaxed) as u64).str(" bytes");
        let other = e.other.load(Ordering::Relaxed);
        if other != 0 {
            m.str(" (from ").hex(other).str(")");
        }
        m.str("\n");
        os::write_fd(fd, m.as_bytes());
        for f in &e.frames {
            let a = f.load(Ordering::Relaxed);
            if a == 0 {
                break;
            }
            let mut m = MsgBuf::new();
            m.str("      at ").hex(a);
            if symbolize {
                os::describe_code_address(a, &mut m);
            }
            m.str("\n");
            os::write_fd(fd, m.as_bytes());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fatal signals

const SIGNALS: [libc::c_int; 3] = [libc::SIGSEGV, libc::SIGBUS, libc::SIGABRT];

/// The actions our handlers replaced, in the order of [`SIGNALS`].
struct OldActions(UnsafeCell<[libc::sigaction; 3]>);
// SAFETY: written once by `start` before the handlers that read it are installed; read-only after.
unsafe impl Sync for OldActions {}

// SAFETY: an all-zero sigaction is a valid value (the default action, no flags).
static OLD: OldActions = OldActions(UnsafeCell::new(unsafe { core::mem::zeroed() }));

extern "C" fn on_fatal_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    if DUMPED.swap(1, Ordering::AcqRel) == 0 {
        let mut m = MsgBuf::new();
        let name = match sig {
            libc::SIGSEGV => "SIGSEGV",
            libc::SIGBUS => "SIGBUS",
            _ => "SIGABRT",
        };
        m.str("edgepool: ").str(name);
        // SAFETY: `info` is this handler's own siginfo.
        let addr = unsafe { os::fault_address(sig, info) };
        if addr != 0 {
            m.str(" at address ").hex(addr);
        }
        m.str("\n");
        os::write_stderr(m.as_bytes());
        dump(2, false);
    }
    let i = SIGNALS.iter().position(|&s| s == sig).unwrap_or(0);
    // SAFETY: `OLD` is read-only once the handlers exist; this is a handler of `sig` with its own
    // arguments.
    unsafe { os::chain_signal(sig, info, ctx, &(*OLD.0.get())[i]) };
}
