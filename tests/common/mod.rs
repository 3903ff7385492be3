//! Helpers shared by the integration tests (each test file is its own process).
#![allow(dead_code)]

pub mod preload;

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
