"""onnxruntime under LD_PRELOAD: builds a small convolutional ONNX model with the `onnx` package
(weights from a fixed seed), creates an InferenceSession and runs one inference. Prints the outputs
in full precision. Usage: python ort_infer.py MODEL_PATH"""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

path = sys.argv[1]
rng = np.random.default_rng(1234)
inits, nodes = [], []


def const(name, arr):
    inits.append(numpy_helper.from_array(arr.astype(np.float32), name))
    return name


x, c = "X", 3
for i, co in enumerate([16, 32, 64, 64]):
    w = const(f"w{i}", rng.standard_normal((co, c, 3, 3)) * 0.2)
    b = const(f"b{i}", rng.standard_normal(co) * 0.1)
    nodes.append(helper.make_node("Conv", [x, w, b], [f"c{i}"], pads=[1, 1, 1, 1], strides=[2 if i else 1] * 2))
    nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"]))
    x, c = f"r{i}", co
nodes.append(helper.make_node("GlobalAveragePool", [x], ["g"]))
nodes.append(helper.make_node("Flatten", ["g"], ["f"]))
wf = const("wf", rng.standard_normal((c, 10)) * 0.1)
nodes.append(helper.make_node("MatMul", ["f", wf], ["m"]))
nodes.append(helper.make_node("Softmax", ["m"], ["Y"], axis=1))
graph = helper.make_graph(
    nodes, "edgepool_ort_test",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 3, 64, 64])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 10])],
    initializer=inits,
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
onnx.checker.check_model(model)
onnx.save(model, path)

opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
inp = np.random.default_rng(99).standard_normal((1, 3, 64, 64)).astype(np.float32)
y = sess.run(None, {"X": inp})[0]
print(ort.__version__.split(".")[0], y.shape)
print(" ".join(repr(float(v)) for v in y.ravel()))
