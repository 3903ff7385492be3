#!/usr/bin/env python3
"""The model-loading benchmark: peak RSS while loading, RSS right after loading, load time and first
inference time for a U-Net-style ONNX model of about 128 MB of weights (generated, not committed),
loaded with tract (examples/tract_load.rs) and with onnxruntime, under glibc, mimalloc, jemalloc,
tcmalloc, and edgepool without a load phase, with one (segregated slabs), and with one in arena mode. Runs alternate; the model is loaded from
several paths of different lengths (glibc's peak moves with the path string). Prints medians.

    python3 scripts/load-bench.py [--mb 128] [--rounds 3] [--threads N] [--engines tract,onnxruntime]
                                  [--python target/test-venv/bin/python]

--threads N loads the model N times at once from N threads (tract: N loads under one process-wide
phase; onnxruntime: N sessions created from N Python threads), every one checked to compute the same
output; the load time is until all have loaded.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import importlib.util  # noqa: E402

spec = importlib.util.spec_from_file_location("cmp", os.path.join(ROOT, "scripts", "compare-allocators.py"))
cmp = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cmp)


def parse(line):
    return dict(kv.split("=", 1) for kv in line.split() if "=" in kv)


def run(cmd, env):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    e.update(env)
    out = subprocess.run(cmd, env=e, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {out.stderr[-2000:]}")
    return parse(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--python", default=os.path.join(ROOT, "target", "test-venv", "bin", "python"))
    ap.add_argument("--dir", default="/tmp/edgepool-load-bench")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engines", default="tract,onnxruntime")
    ap.add_argument("--paths", type=int, default=3, help="model paths of different lengths (1 to 3)")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "--example", "tract_load", "-p", "edgepool"], cwd=ROOT, check=True)
    edge = cmp.edgepool_lib()
    tracer = os.path.join(ROOT, "target", "live-heap.so")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", tracer, os.path.join(ROOT, "scripts", "live-heap.c")], check=True)
    cmp.ensure_debian(["mimalloc", "jemalloc", "tcmalloc"])
    libs = {n: os.path.join(cmp.LIBDIR, cmp.DEBIAN[n][1]) for n in ("mimalloc", "jemalloc", "tcmalloc")}
    tract = os.path.join(ROOT, "target", "release", "examples", "tract_load")
    os.makedirs(a.dir, exist_ok=True)
    base = os.path.join(a.dir, "unet.onnx")
    if not os.path.exists(base):
        subprocess.run([tract, "generate", base, str(a.mb)], check=True)
    paths = [base]
    for suffix in ("m", "model-with-a-longer-path-name")[:max(0, a.paths - 1)]:
        d = os.path.join(a.dir, suffix)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "unet.onnx")
        if not os.path.exists(p):
            shutil.copy(base, p)
        paths.append(p)
    ort_script = os.path.join(ROOT, "tests", "programs", "ort_load.py")
    # The floor: glibc with the live-heap tracer, once per path.
    floors = {
        "tract": lambda p: ([tract, "load", p], {"EDGEPOOL_ALLOCATOR": "system", "LD_PRELOAD": tracer}),
        "onnxruntime": lambda p: ([a.python, ort_script, p], {"LD_PRELOAD": tracer}),
    }
    configs = {
        "tract": [
            ("system", lambda p: ([tract, "load", p], {"EDGEPOOL_ALLOCATOR": "system"})),
            ("mimalloc", lambda p: ([tract, "load", p], {"EDGEPOOL_ALLOCATOR": "system", "LD_PRELOAD": libs["mimalloc"]})),
            ("jemalloc", lambda p: ([tract, "load", p], {"EDGEPOOL_ALLOCATOR": "system", "LD_PRELOAD": libs["jemalloc"]})),
            ("tcmalloc", lambda p: ([tract, "load", p], {"EDGEPOOL_ALLOCATOR": "system", "LD_PRELOAD": libs["tcmalloc"]})),
            ("edgepool", lambda p: ([tract, "load", p], {})),
            ("edgepool+phase", lambda p: ([tract, "load", p, "--phase"], {})),
            ("edgepool+arena", lambda p: ([tract, "load", p, "--arena"], {})),
        ],
        "onnxruntime": [
            ("system", lambda p: ([a.python, ort_script, p], {})),
            ("mimalloc", lambda p: ([a.python, ort_script, p], {"LD_PRELOAD": libs["mimalloc"]})),
            ("jemalloc", lambda p: ([a.python, ort_script, p], {"LD_PRELOAD": libs["jemalloc"]})),
            ("tcmalloc", lambda p: ([a.python, ort_script, p], {"LD_PRELOAD": libs["tcmalloc"]})),
            ("edgepool", lambda p: ([a.python, ort_script, p], {"LD_PRELOAD": edge})),
            ("edgepool+phase", lambda p: ([a.python, ort_script, p, "--phase"], {"LD_PRELOAD": edge})),
            ("edgepool+arena", lambda p: ([a.python, ort_script, p, "--phase"], {"LD_PRELOAD": edge, "EDGEPOOL_LOAD_ARENA": "1"})),
        ],
    }
    engines = a.engines.split(",")
    configs = {e: c for e, c in configs.items() if e in engines}
    if a.threads > 1:
        t = f"--threads={a.threads}"
        configs = {e: [(n, (lambda make: lambda p: (make(p)[0] + [t], make(p)[1]))(make)) for n, make in cfgs]
                   for e, cfgs in configs.items()}
        floors = {e: (lambda make: lambda p: (make(p)[0] + [t], make(p)[1]))(make) for e, make in floors.items()}
    size = os.path.getsize(base)
    print(f"model: U-Net, {size / 2**20:.0f} MiB file; {a.threads} thread(s) loading; {a.rounds} rounds x {len(paths)} paths; medians")
    for engine, cfgs in configs.items():
        if engine == "onnxruntime" and not os.path.exists(a.python):
            print(f"\nonnxruntime: skipped ({a.python} missing; .ci/run makes it)")
            continue
        res = {n: [] for n, _ in cfgs}
        for r in range(a.rounds):
            for p in paths:
                for n, make in cmp.rotated(cfgs, r):
                    cmd, env = make(p)
                    res[n].append(run(cmd, env))
        fl = []
        for p in paths:
            cmd, env = floors[engine](p)
            x = run(cmd, env)
            fl.append(int(x["rss_before"]) + int(x["heap_peak"]) - int(x["heap_before"]))
        floor = statistics.median(fl)
        print(f"\n{engine}: floor {floor / 2**20:.0f} MiB (RSS before loading + growth of the live heap while "
              f"loading, traced under glibc with scripts/live-heap.c)\n")
        print("| allocator | peak RSS while loading | peak ÷ floor | RSS right after loading | load time | first inference |")
        print("|---|---|---|---|---|---|")
        for n, _ in cfgs:
            med = lambda k: statistics.median(float(x[k]) for x in res[n])
            sums = {x["out_sum"] for x in res[n]}
            print(f"| {n} | {med('peak_rss') / 2**20:.0f} MiB | {med('peak_rss') / floor:.2f} | {med('rss_after_load') / 2**20:.0f} MiB | "
                  f"{med('load_ms'):.0f} ms | {med('infer_ms'):.1f} ms |" + ("" if len(sums) == 1 else f" outputs differ: {sums}"))


if __name__ == "__main__":
    main()
