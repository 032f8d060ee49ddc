#!/usr/bin/env bash
# Issue 11's churn on the GPU: three ncnn models on one Vulkan device (the
# fp16-weight MiniLM under three ids, packing 512, 128 and 1 tokens a run),
# keep_alive = 0 and max_loaded_models = 1, four clients of mixed traffic for
# EEANE_CHURN_SECONDS (default 180); every answer compared with an
# all-resident server's; VRAM (nvidia-smi) and RSS sampled whenever all models
# are unloaded. Same packing as tests/gpu/h200.sh: bash tests/gpu/pack.sh here,
# then run this there with .h200 and .gl carried. Results go to $OUT.
set -uo pipefail
source tests/gpu/setup.sh
seconds=${EEANE_CHURN_SECONDS:-180}
config() {  # keep_alive, extra server lines
  printf '[server]\nport = 7997\nkeep_alive = %s\n%b\n[runtimes]\nncnn = "%s/lib/libeeane_ncnn.so"\n' "$1" "$2" "$root"
  for spec in "a 512" "b 128" "c 1"; do
    set -- $spec
    printf '[[models]]\nid = "%s"\nengine = "ncnn"\ndevice = "vulkan:%s"\npack_tokens = %s\nmodel = "%s/model/model.ncnn.param"\ntokenizer = "%s/model/tokenizer.json"\nmax_tokens = 256\n' \
      "$1" "$gpu" "$2" "$root" "$root"
  done
}
serve() {  # config file
  "$eeane" serve --config "$1" >> "$OUT/server.log" 2>&1 &
  server=$!
  for _ in $(seq 60); do curl -sf localhost:7997/health -o /dev/null && break; sleep 1; done
}
config -1 'default_load_policy = "resident"' > "$root/resident.toml"
config 0 'max_loaded_models = 1' > "$root/churn.toml"
cp "$root"/resident.toml "$root"/churn.toml "$OUT/"

vram "at rest, no eeane"
serve "$root/resident.toml"
vram "three models resident"
"$py" tests/gpu/churn.py expect http://127.0.0.1:7997 "$OUT/expected.json"
kill -TERM $server; wait $server
vram "resident server stopped"

serve "$root/churn.toml"
vram "churn server up, nothing loaded"
"$py" tests/gpu/churn.py churn http://127.0.0.1:7997 "$OUT/expected.json" "$seconds" $server | tee "$OUT/churn.json"
status=${PIPESTATUS[0]}
kill -TERM $server; wait $server
vram "churn server stopped"
exit $status
