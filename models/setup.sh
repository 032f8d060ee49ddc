#!/usr/bin/env bash
# Installs what eeane needs on a fresh machine, idempotently and fast the second time:
# a Python venv for model preparation (pinned in requirements.txt), the ONNX Runtime
# and OpenVINO libraries from their PyPI wheels, the default model converted to ONNX, and cmake for
# the build. EEANE_EXTRA_MODELS names more models to prepare (models/prepare.py).
# Everything lands in the cache directory ($EEANE_CACHE_DIR, else ~/.cache/eeane).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${EEANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eeane}
venv=$cache/venv
mkdir -p "$cache"

# Debian packages, installed only when missing (root, or sudo when there is one).
apt_install() {
  local sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get install -y -qq "$@" >/dev/null 2>&1 || { $sudo apt-get update -qq && $sudo apt-get install -y -qq "$@" >/dev/null; }
}

python=${PYTHON:-python3}
if ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "setup: $python lacks venv/ensurepip; installing Debian's python3-venv" >&2
  apt_install python3-venv
fi
# The sentencepiece crate compiles the SentencePiece library with cmake.
if ! command -v cmake >/dev/null; then
  echo "setup: installing Debian's cmake (the sentencepiece crate builds its library with it)" >&2
  apt_install cmake
fi

stamp=$(sha256sum "$here/requirements.txt" | cut -d' ' -f1)
if [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$stamp" ]; then
  echo "setup: preparing the Python venv in $venv"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$here/requirements.txt"
  echo "$stamp" > "$venv/.requirements.sha256"
fi

# "ncnn" in EEANE_EXTRA_MODELS builds ncnn and eeane's shim (models/build_ncnn.sh,
# about 7 minutes once) and installs a Vulkan loader and Mesa's lavapipe, a
# Vulkan device on the CPU; "examples" makes a venv with the client packages
# the examples use (examples/requirements.txt), "test-tools" one with the test
# tools (tests/requirements.txt: schemathesis, playwright); "chromium" installs
# Debian's chromium (tests/explorer.rs drives it); "nginx" installs Debian's
# nginx (the scale-out test); "wrk" Debian's wrk (tests/gpu/load.sh, the load
# generator); the other names are models/prepare.py targets.
# A venv of its own for client or test packages, remade when its requirements change.
side_venv() {
  local dir=$1 requirements=$2 stamp
  stamp=$(sha256sum "$requirements" | cut -d' ' -f1)
  if [ "$(cat "$dir/.requirements.sha256" 2>/dev/null)" != "$stamp" ]; then
    echo "setup: preparing $dir from $requirements"
    rm -rf "$dir"
    "$python" -m venv "$dir"
    "$dir/bin/python" -m pip install --quiet -r "$requirements"
    echo "$stamp" > "$dir/.requirements.sha256"
  fi
}

extra=()
for target in ${EEANE_EXTRA_MODELS:-}; do
  if [ "$target" = examples ]; then
    side_venv "$cache/venv-examples" "$here/../examples/requirements.txt"
  elif [ "$target" = test-tools ]; then
    side_venv "$cache/venv-tools" "$here/../tests/requirements.txt"
  elif [ "$target" = chromium ]; then
    if [ ! -x /usr/bin/chromium ]; then
      echo "setup: installing Debian's chromium (the /docs explorer test)" >&2
      apt_install chromium
    fi
  elif [ "$target" = nginx ]; then
    if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
      echo "setup: installing Debian's nginx" >&2
      apt_install nginx-light || apt_install nginx
    fi
  elif [ "$target" = wrk ]; then
    if ! command -v wrk >/dev/null; then
      echo "setup: installing Debian's wrk (the load generator)" >&2
      apt_install wrk
    fi
  elif [ "$target" = ncnn ]; then
    if [ ! -e /usr/share/vulkan/icd.d/lvp_icd.x86_64.json ] || ! ldconfig -p | grep -q 'libvulkan.so.1 '; then
      echo "setup: installing Debian's libvulkan1 and mesa-vulkan-drivers (lavapipe)" >&2
      apt_install libvulkan1 mesa-vulkan-drivers
    fi
    EEANE_CACHE_DIR=$cache bash "$here/build_ncnn.sh"
  else
    extra+=("$target")
  fi
done
# OpenVINO's library (from the venv's wheel) too: precision = "auto" measures its variants.
"$venv/bin/python" "$here/prepare.py" --cache "$cache" onnxruntime openvino all-minilm-l6-v2 "${extra[@]}"
# The default model is precision = "auto": its first load serves the fp32
# reference at once and measures the variants beside it (about half a minute
# on 2 cores), then serves the fastest within cosine 0.9999. `eeane survey`
# runs that measurement ahead of time; setup does not, since eeane is not built yet.
echo "setup: done. The default model (precision = \"auto\") measures its variants in the background at its first load; \`eeane survey\` does it ahead of time" >&2
