//! The benchmark suite's programs (benches/suite/*.c, run at full size by `scripts/bench-all`) at a
//! tiny size under `LD_PRELOAD=libedgepool.so`, so that the suite cannot rot: each program checks the
//! contents of every block it frees and says "ok". And the check itself catches a damaged block.

mod common;

use std::path::Path;
use std::process::Command;

use common::preload::{compile_c, run_with, stat, tmp_dir};

fn suite() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/suite")
}

#[test]
fn every_suite_program_runs_at_a_tiny_size_under_edgepool() {
    let dir = tmp_dir("bench-suite");
    let mut names: Vec<String> = std::fs::read_dir(suite())
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|f| f.strip_suffix(".c").map(str::to_owned))
        .collect();
    names.sort();
    assert!(names.len() >= 8, "{names:?}");
    for name in &names {
        let exe = dir.join(name);
        compile_c(&suite().join(format!("{name}.c")), &exe, &["-pthread", "-ldl", "-Werror", "-Wextra"]);
        let out = run_with(Command::new(&exe).arg("0.01"), true, &[("EDGEPOOL_STATS", "1")]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name} failed under edgepool:\n{stdout}\n{stderr}");
        assert_eq!(stdout.trim(), format!("ok {name}"), "{stderr}");
        assert!(stat(&stderr, "slabs_acquired") > 0, "{name}: no allocation went through edgepool:\n{stderr}");
    }
}

#[test]
fn the_suite_check_catches_a_damaged_block() {
    let dir = tmp_dir("bench-suite-check");
    let src = dir.join("damaged.c");
    std::fs::write(
        &src,
        format!(
            "#include \"{}\"\nint main(int argc, char **argv) {{\n\
             size_t n = (size_t)atoi(argv[1]), at = (size_t)atoi(argv[2]);\n\
             unsigned char *p = xmalloc(n);\n stamp(p, n, 77);\n p[at] ^= 1;\n check_stamp(p, n, 77, 0);\n free(p);\n\
             puts(\"not caught\");\n return 0;\n}}\n",
            suite().join("suite.h").display()
        ),
    )
    .unwrap();
    let exe = dir.join("damaged");
    compile_c(&src, &exe, &[]);
    // The size word, the tag, a page word and the last word: each damaged byte fails the check.
    for (n, at, what) in [
        (100, 0, "size word changed"),
        (100, 9, "tag changed"),
        (100, 95, "last word changed"),
        (20000, 8192, "page word changed"),
    ] {
        let out = Command::new(&exe).args([n.to_string(), at.to_string()]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "n={n} at={at}: {stderr}");
        assert!(stderr.contains(what), "n={n} at={at}: {stderr}");
    }
    // Bytes the stamp does not cover pass (the check is a sample, not a checksum).
    let out = Command::new(&exe).args(["100", "50"]).output().unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("not caught"));
}
