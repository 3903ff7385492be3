//! valgrind client requests (the `valgrind` cargo feature): edgepool tells memcheck which memory is a
//! block and which is not, so that a program running on edgepool gets the leak, overflow and
//! use-after-free reports it would get on glibc under valgrind. Without the feature every function
//! here is empty and costs nothing; with it, they cost one load and branch when the process does not
//! run under valgrind (found once with the `RUNNING_ON_VALGRIND` request), so the behaviour of a
//! native run is unchanged.
//!
//! A client request is a magic no-op instruction sequence (four rotations of `rdi` adding up to 128
//! bits, then `xchg rbx, rbx`) that valgrind's JIT recognises: it reads the request from the array
//! that `rax` points to and writes its answer to `rdx`. Run natively, the sequence changes nothing.
//! The request numbers are those of `valgrind.h` and `memcheck.h`.
//!
//! What edgepool reports (see `global`): every block handed out is `MALLOCLIKE` with its requested
//! size (its slack to the usable size made inaccessible), every block freed `FREELIKE` (inaccessible)
//! before any allocator data is written into it; the first 16 bytes of a freed slab slot are made
//! defined again, because the allocator keeps its remote-free link and freed mark there. Blocks of the
//! heap taken for the allocator's own use are made defined (they may have been a user's block).

#[cfg(all(feature = "valgrind", target_arch = "x86_64", target_os = "linux"))]
mod imp {
    use core::sync::atomic::{AtomicU8, Ordering};

    const RUNNING_ON_VALGRIND: usize = 0x1001;
    const MALLOCLIKE_BLOCK: usize = 0x1301;
    const FREELIKE_BLOCK: usize = 0x1302;
    const MAKE_MEM_NOACCESS: usize = 0x4d43_0000;
    const MAKE_MEM_DEFINED: usize = 0x4d43_0002;

    #[inline(always)]
    fn request(args: [usize; 6]) -> usize {
        let mut result: usize = 0;
        // SAFETY: natively the sequence rotates rdi by 128 bits in all (no change) and exchanges rbx
        // with itself: it touches no memory and leaves every register as it found it. Under valgrind
        // the request only reads `args` and writes `rdx` (declared). `rbx` is not an operand, only
        // named in an instruction that leaves it unchanged.
        unsafe {
            core::arch::asm!(
                "rol rdi, 3",
                "rol rdi, 13",
                "rol rdi, 61",
                "rol rdi, 51",
                "xchg rbx, rbx",
                in("rax") args.as_ptr(),
                inout("rdx") result,
                out("rdi") _,
                options(nostack),
            );
        }
        result
    }

    /// 0: not asked yet; 1: native; 2: under valgrind.
    static UNDER: AtomicU8 = AtomicU8::new(0);

    /// Whether the process runs under valgrind.
    #[inline(always)]
    pub fn active() -> bool {
        match UNDER.load(Ordering::Relaxed) {
            0 => ask(),
            s => s == 2,
        }
    }

    #[cold]
    fn ask() -> bool {
        let on = request([RUNNING_ON_VALGRIND, 0, 0, 0, 0, 0]) != 0;
        UNDER.store(if on { 2 } else { 1 }, Ordering::Relaxed);
        on
    }

    #[inline(always)]
    pub fn malloclike(p: *mut u8, size: usize, zeroed: bool) {
        request([MALLOCLIKE_BLOCK, p as usize, size, 0, zeroed as usize, 0]);
    }
    #[inline(always)]
    pub fn freelike(p: *mut u8) {
        request([FREELIKE_BLOCK, p as usize, 0, 0, 0, 0]);
    }
    #[inline(always)]
    pub fn noaccess(p: *mut u8, len: usize) {
        request([MAKE_MEM_NOACCESS, p as usize, len, 0, 0, 0]);
    }
    #[inline(always)]
    pub fn defined(p: *mut u8, len: usize) {
        request([MAKE_MEM_DEFINED, p as usize, len, 0, 0, 0]);
    }
}

#[cfg(not(all(feature = "valgrind", target_arch = "x86_64", target_os = "linux")))]
mod imp {
    #[inline(always)]
    pub fn malloclike(_: *mut u8, _: usize, _: bool) {}
    #[inline(always)]
    pub fn freelike(_: *mut u8) {}
    #[inline(always)]
    pub fn noaccess(_: *mut u8, _: usize) {}
    #[inline(always)]
    pub fn defined(_: *mut u8, _: usize) {}
    #[inline(always)]
    pub fn active() -> bool {
        false
    }
}

/// Whether client requests are compiled in (the `valgrind` feature, on x86-64 Linux) and the process
/// runs under valgrind. The other functions must be called only when this is true.
pub use imp::active;
/// `[p, p+len)` is the allocator's, readable and writable, holding defined bytes.
pub use imp::defined;
/// The block at `p` was given back.
pub use imp::freelike;
/// A block of `size` bytes at `p` was handed out (`zeroed`: it reads zero).
pub use imp::malloclike;
/// `[p, p+len)` may not be touched by the program.
pub use imp::noaccess;
