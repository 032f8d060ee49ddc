#!/usr/bin/env bash
# ncnn on the lent H200's Vulkan, fp32 against fp16 arithmetic in one run:
# fidelity to ONNX Runtime on the same texts and eeane bench for each, both
# with two nets. Carries what tests/gpu/pack.sh made (.h200/, .gl/).
# A dry run on lavapipe: EEANE_GPU_NAME=llvmpipe EEANE_GPU_TEXTS=200 bash tests/gpu/ncnn_fp16.sh
set -uo pipefail
source tests/gpu/setup.sh
model() {  # id, extra lines
  printf '[[models]]\nid = "%s"\nengine = "ncnn"\nmodel = "%s/model/model.ncnn.param"\ntokenizer = "%s/model/tokenizer.json"\nmax_tokens = 512\nmax_batch = 128\nmax_batch_tokens = 65536\n%b\n' "$1" "$root" "$root" "$2"
}
d="\"vulkan:$gpu\""
{
  printf '[server]\nport = 7997\nkeep_alive = 300\n[runtimes]\nncnn = "%s/lib/libeeane_ncnn.so"\n' "$root"
  model ncnn-fp32 "device = [$d, $d]"
  model ncnn-fp32-alone "device = $d\npack_tokens = 1"
  model ncnn-fp16 "device = [$d, $d]\nprecision = \"fp16\""
  model ncnn-fp16-alone "device = $d\nprecision = \"fp16\"\npack_tokens = 1"
} > "$root/fp16.toml"
cp "$root/fp16.toml" "$OUT/"
"$eeane" serve --config "$root/fp16.toml" > "$OUT/server.log" 2>&1 &
server=$!
for _ in $(seq 60); do curl -sf localhost:7997/health -o /dev/null && break; sleep 1; done
for m in ncnn-fp32 ncnn-fp16; do
  $py tests/gpu/fidelity.py http://127.0.0.1:7997 .h200/reference.json $m $m-alone "$weights" > "$OUT/fidelity-$m.json"
  echo "$m fidelity exit $?"; head -c 700 "$OUT/fidelity-$m.json"; echo
done
curl -s localhost:7997/health | $py -c 'import json,sys; [print(m["id"], m["state"], m.get("device"), m.get("precision"), m.get("error","")) for m in json.load(sys.stdin)["models"]]'
kill -TERM $server; wait $server
for m in ncnn-fp32 ncnn-fp16; do
  echo "== $m"
  timeout 150 "$eeane" bench --config "$root/fp16.toml" --model $m --texts "$texts" --batch 128 2>&1 | grep -v -E "INFO|WARN" | grep -E "^\||^\(|^model|^idle|^tokenizer"
done 2>&1 | tee "$OUT/bench.txt"
