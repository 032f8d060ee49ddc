#!/usr/bin/env bash
# Where the CUDA pipeline's time goes (after tests/gpu/cuda.sh on the same
# machine): the machine's tokenization rate (the tokenizers library eeane
# links, through Python) on one core and on all, and eeane's in-process
# phase with per-job tokenization and total times logged.
set -uo pipefail
root=/tmp/eeane-cuda
export EEANE_CACHE_DIR=$root/cache
[ -f .cuda/bin/eeane.xz ] && xz -dc .cuda/bin/eeane.xz > "$root/eeane" && chmod +x "$root/eeane"
nproc; grep -m1 "model name" /proc/cpuinfo
python3 - "$root" <<'PY'
import json, sys, time
from tokenizers import Tokenizer
root = sys.argv[1]
t = Tokenizer.from_file(f"{root}/cache/models/all-minilm-l6-v2-cuda/tokenizer.json"); t.no_truncation(); t.no_padding()
x = json.load(open(f"{root}/texts.json"))
s = time.time(); [t.encode(a, add_special_tokens=False) for a in x]; print("tokenizers, one core:", round(len(x) / (time.time() - s)), "texts/s")
s = time.time(); t.encode_batch(x, add_special_tokens=False); print("tokenizers, encode_batch (rayon, all cores):", round(len(x) / (time.time() - s)), "texts/s")
PY
EEANE_LOG=eeane=debug,eeane_backend_onnxruntime=debug timeout 200 "$root/eeane" bench --config "$root/cuda.toml" --model minilm-fp16-one --corpus "$root/texts.json" --texts 4000 --batch 128 2>&1 | grep -E "embedded|session run|^\||idle" | grep -v "sequences=1 " > /tmp/diag-bench.log
grep -c "session run" /tmp/diag-bench.log
grep -E 'session run' /tmp/diag-bench.log | sed -n '1,4p;68,72p' | sed 's/.*session run //'
grep -E "session run" /tmp/diag-bench.log | sed -n '73,130p' | sed 's/.*session run //'
grep -E "embedded" /tmp/diag-bench.log | head -8 | sed 's/.*embedded //'
grep -E "^\||idle" /tmp/diag-bench.log
