//! Out of memory: with a budget in place, requests beyond it return null, the allocator keeps working,
//! and memory freed later can be taken again.

mod common;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

#[test]
fn requests_beyond_the_budget_fail_cleanly_and_recover() {
    // Free memory waiting for reuse counts as taken until it is purged: start from none.
    edgepool::trim();
    let base = edgepool::stats().os_bytes;
    let limit = base + (64 << 20);
    edgepool::set_limit(limit);
    let mut blocks = vec![];
    let refused = loop {
        let p = edgepool::raw::alloc(1 << 20, 16);
        if p.is_null() {
            break true;
        }
        // SAFETY: fresh 1 MiB block.
        unsafe { p.write_bytes(0x5A, 1 << 20) };
        blocks.push(p);
        if blocks.len() > 1000 {
            break false;
        }
    };
    let s = edgepool::stats();
    // Lift the budget while the figures are checked, so that a failed assertion can report.
    edgepool::set_limit(0);
    assert!(refused, "the budget never refused a request");
    assert!((56..=64).contains(&blocks.len()), "{} MiB fitted under a 64 MiB budget", blocks.len());
    assert!(s.os_bytes <= limit, "{} bytes taken under a budget of {limit}", s.os_bytes);
    assert!(s.counters.budget_refusals > 0);
    edgepool::set_limit(limit);
    // Small allocations and big ones beyond the largest block are refused the same way.
    let huge = edgepool::raw::alloc(200 << 20, 16);
    assert!(huge.is_null());
    // Growing a block at the budget fails and leaves it intact, and the refusal takes nothing.
    let last = *blocks.last().unwrap();
    // SAFETY: a live 1 MiB block, grown to 8 MiB (in place or moved: either needs new memory).
    let grown = unsafe { edgepool::raw::realloc(last, 8 << 20, 16) };
    let after = edgepool::stats().os_bytes;
    edgepool::set_limit(0);
    assert!(grown.is_null(), "a realloc beyond the budget succeeded");
    // SAFETY: the block is still live and 1 MiB long.
    assert!(unsafe { std::slice::from_raw_parts(last, 1 << 20) }.iter().all(|&b| b == 0x5A));
    assert!(after <= limit, "a refused realloc left {after} bytes taken under a budget of {limit}");
    edgepool::set_limit(limit);
    // Free half: the same requests succeed again.
    for p in blocks.drain(..32) {
        // SAFETY: live blocks.
        unsafe { edgepool::raw::free(p) };
    }
    for _ in 0..24 {
        let p = edgepool::raw::alloc(1 << 20, 16);
        assert!(!p.is_null(), "memory freed under the budget could not be taken again");
        blocks.push(p);
    }
    for p in blocks {
        // SAFETY: live blocks.
        unsafe { edgepool::raw::free(p) };
    }
    edgepool::set_limit(0);
    let v = vec![3u8; 256 << 20];
    assert_eq!(v[12345], 3);
    edgepool::check_heap().unwrap();
    drop(v);

    // A block grown by moving counts once against the budget: its pages go back to the OS as it is
    // copied. 16 MiB grown to 32 MiB under a budget 20 MiB above what is taken (16 + 32 would not
    // fit; 32 and one piece does).
    let mut g: Vec<u8> = Vec::with_capacity(16 << 20);
    g.resize(16 << 20, 7);
    let blocker = common::block_right_after(g.as_ptr(), 16 << 20);
    edgepool::trim();
    let base = edgepool::stats().os_bytes;
    let limit = base + (20 << 20);
    edgepool::set_limit(limit);
    let old = g.as_ptr();
    let grew = g.try_reserve_exact(16 << 20).is_ok();
    let moved = g.as_ptr() != old;
    let after = edgepool::stats().os_bytes;
    // Twice the block: beyond the budget even counted once.
    let again = g.try_reserve_exact(48 << 20).is_ok();
    let refusals = edgepool::stats().counters.budget_refusals;
    edgepool::set_limit(0);
    assert!(grew, "growing 16 -> 32 MiB by moving was refused under a budget of 20 MiB more");
    assert!(moved, "the block grew in place");
    assert!(after <= limit, "{after} bytes taken under a budget of {limit}");
    assert!(!again, "growing 32 -> 64 MiB fitted a budget of {limit} bytes ({after} taken)");
    assert!(refusals > 0);
    assert!(g.iter().all(|&b| b == 7), "the contents did not survive the move and the refusal");
    drop((g, blocker));
    edgepool::check_heap().unwrap();

    // The same for a block moved into a mapping of its own (beyond the largest heap block): three
    // quarters of it grown to one and a quarter, under a budget of 3/4 more (old and new would need
    // 5/4; the new mapping, less the old block given back, and one piece, need 1/2 and 1 MiB).
    let big = edgepool::max_block();
    let mut h: Vec<u8> = Vec::with_capacity(big / 4 * 3);
    h.resize(big / 4 * 3, 9);
    edgepool::trim();
    let base = edgepool::stats().os_bytes;
    let limit = base + big / 4 * 3;
    edgepool::set_limit(limit);
    let grew = h.try_reserve_exact(big / 2).is_ok();
    let after = edgepool::stats().os_bytes;
    edgepool::set_limit(0);
    assert!(grew, "growing into a mapping of its own by moving was refused under the budget");
    assert!(h.capacity() > big, "not a mapping of its own: {} bytes", h.capacity());
    assert!(after <= limit, "{after} bytes taken under a budget of {limit}");
    assert!(h.iter().all(|&b| b == 9));
    drop(h);
    edgepool::check_heap().unwrap();
}
