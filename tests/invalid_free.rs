//! Bad frees are caught with a clear message and `abort()`: an interior pointer, a small block freed
//! twice (onto the stack of recent frees, onto the bitmap, once on each, by another thread and by its
//! owner in either order), a large block freed twice (into the run cache or the heap) or passed to
//! `realloc` while the run cache holds it, a pointer that edgepool never handed out. Each case runs in
//! a child process (this same binary), whose death by SIGABRT and message are checked.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

fn expect_abort(case: &str, message: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("EDGEPOOL_TEST_BAD_FREE_CASE", case)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "case {case}: not aborted: {:?}\n{stderr}", out.status);
    assert!(stderr.contains(message), "case {case}: message missing: {stderr}");
}

#[test]
fn interior_pointer_aborts() {
    expect_abort("interior", "free(): pointer is not the start of a block");
}

#[test]
fn double_free_of_small_block_aborts() {
    expect_abort("double_small", "free(): double free detected");
}

#[test]
fn double_free_onto_the_stack_aborts() {
    expect_abort("double_stack", "free(): double free detected");
}

#[test]
fn double_free_first_on_the_stack_then_on_the_bitmap_aborts() {
    expect_abort("stack_then_bitmap", "free(): double free detected");
}

#[test]
fn double_free_first_remote_then_by_the_owner_aborts() {
    expect_abort("remote_then_owner", "free(): double free detected");
}

/// The freed mark is lost when the page is purged (here: the owner sat idle while another thread
/// freed its whole slab, and that thread's scan purged the pages), so the owner's second free goes
/// onto its stack unsuspected; the slot's remote bit still says it was freed, and taking it back
/// while the slot is on the stack aborts.
#[test]
fn double_free_first_remote_then_by_the_owner_after_a_purge_aborts() {
    expect_abort("remote_purged_then_owner", "free(): double free detected");
}

#[test]
fn double_free_first_by_the_owner_then_remote_aborts() {
    expect_abort("owner_then_remote", "free(): double free detected");
}

#[test]
fn double_free_of_a_run_in_the_run_cache_aborts() {
    expect_abort("double_cached", "free(): double free (the block is in a thread's run cache)");
}

#[test]
fn realloc_of_a_run_in_the_run_cache_aborts() {
    expect_abort("realloc_cached", "realloc(): the block was freed (it is in a thread's run cache)");
}

#[test]
fn double_free_of_large_block_aborts() {
    expect_abort("double_large", "free(): invalid pointer or double free");
}

#[test]
fn foreign_pointer_aborts() {
    expect_abort("foreign", "free(): invalid pointer or double free");
}

#[test]
#[ignore = "run by the tests above in a child process"]
fn child() {
    let case = std::env::var("EDGEPOOL_TEST_BAD_FREE_CASE").unwrap();
    // SAFETY: deliberately wrong frees; the allocator must abort before any harm.
    unsafe {
        match case.as_str() {
            "interior" => {
                let p = edgepool::raw::alloc(64, 16);
                edgepool::raw::free(p.add(8));
            }
            "double_small" => {
                // Fill this class's stack of recent frees so that the next frees reach the bitmap.
                let v: Vec<*mut u8> = (0..64).map(|_| edgepool::raw::alloc(200, 16)).collect();
                for &p in &v[..40] {
                    edgepool::raw::free(p);
                }
                edgepool::raw::free(v[50]);
                edgepool::raw::free(v[50]);
            }
            "double_stack" => {
                let p = edgepool::raw::alloc(40, 16);
                edgepool::raw::free(p);
                edgepool::raw::free(p);
                // Before the freed mark, both copies were handed out: two live objects overlapped.
                let (a, b) = (edgepool::raw::alloc(40, 16), edgepool::raw::alloc(40, 16));
                eprintln!("handed out twice: {a:?} {b:?}");
            }
            "stack_then_bitmap" => {
                let v: Vec<*mut u8> = (0..40).map(|_| edgepool::raw::alloc(300, 16)).collect();
                // The first free lands on the stack; 16 more fill it; the second reaches the bitmap.
                edgepool::raw::free(v[0]);
                for &p in &v[1..20] {
                    edgepool::raw::free(p);
                }
                edgepool::raw::free(v[0]);
            }
            "remote_then_owner" => {
                let p = edgepool::raw::alloc(100, 16) as usize;
                std::thread::spawn(move || edgepool::raw::free(p as *mut u8)).join().unwrap();
                edgepool::raw::free(p as *mut u8);
            }
            "remote_purged_then_owner" => {
                // A whole slab of the 1024-byte class (64 slots), all freed by another thread.
                let blocks: Vec<usize> = (0..64).map(|_| edgepool::raw::alloc(1000, 16) as usize).collect();
                let x = blocks[0];
                for &p in &blocks {
                    // Fresh blocks of 1000 bytes.
                    (p as *mut u8).write_bytes(1, 1000);
                }
                std::thread::spawn(move || {
                    for &p in &blocks {
                        edgepool::raw::free(p as *mut u8);
                    }
                    // Allocates (its slow path scans for idle caches) until the slab's first page
                    // leaves the resident set.
                    let start = std::time::Instant::now();
                    loop {
                        let v: Vec<usize> = (0..2000).map(|_| edgepool::raw::alloc(64, 16) as usize).collect();
                        for p in v {
                            edgepool::raw::free(p as *mut u8);
                        }
                        let mut r = 0u8;
                        // One page of the heap's mapping.
                        libc::mincore((x & !4095) as *mut libc::c_void, 4096, &mut r);
                        if r & 1 == 0 {
                            break;
                        }
                        assert!(start.elapsed().as_secs() < 5, "the page was not purged");
                    }
                })
                .join()
                .unwrap();
                // The second free: no mark on the purged page, so onto the stack.
                edgepool::raw::free(x as *mut u8);
                // Slow paths of other classes take the remote frees back.
                for _ in 0..100_000 {
                    edgepool::raw::alloc(48, 16);
                }
            }
            "owner_then_remote" => {
                let p = edgepool::raw::alloc(100, 16) as usize;
                edgepool::raw::free(p as *mut u8);
                std::thread::spawn(move || edgepool::raw::free(p as *mut u8)).join().unwrap();
            }
            "double_cached" => {
                // A medium run (above the largest slab class): the first free keeps it in this
                // thread's run cache.
                let p = edgepool::raw::alloc(32 << 10, 16);
                edgepool::raw::free(p);
                edgepool::raw::free(p);
            }
            "realloc_cached" => {
                // Freed into the run cache, then grown: it must not be resized or moved while the
                // cache holds it.
                let p = edgepool::raw::alloc(32 << 10, 16);
                edgepool::raw::free(p);
                edgepool::raw::realloc(p, 48 << 10, 16);
            }
            "double_large" => {
                let p = edgepool::raw::alloc(1 << 20, 16);
                edgepool::raw::free(p);
                edgepool::raw::free(p);
            }
            "foreign" => {
                let mut x = [0u8; 64];
                edgepool::raw::free(x.as_mut_ptr());
            }
            _ => unreachable!(),
        }
    }
    // Reaching here means the bad free went unnoticed.
    std::process::exit(3);
}
