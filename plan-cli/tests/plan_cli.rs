//! The `edgepool-plan` command line: the table, `--json`, `--exact`, and clear errors with line
//! numbers.

use std::process::Command;

fn run(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_edgepool-plan")).args(args).output().unwrap()
}

fn shared(name: &str) -> String {
    format!("{}/../tests/data/plan/{name}.csv", env!("CARGO_MANIFEST_DIR"))
}

fn field(json: &str, key: &str) -> String {
    let k = format!("\"{key}\":");
    let start = json.find(&k).unwrap_or_else(|| panic!("no {key} in {json}")) + k.len();
    json[start..].split([',', '}']).next().unwrap().trim_matches('"').to_owned()
}

#[test]
fn json_reports_default_strategy_per_input() {
    let files = [shared("mobilenet_v2_224"), shared("unet_512"), shared("deeplabv3_mnv2_513")];
    let args: Vec<&str> = std::iter::once("--json").chain(files.iter().map(String::as_str)).collect();
    let out = run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3);
    let deeplab = lines[2];
    assert_eq!(field(deeplab, "naive_bytes"), "402680476");
    assert_eq!(field(deeplab, "lower_bound_bytes"), "35152000");
    assert_eq!(field(deeplab, "planned_bytes"), "35152000");
    assert_eq!(field(deeplab, "strategy"), "search");
    let ms: f64 = field(deeplab, "plan_ms").parse().unwrap();
    assert!(ms >= 0.0);
}

#[test]
fn table_lists_every_strategy() {
    let out = run(&[&shared("deeplabv3_mnv2_513")]);
    let text = String::from_utf8(out.stdout).unwrap();
    for s in ["naive total", "lower bound", "greedy-by-size", "greedy-by-breadth", "search", "of bound", " ms"] {
        assert!(text.contains(s), "missing {s}: {text}");
    }
}

#[test]
fn bad_input_gets_a_clear_error_with_the_line() {
    let dir = std::env::temp_dir().join(format!("edgepool-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let h = "tensor_id,size_bytes,first_op,last_op\n";
    let cases = [
        ("negative", format!("{h}a,1,0,1\nb,-5,0,1\n"), "line 3: size_bytes is negative"),
        ("nonnumeric", format!("{h}a,lots,0,1\n"), "line 2: size_bytes is not a whole number"),
        ("order", format!("{h}a,1,4,2\n"), "line 2: last_op 2 is before first_op 4"),
        ("duplicate", format!("{h}a,1,0,1\nb,1,0,1\na,2,1,2\n"), "line 4: duplicate tensor_id 'a'"),
        ("empty", String::new(), "line 1: empty file"),
    ];
    for (name, text, message) in cases {
        let path = dir.join(format!("{name}.csv"));
        std::fs::write(&path, text).unwrap();
        let out = run(&[path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{name}: {stderr}");
        assert!(stderr.contains(message), "{name}: {stderr}");
    }
    let out = run(&["--strategy", "magic", "x.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'magic'"));
    let out = run(&["--align", "3", "x.csv"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'3' is not a power of two"));
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn help_lists_every_option() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for opt in ["--json", "--strategy", "--exact", "--align", "--budget-ms", "--seed", "--input-shape"] {
        assert!(text.contains(opt), "missing {opt}: {text}");
    }
}

/// `--exact` on a generated hard instance (written as a CSV): the JSON says the plan is proven
/// optimal, at the bound the instance was cut to.
#[test]
fn exact_proves_a_small_hard_instance() {
    use edgepool::plan::hard::{tiling, HardSpec};
    let spec = HardSpec::new(30, 1);
    let dir = std::env::temp_dir().join(format!("edgepool-plan-exact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hard.csv");
    let mut text = String::from("tensor_id,size_bytes,first_op,last_op\n");
    for t in tiling(spec) {
        text += &format!("{},{},{},{}\n", t.id, t.size, t.first, t.last);
    }
    std::fs::write(&path, text).unwrap();
    let out = run(&["--json", "--exact", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
    assert_eq!(field(&json, "strategy"), "exact");
    assert_eq!(field(&json, "proven_optimal"), "true");
    assert_eq!(field(&json, "planned_bytes"), spec.bound.to_string());
    assert_eq!(field(&json, "best_bound_bytes"), spec.bound.to_string());
    std::fs::remove_dir_all(&dir).unwrap();
}
