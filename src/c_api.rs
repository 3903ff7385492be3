//! The C allocation API with glibc's exact semantics (see `../shared/PRELOAD-CONTRACT.md`). The cdylib
//! only exports these under their C names; all the rules live here, testable in-process.
//!
//! errno: set to `ENOMEM`/`EINVAL` exactly where glibc sets it; `free` never changes it (the OS layer
//! saves and restores errno around every system call a free can make).

use core::ffi::{c_char, c_int, c_void};

use crate::global;
use crate::heap;
use crate::os;
use crate::phase;
use crate::stats;

const MIN_ALIGN: usize = global::MALLOC_ALIGN;
const PTRDIFF_MAX: usize = isize::MAX as usize;

#[inline]
fn fail(e: i32) -> *mut c_void {
    os::set_errno(e);
    core::ptr::null_mut()
}

/// `malloc(n)`: `n == 0` gives a unique pointer; `n > PTRDIFF_MAX` gives NULL + `ENOMEM`.
#[inline]
pub fn malloc(n: usize) -> *mut c_void {
    global::alloc_c(n).cast()
}

/// `calloc(n, s)`: overflow gives NULL + `ENOMEM`; the memory is zero.
#[inline]
pub fn calloc(n: usize, s: usize) -> *mut c_void {
    let Some(total) = n.checked_mul(s) else { return fail(libc::ENOMEM) };
    let p = global::alloc_zeroed(total, MIN_ALIGN);
    if p.is_null() {
        return fail(libc::ENOMEM);
    }
    p.cast()
}

/// `free(p)`: NULL is a no-op; errno is preserved.
///
/// # Safety
/// - `p` is NULL or a live block of this allocator.
#[inline]
pub unsafe fn free(p: *mut c_void) {
    // SAFETY: forwarded contract.
    unsafe { global::free(p.cast()) }
}

/// `realloc(p, n)`: `(NULL, n)` is `malloc(n)`; `(p, 0)` frees `p` and returns NULL without setting
/// errno; on failure NULL + `ENOMEM` with `p` intact; growing within the usable size does not move.
///
/// # Safety
/// - `p` is NULL or a live block of this allocator.
pub unsafe fn realloc(p: *mut c_void, n: usize) -> *mut c_void {
    if p.is_null() {
        return malloc(n);
    }
    if n == 0 {
        // SAFETY: live block.
        unsafe { global::free(p.cast()) };
        return core::ptr::null_mut();
    }
    if n > PTRDIFF_MAX {
        return fail(libc::ENOMEM);
    }
    // SAFETY: live block, allocated with alignment ≤ its slot's (realloc keeps at least 16).
    let q = unsafe { global::realloc(p.cast(), n, MIN_ALIGN) };
    if q.is_null() {
        return fail(libc::ENOMEM);
    }
    q.cast()
}

/// `reallocarray(p, n, s)`: overflow gives NULL + `ENOMEM`; otherwise `realloc(p, n * s)`.
///
/// # Safety
/// - as [`realloc`].
pub unsafe fn reallocarray(p: *mut c_void, n: usize, s: usize) -> *mut c_void {
    match n.checked_mul(s) {
        // SAFETY: forwarded contract.
        Some(total) => unsafe { realloc(p, total) },
        None => fail(libc::ENOMEM),
    }
}

/// Allocation at alignment `align` (a power of two) with C error reporting.
fn aligned(align: usize, n: usize) -> *mut c_void {
    let p = global::alloc(n, align.max(MIN_ALIGN));
    if p.is_null() {
        return fail(libc::ENOMEM);
    }
    p.cast()
}

/// `posix_memalign(&p, a, n)`: `a` not a power-of-two multiple of `sizeof(void*)` gives `EINVAL`;
/// failure gives `ENOMEM`; on any failure `*memptr` is unchanged and errno untouched.
///
/// # Safety
/// - `memptr` is valid for a write.
pub unsafe fn posix_memalign(memptr: *mut *mut c_void, align: usize, n: usize) -> c_int {
    if !align.is_power_of_two() || align % core::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let saved = os::errno();
    let p = global::alloc(n, align.max(MIN_ALIGN));
    if p.is_null() {
        os::set_errno(saved);
        return libc::ENOMEM;
    }
    // SAFETY: caller guarantees memptr is writable.
    unsafe { *memptr = p.cast() };
    0
}

/// `aligned_alloc(a, n)` as glibc ≥ 2.38: `a` zero or not a power of two gives NULL + `EINVAL`; any
/// `n` is allowed.
pub fn aligned_alloc(align: usize, n: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        return fail(libc::EINVAL);
    }
    aligned(align, n)
}

/// `memalign(a, n)`: `a <= 16` acts as malloc; a non-power-of-two `a` is rounded up; an `a` beyond
/// `SIZE_MAX / 2 + 1` (no power of two) gives NULL + `EINVAL`, a power of two too large to serve NULL
/// + `ENOMEM`, as glibc does.
pub fn memalign(align: usize, n: usize) -> *mut c_void {
    if align <= MIN_ALIGN {
        return malloc(n);
    }
    if align > usize::MAX / 2 + 1 {
        return fail(libc::EINVAL);
    }
    aligned(align.next_power_of_two(), n)
}

/// `valloc(n)`: page aligned.
pub fn valloc(n: usize) -> *mut c_void {
    aligned(os::os_page_size(), n)
}

/// `pvalloc(n)`: page aligned, `n` rounded up to whole pages (at least one); overflow gives `ENOMEM`.
pub fn pvalloc(n: usize) -> *mut c_void {
    let page = os::os_page_size();
    let Some(rounded) = n.max(1).checked_add(page - 1).map(|v| v & !(page - 1)) else {
        return fail(libc::ENOMEM);
    };
    aligned(page, rounded)
}

/// `malloc_usable_size(p)`: 0 for NULL; otherwise at least the request, all of it writable.
///
/// # Safety
/// - `p` is NULL or a live block of this allocator.
pub unsafe fn malloc_usable_size(p: *mut c_void) -> usize {
    // SAFETY: forwarded contract.
    unsafe { global::usable_size(p.cast()) }
}

/// glibc's `struct mallinfo2`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mallinfo2 {
    pub arena: usize,
    pub ordblks: usize,
    pub smblks: usize,
    pub hblks: usize,
    pub hblkhd: usize,
    pub usmblks: usize,
    pub fsmblks: usize,
    pub uordblks: usize,
    pub fordblks: usize,
    pub keepcost: usize,
}

/// glibc's `struct mallinfo` (int fields, truncated as glibc does).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mallinfo {
    pub arena: c_int,
    pub ordblks: c_int,
    pub smblks: c_int,
    pub hblks: c_int,
    pub hblkhd: c_int,
    pub usmblks: c_int,
    pub fsmblks: c_int,
    pub uordblks: c_int,
    pub fordblks: c_int,
    pub keepcost: c_int,
}

/// `mallinfo2()` from edgepool's counters: `arena` = heap bytes committed, `hblks`/`hblkhd` = direct
/// mappings, `uordblks` = bytes in allocated heap blocks (slabs counted whole) plus direct mappings,
/// `fordblks` = free heap bytes, `keepcost` = free bytes still resident, `usmblks` = peak OS bytes.
pub fn mallinfo2() -> Mallinfo2 {
    let s = heap::stats();
    let c = s.counters;
    Mallinfo2 {
        arena: s.committed_bytes,
        ordblks: 0,
        smblks: 0,
        hblks: c.direct_allocs - c.direct_frees,
        hblkhd: c.direct_bytes,
        usmblks: s.peak_os_bytes,
        fsmblks: 0,
        uordblks: s.committed_bytes - s.free_bytes + c.direct_bytes,
        fordblks: s.free_bytes,
        keepcost: s.dirty_free_bytes,
    }
}

/// `mallinfo()`: [`mallinfo2`] truncated to `int`.
pub fn mallinfo() -> Mallinfo {
    let m = mallinfo2();
    let t = |v: usize| v as c_int;
    Mallinfo {
        arena: t(m.arena),
        ordblks: t(m.ordblks),
        smblks: t(m.smblks),
        hblks: t(m.hblks),
        hblkhd: t(m.hblkhd),
        usmblks: t(m.usmblks),
        fsmblks: t(m.fsmblks),
        uordblks: t(m.uordblks),
        fordblks: t(m.fordblks),
        keepcost: t(m.keepcost),
    }
}

/// `malloc_trim(pad)`: returns free memory to the OS; 1 if any was released, else 0.
pub fn malloc_trim(_pad: usize) -> c_int {
    c_int::from(global::trim() > 0)
}

/// `mallopt(param, value)`: accepted and ignored (edgepool is tuned by `EDGEPOOL_*`); returns 1 as glibc
/// does on success.
pub fn mallopt(_param: c_int, _value: c_int) -> c_int {
    1
}

/// `edgepool_stats(out, size)`: fills `struct edgepool_stats` (cdylib/include/edgepool.h), versioned by
/// size as mimalloc's and jemalloc's statistics calls are: its first field receives the bytes filled,
/// then come the figures and counters of [`stats::Stats::fields`], one `uint64_t` each. At most `size`
/// bytes are written, whole fields only, so a program built against an older, shorter struct keeps
/// working, and fields only ever join at the end. Returns 0, or -1 with `EINVAL` when `out` is NULL or
/// `size` is below 8.
///
/// # Safety
/// - `out` is NULL or valid for writes of `size` bytes, aligned to 8.
pub unsafe fn stats_into(out: *mut u64, size: usize) -> c_int {
    if out.is_null() || size < 8 {
        os::set_errno(libc::EINVAL);
        return -1;
    }
    let s = heap::stats();
    let room = size / 8 - 1;
    let mut n = 0;
    for (i, (_, v)) in s.fields().enumerate().take(room) {
        // SAFETY: field i + 1 < size / 8 lies inside the caller's buffer.
        unsafe { out.add(i + 1).write(v as u64) };
        n = i + 1;
    }
    // SAFETY: size >= 8.
    unsafe { out.write(((n + 1) * 8) as u64) };
    0
}

/// `edgepool_class_stats(out, count)`: fills the first `count` entries of `out` (`struct
/// edgepool_class_stats`: five `uint64_t`, [`stats::ClassStats`] in its field order) with the size
/// classes' figures, smallest class first, and returns the number of classes (so that a caller may
/// ask with `count = 0` first). `out` may be NULL only with `count = 0`; otherwise -1 with `EINVAL`.
///
/// # Safety
/// - `out` is NULL or valid for writes of `count` entries of five `uint64_t`, aligned to 8.
pub unsafe fn class_stats_into(out: *mut u64, count: usize) -> c_int {
    if out.is_null() && count > 0 {
        os::set_errno(libc::EINVAL);
        return -1;
    }
    let s = heap::stats();
    for (i, c) in s.classes.iter().take(count).enumerate() {
        let v = [c.size as u64, c.slots_in_use as u64, c.slots_reserved as u64, c.allocations, c.frees];
        // SAFETY: entry i < count lies inside the caller's buffer (contract).
        unsafe { core::ptr::copy_nonoverlapping(v.as_ptr(), out.add(5 * i), 5) };
    }
    s.classes.len() as c_int
}

/// Writes the statistics report to `fd`, without allocating.
pub fn write_stats(fd: c_int) {
    stats::write_report(fd, &heap::stats());
}

/// `malloc_stats()`: the statistics report on stderr (glibc prints there too).
pub fn malloc_stats() {
    write_stats(2);
}

/// `malloc_info(options, stream)`: an XML summary on `stream`; `options != 0` gives `EINVAL`.
///
/// # Safety
/// - `stream` is a valid `FILE*`.
pub unsafe fn malloc_info(options: c_int, stream: *mut libc::FILE) -> c_int {
    if options != 0 {
        os::set_errno(libc::EINVAL);
        return -1;
    }
    let s = heap::stats();
    let mut m = os::MsgBuf::new();
    m.str("<malloc version=\"edgepool-").str(env!("CARGO_PKG_VERSION")).str("\">\n");
    m.str("<total type=\"committed\" size=\"").num(s.committed_bytes as u64).str("\"/>\n");
    m.str("<total type=\"os\" size=\"").num(s.os_bytes as u64).str("\"/>\n");
    m.str("<total type=\"free\" size=\"").num(s.free_bytes as u64).str("\"/>\n");
    m.str("<total type=\"mmap\" count=\"").num((s.counters.direct_allocs - s.counters.direct_frees) as u64);
    m.str("\" size=\"").num(s.counters.direct_bytes as u64).str("\"/>\n</malloc>\n");
    // SAFETY: stream is a valid FILE* (caller); stdio may allocate, which re-enters a ready allocator
    // holding no lock.
    unsafe { os::write_file(stream, m.as_bytes()) };
    0
}

/// `struct edgepool_phase_report` (cdylib/include/edgepool.h).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseReportC {
    pub allocations: u64,
    pub peak_bytes: u64,
    pub survivor_bytes: u64,
    pub released_bytes: u64,
    pub os_bytes_before: u64,
    pub os_bytes_after: u64,
    pub duration_ns: u64,
}

/// `edgepool_load_begin()`: opens (or nests) the process-wide load phase.
pub fn load_begin() {
    phase::c_begin();
}

/// `edgepool_load_end(out)`: ends the innermost phase opened by `edgepool_load_begin` (or by
/// `EDGEPOOL_LOAD_PHASE=1`) and fills `*out` if `out` is not NULL. Returns 0, or -1 with `EINVAL` when no
/// phase is open.
///
/// # Safety
/// - `out` is NULL or valid for a write.
pub unsafe fn load_end(out: *mut PhaseReportC) -> c_int {
    let Some(r) = phase::c_end() else {
        os::set_errno(libc::EINVAL);
        return -1;
    };
    if !out.is_null() {
        let c = PhaseReportC {
            allocations: r.allocations,
            peak_bytes: r.peak_bytes as u64,
            survivor_bytes: r.survivor_bytes as u64,
            released_bytes: r.released_bytes as u64,
            os_bytes_before: r.os_bytes_before as u64,
            os_bytes_after: r.os_bytes_after as u64,
            duration_ns: r.duration.as_nanos() as u64,
        };
        // SAFETY: caller guarantees `out` is writable.
        unsafe { out.write(c) };
    }
    0
}

/// `edgepool_version()`: a static NUL-terminated version string.
pub fn version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
}

/// `int edgepool_prefault(void *p, size_t n)`: faults in the pages of `[p, p+n)` for writing without
/// changing their contents (see [`crate::prefault`]). Returns 0, or -1 with `errno = EINVAL` for a
/// null `p` with `n > 0` or a range that wraps around the address space.
///
/// # Safety
/// - the range is mapped read-write and no other thread writes it during the call.
pub unsafe fn prefault(p: *mut c_void, n: usize) -> c_int {
    if n == 0 {
        return 0;
    }
    if p.is_null() || (p as usize).checked_add(n).is_none() {
        os::set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's contract.
    unsafe { os::prefault(p.cast(), n) };
    0
}

/// `edgepool_check`: debug mode's walk of every live block ([`crate::check`]); -1 when debug mode is
/// off.
pub fn check() -> libc::c_long {
    match crate::debug::check() {
        Some(n) => n.min(libc::c_long::MAX as usize) as libc::c_long,
        None => -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contract_edges_in_process() {
        os::set_errno(0);
        let p = malloc(0);
        assert!(!p.is_null());
        // SAFETY: live block.
        unsafe { free(p) };
        assert!(malloc(usize::MAX).is_null());
        assert_eq!(os::errno(), libc::ENOMEM);
        assert!(calloc(usize::MAX / 2, 3).is_null());
        os::set_errno(0);
        // SAFETY: NULL and live blocks only.
        unsafe {
            assert!(!reallocarray(core::ptr::null_mut(), 0, 16).is_null() || os::errno() == 0);
            assert_eq!(os::errno(), 0);
            let mut out = 7usize as *mut c_void;
            assert_eq!(posix_memalign(&mut out, 3, 8), libc::EINVAL);
            assert_eq!(posix_memalign(&mut out, 4, 8), libc::EINVAL);
            assert_eq!(out as usize, 7);
            assert_eq!(posix_memalign(&mut out, 64, 0), 0);
            assert_eq!(out as usize % 64, 0);
            free(out);
        }
        assert!(aligned_alloc(0, 8).is_null());
        assert_eq!(os::errno(), libc::EINVAL);
        assert!(aligned_alloc(24, 8).is_null());
        assert!(memalign(1 << 63, 1).is_null());
        assert_eq!(os::errno(), libc::ENOMEM);
        assert!(memalign((1 << 63) + 1, 1).is_null());
        assert_eq!(os::errno(), libc::EINVAL);
        let q = memalign(24, 10);
        assert_eq!(q as usize % 32, 0);
        // SAFETY: live block.
        unsafe { free(q) };
        let v = pvalloc(1);
        // SAFETY: live block.
        unsafe {
            assert!(malloc_usable_size(v) >= os::os_page_size());
            free(v);
        }
    }
}
