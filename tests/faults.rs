//! Fault injection (feature `fault-injection`): the OS layer is told to refuse memory — reserve,
//! commit, map, growing remap — after N more requests. Every entry point must then answer NULL with
//! `ENOMEM` (or `ENOMEM` from `posix_memalign`), nothing already allocated may be damaged, memory
//! freed meanwhile must be reusable, and allocation must work again once the OS gives memory.
//!
//! `cargo test --release --features fault-injection --test faults` (CI runs it with `--all-features`).

mod common;

use core::ffi::c_void;

use edgepool::c_api;
use edgepool::os::{errno, refuse_after, set_errno};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const MIB: usize = 1 << 20;

/// Fills the first and last 64 bytes and one byte a page of a block with its pattern.
fn fill(p: *mut u8, size: usize) {
    // SAFETY: a live block of `size` bytes.
    unsafe { common::fill_sampled(p, size, p as usize, 4096) }
}

fn intact(p: *mut u8, size: usize) -> bool {
    // SAFETY: a live block of `size` bytes.
    unsafe { common::verify_sampled(p, size, size, p as usize, 4096) }.is_none()
}

/// Asserts that a C allocation call failed with NULL and ENOMEM.
fn refused(what: &str, p: *mut c_void) {
    assert!(p.is_null(), "{what} succeeded while the OS refuses memory");
    assert_eq!(errno(), libc::ENOMEM, "{what}: errno");
    set_errno(0);
}

#[test]
fn refused_memory_is_null_and_enomem_everywhere_and_damages_nothing() {
    // Live blocks of every kind: small, large (buddy), direct.
    let mut live: Vec<(*mut u8, usize)> = (1..300).map(|i| i * 13).map(|n| (c_api::malloc(n).cast(), n)).collect();
    live.push((c_api::malloc(3 * MIB).cast(), 3 * MIB));
    live.push((c_api::malloc(70 * MIB).cast(), 70 * MIB));
    for &(p, n) in &live {
        assert!(!p.is_null());
        fill(p, n);
    }

    // The heap grown to two 24 MiB blocks and given them back: its first top block comes in
    // pieces, and the refused growth below must find blocks to hand out before it.
    for p in [c_api::malloc(24 * MIB), c_api::malloc(24 * MIB)] {
        assert!(!p.is_null());
        // SAFETY: a live block of ours, freed once.
        unsafe { c_api::free(p) };
    }

    refuse_after(Some(0));
    set_errno(0);
    // Beyond the largest block: a direct mapping, refused.
    refused("malloc(70 MiB)", c_api::malloc(70 * MIB));
    refused("calloc(1, 70 MiB)", c_api::calloc(1, 70 * MIB));
    refused("memalign(4096, 70 MiB)", c_api::memalign(4096, 70 * MIB));
    refused("aligned_alloc(64, 70 MiB)", c_api::aligned_alloc(64, 70 * MIB));
    refused("valloc(70 MiB)", c_api::valloc(70 * MIB));
    refused("pvalloc(70 MiB)", c_api::pvalloc(70 * MIB));
    // SAFETY: NULL is a valid realloc argument; `out` is a valid out-pointer.
    unsafe {
        refused("realloc(NULL, 70 MiB)", c_api::realloc(core::ptr::null_mut(), 70 * MIB));
        let mut out = 5usize as *mut c_void;
        assert_eq!(c_api::posix_memalign(&mut out, 4096, 70 * MIB), libc::ENOMEM);
        assert_eq!(out as usize, 5, "posix_memalign changed *memptr on failure");
    }
    // Growing a live block beyond what the heap holds: NULL, the block intact.
    let (large, large_n) = live[live.len() - 2];
    let (direct, direct_n) = live[live.len() - 1];
    // SAFETY: live blocks of ours; on failure they stay live.
    unsafe {
        refused("realloc(large, 70 MiB)", c_api::realloc(large.cast(), 70 * MIB));
        refused("realloc(direct, 90 MiB)", c_api::realloc(direct.cast(), 90 * MIB));
    }
    assert!(intact(large, large_n) && intact(direct, direct_n), "a block was damaged by a refused realloc");
    // Large blocks from the heap until it would have to grow: the growth is refused.
    let mut got = vec![];
    let mut refusals = 0;
    for _ in 0..64 {
        let p = c_api::malloc(24 * MIB);
        if p.is_null() {
            assert_eq!(errno(), libc::ENOMEM);
            refusals += 1;
            break;
        }
        got.push(p);
    }
    assert_eq!(refusals, 1, "the heap never needed to grow in 64 × 24 MiB");
    assert!(!got.is_empty(), "no 24 MiB block from the memory the heap had");
    // Memory freed meanwhile is reused without the OS.
    for p in got.drain(..) {
        // SAFETY: live blocks of ours.
        unsafe { c_api::free(p) };
    }
    let again = c_api::malloc(24 * MIB);
    assert!(!again.is_null(), "freed heap memory was not reusable while the OS refuses");
    let small: Vec<*mut c_void> = (0..1000).map(|i| c_api::malloc(16 + i % 200)).collect();
    assert!(small.iter().all(|p| !p.is_null()), "small blocks from existing slabs failed");
    for p in small.into_iter().chain([again]) {
        // SAFETY: live blocks of ours.
        unsafe { c_api::free(p) };
    }
    for &(p, n) in &live {
        assert!(intact(p, n), "block {p:?} of {n} bytes damaged while the OS refused memory");
    }
    edgepool::check_heap().unwrap();

    // N more grants, then refusals: exactly the first N direct mappings succeed.
    for n in 0..4 {
        refuse_after(Some(n));
        let maps: Vec<*mut c_void> = (0..6).map(|_| c_api::malloc(70 * MIB)).collect();
        let ok = maps.iter().take_while(|p| !p.is_null()).count();
        assert_eq!(ok, n, "with {n} grants left");
        assert!(maps[ok..].iter().all(|p| p.is_null()));
        for p in maps.into_iter().filter(|p| !p.is_null()) {
            fill(p.cast(), 70 * MIB);
            // SAFETY: live blocks of ours.
            unsafe { c_api::free(p) };
        }
    }

    // The OS gives memory again: everything works.
    refuse_after(None);
    let d = c_api::malloc(70 * MIB);
    assert!(!d.is_null());
    // SAFETY: a live block of ours.
    unsafe {
        let d2 = c_api::realloc(d, 90 * MIB);
        assert!(!d2.is_null());
        c_api::free(d2);
    }
    let heap_blocks: Vec<*mut c_void> = (0..8).map(|_| c_api::malloc(24 * MIB)).collect();
    assert!(heap_blocks.iter().all(|p| !p.is_null()), "the heap did not grow again");
    for p in heap_blocks {
        // SAFETY: live blocks of ours.
        unsafe { c_api::free(p) };
    }
    for (p, n) in live {
        assert!(intact(p, n));
        // SAFETY: live blocks of ours, freed once.
        unsafe { c_api::free(p.cast()) };
    }
    edgepool::check_heap().unwrap();
}
