#!/usr/bin/env bash
# Builds TEI's router (text-embeddings-router, v1.9.3) from its source with
# only its CPU ONNX Runtime backend, as the peer that
# tests/peer/cpu_peers.py --tei-router compares eeane against. Not part of
# the suite: from an empty target folder it took 5 min 40 s on 2 cores
# (2026-12-04, crates already downloaded).
#
#   bash tests/peer/build_tei.sh [--source GIT_DIR_OR_URL] [--out DIR]
#
# --source: a clone of huggingface/text-embeddings-inference that holds the
#   pinned commit (default: the GitHub URL).
# --out: where the build goes (default ~/.cache/eeane/peers/tei). It ends
#   with DIR/text-embeddings-router and DIR/ort-lib/libonnxruntime.so.1, the
#   two paths cpu_peers.py takes as --tei-router and --tei-ort-lib.
#
# The ONNX Runtime TEI links is eeane's own (bash models/setup.sh installs
# it), so both servers run the same library on the same model.onnx.
# Every crate comes from the registry: TEI patches candle and cudarc to git
# revisions and takes insta from git, all for its candle backend and its
# tests, which this build leaves out; the copy here drops the candle backend
# from the workspace and those lines from the manifests.
set -euo pipefail

COMMIT=06670157fb6c1523482219bdb2d1660277d38088
source="https://github.com/huggingface/text-embeddings-inference"
out="${HOME}/.cache/eeane/peers/tei"
while [ $# -gt 0 ]; do
  case "$1" in
    --source) source="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--source GIT_DIR_OR_URL] [--out DIR]" >&2; exit 2 ;;
  esac
done

ort_dir="${EEANE_CACHE_DIR:-$HOME/.cache/eeane}/runtimes/onnxruntime"
ort_lib=$(readlink -f "$ort_dir/libonnxruntime.so" 2>/dev/null || true)
if [ -z "$ort_lib" ] || [ ! -f "$ort_lib" ]; then
  echo "no ONNX Runtime at $ort_dir/libonnxruntime.so: run 'bash models/setup.sh' first" >&2
  exit 1
fi

mkdir -p "$out"
work="$out/src"
if [ ! -d "$work/.git" ]; then
  rm -rf "$work.partial"
  git clone -q --no-checkout "$source" "$work.partial"
  mv "$work.partial" "$work"
fi
git -C "$work" checkout -q --force "$COMMIT"
git -C "$work" clean -qfdx -e target

cd "$work"
# The repository pins rustc 1.92.0 through rustup; the machine's toolchain builds it.
rm -f rust-toolchain.toml
# The candle backend needs candle at a git revision: leave it out of the
# workspace, and its features in the backends crate become empty.
python3 - <<'EOF'
import re
from pathlib import Path
manifest = Path("Cargo.toml")
text = manifest.read_text()
text = re.sub(r"\[patch\.crates-io\]\n(?:[^\[\n][^\n]*\n|\n)*", "", text)
text = text.replace('    "backends/candle",\n', "")
manifest.write_text(text)
backends = Path("backends/Cargo.toml")
text = re.sub(r"^text-embeddings-backend-candle = [^\n]*\n", "", backends.read_text(), flags=re.M)
text = re.sub(r'^(\S+) = \[[^\]\n]*text-embeddings-backend-candle[^\]\n]*\]$', r"\1 = []", text, flags=re.M)
backends.write_text(text)
# insta, a test dependency, from the registry instead of git.
router = Path("router/Cargo.toml")
text = re.sub(r"^insta = \{ git = [^\n]*$", 'insta = { version = "1", features = ["yaml"] }', router.read_text(), flags=re.M)
# cudarc, only for the CUDA builds, comes from a git fork: dropped.
text = re.sub(r"^cudarc = [^\n]*\n", "", text, flags=re.M).replace(', "dep:cudarc"', "")
router.write_text(re.sub(r'"cudarc\?/[a-z-]+", ', "", text))
EOF
if grep -rn 'git = "' --include=Cargo.toml --exclude-dir=candle . >&2; then
  echo "a git dependency is left in TEI's manifests: this script no longer matches its source" >&2
  exit 1
fi

# metrics 0.23.0 no longer compiles on rustc 1.95 (a raw-pointer cast that
# extends a trait object's lifetime, rust-lang/rust#141402); 0.23.1 is the
# same API with that fixed.
cargo update -q -p metrics@0.23.0 --precise 0.23.1

# ort-sys links the library in ORT_LIB_LOCATION instead of downloading one;
# the linker looks for libonnxruntime.so, the loader at run time for .so.1.
mkdir -p "$out/ort-lib"
ln -sf "$ort_lib" "$out/ort-lib/libonnxruntime.so"
ln -sf "$ort_lib" "$out/ort-lib/libonnxruntime.so.1"
export ORT_LIB_LOCATION="$out/ort-lib" ORT_PREFER_DYNAMIC_LINK=1 GIT_SHA="$COMMIT"
export CARGO_TARGET_DIR="$out/target"
cargo build --release -p text-embeddings-router --no-default-features --features ort,http

ln -sf "$out/target/release/text-embeddings-router" "$out/text-embeddings-router"
LD_LIBRARY_PATH="$out/ort-lib" "$out/text-embeddings-router" --version
echo "built: --tei-router $out/text-embeddings-router --tei-ort-lib $out/ort-lib"
