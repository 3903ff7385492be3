"""A preloaded Python run for the memory curve (EDGEPOOL_CURVE): 60 ms of steady state, a load phase
that builds and drops 150 MB of temporaries and keeps 20 MB, then 100 ms after it."""
import time

import edgepool

time.sleep(0.06)
with edgepool.load_phase() as phase:
    temps = [bytearray(1 << 20) for _ in range(150)]
    for t in temps:
        t[::4096] = b"x" * len(t[::4096])
    keep = [bytes(1000) for _ in range(20000)]
    time.sleep(0.05)
    del temps
time.sleep(0.1)
print("released", phase.report.released_bytes, "kept", len(keep))
