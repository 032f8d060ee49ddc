#!/usr/bin/env bash
# The engine alone on the lent GPU (tests/gpu/ort_kernels.py), after
# `EEANE_CUDA_SETUP_ONLY=1 bash tests/gpu/cuda.sh`: each variant in a process
# of its own (ONNX Runtime reads its `ORT_DISABLE_*` switches once), its JSON
# in $OUT/kernels-NAME.json, and a summary with the kernel tables.
# Needs onnxruntime-gpu's Python package, which tests/gpu/cuda_pack.sh puts
# in .cuda/ortpy (carry it with the call).
#   bash tests/gpu/ort_kernels.sh NAME "ARGS" [NAME "ARGS" ...]
# e.g. bash tests/gpu/ort_kernels.sh default "--profile" step8 "--seq-step 8 --no-torch --profile"
# An argument list may start with VAR=value words: the variant's environment;
# GRAPH=path runs another graph than the catalog's (same inputs and output).
set -uo pipefail
OUT=${OUT:-/tmp/eeane-cuda-out}
root=/tmp/eeane-cuda
model=$root/cache/models/all-minilm-l6-v2-cuda
[ -f "$model/model.fp16.onnx" ] && [ -f "$root/texts.json" ] || { echo "run EEANE_CUDA_SETUP_ONLY=1 bash tests/gpu/cuda.sh first"; exit 3; }
package=/tmp/eeane-ortpy
if [ ! -d "$package/onnxruntime" ]; then
  mkdir -p "$package" && xz -dc .cuda/ortpy/onnxruntime-python.tar.xz | tar -C "$package" -xf - || { echo "no .cuda/ortpy/onnxruntime-python.tar.xz: run tests/gpu/cuda_pack.sh here and carry .cuda/ortpy"; exit 3; }
  # The CUDA provider (284 MB) is the bundle's, not a second copy.
  ln -sf "$root/ort/libonnxruntime_providers_cuda.so" "$package/onnxruntime/capi/"
fi
# The machine's CUDA 13 and cuDNN libraries, as its torch has them.
site=$(python3 -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))')
libs=$(ls -d "$site"/nvidia/*/lib "$site"/nvidia/cu13/lib 2>/dev/null | tr '\n' ':')
mkdir -p "$OUT"
while [ $# -ge 2 ]; do
  name=$1 args=$2
  shift 2
  graph=$model/model.fp16.onnx
  for word in $args; do case $word in GRAPH=*) graph=${word#GRAPH=} ;; esac; done
  # shellcheck disable=SC2086 # the arguments are words by design
  (cd tests/gpu && env LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" PYTHONPATH="$package" $(printf '%s\n' $args | grep '=') \
    python3 ort_kernels.py "$root/texts.json" "$model" "$graph" $(printf '%s\n' $args | grep -v '=') \
    > "$OUT/kernels-$name.json" 2> "$OUT/kernels-$name.err")
  echo "$name: exit $?"
done
python3 - "$OUT"/kernels-*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    try:
        report = json.load(open(path))
    except (OSError, ValueError) as e:
        print(path, "unreadable:", e)
        continue
    rates = {k: round(v) for k, v in report.items() if k.endswith("texts_per_s")}
    print(path.rsplit("/", 1)[-1], report.get("device"), f"real tokens {report['real_tokens_share']:.3f}", rates)
    for table in report.get("profiles", []):
        print(f"   {table['label']}: {table['kernels']} kernels, {table['kernel_ms']:.1f} ms of kernels, GPU busy {table['gpu_busy_ms']:.1f} of {table['wall_ms']:.1f} ms")
        for row in table["top"][:10]:
            print(f"     {row['ms']:6.2f} ms {row['calls']:4d} x {100 * row['share']:4.1f} %  {row['kernel']}")
PY
