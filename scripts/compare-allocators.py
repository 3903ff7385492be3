#!/usr/bin/env python3
"""Runs one command under several allocators, alternating run by run, and prints each allocator's
median wall time and median peak RSS, with the ratio to the system allocator (glibc).

    python3 scripts/compare-allocators.py [--rounds N] [--only a,b] -- COMMAND ARGS...

Allocators: system (no preload), edgepool (target/release/libedgepool.so, built if needed), and the
Debian packages libmimalloc2.0, libjemalloc2, libtcmalloc-minimal4 (installed with apt-get if missing).
Wall time and peak RSS are measured by scripts/runrss.c around the command: the waited process's
ru_maxrss (the largest of it and the children it waited for).
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBDIR = "/usr/lib/x86_64-linux-gnu"
DEBIAN = {
    "mimalloc": ("libmimalloc2.0", "libmimalloc.so.2"),
    "jemalloc": ("libjemalloc2", "libjemalloc.so.2"),
    "tcmalloc": ("libtcmalloc-minimal4", "libtcmalloc_minimal.so.4"),
}


def ensure_debian(names):
    missing = [DEBIAN[n][0] for n in names if n in DEBIAN and not os.path.exists(os.path.join(LIBDIR, DEBIAN[n][1]))]
    if missing:
        print(f"installing {' '.join(missing)} ...", file=sys.stderr)
        subprocess.run(["apt-get", "update", "-qq"], check=True)
        subprocess.run(["apt-get", "install", "-y", "-qq", *missing], check=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def edgepool_lib():
    lib = os.path.join(ROOT, "target", "release", "libedgepool.so")
    subprocess.run(["cargo", "build", "--release", "-p", "edgepool-cdylib", "-q"], cwd=ROOT, check=True)
    return lib


def library(name):
    """The library to preload for an allocator name: None for the system allocator, the release build
    of libedgepool.so (built if needed) for edgepool, the Debian library for the others."""
    if name == "system":
        return None
    if name == "edgepool":
        return edgepool_lib()
    if name in DEBIAN:
        return os.path.join(LIBDIR, DEBIAN[name][1])
    raise SystemExit(f"unknown allocator {name}")


def uncache(paths):
    """Writes back and drops each library's pages from the page cache (those no running process maps),
    so that the runs map it as a library read from disk. A file just written (a fresh build, a package
    just installed) sits in the page cache in large folios, which the kernel may map whole around a
    touched page: up to 64 KiB more of a library resident in each process than once it is read back.
    Applied to every allocator's library alike."""
    for path in paths:
        if not path:
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def compiled(name, flags=()):
    """scripts/NAME.c compiled with cc -O2 into target/NAME, again only when the source is newer."""
    exe = os.path.join(ROOT, "target", name)
    src = os.path.join(ROOT, "scripts", name + ".c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        os.makedirs(os.path.dirname(exe), exist_ok=True)
        subprocess.run(["cc", "-O2", *flags, "-o", exe, src], check=True)
    return exe


def runrss():
    """The measuring wrapper (scripts/runrss.c), compiled once into target/."""
    return compiled("runrss")


def rotated(names, r):
    """The order of round r: the names rotated by r, so that each goes first in turn (runs alternate,
    and none always runs first or right after another)."""
    k = r % len(names)
    return names[k:] + names[:k]


def run_once(cmd, preload, env_extra):
    """Runs cmd once (under preload if given) and returns (wall seconds, peak RSS bytes)."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
    env.update(env_extra)
    p = subprocess.run([runrss(), *cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.decode(errors="replace")
    last = err.rstrip().rsplit("\n", 1)[-1].split()
    if p.returncode != 0 or len(last) != 4 or last[0] != "runrss" or last[1] != "0":
        raise SystemExit(f"command failed under {preload or 'system'}: {err[-2000:]}")
    return float(last[2]), int(last[3])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="system,edgepool,mimalloc,jemalloc,tcmalloc")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command")
    names = a.only.split(",")
    ensure_debian(names)
    libs = {n: library(n) for n in names}
    uncache(libs.values())
    results = {n: [] for n in names}
    for r in range(a.rounds):
        for n in rotated(names, r):
            results[n].append(run_once(cmd, libs[n], {}))
    base_t = statistics.median(w for w, _ in results["system"]) if "system" in results else None
    base_m = statistics.median(m for _, m in results["system"]) if "system" in results else None
    print(f"command: {' '.join(cmd)}  ({a.rounds} rounds, medians)")
    if a.markdown:
        print("| allocator | wall time | peak RSS | time ÷ system | peak RSS ÷ system |")
        print("|---|---|---|---|---|")
    for n in names:
        t = statistics.median(w for w, _ in results[n])
        m = statistics.median(x for _, x in results[n])
        rt = f"{t / base_t:.2f}" if base_t else "-"
        rm = f"{m / base_m:.2f}" if base_m else "-"
        if a.markdown:
            print(f"| {n} | {t:.3f} s | {m / 2**20:.1f} MiB | {rt} | {rm} |")
        else:
            print(f"{n:<10} {t:8.3f} s  {m / 2**20:8.1f} MiB   time×{rt}  rss×{rm}")


if __name__ == "__main__":
    main()
