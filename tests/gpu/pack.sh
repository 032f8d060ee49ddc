#!/usr/bin/env bash
# Gathers what tests/gpu/h200.sh needs into .h200/ and .gl/ (both ignored by
# git, carried by the device tool): eeane and libncnn stripped and xz'd, the
# shim, the fp16-weight ncnn model (the fp32 one, 90 MB, is over the 64 MiB a
# call may carry), reference vectors, and the Vulkan loader from Debian.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache=${EEANE_CACHE_DIR:-$HOME/.cache/eeane}
grep -qx '/.h200/' .git/info/exclude || echo /.h200/ >> .git/info/exclude
grep -qx '/.gl/' .git/info/exclude || echo /.gl/ >> .git/info/exclude
rm -rf .h200 && mkdir -p .h200/model .gl
cargo build --release
strip -o .h200/eeane target/release/eeane && xz -T2 -6 .h200/eeane
lib=$cache/runtimes/ncnn/current/lib
strip -o .h200/libncnn.so.1 "$lib/libncnn.so.1" && xz -T2 -6 .h200/libncnn.so.1
cp "$lib/libeeane_ncnn.so" /usr/lib/x86_64-linux-gnu/libgomp.so.1 .h200/
# --fp32: the fp32 model, its .bin split in two: .h200a/ holds the first part
# for a first call (which leaves it in /tmp there), .h200/ the rest.
if [ "${1:-}" = --fp32 ]; then
  "$cache/venv/bin/python" models/prepare.py all-minilm-l6-v2-ncnn
  m=$cache/models/all-minilm-l6-v2-ncnn
  grep -qx '/.h200a/' .git/info/exclude || echo /.h200a/ >> .git/info/exclude
  rm -rf .h200a && mkdir -p .h200a
  head -c 45000000 "$m/model.ncnn.bin" > .h200a/model.ncnn.bin.part1
  tail -c +45000001 "$m/model.ncnn.bin" > .h200/model/model.ncnn.bin.part2
  cp "$m"/{model.ncnn.param,tokenizer.json,manifest.json} .h200/model/
  sha256sum "$m/model.ncnn.bin"
else
  "$cache/venv/bin/python" models/prepare.py all-minilm-l6-v2-ncnn-w16
  cp "$cache"/models/all-minilm-l6-v2-ncnn-w16/{model.ncnn.param,model.ncnn.bin,tokenizer.json,manifest.json} .h200/model/
fi
"$cache/venv/bin/python" tests/gpu/make_reference.py .h200/reference.json 600
if ! ls .gl/libglvnd0_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq && (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
fi
du -sh .h200 .gl
