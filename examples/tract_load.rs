//! Loads an ONNX model with tract-onnx (a real Rust inference engine) and reports memory and time.
//! Used by `scripts/load-bench.py`; the same code (`tests/common/tract_loader.rs`) is run by
//! `tests/tract_phase.rs`.
//!
//! ```text
//! tract_load generate MODEL.onnx WEIGHTS_MB     write a U-Net-style model with random weights
//! tract_load load MODEL.onnx [--phase|--arena] [--hold-ms=N]
//!                                                load it, run one inference, print one line of figures
//!                                                (and stay alive N ms more, for memory curves)
//! tract_load demo [WEIGHTS_MB]                   generate a model (default 64 MB) and compare glibc,
//!                                                edgepool, and edgepool with the load phase
//! ```
//! `EDGEPOOL_ALLOCATOR=system` runs on glibc's malloc instead of edgepool (chosen once, at the first
//! allocation). `--phase` wraps loading in `edgepool::load_phase()`.

#[path = "../tests/common/tract_loader.rs"]
mod tract_loader;

use tract_loader::{generate, load_with, Switch};

#[global_allocator]
static GLOBAL: Switch = Switch;

/// Runs this program as a child (`load`) under one allocator and returns its figures.
fn child(model: &str, flag: Option<&str>, system: bool) -> std::collections::HashMap<String, String> {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["load", model]).args(flag);
    if system {
        c.env("EDGEPOOL_ALLOCATOR", "system");
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect()
}

fn demo(mb: usize) {
    let dir = std::env::temp_dir().join(format!("edgepool-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("unet.onnx");
    let model = model.to_str().unwrap();
    generate(model, mb);
    println!("\nloading it with tract, each in a fresh process:\n");
    println!("| allocator | peak RSS while loading | RSS right after loading | load | first inference |");
    println!("|---|---|---|---|---|");
    for (name, flag, system) in
        [("glibc malloc", None, true), ("edgepool", None, false), ("edgepool + load_phase()", Some("--phase"), false)]
    {
        let r = child(model, flag, system);
        let mib = |k: &str| r[k].parse::<f64>().unwrap() / (1u64 << 20) as f64;
        println!(
            "| {name} | {:.0} MiB | {:.0} MiB | {} ms | {} ms |",
            mib("peak_rss"),
            mib("rss_after_load"),
            r["load_ms"],
            r["infer_ms"]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("demo") => demo(args.get(2).and_then(|a| a.parse().ok()).unwrap_or(64)),
        Some("generate") if args.len() == 4 => generate(&args[2], args[3].parse().expect("WEIGHTS_MB")),
        Some("load") if args.len() >= 3 => {
            let mode = if args.iter().any(|a| a == "--arena") {
                Some(edgepool::PhaseMode::Arena)
            } else if args.iter().any(|a| a == "--phase") {
                Some(edgepool::PhaseMode::Segregated)
            } else {
                None
            };
            if let Err(e) = load_with(&args[2], mode) {
                eprintln!("tract_load: {e:?}");
                std::process::exit(1);
            }
            // `--hold-ms=N`: stay alive N ms after the inference (for memory curves, which then show
            // the run phase after the step down).
            if let Some(ms) = args.iter().find_map(|a| a.strip_prefix("--hold-ms=")).and_then(|v| v.parse().ok()) {
                std::thread::sleep(std::time::Duration::from_millis(ms));
            }
        }
        _ => {
            eprintln!(
                "usage: tract_load generate MODEL.onnx WEIGHTS_MB | load MODEL.onnx [--phase|--arena] [--hold-ms=N] | demo [WEIGHTS_MB]"
            );
            std::process::exit(2);
        }
    }
}
