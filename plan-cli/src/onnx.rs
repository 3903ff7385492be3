//! Reads the intermediate tensors of an ONNX model (behind the `onnx` feature), through tract-onnx:
//! shapes from tract's type inference, op order from its evaluation order.
//!
//! Each node of the evaluation order that does not derive from constants alone (weights, and what
//! tract computes from them) is one op; graph inputs are live from op 0. A tensor is live from the op that produces it through the last op
//! that reads it; graph outputs live to the last op.
#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::Path;

use tract_onnx::prelude::*;
use tract_onnx::tract_core::ops::konst::Const;

use edgepool::plan::Tensor;

/// The intermediate tensors of the ONNX model at `path`. `input_shape`, if given, fixes the shape of
/// the model's first input, as `f32` (for models with symbolic dimensions such as a batch size).
pub fn tensors_from_onnx(path: &Path, input_shape: Option<&[usize]>) -> Result<Vec<Tensor>, String> {
    let err = |e: TractError| format!("{}: {e:#}", path.display());
    let mut model = tract_onnx::onnx().model_for_path(path).map_err(err)?;
    if let Some(shape) = input_shape {
        model = model.with_input_fact(0, InferenceFact::dt_shape(f32::datum_type(), shape)).map_err(err)?;
    }
    let typed = model.into_typed().map_err(err)?;
    let order = typed.eval_order().map_err(err)?;
    let inputs: Vec<usize> = typed.input_outlets().map_err(err)?.iter().map(|o| o.node).collect();
    // Constant-derived nodes (weights, and what tract computes from weights alone: reshaped biases,
    // rearranged kernels) are not intermediates. In evaluation order a node's inputs come first.
    let mut constant = vec![false; typed.nodes().len()];
    for &id in &order {
        let node = typed.node(id);
        constant[id] = node.op_is::<Const>()
            || (!inputs.contains(&id) && !node.inputs.is_empty() && node.inputs.iter().all(|i| constant[i.node]));
    }
    // Op index of each other node, in evaluation order.
    let mut op_of: HashMap<usize, u32> = HashMap::new();
    let mut ops = 0u32;
    for &id in &order {
        if !constant[id] {
            op_of.insert(id, ops);
            ops += 1;
        }
    }
    let last_op = ops.saturating_sub(1);
    let outputs = typed.output_outlets().map_err(err)?.to_vec();
    let mut tensors = Vec::new();
    for &id in &order {
        let Some(&op) = op_of.get(&id) else { continue };
        let node = typed.node(id);
        for slot in 0..node.outputs.len() {
            let outlet = OutletId::new(id, slot);
            let fact = typed.outlet_fact(outlet).map_err(err)?;
            let Some(shape) = fact.shape.as_concrete() else {
                return Err(format!(
                    "{}: tensor {}:{slot} has a symbolic shape {:?}; pass --input-shape",
                    path.display(),
                    node.name,
                    fact.shape
                ));
            };
            let size = (shape.iter().product::<usize>() * fact.datum_type.size_of()) as u64;
            let first = if inputs.contains(&id) { 0 } else { op };
            let mut last = typed
                .outlet_successors(outlet)
                .iter()
                .filter_map(|s| op_of.get(&s.node))
                .copied()
                .max()
                .unwrap_or(first);
            if outputs.contains(&outlet) {
                last = last_op;
            }
            tensors.push(Tensor::new(format!("{}:{slot}", node.name), size, first, last.max(first)));
        }
    }
    if tensors.is_empty() {
        return Err(format!("{}: no intermediate tensors", path.display()));
    }
    Ok(tensors)
}
