//! Prefaulting: `prefault` leaves a range resident with its contents unchanged; `prefault_free`
//! makes the next allocations of that much memory land on resident pages (page faults counted with
//! `getrusage(RUSAGE_THREAD)`, so other threads do not count).
//!
//! One test per concern, serialised: `prefault_free` changes the process's heap.

use std::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::new(());
const PAGE: usize = 4096;

fn minor_faults() -> i64 {
    // SAFETY: getrusage writes the struct.
    unsafe {
        let mut u: libc::rusage = core::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut u), 0);
        u.ru_minflt
    }
}

fn resident_pages(p: *const u8, len: usize) -> Vec<bool> {
    let mut v = vec![0u8; len.div_ceil(PAGE)];
    // SAFETY: `p` is page aligned, the range mapped, `v` has a byte per page.
    assert_eq!(unsafe { libc::mincore(p as *mut _, len, v.as_mut_ptr()) }, 0);
    v.iter().map(|b| b & 1 != 0).collect()
}

#[test]
fn prefault_makes_the_range_resident_and_changes_nothing() {
    let _g = SERIAL.lock().unwrap();
    let len = 64 * PAGE;
    // SAFETY: a fresh private anonymous mapping, ours alone.
    let base = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as *mut u8;
    assert_ne!(base as *mut libc::c_void, libc::MAP_FAILED);
    // SAFETY: the mapping is ours; the slices below stay inside it.
    let all = unsafe { core::slice::from_raw_parts_mut(base, len) };
    // A few pages written with a pattern; the rest never touched (not even read: a read would map
    // the zero page, which mincore counts as resident).
    let mut expected = vec![0u8; len];
    for page in [3usize, 10, 40] {
        for i in 0..PAGE {
            let v = (i * 13 + page) as u8;
            all[page * PAGE + i] = v;
            expected[page * PAGE + i] = v;
        }
    }
    let before = resident_pages(base, len).iter().filter(|&&r| r).count();
    assert!(before <= 3, "{before} pages resident before prefaulting");
    // An unaligned range: from the middle of page 2 to the middle of page 50.
    let (from, to) = (2 * PAGE + 100, 50 * PAGE + 7);
    edgepool::prefault(&mut all[from..to]);
    let res = resident_pages(base, len);
    for (i, &r) in res.iter().enumerate().take(51).skip(2) {
        assert!(r, "page {i} of the range is not resident");
    }
    // The C entry point: the same on the rest, EINVAL on null.
    // SAFETY: inside the mapping, which only this thread touches.
    assert_eq!(unsafe { edgepool::c_api::prefault(base.add(51 * PAGE).cast(), 13 * PAGE) }, 0);
    assert!(resident_pages(base, len)[51..].iter().all(|&r| r));
    // SAFETY: a null pointer is refused before anything is touched; zero bytes is nothing to do.
    unsafe {
        assert_eq!(edgepool::c_api::prefault(core::ptr::null_mut(), 10), -1);
        assert_eq!(*libc::__errno_location(), libc::EINVAL);
        assert_eq!(edgepool::c_api::prefault(core::ptr::null_mut(), 0), 0);
    }
    assert!(all[..] == expected[..], "prefault changed the contents");
    // SAFETY: our mapping, no longer used.
    unsafe { libc::munmap(base.cast(), len) };
}

/// Allocates `n` blocks of `size` bytes from edgepool, writes one byte per page, and returns them
/// with the minor faults the writing took.
fn take_and_touch(n: usize, size: usize) -> (Vec<*mut u8>, i64) {
    let blocks: Vec<*mut u8> = (0..n).map(|_| edgepool::raw::alloc(size, 16)).collect();
    assert!(blocks.iter().all(|p| !p.is_null()));
    let f0 = minor_faults();
    for &p in &blocks {
        for off in (0..size).step_by(PAGE) {
            // SAFETY: inside a live block of `size` bytes.
            unsafe { p.add(off).write_volatile(1) };
        }
    }
    (blocks, minor_faults() - f0)
}

fn give_back(blocks: Vec<*mut u8>) {
    for p in blocks {
        // SAFETY: live blocks from take_and_touch, freed once.
        unsafe { edgepool::raw::free(p) };
    }
}

#[test]
fn prefault_free_makes_the_next_allocations_fault_free() {
    let _g = SERIAL.lock().unwrap();
    const N: usize = 24;
    const SIZE: usize = 1 << 20;
    let pages = (N * SIZE / PAGE) as i64;
    // Without: every page written faults once.
    edgepool::trim();
    let (blocks, cold) = take_and_touch(N, SIZE);
    give_back(blocks);
    edgepool::trim();
    assert!(cold >= pages * 9 / 10, "{cold} faults for {pages} fresh pages: the count does not work");

    let warmed = edgepool::prefault_free(N * SIZE);
    assert!(warmed >= N * SIZE, "prefault_free made {warmed} bytes resident, asked {}", N * SIZE);
    assert!(edgepool::stats().dirty_free_bytes >= N * SIZE, "{:?}", edgepool::stats());
    let (blocks, warm) = take_and_touch(N, SIZE);
    give_back(blocks);
    assert!(warm * 20 < pages, "{warm} faults for {pages} prefaulted pages ({cold} without)");
    // Still kept resident after they were freed: the next round faults as little.
    let (blocks, again) = take_and_touch(N, SIZE);
    give_back(blocks);
    assert!(again * 20 < pages, "{again} faults in the second round");
    eprintln!("minor faults writing {pages} pages: {cold} fresh, {warm} after prefault_free, {again} the round after");

    // prefault_free(0) stops keeping them: trim gives everything back and nothing is warmed again.
    assert_eq!(edgepool::prefault_free(0), 0);
    edgepool::trim();
    assert_eq!(edgepool::stats().dirty_free_bytes, 0);
}
