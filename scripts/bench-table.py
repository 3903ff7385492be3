#!/usr/bin/env python3
"""Prints the allocator comparison table from criterion's results (target/criterion).

Run `cargo bench --bench alloc` first. For each benchmark: the median time of every allocator, and
edgepool's ratio to the system allocator and to mimalloc (below 1.0 = edgepool faster).
"""
import json
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "criterion")
ALLOCS = ["system", "mimalloc", "jemalloc", "edgepool"]


def median_ns(group, alloc, bench_id):
    path = os.path.join(ROOT, group, alloc, bench_id, "new", "estimates.json")
    try:
        with open(path) as f:
            return json.load(f)["median"]["point_estimate"]
    except (OSError, KeyError, ValueError):
        return None


def fmt(ns):
    if ns is None:
        return "–"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.2f} µs"
    return f"{ns:.2f} ns"


def main():
    if not os.path.isdir(ROOT):
        sys.exit("no criterion results: run `cargo bench --bench alloc` first")
    rows = []
    for group in sorted(os.listdir(ROOT)):
        gdir = os.path.join(ROOT, group)
        sysdir = os.path.join(gdir, "system")
        if not os.path.isdir(sysdir):
            continue
        ids = sorted(os.listdir(sysdir), key=lambda s: (len(s), s))
        for bench_id in ids:
            if bench_id == "report":
                continue
            t = {a: median_ns(group, a, bench_id) for a in ALLOCS}
            if t["edgepool"] is None:
                continue
            rows.append((f"{group}/{bench_id}", t))
    print("| benchmark | system | mimalloc | jemalloc | edgepool | edgepool ÷ system | edgepool ÷ mimalloc |")
    print("|---|---|---|---|---|---|---|")
    for name, t in rows:
        r_sys = t["edgepool"] / t["system"] if t["system"] else float("nan")
        r_mi = t["edgepool"] / t["mimalloc"] if t["mimalloc"] else float("nan")
        print(f"| {name} | {fmt(t['system'])} | {fmt(t['mimalloc'])} | {fmt(t['jemalloc'])} | "
              f"{fmt(t['edgepool'])} | {r_sys:.2f} | {r_mi:.2f} |")


if __name__ == "__main__":
    main()
