#!/usr/bin/env bash
# Compares edgepool's criterion benches (benches/alloc.rs) between a base revision and the working
# tree, and the working tree with EDGEPOOL_SECURE=1, alternating the three in each round (this machine
# is shared and noisy: same-round alternation, then medians). Prints a table of medians and ratios.
#   scripts/bench-vs.sh BASE_REV [ROUNDS=5] [FILTER]
# FILTER is a criterion regex (default: the pair and batch groups, edgepool only).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/bench-vs.sh BASE_REV [ROUNDS] [FILTER]}
rounds=${2:-5}
filter=${3:-'^(pair|batch_lifo|batch_fifo|batch_random)/edgepool/'}
out=target/bench-vs
rm -rf "$out" && mkdir -p "$out"
wt=$out/base-tree
git worktree add -f "$wt" "$base" -q
trap 'git worktree remove --force "$wt"' EXIT
bin() { # the bench executable cargo builds in target dir $1
    (cd "$2" && CARGO_TARGET_DIR="$1" cargo bench --bench alloc --no-run --message-format=json -q) |
        python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "alloc" and m.get("executable"):
        print(m["executable"])'
}
new=$(bin "$PWD/target" "$PWD")
old=$(bin "$PWD/target/base-check" "$wt")
for r in $(seq "$rounds"); do
    for v in base new secure; do
        exe=$new; env=()
        [ "$v" = base ] && exe=$old
        [ "$v" = secure ] && env=(EDGEPOOL_SECURE=1)
        env "${env[@]}" CRITERION_HOME="$out/crit-$v-$r" "$exe" --bench "$filter" --warm-up-time 1 \
            --measurement-time 3 --noplot > "$out/$v-$r.txt" 2>&1
    done
done
python3 - "$out" <<'PY'
import glob, re, statistics, sys
res = {}
for f in glob.glob(sys.argv[1] + "/*-*.txt"):
    v = f.rsplit("/", 1)[1].split("-")[0]
    for m in re.finditer(r"^(\S+)\s+time:\s+\[\S+ \S+ (\S+) (\S+)", open(f).read(), re.M):
        mult = {"ps": 1e-3, "ns": 1, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}[m.group(3)]
        res.setdefault(m.group(1), {}).setdefault(v, []).append(float(m.group(2)) * mult)
print(f"{'bench':34} {'base ns':>10} {'new ns':>10} {'secure ns':>10} {'new/base':>9} {'secure/new':>10}")
for n in sorted(res):
    b, w, s = (statistics.median(res[n].get(k, [float("nan")])) for k in ("base", "new", "secure"))
    print(f"{n:34} {b:10.1f} {w:10.1f} {s:10.1f} {w / b:9.3f} {s / w:10.3f}")
PY
