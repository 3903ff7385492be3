"""Loads an ONNX model with onnxruntime and reports memory and time, for scripts/load-bench.py.
Usage: python ort_load.py MODEL.onnx [--phase] [--threads=N]
--phase wraps InferenceSession(...) in edgepool's load phase (libedgepool.so must be preloaded);
--threads=N creates N sessions at once from N Python threads (onnxruntime releases the GIL while it
loads), runs each once and checks that their outputs are equal.
Prints one line: load_ms infer_ms peak_rss rss_after_load rss_before out_sum, and heap_before and
heap_peak when scripts/live-heap.c is preloaded."""
import ctypes
import sys
import threading
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
threads = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--threads=")), 1)
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
lib = ctypes.CDLL(None)
tracer = hasattr(lib, "live_heap_bytes")
if tracer:
    lib.live_heap_bytes.restype = lib.live_heap_peak.restype = ctypes.c_size_t
rss_before = status("VmRSS:")
heap_before = lib.live_heap_bytes() if tracer else None
t0 = time.perf_counter()
if phase:
    lib.edgepool_load_begin()
sessions = [None] * threads


def make(i):
    sessions[i] = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])


if threads == 1:
    make(0)
else:
    ts = [threading.Thread(target=make, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert all(s is not None for s in sessions), "a session failed to load"
sess = sessions[0]
if phase:
    assert lib.edgepool_load_end(None) == 0
load_ms = (time.perf_counter() - t0) * 1e3
peak, after = status("VmHWM:"), status("VmRSS:")
heap = f" heap_before={heap_before} heap_peak={lib.live_heap_peak()}" if tracer else ""
x = np.random.default_rng(99).standard_normal((1, 3, 32, 32)).astype(np.float32)
t1 = time.perf_counter()
y = sess.run(None, {"input": x})[0]
infer_ms = (time.perf_counter() - t1) * 1e3
for other in sessions[1:]:
    assert np.array_equal(other.run(None, {"input": x})[0], y), "sessions compute different outputs"
print(f"threads={threads} load_ms={load_ms:.1f} infer_ms={infer_ms:.1f} peak_rss={peak} rss_after_load={after} rss_before={rss_before} "
      f"out_sum={float(y.sum()):e}{heap}")
