//! `edgepool-plan`: plans the intermediate tensors of one or more lifetime CSVs
//! (`tensor_id,size_bytes,first_op,last_op[,align]`) and prints, per strategy, the planned arena size,
//! its ratio to the lower bound, and the planning time.
//!
//! ```text
//! edgepool-plan [--json] [--strategy NAME] [--align N] [--budget-ms N] FILE.csv…
//! ```

use std::process::ExitCode;
use std::time::{Duration, Instant};

use edgepool::plan::{self, Budget, Strategy, Tensor};

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

const USAGE: &str = "usage: edgepool-plan [--json] [--strategy greedy-by-size|greedy-by-breadth|search] \
[--align N] [--budget-ms N] [--input-shape 1,3,224,224] FILE.csv|MODEL.onnx...
  Plans tensors whose lifetimes do not overlap into one shared arena.
  --json         one JSON object per input (naive_bytes, lower_bound_bytes, planned_bytes, strategy, plan_ms, ...)
  --strategy S   the strategy reported as the default one (default: search)
  --align N      alignment of every tensor without an align column (default: 1)
  --budget-ms N  time budget of the search strategy (default: 500)
  --input-shape  shape of an ONNX model's first input, for models with symbolic dimensions
  MODEL.onnx     read the intermediate tensors of an ONNX model (needs the `onnx` feature)";

struct Args {
    json: bool,
    strategy: Strategy,
    align: u64,
    budget: Budget,
    input_shape: Option<Vec<usize>>,
    files: Vec<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        json: false,
        strategy: Strategy::Search,
        align: 1,
        budget: Budget::default(),
        input_shape: None,
        files: vec![],
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match arg.as_str() {
            "--json" => a.json = true,
            "--strategy" => {
                let v = value("--strategy")?;
                a.strategy = Strategy::from_name(&v).ok_or_else(|| format!("unknown strategy '{v}'"))?;
            }
            "--align" => {
                let v = value("--align")?;
                a.align =
                    v.parse().ok().filter(|x: &u64| x.is_power_of_two()).ok_or_else(|| format!("bad --align '{v}'"))?;
            }
            "--budget-ms" => {
                let v = value("--budget-ms")?;
                let ms: u64 = v.parse().map_err(|_| format!("bad --budget-ms '{v}'"))?;
                a.budget.max_time = Duration::from_millis(ms);
            }
            "--input-shape" => {
                let v = value("--input-shape")?;
                let dims: Result<Vec<usize>, _> = v.split(',').map(str::parse).collect();
                a.input_shape = Some(dims.map_err(|_| format!("bad --input-shape '{v}'"))?);
            }
            "-h" | "--help" => return Err(String::new()),
            s if s.starts_with("--") => return Err(format!("unknown option '{s}'")),
            _ => a.files.push(arg),
        }
    }
    if a.files.is_empty() {
        return Err("no input file".into());
    }
    Ok(a)
}

struct Row {
    strategy: Strategy,
    planned: u64,
    ms: f64,
}

fn run_all(ts: &[Tensor], budget: Budget) -> Result<Vec<Row>, plan::PlanError> {
    Strategy::ALL
        .into_iter()
        .map(|s| {
            let t0 = Instant::now();
            let p = plan::plan_with(ts, s, budget)?;
            Ok(Row { strategy: s, planned: p.arena_size, ms: t0.elapsed().as_secs_f64() * 1e3 })
        })
        .collect()
}

/// Tensors from a CSV, or from an ONNX model (with the `onnx` feature).
fn read_tensors(file: &str, args: &Args) -> Result<Vec<Tensor>, String> {
    if file.ends_with(".onnx") {
        #[cfg(feature = "onnx")]
        {
            let mut ts = plan::onnx::tensors_from_onnx(std::path::Path::new(file), args.input_shape.as_deref())?;
            for t in &mut ts {
                t.align = args.align;
            }
            return Ok(ts);
        }
        #[cfg(not(feature = "onnx"))]
        return Err("reading ONNX models needs edgepool built with the `onnx` feature".into());
    }
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    plan::csv::parse(&text, args.align).map_err(|e| e.to_string())
}

fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("edgepool-plan: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut failed = false;
    for file in &args.files {
        let ts = match read_tensors(file, &args) {
            Ok(ts) => ts,
            Err(e) => {
                eprintln!("edgepool-plan: {file}: {e}");
                failed = true;
                continue;
            }
        };
        let rows = match run_all(&ts, args.budget) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("edgepool-plan: {file}: {e}");
                failed = true;
                continue;
            }
        };
        let naive = plan::naive_total(&ts);
        let bound = plan::lower_bound(&ts);
        let ratio = |p: u64| if bound == 0 { 1.0 } else { p as f64 / bound as f64 };
        let chosen = rows.iter().find(|r| r.strategy == args.strategy).expect("every strategy ran");
        if args.json {
            let per: Vec<String> = rows
                .iter()
                .map(|r| {
                    format!(
                        "{{\"strategy\":{},\"planned_bytes\":{},\"ratio_to_bound\":{:.6},\"plan_ms\":{:.3}}}",
                        json_str(r.strategy.name()),
                        r.planned,
                        ratio(r.planned),
                        r.ms
                    )
                })
                .collect();
            println!(
                "{{\"file\":{},\"tensors\":{},\"naive_bytes\":{},\"lower_bound_bytes\":{},\"planned_bytes\":{},\"ratio_to_bound\":{:.6},\"strategy\":{},\"plan_ms\":{:.3},\"strategies\":[{}]}}",
                json_str(file),
                ts.len(),
                naive,
                bound,
                chosen.planned,
                ratio(chosen.planned),
                json_str(chosen.strategy.name()),
                chosen.ms,
                per.join(",")
            );
        } else {
            println!("{file}: {} tensors", ts.len());
            println!("  naive total   {naive:>14} B");
            println!("  lower bound   {bound:>14} B");
            for r in &rows {
                let mark = if r.strategy == args.strategy { " (default)" } else { "" };
                println!(
                    "  {:<18} {:>14} B  ×{:.4} of bound  {:>9.3} ms{mark}",
                    r.strategy.name(),
                    r.planned,
                    ratio(r.planned),
                    r.ms
                );
            }
        }
    }
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
