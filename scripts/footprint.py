#!/usr/bin/env python3
"""What each allocator costs a small C program in resident memory: scripts/footprint.c, run under
glibc, edgepool and Debian's mimalloc, jemalloc and tcmalloc (LD_PRELOAD), alternating run by run,
prints the medians of its resident memory by what it belongs to, in KiB, and the total's difference
to glibc's.

    python3 scripts/footprint.py [--rounds 15] [--only a,b] [--lib NAME=PATH]...

--lib adds a library (another build of edgepool, say: `EDGEPOOL_PLAIN_LINK=1 cargo build --release
-p edgepool-cdylib` links it without cdylib/build.rs's two steps).
"""
import argparse
import importlib.util
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("compare", os.path.join(ROOT, "scripts", "compare-allocators.py"))
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

COLUMNS = ["allocator library", "libgcc_s", "libc + ld.so", "program + other libraries", "anonymous + stack", "total", "VmHWM"]


def run_once(exe, lib):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if lib:
        env["LD_PRELOAD"] = lib
    out = subprocess.run([exe], env=env, capture_output=True, text=True)
    fields = out.stdout.split()
    if out.returncode != 0 or len(fields) != 8 or fields[0] != "footprint":
        raise SystemExit(f"footprint failed under {lib or 'glibc'}: {out.stdout}{out.stderr}")
    return [int(x) for x in fields[1:]]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--only", default="system,edgepool,mimalloc,jemalloc,tcmalloc")
    ap.add_argument("--lib", action="append", default=[], metavar="NAME=PATH")
    a = ap.parse_args()
    names = a.only.split(",")
    compare.ensure_debian(names)
    libs = {n: compare.library(n) for n in names}
    for spec in a.lib:
        n, _, path = spec.partition("=")
        if not path or not os.path.exists(path):
            ap.error(f"--lib {spec}: no such file")
        names.append(n)
        libs[n] = os.path.abspath(path)
    exe = compare.compiled("footprint", ["-pthread"])
    compare.uncache(libs.values())
    runs = {n: [] for n in names}
    for r in range(a.rounds):
        for n in compare.rotated(names, r):
            runs[n].append(run_once(exe, libs[n]))
    med = {n: [statistics.median(col) for col in zip(*runs[n])] for n in names}
    base = med["system"][5] if "system" in med else None
    print(f"scripts/footprint.c, medians of {a.rounds} alternating runs, KiB")
    print("| allocator | " + " | ".join(COLUMNS) + " | total − glibc's |")
    print("|---|" + "---|" * (len(COLUMNS) + 1))
    for n in names:
        m = med[n]
        extra = f"{m[5] - base:+.0f}" if base is not None else "-"
        print(f"| {n} | " + " | ".join(f"{x:.0f}" for x in m) + f" | {extra} |")


if __name__ == "__main__":
    sys.exit(main())
