#!/usr/bin/env bash
# Coverage-guided fuzzing with cargo fuzz (libFuzzer) on the nightly toolchain, for as long as asked:
#   scripts/fuzz.sh [SECONDS=600] [JOBS=1] [TARGET=ops]
# TARGET `ops` (fuzz/fuzz_targets/ops.rs) fuzzes the allocator, `plan` (fuzz/fuzz_targets/plan.rs)
# the memory planner.
# Installs cargo-fuzz if missing. The nightly toolchain here has no rust-src, so the sanitizer build
# (which needs -Zbuild-std for some sanitizers) is not used: `-s none` builds with coverage only; the
# targets check their results themselves instead. A crash leaves its input under
# fuzz/artifacts/TARGET/; replay it with `cargo +nightly fuzz run -s none TARGET <that file>`.
# FUZZ_ASSERTS=1 builds with debug assertions, so that integer overflow panics (as a debug build
# of a user's program would) instead of wrapping.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
jobs=${2:-1}
target=${3:-ops}
case "$target" in
    ops | plan) ;;
    *) echo "fuzz.sh: unknown target '$target' (ops or plan)" >&2; exit 2 ;;
esac
asserts=()
if [ "${FUZZ_ASSERTS:-0}" = 1 ]; then
    asserts=(-a)
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p "fuzz/corpus/$target"
cd fuzz
cargo +nightly fuzz build -s none -O "${asserts[@]}" "$target"
par=()
if [ "$jobs" -gt 1 ]; then
    # Parallel jobs write their output to fuzz/fuzz-N.log.
    par=(-jobs="$jobs" -workers="$jobs")
fi
# EDGEPOOL_* options pass through to the target: EDGEPOOL_SECURE=1 scripts/fuzz.sh fuzzes the hardened mode.
cargo +nightly fuzz run -s none -O "${asserts[@]}" "$target" "corpus/$target" -- \
    -max_total_time="$secs" "${par[@]}" -rss_limit_mb=4096 -max_len=4096 -print_final_stats=1
