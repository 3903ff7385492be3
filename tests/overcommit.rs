//! Requests larger than the machine fail as they do on glibc: direct mappings are made under the
//! kernel's overcommit policy (no `MAP_NORESERVE` for memory the program owns), so under the default
//! heuristic (`vm.overcommit_memory = 0`) or strict accounting (2) a request beyond RAM + swap returns
//! NULL with `ENOMEM`, and the allocator keeps working. Under `overcommit_memory = 1` the kernel
//! grants anything, on glibc too: the test then says so and checks nothing.

use core::ffi::c_void;

use edgepool::c_api;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

/// RAM + swap in bytes, from /proc/meminfo.
fn machine_bytes() -> usize {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib = |key: &str| -> usize {
        let line = info.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<usize>().unwrap()
    };
    (kib("MemTotal:") + kib("SwapTotal:")) * 1024
}

#[test]
fn requests_larger_than_the_machine_fail_with_enomem() {
    let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
    if mode.trim() == "1" {
        eprintln!("vm.overcommit_memory = 1: the kernel grants any mapping (glibc's too); nothing to check");
        return;
    }
    let too_big = (4 * machine_bytes()).next_power_of_two();
    let errno = || edgepool::os::errno();
    edgepool::os::set_errno(0);
    assert!(c_api::malloc(too_big).is_null(), "malloc({too_big}) succeeded");
    assert_eq!(errno(), libc::ENOMEM);
    assert!(c_api::malloc(64 << 40).is_null(), "malloc(64 TiB) succeeded");
    assert!(c_api::calloc(1 << 20, 64 << 20).is_null(), "calloc of 64 TiB succeeded");
    edgepool::os::set_errno(0);
    assert!(c_api::memalign(1 << 40, 1).is_null(), "memalign(1 TiB alignment) succeeded");
    assert_eq!(errno(), libc::ENOMEM);
    let mut out = 7usize as *mut c_void;
    // SAFETY: `out` is a valid out-pointer.
    assert_eq!(unsafe { c_api::posix_memalign(&mut out, 1 << 40, 1) }, libc::ENOMEM);
    assert_eq!(out as usize, 7, "posix_memalign must leave *memptr alone on failure");
    // realloc of a direct mapping to 64 TiB: NULL, the block intact.
    let p = c_api::malloc(100 << 20) as *mut u8;
    assert!(!p.is_null());
    // SAFETY: a live 100 MiB block of ours.
    unsafe {
        p.write_bytes(0x5a, 100 << 20);
        edgepool::os::set_errno(0);
        assert!(c_api::realloc(p.cast(), 64 << 40).is_null(), "realloc to 64 TiB succeeded");
        assert_eq!(errno(), libc::ENOMEM);
        assert!(*p == 0x5a && *p.add((100 << 20) - 1) == 0x5a, "the block was damaged");
        c_api::free(p.cast());
    }
    // The allocator keeps working.
    let q = c_api::malloc(200 << 20);
    assert!(!q.is_null());
    // SAFETY: live block.
    unsafe { c_api::free(q) };
    assert!(edgepool::stats().counters.oom_refusals >= 4);
}
