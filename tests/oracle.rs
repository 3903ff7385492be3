//! A shadow-model oracle: random programs of allocate / zeroed / aligned / realloc (grow, shrink, to
//! and from nothing) / free / load-phase begin and end / hand-over to another thread, over every size
//! class, the buddy range and direct mappings. The shadow knows every live block: its range must
//! not overlap any other live block's (no block is ever handed out twice), its alignment must hold,
//! a zeroed block must read zero, and its contents — a pattern from its address and generation,
//! written at its head, its tail and one byte every 16 KiB — must be intact before every realloc and free.
//!
//! A failure names the seed and the operation; `EDGEPOOL_TEST_ORACLE_SEED=N` replays that seed
//! (threads interleave differently, but each thread's program is the same), and
//! `EDGEPOOL_TEST_ORACLE_OPS=N` sets the operations per thread (default 40 000; 10 000 in debug
//! builds). `scripts/oracle.sh` runs many seeds for as long as asked.

mod common;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use common::{fill_sampled, sampled, verify_sampled, Rng};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const THREADS: usize = 4;
/// Live bytes per thread above which the program frees instead of allocating.
const LIVE_CAP: usize = 96 << 20;

#[derive(Clone, Copy, Debug)]
struct Block {
    ptr: usize,
    size: usize,
    align: usize,
    gen: u64,
}

// SAFETY: a Block is an owned allocation handed from thread to thread.
unsafe impl Send for Block {}

/// One byte of pattern every this many bytes, beyond the first and last 64.
const STEP: usize = 16384;

/// The pattern key of a block: its address and generation.
fn key(b: &Block) -> usize {
    b.ptr ^ b.gen.rotate_left(17) as usize
}

fn fill(b: &Block) {
    // SAFETY: a live block of `b.size` bytes.
    unsafe { fill_sampled(b.ptr as *mut u8, b.size, key(b), STEP) }
}

/// The first offset whose byte is not the pattern's.
fn check(b: &Block) -> Option<usize> {
    // SAFETY: a live block of `b.size` bytes.
    unsafe { verify_sampled(b.ptr as *const u8, b.size, b.size, key(b), STEP) }
}

/// Every live block of every thread, by address: a new block must overlap none.
struct Live(Mutex<BTreeMap<usize, usize>>);

impl Live {
    fn insert(&self, b: &Block, what: &str) {
        let mut m = self.0.lock().unwrap();
        if let Some((&s, &len)) = m.range(..b.ptr + b.size.max(1)).next_back() {
            assert!(s + len <= b.ptr, "{what}: [{:#x}, +{}) overlaps the live block [{s:#x}, +{len})", b.ptr, b.size);
        }
        m.insert(b.ptr, b.size.max(1));
    }
    fn remove(&self, b: &Block) {
        assert!(self.0.lock().unwrap().remove(&b.ptr).is_some(), "freeing a block the shadow does not know");
    }
}

fn random_size(rng: &mut Rng) -> usize {
    match rng.below(1000) {
        0..=649 => rng.below(4097) as usize,               // every small class, and 0
        650..=939 => 4097 + rng.below(256 << 10) as usize, // buddy runs
        940..=996 => (256 << 10) + rng.below(15 << 20) as usize,
        _ => (66 << 20) + rng.below(8 << 20) as usize, // direct mappings (beyond 64 MiB)
    }
}

fn random_align(rng: &mut Rng) -> usize {
    match rng.below(10) {
        0..=6 => 16,
        _ => 1 << (3 + rng.below(18)), // 8 .. 1 MiB
    }
}

struct Program {
    t: usize,
    seed: u64,
    op: usize,
    rng: Rng,
    live: Vec<Block>,
    bytes: usize,
    gen: u64,
    shadow: Arc<Live>,
}

impl Program {
    fn fail(&self, what: &str) -> String {
        format!("seed {} thread {} operation {}: {what}", self.seed, self.t, self.op)
    }

    fn adopt(&mut self, b: Block, what: &str) {
        assert!(b.ptr != 0, "{}", self.fail(&format!("{what} returned null for {} bytes", b.size)));
        assert_eq!(b.ptr % b.align.max(1), 0, "{}", self.fail(&format!("{what}: misaligned (align {})", b.align)));
        self.shadow.insert(&b, &self.fail(what));
        fill(&b);
        self.bytes += b.size;
        self.live.push(b);
    }

    fn alloc(&mut self) {
        let (size, align) = (random_size(&mut self.rng), random_align(&mut self.rng));
        self.gen += 1;
        let zeroed = self.rng.below(4) == 0;
        let p = match self.rng.below(8) {
            _ if zeroed => edgepool::raw::alloc_zeroed(size, align),
            // C semantics: realloc(NULL, n) is malloc(n) (16-byte alignment).
            0 if align <= 16 => {
                // SAFETY: NULL is a valid argument.
                unsafe { edgepool::c_api::realloc(core::ptr::null_mut(), size).cast() }
            }
            _ => edgepool::raw::alloc(size, align),
        };
        let b = Block { ptr: p as usize, size, align, gen: self.gen };
        if zeroed && p as usize != 0 {
            // SAFETY: i < size, inside the new block.
            let nz = sampled(size, STEP).find(|&i| unsafe { *p.add(i) } != 0);
            assert_eq!(nz, None, "{}", self.fail(&format!("zeroed block of {size} bytes is not zero")));
        }
        self.adopt(b, "alloc");
    }

    fn take(&mut self, k: usize) -> Block {
        let b = self.live.swap_remove(k);
        self.bytes -= b.size;
        if let Some(i) = check(&b) {
            panic!("{}", self.fail(&format!("block {:#x} of {} bytes damaged at offset {i}", b.ptr, b.size)));
        }
        b
    }

    fn free(&mut self, b: Block) {
        self.shadow.remove(&b);
        // SAFETY: a live block of this allocator, freed once.
        unsafe { edgepool::raw::free(b.ptr as *mut u8) };
    }

    fn realloc(&mut self, k: usize) {
        let b = self.take(k);
        let c_api = b.align <= 16 && self.rng.below(8) == 0;
        let new_size = match self.rng.below(4) {
            0 => b.size / 2,
            1 => b.size + 1 + self.rng.below(64 << 10) as usize,
            2 if c_api => 0,
            _ => random_size(&mut self.rng),
        };
        self.shadow.remove(&b);
        // SAFETY: a live block allocated with alignment `b.align`; on success the old one is gone.
        let q = unsafe {
            if c_api {
                // C semantics: realloc(p, 0) frees p and returns NULL.
                edgepool::c_api::realloc(b.ptr as *mut _, new_size).cast::<u8>()
            } else {
                edgepool::raw::realloc(b.ptr as *mut u8, new_size, b.align)
            }
        };
        if c_api && new_size == 0 {
            assert!(q.is_null(), "{}", self.fail("realloc(p, 0) must free p and return NULL"));
            return;
        }
        assert!(!q.is_null(), "{}", self.fail(&format!("realloc to {new_size} returned null")));
        // The kept prefix carries the old pattern (keyed by the old block) where the old block had it.
        // SAFETY: the new block holds `new_size` bytes.
        let bad = unsafe { verify_sampled(q, b.size, new_size, key(&b), STEP) };
        assert_eq!(bad, None, "{}", self.fail(&format!("realloc {} -> {new_size} lost data", b.size)));
        self.gen += 1;
        self.adopt(Block { ptr: q as usize, size: new_size, align: b.align, gen: self.gen }, "realloc");
    }

    fn step(&mut self, outbox: &mpsc::Sender<Vec<Block>>, inbox: &mpsc::Receiver<Vec<Block>>) {
        self.op += 1;
        let r = self.rng.below(100);
        if self.live.is_empty() || (r < 45 && self.bytes < LIVE_CAP) {
            self.alloc();
        } else if r < 60 {
            let k = self.rng.below(self.live.len() as u64) as usize;
            self.realloc(k);
        } else if r < 62 {
            // Hand a few blocks to another thread, which checks and frees them.
            // They stay live in the shadow until the receiver frees them.
            let n = (self.live.len() / 4).max(1);
            let batch: Vec<Block> = (0..n).map(|_| self.take(self.live.len() - 1)).collect();
            let _ = outbox.send(batch);
        } else {
            let k = self.rng.below(self.live.len() as u64) as usize;
            let b = self.take(k);
            self.free(b);
        }
        if self.op % 32 == 0 {
            while let Ok(batch) = inbox.try_recv() {
                for b in batch {
                    if let Some(i) = check(&b) {
                        panic!("{}", self.fail(&format!("handed-over block damaged at offset {i}")));
                    }
                    self.free(b);
                }
            }
        }
    }
}

fn ops() -> usize {
    let default = if cfg!(debug_assertions) { 10_000 } else { 40_000 };
    std::env::var("EDGEPOOL_TEST_ORACLE_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn run(seed: u64) {
    let shadow = Arc::new(Live(Mutex::new(BTreeMap::new())));
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..THREADS).map(|_| mpsc::channel::<Vec<Block>>()).unzip();
    let n = ops();
    let handles: Vec<_> = rxs
        .into_iter()
        .enumerate()
        .map(|(t, inbox)| {
            let outbox = txs[(t + 1) % THREADS].clone();
            let shadow = shadow.clone();
            std::thread::spawn(move || {
                let mut p = Program {
                    t,
                    seed,
                    op: 0,
                    rng: Rng::new(seed ^ (t as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D)),
                    live: vec![],
                    bytes: 0,
                    gen: (t as u64) << 48,
                    shadow,
                };
                let mut phase = None;
                for _ in 0..n {
                    // Load phases open and close now and then on every thread.
                    if p.rng.below(5000) == 0 {
                        phase = match phase.take() {
                            None => Some(if p.rng.below(4) == 0 {
                                edgepool::load_phase_with(edgepool::PhaseMode::Arena)
                            } else {
                                edgepool::load_phase()
                            }),
                            Some(g) => {
                                drop(g);
                                None
                            }
                        };
                    }
                    p.step(&outbox, &inbox);
                }
                drop(phase);
                while let Some(b) = p.live.pop() {
                    p.bytes -= b.size;
                    if let Some(i) = check(&b) {
                        panic!("{}", p.fail(&format!("block damaged at offset {i} at the end")));
                    }
                    p.free(b);
                }
                drop(outbox);
                (inbox, p.op)
            })
        })
        .collect();
    drop(txs);
    // Join every thread before draining: a thread still running may send to a finished one's inbox.
    let ends: Vec<_> = handles
        .into_iter()
        .map(|h| h.join().unwrap_or_else(|_| panic!("seed {seed}: a thread failed (see above)")))
        .collect();
    let mut total = 0;
    for (inbox, n) in ends {
        total += n;
        while let Ok(batch) = inbox.try_recv() {
            for b in batch {
                assert_eq!(check(&b), None, "seed {seed}: a handed-over block was damaged");
                shadow.remove(&b);
                // SAFETY: a live block, freed once.
                unsafe { edgepool::raw::free(b.ptr as *mut u8) };
            }
        }
    }
    let left: Vec<(usize, usize)> = shadow.0.lock().unwrap().iter().take(5).map(|(&a, &l)| (a, l)).collect();
    assert!(left.is_empty(), "seed {seed}: blocks left in the shadow, the first: {left:x?}");
    edgepool::check_heap().unwrap_or_else(|e| panic!("seed {seed}: heap after the run: {e}"));
    println!("oracle: seed {seed}: {total} operations on {THREADS} threads, no block damaged or handed out twice");
}

#[test]
fn random_programs_agree_with_the_shadow_model() {
    let seed = std::env::var("EDGEPOOL_TEST_ORACLE_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(0xEDCE_B001_u64);
    run(seed);
}
