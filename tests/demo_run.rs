//! The README's first command, at a small size: `examples/demo.rs` (built by `cargo test` with the
//! other examples) prints a row per allocator with plausible figures, every run computes the same
//! output, and `--curve` writes a CSV per allocator and the PNG.

use std::path::PathBuf;
use std::process::Command;

/// `target/<profile>/examples/demo`, next to this test's own `deps` directory; built if missing.
fn demo() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().unwrap().parent().unwrap();
    let demo = profile_dir.join("examples").join("demo");
    if !demo.exists() {
        let release = profile_dir.ends_with("release");
        let st = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "-q", "-p", "edgepool", "--example", "demo"])
            .args(release.then_some("--release"))
            .status()
            .unwrap();
        assert!(st.success() && demo.exists(), "building the demo failed");
    }
    demo
}

#[test]
fn the_demo_prints_a_plausible_row_per_allocator_and_draws_the_curves() {
    let dir = std::env::temp_dir().join(format!("edgepool-demo-test-{}", std::process::id()));
    let mut cmd = Command::new(demo());
    cmd.args(["--mb", "4", "--rounds", "1", "--curve"]).arg(&dir).env_remove("LD_PRELOAD");
    if let Ok(py) = std::env::var("EDGEPOOL_TEST_PYTHON") {
        cmd.env("PYTHON", py);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Vec<String>> = stdout
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| allocator"))
        .map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect())
        .collect();
    let names: Vec<&str> = rows.iter().map(|r| r[0].as_str()).collect();
    assert_eq!(
        names,
        [
            "glibc malloc",
            "mimalloc",
            "jemalloc",
            "edgepool",
            "edgepool + load_phase()",
            "edgepool + load_phase() + prefault_free()"
        ],
        "{stdout}"
    );
    let n = |cell: &str| -> f64 { cell.split_whitespace().next().unwrap().parse().unwrap() };
    for r in &rows {
        let (before, peak, ratio, after, load) = (n(&r[1]), n(&r[2]), n(&r[3]), n(&r[4]), n(&r[5]));
        assert!(before > 0.0 && load > 0.0 && ratio > 0.0, "{r:?}");
        assert!(peak >= after && after >= before, "peak ≥ after loading ≥ before loading: {r:?}");
    }
    assert!(stdout.contains("every run computed the same output"), "{stdout}");
    for name in
        ["glibc-malloc", "mimalloc", "jemalloc", "edgepool", "edgepool+load_phase", "edgepool+load_phase+prefault_free"]
    {
        let csv =
            std::fs::read_to_string(dir.join(format!("{name}.csv"))).unwrap_or_else(|e| panic!("{name}.csv: {e}"));
        assert!(csv.starts_with("t_ms,rss_bytes,") && csv.lines().count() > 3, "{name}.csv:\n{csv}");
    }
    let png = std::fs::read(dir.join("demo.png")).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "not a PNG");
    let _ = std::fs::remove_dir_all(&dir);
}
