#!/usr/bin/env bash
# The server alone on the CUDA model, driven by curl from outside (no Rust
# client in the same process): bulk throughput, and the server's own
# per-request tokenization time from its debug log. Run after
# `EEANE_CUDA_SETUP_ONLY=1 bash tests/gpu/cuda.sh` on the same machine.
set -uo pipefail
root=/tmp/eeane-cuda
export EEANE_CACHE_DIR=$root/cache
[ -f .cuda/bin/eeane.xz ] && xz -dc .cuda/bin/eeane.xz > "$root/eeane" && chmod +x "$root/eeane"
mkdir -p /tmp/bodies
python3 - "$root/texts.json" <<'PY'
import json, sys
texts = json.load(open(sys.argv[1]))
for i in range(0, len(texts), 128):
    json.dump({"model": "minilm-fp16", "input": texts[i:i + 128], "encoding_format": "base64"}, open(f"/tmp/bodies/{i // 128:03d}.json", "w"))
PY
EEANE_LOG=eeane=debug "$root/eeane" serve --config "$root/cuda.toml" > /tmp/serve.log 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf localhost:7997/health -o /dev/null && break; sleep 1; done
curl -s localhost:7997/v1/embeddings -H 'content-type: application/json' -d @/tmp/bodies/000.json -o /dev/null -w "warm-up %{http_code} %{time_total}s\n"
for clients in 8 16; do
  start=$(date +%s.%N)
  for r in 1 2 3 4; do ls /tmp/bodies/*.json; done | xargs -P $clients -I{} curl -s -o /dev/null -w "%{http_code}\n" \
    -H 'content-type: application/json' -d @{} localhost:7997/v1/embeddings | sort | uniq -c
  end=$(date +%s.%N)
  python3 -c "print('curl, $clients clients, 128 texts a request: %.0f texts/s' % (16000 / ($end - $start)))"
done
grep "embedded" /tmp/serve.log | grep "sequences=128" | sed 's/.*tokenize_ms=\([0-9.]*\) total_ms=\([0-9.]*\).*/\1 \2/' | python3 -c "
import sys; rows=[tuple(map(float, l.split())) for l in sys.stdin if l.strip()]
rows.sort(); n=len(rows)
print(f'{n} requests of 128 texts: tokenize ms p50 {rows[n//2][0]:.1f} max {rows[-1][0]:.1f}; total ms p50 {sorted(r[1] for r in rows)[n//2]:.1f}')"
top -b -n1 -H -p $server | head -20 | tail -12
kill -TERM $server; wait $server
