//! Memory goes back to the OS: after large blocks are freed, the free heap memory kept resident stays
//! within EDGEPOOL_RETAIN, the rest is purged, and the process's RSS falls accordingly.

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

#[test]
fn freed_memory_is_returned_beyond_the_retain_threshold() {
    let retain = edgepool::options().get(edgepool::options::RETAIN) as usize;
    let block = 1 << 20;
    let n = 96;
    let rss0 = edgepool::os::rss_bytes();
    let mut v: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8 | 1; block]).collect();
    let rss_full = edgepool::os::rss_bytes();
    assert!(rss_full >= rss0 + n * block * 9 / 10, "blocks were not resident: {rss0} -> {rss_full}");
    let purged0 = edgepool::stats().counters.purged_bytes;
    v.clear();
    v.shrink_to_fit();
    let s = edgepool::stats();
    assert!(s.dirty_free_bytes <= retain, "dirty free {} above retain {retain}", s.dirty_free_bytes);
    assert!(s.counters.purged_bytes >= purged0 + n * block - retain - block);
    let rss_after = edgepool::os::rss_bytes();
    assert!(
        rss_after + (n * block) / 2 < rss_full,
        "RSS did not follow the live heap: full {rss_full}, after free {rss_after}"
    );
    // trim() gives back even what RETAIN kept.
    edgepool::trim();
    assert_eq!(edgepool::stats().dirty_free_bytes, 0);
    // Purged memory is reusable and reads as zero through alloc_zeroed.
    let z = vec![0u8; 8 << 20];
    assert!(z.iter().all(|&b| b == 0));
    edgepool::check_heap().unwrap();
}
