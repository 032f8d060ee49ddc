#!/usr/bin/env bash
# Gathers what tests/peer/host_run.sh needs on another machine's CPU (the lent
# GPU host: 16 cores with AVX512-BF16 and AMX, which this 2-core machine
# lacks) into .peer/ (ignored by git): eeane stripped, the ONNX Runtime and
# OpenVINO libraries from the cache (OpenVINO without its GPU and NPU
# plugins), the all-MiniLM-L6-v2 model folder, and, when given, a TEI router
# binary built elsewhere (nothing here builds it). One archive, cut into parts
# that each fit in one device call (64 MiB with the working tree):
# .peer/p1 ... .peer/pN, and .peer/pN/SHA256SUMS, which the last call checks.
#
# Usage: bash tests/peer/host_pack.sh [PATH-TO-text-embeddings-router]
# The router must run on the other CPU: build it for a baseline such as
# RUSTFLAGS="-C target-cpu=x86-64-v3" (TEI's own .cargo/config.toml asks for
# target-cpu=native, whose AMD-only instructions stop it on an Intel host).
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${EEANE_CACHE_DIR:-$HOME/.cache/eeane}
router=${1:-}
for need in "$cache/runtimes/onnxruntime/libonnxruntime.so" "$cache/runtimes/openvino/libopenvino_c.so" \
            "$cache/models/all-minilm-l6-v2/model.onnx"; do
  [ -e "$need" ] || { echo "missing $need: run bash models/setup.sh first" >&2; exit 1; }
done
rm -rf .peer && mkdir -p .peer/stage/bin .peer/stage/cache/runtimes .peer/stage/cache/models
cargo build --release
strip -o .peer/stage/bin/eeane target/release/eeane
cp -a "$cache/runtimes/onnxruntime" "$cache/runtimes/openvino" .peer/stage/cache/runtimes/
rm -f .peer/stage/cache/runtimes/openvino/*/libopenvino_intel_{gpu,npu}_plugin.so
cp -a "$cache/models/all-minilm-l6-v2" .peer/stage/cache/models/
if [ -n "$router" ]; then
  strip -o .peer/stage/bin/text-embeddings-router "$router"
  mkdir -p .peer/stage/tei-ort
  ln -s ../cache/runtimes/onnxruntime/libonnxruntime.so .peer/stage/tei-ort/libonnxruntime.so.1
fi
tar -C .peer/stage -cf - . | xz -T2 -9 > .peer/bundle.tar.xz
split -b 48M -d -a 1 .peer/bundle.tar.xz .peer/part.
for part in .peer/part.*; do
  n=$(( ${part##*.} + 1 ))
  mkdir -p ".peer/p$n" && mv "$part" ".peer/p$n/"
done
last=$(ls -d .peer/p* | wc -l)
(cd .peer && sha256sum p*/part.* bundle.tar.xz > "p$last/SHA256SUMS")
rm -rf .peer/stage .peer/bundle.tar.xz
ls -la .peer/p*
