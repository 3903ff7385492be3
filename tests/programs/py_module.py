"""python/edgepool.py with onnxruntime: a session created inside edgepool.load_phase(), then stats,
trim, prefault_free and the budget. Prints one line of results. Usage: python py_module.py MODEL_PATH"""
import ctypes
import sys

import numpy as np
import onnxruntime as ort

import edgepool

before = edgepool.stats()
opts = ort.SessionOptions()
opts.intra_op_num_threads = 2
with edgepool.load_phase() as phase:
    sess = ort.InferenceSession(sys.argv[1], opts, providers=["CPUExecutionProvider"])
r = phase.report
x = np.random.default_rng(99).standard_normal((1, 3, 64, 64)).astype(np.float32)
y = sess.run(None, {"X": x})[0]
after = edgepool.stats()
# A known workload through the C allocator: 500 blocks of 100 bytes are 128-byte slots in use.
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
c128 = [c["size"] for c in after["classes"]].index(128)
s0 = edgepool.stats()["classes"][c128]
blocks = [libc.malloc(100) for _ in range(500)]
s1 = edgepool.stats()["classes"][c128]
for b in blocks:
    libc.free(b)
s2 = edgepool.stats()["classes"][c128]
slots = (s1["slots_in_use"] - s0["slots_in_use"], s2["slots_in_use"] - s0["slots_in_use"])
trimmed = edgepool.trim()
warmed = edgepool.prefault_free(8 << 20)
edgepool.prefault_free(0)
edgepool.set_limit(after["os_bytes"] + (1 << 20))
try:
    big = bytearray(512 << 20)
    refused = False
except MemoryError:
    refused = True
edgepool.set_limit(0)
print(
    f"version={edgepool.version()} allocations={r.allocations} peak={r.peak_bytes} survivors={r.survivor_bytes} "
    f"released={r.released_bytes} large_allocs={after['large_allocs'] - before['large_allocs']} "
    f"fields={len(after)} classes={len(after['classes'])} slots={slots[0]},{slots[1]} "
    f"fragmentation={after['fragmentation']:.3f} trimmed={trimmed} warmed={warmed} refused={refused} out={float(y.ravel()[0])!r}"
)
