"""onnxruntime with edgepool's load phase switched through ctypes around InferenceSession(...).
Prints the phase report and the inference output. Usage: python ort_phase.py MODEL_PATH"""
import ctypes
import sys

import numpy as np
import onnxruntime as ort


class Report(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in (
        "allocations", "peak_bytes", "survivor_bytes", "released_bytes", "os_bytes_before", "os_bytes_after", "duration_ns")]


lib = ctypes.CDLL(None)  # the preloaded libedgepool.so is part of the process
lib.edgepool_load_end.argtypes = [ctypes.POINTER(Report)]
path = sys.argv[1]
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
lib.edgepool_load_begin()
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
r = Report()
assert lib.edgepool_load_end(ctypes.byref(r)) == 0
print("REPORT", " ".join(f"{n}={getattr(r, n)}" for n, _ in Report._fields_), file=sys.stderr)
x = np.random.default_rng(99).standard_normal((1, 3, 64, 64)).astype(np.float32)
y = sess.run(None, {"X": x})[0]
print(" ".join(repr(float(v)) for v in y.ravel()))
