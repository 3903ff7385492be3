"""A multi-threaded Python workload for the LD_PRELOAD tests: dicts, strings, json, re, a
concurrent.futures thread pool and a multiprocessing pool with fork. Prints deterministic results.
Usage: python3 py_workload.py SCALE"""
import concurrent.futures as cf
import hashlib
import json
import multiprocessing as mp
import re
import sys

scale = int(sys.argv[1]) if len(sys.argv) > 1 else 1


def build(n):
    return {f"key{i}": {"id": i, "name": "x" * (i % 50), "tags": [str(j) for j in range(i % 7)]} for i in range(n)}


def work(i):
    d = build(2000 * scale)
    s = json.dumps(d, sort_keys=True)
    words = re.findall(r"key(\d+)", s)
    back = json.loads(s)
    return len(s) + len(words) + len(back) + i


def square(x):
    return sum(len(str(k)) for k in range(x * 100))


if __name__ == "__main__":
    with cf.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(work, range(8)))
    text = " ".join(str(r) for r in results)
    print("threads", hashlib.sha256(text.encode()).hexdigest(), sum(results))
    with mp.get_context("fork").Pool(2) as pool:
        print("fork", sum(pool.map(square, range(20 * scale))))
    big = build(30000 * scale)
    print("dict", len(big), hashlib.sha256(json.dumps(big, sort_keys=True).encode()).hexdigest())
