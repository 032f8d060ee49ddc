#!/usr/bin/env bash
# The project's load generator, for the GPU and the CPU alike: wrk (C, an
# event loop per thread) with a Lua script that gives every request its own
# body, cut from a file of texts, so that coalescing cannot help. A Python
# client on a few cores measures itself, not the server.
#
#   bash tests/gpu/load.sh URL MODEL TEXTS.json [OUT.json]
#
# TEXTS.json is a JSON array of strings (tests/gpu/stdlib_texts.py makes
# one). It waits until MODEL answers (its load included), warms it for
# 2 s, then measures, each for LOAD_SECONDS (15):
#   bulk:  LOAD_BULK texts a request (256) over LOAD_BULK_CONNECTIONS (12);
#   one text a request at each of LOAD_IN_FLIGHT ("64 256 480") connections.
# Prints one line per run (texts/s, requests/s, p50, p99, responses that
# were not 2xx, socket errors) and writes them to OUT.json when given.
# Needs wrk (Debian's package; EEANE_EXTRA_MODELS=wrk bash models/setup.sh)
# and python3 (standard library only). LOAD_THREADS: wrk's threads
# (default: the cores, at most 8).
set -euo pipefail
url=${1:?usage: load.sh URL MODEL TEXTS.json [OUT.json]}
model=${2:?model id}
texts=${3:?texts file}
out=${4:-}
seconds=${LOAD_SECONDS:-15}
bulk=${LOAD_BULK:-256}
bulk_connections=${LOAD_BULK_CONNECTIONS:-12}
in_flight=${LOAD_IN_FLIGHT:-64 256 480}
cores=$(nproc)
threads=${LOAD_THREADS:-$((cores < 8 ? cores : 8))}
command -v wrk >/dev/null || { echo "load.sh: wrk is missing: EEANE_EXTRA_MODELS=wrk bash models/setup.sh (Debian's wrk)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
here=$(cd "$(dirname "$0")" && pwd)

# The bodies: one a line; bulk bodies start at every text in turn, so that
# none repeats while fewer than len(texts) are in flight.
python3 - "$texts" "$model" "$bulk" "$work" <<'PY'
import json, sys
texts, model, bulk, work = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), sys.argv[4]
with open(f"{work}/one.jsonl", "w") as f:
    for t in texts:
        f.write(json.dumps({"model": model, "input": [t], "encoding_format": "base64"}) + "\n")
with open(f"{work}/bulk.jsonl", "w") as f:
    for i in range(len(texts)):
        chunk = [texts[(i + k) % len(texts)] for k in range(bulk)]
        f.write(json.dumps({"model": model, "input": chunk, "encoding_format": "base64"}) + "\n")
PY

# Waits for the model: its first request loads it (up to LOAD_WAIT s, 900).
deadline=$(( $(date +%s) + ${LOAD_WAIT:-900} ))
first=$(head -n 1 "$work/one.jsonl")
started=$(date +%s.%N)
until [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' -d "$first" "$url/v1/embeddings")" = 200 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "load.sh: $model did not answer 200 within ${LOAD_WAIT:-900} s" >&2; exit 1; }
  sleep 0.5
done
ready=$(python3 -c "import time; print(f'{time.time() - $started:.1f}')")
echo "load.sh: $model answered after ${ready} s; wrk $(wrk --version 2>&1 | head -n 1 | awk '{print $2}'), $threads threads, $cores cores"

# One wrk run: mode, texts a request, connections, seconds -> a JSON line.
run() {
  local mode=$1 per=$2 connections=$3 duration=$4 bodies=$5 line
  line=$(wrk -t"$threads" -c"$connections" -d"${duration}s" --timeout 120s -s "$here/load.lua" "$url" -- "$bodies" | grep '^LOAD ')
  python3 - "$mode" "$per" "$connections" $line <<'PY'
import json, sys
mode, per, connections = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
requests, duration_us, non2xx, socket, p50, p99 = map(int, sys.argv[5:11])
good = requests - non2xx
print(json.dumps({"mode": mode, "texts_per_request": per, "connections": connections, "seconds": duration_us / 1e6,
                  "texts_per_s": good * per / (duration_us / 1e6), "requests_per_s": requests / (duration_us / 1e6),
                  "p50_ms": p50 / 1e3, "p99_ms": p99 / 1e3, "not_2xx": non2xx, "socket_errors": socket}))
PY
}

[ "$threads" -le "$bulk_connections" ] || threads=$bulk_connections
run warm-up "$bulk" "$bulk_connections" 2 "$work/bulk.jsonl" > /dev/null
results=()
results+=("$(run bulk "$bulk" "$bulk_connections" "$seconds" "$work/bulk.jsonl")")
for c in $in_flight; do
  results+=("$(run one "1" "$c" "$seconds" "$work/one.jsonl")")
done
table=$(printf '%s\n' "${results[@]}")
python3 - "$table" <<'PY'
import json, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
best = max(r["texts_per_s"] for r in rows if r["mode"] == "bulk") or float("nan")
for r in rows:
    what = f"bulk ({r['texts_per_request']} texts a request)" if r["mode"] == "bulk" else "one text a request"
    print(f"{what:>32}, {r['connections']:>4} in flight: {r['texts_per_s']:>10.1f} texts/s ({r['texts_per_s'] / best:.2f} of bulk), "
          f"{r['requests_per_s']:>8.1f} requests/s, p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, "
          f"not 2xx {r['not_2xx']}, socket errors {r['socket_errors']}")
PY
if [ -n "$out" ]; then
  printf '%s\n' "${results[@]}" | python3 -c 'import json, sys; json.dump([json.loads(l) for l in sys.stdin if l.strip()], open(sys.argv[1], "w"), indent=1)' "$out"
fi
