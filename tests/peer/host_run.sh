#!/usr/bin/env bash
# Runs the CPU peer bench (cpu_peers.py) and the engine-settings bench
# (cpu_knobs.py) on the lent machine's CPU, from the parts host_pack.sh cut.
# There, one call per part, back to back (the machine goes back after 30 s
# idle): carry .peer/p1 and run
#   mkdir -p /tmp/peer-parts && cp -r .peer/p1 /tmp/peer-parts/
# and the same for each part but the last; the last call carries .peer/pN and
# runs `bash tests/peer/host_run.sh`. Every call is idempotent: a lost machine
# means sending the parts again. Figures go to $OUT.
set -uo pipefail
repo=$PWD
parts=/tmp/peer-parts root=/tmp/peer-root
mkdir -p "$parts" && cp -r .peer/p* "$parts"/
sums=$(ls "$parts"/p*/SHA256SUMS | head -1)
(cd "$parts" && grep ' p' "$sums" | sha256sum -c --quiet) || { echo "a part is missing or damaged: send it again" >&2; exit 4; }
if ! cmp -s "$root/.unpacked" "$sums"; then
  rm -rf "$root" && mkdir -p "$root"
  cat $(ls "$parts"/p*/part.* | sort -t. -k2 -n) > "$parts/bundle.tar.xz"
  (cd "$parts" && grep ' bundle' "$sums" | sha256sum -c --quiet) || { echo "the assembled archive's sha256 differs" >&2; exit 4; }
  xz -dc "$parts/bundle.tar.xz" | tar -C "$root" -xf - && rm "$parts/bundle.tar.xz"
  cp "$sums" "$root/.unpacked"
fi
export EEANE_CACHE_DIR=$root/cache
python=${PYTHON:-python3}
texts=${EEANE_PEER_TEXTS:-1536}  # fewer for a dry run here
out=${OUT:-/tmp/peer-out}; mkdir -p "$out"
lscpu > "$out/lscpu.txt"
tei=()
[ -x "$root/bin/text-embeddings-router" ] && tei=(--tei-router "$root/bin/text-embeddings-router" --tei-ort-lib "$root/tei-ort")
cd "$repo"
benches=${EEANE_PEER_BENCHES:-peers knobs}  # one of them, to spend less device time
# A small machine carved from this one: EEANE_PEER_CPUS=2 runs cpu_peers.py on
# one CPU of each of 2 cores; EEANE_PEER_ROWS picks its eeane rows.
carve=()
[ -n "${EEANE_PEER_CPUS:-}" ] && carve+=(--cpus "$EEANE_PEER_CPUS")
[ -n "${EEANE_PEER_ROWS:-}" ] && carve+=(--rows "$EEANE_PEER_ROWS")
touch "$out/peers.txt" "$out/peers.err" "$out/knobs.txt" "$out/knobs.err"
case " $benches " in *" peers "*)
  timeout "${EEANE_PEER_TIMEOUT:-440}" "$python" tests/peer/cpu_peers.py --eeane "$root/bin/eeane" "${tei[@]}" "${carve[@]}" \
    --texts "$texts" --rounds "${EEANE_PEER_ROUNDS:-3}" --json "$out/peers.json" \
    > "$out/peers.txt" 2> "$out/peers.err"; echo "cpu_peers.py: rc $?";;
esac
case " $benches " in *" knobs "*)
  timeout 320 "$python" tests/peer/cpu_knobs.py --eeane "$root/bin/eeane" --texts "$texts" --rounds 2 --json "$out/knobs.json" \
    > "$out/knobs.txt" 2> "$out/knobs.err"; echo "cpu_knobs.py: rc $?";;
esac
cp "$EEANE_CACHE_DIR/models/all-minilm-l6-v2/manifest.json" "$out/" 2>/dev/null
cat "$out/peers.txt" "$out/knobs.txt"; tail -n 3 "$out/peers.err" "$out/knobs.err"
