#!/usr/bin/env bash
# The API by hand. Start the server first: bash models/setup.sh && cargo run --release -- serve
# EEANE_URL (default http://127.0.0.1:7997) and EEANE_API_KEY (when the server has one).
set -euo pipefail
url=${EEANE_URL:-http://127.0.0.1:7997}
auth=()
[ -n "${EEANE_API_KEY:-}" ] && auth=(-H "Authorization: Bearer $EEANE_API_KEY")
# One text; a list cut to 128 dimensions, as base64 (little-endian float32).
out=$(curl -fsS "${auth[@]}" "$url/v1/embeddings" -d '{"input": "hello"}'); echo "${out:0:200}..."
out=$(curl -fsS "${auth[@]}" "$url/v1/embeddings" -d '{"input": ["fn main() {}", "a docstring"], "dimensions": 128, "encoding_format": "base64"}'); echo "${out:0:200}..."
# Rerank with the default reranker (the first kind = "reranker" entry, else a rerank = true one).
curl -fsS "${auth[@]}" "$url/v1/rerank" -d '{"query": "sort a list", "documents": ["xs.sort()", "a poem about rain"], "return_documents": true}'; echo
curl -fsS "${auth[@]}" "$url/v1/models"; echo
curl -fsS "$url/health"; echo
