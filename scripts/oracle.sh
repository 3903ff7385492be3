#!/usr/bin/env bash
# Runs the shadow-model oracle (tests/oracle.rs) on many seeds, for as long as asked:
#   scripts/oracle.sh [SECONDS=600] [OPS_PER_THREAD=40000]
# Each seed is a new random program; a failure prints its seed, which replays with
#   EDGEPOOL_TEST_ORACLE_SEED=N cargo test --release --test oracle -- --nocapture
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-600}
ops=${2:-40000}
cargo test --release --test oracle --no-run -q
end=$((SECONDS + secs))
seeds=0
seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
while [ "$SECONDS" -lt "$end" ]; do
    if ! EDGEPOOL_TEST_ORACLE_SEED=$seed EDGEPOOL_TEST_ORACLE_OPS=$ops \
        cargo test --release --test oracle -q -- --nocapture 2>&1 | grep -E "^oracle:|panicked|seed"; then
        echo "oracle: seed $seed FAILED"
        exit 1
    fi
    seeds=$((seeds + 1))
    seed=$((seed + 1))
done
echo "oracle: $seeds seeds passed in ${secs} s"
