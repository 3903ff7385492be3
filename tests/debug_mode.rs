//! Debug mode (`EDGEPOOL_DEBUG=1`): each corruption runs in a child process (this same binary, with
//! edgepool as its global allocator), which must abort with the expected message and the dump of the
//! last allocator events; the same child without debug mode must claim no detection it did not make
//! (it either survives, or aborts with normal mode's own message, and never prints the dump). A
//! busy multi-threaded child, with `edgepool::check()` walking the heap meanwhile, must see no false
//! alarm. (Debug mode needs the `debug` feature; `cargo test --all-features` has it.)
#![cfg(feature = "debug")]

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const DUMP: &str = "allocator events, oldest first (EDGEPOOL_DEBUG)";

fn run_child(case: &str, debug: Option<&str>) -> Output {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .env("EDGEPOOL_TEST_DEBUG_CASE", case)
        .env_remove("EDGEPOOL_DEBUG");
    if let Some(v) = debug {
        c.env("EDGEPOOL_DEBUG", v);
    }
    c.output().unwrap()
}

/// How a child ends without debug mode.
enum Normal {
    Survives,
    /// Aborts with normal mode's own message.
    Aborts(&'static str),
    /// Dies of this signal.
    Dies(i32),
}

/// Under debug mode the child dies of `signal` with `message` and the dump; without it, it prints no
/// dump and no debug-mode message, and ends as `normal` says.
fn expect(case: &str, signal: i32, message: &str, normal: Normal) -> String {
    let out = run_child(case, Some("1"));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.signal(), Some(signal), "case {case}: {:?}\n{stderr}", out.status);
    assert!(stderr.contains(message), "case {case}: message missing:\n{stderr}");
    assert!(stderr.contains(DUMP), "case {case}: no event dump:\n{stderr}");
    let plain = run_child(case, None);
    let perr = String::from_utf8_lossy(&plain.stderr);
    let pout = String::from_utf8_lossy(&plain.stdout);
    assert!(!perr.contains(DUMP) && !perr.contains(message), "case {case} without debug mode:\n{perr}");
    match normal {
        Normal::Survives => assert!(
            plain.status.success() && pout.contains("survived"),
            "case {case} without debug mode: {:?}\n{pout}{perr}",
            plain.status
        ),
        Normal::Aborts(m) => {
            assert_eq!(plain.status.signal(), Some(libc::SIGABRT), "case {case} without debug mode: {perr}");
            assert!(perr.contains(m), "case {case} without debug mode:\n{perr}");
        }
        Normal::Dies(sig) => assert_eq!(plain.status.signal(), Some(sig), "case {case} without debug mode: {perr}"),
    }
    stderr
}

#[test]
fn one_byte_past_the_end_is_caught_at_free() {
    let err =
        expect("overflow_free", libc::SIGABRT, "heap buffer overflow: the canary after the block", Normal::Survives);
    assert!(err.contains("(40 bytes requested) is overwritten at byte 40 (0x78") && err.contains("detected at free()"));
}

#[test]
fn an_overflow_is_caught_by_check_and_by_realloc() {
    let err = expect("overflow_check", libc::SIGABRT, "is overwritten at byte 41", Normal::Survives);
    assert!(err.contains("detected by edgepool_check()"), "{err}");
    let err = expect("overflow_realloc", libc::SIGABRT, "is overwritten at byte 100", Normal::Survives);
    assert!(err.contains("detected at realloc()"), "{err}");
    // The large block's slack is canary too.
    let err = expect(
        "overflow_large",
        libc::SIGABRT,
        "(100000 bytes requested) is overwritten at byte 100000",
        Normal::Survives,
    );
    assert!(err.contains("detected at free()"), "{err}");
}

#[test]
fn double_frees_are_caught_on_every_path() {
    // By the owner, by another thread, of a large block, and of a block realloc moved away. Normal
    // mode catches these too (the freed mark, the run cache), with its own words.
    for case in ["double_owner", "double_remote", "double_large", "double_realloc"] {
        expect(case, libc::SIGABRT, "free(): double free: the block was freed already", Normal::Aborts("double free"));
    }
}

#[test]
fn frees_of_pointers_that_start_no_block_are_caught() {
    expect(
        "stack",
        libc::SIGABRT,
        "free(): invalid pointer: not memory of this allocator",
        Normal::Aborts("free(): invalid pointer or double free"),
    );
    expect(
        "interior",
        libc::SIGABRT,
        "free(): invalid pointer: not the start of a live block",
        Normal::Aborts("free(): pointer is not the start of a block"),
    );
}

#[test]
fn a_write_after_free_is_caught_by_check_and_when_the_block_leaves_the_quarantine() {
    let err = expect("uaf_check", libc::SIGABRT, "write after free: the freed block", Normal::Survives);
    assert!(err.contains("was written at byte 20 (0x1 ") && err.contains("by edgepool_check()"), "{err}");
    let err = expect("uaf_evict", libc::SIGABRT, "write after free: the freed block", Normal::Survives);
    assert!(err.contains("when it left the quarantine"), "{err}");
}

#[test]
fn an_abort_dumps_the_events_and_keeps_its_signal() {
    // (SIGSEGV is tested with a C program under LD_PRELOAD, in `preload`: in a Rust program, the
    // standard library's stack-overflow handler, installed after edgepool's, takes SIGSEGV.)
    let err = expect("abort", libc::SIGABRT, "edgepool: SIGABRT", Normal::Dies(libc::SIGABRT));
    // The block the child allocated last is in the dump.
    assert!(err.lines().any(|l| l.contains(" alloc ") && l.contains(" 4242 bytes")), "{err}");
}

#[test]
fn debug_mode_survives_threads_reallocs_and_concurrent_checks() {
    let out = run_child("busy", Some("1"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let checks: Vec<usize> =
        stdout.lines().filter_map(|l| l.strip_prefix("checked ")).map(|v| v.trim().parse().unwrap()).collect();
    assert!(checks.len() >= 3 && checks.iter().all(|&n| n > 0), "{stdout}");
    // Without debug mode check() says so.
    let plain = run_child("busy", None);
    assert!(plain.status.success() && String::from_utf8_lossy(&plain.stdout).contains("check: off"));
}

#[test]
fn with_backtrace_the_events_name_their_callers() {
    let out = run_child("double_owner", Some("backtrace"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{err}");
    // Frames follow the events, and this test binary's functions are among them.
    assert!(err.lines().any(|l| l.trim_start().starts_with("at 0x")), "{err}");
    assert!(err.contains("debug_mode"), "no frame of the test binary named:\n{err}");
}

fn opaque<T>(v: T) -> T {
    std::hint::black_box(v)
}

#[test]
#[ignore = "run by the tests above in a child process"]
fn child() {
    use std::alloc::{alloc, dealloc, realloc, Layout};
    let case = std::env::var("EDGEPOOL_TEST_DEBUG_CASE").unwrap();
    let l40 = Layout::from_size_align(40, 8).unwrap();
    // SAFETY: deliberately wrong uses of the allocator, each the bug a test names; debug mode must
    // abort before any harm, and normal mode either aborts or survives the (benign) bug.
    unsafe {
        match case.as_str() {
            "overflow_free" => {
                let p = alloc(l40);
                opaque(p).add(40).write_volatile(b'x');
                dealloc(p, l40);
            }
            "overflow_check" => {
                let p = alloc(l40);
                opaque(p).add(41).write_volatile(b'x');
                if edgepool::check().is_none() {
                    println!("check: off");
                }
                dealloc(p, l40);
            }
            "overflow_realloc" => {
                let l = Layout::from_size_align(100, 8).unwrap();
                let p = alloc(l);
                opaque(p).add(100).write_volatile(b'x');
                let q = realloc(opaque(p), l, opaque(300));
                opaque(q).write_volatile(1);
                dealloc(q, Layout::from_size_align(300, 8).unwrap());
            }
            "overflow_large" => {
                let l = Layout::from_size_align(100_000, 8).unwrap();
                let p = alloc(l);
                opaque(p).add(100_000).write_volatile(b'x');
                dealloc(p, l);
            }
            "double_owner" => {
                let p = alloc(l40);
                dealloc(p, l40);
                dealloc(opaque(p), l40);
            }
            "double_remote" => {
                let p = alloc(l40) as usize;
                std::thread::spawn(move || dealloc(p as *mut u8, l40)).join().unwrap();
                dealloc(opaque(p as *mut u8), l40);
            }
            "double_large" => {
                let l = Layout::from_size_align(1 << 20, 8).unwrap();
                let p = alloc(l);
                p.write_bytes(1, 1 << 20);
                dealloc(p, l);
                dealloc(opaque(p), l);
            }
            "double_realloc" => {
                let l = Layout::from_size_align(100, 8).unwrap();
                let p = alloc(l);
                let q = realloc(opaque(p), l, opaque(50_000));
                opaque(q);
                if q != p {
                    dealloc(opaque(p), l);
                } else {
                    println!("realloc did not move; survived");
                    return;
                }
            }
            "stack" => {
                let mut buf = [0u8; 64];
                dealloc(opaque(buf.as_mut_ptr().add(16)), l40);
            }
            "interior" => {
                let p = alloc(l40);
                dealloc(opaque(p).add(16), l40);
            }
            "uaf_check" => {
                let p = alloc(l40);
                dealloc(p, l40);
                opaque(p).add(20).write_volatile(1);
                if edgepool::check().is_none() {
                    println!("check: off");
                }
            }
            "uaf_evict" => {
                let p = alloc(l40);
                dealloc(p, l40);
                opaque(p).add(20).write_volatile(1);
                let l = Layout::from_size_align(64, 8).unwrap();
                for _ in 0..10_000 {
                    dealloc(opaque(alloc(l)), l);
                }
            }
            "abort" => {
                let l = Layout::from_size_align(4242, 8).unwrap();
                opaque(alloc(l));
                std::process::abort();
            }
            "busy" => busy(),
            _ => panic!("unknown case {case}"),
        }
    }
    println!("survived");
}

/// Four threads allocate, grow and free blocks of every size class and some large ones, checking
/// their contents, while the main thread calls `edgepool::check()`.
fn busy() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                let mut next = move || {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed
                };
                let mut live: Vec<Vec<u8>> = Vec::new();
                for i in 0..40_000u64 {
                    let r = next();
                    let size = match r % 100 {
                        0 => 100_000 + (r >> 8) as usize % 300_000,
                        1..=9 => 4096 + (r >> 8) as usize % 30_000,
                        _ => (r >> 8) as usize % 2000,
                    };
                    if live.len() < 500 || r % 3 != 0 {
                        live.push(vec![(i % 251) as u8; size]);
                    } else {
                        let j = (r >> 20) as usize % live.len();
                        let mut v = live.swap_remove(j);
                        let b = v.first().copied();
                        assert!(v.iter().all(|&x| Some(x) == b), "a block changed");
                        if r % 7 == 0 {
                            let fill = b.unwrap_or(0);
                            v.resize(v.len() * 2 + 1, fill);
                            live.push(v);
                        }
                    }
                    if live.len() > 2000 {
                        live.truncate(1000);
                    }
                }
            })
        })
        .collect();
    let checker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut lines = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                match edgepool::check() {
                    Some(n) => lines.push(format!("checked {n}")),
                    None => {
                        lines.push("check: off".to_string());
                        break;
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            lines
        })
    };
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    for l in checker.join().unwrap() {
        println!("{l}");
    }
    if let Some(n) = edgepool::check() {
        println!("checked {n}");
    }
}
