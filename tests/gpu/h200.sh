#!/usr/bin/env bash
# Issue 7's GPU run: the ncnn engine on a real GPU through Vulkan (NVIDIA's
# driver), fidelity with the device pinned by name, throughput, and VRAM. It
# runs on the lent H200 from what tests/gpu/pack.sh put in .h200/ (and the
# Vulkan loader in .gl/); tests/gpu/README.md says how. Results go to $OUT.
set -uo pipefail
source tests/gpu/setup.sh

model() {  # id, extra lines
  printf '[[models]]\nid = "%s"\nengine = "ncnn"\nmodel = "%s/model/model.ncnn.param"\ntokenizer = "%s/model/tokenizer.json"\nmax_tokens = 512\nmax_batch = 128\nmax_batch_tokens = 65536\n%b\n' "$1" "$root" "$root" "$2"
}
{
  printf '[server]\nport = 7997\nkeep_alive = 300\n[runtimes]\nncnn = "%s/lib/libeeane_ncnn.so"\n' "$root"
  d="\"vulkan:$gpu\""
  model minilm-h200 "device = $d\nkeep_alive = 3"
  model minilm-h200-alone "device = $d\npack_tokens = 1"
  model minilm-h200-p2048 "device = $d\npack_tokens = 2048"
  model minilm-h200-x2 "device = [$d, $d]"
  model minilm-h200-x2-p2048 "device = [$d, $d]\npack_tokens = 2048"
} > "$root/h200.toml"
cp "$root/h200.toml" "$OUT/"

# VRAM: at rest, with the server up, loaded, after a 512-token request, after unload.
vram "at rest, no eeane"
"$eeane" serve --config "$root/h200.toml" > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf localhost:7997/health -o /dev/null && break; sleep 1; done
vram "eeane up, no model loaded"
if ! curl -s localhost:7997/health | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin)["devices"].get("vulkan") else 1)'; then
  echo "no Vulkan device named $gpu:"; curl -s localhost:7997/health | head -c 300; echo
  tail -5 "$OUT/server.log"
  kill -TERM $server; exit 1
fi
embed() { curl -s localhost:7997/v1/embeddings -H 'content-type: application/json' -d "$1" -o /dev/null -w "%{http_code} %{time_total}s\n"; }
embed '{"model":"minilm-h200","input":"hello"}'
vram "minilm-h200 loaded (one short request)"
long=$(python3 -c 'print(" ".join(["token"] * 600))')
embed "{\"model\":\"minilm-h200\",\"input\":\"$long\"}"
curl -s localhost:7997/health | python3 -c 'import json,sys; h=json.load(sys.stdin); print([m["engine_calls"] for m in h["models"] if m["id"]=="minilm-h200"])'
vram "after a 512-token request"
for _ in $(seq 30); do sleep 1; curl -s localhost:7997/health | grep -q '"id":"minilm-h200"[^}]*"state":"unloaded"' && break; done
sleep 1
vram "after unload (keep_alive 3 s)"
curl -s localhost:7997/health | python3 -c 'import json,sys; h=json.load(sys.stdin); print("devices:", h["devices"]); print([(m["id"], m["state"], m["counters"]["loads"], m["counters"]["unloads"]) for m in h["models"]][:1])'

# Fidelity, device pinned by name: packed (512 tokens a run) and each text alone.
$py tests/gpu/fidelity.py http://127.0.0.1:7997 .h200/reference.json minilm-h200 minilm-h200-alone "$weights" > "$OUT/fidelity.json"
echo "fidelity exit $?"; head -c 1500 "$OUT/fidelity.json"; echo
kill -TERM $server; wait $server
vram "server stopped"

# Throughput: one sequence per run (the baseline), then packed, and several nets.
bench() { echo "== $*"; timeout 120 "$eeane" bench --config "$root/h200.toml" "$@" 2>&1 | grep -v -E "INFO|WARN" | grep -E "^\||^\(|^model"; }
if [ -n "${EEANE_GPU_QUICK:-}" ]; then
  bench --model minilm-h200-x2 --texts "$texts" --batch 128 | tee "$OUT/bench.txt"; vram "end"; exit 0
fi
{
  bench --model minilm-h200-alone --texts $((texts / 10)) --batch 32
  for m in minilm-h200 minilm-h200-p2048 minilm-h200-x2 minilm-h200-x2-p2048; do
    bench --model $m --texts "$texts" --batch 128
  done
} 2>&1 | tee "$OUT/bench.txt"
vram "end"
