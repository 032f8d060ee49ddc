#!/usr/bin/env bash
# Issue 43's GPU run: a Hub decoder embedder with Qwen3-Embedding-0.6B's
# shapes (random weights) on the lent H200, in eeane with precision =
# "auto" (the fp32 graph against the GPU's fp16 graph, measured on the card),
# against torch and sentence-transformers on the same card and texts.
# Runs after tests/gpu/cuda.sh's setup (EEANE_CUDA_SETUP_ONLY=1
# EEANE_CUDA_NO_TORCH=1) in the same lease: eeane, ONNX Runtime's CUDA
# build, wrk and the texts are in /tmp/eeane-cuda.
#
# In steps, each idempotent, one device call each (a lease can end mid-call):
#   HUB_STEPS=make     the repository (tests/gpu/decoder_gpu.py make) and its
#                      preparation by models/prepare.py --cuda-fp16, timed
#                      (the graphs built and checked on the CPU);
#   HUB_STEPS=peers    torch fp32 (the reference), torch fp16 SDPA forward,
#                      sentence-transformers encode;
#   HUB_STEPS=serve    eeane: the first request after a cold start, the
#                      survey's choice, fidelity over HTTP to the reference,
#                      and tests/gpu/load.sh (bulk and one text a request).
# HUB_SHAPE=tiny: a 2-layer model, for a dry run (on a CPU machine too,
# with EEANE_CUDA_DEVICE=cpu: then auto measures the CPU's variants).
set -uo pipefail
OUT=${OUT:-/tmp/eeane-cuda-out}
root=/tmp/eeane-cuda
py=${PYTHON:-python3}
# The card by its model (H200, H100) as nvidia-smi names it.
device=${EEANE_CUDA_DEVICE:-cuda:$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | awk '{print $2}')}
steps=${HUB_STEPS:-make peers serve}
shape=${HUB_SHAPE:-}
repo=$root/qwen3-0.6b-shaped$shape
name=hf--bench--qwen3-embedding-0.6b-shaped$shape
dir=$root/cache/models/$name
eeane=${EEANE_BIN:-$root/eeane}
mkdir -p "$OUT"
export EEANE_CACHE_DIR=$root/cache PYTHONUNBUFFERED=1
has() { [[ " $steps " == *" $1 "* ]]; }
[ -f "$root/texts.json" ] || $py tests/gpu/stdlib_texts.py "$root/texts.json" "${EEANE_CUDA_TEXTS:-4000}"

if has make; then
  [ -f "$repo/model.safetensors" ] || $py tests/gpu/decoder_gpu.py make "$repo" $shape
  if [ ! -f "$dir/model.fp16.onnx" ]; then
    settings=$($py tests/gpu/decoder_gpu.py settings "$repo")
    start=$(date +%s.%N)
    /usr/bin/time -v $py models/prepare.py --cache "$root/cache" --hf-snapshot "$repo" --name "$name" \
      --source "hf:bench/qwen3-embedding-0.6b-shaped@random" --settings "$settings" --cuda-fp16 2>&1 \
      | grep -v -i "warning\|W:onnxruntime" | tee "$OUT/hub-prepare$shape.log" | grep -v "^\s"
    echo "prepare: $(awk "BEGIN {print $(date +%s.%N) - $start}") s" | tee -a "$OUT/hub-prepare$shape.log"
  fi
  ls -la "$dir" | tee -a "$OUT/hub-prepare$shape.log"
  $py -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["checks"], indent=1))' "$dir/manifest.json" | tee -a "$OUT/hub-prepare$shape.log"
fi

if has peers && [ "$device" != cpu ]; then
  $py tests/gpu/decoder_gpu.py peers "$repo" "$root/texts.json" "$root/hub$shape" > "$OUT/hub-peers$shape.json" 2> /tmp/hub-peers.err
  echo "peers exit $?"; cat "$OUT/hub-peers$shape.json"; tail -3 /tmp/hub-peers.err
fi

if has serve; then
  sessions=${HUB_SESSIONS:-4}
  devices=$(for _ in $(seq "$sessions"); do printf '"%s", ' "$device"; done | sed 's/, $//')
  {
    printf '[server]\nport = 7997\nkeep_alive = 600\n'
    [ "$device" != cpu ] && printf '[runtimes]\nonnxruntime = "%s/cache/runtimes/onnxruntime-gpu/libonnxruntime.so"\n' "$root"
    printf '[[models]]\nid = "qwen3-auto"\nengine = "onnxruntime"\nmodel = "%s/model.onnx"\ntokenizer = "%s/tokenizer.json"\n' "$dir" "$dir"
    printf 'pooling = "last_token"\nnormalize = true\nmax_tokens = 256\nprecision = "auto"\n'
    if [ "$device" != cpu ]; then
      printf 'device = [%s]\nisolation = "thread"\nmax_batch = 256\nmax_batch_tokens = 65536\n' "$devices"
      printf 'buckets = [{ max_tokens = 64, max_batch = 256 }, { max_tokens = 128, max_batch = 256 }, { max_tokens = 256, max_batch = 256 }]\n'
    fi
  } > "$root/hub$shape.toml"
  cp "$root/hub$shape.toml" "$OUT/"
  vram() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
  echo "VRAM before: $(vram) MiB" | tee "$OUT/hub-serve$shape.log"
  EEANE_LOG=${EEANE_LOG:-warn,eeane::variants=info} "$eeane" serve --config "$root/hub$shape.toml" > "$OUT/hub-server$shape.log" 2>&1 &
  server=$!
  for _ in $(seq 60); do curl -sf localhost:7997/health -o /dev/null && break; sleep 0.5; done
  start=$(date +%s.%N)
  curl -sf localhost:7997/v1/embeddings -H 'content-type: application/json' -d '{"model": "qwen3-auto", "input": ["first"]}' -o /dev/null
  echo "first request after a cold start (fp32 reference serving): $(awk "BEGIN {print $(date +%s.%N) - $start}") s" | tee -a "$OUT/hub-serve$shape.log"
  for _ in $(seq 600); do
    state=$(curl -s localhost:7997/health | $py -c 'import json,sys; m=[m for m in json.load(sys.stdin)["models"] if m["id"]=="qwen3-auto"][0]; print((m.get("survey") or {}).get("state"))')
    [ "$state" = running ] || break
    sleep 1
  done
  echo "survey done after $(awk "BEGIN {print $(date +%s.%N) - $start}") s" | tee -a "$OUT/hub-serve$shape.log"
  curl -s localhost:7997/health | $py -c 'import json,sys; m=[m for m in json.load(sys.stdin)["models"] if m["id"]=="qwen3-auto"][0]; print(json.dumps({k: m.get(k) for k in ("state", "device", "precision", "variant", "survey")}, indent=1))' | tee -a "$OUT/hub-serve$shape.log"
  echo "VRAM served: $(vram) MiB" | tee -a "$OUT/hub-serve$shape.log"
  if [ -f "$root/hub$shape.reference.npy" ]; then
    $py tests/gpu/decoder_gpu.py http http://127.0.0.1:7997 qwen3-auto "$root/texts.json" "$root/hub$shape.reference.npy" | tee -a "$OUT/hub-serve$shape.log"
  fi
  LOAD_SERVER_PID=$server LOAD_SECONDS=${LOAD_SECONDS:-15} LOAD_IN_FLIGHT=${LOAD_IN_FLIGHT:-64 256 480} bash tests/gpu/load.sh http://127.0.0.1:7997 qwen3-auto "$root/texts.json" "$OUT/hub-load$shape.json" 2>&1 | tee -a "$OUT/hub-serve$shape.log"
  kill -TERM $server; wait $server
  echo "server exit $?; VRAM after: $(vram) MiB" | tee -a "$OUT/hub-serve$shape.log"
fi
