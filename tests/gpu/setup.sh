# Sourced by tests/gpu/h200.sh and churn.sh on the lent machine: unpacks what
# tests/gpu/pack.sh put in .h200/ (and the Vulkan loader from .gl/), points the
# loader at NVIDIA's driver, and defines $eeane, $root, $OUT, $gpu and vram().
OUT=${OUT:-/tmp/eeane-gpu-out}
root=/tmp/eeane-gpu
gpu=${EEANE_GPU_NAME:-H200}     # a local dry run: EEANE_GPU_NAME=llvmpipe EEANE_GPU_TEXTS=200
texts=${EEANE_GPU_TEXTS:-4000}
mkdir -p "$OUT" "$root/bin" "$root/lib" "$root/model" "$root/cache"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
# The driver's own manifest (the device README's advice; without it the loader
# found no driver there: vkCreateInstance -9).
[ -f $nvidia_icd ] && export VK_DRIVER_FILES=$nvidia_icd
echo "VK_DRIVER_FILES=${VK_DRIVER_FILES:-} LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
py=${PYTHON:-python3}
xz -dc .h200/eeane.xz > "$root/bin/eeane" && chmod +x "$root/bin/eeane"
xz -dc .h200/libncnn.so.1.xz > "$root/lib/libncnn.so.1"
cp .h200/libeeane_ncnn.so .h200/libgomp.so.1 "$root/lib/"
cp .h200/model/* "$root/model/"
# The fp32 model is over what one call may carry: an earlier call on the same
# machine leaves the first part of its .bin in /tmp/eeane-bin.part1 (pack.sh --fp32).
if [ -f "$root/model/model.ncnn.bin.part2" ]; then
  cat /tmp/eeane-bin.part1 "$root/model/model.ncnn.bin.part2" > "$root/model/model.ncnn.bin" || exit 1
  rm "$root/model/model.ncnn.bin.part2"
  sha256sum "$root/model/model.ncnn.bin"
fi
weights=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["source"]["weights"])' "$root/model/manifest.json")
echo "model weights: $weights"
# Keep the images own LD_LIBRARY_PATH: the drivers libraries are found through it.
export LD_LIBRARY_PATH=$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} EEANE_CACHE_DIR=$root/cache
eeane=$root/bin/eeane
vram() { echo "$1: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1) MiB" | tee -a "$OUT/vram.txt"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
