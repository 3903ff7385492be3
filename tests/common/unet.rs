//! A U-Net-style ONNX model with random weights, written with tract's own ONNX protobuf types: the
//! model every loading test, example and benchmark uses (generated, never committed).
#![allow(dead_code)]

use prost::Message;
use tract_onnx::pb;

/// A xorshift step mapped to [-1, 1).
pub fn rng(state: &mut u64) -> f32 {
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
