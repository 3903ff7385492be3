//! A real loader: tract-onnx loads an ONNX U-Net (written by the test, a few MB of random weights),
//! three ways in three child processes of this binary: on glibc's malloc, on edgepool, and on
//! edgepool with `load_phase()` around loading (the code is `examples/tract_load.rs`'s).

use std::process::Command;

#[path = "common/tract_loader.rs"]
mod tract_loader;

#[global_allocator]
static GLOBAL: tract_loader::Switch = tract_loader::Switch;

/// The child: `EDGEPOOL_TEST_TRACT=generate|load|load-phase`, `EDGEPOOL_TEST_MODEL=path`.
#[test]
#[ignore = "child process of tract_loads_a_unet_with_less_memory_after_the_phase"]
fn child() {
    let model = std::env::var("EDGEPOOL_TEST_MODEL").unwrap();
    match std::env::var("EDGEPOOL_TEST_TRACT").unwrap().as_str() {
        "generate" => tract_loader::generate(&model, 6),
        "load" => tract_loader::load(&model, false).unwrap(),
        "load-phase" => tract_loader::load(&model, true).unwrap(),
        "load-phase-4" => {
            let how = tract_loader::Load {
                mode: Some(edgepool::PhaseMode::Segregated),
                threads: 4,
                ..tract_loader::Load::default()
            };
            tract_loader::load_with(&model, &how).unwrap()
        }
        other => panic!("{other}"),
    }
}

fn run(args: &[&str], env: &[(&str, &str)]) -> String {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["child", "--exact", "--ignored", "--nocapture", "--test-threads=1"]);
    let (what, model) = match args {
        ["generate", m, _] => ("generate", m),
        ["load", m] => ("load", m),
        ["load", m, "--phase"] => ("load-phase", m),
        ["load", m, "--phase", "--threads=4"] => ("load-phase-4", m),
        _ => unreachable!(),
    };
    c.env("EDGEPOOL_TEST_TRACT", what).env("EDGEPOOL_TEST_MODEL", model);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    // The harness prints the test name on the same line as our output.
    match text.find("allocator=") {
        Some(at) => text[at..].lines().next().unwrap().to_owned(),
        None => text,
    }
}

fn get<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("{key} in {line}"))
}

fn num(line: &str, key: &str) -> usize {
    get(line, key).parse().unwrap()
}

#[test]
fn tract_loads_a_unet_with_less_memory_after_the_phase() {
    let dir = std::env::temp_dir().join(format!("edgepool-tract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("unet.onnx");
    let model = model.to_str().unwrap();
    run(&["generate", model, "6"], &[]);
    let system = run(&["load", model], &[("EDGEPOOL_ALLOCATOR", "system")]);
    let plain = run(&["load", model], &[]);
    let phase = run(&["load", model, "--phase"], &[]);
    eprintln!("{system}\n{plain}\n{phase}");
    // Same inference output whatever the allocator.
    for line in [&plain, &phase] {
        assert_eq!(get(line, "out_sum"), get(&system, "out_sum"));
        assert_eq!(get(line, "out_first"), get(&system, "out_first"));
    }
    // The phase lowers RSS right after loading.
    let (rss_plain, rss_phase) = (num(&plain, "rss_after_load"), num(&phase, "rss_after_load"));
    assert!(rss_phase < rss_plain, "RSS after load: {rss_phase} with the phase, {rss_plain} without");
    // The report is consistent: what remains held after the phase is what the phase began with plus
    // its survivors (and at most a few partly used slabs); what it let go was really released.
    let (before, after, peak) =
        (num(&phase, "phase_os_before"), num(&phase, "phase_os_after"), num(&phase, "phase_peak"));
    let (survivors, released) = (num(&phase, "phase_survivors"), num(&phase, "phase_released"));
    assert!(released > 0, "{phase}");
    assert!(survivors >= 6 << 20, "the weights survive loading: {phase}");
    assert!(survivors <= peak - before, "{phase}");
    assert!(
        after <= before + survivors + (4 << 20),
        "held after the phase {after} > before {before} + survivors {survivors}: {phase}"
    );
    assert!(num(&phase, "phase_allocations") > 1000);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Four threads load the model at once under one process-wide phase: every thread's model computes
/// the single-threaded run's output (the loader checks the four against each other), the phase
/// counts the four loads' allocations, and the heap's invariants hold afterwards.
#[test]
fn four_threads_load_at_once_under_a_process_wide_phase() {
    let dir = std::env::temp_dir().join(format!("edgepool-tract4-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("unet.onnx");
    let model = model.to_str().unwrap();
    run(&["generate", model, "6"], &[]);
    let one = run(&["load", model, "--phase"], &[]);
    let four = run(&["load", model, "--phase", "--threads=4"], &[]);
    eprintln!("{one}\n{four}");
    assert_eq!(get(&four, "threads"), "4");
    assert_eq!(get(&four, "out_sum"), get(&one, "out_sum"));
    assert_eq!(get(&four, "out_first"), get(&one, "out_first"));
    // Four loads allocate about four times as often as one.
    let (a1, a4) = (num(&one, "phase_allocations"), num(&four, "phase_allocations"));
    assert!(a4 > 3 * a1, "allocations in the phase: {a1} for one load, {a4} for four");
    // Each model's weights survive: four times one load's survivors, give or take partly used slabs.
    let (s1, s4) = (num(&one, "phase_survivors"), num(&four, "phase_survivors"));
    assert!(s4 >= 4 * s1 - (4 << 20), "survivors: {s1} for one load, {s4} for four");
    std::fs::remove_dir_all(&dir).unwrap();
}
