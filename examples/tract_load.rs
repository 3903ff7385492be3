//! Loads an ONNX model with tract-onnx (a real Rust inference engine) and reports memory and time.
//! Used by `scripts/load-bench.py`; the same code (`tests/common/tract_loader.rs`) is run by
//! `tests/tract_phase.rs`.
//!
//! ```text
//! tract_load generate MODEL.onnx WEIGHTS_MB     write a U-Net-style model with random weights
//! tract_load load MODEL.onnx [--phase|--arena]  load it, run one inference, print one line of figures
//! ```
//! `EDGEPOOL_ALLOCATOR=system` runs on glibc's malloc instead of edgepool (chosen once, at the first
//! allocation). `--phase` wraps loading in `edgepool::load_phase()`.

#[path = "../tests/common/tract_loader.rs"]
mod tract_loader;

use tract_loader::{generate, load_with, Switch};

#[global_allocator]
static GLOBAL: Switch = Switch;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
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
        }
        _ => {
            eprintln!("usage: tract_load generate MODEL.onnx WEIGHTS_MB | tract_load load MODEL.onnx [--phase|--arena]");
            std::process::exit(2);
        }
    }
}
