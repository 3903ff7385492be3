//! Out of memory: with a budget in place, requests beyond it return null, the allocator keeps working,
//! and memory freed later can be taken again.

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
}
