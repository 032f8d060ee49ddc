#!/usr/bin/env bash
# Before/after for Hub models: every fixture family of tests/hub pulled by
# NEW's `eeane pull` from the look-alike on loopback, for ONNX Runtime and
# OpenVINO, then served by both binaries from the same prepared files and
# compared byte for byte (tests/tools/compare_binaries.py). The graphs
# themselves are compared by tests/tools/compare_prepared.py.
#
#   bash tests/tools/compare_hub.sh OLD/eeane NEW/eeane REPOS_DIR [TEXTS.txt]
#
# REPOS_DIR: tests/hub/make_repos.py's output (python3 tests/hub/make_repos.py
# --cache ~/.cache/eeane DIR). Pulls go to a throwaway HF_HOME; the prepared
# models to eeane's cache, as `eeane pull` puts them.
set -euo pipefail
old=$1 new=$2 repos=$3
texts=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
python=${EEANE_PYTHON:-${XDG_CACHE_HOME:-$HOME/.cache}/eeane/venv/bin/python}
work=$(mktemp -d)
trap 'kill "$hub" 2>/dev/null || true; rm -rf "$work"' EXIT
"$python" "$here/../hub/lookalike.py" --repos "$repos" --port-file "$work/ports" &
hub=$!
for _ in $(seq 100); do [ -s "$work/ports" ] && break; sleep 0.1; done
export HF_ENDPOINT="http://127.0.0.1:$(cut -d' ' -f1 "$work/ports")" HF_HOME="$work/hf"
families=(
  sentence-transformers/all-MiniLM-L6-v2 eeane-test/minilm-cls-raw eeane-test/minilm-max eeane-test/minilm-prompts
  eeane-test/minilm-roberta eeane-test/minilm-camembert eeane-test/minilm-distilbert eeane-test/multilingual-e5-small-enpt
  eeane-test/minilm-dense eeane-test/bert-bin-tiny eeane-test/bert-vocab-tiny eeane-test/roberta-vocab-tiny eeane-test/xlmr-spm-tiny
  eeane-test/mpnet-tiny eeane-test/modernbert-tiny eeane-test/qwen3-tiny eeane-test/qwen3-bf16-tiny eeane-test/qwen2-tiny
  eeane-test/mistral-tiny eeane-test/llama-tiny eeane-test/gemma-tiny eeane-test/gemma2-tiny eeane-test/gemma3-tiny
  eeane-test/minilm-onnx-only
)
rerankers=(eeane-test/minilm-cross-encoder eeane-test/minilm-distilbert-cross-encoder eeane-test/e5-enpt-cross-encoder
  eeane-test/qwen3-reranker-tiny eeane-test/bge-gemma-reranker-tiny)
config="$work/hub.toml"
echo "[server]" > "$config"
for repo in "${families[@]}" "${rerankers[@]}"; do
  "$new" pull "hf:$repo" 2> "$work/pull.log" | sed "s|^id = .*|id = \"$repo\"|" >> "$config" || { cat "$work/pull.log"; exit 1; }
  echo >> "$config"
done
# The same prepared graphs on OpenVINO (it takes embedders; rerankers stay on ONNX Runtime).
for repo in "${families[@]}"; do
  "$new" pull --engine openvino "hf:$repo" 2> "$work/pull.log" | sed "s|^id = .*|id = \"$repo@openvino\"|" >> "$config" || { cat "$work/pull.log"; exit 1; }
  echo >> "$config"
done
if [ -z "$texts" ]; then
  texts="$work/texts.txt"
  "$python" -c 'import json,sys; [print(t.replace("\n", " ")) for t in json.load(open(sys.argv[1]))]' "$here/../fixtures/texts.json" > "$texts"
fi
"$python" "$here/compare_binaries.py" "$old" "$new" "$config" "$texts"
