#!/usr/bin/env bash
# Runs the soak (tests/soak.rs) for as long as asked, per option set:
#   scripts/soak.sh [SECONDS=600]
# Each of the three runs (default options; purge at once; a 1 MiB largest block) lasts SECONDS.
set -euo pipefail
cd "$(dirname "$0")/.."
EDGEPOOL_TEST_SOAK_SECONDS=${1:-600} cargo test --release --test soak -- --nocapture --test-threads=1 2>&1 \
    | grep -E "soak:|panicked|failed|test result"
