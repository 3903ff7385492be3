#!/usr/bin/env python3
"""Counts the instructions of the fast paths in examples/asm_probe.rs, as the comment in
src/cache/mod.rs quotes them:

    cargo build --release --example asm_probe && python3 scripts/fast-path-insns.py

Each path is followed from the function's entry through its straight-line code, with the named
conditional jump taken, up to its `ret`:
- alloc, stack hit: every conditional jump falls through;
- alloc, word hit: the last conditional jump of the stack-hit path (the stack is empty) is taken (the
  jumps before it are the size check and, in a build with the `debug` feature, the hooks check);
- free by the owner onto the stack: every conditional jump falls through.
"""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "examples", "asm_probe")


def function(name):
    out = subprocess.run(["objdump", "-d", "-M", "intel", "--no-show-raw-insn", BIN], check=True,
                         capture_output=True, text=True).stdout
    body = out.split(f"<{name}>:\n", 1)[1].split("\n\n", 1)[0]
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


if not os.path.exists(BIN):
    sys.exit("build it first: cargo build --release --example asm_probe")
alloc, free = function("probe_alloc"), function("probe_free")
print(f"alloc, stack hit: {walk(alloc)} instructions")
print(f"alloc, word hit:  {walk(alloc, walk(alloc, jumps=True))} instructions")
print(f"free onto the stack by the owner: {walk(free)} instructions")
