//! Helpers shared by the integration tests (each test file is its own process).
#![allow(dead_code)]

pub mod preload;

/// Runs test `test` of this test binary (an `#[ignore]`d child) alone in a child process with the
/// extra environment `env`, and returns its output.
pub fn child(test: &str, env: &[(&str, &str)]) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--ignored", "--nocapture", "--test-threads=1"])
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// [`child`], which must succeed (else the test fails with its output).
pub fn run_child(test: &str, env: &[(&str, &str)]) {
    let out = child(test, env);
    assert!(
        out.status.success(),
        "{test} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A reading of `read` once the process is quiet: readings 10 ms apart until two agree on `key`.
/// For tests that count the process's own figures exactly: libtest's main thread still allocates
/// for its bookkeeping just after it started the test's thread (a probe saw a 144-byte slot land
/// 20 ms into the test in 86 of 200 runs; a CI run counted it between two exact readings).
pub fn settled<T, K: PartialEq>(read: impl Fn() -> T, key: impl Fn(&T) -> K) -> T {
    let mut last = read();
    for _ in 0..500 {
        std::thread::sleep(std::time::Duration::from_millis(10));
        let now = read();
        if key(&now) == key(&last) {
            return now;
        }
        last = now;
    }
    panic!("the process never stopped allocating");
}

/// xorshift64*: a small deterministic generator (no dependency, no allocation).
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

mod pattern;
#[allow(unused_imports)]
pub use pattern::*;

/// A scale factor for the heavier tests: `EDGEPOOL_TEST_SCALE` (default 1).
pub fn scale() -> usize {
    std::env::var("EDGEPOOL_TEST_SCALE").ok().and_then(|v| v.parse().ok()).unwrap_or(1).max(1)
}

/// A new block of `len` bytes placed right after the live block `[p, p + len)`, so that the block
/// cannot grow in place. Blocks of one size are taken lowest address first, so one of the first few
/// lands there; the others are freed again.
pub fn block_right_after(p: *const u8, len: usize) -> Vec<u8> {
    let mut tries: Vec<Vec<u8>> = Vec::new();
    loop {
        let b = vec![1u8; len];
        if b.as_ptr() as usize == p as usize + len {
            return b;
        }
        assert!(tries.len() < 8, "no {len}-byte block was placed right after the one at {p:?}");
        tries.push(b);
    }
}
