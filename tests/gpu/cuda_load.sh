#!/usr/bin/env bash
# Issues 45 and 47 on a lent GPU, in one call after
# `EEANE_CUDA_SETUP_ONLY=1 bash tests/gpu/cuda.sh` (which leaves eeane, the
# CUDA runtime, the fp16 model, the texts and cuda.toml in /tmp/eeane-cuda):
#   1. pins: the card by name, by NVML UUID (a prefix), by PCI bus id, and
#      every matching card (cuda:NAME*) serve the same vectors; a wrong UUID
#      is refused naming the card that is there; /health lists UUID and bus id;
#   2. per layout (xN-thread: N sessions in the server's process; xN-process:
#      N engine processes): the
#      cold start's first answer, how long until every session has run every
#      batch shape once (in the background, while idle), then
#      tests/gpu/load.sh (bulk, and one text a request at 64, 256 and 480 in
#      flight) and VRAM after an unload;
#   3. SIGTERM while 1,024 connections send one text a request as the model
#      loads, five times per layout (STOP_LAYOUTS, "x8-thread x4-process"):
#      each exit status.
# Everything goes to $OUT. LOAD_STEPS ("pins load stop") and LOAD_LAYOUTS
# ("x8-thread x4-thread x2-process"; a layout named twice runs twice, the
# second's files suffixed "-again") pick parts, so that each call of a lent
# machine that may be taken back stays short.
set -uo pipefail
OUT=${OUT:-/tmp/eeane-cuda-out}
root=/tmp/eeane-cuda
# EEANE_BIN: another build to measure (an A/B in one call), its output
# files named with LOAD_NAME; LOAD_WAIT_WARM=0 for a build that warms at load,
# LOAD_WARM_SECONDS (120) the longest it waits for the shapes to warm.
eeane=${EEANE_BIN:-$root/eeane}
name=${LOAD_NAME:-}
device=cuda:$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 | awk '{print $2}')
seconds=${LOAD_SECONDS:-15}
mkdir -p "$OUT"
export EEANE_CACHE_DIR=$root/cache
[ -z "${EEANE_BIN:-}" ] && [ -f .cuda/bin/eeane.xz ] && xz -dc .cuda/bin/eeane.xz > "$eeane" && chmod +x "$eeane"
[ -x "$eeane" ] || { echo "run EEANE_CUDA_SETUP_ONLY=1 bash tests/gpu/cuda.sh first"; exit 3; }
command -v wrk > /dev/null || { echo "wrk is missing on this machine"; exit 3; }
ulimit -n 65536 2>/dev/null
# LOAD_MODEL_DIR: another prepared folder of the model (tests/gpu/unfused_twin.py).
model_dir=${LOAD_MODEL_DIR:-$root/cache/models/all-minilm-l6-v2-cuda}
entry() {  # id, device list, extra lines
  printf '[[models]]\nid = "%s"\nengine = "onnxruntime"\nmodel = "%s/model.fp16.onnx"\ntokenizer = "%s/tokenizer.json"\nmax_tokens = 256\nprecision = "fp16"\ndevice = %s\nmax_batch = 256\nmax_batch_tokens = 65536\npooling = "none"\nbuckets = [{ max_tokens = 64, max_batch = 256 }, { max_tokens = 128, max_batch = 256 }]\n%b\n' \
    "$1" "$model_dir" "$model_dir" "$2" "$3"
}
header() { printf '[server]\nport = %s\nkeep_alive = 300\n' "$1"; sed -n '/^\[runtimes\]/,/^\[\[models\]\]/p' "$root/cuda.toml" | grep -v '^\[\[models\]\]'; }
wait_port() { for _ in $(seq 600); do curl -sf "localhost:$1/health" -o /dev/null && return 0; sleep 0.2; done; return 1; }

steps=${LOAD_STEPS:-pins load stop}
layouts=${LOAD_LAYOUTS:-x8-thread x4-thread x2-process}
has() { [[ " $1 " == *" $2 "* ]]; }

# 1. Pins.
if has "$steps" pins; then
name=${device#cuda:}
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)
bus=$(nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader | head -n 1)
{
  header 7990
  entry by-name "\"cuda:$name\"" ""
  entry by-uuid "\"cuda:${uuid:0:12}\"" ""
  entry by-bus "\"cuda:$bus\"" ""
  entry every "\"cuda:$name*\"" ""
  entry wrong-uuid "\"cuda:GPU-00000000\"" ""
} > "$root/pins.toml"
"$eeane" serve --config "$root/pins.toml" > "$OUT/pins-server.log" 2>&1 &
server=$!
wait_port 7990
python3 - "$OUT/pins.json" <<'PY'
import json, sys, urllib.request
def post(model):
  request = urllib.request.Request("http://127.0.0.1:7990/v1/embeddings", json.dumps({"model": model, "input": ["fn main() {}", "pins by uuid"], "encoding_format": "float"}).encode(), {"content-type": "application/json"})
  try:
      with urllib.request.urlopen(request, timeout=300) as r:
          return r.status, json.load(r)
  except urllib.error.HTTPError as e:
      return e.code, json.load(e)
report = {}
base = post("by-name")[1]["data"]
for model in ["by-uuid", "by-bus", "every"]:
  status, body = post(model)
  report[model] = {"status": status, "same_vectors_as_by_name": status == 200 and body["data"] == base}
status, body = post("wrong-uuid")
report["wrong-uuid"] = {"status": status, "message": body.get("error", {}).get("message")}
health = json.load(urllib.request.urlopen("http://127.0.0.1:7990/health"))
report["devices"] = health.get("devices")
report["every_per_device"] = next(m for m in health["models"] if m["id"] == "every").get("engine_calls")
json.dump(report, open(sys.argv[1], "w"), indent=1)
print(json.dumps(report, indent=1))
PY
kill -TERM $server; wait $server
fi

# 2. Per layout: cold start, the load generator, VRAM after an unload.
sessions_on() {  # a device list of N entries of this card
  printf '"%s", ' $(for _ in $(seq "$1"); do echo "$device"; done) | sed 's/, $//'
}
base_name=$name
seen=" "
for tag in $layouts; do
  has "$steps" load || break
  case $tag in
    x*-thread) n=${tag#x}; n=${n%-thread}; devices="[$(sessions_on "$n")]"; extra='isolation = "thread"' ;;
    x*-process) n=${tag#x}; n=${n%-process}; devices="[$(sessions_on "$n")]"; extra="" ;;
    *) echo "unknown layout $tag (xN-thread or xN-process)"; continue ;;
  esac
  name=$base_name
  has "$seen" "$tag" && name=$base_name-again
  seen="$seen$tag "
  # LOAD_ENTRY: more lines for the model's entry (an engine option to A/B).
  { header 7991; entry "minilm-$tag" "$devices" "$extra${LOAD_ENTRY:+\n$LOAD_ENTRY}"; } > "$root/load-$tag.toml"
  "$eeane" serve --config "$root/load-$tag.toml" > "$OUT/load-$tag$name-server.log" 2>&1 &
  server=$!
  wait_port 7991
  start=$(date +%s.%N)
  code=$(curl -s -o /dev/null -w "%{http_code}" -H 'content-type: application/json' -d "{\"model\": \"minilm-$tag\", \"input\": \"cold\"}" localhost:7991/v1/embeddings)
  echo "$tag$name: first answer after a cold start $(python3 -c "import time; print(f'{time.time() - $start:.1f}')") s, status $code" | tee -a "$OUT/load.txt"
  # A model that does not load (a refused file, a missing runtime) has no
  # shapes to wait for: its log's errors say why, and the next layout runs.
  if [ "$code" != 200 ]; then
    grep -m 3 ERROR "$OUT/load-$tag$name-server.log" | tee -a "$OUT/load.txt"
    kill -TERM $server; wait $server
    continue
  fi
  sessions=$(grep -o '"cuda' <<< "$devices" | wc -l)
  for _ in $(seq $((${LOAD_WARM_SECONDS:-120} * 5))); do [ "${LOAD_WAIT_WARM:-1}" = 0 ] || [ "$(grep -c 'every GPU batch shape has run once' "$OUT/load-$tag$name-server.log")" -ge "$sessions" ] && break; sleep 0.2; done
  echo "$tag$name: every shape warmed on all $sessions sessions $(python3 -c "import time; print(f'{time.time() - $start:.1f}')") s after the cold start" | tee -a "$OUT/load.txt"
  LOAD_SERVER_PID=$server LOAD_SECONDS=$seconds bash tests/gpu/load.sh http://127.0.0.1:7991 "minilm-$tag" "$root/texts.json" "$OUT/load-$tag$name.json" 2>&1 | tee -a "$OUT/load.txt"
  # The batches' rows, tokens and run time over the whole load (Prometheus histograms).
  curl -s localhost:7991/metrics | grep -E '^eeane_(batch_rows|batch_tokens|inference_seconds)' > "$OUT/metrics-$tag$name.txt"
  # LOAD_AFTER: a command run while the loaded server still serves (MODEL and PORT set).
  [ -z "${LOAD_AFTER:-}" ] || MODEL=minilm-$tag PORT=7991 NAME=$tag$name bash -c "$LOAD_AFTER" 2>&1 | tee -a "$OUT/load.txt"
  curl -s -o /dev/null -H 'content-type: application/json' -d "{\"model\": \"minilm-$tag\", \"input\": \"x\", \"keep_alive\": 0}" localhost:7991/v1/embeddings
  sleep 3
  echo "$tag: VRAM after unload $(nvidia-smi --query-gpu=memory.used --format=csv,noheader | head -n 1)" | tee -a "$OUT/load.txt"
  kill -TERM $server; wait $server
done
name=$base_name

# 3. SIGTERM under overload while loading, five times per layout.
python3 - "$root/texts.json" "$root/one.jsonl" <<'PY'
import json, sys
texts = json.load(open(sys.argv[1]))
open(sys.argv[2], "w").write("".join(json.dumps({"model": "m", "input": [t]}) + "\n" for t in texts))
PY
has "$steps" stop || exit 0
for tag in ${STOP_LAYOUTS:-x8-thread x4-process}; do
  n=${tag#x}; n=${n%-*}
  { header 7991; entry "minilm-$tag" "[$(sessions_on "$n")]" "$([[ $tag == *-thread ]] && echo 'isolation = "thread"')${LOAD_ENTRY:+\n$LOAD_ENTRY}"; } > "$root/load-$tag.toml"
  sed "s/id = \"minilm-$tag\"/id = \"m\"/" "$root/load-$tag.toml" > "$root/stop-$tag.toml"
  for attempt in 1 2 3 4 5; do
    "$eeane" serve --config "$root/stop-$tag.toml" > "$OUT/stop-$tag-$attempt.log" 2>&1 &
    server=$!
    wait_port 7991
    timeout 60 wrk -t4 -c1024 -d40s -s tests/gpu/load.lua http://127.0.0.1:7991 -- "$root/one.jsonl" > /dev/null 2>&1 &
    load=$!
    sleep $((attempt * 2))
    kill -TERM $server
    wait $server
    status=$?
    [ "$status" = 0 ] || stop_failures=$((${stop_failures:-0} + 1))
    echo "$tag, attempt $attempt: SIGTERM after $((attempt * 2)) s under 1,024 connections: exit status $status" | tee -a "$OUT/stop.txt"
    kill $load 2>/dev/null; wait $load 2>/dev/null
  done
done
# The step fails when a server did not exit 0 (not on the killed wrk's status).
[ "${stop_failures:-0}" = 0 ] || { echo "stop: ${stop_failures} of the servers did not exit 0"; exit 1; }
