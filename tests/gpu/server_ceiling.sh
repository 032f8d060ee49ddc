#!/usr/bin/env bash
# The server's own ceiling on a GPU host, with no card behind it: the
# testing engine (token states from a formula, `dimensions = 8`) under
# tests/gpu/load.sh's bulk and one text a request, so that what is left is
# HTTP, JSON, tokenizing and the hand-offs to the batcher and back. A rate
# on the card far below this one is the card's side (the sessions, the
# engine), not the request path. Optionally perf on the server.
#
#   Here:  bash tests/gpu/server_ceiling.sh pack [BASE_BINARY]
#          builds eeane with the testing engine and packs into .cuda/fake/
#          (ignored by git, about 24 MB): it, BASE_BINARY too when given
#          (another build to hold against it), wrk and its LuaJIT, Debian's
#          perf with its libraries (run through their own ld-linux), the
#          4,000 stdlib paragraphs and MiniLM's tokenizer.json.
#   There: carry .cuda/fake and run `bash tests/gpu/server_ceiling.sh run`;
#          VARIANTS="new:4:8:process: base:4:8:process:" (build, sessions,
#          dimensions, isolation, tokio's workers: empty for one a core),
#          FLIGHT="64 480 960", PERF_FLIGHT=480 (empty: no perf). Writes
#          $OUT/ceiling.log (and perf-1.data, kallsyms.xz for `perf report
#          --kallsyms` here, with the unstripped build in perf's build-id
#          cache). About 30 s a variant.
set -uo pipefail
step=${1:?pack or run}
d=$(pwd)/.cuda/fake

if [ "$step" = pack ]; then
  set -e
  mkdir -p "$d"
  cargo build --release --locked --features eeane/test-engine
  strip -o "$d/eeane-new" target/release/eeane && xz -T2 -6 -f "$d/eeane-new"
  if [ -n "${2:-}" ]; then strip -o "$d/eeane-base" "$2" && xz -T2 -6 -f "$d/eeane-base"; fi
  cp "$(command -v wrk)" "$d/wrk"
  cp "$(ldd "$(command -v wrk)" | awk '/libluajit/ {print $3}')" "$d/"
  perf_bin=$(readlink -f "$(command -v perf)")
  rm -rf /tmp/perfpack && mkdir -p /tmp/perfpack/lib && cp "$perf_bin" /tmp/perfpack/perf
  for lib in $(ldd "$perf_bin" | awk '$3 ~ /^\// {print $3}') /lib64/ld-linux-x86-64.so.2; do cp -L "$lib" /tmp/perfpack/lib/; done
  tar -C /tmp -cJf "$d/perf.tar.xz" perfpack
  python3 tests/gpu/stdlib_texts.py "$d/texts.json" 4000
  cp "${EEANE_CACHE:-$HOME/.cache/eeane}/models/all-minilm-l6-v2/tokenizer.json" "$d/"
  du -sh "$d"
  exit 0
fi

[ "$step" = run ] || { echo "server_ceiling.sh: pack or run" >&2; exit 2; }
out=${OUT:-/tmp/ceiling-out}
mkdir -p "$out" /tmp/fake
exec > >(tee "$out/ceiling.log") 2>&1
for xz in "$d"/eeane-*.xz; do name=$(basename "$xz" .xz); xz -dc "$xz" > "/tmp/fake/$name" && chmod +x "/tmp/fake/$name"; done
cp "$d/wrk" "$d"/libluajit* /tmp/fake/
export PATH=/tmp/fake:$PATH LD_LIBRARY_PATH=/tmp/fake
perf() { /tmp/perfpack/lib/ld-linux-x86-64.so.2 --library-path /tmp/perfpack/lib /tmp/perfpack/perf "$@"; }
[ ! -f "$d/perf.tar.xz" ] || tar -C /tmp -xJf "$d/perf.tar.xz"
xz -c /proc/kallsyms > "$out/kallsyms.xz" 2>/dev/null
lscpu | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))"
python3 - "$d/texts.json" /tmp/fake/one.jsonl <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for t in json.load(open(sys.argv[1])):
        f.write(json.dumps({"model": "fake", "input": [t], "encoding_format": "base64"}) + "\n")
PY
n=0
for variant in ${VARIANTS:-new:4:8:process:}; do
  n=$((n + 1))
  IFS=: read -r build sessions dims isolation workers <<< "$variant"
  devices=$(python3 -c "print(', '.join(['\"cpu\"'] * $sessions))")
  printf '[server]\nport = 7998\nkeep_alive = 300\n[[models]]\nid = "fake"\nengine = "testing"\nmodel = "%s/tokenizer.json"\ntokenizer = "%s/tokenizer.json"\nmax_tokens = 256\ndevice = [%s]\nmax_batch = 256\nmax_batch_tokens = 65536\ndimensions = %s\nisolation = "%s"\n' \
    "$d" "$d" "$devices" "$dims" "$isolation" > /tmp/fake/fake.toml
  TOKIO_WORKER_THREADS=${workers:-$(nproc)} EEANE_LOG=warn "/tmp/fake/eeane-$build" serve --config /tmp/fake/fake.toml > /tmp/fake/server.log 2>&1 &
  pid=$!
  sleep 2
  echo "## $build: testing engine, $sessions sessions ($isolation), $dims dimensions, $(nproc) cores, ${workers:-$(nproc)} tokio workers"
  LOAD_SERVER_PID=$pid LOAD_SECONDS=6 LOAD_IN_FLIGHT="${FLIGHT:-64 480 960}" LOAD_BULK_CONNECTIONS=24 \
    bash tests/gpu/load.sh http://127.0.0.1:7998 fake "$d/texts.json" 2>&1 | grep -v "^load.sh"
  if [ -n "${PERF_FLIGHT-480}" ] && [ $n -eq 1 ] && [ -d /tmp/perfpack ]; then
    ( sleep 2; perf record -F 499 -p $pid -o "$out/perf-$n.data" -- sleep 3 > "$out/perf-$n.txt" 2>&1
      perf stat -e task-clock,context-switches,cpu-migrations -p $pid -- sleep 2 >> "$out/perf-$n.txt" 2>&1 ) &
    profiler=$!
    wrk -t8 -c"${PERF_FLIGHT-480}" -d8s -s tests/gpu/load.lua http://127.0.0.1:7998 -- /tmp/fake/one.jsonl 8 | tail -n 1
    wait $profiler
    tail -n 5 "$out/perf-$n.txt"
    echo "GET /api/version, 480 connections (HTTP alone):"
    wrk -t8 -c480 -d5s http://127.0.0.1:7998/api/version | grep -E "Requests/sec|Latency"
  fi
  # Never `wait` on the server: a server that does not stop would hold the call.
  kill -TERM $pid; timeout 20 tail --pid=$pid -f /dev/null; kill -KILL $pid 2>/dev/null
done
true
