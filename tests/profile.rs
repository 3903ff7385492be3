//! `EDGEPOOL_PROFILE=1`: a child process (this binary, on edgepool) makes known allocations; its
//! report at exit must count them, show their peaks, size pools from the peaks with 1.2x headroom,
//! and propose classes that waste no more than today's. (Needs the `debug` feature.)
#![cfg(feature = "debug")]

use std::process::Command;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

fn child_report(profile: bool) -> String {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"]).env_remove("EDGEPOOL_PROFILE");
    if profile {
        c.env("EDGEPOOL_PROFILE", "1");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The numbers of the report's line for class `size`: allocations, peak live, waste, pool blocks,
/// pool slabs.
fn class_line(report: &str, size: u64) -> Vec<u64> {
    let line = report
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&size.to_string()))
        .unwrap_or_else(|| panic!("no line for class {size}:\n{report}"));
    line.split_whitespace().filter_map(|w| w.parse().ok()).skip(1).collect()
}

fn after<'a>(report: &'a str, key: &str) -> &'a str {
    let i = report.find(key).unwrap_or_else(|| panic!("{key} missing:\n{report}"));
    &report[i + key.len()..]
}

fn first_number(s: &str) -> u64 {
    s.split(|c: char| !c.is_ascii_digit()).find(|w| !w.is_empty()).unwrap().parse().unwrap()
}

#[test]
fn the_report_counts_known_allocations_and_sizes_pools_from_their_peaks() {
    let report = child_report(true);
    // 10 000 live 40-byte blocks at once (class 48), then 3 000 of 200 bytes (class 256).
    let c48 = class_line(&report, 48);
    assert!(c48[0] >= 10_000 && c48[1] >= 10_000, "{report}");
    assert_eq!(c48[3], (c48[1] * 12).div_ceil(10), "pool blocks = peak x 1.2: {report}");
    assert_eq!(c48[4], c48[3].div_ceil(65536 / 48), "slabs for the pool: {report}");
    assert!(c48[2] >= 10_000 * 8, "waste of 40 bytes in 48: {report}");
    let c256 = class_line(&report, 256);
    assert!(c256[0] >= 3_000 && c256[2] >= 3_000 * 56, "{report}");
    // Twenty 1 MiB blocks live at once.
    let peak = first_number(after(&report, "bytes of large blocks (peak live "));
    assert!(peak >= 20 << 20, "{report}");
    // The classes with least waste waste no more than today's, and serve 200 bytes in 208.
    let today = first_number(after(&report, "classes: waste "));
    let best_line = after(&report, "least waste with ");
    let best = first_number(after(best_line, "waste "));
    assert!(best <= today, "{report}");
    let classes: Vec<u64> = best_line
        .lines()
        .next()
        .unwrap()
        .rsplit_once(':')
        .unwrap()
        .1
        .split_whitespace()
        .map(|w| w.parse().unwrap())
        .collect();
    assert_eq!(classes.len(), edgepool::classes::CLASS_SIZES.len());
    let largest = edgepool::classes::SMALL_MAX as u64;
    assert!(classes.contains(&208) && classes.contains(&48) && classes.last() == Some(&largest), "{classes:?}");
    // Without the option, no report.
    assert!(!child_report(false).contains("edgepool profile"));
}

#[test]
#[ignore = "run by the test above in a child process"]
fn child() {
    let small: Vec<Vec<u8>> = (0..10_000).map(|i| vec![i as u8; 40]).collect();
    let large: Vec<Vec<u8>> = (0..20).map(|i| vec![i as u8; 1 << 20]).collect();
    drop(small);
    drop(large);
    let mid: Vec<Vec<u8>> = (0..3_000).map(|i| vec![i as u8; 200]).collect();
    std::hint::black_box(&mid);
}
