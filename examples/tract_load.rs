//! Loads an ONNX model with tract-onnx (a real Rust inference engine) and reports memory and time.
//! Used by `scripts/load-bench.py`; the same code (`tests/common/tract_loader.rs`) is run by
//! `tests/tract_phase.rs`.
//!
//! ```text
//! tract_load generate MODEL.onnx WEIGHTS_MB     write a U-Net-style model with random weights
//! tract_load load MODEL.onnx [--phase|--arena] [--read] [--populate] [--prefault-free=BYTES] [--threads=N] [--hold-ms=N]
//!                                                load it, run one inference, print one line of figures
//!                                                (and stay alive N ms more, for memory curves)
//! ```
//! `EDGEPOOL_ALLOCATOR=system|mimalloc|jemalloc|count` runs on glibc's malloc, the `mimalloc` or
//! `tikv-jemallocator` crate, or glibc with its live bytes counted, instead of edgepool (chosen once,
//! at the first allocation). `--phase` wraps loading in `edgepool::load_phase()`; the model is read
//! through `edgepool::MappedModel` (`--populate`: read in ahead of parsing), or with `--read` into a
//! buffer; `--prefault-free=BYTES` calls `edgepool::prefault_free` before the first inference; `--threads=N`
//! loads it in N threads at once (under a process-wide phase with `--phase`). The
//! comparison of allocators is `cargo run --release --example demo`.

#[path = "../tests/common/tract_loader.rs"]
mod tract_loader;

use tract_loader::{generate, load_with, Load, Switch};

#[global_allocator]
static GLOBAL: Switch = Switch;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("generate") if args.len() == 4 => generate(&args[2], args[3].parse().expect("WEIGHTS_MB")),
        Some("load") if args.len() >= 3 => {
            let has = |f: &str| args.iter().any(|a| a == f);
            let how = Load {
                mode: if has("--arena") {
                    Some(edgepool::PhaseMode::Arena)
                } else if has("--phase") {
                    Some(edgepool::PhaseMode::Segregated)
                } else {
                    None
                },
                read: has("--read"),
                populate: has("--populate"),
                prefault_free: args
                    .iter()
                    .find_map(|a| a.strip_prefix("--prefault-free="))
                    .map(|v| v.parse().expect("--prefault-free=BYTES"))
                    .unwrap_or(0),
                threads: args
                    .iter()
                    .find_map(|a| a.strip_prefix("--threads="))
                    .map(|v| v.parse().expect("--threads=N"))
                    .unwrap_or(1),
                // `--hold-ms=N`: stay alive N ms after the inference, the model still loaded (for
                // memory curves, which then show the run phase after the step down).
                hold_ms: args
                    .iter()
                    .find_map(|a| a.strip_prefix("--hold-ms="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0),
            };
            if let Err(e) = load_with(&args[2], &how) {
                eprintln!("tract_load: {e:?}");
                std::process::exit(1);
            }
        }
        _ => {
            eprintln!(
                "usage: tract_load generate MODEL.onnx WEIGHTS_MB | load MODEL.onnx [--phase|--arena] [--read] [--populate] [--prefault-free=BYTES] [--threads=N] [--hold-ms=N]"
            );
            std::process::exit(2);
        }
    }
}
