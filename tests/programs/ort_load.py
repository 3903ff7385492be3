"""Loads an ONNX model with onnxruntime and reports memory and time, for scripts/load-bench.py.
Usage: python ort_load.py MODEL.onnx [--phase]
--phase wraps InferenceSession(...) in edgepool's load phase (libedgepool.so must be preloaded).
Prints one line: load_ms infer_ms peak_rss rss_after_load out_sum."""
import ctypes
import sys
import time

import numpy as np
import onnxruntime as ort


def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    return 0


path = sys.argv[1]
phase = "--phase" in sys.argv
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
lib = ctypes.CDLL(None) if phase else None
t0 = time.perf_counter()
if phase:
    lib.edgepool_load_begin()
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
if phase:
    assert lib.edgepool_load_end(None) == 0
load_ms = (time.perf_counter() - t0) * 1e3
peak, after = status("VmHWM:"), status("VmRSS:")
x = np.random.default_rng(99).standard_normal((1, 3, 32, 32)).astype(np.float32)
t1 = time.perf_counter()
y = sess.run(None, {"input": x})[0]
infer_ms = (time.perf_counter() - t1) * 1e3
print(f"load_ms={load_ms:.1f} infer_ms={infer_ms:.1f} peak_rss={peak} rss_after_load={after} out_sum={float(y.sum()):e}")
