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
# Where the time went, per run, so that a run says what bounds it: the
# machine's busy cores (/proc/stat), wrk's own, the server's (LOAD_SERVER_PID:
# the server's process, its threads by name, and its engine processes, its
# children, counted apart) and the GPU's busy share (nvidia-smi's
# utilization.gpu, sampled every 200 ms, where there is one), all over the
# seconds wrk measured.
# Needs wrk (Debian's package; EEANE_EXTRA_MODELS=wrk bash models/setup.sh)
# and python3 (standard library only). LOAD_THREADS: wrk's threads (default:
# the cores, at most 8; fewer where they would not divide a run's
# connections).
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
# Bulk body i holds the texts from i * bulk on: consecutive bodies share
# none, and the offsets cycle after len(texts) / gcd(len(texts), bulk)
# bodies (125 of 256 texts for 4,000), a file each wrk thread reads in a
# moment (a body per starting text made 600 MB, read at wrk's start while
# its first threads already sent requests that wrk then counted).
import math
with open(f"{work}/bulk.jsonl", "w") as f:
    for i in range(len(texts) // math.gcd(len(texts), bulk)):
        chunk = [texts[(i * bulk + k) % len(texts)] for k in range(bulk)]
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
echo "load.sh: $model answered after ${ready} s; wrk $(wrk --version 2>&1 | head -n 1 | awk '{print $2}'), up to $threads threads, $cores cores"

# One wrk run: mode, texts a request, connections, seconds -> a JSON line.
# CPU and GPU figures count only the seconds wrk measured (its last
# `duration` before it exits), not its start: with a body per starting text
# each thread read 600 MB there, 6 of 14 s on a 16-core machine, which
# showed the server's cores 1.8 times lower than they were.
run() {
  local mode=$1 per=$2 connections=$3 duration=$4 bodies=$5 line sampler gpu_pid="" wrk_cpu wrk_threads=$threads
  # wrk opens connections / threads connections a thread, rounded down: the
  # threads must divide the connections (12 over 8 threads were 8).
  while [ $((connections % wrk_threads)) -ne 0 ]; do wrk_threads=$((wrk_threads - 1)); done
  python3 "$here/cpu_snapshots.py" 0.25 "${LOAD_SERVER_PID:-}" > "$work/cpu.jsonl" &
  sampler=$!
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu --format=csv,noheader,nounits -lms 200 > "$work/gpu.txt" 2>/dev/null &
    gpu_pid=$!
  fi
  # The model's batch counters around the run: how the requests were batched.
  curl -s "$url/metrics" > "$work/metrics-before.txt" 2>/dev/null
  # bash's `time` gives wrk's own user and system seconds.
  { TIMEFORMAT='%U %S'; time wrk -t"$wrk_threads" -c"$connections" -d"${duration}s" --timeout 120s -s "$here/load.lua" "$url" -- "$bodies" "$wrk_threads" > "$work/wrk.txt"; } 2> "$work/wrk-time.txt"
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
  python3 "$here/cpu_snapshots.py" 0 "${LOAD_SERVER_PID:-}" >> "$work/cpu.jsonl"
  [ -z "$gpu_pid" ] || { kill "$gpu_pid"; wait "$gpu_pid" 2>/dev/null; }
  curl -s "$url/metrics" > "$work/metrics-after.txt" 2>/dev/null
  line=$(grep '^LOAD ' "$work/wrk.txt")
  wrk_cpu=$(tail -n 1 "$work/wrk-time.txt")
  python3 - "$mode" "$per" "$connections" "$wrk_threads" "$work/cpu.jsonl" "$work/gpu.txt" $wrk_cpu $line "$model" "$work" <<'PY'
import json, os, sys
mode, per, connections, wrk_threads, cpu_file, gpu_file = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
wrk_user, wrk_system = map(float, sys.argv[7:9])
requests, duration_us, non2xx, socket, p50, p99 = map(int, sys.argv[10:16])
model, work = sys.argv[16], sys.argv[17]
seconds, hz = duration_us / 1e6, os.sysconf("SC_CLK_TCK")
snapshots = [json.loads(l) for l in open(cpu_file) if l.strip()]
after = snapshots[-1]
# The first snapshot inside wrk's measured seconds (one every 0.25 s).
before = next((s for s in snapshots if s["at"] >= after["at"] - seconds), snapshots[0])
good = requests - non2xx
cores, span = after["cores"], max(after["at"] - before["at"], 1e-3)
row = {"mode": mode, "texts_per_request": per, "connections": connections, "wrk_threads": wrk_threads, "seconds": seconds,
       "texts_per_s": good * per / seconds, "requests_per_s": requests / seconds,
       "p50_ms": p50 / 1e3, "p99_ms": p99 / 1e3, "not_2xx": non2xx, "socket_errors": socket,
       "cores": cores, "measured_span_s": span, "machine_busy_cores": (after["busy"] - before["busy"]) / hz / span,
       # wrk's CPU over its whole life, its start included: an upper bound.
       "wrk_cores": (wrk_user + wrk_system) / seconds}
if "server" in after:
    row["server_cores"] = (after["server"] - before["server"]) / hz / span
    # Engine processes started during the run count from zero.
    row["engine_process_cores"] = max(after["engines"] - before["engines"], 0) / hz / span
    row["server_cpu_us_per_text"] = row["server_cores"] * 1e6 / max(row["texts_per_s"], 1e-9)
    # The server's threads by name; threads that ended during the run count as "ended".
    parts = {name: (ticks - before["threads"].get(name, 0)) / hz / span for name, ticks in after["threads"].items()}
    parts["ended"] = row["server_cores"] - sum(parts.values())
    row["server_threads_cores"] = dict(sorted(parts.items(), key=lambda kv: -kv[1]))
def counters(path):
    """The model's batch counters in a /metrics text (absent: empty)."""
    found = {}
    try:
        for line in open(path):
            name, _, value = line.rpartition(" ")
            if f'model="{model}"' in name and name.split("{")[0] in ("eeane_batch_rows_sum", "eeane_batch_rows_count", "eeane_batch_tokens_sum", "eeane_model_coalesced_total"):
                found[name.split("{")[0]] = float(value)
    except OSError:
        pass
    return found


# Warm-up runs and the measured seconds alike: the run's batches as a whole.
first, last = counters(f"{work}/metrics-before.txt"), counters(f"{work}/metrics-after.txt")
batches = last.get("eeane_batch_rows_count", 0) - first.get("eeane_batch_rows_count", 0)
if batches > 0:
    row["batches"] = int(batches)
    row["rows_per_batch"] = (last["eeane_batch_rows_sum"] - first.get("eeane_batch_rows_sum", 0)) / batches
    row["tokens_per_batch"] = (last["eeane_batch_tokens_sum"] - first.get("eeane_batch_tokens_sum", 0)) / batches
# Requests answered from an identical one in flight (coalesced): texts the
# server did not compute. A corpus's few repeated texts coalesce now and then
# (62-325 a run of 100,000-250,000 on the 4,000 stdlib paragraphs); more,
# and the run measures the coalescer, not the engine.
if "eeane_model_coalesced_total" in last:
    row["coalesced"] = int(last["eeane_model_coalesced_total"] - first.get("eeane_model_coalesced_total", 0))
try:
    # nvidia-smi's samples ("2026/12/05 19:04:06.123, 66", a line a GPU)
    # whose time falls in wrk's seconds, on the wall clock of the last snapshot.
    import datetime
    samples = []
    for line in open(gpu_file):
        stamp, _, busy = line.rpartition(",")
        try:
            at = datetime.datetime.strptime(stamp.strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            if at >= after["wall"] - seconds:
                samples.append(float(busy))
        except ValueError:
            pass
    if samples:
        row["gpu_busy_percent"] = sum(samples) / len(samples)
except OSError:
    pass
print(json.dumps(row))
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
    where = [f"machine {r['machine_busy_cores']:.1f} of {r['cores']} cores busy", f"wrk {r['wrk_cores']:.2f}"]
    if "server_cores" in r:
        where += [f"server {r['server_cores']:.2f} ({r['server_cpu_us_per_text']:.0f} us a text)", f"engine processes {r['engine_process_cores']:.2f}"]
        threads = ", ".join(f"{k} {v:.2f}" for k, v in r["server_threads_cores"].items() if v >= 0.005)
    if "gpu_busy_percent" in r:
        where.append(f"GPU busy {r['gpu_busy_percent']:.0f} %")
    if "batches" in r:
        where.append(f"{r['batches']} batches of {r['rows_per_batch']:.1f} rows, {r['tokens_per_batch']:.0f} tokens as run")
    if "coalesced" in r:
        where.append(f"coalesced {r['coalesced']}")
    print(f"{'':>32}  {', '.join(where)}")
    if "server_threads_cores" in r:
        print(f"{'':>32}  server threads (cores): {threads}")
PY
if [ -n "$out" ]; then
  printf '%s\n' "${results[@]}" | python3 -c 'import json, sys; json.dump([json.loads(l) for l in sys.stdin if l.strip()], open(sys.argv[1], "w"), indent=1)' "$out"
fi
