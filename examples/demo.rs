//! The demo: loads a U-Net-style ONNX model with tract (a real Rust inference engine) through
//! `edgepool::MappedModel`, each load in a fresh process, on glibc's malloc, the `mimalloc` and
//! `tikv-jemallocator` crates, edgepool, edgepool with `load_phase()`, and that plus
//! `prefault_free()` before the first inference; prints the memory and time of each with the floor
//! (RSS before loading + the peak of the bytes the program holds live, counted under glibc).
//!
//! ```text
//! cargo run --release --example demo -- [--mb 64] [--rounds 5] [--curve DIR]
//! ```
//! `--mb`: megabytes of weights (the file is a little larger); `--rounds`: loads per allocator (the
//! table shows medians); `--curve DIR`: one more run each with the memory curve sampled, written to
//! `DIR/<allocator>.csv`, and `DIR/demo.png` drawn from them by `scripts/plot-curve.py` (run with
//! `$PYTHON`, else `python3`).

#[path = "../tests/common/tract_loader.rs"]
mod tract_loader;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use tract_loader::{generate, load_with, Load, Switch};

#[global_allocator]
static GLOBAL: Switch = Switch;

/// One configuration: a name, the allocator (`EDGEPOOL_ALLOCATOR`), and the child's flags.
struct Config {
    name: &'static str,
    allocator: &'static str,
    phase: bool,
    prefault: bool,
}

const CONFIGS: [Config; 6] = [
    Config { name: "glibc malloc", allocator: "system", phase: false, prefault: false },
    Config { name: "mimalloc", allocator: "mimalloc", phase: false, prefault: false },
    Config { name: "jemalloc", allocator: "jemalloc", phase: false, prefault: false },
    Config { name: "edgepool", allocator: "edgepool", phase: false, prefault: false },
    Config { name: "edgepool + load_phase()", allocator: "edgepool", phase: true, prefault: false },
    Config { name: "edgepool + load_phase() + prefault_free()", allocator: "edgepool", phase: true, prefault: true },
];

type Figures = HashMap<String, String>;

/// Runs this program as a child that loads `model` once, and returns its figures.
fn child(model: &Path, allocator: &str, flags: &[String]) -> Figures {
    let out = Command::new(std::env::current_exe().unwrap())
        .arg("--child")
        .arg(model)
        .args(flags)
        .env("EDGEPOOL_ALLOCATOR", allocator)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!("demo: the {allocator} child failed:\n{}", String::from_utf8_lossy(&out.stderr));
        std::process::exit(1);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or("");
    line.split_whitespace().filter_map(|kv| kv.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned()))).collect()
}

fn num(f: &Figures, k: &str) -> f64 {
    f.get(k).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no figure {k} in {f:?}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

const MIB: f64 = (1u64 << 20) as f64;

fn flags(c: &Config, prefault: usize) -> Vec<String> {
    let mut f = vec![];
    if c.phase {
        f.push("--phase".to_string());
    }
    if c.prefault {
        f.push(format!("--prefault-free={prefault}"));
    }
    f
}

fn demo(mb: usize, rounds: usize, curve: Option<PathBuf>) {
    let dir = std::env::temp_dir().join(format!("edgepool-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("unet.onnx");
    generate(model.to_str().unwrap(), mb);

    // The floor: glibc with every live byte counted.
    let fl = child(&model, "count", &[]);
    let floor = num(&fl, "rss_before") + num(&fl, "heap_peak") - num(&fl, "heap_before");
    // How much the first inference faults in (one probe run), to size prefault_free: that, plus a fifth.
    let probe = child(&model, "edgepool", &["--phase".to_string()]);
    let prefault = ((num(&probe, "infer_faults") * 4096.0 * 1.2) as usize).next_multiple_of(1 << 20);

    let mut runs: Vec<Vec<Figures>> = CONFIGS.iter().map(|_| vec![]).collect();
    for r in 0..rounds {
        // Each round starts with another allocator, so that none always runs first.
        for k in 0..CONFIGS.len() {
            let i = (k + r) % CONFIGS.len();
            let c = &CONFIGS[i];
            runs[i].push(child(&model, c.allocator, &flags(c, prefault)));
        }
    }

    let size = std::fs::metadata(&model).unwrap().len() as f64;
    println!("\nloading a U-Net ({:.0} MiB file) with tract through MappedModel, each in a fresh process;", size / MIB);
    println!(
        "medians of {rounds} round(s); floor {:.0} MiB = RSS before loading + peak of the live heap while loading\n",
        floor / MIB
    );
    println!("| allocator | RSS before loading | peak RSS while loading | peak ÷ floor | RSS right after loading | load | first inference | its page faults |");
    println!("|---|---|---|---|---|---|---|---|");
    let sums: std::collections::BTreeSet<&str> =
        runs.iter().flatten().map(|f| f.get("out_sum").map(String::as_str).unwrap_or("?")).collect();
    for (c, rs) in CONFIGS.iter().zip(&runs) {
        let m = |k: &str| median(rs.iter().map(|f| num(f, k)).collect());
        println!(
            "| {} | {:.1} MiB | {:.1} MiB | {:.2} | {:.1} MiB | {:.0} ms | {:.1} ms | {:.0} |",
            c.name,
            m("rss_before") / MIB,
            m("peak_rss") / MIB,
            m("peak_rss") / floor,
            m("rss_after_load") / MIB,
            m("load_ms"),
            m("infer_ms"),
            m("infer_faults"),
        );
    }
    println!(
        "\nprefault_free({} MiB) before the first inference (its first inference faulted {:.0} pages in a probe run)",
        prefault >> 20,
        num(&probe, "infer_faults")
    );
    if sums.len() == 1 {
        println!("every run computed the same output (sum {})", sums.iter().next().unwrap());
    } else {
        println!("the outputs differ between runs: {sums:?}");
        std::process::exit(1);
    }

    if let Some(cdir) = curve {
        std::fs::create_dir_all(&cdir).unwrap();
        // The phase's run first: the plot shades the first curve's load phase.
        let order = [4usize, 0, 1, 2, 3, 5];
        let mut csvs = vec![];
        for &i in &order {
            let c = &CONFIGS[i];
            let file = c.name.replace(" + ", "+").replace("()", "").replace(' ', "-");
            let csv = cdir.join(format!("{file}.csv"));
            let mut f = flags(c, prefault);
            f.push(format!("--curve={}", csv.display()));
            child(&model, c.allocator, &f);
            csvs.push(csv);
        }
        let png = cdir.join("demo.png");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/plot-curve.py");
        // `PYTHON`: an interpreter with matplotlib (else the script installs it into a venv).
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let st = Command::new(python).arg(&script).arg(&png).args(&csvs).env_remove("LD_PRELOAD").status().unwrap();
        if st.success() {
            println!("memory curves: {} (from {})", png.display(), cdir.display());
        } else {
            eprintln!("demo: the plot script failed; the curves are in {}", cdir.display());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The child: loads the model once and prints its figures.
fn child_main(args: &[String]) {
    let model = &args[0];
    let mut how = Load::default();
    let mut curve = None;
    for a in &args[1..] {
        if a == "--phase" {
            how.mode = Some(edgepool::PhaseMode::Segregated);
        } else if let Some(v) = a.strip_prefix("--prefault-free=") {
            how.prefault_free = v.parse().expect("--prefault-free=BYTES");
        } else if let Some(v) = a.strip_prefix("--curve=") {
            curve = Some(v.to_string());
        }
    }
    if let Some(path) = &curve {
        edgepool::curve::start(path, std::time::Duration::from_millis(2)).expect("the memory curve");
        // The run phase after the step down, the model still loaded, for the curve.
        how.hold_ms = 150;
    }
    if let Err(e) = load_with(model, &how) {
        eprintln!("demo: {e:?}");
        std::process::exit(1);
    }
    if curve.is_some() {
        edgepool::curve::stop();
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child_main(&args[1..]);
    }
    let (mut mb, mut rounds, mut curve) = (64usize, 5usize, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().unwrap_or_else(|| usage(&format!("{a} needs a value")));
        match a.as_str() {
            "--mb" => mb = value().parse().unwrap_or_else(|_| usage("--mb takes a number")),
            "--rounds" => rounds = value().parse().unwrap_or_else(|_| usage("--rounds takes a number")),
            "--curve" => curve = Some(PathBuf::from(value())),
            "-h" | "--help" => usage(""),
            other => usage(&format!("unknown argument {other}")),
        }
    }
    if mb == 0 || rounds == 0 {
        usage("--mb and --rounds must be at least 1");
    }
    demo(mb, rounds, curve);
}

fn usage(why: &str) -> ! {
    if !why.is_empty() {
        eprintln!("demo: {why}");
    }
    eprintln!("usage: cargo run --release --example demo -- [--mb 64] [--rounds 5] [--curve DIR]");
    std::process::exit(2);
}
