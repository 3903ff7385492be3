//! `fork` racing `realloc` of direct mappings (issue 9, defect 1). Two threads grow and shrink
//! 66–133 MiB blocks (beyond the largest buddy block, so they are direct mappings resized by `mremap`)
//! while the main thread forks in a loop; each child allocates, frees and exits. Before the lock order
//! was made one, `direct_realloc` held the direct-table lock while taking the heap lock and the prefork
//! handler took them the other way round: the process hung within a few hundred forks. The work runs in
//! a child process with a deadline, so a hang fails the test instead of stalling the suite.

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;
const FORKS: usize = 600;

#[test]
fn fork_while_other_threads_realloc_direct_mappings_completes() {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_fork_realloc", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // glibc finishes this in a few seconds here; a debug build takes longer. A deadlock never does.
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let Some(status) = status else {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!(
            "fork racing realloc of direct mappings did not finish in 120 s (deadlock):\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(status.success(), "child failed: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("forks={FORKS}")), "{stdout}");
}

#[test]
#[ignore = "child of fork_while_other_threads_realloc_direct_mappings_completes"]
fn child_fork_realloc() {
    assert!(edgepool::max_block() < 66 * MIB, "the blocks must be direct mappings");
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut p = edgepool::raw::alloc(66 * MIB, 16);
                assert!(!p.is_null());
                let mut n = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // 66 → 90 → 133 → 66 MiB: every step moves the mapping (a shrink to half or
                    // less, or a growth), so every call reaches the direct table and the budget.
                    let size = [66, 90, 133][(n + t) % 3] * MIB + t * PAGE;
                    // SAFETY: p is live; on failure it stays live.
                    let q = unsafe { edgepool::raw::realloc(p, size, 16) };
                    assert!(!q.is_null());
                    // SAFETY: q holds at least `size` bytes.
                    unsafe { q.add(size - 1).write(n as u8) };
                    p = q;
                    n += 1;
                }
                // SAFETY: p is live.
                unsafe { edgepool::raw::free(p) };
                n
            })
        })
        .collect();
    let mut forks = 0;
    for _ in 0..FORKS {
        // SAFETY: the child only calls the allocator (async-signal-safe here: its locks were reset by
        // the fork handlers) and _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let p = edgepool::raw::alloc(100, 16);
            let q = edgepool::raw::alloc(100 * MIB, 16);
            // SAFETY: live blocks (or null, which free ignores).
            unsafe {
                edgepool::raw::free(q);
                edgepool::raw::free(p);
                libc::_exit(if p.is_null() || q.is_null() { 1 } else { 0 });
            }
        }
        let mut st = 0;
        // SAFETY: pid is our child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        assert!(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0, "fork child failed: {st}");
        forks += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let reallocs: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    println!("forks={forks} reallocs={reallocs}");
}
