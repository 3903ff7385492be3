//! Bad frees are caught with a clear message and `abort()`: an interior pointer, a double free that
//! reaches the bitmap, a large block freed twice, a pointer that edgepool never handed out. Each case
//! runs in a child process (this same binary), whose death by SIGABRT and message are checked.

use std::os::unix::process::ExitStatusExt;
use std::process::Command;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

fn expect_abort(case: &str, message: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("EDGEPOOL_BAD_FREE_CASE", case)
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
    let case = std::env::var("EDGEPOOL_BAD_FREE_CASE").unwrap();
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
