//! Helpers for the tests that run programs under `LD_PRELOAD=libedgepool.so`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// Builds `libedgepool.so` (release) once per test binary and returns its path. A separate target
/// directory keeps this nested build off the lock of the `cargo test` that runs us.
pub fn lib() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| build_lib("preload", &[])).clone()
}

/// Builds `libedgepool.so` with the `valgrind` feature (client requests), once per test binary.
pub fn lib_valgrind() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| build_lib("preload-valgrind", &["--features", "valgrind"])).clone()
}

/// Builds `libedgepool.so` with the `debug` feature (debug mode, sizing advice), once per test binary.
pub fn lib_debug() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| build_lib("preload-debug", &["--features", "debug"])).clone()
}

fn build_lib(dir: &str, extra: &[&str]) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = root.join("target").join(dir);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .current_dir(root)
        .args(["build", "--release", "-p", "edgepool-cdylib"])
        .args(extra)
        .arg("--target-dir")
        .arg(&target)
        .status()
        .unwrap();
    assert!(st.success(), "building libedgepool.so failed");
    let so = target.join("release").join("libedgepool.so");
    assert!(so.exists());
    so
}

/// A fresh temporary directory for one test.
pub fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("edgepool-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles a C file with the system `cc` and `-O2 -D_FORTIFY_SOURCE=3`.
pub fn compile_c(src: &Path, out: &Path, extra: &[&str]) {
    let st = Command::new("cc")
        .args(["-O2", "-D_FORTIFY_SOURCE=3", "-Wall", "-Wno-use-after-free"])
        .arg(src)
        .arg("-o")
        .arg(out)
        .args(extra)
        .status()
        .unwrap();
    assert!(st.success(), "cc failed on {}", src.display());
}

/// Runs `cmd`, under edgepool if `preload`, with extra environment variables.
pub fn run_with(cmd: &mut Command, preload: bool, env: &[(&str, &str)]) -> Output {
    if preload {
        cmd.env("LD_PRELOAD", lib());
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Sums a counter over every statistics report (`EDGEPOOL_STATS=1`) in `stderr`.
pub fn stat(stderr: &str, name: &str) -> u64 {
    stderr
        .lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(name)).then(|| it.next()?.parse::<u64>().ok())?
        })
        .sum()
}
