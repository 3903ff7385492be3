#!/usr/bin/env python3
"""Read versus mmap: load time and peak RSS of loading the same model with tract (on edgepool, with the
load phase) when the file is read into a buffer (`tract_load load --read`: std::fs::read, then decode)
and when it is mapped with edgepool::MappedModel (with and without `populate()` ahead of parsing),
with the file evicted from the page cache first (posix_fadvise DONTNEED) and warm. Runs alternate;
prints medians and the ratio of each to reading.

    python3 scripts/read-vs-mmap.py [--mb 128] [--rounds 5]
"""
import argparse
import os
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path):
    """Fraction of the file's pages in the page cache (mincore over a fresh mapping), to check eviction."""
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    size = os.path.getsize(path)
    pages = (size + 4095) // 4096
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        vec = (ctypes.c_ubyte * pages)()
        rc = libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vec) / pages if rc == 0 else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default="/tmp/edgepool-read-vs-mmap")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "--example", "tract_load", "-p", "edgepool"], cwd=ROOT, check=True)
    tract = os.path.join(ROOT, "target", "release", "examples", "tract_load")
    os.makedirs(a.dir, exist_ok=True)
    model = os.path.join(a.dir, f"unet-{a.mb}.onnx")
    if not os.path.exists(model):
        subprocess.run([tract, "generate", model, str(a.mb)], check=True, stdout=subprocess.DEVNULL)
    ways = [("read into a buffer", ["--read"]), ("MappedModel", []), ("MappedModel + populate()", ["--populate"])]
    res = {(c, w): [] for c in ("evicted", "warm") for w, _ in ways}
    left = []
    for r in range(a.rounds):
        for c in ("evicted", "warm"):
            for k in range(len(ways)):
                w, flags = ways[(k + r) % len(ways)]
                if c == "evicted":
                    evict(model)
                    left.append(resident_fraction(model))
                else:
                    subprocess.run(["cat", model], stdout=subprocess.DEVNULL, check=True)
                env = dict(os.environ)
                env.pop("LD_PRELOAD", None)
                out = subprocess.run([tract, "load", model, "--phase"] + flags, env=env, capture_output=True, text=True)
                if out.returncode != 0:
                    raise SystemExit(out.stderr)
                res[(c, w)].append(parse(out.stdout.strip().splitlines()[-1]))
    size = os.path.getsize(model)
    print(f"model: U-Net, {size / 2**20:.0f} MiB file; tract on edgepool with the load phase; {a.rounds} rounds; medians")
    print(f"eviction check: at most {max(left) * 100:.1f} % of the file's pages were still cached before an evicted run\n")
    print("| page cache | how | load time | ÷ read | peak RSS while loading | ÷ read |")
    print("|---|---|---|---|---|---|")
    for c in ("evicted", "warm"):
        base_t = statistics.median(float(x["load_ms"]) for x in res[(c, ways[0][0])])
        base_p = statistics.median(float(x["peak_rss"]) for x in res[(c, ways[0][0])])
        for w, _ in ways:
            t = statistics.median(float(x["load_ms"]) for x in res[(c, w)])
            p = statistics.median(float(x["peak_rss"]) for x in res[(c, w)])
            print(f"| {c} | {w} | {t:.0f} ms | {t / base_t:.2f} | {p / 2**20:.0f} MiB | {p / base_p:.2f} |")


if __name__ == "__main__":
    main()
