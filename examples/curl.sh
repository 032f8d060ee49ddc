#!/usr/bin/env bash
# The API by hand. Start the server first: bash models/setup.sh && cargo run --release -- serve
set -euo pipefail
url=${EEANE_URL:-http://127.0.0.1:7997}
curl -s "$url/v1/embeddings" -d '{"input": "hello"}' | head -c 200; echo
curl -s "$url/v1/embeddings" -d '{"input": ["fn main() {}", "a docstring"], "dimensions": 128, "encoding_format": "base64"}' | head -c 200; echo
curl -s "$url/v1/models"; echo
curl -s "$url/health"; echo
