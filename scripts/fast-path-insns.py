#!/usr/bin/env python3
"""Counts the instructions of the fast paths in examples/asm_probe.rs, as the comment in
src/cache/mod.rs quotes them, and of the same paths in the library's own `malloc` and `free` (what a
program under LD_PRELOAD runs), if target/release/libedgepool.so is built:

    cargo build --release --example asm_probe && python3 scripts/fast-path-insns.py
    cargo build --release -p edgepool-cdylib && python3 scripts/fast-path-insns.py

Each path is followed from the function's entry through its straight-line code, with the named
conditional jump taken, up to its `ret`:
- alloc, stack hit: every conditional jump falls through;
- alloc, word hit: the last conditional jump of the stack-hit path (the stack is empty) is taken (the
  jumps before it are the size check and, in a build with the `debug` feature, the hooks check);
- free by the owner onto the stack: every conditional jump falls through.
"""
import functools
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "examples", "asm_probe")
LIB = os.path.join(ROOT, "target", "release", "libedgepool.so")


@functools.lru_cache(maxsize=None)
def disassembly(binary):
    return subprocess.run(["objdump", "-d", "-M", "intel", "--no-show-raw-insn", binary], check=True,
                          capture_output=True, text=True).stdout


def function(name, binary=BIN):
    body = disassembly(binary).split(f"<{name}>:\n", 1)[1].split("\n\n", 1)[0]
    ins = []
    for line in body.splitlines():
        m = re.match(r"\s+([0-9a-f]+):\s+(\S+)\s*(.*)", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return ins


def walk(ins, take=0, jumps=False):
    at = {a: i for i, (a, _, _) in enumerate(ins)}
    i, n, cond = 0, 0, 0
    while True:
        _, op, arg = ins[i]
        n += 1
        if op == "ret":
            return cond if jumps else n
        if op == "jmp":
            return None
        if op.startswith("j"):
            cond += 1
            if cond == take:
                i = at[int(arg.split()[0], 16)]
                continue
        i += 1


def exported(name):
    """The body of the library's exported function `name` (LLVM merges equal bodies, such as malloc's
    and __libc_malloc's, so the one symbol that objdump shows there may bear the other name)."""
    out = subprocess.run(["nm", "-D", "--defined-only", LIB], check=True, capture_output=True, text=True).stdout
    addr = next(int(a, 16) for a, _, n in (line.split() for line in out.splitlines()) if n == name)
    label = next(line for line in disassembly(LIB).splitlines() if line.startswith(f"{addr:016x} <"))
    return function(label.split("<", 1)[1].rstrip(">:"), LIB)


def report(what, alloc, free):
    print(f"{what}alloc, stack hit: {walk(alloc)} instructions")
    print(f"{what}alloc, word hit:  {walk(alloc, walk(alloc, jumps=True))} instructions")
    print(f"{what}free onto the stack by the owner: {walk(free)} instructions")


if not os.path.exists(BIN):
    sys.exit("build it first: cargo build --release --example asm_probe")
report("", function("probe_alloc"), function("probe_free"))
if os.path.exists(LIB):
    report("libedgepool.so malloc/free: ", exported("malloc"), exported("free"))
