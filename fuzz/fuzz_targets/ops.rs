//! Coverage-guided fuzzing of the allocator: the fuzzer's bytes are a program of allocate / zeroed /
//! aligned / realloc / free / usable-size / trim / load-phase operations, run against a shadow model
//! of every live block (the same checks as `tests/oracle.rs`, on one thread): no two live blocks
//! overlap, alignment holds, zeroed memory reads zero, and every block keeps its pattern until it is
//! freed. edgepool is also the fuzz binary's global allocator. Run with `scripts/fuzz.sh`.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

#[path = "../../tests/common/pattern.rs"]
mod pattern;
use pattern::{fill_sampled, verify_sampled};

const STEP: usize = 4096;

struct Block {
    ptr: *mut u8,
    size: usize,
    align: usize,
    gen: u64,
}

fn key(b: &Block) -> usize {
    b.ptr as usize ^ b.gen.rotate_left(17) as usize
}

/// Reads the program's next operand.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<usize> {
        Some(self.byte()? as usize | (self.byte()? as usize) << 8)
    }
    /// A size over every range: small classes, buddy runs, the largest blocks and direct mappings.
    fn size(&mut self) -> Option<usize> {
        let sel = self.byte()?;
        let v = self.u16()?;
        Some(match sel % 16 {
            0..=8 => v % 4097,
            9..=12 => 4097 + v * 4,
            13 | 14 => (256 << 10) + v * 256,
            _ => (64 << 20) + (v << 6),
        })
    }
}

fn insert(live: &mut Vec<Block>, b: Block) {
    let (s, e) = (b.ptr as usize, b.ptr as usize + b.size.max(1));
    for o in live.iter() {
        let (os, oe) = (o.ptr as usize, o.ptr as usize + o.size.max(1));
        assert!(e <= os || oe <= s, "[{s:#x}, {e:#x}) overlaps the live block [{os:#x}, {oe:#x})");
    }
    assert_eq!(b.ptr as usize % b.align, 0, "{:p} is not aligned to {}", b.ptr, b.align);
    // SAFETY: a live block of `size` bytes.
    unsafe { fill_sampled(b.ptr, b.size, key(&b), STEP) };
    live.push(b);
}

fn check(b: &Block, upto: usize) {
    // SAFETY: a live block of `size` bytes.
    if let Some(off) = unsafe { verify_sampled(b.ptr, b.size, upto, key(b), STEP) } {
        panic!("block {:p} of {} bytes damaged at offset {off}", b.ptr, b.size);
    }
}

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let mut live: Vec<Block> = Vec::new();
    let mut gen = 0u64;
    let mut phase: Option<edgepool::LoadPhase> = None;
    while let Some(op) = inp.byte() {
        gen += 1;
        match op % 10 {
            0..=2 => {
                let Some(size) = inp.size() else { break };
                let p = edgepool::raw::alloc(size, 1);
                assert!(!p.is_null(), "alloc({size}) failed");
                insert(&mut live, Block { ptr: p, size, align: 1, gen });
            }
            3 => {
                let Some(size) = inp.size() else { break };
                let p = edgepool::raw::alloc_zeroed(size, 1);
                assert!(!p.is_null(), "alloc_zeroed({size}) failed");
                // SAFETY: a live block of `size` bytes.
                let nonzero = (0..size).step_by(61).find(|&i| unsafe { *p.add(i) } != 0);
                assert!(nonzero.is_none(), "alloc_zeroed({size}) byte {nonzero:?} is not zero");
                insert(&mut live, Block { ptr: p, size, align: 1, gen });
            }
            4 => {
                let (Some(size), Some(a)) = (inp.size(), inp.byte()) else { break };
                let align = 1usize << (a % 22);
                let p = edgepool::raw::alloc(size, align);
                assert!(!p.is_null(), "alloc({size}, align {align}) failed");
                insert(&mut live, Block { ptr: p, size, align, gen });
            }
            5 | 6 => {
                let Some(i) = inp.u16() else { break };
                if live.is_empty() {
                    continue;
                }
                let b = live.swap_remove(i % live.len());
                check(&b, b.size);
                // SAFETY: a live block of ours, freed once.
                unsafe { edgepool::raw::free(b.ptr) };
            }
            7 => {
                let (Some(i), Some(size)) = (inp.u16(), inp.size()) else { break };
                if live.is_empty() {
                    continue;
                }
                let b = live.swap_remove(i % live.len());
                check(&b, b.size);
                // SAFETY: a live block of ours, with the alignment it was allocated with.
                let q = unsafe { edgepool::raw::realloc(b.ptr, size, b.align) };
                assert!(!q.is_null(), "realloc({:p}, {size}) failed", b.ptr);
                // The kept prefix moved with the block: check it under the old key, then refill.
                // SAFETY: the first min(old, new) bytes of the new block are the old block's.
                if let Some(off) = unsafe { verify_sampled(q, b.size, size.min(b.size), key(&b), STEP) } {
                    panic!("realloc lost byte {off} of {} ({:p} -> {q:p})", b.size, b.ptr);
                }
                insert(&mut live, Block { ptr: q, size, align: b.align, gen });
            }
            8 => {
                let Some(i) = inp.u16() else { break };
                if let Some(b) = live.get(i % live.len().max(1)) {
                    // SAFETY: a live block of ours.
                    let u = unsafe { edgepool::raw::usable_size(b.ptr) };
                    assert!(u >= b.size, "usable size {u} < {}", b.size);
                }
            }
            _ => match inp.byte() {
                Some(x) if x % 3 == 0 => phase = Some(phase.take().unwrap_or_else(edgepool::load_phase)),
                Some(x) if x % 3 == 1 => drop(phase.take()),
                Some(_) => {
                    edgepool::trim();
                }
                None => break,
            },
        }
        // Bound the live memory: the fuzzer's inputs grow, the machine does not.
        while live.iter().map(|b| b.size).sum::<usize>() > 256 << 20 {
            let b = live.swap_remove(0);
            check(&b, b.size);
            // SAFETY: a live block of ours, freed once.
            unsafe { edgepool::raw::free(b.ptr) };
        }
    }
    drop(phase);
    for b in live {
        check(&b, b.size);
        // SAFETY: a live block of ours, freed once.
        unsafe { edgepool::raw::free(b.ptr) };
    }
    edgepool::check_heap().unwrap();
});
