//! `edgepool-plan`: plans the intermediate tensors of lifetime CSVs or ONNX models into one shared
//! arena and prints, per strategy, the arena size, its ratio to the lower bound, the planning time,
//! and whether the plan is proven optimal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use edgepool::plan::{self, Budget, Strategy, Tensor};
use serde::Serialize;

#[global_allocator]
static GLOBAL: edgepool::EdgePool = edgepool::EdgePool::new();

/// Plans tensors whose lifetimes do not overlap into one shared arena.
///
/// Each input is a CSV `tensor_id,size_bytes,first_op,last_op[,align]` (one header line; `#` comments)
/// or, with the `onnx` feature, an ONNX model. The table lists the naive total, the lower bound (the
/// most bytes live at one op) and each strategy's arena; `--json` prints one object per input.
#[derive(Parser, Debug)]
#[command(name = "edgepool-plan", version)]
struct Args {
    /// Lifetime CSVs or ONNX models.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// One JSON object per input (naive_bytes, lower_bound_bytes, planned_bytes, proven_optimal, ...).
    #[arg(long)]
    json: bool,
    /// The strategy whose plan is reported as the result.
    #[arg(long, value_enum, default_value = "search")]
    strategy: StrategyArg,
    /// Shorthand for `--strategy exact`: search until the plan is proven optimal or the time limit.
    #[arg(long, conflicts_with = "strategy")]
    exact: bool,
    /// Alignment of every tensor without an align column (a power of two).
    #[arg(long, default_value_t = 1, value_parser = power_of_two)]
    align: u64,
    /// Time limit of `search` and `exact`, in milliseconds [default: 500 for search, 10000 for exact].
    #[arg(long, value_name = "MS")]
    budget_ms: Option<u64>,
    /// Seed of the local search (plans are reproducible for a seed when the time limit does not end
    /// the search).
    #[arg(long, default_value_t = Budget::default().seed)]
    seed: u64,
    /// Shape of an ONNX model's first input, for models with symbolic dimensions (e.g. 1,3,224,224).
    #[arg(long, value_delimiter = ',', value_name = "DIMS")]
    input_shape: Option<Vec<usize>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum StrategyArg {
    GreedyBySize,
    GreedyByBreadth,
    Search,
    Exact,
}

impl From<StrategyArg> for Strategy {
    fn from(s: StrategyArg) -> Strategy {
        match s {
            StrategyArg::GreedyBySize => Strategy::GreedyBySize,
            StrategyArg::GreedyByBreadth => Strategy::GreedyByBreadth,
            StrategyArg::Search => Strategy::Search,
            StrategyArg::Exact => Strategy::Exact,
        }
    }
}

fn power_of_two(v: &str) -> Result<u64, String> {
    v.parse::<u64>().ok().filter(|x| x.is_power_of_two()).ok_or_else(|| format!("'{v}' is not a power of two"))
}

/// One strategy's result, as printed.
#[derive(Serialize)]
struct Row {
    strategy: &'static str,
    planned_bytes: u64,
    ratio_to_bound: f64,
    plan_ms: f64,
    proven_optimal: bool,
    best_bound_bytes: u64,
}

/// One input's report (`--json`).
#[derive(Serialize)]
struct Report<'a> {
    file: &'a str,
    tensors: usize,
    naive_bytes: u64,
    lower_bound_bytes: u64,
    planned_bytes: u64,
    ratio_to_bound: f64,
    strategy: &'static str,
    plan_ms: f64,
    proven_optimal: bool,
    best_bound_bytes: u64,
    strategies: &'a [Row],
}

/// Tensors from a CSV, or from an ONNX model (with the `onnx` feature).
fn read_tensors(file: &std::path::Path, args: &Args) -> Result<Vec<Tensor>, String> {
    if file.extension().is_some_and(|e| e == "onnx") {
        #[cfg(feature = "onnx")]
        {
            let mut ts = edgepool_plan::onnx::tensors_from_onnx(file, args.input_shape.as_deref())?;
            for t in &mut ts {
                t.align = args.align;
            }
            return Ok(ts);
        }
        #[cfg(not(feature = "onnx"))]
        return Err("reading ONNX models needs edgepool-plan built with the `onnx` feature".into());
    }
    let text = std::fs::read_to_string(file).map_err(|e| e.to_string())?;
    edgepool_plan::read_csv(&text, args.align).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let chosen: Strategy = if args.exact { Strategy::Exact } else { args.strategy.into() };
    // The greedy strategies and the search always run (the table compares them); exact when asked.
    let mut strategies = vec![Strategy::GreedyBySize, Strategy::GreedyByBreadth, Strategy::Search];
    if chosen == Strategy::Exact {
        strategies.push(Strategy::Exact);
    }
    let mut failed = false;
    for file in &args.files {
        let name = file.display().to_string();
        let ts = match read_tensors(file, &args) {
            Ok(ts) => ts,
            Err(e) => {
                eprintln!("edgepool-plan: {name}: {e}");
                failed = true;
                continue;
            }
        };
        let mut rows = Vec::new();
        for &s in &strategies {
            let default = if s == Strategy::Exact { Budget::exact() } else { Budget::default() };
            let budget = Budget {
                max_time: args.budget_ms.map_or(default.max_time, Duration::from_millis),
                seed: args.seed,
                ..default
            };
            let t0 = Instant::now();
            match plan::plan_with(&ts, s, budget) {
                Ok(p) => rows.push(Row {
                    strategy: s.name(),
                    planned_bytes: p.arena_size,
                    ratio_to_bound: if p.lower_bound == 0 { 1.0 } else { p.arena_size as f64 / p.lower_bound as f64 },
                    plan_ms: t0.elapsed().as_secs_f64() * 1e3,
                    proven_optimal: p.proven_optimal,
                    best_bound_bytes: p.best_bound,
                }),
                Err(e) => {
                    eprintln!("edgepool-plan: {name}: {e}");
                    failed = true;
                    break;
                }
            }
        }
        if rows.len() < strategies.len() {
            continue;
        }
        let naive = plan::naive_total(&ts);
        let bound = plan::lower_bound(&ts);
        let main = rows.iter().find(|r| r.strategy == chosen.name()).expect("the chosen strategy ran");
        if args.json {
            let report = Report {
                file: &name,
                tensors: ts.len(),
                naive_bytes: naive,
                lower_bound_bytes: bound,
                planned_bytes: main.planned_bytes,
                ratio_to_bound: main.ratio_to_bound,
                strategy: main.strategy,
                plan_ms: main.plan_ms,
                proven_optimal: main.proven_optimal,
                best_bound_bytes: main.best_bound_bytes,
                strategies: &rows,
            };
            println!("{}", serde_json::to_string(&report).expect("a report serialises"));
        } else {
            println!("{name}: {} tensors", ts.len());
            println!("  naive total   {naive:>14} B");
            println!("  lower bound   {bound:>14} B");
            for r in &rows {
                let mark = if r.strategy == chosen.name() { " (chosen)" } else { "" };
                let proof = if r.proven_optimal {
                    "optimal".to_string()
                } else {
                    format!("optimum ≥ {}", r.best_bound_bytes)
                };
                println!(
                    "  {:<18} {:>14} B  ×{:.4} of bound  {:>9.3} ms  {proof}{mark}",
                    r.strategy, r.planned_bytes, r.ratio_to_bound, r.plan_ms
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
