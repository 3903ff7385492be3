//! Plans every dataset of `../shared/plan-data` (lifetime CSVs of real networks), asserts that each
//! plan is valid, and that the default strategy reaches the lower bound on all of them.

use std::path::PathBuf;

use edgepool::plan::{self, Budget, Strategy, Tensor};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join("shared").join("plan-data")
}

fn load(name: &str) -> Vec<Tensor> {
    let text = std::fs::read_to_string(data_dir().join(format!("{name}.csv"))).unwrap();
    text.lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            Tensor::new(f[0], f[1].parse().unwrap(), f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect()
}

#[test]
fn every_dataset_planned_valid_and_default_reaches_the_bound() {
    // (dataset, lower bound and naive total from the dataset README)
    let expected = [
        ("mobilenet_v2_224", 6_021_120u64, 28_197_228u64),
        ("unet_512", 268_435_456, 925_892_608),
        ("deeplabv3_mnv2_513", 35_152_000, 402_680_476),
    ];
    for (name, bound, naive) in expected {
        let ts = load(name);
        for s in Strategy::ALL {
            let p = plan::plan_with(&ts, s, Budget::default()).unwrap();
            plan::validate(&ts, &p.offsets, p.arena_size).unwrap();
            assert_eq!(p.lower_bound, bound, "{name}");
            assert_eq!(p.naive_total, naive, "{name}");
            assert!(p.arena_size >= bound);
        }
        let p = plan::plan(&ts).unwrap();
        assert_eq!(p.arena_size, p.lower_bound, "{name}: default strategy missed the bound");
    }
    // The DeepLab case is where greedy alone falls short (the dataset README: bound + 7.7 %).
    let ts = load("deeplabv3_mnv2_513");
    let g = plan::plan_with(&ts, Strategy::GreedyBySize, Budget::default()).unwrap();
    assert!(g.arena_size > g.lower_bound, "greedy by size was expected to miss the DeepLab bound");
}
