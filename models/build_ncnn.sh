#!/usr/bin/env bash
# Builds ncnn (Vulkan on, shared library) once per version from the source in
# its PyPI sdist, into $cache/runtimes/ncnn/<version>/ (outside target/: about
# 7 minutes on 2 cores, measured here). `pip download --no-binary` rejects this sdist (its
# metadata version is a date), so the file is fetched by the URL the registry
# lists for it, and checked against its pinned sha256.
set -euo pipefail
cache=${EEANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eeane}
version=1.0.20261020
sha256=ad8cdd63e9755cfa8e23b9b6d9ce46156077d80298a89e7c3ba325ffccfca200
url=https://files.pythonhosted.org/packages/b7/50/32b5172afe7d3e0dce410b7d8f4a5b7b84b942a0d69affbaedf669de52bc/ncnn-$version.tar.gz
prefix=$cache/runtimes/ncnn/$version
here=$(cd "$(dirname "$0")" && pwd)
shim=$here/../backends/ncnn/shim/eeane_ncnn.cpp

# eeane's C-ABI shim over ncnn, rebuilt whenever its source changes.
build_shim() {
  local libdir stamp
  libdir=$(dirname "$(find "$prefix" -name 'libncnn.so' | head -1)")
  stamp=$(sha256sum "$shim" | cut -d' ' -f1)
  if [ "$(cat "$prefix/.shim.sha256" 2>/dev/null)" != "$stamp" ]; then
    # Built beside it and renamed over it: a server still running the old
    # one keeps its file, never a half-written one.
    g++ -O2 -std=c++17 -shared -fPIC -I"$prefix/include" "$shim" -L"$libdir" -lncnn \
      -Wl,-rpath,"$libdir" -o "$libdir/libeeane_ncnn.so.tmp"
    mv -f "$libdir/libeeane_ncnn.so.tmp" "$libdir/libeeane_ncnn.so"
    echo "$stamp" > "$prefix/.shim.sha256"
  fi
  ln -sfn "$version" "$cache/runtimes/ncnn/current"
  ln -sfn "$libdir/libeeane_ncnn.so" "$cache/runtimes/ncnn/libeeane_ncnn.so"
  echo "ncnn $version: $cache/runtimes/ncnn/libeeane_ncnn.so"
}

if [ -f "$prefix/.built" ]; then
  build_shim
  exit 0
fi
mkdir -p "$cache/downloads"
sdist=$cache/downloads/ncnn-$version.tar.gz
if [ "$(sha256sum "$sdist" 2>/dev/null | cut -d' ' -f1)" != "$sha256" ]; then
  curl -sSfL -o "$sdist.tmp" "$url"
  [ "$(sha256sum "$sdist.tmp" | cut -d' ' -f1)" = "$sha256" ] || { echo "ncnn sdist: sha256 mismatch" >&2; exit 1; }
  mv "$sdist.tmp" "$sdist"
fi
work=$(mktemp -d "$cache/downloads/ncnn-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
tar -xzf "$sdist" -C "$work"
src=$(find "$work" -maxdepth 1 -mindepth 1 -type d | head -1)
echo "ncnn $version: building (Vulkan on) into $prefix; this takes about 7 minutes on 2 cores"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DNCNN_VERSION="${version##*.}" -DNCNN_VULKAN=ON -DNCNN_SHARED_LIB=ON -DNCNN_BUILD_TOOLS=OFF \
  -DNCNN_BUILD_EXAMPLES=OFF -DNCNN_BUILD_BENCHMARK=OFF -DNCNN_BUILD_TESTS=OFF -DNCNN_PYTHON=OFF >/dev/null
cmake --build "$work/build" -j "$(nproc)" >/dev/null
cmake --install "$work/build" >/dev/null
touch "$prefix/.built"
build_shim
