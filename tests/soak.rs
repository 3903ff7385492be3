//! Soak: the stress test scaled up and kept going. Worker threads allocate, check and free blocks of
//! every size, hand blocks to each other through a shared pool, and die after a short life, to be
//! replaced by new threads (their caches are abandoned and adopted); a controller opens and closes
//! process-wide load phases; the main thread forks now and then (the child allocates, checks the
//! blocks it inherited, and exits). Every block carries a pattern checked before it is freed. The
//! live bytes are capped, and the resident set must stay bounded: it is sampled all along and must
//! never pass a ceiling, and after everything is freed and trimmed it must come back down.
//!
//! Each run is a child process with its own options (defaults; purge at once with nothing retained;
//! a 1 MiB largest block, so that many blocks are direct mappings; the hardened mode, purging at
//! once). `EDGEPOOL_TEST_SOAK_SECONDS`
//! sets the seconds per run (default 4; 2 in debug builds); `scripts/soak.sh SECONDS` runs longer.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{fill, verify, Rng};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const MIB: usize = 1 << 20;
/// Live bytes across all threads above which workers free instead of allocating.
const LIVE_CAP: usize = 96 * MIB;
/// The resident set may never pass this while the soak runs (the live cap, plus room for slabs,
/// caches and memory waiting for reuse; measured peaks are 11–37 MiB).
const RSS_CEILING: usize = 256 * MIB;

#[derive(Clone, Copy)]
struct Block {
    ptr: usize,
    size: usize,
}

// SAFETY: a Block is an owned allocation handed from thread to thread.
unsafe impl Send for Block {}

fn alloc(rng: &mut Rng) -> Block {
    let size = match rng.below(100) {
        0..=69 => 1 + rng.below(4096) as usize,
        70..=94 => 4097 + rng.below(256 << 10) as usize,
        _ => (256 << 10) + rng.below(4 << 20) as usize,
    };
    let p = edgepool::raw::alloc(size, 16);
    assert!(!p.is_null(), "allocation of {size} bytes failed");
    // SAFETY: a fresh block of `size` bytes.
    unsafe { fill(p, size.min(128), p as usize) };
    Block { ptr: p as usize, size }
}

fn check_and_free(b: Block) {
    // SAFETY: a live block of ours, checked and freed once.
    unsafe {
        assert_eq!(verify(b.ptr as *const u8, b.size.min(128), b.ptr), None, "block {:#x} damaged", b.ptr);
        edgepool::raw::free(b.ptr as *mut u8);
    }
}

fn seconds() -> f64 {
    let default = if cfg!(debug_assertions) { 2.0 } else { 4.0 };
    std::env::var("EDGEPOOL_TEST_SOAK_SECONDS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run_child(env: &[(&str, &str)]) -> String {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["child_soak", "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "soak with {env:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let at = stdout.find("soak:").unwrap_or_else(|| panic!("no summary: {stdout}"));
    let summary = stdout[at..].lines().next().unwrap();
    println!("{summary} (options {env:?})");
    stdout
}

#[test]
fn soak_with_default_options() {
    run_child(&[]);
}

#[test]
fn soak_purging_at_once_with_nothing_retained() {
    run_child(&[("EDGEPOOL_PURGE_DELAY", "0"), ("EDGEPOOL_RETAIN", "0")]);
}

#[test]
fn soak_with_a_small_largest_block() {
    run_child(&[("EDGEPOOL_MAX_BLOCK", "1M")]);
}

#[test]
fn soak_hardened_purging_at_once() {
    // EDGEPOOL_SECURE: guard pages after slabs, purged memory sealed until reused; purging at once
    // seals as much as possible, so every reuse path must unseal first.
    run_child(&[("EDGEPOOL_SECURE", "1"), ("EDGEPOOL_PURGE_DELAY", "0"), ("EDGEPOOL_RETAIN", "0")]);
}

#[test]
#[ignore = "run by the soak tests in a child process"]
fn child_soak() {
    let end = Instant::now() + Duration::from_secs_f64(seconds());
    let pool: Arc<Mutex<Vec<Block>>> = Arc::new(Mutex::new(Vec::new()));
    let live = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));
    let threads_made = Arc::new(AtomicUsize::new(0));
    let rss_max = Arc::new(AtomicUsize::new(0));

    // Workers: 3 slots, each a succession of short-lived threads.
    let slots: Vec<_> = (0..3u64)
        .map(|slot| {
            let (pool, live, stop, ops, made) =
                (pool.clone(), live.clone(), stop.clone(), ops.clone(), threads_made.clone());
            std::thread::spawn(move || {
                let mut generation = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    generation += 1;
                    let (pool, live, stop, ops) = (pool.clone(), live.clone(), stop.clone(), ops.clone());
                    made.fetch_add(1, Ordering::Relaxed);
                    std::thread::spawn(move || {
                        let mut rng = Rng::new(slot * 1_000_003 + generation);
                        let mut mine: Vec<Block> = Vec::new();
                        for i in 0..3000 {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            if live.load(Ordering::Relaxed) < LIVE_CAP && rng.below(2) == 0 {
                                let b = alloc(&mut rng);
                                live.fetch_add(b.size, Ordering::Relaxed);
                                mine.push(b);
                            } else if !mine.is_empty() {
                                let b = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                                live.fetch_sub(b.size, Ordering::Relaxed);
                                check_and_free(b);
                            }
                            if i % 50 == 0 {
                                // Trade: give some blocks to the pool, take some others'.
                                let mut p = pool.lock().unwrap();
                                let give = mine.len() / 4;
                                p.extend(mine.drain(..give));
                                let take = (p.len() / 3).min(64);
                                for _ in 0..take {
                                    let b = p.swap_remove(0);
                                    mine.push(b);
                                }
                            }
                            ops.fetch_add(1, Ordering::Relaxed);
                        }
                        // The thread dies holding some blocks: they go to the pool for others.
                        let keep = mine.len() / 2;
                        pool.lock().unwrap().extend(mine.drain(..keep));
                        for b in mine {
                            live.fetch_sub(b.size, Ordering::Relaxed);
                            check_and_free(b);
                        }
                    })
                    .join()
                    .unwrap();
                }
            })
        })
        .collect();

    // The controller: process-wide load phases open and close.
    let phases = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                let g = edgepool::load_phase_process();
                std::thread::sleep(Duration::from_millis(30));
                drop(g);
                std::thread::sleep(Duration::from_millis(30));
                n += 1;
            }
            n
        })
    };

    // The main thread: samples the resident set and forks now and then.
    let mut forks = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
        let rss = edgepool::os::rss_bytes();
        rss_max.fetch_max(rss, Ordering::Relaxed);
        assert!(rss < RSS_CEILING, "resident set {} MiB passed the ceiling", rss / MIB);
        if forks < 20 && rss % 3 == 0 {
            // The pool stays locked across the fork, so the sampled blocks are live in it then.
            let guard = pool.lock().unwrap();
            let sample: Vec<Block> = guard.iter().take(16).copied().collect();
            // SAFETY: the child only allocates, checks inherited blocks and calls _exit.
            let pid = unsafe { libc::fork() };
            assert!(pid >= 0);
            if pid == 0 {
                let inherited = sample.iter().all(|b| {
                    // SAFETY: blocks live in the parent at the fork, hence in the child's copy.
                    unsafe { verify(b.ptr as *const u8, b.size.min(128), b.ptr) }.is_none()
                });
                let p = edgepool::raw::alloc(1000, 16);
                let q = edgepool::raw::alloc(3 * MIB, 16);
                let allocated = !p.is_null() && !q.is_null();
                // SAFETY: live blocks (or null).
                unsafe {
                    edgepool::raw::free(q);
                    edgepool::raw::free(p);
                    libc::_exit(if !inherited {
                        1
                    } else if !allocated {
                        2
                    } else {
                        0
                    });
                }
            }
            drop(guard);
            let mut st = 0;
            // SAFETY: pid is our child.
            unsafe { libc::waitpid(pid, &mut st, 0) };
            assert!(
                libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0,
                "fork child failed: status {st} (exit 1: an inherited block damaged; 2: allocation failed)"
            );
            forks += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for s in slots {
        s.join().unwrap();
    }
    let phase_count = phases.join().unwrap();
    for b in pool.lock().unwrap().drain(..) {
        check_and_free(b);
    }
    edgepool::check_heap().unwrap();
    let peak = rss_max.load(Ordering::Relaxed);
    edgepool::trim();
    let after = edgepool::os::rss_bytes();
    assert!(
        after < peak.max(64 * MIB),
        "the resident set did not come down: {} MiB after, {} MiB peak",
        after / MIB,
        peak / MIB
    );
    assert!(after < 64 * MIB, "{} MiB resident after everything was freed and trimmed", after / MIB);
    println!(
        "soak: {} operations, {} threads, {} phases, {forks} forks; peak RSS {} MiB, after trim {} MiB",
        ops.load(Ordering::Relaxed),
        threads_made.load(Ordering::Relaxed),
        phase_count,
        peak / MIB,
        after / MIB
    );
}
