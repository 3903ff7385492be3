//! The OS layer: the only module that calls libc functions (other modules name libc's types and
//! constants only).
//!
//! Every function here is allocation-free: it uses raw system calls (through `libc`'s thin wrappers,
//! which do not allocate) and fixed buffers, so it may be called from inside the allocator, before any
//! runtime is ready, and from the dynamic loader's own `malloc` calls when preloaded.

use core::ffi::c_void;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

/// The allocator's calls into the OS's memory map, counted for the statistics (relaxed adds, on the
/// paths that make the call anyway).
pub struct OsCalls {
    pub mmap: AtomicUsize,
    pub munmap: AtomicUsize,
    pub madvise: AtomicUsize,
    pub mprotect: AtomicUsize,
    pub mremap: AtomicUsize,
}

/// The allocator's calls into the OS's memory map so far: `mmap`, `munmap`, `madvise`, `mprotect` and
/// `mremap` together.
pub fn os_calls() -> u64 {
    let c = &OS_CALLS;
    [&c.mmap, &c.munmap, &c.madvise, &c.mprotect, &c.mremap].iter().map(|a| a.load(Ordering::Relaxed) as u64).sum()
}

/// Page faults the process has taken (minor and major), from `getrusage`.
pub fn page_faults() -> u64 {
    // SAFETY: an all-zero `rusage` is valid, and getrusage only writes into it.
    unsafe {
        let mut ru: libc::rusage = core::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0;
        }
        (ru.ru_minflt + ru.ru_majflt) as u64
    }
}

pub static OS_CALLS: OsCalls = OsCalls {
    mmap: AtomicUsize::new(0),
    munmap: AtomicUsize::new(0),
    madvise: AtomicUsize::new(0),
    mprotect: AtomicUsize::new(0),
    mremap: AtomicUsize::new(0),
};

#[inline]
fn count(c: &AtomicUsize) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// The allocator's page: the granule of the buddy heap and of the page map. The OS page may be larger
/// (16 KiB or 64 KiB on some arm64 kernels); [`purge`] rounds inwards to whole OS pages.
pub const PAGE: usize = 4096;

/// The OS page size, read from the auxiliary vector (no allocation, unlike `sysconf` on some libcs).
pub fn os_page_size() -> usize {
    // SAFETY: getauxval only reads the process's auxiliary vector.
    let p = unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize;
    if p.is_power_of_two() {
        p
    } else {
        PAGE
    }
}

/// Eight of the random bytes the kernel gives every process at `exec` (`AT_RANDOM`: word 0 or 1 of
/// the sixteen), or 0 where the auxiliary vector has none. No system call, no allocation.
pub fn startup_random(word: usize) -> u64 {
    // SAFETY: getauxval only reads the auxiliary vector; AT_RANDOM points at 16 readable bytes, and
    // `word & 1` selects one of their two words.
    unsafe {
        let p = libc::getauxval(libc::AT_RANDOM) as *const u64;
        if p.is_null() {
            0
        } else {
            p.add(word & 1).read_unaligned()
        }
    }
}

/// Fault injection (feature `fault-injection`, for tests): how many more requests for memory the OS
/// layer grants before it refuses every one (`usize::MAX`: never refuses).
#[cfg(feature = "fault-injection")]
static GRANTS_LEFT: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(usize::MAX);

/// Fault injection (feature `fault-injection`): the OS layer grants `n` more requests for memory
/// (reserve, commit, map, remap), then refuses each as the kernel does when out of memory; `None`
/// grants everything again.
#[cfg(feature = "fault-injection")]
pub fn refuse_after(n: Option<usize>) {
    GRANTS_LEFT.store(n.unwrap_or(usize::MAX), core::sync::atomic::Ordering::SeqCst);
}

/// Whether the OS layer may ask the kernel for memory now (always, unless a fault is injected).
#[inline]
fn granted() -> bool {
    #[cfg(feature = "fault-injection")]
    {
        use core::sync::atomic::Ordering;
        let mut left = GRANTS_LEFT.load(Ordering::SeqCst);
        loop {
            if left == usize::MAX {
                return true;
            }
            if left == 0 {
                set_errno(libc::ENOMEM);
                return false;
            }
            match GRANTS_LEFT.compare_exchange(left, left - 1, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return true,
                Err(l) => left = l,
            }
        }
    }
    #[cfg(not(feature = "fault-injection"))]
    true
}

/// A new private anonymous mapping of `len` bytes with protection `prot` and extra `flags`. Returns
/// null on failure.
fn mmap_anon(len: usize, prot: libc::c_int, flags: libc::c_int) -> *mut u8 {
    if !granted() {
        return core::ptr::null_mut();
    }
    count(&OS_CALLS.mmap);
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no existing
    // memory.
    let p =
        unsafe { libc::mmap(core::ptr::null_mut(), len, prot, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags, -1, 0) };
    if p == libc::MAP_FAILED {
        core::ptr::null_mut()
    } else {
        p.cast()
    }
}

/// Reserves `len` bytes of address space with no access and no commit charge.
/// Returns null on failure. `len` must be a multiple of [`PAGE`].
pub fn reserve(len: usize) -> *mut u8 {
    mmap_anon(len, libc::PROT_NONE, libc::MAP_NORESERVE)
}

/// Maps `len` fresh, zeroed, read-write bytes for the allocator's own metadata (the page map, the
/// direct table), without commit charge (`MAP_NORESERVE`): they are touched sparsely. Pages are
/// faulted in on first touch. Returns null on failure.
pub fn map(len: usize) -> *mut u8 {
    mmap_anon(len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE)
}

/// Maps `len` fresh, zeroed, read-write bytes that the program will own (a direct mapping), under the
/// kernel's overcommit policy: where the kernel would refuse the commit charge (a request larger than
/// the machine under the default heuristic, anything beyond the limit under strict accounting), this
/// returns null, as glibc's `malloc` does. Pages are faulted in on first touch.
pub fn map_owned(len: usize) -> *mut u8 {
    mmap_anon(len, libc::PROT_READ | libc::PROT_WRITE, 0)
}

/// The process's address-space limit (`RLIMIT_AS`, `ulimit -v`) in bytes, or `None` when unlimited.
pub fn address_limit() -> Option<usize> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid out-parameter; getrlimit writes nothing else. errno is preserved.
    let ok = unsafe {
        let e = errno();
        let ok = libc::getrlimit(libc::RLIMIT_AS, &mut r) == 0;
        set_errno(e);
        ok
    };
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur as usize)
}

/// Where the kernel places a new mapping now (a one-page mapping made and unmapped at once), or 0.
pub fn probe_address() -> usize {
    let p = mmap_anon(PAGE, libc::PROT_NONE, libc::MAP_NORESERVE);
    if p.is_null() {
        return 0;
    }
    // SAFETY: the page was mapped just above and holds nothing.
    unsafe { unmap(p, PAGE) };
    p as usize
}

/// Why [`map_at`] did not map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapAt {
    /// Something is already mapped in the range: the caller may try elsewhere.
    Taken,
    /// The OS refused (the address-space limit, the overcommit policy, or a kernel without
    /// `MAP_FIXED_NOREPLACE`).
    Refused,
}

/// Maps `len` fresh, zeroed, read-write bytes that the program will own exactly at `p`, never over an
/// existing mapping (`MAP_FIXED_NOREPLACE`). errno is left alone when the range is only taken.
///
/// # Safety
/// - `p` and `len` are page aligned, and nothing of ours expects `[p, p+len)` to stay unmapped.
pub unsafe fn map_at(p: *mut u8, len: usize) -> Result<(), MapAt> {
    if !granted() {
        return Err(MapAt::Refused);
    }
    let e = errno();
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE;
    count(&OS_CALLS.mmap);
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: it fails with EEXIST instead.
    let q = unsafe { libc::mmap(p.cast(), len, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if q == libc::MAP_FAILED {
        if errno() == libc::EEXIST {
            set_errno(e);
            return Err(MapAt::Taken);
        }
        return Err(MapAt::Refused);
    }
    if q.cast::<u8>() != p {
        // A kernel older than 4.17 takes the flag for a hint and maps elsewhere: give it back.
        // SAFETY: the mapping was made just above and holds nothing.
        unsafe { unmap(q.cast(), len) };
        set_errno(libc::ENOMEM);
        return Err(MapAt::Refused);
    }
    Ok(())
}

/// Makes `[p, p+len)` of a reservation readable and writable. Pages read as zero until written.
///
/// # Safety
/// - `p` is page aligned and `[p, p+len)` lies inside a mapping made by [`reserve`] or [`map`].
pub unsafe fn commit(p: *mut u8, len: usize) -> bool {
    if !granted() {
        return false;
    }
    count(&OS_CALLS.mprotect);
    // SAFETY: the caller guarantees the range is ours; changing protection moves no data.
    unsafe { libc::mprotect(p.cast(), len, libc::PROT_READ | libc::PROT_WRITE) == 0 }
}

/// Makes `[p, p+len)` inaccessible (`accessible == false`, `PROT_NONE`) or readable and writable
/// again. Returns whether the OS did it (it may refuse when the process has too many mappings:
/// `vm.max_map_count`). errno is preserved.
///
/// # Safety
/// - `p` and `len` are page aligned, and `[p, p+len)` is memory of ours that nobody uses while it is
///   inaccessible.
pub unsafe fn protect(p: *mut u8, len: usize, accessible: bool) -> bool {
    let prot = if accessible { libc::PROT_READ | libc::PROT_WRITE } else { libc::PROT_NONE };
    // SAFETY: the caller guarantees the range is ours; changing protection moves no data.
    unsafe {
        let e = errno();
        count(&OS_CALLS.mprotect);
        let ok = libc::mprotect(p.cast(), len, prot) == 0;
        set_errno(e);
        ok
    }
}

/// Returns the physical pages of `[p, p+len)` to the OS. Returns `true` only when the whole range was
/// returned and therefore reads as zero afterwards; on `false` (the range is not whole OS pages, or
/// `madvise` failed, e.g. on locked pages) the contents must not be assumed zero. The range stays
/// mapped and usable either way.
///
/// # Safety
/// - `[p, p+len)` lies inside a read-write private anonymous mapping of ours and holds no live data.
pub unsafe fn purge(p: *mut u8, len: usize) -> bool {
    let ps = os_page_size();
    let start = (p as usize + ps - 1) & !(ps - 1);
    let end = (p as usize + len) & !(ps - 1);
    if end <= start {
        // No whole OS page inside: nothing can be returned, and nothing may be assumed zero.
        return false;
    }
    // SAFETY: the caller guarantees the range is ours and dead; MADV_DONTNEED on a private anonymous
    // mapping drops the pages, which read back as zero. errno is preserved: `free` may purge.
    unsafe {
        let e = errno();
        count(&OS_CALLS.madvise);
        let ok = libc::madvise(start as *mut c_void, end - start, libc::MADV_DONTNEED) == 0;
        set_errno(e);
        ok && start == p as usize && end == p as usize + len
    }
}

/// Returns the pages of `[p, p+len)`, heap memory, to the OS as [`purge`] does (same result, same
/// contract). Once pages have moved ([`move_pages`]), it maps fresh memory over the range instead
/// (`mmap` with `MAP_FIXED` and the heap's flags, [`set_heap_reserved`]): each move splits the
/// heap's mapping, the moved pages keeping a mapping of their own, and a fresh mapping merges back
/// with its neighbours (same flags, offsets that follow from the addresses), so the heap's mappings
/// do not pile up with the moves: `malloc_large` run ten times its steps ended at 10 015 mappings
/// without (the count still growing; the kernel keeps about 300 bytes for each) and at 1 596 with,
/// no slower (README, "Pages that move"). Not while the bound on the mappings is at its limit (a
/// range inside one mapping splits it), nor for a range that is not whole OS pages, nor where the
/// kernel refuses: then as [`purge`]. (Under `mlockall(MCL_FUTURE)` the fresh mapping is faulted in
/// whole, zeroed, where `madvise` would have refused: the resident set is the same, as everything
/// is locked in; the heap counts the block clean.)
///
/// # Safety
/// - as [`purge`], and the range is pages of the heap's committed region.
pub unsafe fn purge_heap(p: *mut u8, len: usize) -> bool {
    let ps = os_page_size();
    if MOVE_OKS.load(Ordering::Relaxed) > 0
        && bound_has_room(MAPS_LIMIT.load(Ordering::Relaxed))
        && (p as usize | len) & (ps - 1) == 0
        && len > 0
    {
        // SAFETY: forwarded contract: the range is dead heap memory, whole OS pages; a fresh
        // mapping in its place reads zero, as after a purge. errno is preserved.
        let fresh = unsafe {
            let e = errno();
            let ok = map_fresh(p, len);
            set_errno(e);
            ok
        };
        if fresh {
            return true;
        }
    }
    // SAFETY: forwarded contract.
    unsafe { purge(p, len) }
}

/// Whether the heap's committed memory maps with `MAP_NORESERVE`: a region reserved whole does (see
/// [`reserve`]), a lazy one's pieces do not (they are charged, [`map_at`]). What is mapped over heap
/// memory ([`map_fresh`]) takes the same flags, so that it merges with its neighbours.
static HEAP_NORESERVE: AtomicBool = AtomicBool::new(true);

/// Says whether the heap's region was reserved whole (`true`) or is lazy (set once at start-up).
pub fn set_heap_reserved(reserved: bool) {
    HEAP_NORESERVE.store(reserved, Ordering::Relaxed);
}

/// Maps fresh, zeroed, read-write memory over `[p, p+len)` with the heap's flags (`MAP_FIXED`).
/// Returns whether the range is fresh: `false` where the kernel refused and left the range as it
/// was. Where it refused with part of the range unmapped (a refused `mremap` may leave that, and
/// older kernels' `mmap` too), the range is mapped again, or the process aborts (a hole in the heap
/// would fault at the next use of its pages).
///
/// # Safety
/// - `p` and `len` are whole OS pages of the heap's committed region, and nothing there is needed.
unsafe fn map_fresh(p: *mut u8, len: usize) -> bool {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    let mut flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    if HEAP_NORESERVE.load(Ordering::Relaxed) {
        flags |= libc::MAP_NORESERVE;
    }
    count(&OS_CALLS.mmap);
    // SAFETY: the caller's contract: the range is ours and dead; MAP_FIXED replaces exactly it.
    if unsafe { libc::mmap(p.cast(), len, prot, flags, -1, 0) } != libc::MAP_FAILED {
        return true;
    }
    if mapped(p, len) {
        return false;
    }
    count(&OS_CALLS.mmap);
    // SAFETY: as above.
    if unsafe { libc::mmap(p.cast(), len, prot, flags, -1, 0) } == libc::MAP_FAILED {
        fatal(b"a hole in the heap could not be mapped again");
    }
    true
}

/// Fills `out[i]` with `mincore`'s residency byte of page `i` of `[p, p+len)` (bit 0 = resident).
/// Returns `false` if the kernel could not tell. `p` is page aligned and `out` has one byte per page.
pub fn resident_pages(p: *mut u8, len: usize, out: &mut [u8]) -> bool {
    if out.len() < len.div_ceil(os_page_size()) {
        return false;
    }
    // SAFETY: `out` holds a byte per page of the range; mincore only writes there.
    unsafe {
        let e = errno();
        let ok = libc::mincore(p.cast(), len, out.as_mut_ptr()) == 0;
        set_errno(e);
        ok
    }
}

/// Faults in every page of `[p, p+len)` for writing, in one call (`MADV_POPULATE_WRITE`, Linux
/// 5.14+), instead of one page fault per page when the memory is first written. Returns `false` if the
/// kernel refused (older kernels: `EINVAL`); the memory is then faulted in on use as usual.
///
/// # Safety
/// - the range is page aligned, mapped read-write, and owned by the caller.
pub unsafe fn populate(p: *mut u8, len: usize) -> bool {
    // SAFETY: guaranteed by the caller; populating only allocates pages, it changes no contents.
    // errno is preserved: malloc must not change it on success.
    unsafe {
        let e = errno();
        let mut ok = true;
        let mut off = 0;
        while ok && off < len {
            let n = (len - off).min(POPULATE_PIECE);
            count(&OS_CALLS.madvise);
            ok = libc::madvise(p.add(off).cast(), n, libc::MADV_POPULATE_WRITE) == 0;
            off += n;
        }
        set_errno(e);
        ok
    }
}

/// [`populate`] works in pieces of this size: each `madvise` holds the process's memory-map lock
/// for reading while it faults its pieces in, and a long one stalls every `mmap`, `mprotect` and
/// `munmap` of the process (and, behind a waiting writer, every other page fault).
const POPULATE_PIECE: usize = 2 << 20;

/// Makes every page that `[p, p+len)` touches resident and writable, without changing any byte:
/// `MADV_POPULATE_WRITE` on those pages (Linux 5.14+) or, where the kernel refuses, one byte of the
/// range on each page read and written back. Returns whether the kernel populated the pages.
///
/// Rounding out to whole pages is safe: every page holds at least one byte of the range, so it is
/// mapped writable (protection is per page), and populating changes no contents, including those of
/// other objects sharing the first and last page.
///
/// # Safety
/// - the range is mapped read-write and no other thread writes it during the call.
pub unsafe fn prefault(p: *mut u8, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let start = p as usize & !(PAGE - 1);
    let end = (p as usize + len).next_multiple_of(PAGE);
    // SAFETY: [start, end) is page aligned, and every page of it holds a byte of the caller's
    // writable range (see above), so it is mapped read-write; populating changes no contents, so
    // the bytes of the first and last page outside the range are untouched.
    let ok = unsafe { populate(start as *mut u8, end - start) };
    if !ok {
        let mut q = p as usize;
        while q < p as usize + len {
            // SAFETY: q is inside the caller's range, which nobody else writes meanwhile; the byte
            // is written back unchanged.
            unsafe {
                let b = core::ptr::read_volatile(q as *const u8);
                core::ptr::write_volatile(q as *mut u8, b);
            }
            q = (q & !(PAGE - 1)) + PAGE;
        }
    }
    ok
}

/// Unmaps `[p, p+len)`.
///
/// # Safety
/// - the range was mapped by this module and holds nothing anyone will touch again.
pub unsafe fn unmap(p: *mut u8, len: usize) {
    // SAFETY: guaranteed by the caller. errno is saved and restored: `free` must preserve it.
    unsafe {
        let e = errno();
        count(&OS_CALLS.munmap);
        libc::munmap(p.cast(), len);
        set_errno(e);
    }
}

/// Resizes a mapping made by [`map`], possibly moving it. Returns null on failure (the old mapping is
/// then intact).
///
/// # Safety
/// - `[p, p+old)` is exactly one mapping made by [`map`].
pub unsafe fn remap(p: *mut u8, old: usize, new: usize) -> *mut u8 {
    if new > old && !granted() {
        return core::ptr::null_mut();
    }
    count(&OS_CALLS.mremap);
    // SAFETY: guaranteed by the caller; MREMAP_MAYMOVE keeps the contents.
    let q = unsafe { libc::mremap(p.cast(), old, new, libc::MREMAP_MAYMOVE) };
    if q == libc::MAP_FAILED {
        core::ptr::null_mut()
    } else {
        q.cast()
    }
}

/// Set once the kernel refused a move of pages as unsupported ([`move_pages`]): no more tries.
static MOVES_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// A bound on the process's mappings: the last count ([`count_maps`]) plus [`MOVE_MAPS`] per move
/// of pages tried since. Starts high, so that the first move counts them.
static MAPS_BOUND: AtomicUsize = AtomicUsize::new(usize::MAX / 2);
/// Moves refused by the bound ([`moves_possible`]): it lets one through to count again every
/// [`RECOUNT_EVERY`].
static MAPS_REFUSED: AtomicUsize = AtomicUsize::new(0);
/// Set when [`moves_possible`] let a move through to count the mappings again.
static MAPS_RECOUNT: AtomicBool = AtomicBool::new(true);
/// Set while a thread counts the mappings.
static MAPS_COUNTING: AtomicBool = AtomicBool::new(false);
/// Mappings moves may take the process to: a quarter of `vm.max_map_count` (0 until read).
static MAPS_LIMIT: AtomicUsize = AtomicUsize::new(0);

/// Whether the bound on the process's mappings leaves room for one more move under `limit`.
fn bound_has_room(limit: usize) -> bool {
    MAPS_BOUND.load(Ordering::Relaxed).saturating_add(MOVE_MAPS) <= limit
}

/// Mappings one move of pages may add: the target's mapping split around it (two), the moved pages
/// a mapping of their own (one), and one for the source's.
const MOVE_MAPS: usize = 4;
/// Refused moves between two counts of the mappings once the bound is reached.
const RECOUNT_EVERY: usize = 1024;

/// The process's mappings: the lines of `/proc/self/maps`, read a page at a time (no allocation).
/// `None` if it cannot be read.
fn count_maps() -> Option<usize> {
    let mut buf = [0u8; 4096];
    // SAFETY: the path is NUL-terminated; reads go into `buf`, within its length; the descriptor is
    // closed before returning. errno is preserved.
    unsafe {
        let e = errno();
        let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            set_errno(e);
            return None;
        }
        let mut lines = 0;
        let ok = loop {
            let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
            if n < 0 {
                break false;
            }
            if n == 0 {
                break true;
            }
            lines += buf[..n as usize].iter().filter(|&&b| b == b'\n').count();
        };
        libc::close(fd);
        set_errno(e);
        ok.then_some(lines)
    }
}

/// Whether a move of pages may add mappings now: the bound on the process's mappings stays a
/// quarter of `vm.max_map_count` below it (each move splits the heap's mapping; pages moved keep
/// their own mapping until purged with it). Above, moves stop, and the mappings are counted again
/// when [`moves_possible`] lets a try through (every [`RECOUNT_EVERY`] refusals), so that moves start
/// again once the mappings are fewer. Without `/proc`, no moves. (Reads files: outside every lock.)
fn maps_allow_move() -> bool {
    let mut limit = MAPS_LIMIT.load(Ordering::Relaxed);
    if limit == 0 {
        let mut buf = [0u8; 32];
        let n = read_small_file(c"/proc/sys/vm/max_map_count", &mut buf);
        let max = leading_decimal(&buf[..n]);
        limit = if max == 0 { 65530 / 4 } else { max / 4 };
        MAPS_LIMIT.store(limit, Ordering::Relaxed);
    }
    if bound_has_room(limit) {
        return true;
    }
    if !MAPS_RECOUNT.swap(false, Ordering::Relaxed) || MAPS_COUNTING.swap(true, Ordering::Acquire) {
        return false;
    }
    let n = count_maps().unwrap_or(usize::MAX / 2);
    MAPS_BOUND.store(n, Ordering::Relaxed);
    let room = n.saturating_add(MOVE_MAPS) <= limit;
    if room {
        // The next time the bound reaches the limit, its first refusal counts again: purges
        // ([`purge_heap`]) merge mappings back, so the bound, which only grows, is far above the
        // count by then.
        MAPS_REFUSED.store(0, Ordering::Relaxed);
    }
    MAPS_COUNTING.store(false, Ordering::Release);
    room
}

/// Whether a move of pages may be tried now (cheap, for the heap's lock: no file is read): the
/// kernel did not refuse one as unsupported, and the bound on the process's mappings leaves room,
/// or it is time to count them again (every [`RECOUNT_EVERY`] refusals; the move counts).
pub fn moves_possible() -> bool {
    if MOVES_UNSUPPORTED.load(Ordering::Relaxed) {
        return false;
    }
    let limit = MAPS_LIMIT.load(Ordering::Relaxed);
    if limit == 0 || bound_has_room(limit) {
        return true;
    }
    if MAPS_REFUSED.fetch_add(1, Ordering::Relaxed) % RECOUNT_EVERY == 0 {
        MAPS_RECOUNT.store(true, Ordering::Relaxed);
        return true;
    }
    false
}

/// Sets the mappings that moves of pages may take the process to (instead of a quarter of
/// `vm.max_map_count`). For the tests.
#[doc(hidden)]
pub fn set_move_maps_limit(maps: usize) {
    MAPS_LIMIT.store(maps.max(1), Ordering::Relaxed);
    MAPS_REFUSED.store(0, Ordering::Relaxed);
    MAPS_RECOUNT.store(true, Ordering::Relaxed);
}

/// The process's mappings now (the lines of `/proc/self/maps`), or `None`. For the tests.
#[doc(hidden)]
pub fn mappings() -> Option<usize> {
    count_maps()
}

/// Moves the pages of `[src, src+len)` to `[dst, dst+len)` (`mremap` with `MREMAP_FIXED` and
/// `MREMAP_DONTUNMAP`, Linux 5.7+): what was resident at `src` is resident at `dst` with its
/// contents, without a copy or a page fault, and `src` stays mapped with nothing resident (it reads
/// zero, as after [`purge`]); what `dst` held is dropped. Returns `false` if it did not move (the
/// process has too many mappings for more, [`maps_allow_move`], or the kernel refused); `src` is
/// then as it was, and `dst` holds what it held or, where a kernel unmapped it before it refused,
/// nothing (mapped again, fresh). A kernel that refuses moves (too old, or most of them) gets no
/// more. errno is preserved.
///
/// # Safety
/// - both ranges are page aligned, do not overlap, and lie in the committed part of the heap's
///   region (read-write); nobody uses either while this runs, and nothing of
///   either is needed but what moves.
pub unsafe fn move_pages(src: *mut u8, dst: *mut u8, len: usize) -> bool {
    if MOVES_UNSUPPORTED.load(Ordering::Relaxed) || !maps_allow_move() {
        return false;
    }
    MAPS_BOUND.fetch_add(MOVE_MAPS, Ordering::Relaxed);
    // SAFETY: the caller's contract; a refused move changes nothing but the target, mapped again
    // below with the flags of the heap's committed region.
    unsafe {
        let e = errno();
        count(&OS_CALLS.mremap);
        let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
        let q = libc::mremap(src.cast(), len, len, flags, dst.cast::<c_void>());
        if q != libc::MAP_FAILED {
            MOVE_OKS.fetch_add(1, Ordering::Relaxed);
            set_errno(e);
            return true;
        }
        // A kernel without MREMAP_DONTUNMAP (before 5.7) refuses every move at its flags; one that
        // refuses many moves otherwise (a source across mappings, on older kernels) is not worth
        // asking.
        let fails = MOVE_FAILS.fetch_add(1, Ordering::Relaxed) + 1;
        if errno() == libc::EINVAL || (fails > 64 && fails * 4 > MOVE_OKS.load(Ordering::Relaxed)) {
            MOVES_UNSUPPORTED.store(true, Ordering::Relaxed);
        }
        // Some kernels unmap the target before they find that they cannot move the source: map it
        // again where it is unmapped (`mincore` refuses unmapped pages; `map_fresh` fills the hole
        // or aborts).
        if !mapped(dst, len) {
            map_fresh(dst, len);
        }
        set_errno(e);
        false
    }
}

/// Moves of pages that worked, and that the kernel refused ([`move_pages`]).
static MOVE_OKS: AtomicUsize = AtomicUsize::new(0);
static MOVE_FAILS: AtomicUsize = AtomicUsize::new(0);

/// Whether every page of `[p, p+len)` (page aligned) is mapped.
fn mapped(p: *mut u8, len: usize) -> bool {
    let mut res = [0u8; 256];
    let mut off = 0;
    while off < len {
        let span = (len - off).min(res.len() * PAGE);
        if !resident_pages(p.wrapping_add(off), span, &mut res) {
            return false;
        }
        off += span;
    }
    true
}

/// The process id (a system call: for slow paths).
pub fn pid() -> u32 {
    // SAFETY: getpid has no preconditions and cannot fail.
    unsafe { libc::getpid() as u32 }
}

/// The calling thread's `errno`.
pub fn errno() -> i32 {
    // SAFETY: __errno_location always returns the valid thread-local errno slot.
    unsafe { *libc::__errno_location() }
}

/// Sets the calling thread's `errno`.
pub fn set_errno(e: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Writes all of `bytes` to standard error, ignoring failure. Never allocates.
pub fn write_stderr(bytes: &[u8]) {
    write_fd(2, bytes)
}

/// Writes all of `bytes` to file descriptor `fd`, ignoring failure. Never allocates.
pub fn write_fd(fd: libc::c_int, bytes: &[u8]) {
    let mut b = bytes;
    while !b.is_empty() {
        // SAFETY: the buffer is valid for `b.len()` bytes; a bad descriptor only makes write fail.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n <= 0 {
            return;
        }
        b = &b[n as usize..];
    }
}

/// Prints `msg` and aborts the process. Used for heap corruption and broken invariants: never unwinds.
pub fn fatal(msg: &[u8]) -> ! {
    write_stderr(b"edgepool: fatal: ");
    write_stderr(msg);
    write_stderr(b"\n");
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// Writes `bytes` to the C stream `stream` (`fwrite`). stdio may allocate: call it outside every
/// allocator lock.
///
/// # Safety
/// - `stream` is a valid, open `FILE*`.
pub unsafe fn write_file(stream: *mut libc::FILE, bytes: &[u8]) {
    // SAFETY: the buffer is valid for its length; the stream is valid (contract).
    unsafe { libc::fwrite(bytes.as_ptr().cast(), 1, bytes.len(), stream) };
}

/// Reports a pointer that cannot be freed (or measured) and aborts: `what (pointer 0x…)`.
#[cold]
#[inline(never)]
pub fn invalid_pointer(p: *mut u8, what: &str) -> ! {
    let mut m = MsgBuf::new();
    m.str(what).str(" (pointer ").hex(p as usize).str(")");
    fatal(m.as_bytes())
}

/// An impossible state of the allocator's own structures: a failed assertion in debug builds (so
/// tests see where), a message and `abort()` in release builds. Never a panic.
#[cold]
#[inline(never)]
pub fn broken(what: &str) -> ! {
    debug_assert!(false, "edgepool: broken invariant: {what}");
    let mut m = MsgBuf::new();
    m.str("broken invariant: ").str(what);
    fatal(m.as_bytes())
}

/// Creates a thread-specific key whose destructor `dtor` runs at thread exit with the thread's
/// non-null value. `None` when the process has no key left. Does not allocate.
pub fn thread_key_create(dtor: unsafe extern "C" fn(*mut c_void)) -> Option<libc::pthread_key_t> {
    let mut key: libc::pthread_key_t = 0;
    // SAFETY: `key` is a valid out-pointer; `dtor` has the destructor signature.
    (unsafe { libc::pthread_key_create(&mut key, Some(dtor)) } == 0).then_some(key)
}

/// Sets the calling thread's value of `key`. May allocate inside libc for keys beyond the first 32
/// (the caller makes sure a nested allocation finds its state ready).
///
/// # Safety
/// - `key` came from [`thread_key_create`], and its destructor accepts `value`.
pub unsafe fn thread_key_set(key: libc::pthread_key_t, value: *mut c_void) {
    // SAFETY: the key came from `thread_key_create`; the value is only passed back to its destructor.
    unsafe { libc::pthread_setspecific(key, value) };
}

/// Registers `fork` handlers. May allocate: call it outside every allocator lock.
pub fn at_fork(prepare: extern "C" fn(), parent: extern "C" fn(), child: extern "C" fn()) {
    // SAFETY: plain `extern "C"` functions that do not unwind.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// Registers `f` to run at process exit. May allocate: call it outside every allocator lock.
pub fn at_exit(f: extern "C" fn()) {
    // SAFETY: an `extern "C"` function that does not unwind.
    unsafe { libc::atexit(f) };
}

/// Installs `handler` for signal `sig` (`SA_RESTART`). The handler must be async-signal-safe.
pub fn on_signal(sig: libc::c_int, handler: extern "C" fn(libc::c_int)) {
    // SAFETY: a zeroed sigaction is a valid starting value; the handler is a plain function.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, core::ptr::null_mut());
    }
}

/// A handler of fatal signals, `SA_SIGINFO` style.
pub type FatalHandler = extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut c_void);

/// Installs `handler` for `sig` (`SA_SIGINFO | SA_ONSTACK`, so that it runs on an alternate stack
/// where the thread has one) and stores the action it replaces in `old`, for [`chain_signal`].
///
/// # Safety
/// - `old` is valid for writes and is not read by a handler of `sig` before this returns.
pub unsafe fn install_fatal_handler(sig: libc::c_int, handler: FatalHandler, old: *mut libc::sigaction) {
    // SAFETY: a zeroed sigaction is a valid starting value; `old` is writable (contract).
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(sig, &sa, old);
    }
}

/// From a handler of `sig`: passes the signal on to the action `old` that was in place before ours —
/// calls its handler, or, for the default action (and for an ignored signal, which cannot be ignored
/// once it is a fault), restores it and raises the signal again, so that it takes effect when the
/// handler returns (a fault re-executes, and kills the process with the right status).
///
/// # Safety
/// - called from a handler of `sig` with the handler's own `info` and `ctx`; `old` is the action
///   [`install_fatal_handler`] stored.
pub unsafe fn chain_signal(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut c_void, old: &libc::sigaction) {
    let h = old.sa_sigaction;
    // SAFETY: `h` is the previous action's handler, called with the arguments its flags promise;
    // sigaction and raise are async-signal-safe.
    unsafe {
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, core::ptr::null_mut());
            libc::raise(sig);
        } else if old.sa_flags & libc::SA_SIGINFO != 0 {
            let f: FatalHandler = core::mem::transmute::<usize, FatalHandler>(h);
            f(sig, info, ctx);
        } else {
            let f: extern "C" fn(libc::c_int) = core::mem::transmute::<usize, extern "C" fn(libc::c_int)>(h);
            f(sig);
        }
    }
}

/// The fault address of a `SIGSEGV` or `SIGBUS` (null for other signals).
///
/// # Safety
/// - `info` is the `siginfo_t` a handler received.
pub unsafe fn fault_address(sig: libc::c_int, info: *const libc::siginfo_t) -> usize {
    if info.is_null() || (sig != libc::SIGSEGV && sig != libc::SIGBUS) {
        return 0;
    }
    // SAFETY: a fault's siginfo carries `si_addr` (contract).
    unsafe { (*info).si_addr() as usize }
}

/// Aborts the process (`abort()`: `SIGABRT`, through any handler installed for it).
pub fn abort() -> ! {
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}

/// The calling thread's kernel thread id.
pub fn thread_id() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

/// Fills `frames` with the return addresses of the calling stack, innermost first (glibc's
/// `backtrace`); returns how many it wrote. The first call in a process loads the unwinder, which
/// allocates: the caller must make a nested allocation skip its own backtrace.
pub fn backtrace(frames: &mut [*mut c_void]) -> usize {
    // SAFETY: the buffer is valid for `len` entries.
    let n = unsafe { libc::backtrace(frames.as_mut_ptr(), frames.len().min(i32::MAX as usize) as libc::c_int) };
    n.max(0) as usize
}

/// Appends ` (symbol+0xoff)` or ` (file+0xoff)` for code address `addr` to `m`, when the dynamic
/// loader knows it (`dladdr`: no allocation, but the loader's lock; not for signal handlers).
pub fn describe_code_address(addr: usize, m: &mut MsgBuf) {
    // SAFETY: dladdr only reads the loader's tables and writes `info`.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::dladdr(addr as *const c_void, &mut info) } == 0 {
        return;
    }
    let (name, base) = if !info.dli_sname.is_null() {
        (info.dli_sname, info.dli_saddr as usize)
    } else if !info.dli_fname.is_null() {
        (info.dli_fname, info.dli_fbase as usize)
    } else {
        return;
    };
    // SAFETY: dladdr's names are NUL-terminated strings of the loader's, alive while the object is.
    let bytes = unsafe { core::ffi::CStr::from_ptr(name) }.to_bytes();
    let bytes = match bytes.iter().rposition(|&c| c == b'/') {
        Some(i) if info.dli_sname.is_null() => &bytes[i + 1..],
        _ => bytes,
    };
    m.str(" (").str(core::str::from_utf8(&bytes[..bytes.len().min(160)]).unwrap_or("?"));
    m.str("+").hex(addr.wrapping_sub(base)).str(")");
}

/// A small fixed-capacity text buffer for messages built without allocating.
pub struct MsgBuf {
    buf: [u8; 512],
    len: usize,
}

impl Default for MsgBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl MsgBuf {
    pub const fn new() -> Self {
        MsgBuf { buf: [0; 512], len: 0 }
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        for &c in s.as_bytes() {
            if self.len < self.buf.len() {
                self.buf[self.len] = c;
                self.len += 1;
            }
        }
        self
    }
    pub fn num(&mut self, mut v: u64) -> &mut Self {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        loop {
            i -= 1;
            tmp[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        for &c in &tmp[i..] {
            if self.len < self.buf.len() {
                self.buf[self.len] = c;
                self.len += 1;
            }
        }
        self
    }
    /// Appends `v` right-aligned in `width` columns.
    pub fn num_padded(&mut self, v: u64, width: usize) -> &mut Self {
        let digits = if v == 0 { 1 } else { v.ilog10() as usize + 1 };
        for _ in digits..width {
            self.str(" ");
        }
        self.num(v)
    }
    /// Appends `v / 10^decimals` with `decimals` digits after the point (`fixed(1234, 3)` is
    /// `1.234`, `fixed(5, 2)` is `0.05`).
    pub fn fixed(&mut self, v: u64, decimals: u32) -> &mut Self {
        let unit = 10u64.pow(decimals);
        self.num(v / unit).str(".");
        let mut d = unit / 10;
        while d > 0 {
            self.num(v / d % 10);
            d /= 10;
        }
        self
    }
    pub fn hex(&mut self, v: usize) -> &mut Self {
        self.str("0x");
        let mut started = false;
        for i in (0..16).rev() {
            let d = (v >> (i * 4)) & 0xf;
            if d != 0 || started || i == 0 {
                started = true;
                let c = b"0123456789abcdef"[d];
                if self.len < self.buf.len() {
                    self.buf[self.len] = c;
                    self.len += 1;
                }
            }
        }
        self
    }
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Waits while `*word == expected` (futex wait, private). Returns on wake-up, signal or mismatch.
pub fn futex_wait(word: &AtomicU32, expected: u32) {
    // SAFETY: the futex word is a valid, aligned u32 for the duration of the call.
    unsafe {
        let e = errno();
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            expected,
            core::ptr::null::<libc::timespec>(),
        );
        set_errno(e);
    }
}

/// Wakes one waiter on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: as in `futex_wait`.
    unsafe {
        let e = errno();
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, 1);
        set_errno(e);
    }
}

/// Monotonic time in nanoseconds (`clock_gettime` through the vDSO: no allocation, no lock).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Closes file descriptor `fd`, preserving errno.
pub fn close(fd: libc::c_int) {
    let e = errno();
    // SAFETY: closing a descriptor touches no memory.
    unsafe { libc::close(fd) };
    set_errno(e);
}

/// Sleeps for `ns` nanoseconds (or until a signal).
pub fn sleep_ns(ns: u64) {
    let ts =
        libc::timespec { tv_sec: (ns / 1_000_000_000) as libc::time_t, tv_nsec: (ns % 1_000_000_000) as libc::c_long };
    // SAFETY: `ts` is a valid timespec; no remainder is asked for.
    unsafe { libc::nanosleep(&ts, core::ptr::null_mut()) };
}

/// Opens `path` (not NUL-terminated, at most 4095 bytes) for writing, created or truncated, close
/// on exec. Returns the descriptor, or `None` (errno set). Never allocates.
pub fn open_write(path: &[u8]) -> Option<libc::c_int> {
    let mut buf = [0u8; 4096];
    if path.len() >= buf.len() || path.contains(&0) {
        set_errno(libc::ENAMETOOLONG);
        return None;
    }
    buf[..path.len()].copy_from_slice(path);
    // SAFETY: `buf` is NUL-terminated (zeroed beyond the path).
    let fd = unsafe {
        libc::open(buf.as_ptr().cast(), libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC, 0o644)
    };
    (fd >= 0).then_some(fd)
}

/// Reads up to `buf.len()` bytes of the file at `path` into `buf`; returns how many (0 on failure).
/// Never allocates.
pub fn read_small_file(path: &core::ffi::CStr, buf: &mut [u8]) -> usize {
    // SAFETY: `path` is NUL-terminated; reads go into `buf`, within its length.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return 0;
        }
        let mut len = 0;
        while len < buf.len() {
            let n = libc::read(fd, buf.as_mut_ptr().add(len).cast(), buf.len() - len);
            if n <= 0 {
                break;
            }
            len += n as usize;
        }
        libc::close(fd);
        len
    }
}

/// Starts a detached thread running `f(arg)` on a 256 KiB stack. Returns whether it started. The
/// thread is made by `pthread_create` directly: nothing of Rust's thread machinery (which allocates)
/// runs in it.
///
/// # Safety
/// - `f(arg)` may run on another thread, for as long as it likes: whatever `arg` points to must stay
///   valid and be safe to use from there.
pub unsafe fn spawn_detached(f: extern "C" fn(*mut c_void) -> *mut c_void, arg: *mut c_void) -> bool {
    // SAFETY: the attribute object is initialised before use and destroyed after; `f` is a plain
    // C-ABI function and `arg` is passed through untouched (the caller vouches for it).
    unsafe {
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        if libc::pthread_attr_init(&mut attr) != 0 {
            return false;
        }
        libc::pthread_attr_setdetachstate(&mut attr, libc::PTHREAD_CREATE_DETACHED);
        libc::pthread_attr_setstacksize(&mut attr, 256 << 10);
        let mut t: libc::pthread_t = 0;
        let ok = libc::pthread_create(&mut t, &attr, f, arg) == 0;
        libc::pthread_attr_destroy(&mut attr);
        ok
    }
}

/// Relaxes the CPU inside a spin loop.
#[inline]
pub fn spin_hint() {
    core::hint::spin_loop();
}

/// Gives the processor to another thread (`sched_yield`, which cannot fail on Linux).
pub fn yield_now() {
    // SAFETY: no arguments, no memory touched.
    unsafe { libc::sched_yield() };
}

extern "C" {
    static mut environ: *const *const libc::c_char;
}

/// Calls `f(name, value)` for every `EDGEPOOL_*` variable of the environment, with the prefix removed.
///
/// Reads the `environ` array by hand (no `getenv`, which may lock or allocate). Early in a preloaded
/// process, before libc has set `environ`, it falls back to reading `/proc/self/environ` into a
/// temporary mapping.
pub fn for_each_option(mut f: impl FnMut(&[u8], &[u8])) {
    const PREFIX: &[u8] = b"EDGEPOOL_";
    let mut visit = |entry: &[u8]| {
        if let Some(rest) = entry.strip_prefix(PREFIX) {
            if let Some(eq) = rest.iter().position(|&c| c == b'=') {
                f(&rest[..eq], &rest[eq + 1..]);
            }
        }
    };
    // SAFETY: `environ` is either null or a null-terminated array of C strings owned by libc; we only
    // read it, during initialisation, as getenv does.
    unsafe {
        let env = core::ptr::read_volatile(&raw const environ);
        if !env.is_null() {
            let mut p = env;
            while !(*p).is_null() {
                let s = core::ffi::CStr::from_ptr(*p);
                visit(s.to_bytes());
                p = p.add(1);
            }
            return;
        }
    }
    // Fallback: /proc/self/environ, NUL-separated, read into a fresh mapping.
    const CAP: usize = 1 << 20;
    let buf = map(CAP);
    if buf.is_null() {
        return;
    }
    // SAFETY: `buf` is our own fresh mapping of CAP bytes, unmapped only after its last use.
    unsafe {
        let data = core::slice::from_raw_parts_mut(buf, CAP);
        let len = read_small_file(c"/proc/self/environ", data);
        for entry in data[..len].split(|&c| c == 0) {
            visit(entry);
        }
        unmap(buf, CAP);
    }
}

/// Calls `f` with the value of the first `EDGEPOOL_<name>` of the environment, if there is one (see
/// [`for_each_option`]).
pub fn with_option(name: &[u8], f: impl FnOnce(&[u8])) {
    let mut f = Some(f);
    for_each_option(|n, value| {
        if n == name {
            if let Some(f) = f.take() {
                f(value);
            }
        }
    });
}

/// Resident set size of this process in bytes, from `/proc/self/statm` (for statistics and tests).
pub fn rss_bytes() -> usize {
    let mut buf = [0u8; 128];
    let n = read_small_file(c"/proc/self/statm", &mut buf);
    let text = &buf[..n];
    let mut fields = text.split(|&c| c == b' ');
    fields.next();
    leading_decimal(fields.next().unwrap_or(b"")) * os_page_size()
}

/// The decimal number that `s` starts with (0 if none; saturating), as `/proc` files write them.
fn leading_decimal(s: &[u8]) -> usize {
    let digits = s.iter().take_while(|c| c.is_ascii_digit());
    digits.fold(0usize, |n, &c| n.saturating_mul(10).saturating_add((c - b'0') as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mappings_are_counted_as_the_kernel_lists_them() {
        let a = count_maps().unwrap();
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let b = count_maps().unwrap();
        let lines = text.lines().count();
        // Other tests map and unmap meanwhile: the file read in between lies between the two counts,
        // give or take a few.
        assert!(lines + 8 >= a.min(b) && lines <= a.max(b) + 8, "{a} {lines} {b}");
    }

    /// A move the kernel refuses leaves the target mapped, writable and reading zero, and the
    /// source as it was.
    #[test]
    fn a_refused_move_leaves_the_target_usable() {
        let len = 4 * PAGE;
        let flags = libc::MAP_NORESERVE;
        let dst = mmap_anon(len, libc::PROT_READ | libc::PROT_WRITE, flags);
        let src = mmap_anon(len, libc::PROT_READ | libc::PROT_WRITE, flags);
        assert!(!dst.is_null() && !src.is_null());
        // SAFETY: both mappings are this test's; `src`'s second half is unmapped below, so a move
        // from there must fail (nothing is mapped there to move).
        unsafe {
            dst.write_bytes(7, len);
            src.write_bytes(9, len);
            unmap(src.add(2 * PAGE), 2 * PAGE);
            assert!(!move_pages(src.add(2 * PAGE), dst, 2 * PAGE), "a move of unmapped pages succeeded");
            // As it was, or unmapped by the kernel and mapped again, fresh.
            let was = *dst;
            assert!(was == 7 || was == 0, "{was}");
            assert!((0..2 * PAGE).step_by(512).all(|i| *dst.add(i) == was), "the target changed in part");
            assert!((2 * PAGE..len).step_by(512).all(|i| *dst.add(i) == 7), "beyond the target changed");
            dst.write_bytes(3, len);
            assert_eq!(*dst.add(len - 1), 3);
            assert!((0..2 * PAGE).all(|i| *src.add(i) == 9), "the source changed");
            // And a move that works carries the pages over, leaving the source reading zero.
            assert!(move_pages(src, dst, 2 * PAGE));
            assert!((0..2 * PAGE).all(|i| *dst.add(i) == 9) && *dst.add(2 * PAGE) == 3);
            assert!((0..2 * PAGE).all(|i| *src.add(i) == 0));
            // Below the mappings' limit, no move; above it again, moves.
            set_move_maps_limit(1);
            assert!(!move_pages(dst, src, 2 * PAGE), "a move beyond the mappings' limit");
            assert!((0..2 * PAGE).all(|i| *dst.add(i) == 9), "a move refused by the limit changed the source");
            set_move_maps_limit(usize::MAX / 4);
            assert!(move_pages(dst, src, 2 * PAGE), "moves did not start again");
            assert!((0..2 * PAGE).all(|i| *src.add(i) == 9));
            MAPS_LIMIT.store(0, Ordering::Relaxed);
            unmap(src, 2 * PAGE);
            unmap(dst, len);
        }
    }

    /// The mappings `/proc/self/maps` lists that overlap `[p, p + len)`.
    fn mappings_over(p: *mut u8, len: usize) -> usize {
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let (lo, hi) = (p as usize, p as usize + len);
        text.lines()
            .filter(|l| {
                let (a, b) = l.split(' ').next().unwrap().split_once('-').unwrap();
                let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
                a < hi && b > lo
            })
            .count()
    }

    /// Pages moved inside a mapping leave it split; fresh memory mapped over the moved pages and
    /// over their source (what `purge_heap` does once pages moved) makes it one mapping again, the
    /// replaced pages reading zero and the others as they were.
    #[test]
    fn fresh_memory_over_moved_pages_merges_the_mapping_back() {
        let len = 64 * PAGE;
        // The heap's flags (a reserved region: MAP_NORESERVE, as `map_fresh` maps by default). One
        // page more on each side, unmapped after, so that no neighbour of another test merges in.
        let outer = mmap_anon(len + 2 * PAGE, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_NORESERVE);
        assert!(!outer.is_null());
        // SAFETY: the mapping is this test's; the moves and fresh mappings stay inside it. (Raw
        // mremap rather than `move_pages`: another test sets the limit on moves meanwhile.)
        unsafe {
            unmap(outer, PAGE);
            unmap(outer.add(PAGE + len), PAGE);
            let r = outer.add(PAGE);
            r.write_bytes(5, len);
            assert_eq!(mappings_over(r, len), 1);
            let flags = libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED | libc::MREMAP_DONTUNMAP;
            let q =
                libc::mremap(r.add(8 * PAGE).cast(), 16 * PAGE, 16 * PAGE, flags, r.add(40 * PAGE).cast::<c_void>());
            if q == libc::MAP_FAILED {
                // A kernel before 5.7: no moves, nothing to merge.
                unmap(r, len);
                return;
            }
            let split = mappings_over(r, len);
            assert!(split > 1, "a move left the mapping whole");
            assert!((40 * PAGE..56 * PAGE).step_by(512).all(|i| *r.add(i) == 5));
            assert!(map_fresh(r.add(40 * PAGE), 16 * PAGE));
            assert!(map_fresh(r.add(8 * PAGE), 16 * PAGE));
            assert_eq!(mappings_over(r, len), 1, "still split ({split} mappings after the move)");
            let fresh = |i: usize| (8 * PAGE..24 * PAGE).contains(&i) || (40 * PAGE..56 * PAGE).contains(&i);
            assert!((0..len).step_by(512).all(|i| *r.add(i) == if fresh(i) { 0 } else { 5 }));
            r.write_bytes(6, len);
            assert_eq!(*r.add(len - 1), 6);
            unmap(r, len);
        }
    }
}
