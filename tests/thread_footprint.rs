//! What a thread's first allocation costs its stack. The first allocation makes the thread's cache
//! (16 KiB); built whole as a temporary and copied, it used to take an 11.6 KiB stack frame, three
//! more pages resident in every thread's stack (388 KiB for 32 threads). Its own process, so that the
//! heap is set up before the thread under test runs.

use std::ffi::c_void;

const PAGE: usize = 4096;
/// The part of the stack measured: this many bytes below the frame that calls the allocator.
const WINDOW: usize = 64 << 10;
const STACK: usize = 1 << 20;

/// Resident pages among the `WINDOW / PAGE` pages below `top` (inside the thread's own stack
/// mapping: STACK bytes, far more than WINDOW below any frame of this thread).
fn resident(top: usize) -> usize {
    let mut v = [0u8; WINDOW / PAGE];
    assert!(edgepool::os::resident_pages((top - WINDOW) as *mut u8, WINDOW, &mut v), "mincore failed");
    v.iter().filter(|&&b| b & 1 != 0).count()
}

/// The thread under test: the pages below its frame that its first allocation made resident.
extern "C" fn first_allocation(_: *mut c_void) -> *mut c_void {
    let here = 0u8;
    let top = (&raw const here as usize) & !(PAGE - 1);
    let before = resident(top);
    let p = edgepool::raw::alloc(24, 16);
    let after = resident(top);
    assert!(!p.is_null());
    // SAFETY: a live block of this thread, freed once.
    unsafe { edgepool::raw::free(p) };
    (after - before) as *mut c_void
}

#[test]
fn a_threads_first_allocation_touches_at_most_one_more_page_of_its_stack() {
    // The heap is set up (options, region) by the first allocation in the process, not by the
    // thread under test.
    let warm = edgepool::raw::alloc(24, 16);
    assert!(!warm.is_null());
    // SAFETY: a fresh private mapping used only as the new thread's stack, unmapped after it is
    // joined; the thread runs `first_allocation`, which touches nothing of ours.
    unsafe {
        edgepool::raw::free(warm);
        // A fresh stack (glibc reuses the stacks of exited threads, whose pages are resident).
        let stack = libc::mmap(
            core::ptr::null_mut(),
            STACK,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        );
        assert_ne!(stack, libc::MAP_FAILED);
        let mut attr: libc::pthread_attr_t = core::mem::zeroed();
        assert_eq!(libc::pthread_attr_init(&mut attr), 0);
        assert_eq!(libc::pthread_attr_setstack(&mut attr, stack, STACK), 0);
        let mut t: libc::pthread_t = 0;
        assert_eq!(libc::pthread_create(&mut t, &attr, first_allocation, core::ptr::null_mut()), 0);
        let mut ret: *mut c_void = core::ptr::null_mut();
        assert_eq!(libc::pthread_join(t, &mut ret), 0);
        libc::pthread_attr_destroy(&mut attr);
        libc::munmap(stack, STACK);
        let pages = ret as usize;
        assert!(pages <= 1, "the first allocation made {pages} more pages of the thread's stack resident");
    }
}
