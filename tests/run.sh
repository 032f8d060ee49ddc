#!/usr/bin/env bash
# The whole test suite from a fresh clone: installs what is missing (models/setup.sh),
# then runs every unit and integration test against the real engine and model.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo >/dev/null || { echo "tests/run.sh: cargo not found; install Rust (rustup) first" >&2; exit 1; }
# A fresh run writes about 12 GiB: target/ 6 (the Hub look-alike's
# repositories 2 of it) and the cache 5. A disk that fills fails tests far
# from the cause (make_repos.py, then every Hub test), so it is said first.
cache=${EEANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eeane}
mkdir -p "$cache"
for where in . "$cache"; do
  free_gib=$(df -Pk "$where" | awk 'NR == 2 { print int($4 / 1048576) }')
  if [ "${free_gib:-0}" -lt 12 ]; then
    echo "tests/run.sh: WARNING: $free_gib GiB free under $(cd "$where" && pwd); a fresh run writes about 12 GiB, and tests fail when the disk fills" >&2
  fi
done
# The pinned toolchain (rust-toolchain.toml). Offline, rustup cannot fetch it:
# an installed stable of the same version is linked under its name instead.
pinned=$(sed -n 's/^channel = "\(.*\)"/\1/p' rust-toolchain.toml)
if command -v rustup >/dev/null && ! rustup run "$pinned" rustc --version >/dev/null 2>&1; then
  stable=$(RUSTUP_TOOLCHAIN=stable rustc --version 2>/dev/null | awk '{print $2}')
  if [ "$stable" = "$pinned" ]; then
    rustup toolchain link "$pinned" "$(RUSTUP_TOOLCHAIN=stable rustc --print sysroot)"
  else
    rustup toolchain install "$pinned" --profile minimal --component rustfmt,clippy
  fi
fi
# Where rustup adds targets: a linked toolchain takes them from the one it links to.
target_toolchain=$pinned
if command -v rustup >/dev/null && [ "$(rustup run "$pinned" rustc --print sysroot 2>/dev/null)" = "$(RUSTUP_TOOLCHAIN=stable rustc --print sysroot 2>/dev/null)" ]; then
  target_toolchain=stable
fi
# The Python venv, ONNX Runtime, the default model, and cmake for the build;
# the examples' client packages (their own venv), nginx (scale-out test),
# wrk (the load generator's test) and chromium (the /docs explorer test).
EEANE_EXTRA_MODELS="examples test-tools nginx wrk chromium all-minilm-l6-v2-cuda" bash models/setup.sh
# Build the tests (and with them the eeane binary they run), then pull the test
# models with it: downloads checked by hash, runtimes installed (OpenVINO from
# its wheel, ncnn built from its sdist, lavapipe), conversions checked.
# The test-only engine (backends/testing) is compiled in for the tests only.
features="--features eeane/test-engine"
cargo test --release --workspace --locked $features --no-run 2>&1 | tail -n 1
# Gates: formatting (rustfmt.toml) and clippy with warnings as errors; a
# failure fails the run, after the tests have run too.
gates=0
if cargo fmt --all --check >/dev/null 2>&1; then echo "cargo fmt --check: clean"; else
  # `|| true`: under pipefail the failing check would end the run here,
  # before clippy, the tests and this line.
  cargo fmt --all --check 2>&1 | head -n 40 || true; echo "cargo fmt --check: NOT clean (run cargo fmt --all)"; gates=1
fi
if lints=$(cargo clippy --release --workspace --all-targets --locked $features -q -- -D warnings 2>&1); then echo "cargo clippy -D warnings: clean"; else
  head -n 60 <<< "$lints"; echo "cargo clippy -D warnings: NOT clean"; gates=1
fi
for model in all-minilm-l6-v2-int8 e5-small-enpt e5-small-enpt-int8 e5-small-enpt-ov e5-small-enpt-int8-ov all-minilm-l6-v2-ncnn minilm-reranker; do
  target/release/eeane pull "$model" >/dev/null
done
# The default model's precision = "auto" survey, once (kept in its manifest):
# tests that start the default config then serve its chosen variant at once,
# with no survey running beside them.
target/release/eeane survey
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --release --workspace --locked $features -- --nocapture 2>&1 | tee "$log" || status=$?
# The Core ML engine's macOS part, type-checked for Apple Silicon (it cannot
# run here): needs the target's standard library from rustup.
if rustup target add --toolchain "$target_toolchain" aarch64-apple-darwin >/dev/null 2>&1; then
  cargo check --locked --target aarch64-apple-darwin -p eeane-backend-coreml --tests 2>&1 | tail -n 2 || status=1
  echo "Core ML engine (macOS part): type-checked for aarch64-apple-darwin"
else
  echo "Core ML engine (macOS part): NOT type-checked: rustup could not add the aarch64-apple-darwin target"
fi
# One closing line over all test binaries (cargo prints one per binary, the last often doc-tests with 0).
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "tests: %d passed, %d failed\n", passed, failed }' "$log"
[ "$gates" = 0 ] || status=1
exit "$status"
