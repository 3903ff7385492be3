//! The planner reads an ONNX model (feature `onnx`): a U-Net written by the test with tract's
//! protobuf types, its intermediate tensors from tract's type inference and evaluation order.

#[path = "../../tests/common/unet.rs"]
mod unet;

use std::process::Command;

use edgepool::plan::{self, Strategy};

#[test]
fn plans_the_intermediate_tensors_of_an_onnx_unet() {
    let dir = std::env::temp_dir().join(format!("edgepool-plan-onnx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("unet.onnx");
    unet::generate(model.to_str().unwrap(), 2);
    let ts = edgepool_plan::onnx::tensors_from_onnx(&model, None).unwrap();
    // 4 levels x (2 convs + 2 relus + pool), bottleneck 2x(conv+relu), 4 x (convT, concat, 2x(conv+relu)),
    // the final conv, and the input: 20 + 4 + 24 + 1 + 1.
    assert_eq!(ts.len(), 50, "{:?}", ts.iter().map(|t| &t.id).collect::<Vec<_>>());
    // The 32x32 input is 3 channels of f32, live from op 0.
    let input = ts.iter().find(|t| t.id.starts_with("input")).unwrap();
    assert_eq!((input.size, input.first), (3 * 32 * 32 * 4, 0));
    let last = ts.iter().map(|t| t.last).max().unwrap();
    let output = ts.iter().find(|t| t.id.starts_with("output") || t.last == last && t.size == 32 * 32 * 4).unwrap();
    assert_eq!(output.last, last);
    // Skip connections live across the whole decoder: the first level's output lives long.
    assert!(ts.iter().any(|t| t.last - t.first > 20), "no long-lived skip tensor");
    for s in Strategy::ALL {
        let p = plan::plan_with(&ts, s, plan::Budget::default()).unwrap();
        plan::validate(&ts, &p.offsets, p.arena_size).unwrap();
        assert!(p.arena_size >= p.lower_bound && p.arena_size < p.naive_total);
    }
    // The command line reads it too.
    let out = Command::new(env!("CARGO_BIN_EXE_edgepool-plan")).arg("--json").arg(&model).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let json = String::from_utf8(out.stdout).unwrap();
    assert!(json.contains("\"tensors\":50"), "{json}");
    std::fs::remove_dir_all(&dir).unwrap();
}
