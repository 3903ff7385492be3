#!/usr/bin/env python3
"""Runs a command and samples its resident set from outside, for allocators without a curve of their
own (glibc, mimalloc, ...), into a CSV that scripts/plot-curve.py reads:

    scripts/sample-rss.py OUT.csv [--label NAME] [--ms 5] -- command args...

Columns: t_ms, rss_bytes (VmRSS of the process, every --ms milliseconds). The command's own output
passes through; the exit status is the command's.
"""
import subprocess
import sys
import time


def rss(pid):
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * 4096
    except (OSError, IndexError, ValueError):
        return None


def main():
    args = sys.argv[1:]
    if "--" not in args or not args:
        sys.exit(__doc__)
    cut = args.index("--")
    opts, cmd = args[:cut], args[cut + 1:]
    out, label, ms = opts[0], None, 5.0
    i = 1
    while i < len(opts):
        if opts[i] == "--label":
            label, i = opts[i + 1], i + 2
        elif opts[i] == "--ms":
            ms, i = float(opts[i + 1]), i + 2
        else:
            sys.exit(f"unknown option {opts[i]}")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd)
    rows = []
    while proc.poll() is None:
        r = rss(proc.pid)
        if r:  # None, or 0 once the process has exited (a zombie has no resident set)
            rows.append((int((time.monotonic() - t0) * 1000), r))
        time.sleep(ms / 1000)
    with open(out, "w") as f:
        if label:
            f.write(f"# label={label}\n")
        f.write("t_ms,rss_bytes\n")
        for t, r in rows:
            f.write(f"{t},{r}\n")
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
