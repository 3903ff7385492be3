//! The tract loader shared by `examples/tract_load.rs` and `tests/tract_phase.rs`: a switch
//! allocator (glibc's malloc or edgepool, chosen once from `EDGEPOOL_ALLOCATOR`), a U-Net generator
//! written with tract's own ONNX protobuf types, and the measured load.
#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use prost::Message;
use tract_onnx::pb;
use tract_onnx::prelude::*;

static EDGEPOOL: edgepool::EdgePool = edgepool::EdgePool::new();
static CHOICE: AtomicU8 = AtomicU8::new(0);

/// System or edgepool, decided once at the first allocation from `EDGEPOOL_ALLOCATOR` (scanning the
/// environment without allocating).
pub struct Switch;

#[inline]
pub fn use_system() -> bool {
    let mut c = CHOICE.load(Ordering::Relaxed);
    if c == 0 {
        c = 2;
        edgepool::os::for_each_option(|name, value| {
            if name == b"ALLOCATOR" && value == b"system" {
                c = 1;
            }
        });
        CHOICE.store(c, Ordering::Relaxed);
    }
    c == 1
}

// SAFETY: forwards every call to one allocator, the same for the whole run.
unsafe impl GlobalAlloc for Switch {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe {
            if use_system() {
                System.alloc(l)
            } else {
                EDGEPOOL.alloc(l)
            }
        }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded to the allocator that made `p`.
        unsafe {
            if use_system() {
                System.dealloc(p, l)
            } else {
                EDGEPOOL.dealloc(p, l)
            }
        }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded.
        unsafe {
            if use_system() {
                System.alloc_zeroed(l)
            } else {
                EDGEPOOL.alloc_zeroed(l)
            }
        }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        // SAFETY: forwarded to the allocator that made `p`.
        unsafe {
            if use_system() {
                System.realloc(p, l, n)
            } else {
                EDGEPOOL.realloc(p, l, n)
            }
        }
    }
}

fn rng(state: &mut u64) -> f32 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    ((*state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

fn tensor(name: &str, dims: &[i64], seed: &mut u64, scale: f32) -> pb::TensorProto {
    let n: i64 = dims.iter().product();
    let mut raw = Vec::with_capacity(n as usize * 4);
    for _ in 0..n {
        raw.extend_from_slice(&(rng(seed) * scale).to_le_bytes());
    }
    pb::TensorProto { name: name.into(), dims: dims.to_vec(), data_type: 1, raw_data: raw, ..Default::default() }
}

fn ints(name: &str, v: &[i64]) -> pb::AttributeProto {
    pb::AttributeProto { name: name.into(), r#type: 7, ints: v.to_vec(), ..Default::default() }
}

fn value_info(name: &str, dims: &[i64]) -> pb::ValueInfoProto {
    use pb::tensor_shape_proto::{dimension::Value as D, Dimension};
    let shape = pb::TensorShapeProto {
        dim: dims.iter().map(|&d| Dimension { value: Some(D::DimValue(d)), ..Default::default() }).collect(),
    };
    pb::ValueInfoProto {
        name: name.into(),
        r#type: Some(pb::TypeProto {
            value: Some(pb::type_proto::Value::TensorType(pb::type_proto::Tensor { elem_type: 1, shape: Some(shape) })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Builds a graph node by node, numbering the tensors.
struct Builder {
    g: pb::GraphProto,
    seed: u64,
    n: usize,
}

impl Builder {
    fn conv(&mut self, x: &str, cin: i64, cout: i64, k: i64, relu: bool) -> String {
        self.n += 1;
        let n = self.n;
        let (w, b, y) = (format!("w{n}"), format!("b{n}"), format!("c{n}"));
        self.g.initializer.push(tensor(&w, &[cout, cin, k, k], &mut self.seed, (2.0 / (cin * k * k) as f32).sqrt()));
        self.g.initializer.push(tensor(&b, &[cout], &mut self.seed, 0.0));
        let pad = k / 2;
        self.g.node.push(pb::NodeProto {
            op_type: "Conv".into(),
            input: vec![x.into(), w, b],
            output: vec![y.clone()],
            attribute: vec![ints("pads", &[pad, pad, pad, pad]), ints("kernel_shape", &[k, k])],
            ..Default::default()
        });
        if !relu {
            return y;
        }
        let r = format!("r{n}");
        self.g.node.push(pb::NodeProto {
            op_type: "Relu".into(),
            input: vec![y],
            output: vec![r.clone()],
            ..Default::default()
        });
        r
    }

    fn node(&mut self, op: &str, inputs: Vec<String>, output: &str, attribute: Vec<pb::AttributeProto>) {
        self.g.node.push(pb::NodeProto {
            op_type: op.into(),
            input: inputs,
            output: vec![output.into()],
            attribute,
            ..Default::default()
        });
    }
}

/// A U-Net: 4 levels of two 3×3 convolutions (channels c, 2c, 4c, 8c; bottleneck 16c), max-pooling
/// down, transposed convolutions up, skip concatenations. Input 1×3×32×32, output 1×1×32×32.
fn unet(c: i64, seed: u64) -> pb::ModelProto {
    let mut b = Builder { g: pb::GraphProto { name: "unet".into(), ..Default::default() }, seed, n: 0 };
    let mut x = "input".to_string();
    let mut cin = 3;
    let mut skips = vec![];
    for level in 0..4 {
        let ch = c << level;
        x = b.conv(&x, cin, ch, 3, true);
        x = b.conv(&x, ch, ch, 3, true);
        skips.push((x.clone(), ch));
        let p = format!("pool{level}");
        b.node("MaxPool", vec![x], &p, vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])]);
        x = p;
        cin = ch;
    }
    x = b.conv(&x, cin, c * 16, 3, true);
    x = b.conv(&x, c * 16, c * 16, 3, true);
    cin = c * 16;
    for (level, (skip, ch)) in skips.into_iter().enumerate().rev() {
        let (w, bias, up, cat) =
            (format!("uw{level}"), format!("ub{level}"), format!("up{level}"), format!("cat{level}"));
        b.g.initializer.push(tensor(&w, &[cin, ch, 2, 2], &mut b.seed, (1.0 / cin as f32).sqrt()));
        b.g.initializer.push(tensor(&bias, &[ch], &mut b.seed, 0.0));
        b.node("ConvTranspose", vec![x, w, bias], &up, vec![ints("kernel_shape", &[2, 2]), ints("strides", &[2, 2])]);
        let axis = pb::AttributeProto { name: "axis".into(), r#type: 2, i: 1, ..Default::default() };
        b.node("Concat", vec![up, skip], &cat, vec![axis]);
        x = b.conv(&cat, ch * 2, ch, 3, true);
        x = b.conv(&x, ch, ch, 3, true);
        cin = ch;
    }
    b.conv(&x, cin, 1, 1, false);
    b.g.node.last_mut().unwrap().output = vec!["output".into()];
    b.g.input.push(value_info("input", &[1, 3, 32, 32]));
    b.g.output.push(value_info("output", &[1, 1, 32, 32]));
    pb::ModelProto {
        ir_version: 7,
        opset_import: vec![pb::OperatorSetIdProto { domain: String::new(), version: 13 }],
        producer_name: "edgepool".into(),
        graph: Some(b.g),
        ..Default::default()
    }
}

fn weight_bytes(m: &pb::ModelProto) -> usize {
    m.graph.as_ref().unwrap().initializer.iter().map(|t| t.raw_data.len()).sum()
}

/// A U-Net whose weights total at least `mb` MB: the smallest base width that reaches it.
pub fn generate(path: &str, mb: usize) {
    let mut c = 4;
    loop {
        let m = unet(c, 0x5EED);
        if weight_bytes(&m) >= mb << 20 || c > 4096 {
            std::fs::write(path, m.encode_to_vec()).unwrap();
            println!("wrote {path}: base width {c}, {} weight bytes", weight_bytes(&m));
            return;
        }
        c += 4;
    }
}

fn status_kb(key: &str) -> usize {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)).unwrap().parse().unwrap()
}

/// Loads the model, runs one inference, and prints one line of `key=value` figures.
pub fn load(path: &str, phase: bool) -> TractResult<()> {
    load_with(path, phase.then_some(edgepool::PhaseMode::Segregated))
}

/// A counter exported by `scripts/live-heap.c` when that tracer is preloaded (`None` otherwise).
fn live_heap(name: &std::ffi::CStr) -> Option<usize> {
    // SAFETY: dlsym with a NUL-terminated name; a symbol it finds is the tracer's `size_t f(void)`.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr());
        (!f.is_null()).then(|| core::mem::transmute::<*mut libc::c_void, extern "C" fn() -> usize>(f)())
    }
}

/// As [`load`], with the load phase in `mode` (or none).
pub fn load_with(path: &str, mode: Option<edgepool::PhaseMode>) -> TractResult<()> {
    let rss_before_kb = status_kb("VmRSS:");
    let heap_before = live_heap(c"live_heap_bytes");
    let t0 = Instant::now();
    let guard = mode.map(edgepool::load_phase_with);
    let model = tract_onnx::onnx()
        .model_for_path(path)?
        .with_input_fact(0, f32::fact([1, 3, 32, 32]).into())?
        .into_optimized()?
        .into_runnable()?;
    let report = guard.map(|g| g.finish());
    let load_ms = t0.elapsed().as_secs_f64() * 1e3;
    let peak_kb = status_kb("VmHWM:");
    let after_kb = status_kb("VmRSS:");
    let heap_peak = live_heap(c"live_heap_peak");
    let mut seed = 99u64;
    let input: Tensor = tract_ndarray::Array4::from_shape_fn((1, 3, 32, 32), |_| rng(&mut seed)).into();
    let t1 = Instant::now();
    let out = model.run(tvec!(input.into()))?;
    let infer_ms = t1.elapsed().as_secs_f64() * 1e3;
    let view = out[0].to_plain_array_view::<f32>()?;
    let sum: f64 = view.iter().map(|&v| v as f64).sum();
    let first: Vec<String> = view.iter().take(4).map(|v| format!("{v:e}")).collect();
    let alloc = match (use_system(), mode) {
        (true, _) => "system",
        (false, Some(edgepool::PhaseMode::Arena)) => "edgepool+arena",
        (false, Some(_)) => "edgepool+phase",
        (false, None) => "edgepool",
    };
    print!(
        "allocator={alloc} load_ms={load_ms:.1} infer_ms={infer_ms:.1} peak_rss={} rss_after_load={} rss_before={} out_sum={sum:e} out_first={}",
        peak_kb * 1024,
        after_kb * 1024,
        rss_before_kb * 1024,
        first.join(",")
    );
    if let (Some(b), Some(p)) = (heap_before, heap_peak) {
        print!(" heap_before={b} heap_peak={p}");
    }
    if let Some(r) = report {
        print!(
            " phase_allocations={} phase_peak={} phase_survivors={} phase_released={} phase_os_before={} phase_os_after={}",
            r.allocations, r.peak_bytes, r.survivor_bytes, r.released_bytes, r.os_bytes_before, r.os_bytes_after
        );
    }
    println!();
    Ok(())
}
