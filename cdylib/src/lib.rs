//! `libedgepool.so`: exports the C allocation API for `LD_PRELOAD`. No logic lives here: every export
//! is a one-line call into `edgepool::c_api`, where glibc's semantics are implemented and tested.
//!
//! Built with initial-exec TLS (see `.cargo/config.toml`), so the allocator's thread-local access is one
//! `%fs`-relative load and never calls `__tls_get_addr` (which may itself call `malloc` after a
//! `dlopen`). `tests/preload.rs` checks the built library for this.
#![allow(clippy::missing_safety_doc)]

use core::ffi::{c_char, c_int, c_void};

use ep::c_api;

/// Emits `#[no_mangle] pub unsafe extern "C" fn NAME(ARGS) -> RET { BODY }` for each entry.
macro_rules! export {
    ($($name:ident ( $($arg:ident : $ty:ty),* ) $(-> $ret:ty)? = $body:expr;)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($arg: $ty),*) $(-> $ret)? {
                // SAFETY: the C caller upholds the C contract of this function, which is the contract
                // of the `c_api` function it forwards to.
                #[allow(unused_unsafe)]
                unsafe { $body }
            }
        )*
    };
}

export! {
    malloc(n: usize) -> *mut c_void = c_api::malloc(n);
    calloc(n: usize, s: usize) -> *mut c_void = c_api::calloc(n, s);
    realloc(p: *mut c_void, n: usize) -> *mut c_void = c_api::realloc(p, n);
    reallocarray(p: *mut c_void, n: usize, s: usize) -> *mut c_void = c_api::reallocarray(p, n, s);
    free(p: *mut c_void) = c_api::free(p);
    cfree(p: *mut c_void) = c_api::free(p);
    free_sized(p: *mut c_void, _s: usize) = c_api::free(p);
    free_aligned_sized(p: *mut c_void, _a: usize, _s: usize) = c_api::free(p);
    posix_memalign(m: *mut *mut c_void, a: usize, n: usize) -> c_int = c_api::posix_memalign(m, a, n);
    aligned_alloc(a: usize, n: usize) -> *mut c_void = c_api::aligned_alloc(a, n);
    memalign(a: usize, n: usize) -> *mut c_void = c_api::memalign(a, n);
    valloc(n: usize) -> *mut c_void = c_api::valloc(n);
    pvalloc(n: usize) -> *mut c_void = c_api::pvalloc(n);
    malloc_usable_size(p: *mut c_void) -> usize = c_api::malloc_usable_size(p);
    malloc_trim(pad: usize) -> c_int = c_api::malloc_trim(pad);
    mallopt(param: c_int, value: c_int) -> c_int = c_api::mallopt(param, value);
    mallinfo() -> c_api::Mallinfo = c_api::mallinfo();
    mallinfo2() -> c_api::Mallinfo2 = c_api::mallinfo2();
    malloc_stats() = c_api::malloc_stats();
    malloc_info(options: c_int, stream: *mut libc::FILE) -> c_int = c_api::malloc_info(options, stream);

    // The names glibc-internal callers and older programs reach.
    __libc_malloc(n: usize) -> *mut c_void = c_api::malloc(n);
    __libc_calloc(n: usize, s: usize) -> *mut c_void = c_api::calloc(n, s);
    __libc_realloc(p: *mut c_void, n: usize) -> *mut c_void = c_api::realloc(p, n);
    __libc_free(p: *mut c_void) = c_api::free(p);
    __libc_cfree(p: *mut c_void) = c_api::free(p);
    __libc_memalign(a: usize, n: usize) -> *mut c_void = c_api::memalign(a, n);
    __libc_valloc(n: usize) -> *mut c_void = c_api::valloc(n);
    __libc_pvalloc(n: usize) -> *mut c_void = c_api::pvalloc(n);
    __posix_memalign(m: *mut *mut c_void, a: usize, n: usize) -> c_int = c_api::posix_memalign(m, a, n);

    // edgepool's own C API (cdylib/include/edgepool.h).
    edgepool_version() -> *const c_char = c_api::version();
    edgepool_trim() -> usize = ep::trim();
    edgepool_check() -> core::ffi::c_long = c_api::check();
    edgepool_print_stats(fd: c_int) = c_api::write_stats(fd);
    edgepool_stats(out: *mut u64, size: usize) -> c_int = c_api::stats_into(out, size);
    edgepool_class_stats(out: *mut u64, count: usize) -> c_int = c_api::class_stats_into(out, count);
    edgepool_set_limit(bytes: usize) = ep::set_limit(bytes);
    edgepool_prefault(p: *mut c_void, n: usize) -> c_int = c_api::prefault(p, n);
    edgepool_prefault_free(bytes: usize) -> usize = ep::prefault_free(bytes);
    edgepool_load_begin() = c_api::load_begin();
    edgepool_load_end(out: *mut c_api::PhaseReportC) -> c_int = c_api::load_end(out);
}
