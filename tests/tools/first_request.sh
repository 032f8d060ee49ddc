#!/usr/bin/env bash
# The README's first request on a model whose precision = "auto" survey has
# never run here: fresh copies of the default model's files under a new id,
# so no kept survey applies. Prints the request's time, then /health's load
# and survey figures once the survey is done (or after 120 s).
#   bash tests/tools/first_request.sh [EEANE_BINARY]   (default target/release/eeane)
set -euo pipefail
bin=${1:-target/release/eeane}
cache=${EEANE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eeane}
work=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"; rm -f "$cache/variants/$id.json"' EXIT
id="first-request-$$"
cp "$cache/models/all-minilm-l6-v2/model.onnx" "$cache/models/all-minilm-l6-v2/tokenizer.json" "$work/"
cat > "$work/eeane.toml" <<TOML
[server]
port = 0
[[models]]
id = "$id"
model = "$work/model.onnx"
tokenizer = "$work/tokenizer.json"
max_tokens = 256
precision = "auto"
TOML
"$bin" --config "$work/eeane.toml" serve > "$work/out" 2> "$work/log" &
pid=$!
for _ in $(seq 600); do grep -q "listening on" "$work/out" 2>/dev/null && break; sleep 0.1; done
url=$(sed -n 's/.*listening on \(http[^ ]*\).*/\1/p' "$work/out")
took=$(curl -s -o "$work/answer" -w '%{time_total}' "$url/v1/embeddings" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$id\", \"input\": [\"hello\", \"world\"]}")
python3 -c "import json,sys; d=json.load(open('$work/answer')); print(f'first request: $took s, {len(d[\"data\"])} vectors of {len(d[\"data\"][0][\"embedding\"])}')"
health() { curl -s "$url/health" | python3 -c "import json,sys; m=[m for m in json.load(sys.stdin)['models'] if m['id']=='$id'][0]; print(json.dumps({k: m.get(k) for k in ('load_ms','survey')}), m.get('variant',{}).get('chosen'))"; }
echo "right after: $(health)"
for _ in $(seq 240); do
  state=$(curl -s "$url/health" | python3 -c "import json,sys; m=[m for m in json.load(sys.stdin)['models'] if m['id']=='$id'][0]; print((m.get('survey') or {}).get('state','none'))")
  [ "$state" = running ] || break
  sleep 0.5
done
echo "later: $(health)"
