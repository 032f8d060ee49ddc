#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing (models/setup.sh),
# then runs every unit and integration test against the real engine and model.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "tests/run.sh: cargo not found; install Rust (rustup) first" >&2; exit 1; }
EEANE_EXTRA_MODELS="all-minilm-l6-v2-int8 e5-small-enpt e5-small-enpt-int8 openvino e5-small-enpt-ov e5-small-enpt-int8-ov ncnn all-minilm-l6-v2-ncnn minilm-reranker" bash models/setup.sh
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --workspace --locked -- --nocapture 2>&1 | tee "$log" || status=$?
# One closing line over all test binaries (cargo prints one per binary, the last often doc-tests with 0).
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
exit "$status"
